//! The memory store and the Redis script give the same answers for the same checks at the same
//! (pinned) time. Production always uses Redis's clock; `RedisOptions::pinned_clock` exists so
//! this comparison can be exact.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use sluice::clock::{Clock, ManualClock};
use sluice::store::{
    Algorithm, Check, MemoryStore, MemoryStoreOptions, Outcome, RedisOptions, RedisStore, Store,
};

/// Microseconds; 20 s into the minute window that starts at 1 699 999 980 s.
const T0: u64 = 1_700_000_000_000_000;

struct Pair {
    clock: Arc<ManualClock>,
    memory: MemoryStore,
    redis: RedisStore,
    _server: RedisServer,
}

async fn pair() -> Pair {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::new(MemoryStoreOptions::default(), clock.clone());
    let redis = RedisStore::new(RedisOptions {
        url: server.url(),
        auth: None,
        tls: Default::default(),
        pool_size: 2,
        timeout: Duration::from_secs(5),
        expiration_jitter_max: Duration::ZERO,
        pinned_clock: Some(clock.clone()),
    })
    .unwrap();
    redis
        .wait_until_ready(Some(Duration::from_secs(5)))
        .await
        .unwrap();
    Pair {
        clock,
        memory,
        redis,
        _server: server,
    }
}

fn fixed(key: &str, hits: u64, limit: u64, window_secs: u64, now_micros: u64) -> Check {
    let now = now_micros / 1_000_000;
    let window_start = now / window_secs * window_secs;
    Check {
        key: format!("{key}_{window_start}"),
        hits,
        algorithm: Algorithm::FixedWindow {
            limit,
            window_secs,
            window_start,
        },
    }
}

impl Pair {
    /// Runs `checks` on both stores and asserts equal outcomes; returns them.
    async fn both(&self, checks: &[Check]) -> Vec<Outcome> {
        let m = self.memory.check(checks).await.unwrap();
        let r = self.redis.check(checks).await.unwrap();
        assert_eq!(m, r, "memory vs redis for {checks:?}");
        m
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_answers_agree() {
    let p = pair().await;
    let now = || p.clock.now_micros();
    // 20 s + 250 ms into a minute window.
    p.clock.set_micros(T0 + 250_000);

    let out = p.both(&[fixed("a", 1, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 2,
            reset_ms: 39_750,
            used: 1
        }
    );
    let out = p.both(&[fixed("a", 2, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 0,
            reset_ms: 39_750,
            used: 3
        }
    );
    let out = p.both(&[fixed("a", 1, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: false,
            remaining: 0,
            reset_ms: 39_750,
            used: 4
        }
    );
    // Zero hits looks without counting, also for a key that does not exist.
    let out = p
        .both(&[fixed("a", 0, 3, 60, now()), fixed("fresh", 0, 3, 60, now())])
        .await;
    assert_eq!((out[0].used, out[1].used), (4, 0));

    // Several keys and windows in one call, in order.
    p.clock.advance_micros(39_000_000); // 59.25 s into the window
    let out = p
        .both(&[
            fixed("b", 5, 5, 1, now()),
            fixed("a", 1, 3, 60, now()),
            fixed("b", 1, 5, 1, now()),
        ])
        .await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 0,
            reset_ms: 750,
            used: 5
        }
    );
    assert_eq!(out[1].reset_ms, 750);
    assert!(!out[2].admitted);

    // The next window starts from zero (a new key).
    p.clock.advance_micros(1_000_000);
    let out = p.both(&[fixed("a", 1, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 2,
            reset_ms: 59_750,
            used: 1
        }
    );

    // A cost beyond every limit is refused without overflow.
    let out = p
        .both(&[fixed("c", 1 << 32, u32::MAX as u64, 3600, now())])
        .await;
    assert!(!out[0].admitted);
    assert_eq!(out[0].used, 1 << 32);
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_is_clamped_when_clocks_disagree() {
    // The key's window comes from the service clock; the reset from the store's. A store clock
    // past the window end reports 1 ms; one before the window start reports the whole window.
    let p = pair().await;
    let window_start = T0 / 1_000_000 / 60 * 60;
    let check = Check {
        key: "skewed".into(),
        hits: 1,
        algorithm: Algorithm::FixedWindow {
            limit: 10,
            window_secs: 60,
            window_start,
        },
    };
    p.clock.set_micros((window_start + 75) * 1_000_000);
    assert_eq!(p.both(std::slice::from_ref(&check)).await[0].reset_ms, 1);
    p.clock.set_micros((window_start - 30) * 1_000_000);
    assert_eq!(
        p.both(std::slice::from_ref(&check)).await[0].reset_ms,
        60_000
    );
}
