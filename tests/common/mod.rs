//! Test harness: real `redis-server` processes and real `sluice` processes on free ports.
//!
//! Every process is started by the test that uses it and killed when its handle drops, so tests
//! are isolated from each other and from the Redis this machine already runs on 6379.

#![allow(dead_code)]

pub mod chart;
pub mod container;
pub mod envoy;
pub mod envoy_gateway;
pub mod load;
pub mod otlp;
pub mod proxy;
pub mod raw_h2;
pub mod readiness;
pub mod sentinel;
pub mod sentinel_tls;
pub mod untimed;
pub mod xds;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice::proto::{
    DescriptorEntry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
    RateLimitServiceClient,
};
use tonic::transport::Channel;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The Redis server the tests run: the binary `SLUICE_TEST_REDIS_SERVER` names (scripts/test.sh
/// runs the store suites again with Valkey 9 and Redis 6.2 this way), else Debian's
/// `redis-server` (Redis 7).
pub fn redis_server_binary() -> String {
    std::env::var("SLUICE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A Redis older than 7.0 (no `PEXPIRE .. NX`): the binary `SLUICE_TEST_REDIS_OLDER` names,
/// which scripts/test.sh sets to the matrix's Redis 6.2.
pub fn older_redis_server_binary() -> String {
    std::env::var("SLUICE_TEST_REDIS_OLDER").expect(
        "SLUICE_TEST_REDIS_OLDER names a redis-server older than 7.0 (scripts/test.sh sets it)",
    )
}

/// A `redis-server` of our own, without persistence.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    /// The `redis-server` binary it runs ([`redis_server_binary`] unless restarted as another).
    binary: String,
    dir: tempfile::TempDir,
    /// Extra server arguments (TLS, ACL users), `{port}` replaced by the port.
    server_args: Vec<String>,
    /// Arguments `redis-cli` needs to reach it (TLS files, credentials).
    cli_args: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[], &[])
    }

    /// Starts a server with extra arguments; `{port}` in them stands for the chosen port, and
    /// when one of them is `--tls-port` the plain port is disabled.
    pub fn start_with(server_args: &[String], cli_args: &[String]) -> RedisServer {
        let mut last_log = String::new();
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port(),
                child: Command::new("true").spawn().unwrap(),
                binary: redis_server_binary(),
                dir: tempfile::tempdir().unwrap(),
                server_args: server_args.to_vec(),
                cli_args: cli_args.to_vec(),
            };
            server.spawn();
            if server.wait_ready() {
                return server;
            }
            // The port was taken between our probe and redis-server's bind: try another.
            server.kill();
            last_log =
                std::fs::read_to_string(server.dir.path().join("redis.log")).unwrap_or_default();
        }
        panic!("could not start redis-server; its last log:\n{last_log}");
    }

    fn spawn(&mut self) {
        let _ = self.child.wait();
        let port = self.port.to_string();
        let tls = self.server_args.iter().any(|a| a == "--tls-port");
        let binary = self.binary.clone();
        let mut cmd = Command::new(&binary);
        cmd.args([
            "--port",
            if tls { "0" } else { &port },
            "--bind",
            "127.0.0.1",
        ])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(self.dir.path())
        .args(self.server_args.iter().map(|a| a.replace("{port}", &port)))
        .arg("--logfile")
        .arg(self.dir.path().join("redis.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        self.child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot run {binary} ({e}): scripts/test.sh installs the Redis servers")
        });
        let name = Path::new(&binary).file_name().unwrap().to_string_lossy();
        stop_when_this_process_ends(self.child.id(), &name);
    }

    /// Kills the server (as a crash would) and leaves it down.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port and directory: empty, unless its arguments turned
    /// persistence on.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        assert!(self.wait_ready(), "redis-server did not come back");
    }

    /// Starts it again on the same port and directory as another server (`binary`), empty: a
    /// failover to a server of another version, as clients see it.
    pub fn restart_as(&mut self, binary: &str) {
        self.binary = binary.to_string();
        self.restart();
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if self
                .cli(&["PING"])
                .map(|o| o.trim() == "PONG")
                .unwrap_or(false)
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_args)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The ids of the clients connected to this server (every normal client but the
    /// `redis-cli` asking): Sluice's connections, in the tests that use this.
    pub fn client_ids(&self) -> Vec<String> {
        let list = self.cli(&["CLIENT", "LIST", "TYPE", "normal"]).unwrap();
        list.lines()
            .filter(|l| !l.contains("cmd=client|list"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Both cores kept busy while it lives, for tests that must hold on a saturated machine: two
/// shell loops, killed on drop (and by the watcher [`stop_when_this_process_ends`] starts,
/// should the test process die first).
pub struct CpuHog(Vec<Child>);

impl CpuHog {
    pub fn start() -> CpuHog {
        CpuHog(
            (0..2)
                .map(|_| {
                    let child = Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("sh");
                    stop_when_this_process_ends(child.id(), "sh");
                    child
                })
                .collect(),
        )
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Stops process `pid` (still named `name`) when this test process ends. A server that a test
/// keeps in a `static` (shared by several tests) is never dropped, so `Drop` alone would leave
/// it running after the test binary exits; a one-line shell watcher ends it instead.
pub fn stop_when_this_process_ends(pid: u32, name: &str) {
    let script = format!(
        "while kill -0 {test} 2>/dev/null; do sleep 1; done; \
         [ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = {name} ] && kill {pid}",
        test = std::process::id(),
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

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

pub fn sluice_command(config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
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
        // Off by default in the service; most tests use it (tests/limiter_api.rs checks the
        // default with this removed).
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

fn send_signal(pid: u32, signal: &str) {
    Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
}

pub fn http_request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut text: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        text = &rest[size + 2..];
    }
    out
}

/// A fixed-window check as the service builds it: the key names the window that `now_micros`
/// falls in, by the store's own window arithmetic (`store::window_start`).
pub fn fixed_window_check(
    key: &str,
    hits: u64,
    limit: u64,
    window_secs: u64,
    now_micros: u64,
) -> sluice::store::Check {
    let window_start = sluice::store::window_start(now_micros / 1_000_000, window_secs);
    sluice::store::Check {
        key: format!("{key}_{window_start}"),
        hits,
        rule: sluice::store::Rule::FixedWindow {
            limit,
            window_secs,
            window_start,
        },
        record_refused: false,
        group: None,
    }
}

pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| DescriptorEntry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(req).await.unwrap().into_inner()
}

/// Polls `check` every 20 ms until it holds; panics naming `what` after 30 s.
pub fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not reached in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A scratch directory path that is kept for the test's duration.
pub fn temp_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
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

/// Sleeps past the next window boundary when fewer than `margin` seconds are left in the
/// current window, so a test that must stay inside one window does.
pub async fn avoid_window_edge(window_secs: u64, margin: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = window_secs - now % window_secs;
    if left < margin {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// A Redis Cluster of our own: `masters` masters with `replicas` replicas each, created with
/// `redis-cli --cluster create`, torn down on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    pub masters: usize,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let cluster_args = |node_timeout: &str| -> Vec<String> {
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                node_timeout,
                // No delay before a replica's first sync: a replica that never synced cannot be
                // promoted, and tests kill masters soon after start.
                "--repl-diskless-sync-delay",
                "0",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_with(&cluster_args("1000"), &[]))
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes, masters };
        cluster.wait_healthy();
        cluster
    }

    /// Waits until every live node reports `cluster_state:ok` and sees `masters` masters with slots.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Healthy: cluster state ok everywhere, and every replica synced with its master
            // (a replica that never synced cannot be promoted).
            let ok = self.nodes.iter().filter(|n| n.is_alive()).all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
                    && n.cli(&["INFO", "replication"]).is_some_and(|info| {
                        info.contains("role:master") || info.contains("master_link_status:up")
                    })
            });
            if ok && self.master_ports().len() == self.masters {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ports of the nodes that are masters now (and alive).
    pub fn master_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_alive())
            .filter(|n| n.cli(&["ROLE"]).is_some_and(|r| r.starts_with("master")))
            .map(|n| n.port)
            .collect()
    }

    /// The `REDIS_URL` for sluice: every node, comma-separated, as upstream lists them.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port == port).unwrap()
    }

    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes.iter_mut().find(|n| n.port == port).unwrap()
    }
}

impl RedisServer {
    /// Sends a signal to the server process: `STOP` freezes it as a stuck host would, `CONT`
    /// lets it go on.
    pub fn signal(&self, signal: &str) {
        send_signal(self.child.id(), signal);
    }

    pub fn is_alive(&self) -> bool {
        self.cli(&["PING"]).is_some_and(|o| o.trim() == "PONG")
    }

    /// This node's cluster id.
    pub fn node_id(&self) -> String {
        self.cli(&["CLUSTER", "MYID"]).unwrap().trim().to_string()
    }

    /// The last lines of this server's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn dbsize(&self) -> u64 {
        self.cli(&["DBSIZE"]).unwrap().trim().parse().unwrap()
    }
}

/// A throw-away certificate authority writing PEM files into a temporary directory:
/// `<ca>.pem`, and `<name>.pem` / `<name>.key` for each certificate it issues.
pub struct Pki {
    dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    pub fn new(ca: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Subjects must differ from the issuer's, or OpenSSL takes a leaf for self-signed.
        params
            .distinguished_name
            .push(DnType::CommonName, format!("sluice test {ca}"));
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.path().join(format!("{ca}.pem")), cert.pem()).unwrap();
        Pki {
            dir,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `sans` (DNS names or IPs) signed by this CA.
    pub fn issue(&self, name: &str, sans: &[&str]) {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let key = KeyPair::generate().unwrap();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(
            self.dir.path().join(format!("{name}.key")),
            key.serialize_pem(),
        )
        .unwrap();
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap()
    }
}
