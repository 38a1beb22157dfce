//! Redis Sentinel for the tests: a master with one synced replica and three sentinels watching
//! it (quorum 2, a master is judged down after 1 s), started on free ports and stopped on drop.
//! Plain by default; [`SentinelOptions`] adds TLS and passwords, as upstream's users run it
//! (envoyproxy/ratelimit#1015). Shared by `tests/it/redis_sentinel.rs` and
//! `tests/it/redis_sentinel_tls.rs` (following a failover) and `tests/it/failover.rs` (a
//! failover under load through Envoy, measured).

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::redis_servers::{
    redis_pki, redis_server_binary, spawn_server, string_args, tls_cli_args, tls_server_args,
};
use crate::{Pki, RedisServer, free_port, sluice_command};

/// The master's (and replica's) password with [`SentinelOptions::passwords`]: `REDIS_AUTH`.
pub const MASTER_PASSWORD: &str = "master-pw-7c1e";
/// The sentinels' password with [`SentinelOptions::passwords`]: `REDIS_SENTINEL_AUTH`.
pub const SENTINEL_PASSWORD: &str = "sentinel-pw-52ab";

/// How a [`SentinelSetup`] is secured; the default is neither TLS nor passwords.
#[derive(Clone, Copy, Default, Debug)]
pub struct SentinelOptions {
    /// Every server and sentinel speaks TLS only (no plain port anywhere), requires client
    /// certificates, and replicates and reaches the others over TLS; one test CA signs every
    /// certificate (the server's doubles as the client one between servers).
    pub tls: bool,
    /// The master and replica require [`MASTER_PASSWORD`] (replication uses it too), the
    /// sentinels [`SENTINEL_PASSWORD`], which they also use with each other.
    pub passwords: bool,
}

/// One sentinel ([`redis_server_binary`] with `--sentinel`, as the master and replica run it)
/// watching the master named `app`.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    /// What `redis-cli` needs to reach it (TLS files, its password).
    cli: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(master_port: u16, options: SentinelOptions, pki: Option<&Pki>) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut conf = match pki {
            // The TLS port only: a client that skipped TLS would fail.
            Some(pki) => format!(
                "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes\n",
                pki.path("server.pem"),
                pki.path("server.key"),
                pki.path("ca.pem"),
            ),
            None => format!("port {port}\n"),
        };
        conf += &format!(
            "bind 127.0.0.1\ndir {}\nsentinel monitor app 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds app 1000\nsentinel failover-timeout app 5000\n\
             sentinel parallel-syncs app 1\n",
            dir.path().display()
        );
        if options.passwords {
            // After `monitor`, which names `app`.
            conf += &format!(
                "requirepass {SENTINEL_PASSWORD}\nsentinel auth-pass app {MASTER_PASSWORD}\n\
                 sentinel sentinel-pass {SENTINEL_PASSWORD}\n"
            );
        }
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf).unwrap();
        let mut cmd = Command::new(redis_server_binary());
        cmd.arg(&path).arg("--sentinel");
        let child = spawn_server(cmd);
        Sentinel {
            port,
            child,
            cli: cli_args(options, pki, SENTINEL_PASSWORD),
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

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `redis-cli` needs to reach a server or sentinel of a setup with `options`, whose
/// password (if any) is `password`.
fn cli_args(options: SentinelOptions, pki: Option<&Pki>, password: &str) -> Vec<String> {
    let mut args = pki.map(tls_cli_args).unwrap_or_default();
    if options.passwords {
        args.extend(string_args(&["--pass", password, "--no-auth-warning"]));
    }
    args
}

/// The arguments of the master and of its replica.
fn server_args(options: SentinelOptions, pki: Option<&Pki>) -> Vec<String> {
    // No delay before the replica's first sync: one that never synced cannot be promoted.
    let mut args = string_args(&["--repl-diskless-sync-delay", "0"]);
    if let Some(pki) = pki {
        args.extend(tls_server_args(pki));
        args.extend(string_args(&["--tls-replication", "yes"]));
    }
    if options.passwords {
        args.extend(string_args(&[
            "--requirepass",
            MASTER_PASSWORD,
            "--masterauth",
            MASTER_PASSWORD,
        ]));
    }
    args
}

/// A master, its replica (synced before `start` returns, or it could not be promoted) and three
/// sentinels that all name the master.
pub struct SentinelSetup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
    /// With TLS: `ca.pem`, `server.*` and `client.*`.
    pub pki: Option<Pki>,
    pub options: SentinelOptions,
}

impl SentinelSetup {
    /// A plain setup: no TLS, no passwords.
    pub fn start() -> SentinelSetup {
        Self::start_with(SentinelOptions::default())
    }

    pub fn start_with(options: SentinelOptions) -> SentinelSetup {
        let pki = options.tls.then(redis_pki);
        let (args, cli) = (
            server_args(options, pki.as_ref()),
            cli_args(options, pki.as_ref(), MASTER_PASSWORD),
        );
        let master = RedisServer::start_with(&args, &cli);
        let mut replica_args = args;
        replica_args.extend(string_args(&["--replicaof", "127.0.0.1"]));
        replica_args.push(master.port.to_string());
        let replica = RedisServer::start_with(&replica_args, &cli);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .is_some_and(|i| i.contains("master_link_status:up"))
        {
            assert!(
                Instant::now() < deadline,
                "replica never synced ({options:?}):\n{}",
                replica.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| Sentinel::start(master.port, options, pki.as_ref()))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sentinels.iter().all(|s| s.master() == Some(master.port)) {
            assert!(Instant::now() < deadline, "sentinels did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        SentinelSetup {
            master,
            replica,
            sentinels,
            pki,
            options,
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

    /// Sluice on `config` with this setup as its store, in upstream's variables: `REDIS_TLS`
    /// covers the sentinels and the master they name, `REDIS_AUTH` authenticates to the master,
    /// `REDIS_SENTINEL_AUTH` to the sentinels, the `REDIS_TLS_*` files serve both.
    pub fn sluice_command(&self, config: &Path) -> Command {
        let mut cmd = sluice_command(config);
        cmd.env("BACKEND_TYPE", "redis")
            .env("REDIS_TYPE", "sentinel")
            .env("REDIS_URL", self.url());
        if let Some(pki) = &self.pki {
            cmd.env("REDIS_TLS", "true")
                .env("REDIS_TLS_CACERT", pki.path("ca.pem"))
                .env("REDIS_TLS_CLIENT_CERT", pki.path("client.pem"))
                .env("REDIS_TLS_CLIENT_KEY", pki.path("client.key"));
        }
        if self.options.passwords {
            cmd.env("REDIS_AUTH", MASTER_PASSWORD)
                .env("REDIS_SENTINEL_AUTH", SENTINEL_PASSWORD);
        }
        cmd
    }
}
