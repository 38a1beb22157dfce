//! Redis Sentinel for the tests: a master with one synced replica and three sentinels watching
//! it (quorum 2, a master is judged down after 1 s), started on free ports and stopped on drop.
//! Shared by `tests/it/redis_sentinel.rs` (following a failover) and `tests/it/failover.rs` (a
//! failover under load through Envoy, measured).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{RedisServer, free_port};

/// One `redis-server --sentinel` process watching the master named `app`.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    pub fn start(master_port: u16) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor app 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds app 1000\nsentinel failover-timeout app 5000\n\
                 sentinel parallel-syncs app 1\n",
                dir.path().display()
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
        Sentinel {
            port,
            child,
            _dir: dir,
        }
    }

    /// The port of the master this sentinel names now, if it answers.
    pub fn master(&self) -> Option<u16> {
        let out = Command::new("redis-cli")
            .args([
                "-p",
                &self.port.to_string(),
                "SENTINEL",
                "get-master-addr-by-name",
                "app",
            ])
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

/// A master, its replica (synced before `start` returns, or it could not be promoted) and three
/// sentinels that all name the master.
pub struct SentinelSetup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    pub fn start() -> SentinelSetup {
        let master =
            RedisServer::start_with(&["--repl-diskless-sync-delay".into(), "0".into()], &[]);
        let replica = RedisServer::start_with(
            &[
                "--replicaof".into(),
                "127.0.0.1".into(),
                master.port.to_string(),
            ],
            &[],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .is_some_and(|i| i.contains("master_link_status:up"))
        {
            assert!(Instant::now() < deadline, "replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(master.port)).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sentinels.iter().all(|s| s.master() == Some(master.port)) {
            assert!(Instant::now() < deadline, "sentinels did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        SentinelSetup {
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
