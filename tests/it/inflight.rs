//! `algorithm: concurrency` (issue #44): leases held at once, given back by a release (the
//! same descriptor with a last entry `sluice_release`). Over `/json` on both stores; 64
//! concurrent callers across two Sluice replicas on one Redis, which never hold more than the
//! limit and leave no lease behind; and, on a pinned clock, leases that expire after their unit
//! on both stores.

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kit::in_process::{pinned_limiter, pinned_store};
use kit::*;
use sluice::clock::ManualClock;
use sluice::proto::Code;
use sluice::rls::RlsOptions;

const INFLIGHT: &str = "domain: d\ndescriptors:\n  - key: inflight\n    rate_limit:\n      \
    unit: minute\n      requests_per_unit: 5\n      algorithm: concurrency\n";

fn json_body(release: bool) -> String {
    let release = if release {
        r#",{"key":"sluice_release","value":"1"}"#
    } else {
        ""
    };
    format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"inflight","value":"u"}}{release}]}}]}}"#
    )
}

/// Five acquisitions are OK, the sixth refused; a release is OK and the next acquisition is
/// admitted; a release with no lease held is OK too, and counted.
#[test]
fn json_acquisitions_and_releases_on_both_stores() {
    let config = config_dir(INFLIGHT);
    let redis = RedisServer::start();
    for server in [None, Some(&redis)] {
        let sluice = Sluice::start(config.path(), server, &[]);
        let acquire = || sluice.http("POST", "/json", &json_body(false)).0;
        let release = || sluice.http("POST", "/json", &json_body(true)).0;
        let first: Vec<u16> = (0..6).map(|_| acquire()).collect();
        assert_eq!(
            first,
            [200, 200, 200, 200, 200, 429],
            "redis: {}",
            server.is_some()
        );
        assert_eq!(release(), 200);
        assert_eq!(acquire(), 200);
        assert_eq!(acquire(), 429);
        // Give all five back, then one more than is held.
        for _ in 0..5 {
            assert_eq!(release(), 200);
        }
        assert_eq!(
            sluice.metric("sluice_concurrency_releases_total{result=\"nothing_held\"}"),
            0.0
        );
        assert_eq!(release(), 200);
        assert_eq!(
            sluice.metric("sluice_concurrency_releases_total{result=\"nothing_held\"}"),
            1.0
        );
        assert_eq!(
            sluice.metric("sluice_concurrency_releases_total{result=\"returned\"}"),
            6.0
        );
        // The release took nothing for later: five fit again, not six.
        let again: Vec<u16> = (0..6).map(|_| acquire()).collect();
        assert_eq!(again, [200, 200, 200, 200, 200, 429]);
        for _ in 0..5 {
            assert_eq!(release(), 200);
        }
    }
    // Nothing left behind on Redis once every lease was given back.
    assert_eq!(
        redis
            .cli(&["--raw", "KEYS", "*"])
            .unwrap_or_default()
            .trim(),
        ""
    );
}

/// A release of a descriptor whose limit is not a concurrency limit counts nothing: it is
/// matched as the descriptor it is (here: no limit).
#[test]
fn a_release_entry_on_another_algorithm_is_no_release() {
    let yaml = "domain: d\ndescriptors:\n  - key: inflight\n    rate_limit: {unit: minute, \
                requests_per_unit: 1}\n";
    let config = config_dir(yaml);
    let sluice = Sluice::start(config.path(), None, &[]);
    assert_eq!(sluice.http("POST", "/json", &json_body(true)).0, 200);
    assert_eq!(sluice.http("POST", "/json", &json_body(false)).0, 200);
    assert_eq!(sluice.http("POST", "/json", &json_body(false)).0, 429);
    assert_eq!(
        sluice.metric("sluice_concurrency_releases_total{result=\"returned\"}"),
        0.0
    );
}

/// 64 callers over two replicas on one Redis, each taking a lease, holding it a moment and
/// giving it back, over and over: the leases held (counted by the callers between grant and
/// release, so never more than Redis holds) never pass the limit, every caller gets through,
/// and no lease is left once they are done. Then 64 acquisitions at once admit exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_callers_on_two_replicas_hold_at_most_the_limit() {
    const LIMIT: u64 = 8;
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: inflight\n    rate_limit: {{unit: minute, \
         requests_per_unit: {LIMIT}, algorithm: concurrency}}\n"
    );
    let config = config_dir(&yaml);
    let redis = RedisServer::start();
    let replicas = [
        Sluice::start(config.path(), Some(&redis), &[]),
        Sluice::start(config.path(), Some(&redis), &[]),
    ];
    let held = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for i in 0..64 {
        let mut client = replicas[i % 2].client().await;
        let (held, most, granted) = (held.clone(), most.clone(), granted.clone());
        callers.push(tokio::spawn(async move {
            let mut mine = 0;
            while mine < 5 {
                let take = ask(
                    &mut client,
                    request("d", vec![descriptor(&[("inflight", "u")])]),
                );
                if take.await.overall_code != Code::Ok as i32 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                held.fetch_sub(1, Ordering::SeqCst);
                let give = descriptor(&[("inflight", "u"), ("sluice_release", "1")]);
                let answer = ask(&mut client, request("d", vec![give])).await;
                assert_eq!(answer.overall_code, Code::Ok as i32);
                mine += 1;
                granted.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(granted.load(Ordering::SeqCst), 64 * 5);
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} leases held at once, limit {LIMIT}");
    assert!(most > 1, "the callers never overlapped ({most})");
    assert_eq!(
        redis
            .cli(&["--raw", "KEYS", "*"])
            .unwrap_or_default()
            .trim(),
        ""
    );
    for replica in &replicas {
        assert_eq!(
            replica.metric("sluice_concurrency_releases_total{result=\"nothing_held\"}"),
            0.0
        );
    }

    // 64 acquisitions at once: exactly LIMIT admitted.
    let mut asks = Vec::new();
    for i in 0..64 {
        let mut client = replicas[i % 2].client().await;
        asks.push(tokio::spawn(async move {
            ask(
                &mut client,
                request("d", vec![descriptor(&[("inflight", "u")])]),
            )
            .await
            .overall_code
                == Code::Ok as i32
        }));
    }
    let mut admitted = 0;
    for a in asks {
        admitted += u64::from(a.await.unwrap());
    }
    assert_eq!(admitted, LIMIT);
}

/// Leases never given back (a crashed Envoy) expire one unit after they were taken, not before,
/// on both stores; a refusal says when the soonest will.
#[tokio::test(flavor = "multi_thread")]
async fn leases_never_given_back_expire_after_their_unit() {
    for_each_store(|kind, redis| async move {
        let t0 = 1_800_000_000_000_000;
        let clock = Arc::new(ManualClock::new(t0));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let limiter = pinned_limiter(store, &clock, INFLIGHT, RlsOptions::default());
        let req = request("d", vec![descriptor(&[("inflight", "u")])]);
        for _ in 0..5 {
            let ok = limiter.should_rate_limit(&req, None).await.unwrap();
            assert_eq!(ok.overall_code, Code::Ok as i32, "{kind:?}: {ok:?}");
        }
        clock.advance_micros(10_000_000);
        let over = limiter.should_rate_limit(&req, None).await.unwrap();
        assert_eq!(over.overall_code, Code::OverLimit as i32);
        assert_eq!(over.statuses[0].duration_until_reset.unwrap().seconds, 50);
        // A minute less a microsecond after they were taken: still held.
        clock.set_micros(t0 + 59_999_999);
        let held = limiter.should_rate_limit(&req, None).await.unwrap();
        assert_eq!(held.overall_code, Code::OverLimit as i32, "{kind:?}");
        clock.set_micros(t0 + 60_000_000);
        let free = limiter.should_rate_limit(&req, None).await.unwrap();
        assert_eq!(free.overall_code, Code::Ok as i32, "{kind:?}: {free:?}");
        assert_eq!(free.statuses[0].limit_remaining, 4);
    })
    .await;
}

/// The memory store and the Redis script answer a long random sequence of acquisitions,
/// releases, zero-cost looks and time steps alike (admitted, remaining, reset, used), on a
/// pinned clock: `store/concurrency.rs` and `lua/concurrency.lua` are one algorithm.
#[tokio::test(flavor = "multi_thread")]
async fn both_stores_answer_a_random_sequence_alike() {
    use sluice::store::{Check, Rule};
    let redis = RedisServer::start();
    let t0 = 1_800_000_000_000_000u64;
    let clock = Arc::new(ManualClock::new(t0));
    let memory = pinned_store(StoreKind::Memory, None, &clock).await;
    let on_redis = pinned_store(StoreKind::Redis, Some(&redis), &clock).await;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..3000 {
        let (hits, release) = match next(10) {
            0..=4 => (1 + next(3), false),
            5..=7 => (1 + next(2), true),
            8 => (0, false),
            _ => (next(9), false),
        };
        let check = Check {
            key: format!("{{k{}}}:concurrency", next(3)),
            hits,
            rule: Rule::Concurrency {
                limit: 7,
                lease: 2_000_000,
                release,
            },
            record_refused: false,
            group: None,
        };
        let a = memory.check(&[&check]).await.unwrap();
        let b = on_redis.check(&[&check]).await.unwrap();
        assert_eq!(a, b, "step {step}: {check:?}");
        clock.advance_micros(next(400_000));
    }
}

/// A release of a concurrency limit in a `rate_limits` list beside a fixed window (the full
/// script, not the lean one, on Redis) gives back its lease and counts nothing on the window.
#[test]
fn a_list_with_a_concurrency_limit_releases_only_it() {
    let yaml = "domain: d\ndescriptors:\n  - key: inflight\n    rate_limits:\n      - {unit: \
                minute, requests_per_unit: 2, algorithm: concurrency}\n      - {unit: minute, \
                requests_per_unit: 4}\n";
    let config = config_dir(yaml);
    let redis = RedisServer::start();
    for server in [None, Some(&redis)] {
        let sluice = Sluice::start(config.path(), server, &[]);
        let acquire = || sluice.http("POST", "/json", &json_body(false)).0;
        let release = || sluice.http("POST", "/json", &json_body(true)).0;
        assert_eq!([acquire(), acquire(), acquire()], [200, 200, 429]);
        assert_eq!(release(), 200);
        assert_eq!(release(), 200);
        // Two leases free again; the window counted only the two admitted requests (a list's
        // refused request charges only the limits that refuse it), so it takes two more.
        assert_eq!(
            [acquire(), acquire()],
            [200, 200],
            "redis {}",
            server.is_some()
        );
        assert_eq!([release(), release()], [200, 200]);
        // Leases free, the window full (4 of 4): refused by the window, and the releases
        // counted nothing on it.
        assert_eq!(acquire(), 429);
        assert_eq!(
            sluice.metric("sluice_concurrency_releases_total{result=\"returned\"}"),
            4.0
        );
    }
}

/// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, a request whose other descriptor goes over
/// (a cost charged at stream end) still gives its lease back: a release is never only looked at.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_beside_a_charge_that_goes_over_still_gives_back() {
    let yaml = "domain: d\ndescriptors:\n  - key: inflight\n    rate_limit: {unit: minute, \
                requests_per_unit: 1, algorithm: concurrency}\n  - key: tokens\n    rate_limit: \
                {unit: minute, requests_per_unit: 10}\n";
    let config = config_dir(yaml);
    let env = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];
    let sluice = Sluice::start(config.path(), None, &env);
    let mut client = sluice.client().await;
    let take = || request("d", vec![descriptor(&[("inflight", "u")])]);
    assert_eq!(ask(&mut client, take()).await.overall_code, Code::Ok as i32);
    let mut cost = descriptor(&[("tokens", "u")]);
    cost.hits_addend = Some(50);
    let give = descriptor(&[("inflight", "u"), ("sluice_release", "1")]);
    let done = ask(&mut client, request("d", vec![give, cost])).await;
    assert_eq!(done.statuses[0].code, Code::Ok as i32, "{done:?}");
    let again = ask(&mut client, take()).await;
    assert_eq!(
        again.overall_code,
        Code::Ok as i32,
        "the lease was given back: {again:?}"
    );
}

/// An answer carries the `sluice_release` mark (which Envoy's release reads) only when the
/// request took a lease: not when refused, and not when a `rate_limits` list's other limit
/// refused it (the list charged nothing, so its concurrency limit took no lease).
#[tokio::test(flavor = "multi_thread")]
async fn the_lease_mark_is_set_only_when_a_lease_was_taken() {
    let yaml = "domain: d\ndescriptors:\n  - key: inflight\n    rate_limits:\n      - {unit: \
                minute, requests_per_unit: 2, algorithm: concurrency}\n      - {unit: minute, \
                requests_per_unit: 1}\n";
    let config = config_dir(yaml);
    let sluice = Sluice::start(config.path(), None, &[]);
    let mut client = sluice.client().await;
    let marked = |r: &sluice::proto::RateLimitResponse| {
        r.dynamic_metadata
            .as_ref()
            .is_some_and(|m| m.fields.contains_key("sluice_release"))
    };
    let take = || request("d", vec![descriptor(&[("inflight", "u")])]);
    let first = ask(&mut client, take()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert!(marked(&first), "{first:?}");
    // The window (1 a minute) refuses the second; the concurrency limit alone would admit it.
    let second = ask(&mut client, take()).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    assert!(!marked(&second), "{second:?}");
}

/// Under `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` a request with another descriptor over its
/// limit charges nothing else: its concurrency check took no lease, and its answer has no mark.
#[tokio::test(flavor = "multi_thread")]
async fn no_lease_mark_when_stop_increment_charged_nothing() {
    let yaml = "domain: d\ndescriptors:\n  - key: inflight\n    rate_limit: {unit: minute, \
                requests_per_unit: 2, algorithm: concurrency}\n  - key: other\n    rate_limit: \
                {unit: minute, requests_per_unit: 0}\n";
    let config = config_dir(yaml);
    let env = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];
    let sluice = Sluice::start(config.path(), None, &env);
    let mut client = sluice.client().await;
    let both = request(
        "d",
        vec![
            descriptor(&[("inflight", "u")]),
            descriptor(&[("other", "x")]),
        ],
    );
    let answer = ask(&mut client, both).await;
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    let marked = answer
        .dynamic_metadata
        .as_ref()
        .is_some_and(|m| m.fields.contains_key("sluice_release"));
    assert!(!marked, "{answer:?}");
    // And indeed nothing was taken: both leases are free.
    let mut look = descriptor(&[("inflight", "u")]);
    look.hits_addend = Some(0);
    let free = ask(&mut client, request("d", vec![look])).await;
    assert_eq!(free.statuses[0].limit_remaining, 2, "{free:?}");
}
