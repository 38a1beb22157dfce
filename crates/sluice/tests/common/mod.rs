//! What the library's integration tests share: a `redis-server` of their own on a free port,
//! and each test run once per store.

#![allow(dead_code)] // each test file uses part of it

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice::store::RedisOptions;
use sluice::store::redis::Target;
use sluice::{Limiter, Limits};

/// A port nothing listens on (as of now).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// A `redis-server` without persistence, killed when dropped.
pub struct Redis {
    pub port: u16,
    child: Child,
}

impl Redis {
    /// Starts one and waits until it accepts connections. `SLUICE_TEST_REDIS_SERVER` names
    /// another server binary, as for the server's tests (scripts/test.sh).
    pub fn start() -> Redis {
        Redis::start_on(free_port())
    }

    /// Starts one on `port` (the port of one that was killed, to bring it back empty).
    pub fn start_on(port: u16) -> Redis {
        let binary = std::env::var("SLUICE_TEST_REDIS_SERVER")
            .unwrap_or_else(|_| "redis-server".to_string());
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {binary} ({e}): scripts/test.sh installs it"));
        let redis = Redis { port, child };
        // 10 s: a quiet machine takes a few milliseconds.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn options(&self) -> RedisOptions {
        RedisOptions::new(Target::Single(self.url()))
    }

    /// Kills the server, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Which store a limiter counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Memory,
    Redis,
}

pub const STORES: [Store; 2] = [Store::Memory, Store::Redis];

/// A limiter on `limits` in `store`, with the Redis server it needs (kept alive by the caller).
pub async fn limiter(store: Store, limits: Limits) -> (Limiter, Option<Redis>) {
    match store {
        Store::Memory => (Limiter::memory(limits), None),
        Store::Redis => {
            let redis = Redis::start();
            let limiter = Limiter::redis(limits, redis.options())
                .await
                .expect("a limiter on a running redis-server");
            (limiter, Some(redis))
        }
    }
}
