//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true` through the real service, on the memory store
//! and on a real Redis: when one descriptor of a request would go over, only it is counted; the
//! others keep their counters and are answered as upstream answers them (OK, with what was left
//! before this request). Decided atomically, so concurrent callers cannot count a descriptor
//! past what that rule allows (upstream reads the counters first, racily).

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kit::*;
use sluice::proto::{Code, RateLimitDescriptor, RateLimitRequest};

const CONFIG: &str = r#"
domain: stop
descriptors:
  - key: wide
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: tight
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: crowd_wide
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: crowd_tight
    rate_limit: {unit: day, requests_per_unit: 10}
"#;

const ON: &[(&str, &str)] = &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];

fn day_start() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    now / 86_400 * 86_400
}

/// The fixed-window count Redis holds for `key=value` (upstream's key format), 0 when none.
fn redis_count(redis: &RedisServer, key: &str, value: &str) -> u64 {
    let name = format!("stop_{key}_{value}_{}", day_start());
    let reply = redis.cli(&["GET", &name]).unwrap();
    reply.trim().parse().unwrap_or(0)
}

/// A zero-cost look at `key=value` through the service: its `limit_remaining`.
async fn remaining(sluice: &Sluice, key: &str, value: &str) -> u32 {
    let mut look = descriptor(&[(key, value)]);
    look.hits_addend = Some(0);
    let r = ask(&mut sluice.client().await, request("stop", vec![look])).await;
    r.statuses[0].limit_remaining
}

fn pair(wide: &str, tight: &str, value: &str) -> RateLimitRequest {
    let descriptors: Vec<RateLimitDescriptor> =
        vec![descriptor(&[(wide, value)]), descriptor(&[(tight, value)])];
    request("stop", descriptors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_descriptor_that_fits_stays_frozen_when_another_goes_over() {
    avoid_window_edge(86_400, 60).await;
    let dir = config_dir(CONFIG);
    for_each_store(|kind, redis| {
        let dir = &dir;
        async move {
            let sluice = Sluice::start(dir.path(), redis.as_ref(), ON);
            let mut client = sluice.client().await;
            let req = pair("wide", "tight", "v");
            // Both fit: both counted.
            let r = ask(&mut client, req.clone()).await;
            assert_eq!(r.overall_code, Code::Ok as i32, "{kind:?}");
            assert_eq!(r.statuses[0].limit_remaining, 99, "{kind:?}");
            for _ in 0..3 {
                let r = ask(&mut client, req.clone()).await;
                assert_eq!(r.overall_code, Code::OverLimit as i32, "{kind:?}");
                // As upstream: the frozen one is OK with what was left before this request
                // (its INCRBY 0 result), the tripping one OVER_LIMIT with 0 left.
                let wide = &r.statuses[0];
                assert_eq!(wide.code, Code::Ok as i32, "{kind:?}");
                assert_eq!(wide.limit_remaining, 99, "{kind:?}");
                assert_eq!(wide.current_limit.as_ref().unwrap().requests_per_unit, 100);
                let tight = &r.statuses[1];
                assert_eq!(tight.code, Code::OverLimit as i32, "{kind:?}");
                assert_eq!(tight.limit_remaining, 0, "{kind:?}");
            }
            assert_eq!(remaining(&sluice, "wide", "v").await, 99, "{kind:?}");
            if let Some(redis) = &redis {
                // The counters themselves: wide counted once, tight on every request (the one
                // going over is counted, as upstream counts it).
                assert_eq!(redis_count(redis, "wide", "v"), 1);
                assert_eq!(redis_count(redis, "tight", "v"), 4);
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_every_descriptor_is_counted() {
    avoid_window_edge(86_400, 60).await;
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[]);
    let mut client = sluice.client().await;
    for _ in 0..3 {
        ask(&mut client, pair("wide", "tight", "off")).await;
    }
    assert_eq!(remaining(&sluice, "wide", "off").await, 97);
}

/// Many callers at once: the wide descriptor is counted exactly as often as the tight one
/// fits, never more, because "would it go over?" and the counting are one atomic step.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_count_nothing_beyond_the_tripping_rule() {
    const CALLERS: usize = 32;
    const REQUESTS: usize = 400;
    avoid_window_edge(86_400, 120).await;
    let dir = config_dir(CONFIG);
    for_each_store(|kind, redis| {
        let dir = &dir;
        async move {
            let sluice = Sluice::start(dir.path(), redis.as_ref(), ON);
            let sent = Arc::new(AtomicUsize::new(0));
            let admitted = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for _ in 0..CALLERS {
                let mut client = sluice.client().await;
                let (sent, admitted) = (sent.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    while sent.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                        let r = ask(&mut client, pair("crowd_wide", "crowd_tight", "c")).await;
                        if r.overall_code == Code::Ok as i32 {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(admitted.load(Ordering::Relaxed), 10, "{kind:?}");
            // Counted exactly once per admitted request: 1000 - 10 left.
            assert_eq!(remaining(&sluice, "crowd_wide", "c").await, 990, "{kind:?}");
            if let Some(redis) = &redis {
                assert_eq!(redis_count(redis, "crowd_wide", "c"), 10);
                assert_eq!(redis_count(redis, "crowd_tight", "c"), REQUESTS as u64);
            }
        }
    })
    .await;
}
