//! Test harness of the client crate: the workspace's real `sluice` binary and real
//! `redis-server` processes, each on free ports and killed when its handle drops.
//!
//! Cargo gives a package's tests only that package's binaries (`CARGO_BIN_EXE_*`), so the
//! `sluice` binary is found another way: `SLUICE_BIN` when set; else the one in this test's own
//! target directory when it is newer than every source it is built from (as after
//! `cargo test --workspace`, which builds it); else `cargo build -p sluice-server --bin sluice`
//! is run once per test binary. The rebuild is not done every time because a build of the
//! server's package alone unifies dependency features differently from a workspace test build,
//! and would compile the service again for nothing.

#![allow(dead_code)]

pub mod services;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice_client::{Client, FailurePolicy};

/// The Sluice config every test of this crate uses: domain `client_test`. Daily windows, so a
/// test's few seconds almost never straddle a window's end (which would double a budget).
/// `peer=::/64` (IPv6 loopback's network, as `key::peer_ip` keys it) has a limit of its own,
/// so a test can tell which key a request from `::1` was charged to. `service=orders` then
/// `user` is a nested rule, for a descriptor of more than one entry.
pub const CONFIG: &str = "\
domain: client_test
descriptors:
  - key: service
    value: orders
    descriptors:
      - key: user
        rate_limit:
          name: orders_per_user
          unit: day
          requests_per_unit: 3
  - key: shared
    rate_limit:
      name: shared
      unit: day
      requests_per_unit: 40
  - key: user
    rate_limit:
      name: per_user
      unit: day
      requests_per_unit: 2
  - key: peer
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: peer
    value: \"::/64\"
    rate_limit:
      name: loopback_64
      unit: day
      requests_per_unit: 1
";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The workspace's `sluice` binary, built if needed (see the module doc).
pub fn sluice_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("SLUICE_BIN") {
            return PathBuf::from(path);
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
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
    })
}

/// What the service binary is built from: the server (`src/`), the limits and the protocol
/// (`crates/`: their sources, `lua/` compiled in, `proto/` generated from), the patched `h2`.
const SERVICE_SOURCES: &[&str] = &["src", "crates", "vendor", "Cargo.toml", "Cargo.lock"];

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

/// A `redis-server` of the test's own, without persistence.
pub struct Redis {
    pub port: u16,
    child: Child,
}

impl Redis {
    pub fn start() -> Redis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        let redis = Redis { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which store a Sluice process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Memory,
    Redis,
}

/// A running `sluice serve` on [`CONFIG`], the native API on.
pub struct Sluice {
    pub grpc: SocketAddr,
    child: Child,
    _config: tempfile::TempDir,
}

impl Sluice {
    /// Starts Sluice on the memory store, or on `redis`; `env` adds variables.
    pub fn start(redis: Option<&Redis>, env: &[(&str, &str)]) -> Sluice {
        let config = tempfile::tempdir().unwrap();
        std::fs::write(config.path().join("config.yaml"), CONFIG).unwrap();
        let mut command = Command::new(sluice_binary());
        command
            .arg("serve")
            .arg("--config-dir")
            .arg(config.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs([
                ("GRPC_HOST", "127.0.0.1"),
                ("GRPC_PORT", "0"),
                ("HOST", "127.0.0.1"),
                ("PORT", "0"),
                ("DEBUG_HOST", "127.0.0.1"),
                ("DEBUG_PORT", "0"),
                ("LOG_FORMAT", "json"),
                ("LIMITER_API_ENABLED", "true"),
                ("BACKEND_TYPE", "memory"),
            ]);
        if let Some(redis) = redis {
            command
                .env("BACKEND_TYPE", "redis")
                .env("REDIS_SOCKET_TYPE", "tcp")
                .env("REDIS_URL", format!("127.0.0.1:{}", redis.port));
        }
        command.envs(env.iter().copied());
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting sluice");
        let grpc = listening_address(&mut child);
        Sluice {
            grpc,
            child,
            _config: config,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// A client of this Sluice with `policy` and a deadline far above a quiet machine's
    /// answer time.
    pub async fn client(&self, policy: FailurePolicy) -> Client {
        Client::builder()
            .failure_policy(policy)
            .deadline(Duration::from_secs(10))
            .connect(self.endpoint())
            .await
            .unwrap()
    }

    /// Kills the process, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The gRPC address from Sluice's "sluice is listening" log line (JSON logs); the rest of its
/// output is drained so the process never blocks on a full pipe.
fn listening_address(child: &mut Child) -> SocketAddr {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if sent {
                continue;
            }
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if event["@message"] == "sluice is listening" {
                let grpc = event["grpc"].as_str().unwrap_or_default().to_string();
                sent = tx.send(grpc).is_ok();
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(grpc) => grpc.parse().unwrap(),
        Err(_) => {
            let _ = child.kill();
            panic!("sluice did not report its listening addresses");
        }
    }
}
