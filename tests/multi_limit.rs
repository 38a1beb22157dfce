//! Windows of several units (`unit_multiplier`) and several limits on one descriptor
//! (`rate_limits`), through a real `RateLimiter` on both stores (issue #18).
//!
//! Time is pinned: the memory store and the Redis script both read a `ManualClock` (Redis's
//! through `RedisOptions::pinned_clock`), so what a test says about windows and resets holds
//! however slow the machine is.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{RedisServer, StoreKind, descriptor, for_each_store, request};
use sluice::clock::{Clock, ManualClock};
use sluice::config::{LoadOptions, load_sources};
use sluice::proto::{Code, RateLimitResponse};
use sluice::rls::{HeaderNames, KeyBuilder, RateLimiter, RlsOptions};
use sluice::store::redis::Target;
use sluice::store::{CounterStore, MemoryStore, MemoryStoreOptions, RedisOptions, RedisStore};

/// A multiple of 300 s (and so of 60 s): a 5-minute window starts here.
const BOUNDARY_SECS: u64 = 1_700_000_100;

fn store_for(
    kind: &StoreKind,
    redis: Option<&RedisServer>,
    clock: &Arc<ManualClock>,
) -> Arc<dyn CounterStore> {
    match kind {
        StoreKind::Memory => Arc::new(MemoryStore::new(
            MemoryStoreOptions::default(),
            clock.clone(),
        )),
        StoreKind::Redis => {
            let server = redis.expect("a Redis store has a server");
            let store = RedisStore::new(RedisOptions {
                target: Target::Single(server.url()),
                auth: None,
                sentinel_auth: None,
                tls: Default::default(),
                pool_size: 4,
                timeout: Duration::from_secs(30),
                expiration_jitter_max: Duration::ZERO,
                pinned_clock: Some(clock.clone()),
            })
            .expect("the store starts");
            futures::executor::block_on(store.wait_until_ready(Some(Duration::from_secs(30))))
                .expect("redis is ready");
            Arc::new(store)
        }
    }
}

fn limiter(
    store: Arc<dyn CounterStore>,
    clock: &Arc<ManualClock>,
    yaml: &str,
    options: RlsOptions,
) -> RateLimiter {
    let limiter = RateLimiter::new(store, KeyBuilder::default(), clock.clone(), options);
    let config = load_sources(
        vec![(PathBuf::from("multi.yaml"), yaml.to_string())],
        &LoadOptions::default(),
    )
    .expect("test config loads");
    limiter.set_config(Arc::new(config));
    limiter
}

fn with_headers() -> RlsOptions {
    RlsOptions {
        response_headers: Some(HeaderNames::default()),
        draft_headers: true,
        ..Default::default()
    }
}

async fn ask(limiter: &RateLimiter, pairs: &[(&str, &str)]) -> RateLimitResponse {
    limiter
        .should_rate_limit(&request("d", vec![descriptor(pairs)]))
        .await
        .expect("a valid request is decided")
}

fn header<'r>(response: &'r RateLimitResponse, name: &str) -> &'r str {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
        .unwrap_or_else(|| panic!("no header {name} in {response:?}"))
}

fn reset_secs(response: &RateLimitResponse) -> i64 {
    response.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("a counted status has a reset")
        .seconds
}

fn secs(s: u64) -> u64 {
    s * 1_000_000
}

#[tokio::test(flavor = "multi_thread")]
async fn a_five_minute_fixed_window_is_epoch_aligned_across_a_boundary() {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS - 10)));
        let store = store_for(&kind, redis.as_ref(), &clock);
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: \
                    {unit: minute, unit_multiplier: 5, requests_per_unit: 3}\n";
        let limiter = limiter(store, &clock, yaml, with_headers());

        // 10 s before a 300 s boundary: the window that started 290 s ago ends in 10 s.
        let first = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(first.overall_code, Code::Ok as i32);
        assert_eq!(reset_secs(&first), 10, "{first:?}");
        assert_eq!(header(&first, "RateLimit-Reset"), "10");
        assert_eq!(header(&first, "RateLimit-Limit"), "3");
        assert_eq!(header(&first, "RateLimit-Remaining"), "2");
        assert_eq!(header(&first, "RateLimit-Policy"), "\"default\";q=3;w=300");
        for _ in 0..2 {
            assert_eq!(
                ask(&limiter, &[("k", "a")]).await.overall_code,
                Code::Ok as i32
            );
        }
        clock.advance_micros(secs(5));
        let over = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(over.overall_code, Code::OverLimit as i32, "{over:?}");
        assert_eq!(reset_secs(&over), 5);

        // Across the boundary a new 300 s window starts, with its own key.
        clock.set_micros(secs(BOUNDARY_SECS) + 250_000);
        let fresh = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(fresh.overall_code, Code::Ok as i32, "{fresh:?}");
        assert_eq!(reset_secs(&fresh), 300);
        assert_eq!(header(&fresh, "RateLimit-Reset"), "300");
        assert_eq!(header(&fresh, "RateLimit-Remaining"), "2");
        // 299 s into it, still the same window: one reset second left.
        clock.set_micros(secs(BOUNDARY_SECS + 299));
        let late = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(header(&late, "RateLimit-Remaining"), "1");
        assert_eq!(reset_secs(&late), 1);

        if let Some(server) = &redis {
            let mut keys: Vec<String> = server
                .cli(&["--raw", "KEYS", "*"])
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .filter(|k| !k.is_empty())
                .collect();
            keys.sort();
            assert_eq!(
                keys,
                vec![
                    format!("d_k_a_{}", BOUNDARY_SECS - 300),
                    format!("d_k_a_{BOUNDARY_SECS}"),
                ]
            );
            let ttl: u64 = server
                .cli(&["PTTL", &format!("d_k_a_{BOUNDARY_SECS}")])
                .unwrap_or_default()
                .trim()
                .parse()
                .expect("a TTL");
            assert!(ttl > 200_000 && ttl <= 300_000, "ttl {ttl} ms");
        }
        let _ = clock.now_secs();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn other_algorithms_take_the_multiplied_window_as_their_period() {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS)));
        let store = store_for(&kind, redis.as_ref(), &clock);
        // 2 per 15 minutes, in a sliding log: the third is refused for the whole 900 s.
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, \
                    unit_multiplier: 15, requests_per_unit: 2, algorithm: sliding_window_log}\n";
        let limiter = limiter(store, &clock, yaml, with_headers());
        assert_eq!(
            ask(&limiter, &[("k", "a")]).await.overall_code,
            Code::Ok as i32
        );
        clock.advance_micros(secs(100));
        assert_eq!(
            ask(&limiter, &[("k", "a")]).await.overall_code,
            Code::Ok as i32
        );
        clock.advance_micros(secs(700));
        let refused = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(refused.overall_code, Code::OverLimit as i32, "{refused:?}");
        // The first entry leaves the log 900 s after it came: 100 s from now.
        assert_eq!(reset_secs(&refused), 100);
        assert_eq!(
            header(&refused, "RateLimit-Policy"),
            "\"default\";q=2;w=900"
        );
        clock.advance_micros(secs(100));
        assert_eq!(
            ask(&limiter, &[("k", "a")]).await.overall_code,
            Code::Ok as i32
        );
    })
    .await;
}

/// The load error for `yaml`, as `check-config` prints it.
fn load_error(yaml: &str) -> String {
    load_sources(
        vec![(PathBuf::from("bad.yaml"), yaml.to_string())],
        &LoadOptions::default(),
    )
    .expect_err("the config is refused")
    .to_string()
}

#[test]
fn check_config_refuses_bad_unit_multipliers() {
    for (value, reason) in [
        (
            "0",
            "unit_multiplier must be a whole number of at least 1, found: '0'",
        ),
        (
            "-5",
            "unit_multiplier must be a whole number of at least 1, found: '-5'",
        ),
        (
            "2.5",
            "unit_multiplier must be a whole number of at least 1, found: '2.5'",
        ),
        (
            "five",
            "unit_multiplier must be a whole number of at least 1, found: 'five'",
        ),
        (
            "101",
            "unit_multiplier 101 makes a window longer than 100 years",
        ),
    ] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: year\n      \
             requests_per_unit: 1\n      unit_multiplier: {value}\n"
        );
        let error = load_error(&yaml);
        assert!(
            error.starts_with(&format!("bad.yaml:7: {reason}")),
            "{value}: {error}"
        );
    }
}
