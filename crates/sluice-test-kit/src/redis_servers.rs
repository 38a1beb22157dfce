//! Redis for the tests: `redis-server` processes of their own on free ports (plain, TLS, ACL
//! users, restarted as another version) and Redis Clusters made of them, each killed when its
//! handle drops. Which binary runs is the environment's choice: `SLUICE_TEST_REDIS_SERVER`
//! (scripts/test.sh runs the store suites again with Valkey 9 and Redis 6.2 this way) and
//! `SLUICE_TEST_REDIS_OLDER` (a server older than 7.0).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{send_signal, stop_when_this_process_ends};
use crate::{Pki, free_port};

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

/// A test CA for Redis over TLS: `ca.pem`, `server.*` for the servers (on 127.0.0.1) and
/// `client.*` for the clients, as [`tls_server_args`] and [`tls_cli_args`] name them.
pub fn redis_pki() -> Pki {
    let pki = Pki::new("ca");
    pki.issue("server", &["127.0.0.1", "localhost"]);
    pki.issue("client", &["client"]);
    pki
}

/// The arguments of a server of [`redis_pki`] that speaks TLS only (no plain port: see
/// [`RedisServer::start_with`]) and requires client certificates.
pub fn tls_server_args(pki: &Pki) -> Vec<String> {
    string_args(&[
        "--tls-port",
        "{port}",
        "--tls-cert-file",
        &pki.path("server.pem"),
        "--tls-key-file",
        &pki.path("server.key"),
        "--tls-ca-cert-file",
        &pki.path("ca.pem"),
        "--tls-auth-clients",
        "yes",
    ])
}

/// What `redis-cli` needs to reach a server of [`tls_server_args`].
pub fn tls_cli_args(pki: &Pki) -> Vec<String> {
    string_args(&[
        "--tls",
        "--cacert",
        &pki.path("ca.pem"),
        "--cert",
        &pki.path("client.pem"),
        "--key",
        &pki.path("client.key"),
    ])
}

/// Arguments as the launchers take them.
pub fn string_args(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Spawns `cmd`, a run of a Redis server binary (a server or a sentinel), its output discarded
/// (it logs to a file, or not at all), and has it stopped when the test process ends: a server a
/// test keeps in a `static` is never dropped.
pub(crate) fn spawn_server(mut cmd: Command) -> Child {
    let binary = cmd.get_program().to_string_lossy().into_owned();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {binary} ({e}): scripts/test.sh installs the Redis servers")
        });
    // The name the process runs under, which the watcher checks before it kills.
    let name = Path::new(&binary).file_name().unwrap().to_string_lossy();
    stop_when_this_process_ends(child.id(), &name);
    child
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
        let mut cmd = Command::new(&self.binary);
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
        .arg(self.dir.path().join("redis.log"));
        self.child = spawn_server(cmd);
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

    /// Options of the library's Redis store on this server, as the tests use it: plain TCP, no
    /// credentials, a pool of 2, a 5 s timeout, no expiry jitter, Redis's own clock. A test
    /// changes what it needs with struct update syntax.
    pub fn store_options(&self) -> sluice::store::RedisOptions {
        sluice::store::RedisOptions {
            target: sluice::store::redis::Target::Single(self.url()),
            auth: None,
            auth_file: None,
            sentinel_auth: None,
            tls: Default::default(),
            pool_size: 2,
            timeout: Duration::from_secs(5),
            expiration_jitter_max: Duration::ZERO,
            pinned_clock: None,
        }
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

/// A Redis Cluster of our own: `masters` masters with `replicas` replicas each, created with
/// `redis-cli --cluster create`, torn down on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    pub masters: usize,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let cluster_args = |node_timeout: &str| -> Vec<String> {
            string_args(&[
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
            ])
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
