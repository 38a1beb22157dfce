//! Sluice processes: the real `sluice serve` on free loopback ports (every listener on port 0,
//! the addresses read from its "sluice is listening" log line), killed when its handle drops,
//! and where its binary is found.
//!
//! The binary: `SLUICE_BIN` when set; else `CARGO_BIN_EXE_sluice`, which Cargo sets when it runs
//! the tests of the package that has the binary (the server's); else the one in this test's own
//! target directory when it is newer than every source it is built from (as after
//! `cargo test --workspace`, which builds it); else `cargo build -p sluice-server --bin sluice`
//! is run once per test binary. The client's tests take one of the last two ways: Cargo gives a
//! package's tests only that package's binaries. The rebuild is not done every time because a
//! build of the server's package alone unifies dependency features differently from a workspace
//! test build, and would compile the service again for nothing.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice::proto::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::plain_http::http_request;
use crate::process::send_signal;
use crate::redis_servers::RedisServer;

/// Which store a `sluice` process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Redis,
}

/// A running `sluice serve` with its addresses.
pub struct Sluice {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// Upstream's debug listener (`/rlconfig`, `/stats`).
    pub debug: SocketAddr,
    /// The native API's own listener, when `LIMITER_GRPC_PORT` is set.
    pub limiter_api: Option<SocketAddr>,
    child: Child,
    pub stdout_rest: mpsc::Receiver<String>,
}

/// A config directory with one file.
pub fn config_dir(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), yaml).unwrap();
    dir
}

/// `sluice serve` on `config` as the tests run it: a clean environment, every listener on a free
/// loopback port, JSON logs (their "sluice is listening" line gives the ports), the memory store,
/// the native API on. A test adds or removes variables before [`Sluice::spawn`].
pub fn sluice_command(config: &Path) -> Command {
    let mut cmd = Command::new(sluice_binary());
    cmd.arg("serve")
        .arg("--config-dir")
        .arg(config)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .env("LOG_FORMAT", "json")
        .env("LOG_LEVEL", "info")
        // Said explicitly, since REDIS_TIMEOUT below would otherwise select Redis.
        .env("BACKEND_TYPE", "memory")
        .env("REDIS_TIMEOUT", "5s")
        // Off by default in the service; most tests use it (tests/it/limiter_api_isolation.rs checks
        // the default with this removed).
        .env("LIMITER_API_ENABLED", "true");
    cmd
}

impl Sluice {
    /// Starts sluice on `config` with extra environment variables; for `StoreKind::Redis` pass
    /// the Redis server to use.
    pub fn start(config: &Path, redis: Option<&RedisServer>, env: &[(&str, &str)]) -> Sluice {
        let mut cmd = sluice_command(config);
        if let Some(redis) = redis {
            cmd.env("BACKEND_TYPE", "redis")
                .env("REDIS_SOCKET_TYPE", "tcp")
                .env("REDIS_URL", format!("127.0.0.1:{}", redis.port));
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Sluice::spawn(cmd)
    }

    pub fn spawn(mut cmd: Command) -> Sluice {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // A test binary killed (or one that panics past its drops) leaves no server behind.
        if let Some(name) = Path::new(cmd.get_program()).file_name() {
            crate::stop_when_this_process_ends(child.id(), &name.to_string_lossy());
        }
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // SLUICE_TEST_ECHO=1 copies the server's log to the test output, for debugging.
        let echo = std::env::var_os("SLUICE_TEST_ECHO").is_some();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if echo {
                    eprintln!("sluice: {line}");
                }
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("sluice did not report its listening addresses");
                }
            };
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            // LOG_FORMAT=json: upstream's field names, the event's fields beside them.
            if event["@message"] == "sluice is listening" {
                let addr = |k: &str| event[k].as_str().unwrap().parse().unwrap();
                // With GRPC_UDS the gRPC address is `unix:<path>` (the test knows the path).
                let grpc = event["grpc"].as_str().unwrap();
                return Sluice {
                    grpc: grpc.parse().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                    http: addr("http"),
                    debug: addr("debug"),
                    limiter_api: event["limiter"].as_str().map(|a| a.parse().unwrap()),
                    child,
                    stdout_rest: rx,
                };
            }
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// Kills the process (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        send_signal(self.child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The value of one series on `/metrics`, named as it is printed before the value
    /// (`name` or `name{label="value"}`); 0 when the series does not exist yet.
    pub fn metric(&self, series: &str) -> f64 {
        let (_, metrics) = self.http("GET", "/metrics", "");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
            .unwrap_or(0.0)
    }

    /// Plain HTTP/1.1 request; returns (status, body).
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http_request(self.http, method, path, body)
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd`, a `sluice serve` that must refuse to start, to its end; what it printed:
/// standard output (the log) and standard error (the reason it gave). A process that exits with
/// success fails the test, and so does one still running after a minute (it started, and would
/// otherwise serve until the test run is killed): it is killed first.
pub fn refused_start(cmd: &mut Command) -> (String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read while it runs: a process whose pipe is full waits for a reader, and would be taken
    // for one that started.
    let stdout = read_aside(child.stdout.take().unwrap());
    let stderr = read_aside(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let Some(status) = status else {
        panic!("sluice kept running for 60 s where it must refuse to start:\n{stdout}{stderr}");
    };
    assert!(
        !status.success(),
        "sluice started where it must refuse to:\n{stdout}{stderr}"
    );
    (stdout, stderr)
}

/// Everything `pipe` gives until it closes, read on a thread of its own.
fn read_aside(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `f` once with each store; the Redis one gets a fresh server.
pub async fn for_each_store<F, Fut>(mut f: F)
where
    F: FnMut(StoreKind, Option<RedisServer>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f(StoreKind::Memory, None).await;
    f(StoreKind::Redis, Some(RedisServer::start())).await;
}

/// The `sluice` binary the tests run (see the module doc for how it is found).
pub fn sluice_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("SLUICE_BIN") {
            return PathBuf::from(path);
        }
        if let Some(path) = std::env::var_os("CARGO_BIN_EXE_sluice") {
            return PathBuf::from(path);
        }
        built_binary()
    })
}

/// The `sluice` binary of this test's target directory, built first unless it is newer than
/// every source of the service.
fn built_binary() -> PathBuf {
    let workspace = crate::workspace_root();
    // This test runs as <target>/<profile>/deps/<name>; the binary lands in <profile>.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let target_dir = profile_dir.parent().unwrap();
    let binary = profile_dir.join("sluice");
    if is_newer_than_sources(&binary, &workspace) {
        return binary;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&workspace)
        .args(["build", "--quiet", "-p", "sluice-server", "--bin", "sluice"])
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .expect("running cargo to build the sluice binary");
    assert!(
        status.success() && binary.exists(),
        "could not build the sluice binary at {} (set SLUICE_BIN to use another)",
        binary.display()
    );
    binary
}

/// What the service binary is built from: the server (`src/`), the limits and the protocol
/// (their sources, `lua/` compiled in, `proto/` generated from), the patched `h2`. Not this
/// kit: a test changed while the binary is current must not rebuild it (from inside a running
/// `cargo test`, that build would wait for cargo's lock).
const SERVICE_SOURCES: &[&str] = &[
    "src",
    "crates/sluice",
    "crates/sluice-proto",
    "vendor",
    "Cargo.toml",
    "Cargo.lock",
];

/// True when `binary` exists and was written after every file of the service's sources.
fn is_newer_than_sources(binary: &Path, workspace: &Path) -> bool {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let Some(built) = modified(binary) else {
        return false;
    };
    let mut pending: Vec<PathBuf> = SERVICE_SOURCES.iter().map(|s| workspace.join(s)).collect();
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path).into_iter().flatten().flatten();
            pending.extend(entries.map(|e| e.path()));
        } else if modified(&path).is_none_or(|m| m > built) {
            return false;
        }
    }
    true
}
