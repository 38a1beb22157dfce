//! Redis Sentinel over TLS with passwords everywhere, as upstream's users run it
//! (envoyproxy/ratelimit#1015): a master and its replica that speak only TLS, require client
//! certificates and a password, and replicate over TLS; three sentinels that speak only TLS
//! too, require a password of their own, and reach the servers (and each other) over TLS with
//! theirs. One test CA signs every certificate. Started on free ports, stopped on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Pki, RedisServer, free_port};

/// The master's (and replica's) password: `REDIS_AUTH`.
pub const MASTER_PASSWORD: &str = "master-pw-7c1e";
/// The sentinels' password: `REDIS_SENTINEL_AUTH`.
pub const SENTINEL_PASSWORD: &str = "sentinel-pw-52ab";

/// The TLS arguments of every server: TLS only, client certificates required, replication
/// over TLS (the server certificate doubles as the client one).
fn tls_server_args(pki: &Pki) -> Vec<String> {
    [
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
        "--tls-replication",
        "yes",
        "--requirepass",
        MASTER_PASSWORD,
        "--masterauth",
        MASTER_PASSWORD,
        "--repl-diskless-sync-delay",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What `redis-cli` needs to reach a server or sentinel of this setup, with `password`.
fn cli_args(pki: &Pki, password: &str) -> Vec<String> {
    [
        "--tls",
        "--cacert",
        &pki.path("ca.pem"),
        "--cert",
        &pki.path("client.pem"),
        "--key",
        &pki.path("client.key"),
        "--pass",
        password,
        "--no-auth-warning",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One `redis-server --sentinel` watching the master named `app`, over TLS only.
pub struct TlsSentinel {
    pub port: u16,
    child: Child,
    cli: Vec<String>,
    _dir: tempfile::TempDir,
}

impl TlsSentinel {
    fn start(pki: &Pki, master_port: u16) -> TlsSentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                 tls-auth-clients yes\ntls-replication yes\n\
                 requirepass {SENTINEL_PASSWORD}\n\
                 sentinel monitor app 127.0.0.1 {master_port} 2\n\
                 sentinel auth-pass app {MASTER_PASSWORD}\n\
                 sentinel sentinel-pass {SENTINEL_PASSWORD}\n\
                 sentinel down-after-milliseconds app 1000\nsentinel failover-timeout app 5000\n\
                 sentinel parallel-syncs app 1\n",
                dir = dir.path().display(),
                cert = pki.path("server.pem"),
                key = pki.path("server.key"),
                ca = pki.path("ca.pem"),
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        TlsSentinel {
            port,
            child,
            cli: cli_args(pki, SENTINEL_PASSWORD),
            _dir: dir,
        }
    }

    /// The port of the master this sentinel names now, if it answers.
    pub fn master(&self) -> Option<u16> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli)
            .args(["SENTINEL", "get-master-addr-by-name", "app"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS master, its replica (synced before `start` returns) and three TLS sentinels that all
/// name the master; `pki` holds `ca.pem`, `server.*` and `client.*`.
pub struct TlsSentinelSetup {
    pub pki: Pki,
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<TlsSentinel>,
}

impl TlsSentinelSetup {
    pub fn start() -> TlsSentinelSetup {
        let pki = Pki::new("ca");
        pki.issue("server", &["127.0.0.1", "localhost"]);
        pki.issue("client", &["client"]);
        let cli = cli_args(&pki, MASTER_PASSWORD);
        let master = RedisServer::start_with(&tls_server_args(&pki), &cli);
        let mut replica_args = tls_server_args(&pki);
        replica_args.extend([
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            master.port.to_string(),
        ]);
        let replica = RedisServer::start_with(&replica_args, &cli);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .is_some_and(|i| i.contains("master_link_status:up"))
        {
            assert!(
                Instant::now() < deadline,
                "replica never synced over TLS:\n{}",
                replica.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels: Vec<TlsSentinel> = (0..3)
            .map(|_| TlsSentinel::start(&pki, master.port))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sentinels.iter().all(|s| s.master() == Some(master.port)) {
            assert!(Instant::now() < deadline, "sentinels did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        TlsSentinelSetup {
            pki,
            master,
            replica,
            sentinels,
        }
    }

    /// `REDIS_URL` for `REDIS_TYPE=sentinel`: the master's name, then every sentinel.
    pub fn url(&self) -> String {
        std::iter::once("app".to_string())
            .chain(
                self.sentinels
                    .iter()
                    .map(|s| format!("127.0.0.1:{}", s.port)),
            )
            .collect::<Vec<_>>()
            .join(",")
    }
}
