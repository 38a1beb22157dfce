//! Windows of several units (`unit_multiplier`) and several limits on one descriptor
//! (`rate_limits`), through a real `RateLimiter` on both stores (issue #18).
//!
//! Time is pinned: the memory store and the Redis script both read a `ManualClock` (Redis's
//! through `RedisOptions::pinned_clock`), so what a test says about windows and resets holds
//! however slow the machine is.

use sluice_test_kit as kit;

use std::path::PathBuf;
use std::sync::Arc;

use kit::in_process::{load_error, pinned_limiter, pinned_store};
use kit::{RedisServer, StoreKind, descriptor, for_each_store, request};
use sluice::clock::{Clock, ManualClock};
use sluice::config::{LoadOptions, load_sources};
use sluice::proto::{Code, RateLimitResponse};
use sluice::rls::{HeaderNames, RateLimiter, RlsOptions};
use sluice::store::{MemoryStore, MemoryStoreOptions};

/// A multiple of 300 s (and so of 60 s): a 5-minute window starts here.
const BOUNDARY_SECS: u64 = 1_700_000_100;

fn with_headers() -> RlsOptions {
    RlsOptions {
        response_headers: Some(HeaderNames::default()),
        draft_headers: true,
        ..Default::default()
    }
}

async fn ask(limiter: &RateLimiter, pairs: &[(&str, &str)]) -> RateLimitResponse {
    limiter
        .should_rate_limit(&request("d", vec![descriptor(pairs)]), None)
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
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: \
                    {unit: minute, unit_multiplier: 5, requests_per_unit: 3}\n";
        let limiter = pinned_limiter(store, &clock, yaml, with_headers());

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
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        // 2 per 15 minutes, in a sliding log: the third is refused for the whole 900 s.
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, \
                    unit_multiplier: 15, requests_per_unit: 2, algorithm: sliding_window_log}\n";
        let limiter = pinned_limiter(store, &clock, yaml, with_headers());
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

/// 5 per second and 20 per minute on one descriptor, named so statuses show which decided.
const BURST_AND_SUSTAINED: &str = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 5}
      - {name: sustained, unit: minute, requests_per_unit: 20}
";

/// The same budgets, counted by a sliding-window log and a token bucket.
const LOG_AND_BUCKET: &str = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 5, algorithm: sliding_window_log}
      - {name: sustained, unit: minute, requests_per_unit: 20, algorithm: token_bucket}
";

const CALLERS: usize = 64;

/// `CALLERS` concurrent requests for `k=a`; returns the responses.
async fn flood(limiter: &Arc<RateLimiter>) -> Vec<RateLimitResponse> {
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { ask(&limiter, &[("k", "a")]).await })
        })
        .collect();
    let mut responses = Vec::with_capacity(CALLERS);
    for task in tasks {
        responses.push(task.await.expect("a caller finishes"));
    }
    responses
}

fn admitted(responses: &[RateLimitResponse]) -> usize {
    responses
        .iter()
        .filter(|r| r.overall_code == Code::Ok as i32)
        .count()
}

/// The name of the limit a refused response's status names (all refused ones agree).
fn refused_by(responses: &[RateLimitResponse]) -> String {
    let names: std::collections::BTreeSet<String> = responses
        .iter()
        .filter(|r| r.overall_code == Code::OverLimit as i32)
        .map(|r| {
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.name.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names.into_iter().next().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_and_sustained_fixed_windows_under_64_callers() {
    burst_and_sustained(RlsOptions::default).await;
}

/// The same with the local over-limit cache and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, which
/// must not change what a group admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_and_sustained_with_the_local_cache_and_stop_increment() {
    burst_and_sustained(|| RlsOptions {
        local_cache_bytes: 1 << 20,
        stop_increment_when_over: true,
        ..Default::default()
    })
    .await;
}

async fn burst_and_sustained(options: fn() -> RlsOptions) {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let limiter = Arc::new(pinned_limiter(
            store,
            &clock,
            BURST_AND_SUSTAINED,
            options(),
        ));
        // Exactly 5 in each of the first four seconds: the 59 refused each second charged
        // neither limit, or the minute's 20 would be gone after the first.
        for second in 0..4 {
            let responses = flood(&limiter).await;
            assert_eq!(admitted(&responses), 5, "{kind:?}, second {second}");
            // Once both are over, the status names the one that refuses longest.
            let deciding = if second < 3 { "burst" } else { "sustained" };
            assert_eq!(refused_by(&responses), deciding, "second {second}");
            let refused = responses
                .iter()
                .find(|r| r.overall_code == Code::OverLimit as i32)
                .expect("some are refused");
            let wait = if second < 3 { 1 } else { 57 };
            assert_eq!(reset_secs(refused), wait, "second {second}");
            clock.advance_micros(secs(1));
        }
        // The minute's 20 are used: nothing more until it ends, and its limit says so.
        for _ in 4..10 {
            let responses = flood(&limiter).await;
            assert_eq!(admitted(&responses), 0, "{kind:?}");
            assert_eq!(refused_by(&responses), "sustained");
            clock.advance_micros(secs(1));
        }
        let refused = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(reset_secs(&refused), 50, "{refused:?}");
        // The next minute starts a fresh budget.
        clock.set_micros(secs(BOUNDARY_SECS + 60) + 100_000);
        assert_eq!(admitted(&flood(&limiter).await), 5, "{kind:?}, next minute");

        if let Some(server) = &redis {
            let mut keys: Vec<String> = server
                .cli(&["--raw", "KEYS", "*"])
                .unwrap_or_default()
                .lines()
                .filter(|k| !k.is_empty() && k.contains(":fixed_window:60_"))
                .map(str::to_string)
                .collect();
            keys.sort();
            assert_eq!(
                keys,
                vec![
                    format!("{{d_k_a}}:fixed_window:60_{BOUNDARY_SECS}"),
                    format!("{{d_k_a}}:fixed_window:60_{}", BOUNDARY_SECS + 60),
                ]
            );
            // The minute's window counts the 20 it admitted and, as a lone fixed window does
            // (upstream's rule), the hits it refused itself: the 59 of second 3, the 6 × 64 of
            // seconds 4 to 9 and the one after. The 3 × 59 that only the one-second log refused
            // while the minute still had room are not counted.
            let minute = server
                .cli(&["GET", &format!("{{d_k_a}}:fixed_window:60_{BOUNDARY_SECS}")])
                .unwrap_or_default();
            let counted = 20 + (CALLERS - 5) + 6 * CALLERS + 1;
            assert_eq!(
                minute.trim(),
                counted.to_string(),
                "only the minute's own refusals are counted"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sliding_log_and_a_token_bucket_under_64_callers() {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let limiter = Arc::new(pinned_limiter(
            store,
            &clock,
            LOG_AND_BUCKET,
            RlsOptions::default(),
        ));
        // The log admits 5 in any second; the bucket holds 20. Refused requests take nothing
        // from either, so four spaced floods get 5 each.
        let mut total = 0;
        for batch in 0..4 {
            let responses = flood(&limiter).await;
            assert_eq!(admitted(&responses), 5, "{kind:?}, batch {batch}");
            assert_eq!(refused_by(&responses), "burst");
            total += 5;
            clock.advance_micros(1_100_000);
        }
        // 4.5 s in, the bucket has refilled one request every 3 s: at most 2 more, and it is
        // the bucket that refuses the rest.
        let responses = flood(&limiter).await;
        let more = admitted(&responses);
        assert!((1..=2).contains(&more), "{kind:?}: {more}");
        assert_eq!(refused_by(&responses), "sustained");
        total += more;
        // Over the rest of the minute, never more than the bucket refills (20 per minute).
        for _ in 0..11 {
            clock.advance_micros(secs(5));
            total += admitted(&flood(&limiter).await);
        }
        let elapsed = 0.1 + 4.4 + 55.0;
        assert!(
            total as f64 <= 20.0 + elapsed / 3.0 + 1.0,
            "{kind:?}: {total} admitted in {elapsed} s"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_and_headers_show_the_deciding_limit() {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let limiter = pinned_limiter(store, &clock, BURST_AND_SUSTAINED, with_headers());
        // First: burst has 4 left, sustained 19: burst (least remaining) decides.
        let first = ask(&limiter, &[("k", "a")]).await;
        let name = |r: &RateLimitResponse| r.statuses[0].current_limit.clone().unwrap().name;
        assert_eq!(name(&first), "burst", "{kind:?}");
        assert_eq!(header(&first, "RateLimit-Limit"), "5");
        assert_eq!(header(&first, "RateLimit-Remaining"), "4");
        assert_eq!(header(&first, "RateLimit-Reset"), "1");
        assert_eq!(header(&first, "RateLimit-Policy"), "\"burst\";q=5;w=1");
        // Spend 16 more over four seconds: sustained has 3 left, burst (new second) 5.
        for _ in 0..4 {
            clock.advance_micros(secs(1));
            for _ in 0..4 {
                assert_eq!(
                    ask(&limiter, &[("k", "a")]).await.overall_code,
                    Code::Ok as i32
                );
            }
        }
        clock.advance_micros(secs(1));
        let later = ask(&limiter, &[("k", "a")]).await;
        assert_eq!(name(&later), "sustained", "{kind:?}");
        assert_eq!(header(&later, "RateLimit-Limit"), "20");
        assert_eq!(header(&later, "RateLimit-Remaining"), "2");
        assert_eq!(header(&later, "RateLimit-Reset"), "55");
        assert_eq!(
            header(&later, "RateLimit-Policy"),
            "\"sustained\";q=20;w=60"
        );
    })
    .await;
}

/// `cmdstat_evalsha`'s calls in `INFO commandstats`.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info = server.cli(&["INFO", "commandstats"]).unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_limit_descriptor_costs_one_script_call() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
    let store = pinned_store(StoreKind::Redis, Some(&server), &clock).await;
    let limiter = pinned_limiter(store, &clock, BURST_AND_SUSTAINED, RlsOptions::default());
    // The first call may load the script; count from the second.
    ask(&limiter, &[("k", "a")]).await;
    for _ in 0..10 {
        let before = evalsha_calls(&server);
        ask(&limiter, &[("k", "a")]).await;
        assert_eq!(evalsha_calls(&server), before + 1);
    }
    let info = server.cli(&["INFO", "commandstats"]).unwrap_or_default();
    assert!(!info.contains("cmdstat_eval:"), "{info}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replaces_drops_one_limit_of_a_list() {
    let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
    let store = pinned_store(StoreKind::Memory, None, &clock).await;
    // `vip` replaces the list's burst limit: only the 3-per-minute one still counts.
    let yaml = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 1}
      - {name: sustained, unit: minute, requests_per_unit: 3}
  - key: vip
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: burst}]}
";
    let limiter = pinned_limiter(store, &clock, yaml, RlsOptions::default());
    let both = || {
        request(
            "d",
            vec![descriptor(&[("k", "a")]), descriptor(&[("vip", "x")])],
        )
    };
    for _ in 0..3 {
        let r = limiter.should_rate_limit(&both(), None).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        assert_eq!(
            r.statuses[0].current_limit.as_ref().unwrap().name,
            "sustained"
        );
    }
    let r = limiter.should_rate_limit(&both(), None).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // Without vip the burst limit is back.
    clock.advance_micros(secs(60));
    assert_eq!(
        ask(&limiter, &[("k", "a")]).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        ask(&limiter, &[("k", "a")]).await.overall_code,
        Code::OverLimit as i32
    );
}

#[test]
fn check_config_refuses_bad_rate_limits() {
    let cases = [
        (
            "    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n",
            "bad.yaml:6: a descriptor has rate_limit or rate_limits, not both",
        ),
        (
            "    rate_limits: []\n",
            "bad.yaml:4: rate_limits must list at least one rate limit",
        ),
        (
            "    rate_limits: {unit: second, requests_per_unit: 1}\n",
            "bad.yaml:4: rate_limits must be a list of rate limits",
        ),
        (
            "    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unlimited: true}\n",
            "bad.yaml:6: unlimited has no meaning in rate_limits",
        ),
        (
            "    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: second, unit_multiplier: 60, requests_per_unit: 9}\n",
            "bad.yaml:6: two limits of one rate_limits list with algorithm fixed_window and a window of 60s",
        ),
        (
            "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      rate_limits: []\n",
            "bad.yaml:7: config error, 'rate_limits' is only valid on a descriptor",
        ),
        (
            "    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: hour, requests_per_unit: 9, unit_multiplier: 0}\n",
            "bad.yaml:6: unit_multiplier must be a whole number of at least 1, found: '0'",
        ),
        // Issue #27 item 9: two limits sharing a name shared their stats, so neither could be
        // read apart (loaded before).
        (
            "    rate_limits:\n      - {name: a, unit: minute, requests_per_unit: 1}\n      - {name: a, unit: hour, requests_per_unit: 9}\n",
            "bad.yaml:6: two limits of one rate_limits list named 'a' (the first on line 5); their stats would merge",
        ),
        (
            "    rate_limits:\n      - {name: limit2, unit: minute, requests_per_unit: 1}\n      - {unit: hour, requests_per_unit: 9}\n",
            "bad.yaml:6: two limits of one rate_limits list whose stats are named 'limit2' (the first on line 5)",
        ),
    ];
    for (body, expected) in cases {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n{body}");
        let error = load_error(&yaml);
        assert!(error.starts_with(expected), "{body}: {error}");
    }
}

#[test]
fn dumps_and_stats_name_each_limit() {
    let config = load_sources(
        vec![(
            PathBuf::from("multi.yaml"),
            format!(
                "{LOG_AND_BUCKET}  - key: report\n    rate_limit: {{unit: minute, \
                 unit_multiplier: 15, requests_per_unit: 4}}\n"
            ),
        )],
        &LoadOptions::default(),
    )
    .expect("loads");
    let limits = config.limits();
    let dump: Vec<String> = limits
        .iter()
        .map(|l| sluice::config::UpstreamDumpLine(l).to_string())
        .collect();
    assert_eq!(
        dump,
        vec![
            "d.k: unit=SECOND requests_per_unit=5, shadow_mode: false, limit: 1 of 2 (burst)",
            "d.k: unit=MINUTE requests_per_unit=20, shadow_mode: false, limit: 2 of 2 (sustained)",
            "d.report: unit=MINUTE unit_multiplier=15 requests_per_unit=4, shadow_mode: false",
        ]
    );
    let lines: Vec<String> = limits.iter().map(|l| l.to_string()).collect();
    assert!(lines[0].contains("name=burst limit 1 of 2"), "{lines:?}");
    assert!(
        lines[2].starts_with("d.report: 4/15 minutes fixed_window"),
        "{lines:?}"
    );
    let entries = descriptor(&[("k", "a")]).entries;
    let stats: Vec<String> = limits[..2]
        .iter()
        .map(|l| sluice::metrics::stats_key(l, &entries).into_owned())
        .collect();
    assert_eq!(stats, vec!["k_burst", "k_sustained"]);
    // Distinct metric slots for each limit of the list.
    assert_ne!(limits[0].id, limits[1].id);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_goes_to_the_per_second_store_only_when_all_its_limits_are_per_second() {
    let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
    let main = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    let fast = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    let yaml = format!(
        "{BURST_AND_SUSTAINED}  - key: fast\n    rate_limits:\n      - {{unit: second, \
         requests_per_unit: 5}}\n      - {{unit: second, unit_multiplier: 10, requests_per_unit: \
         20}}\n"
    );
    let limiter = pinned_limiter(main.clone(), &clock, &yaml, RlsOptions::default())
        .with_per_second_store(fast.clone());
    assert_eq!(
        ask(&limiter, &[("k", "a")]).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        (main.len(), fast.len()),
        (2, 0),
        "a mixed list stays in the main store"
    );
    assert_eq!(
        ask(&limiter, &[("fast", "a")]).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        (main.len(), fast.len()),
        (2, 2),
        "an all-second list goes to the fast one"
    );
}

/// A running `sluice serve`: `/metrics` counts each limit of a list under its own `key1`, the
/// debug port's `/rlconfig` has one line per limit, and `sluice check-config` prints a bad
/// list's error as `file:line: reason` and exits 1.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_service_names_each_limit() {
    let dir = kit::config_dir(BURST_AND_SUSTAINED);
    let sluice = kit::Sluice::start(dir.path(), None, &[("USE_STATSD", "false")]);
    let mut client = sluice.client().await;
    for _ in 0..7 {
        kit::ask(&mut client, request("d", vec![descriptor(&[("k", "a")])])).await;
    }
    // The first second admits 5 (a slow machine may spread the 7 over two seconds: 6 or 7).
    let hits = |key: &str| {
        sluice.metric(&format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"d\",key1=\"{key}\"}}"
        ))
    };
    assert_eq!((hits("k_burst"), hits("k_sustained")), (7.0, 7.0));
    let burst_over =
        sluice.metric("ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"k_burst\"}");
    assert!((0.0..=2.0).contains(&burst_over), "{burst_over}");
    let (status, dump) = kit::http_request(sluice.debug, "GET", "/rlconfig", "");
    assert_eq!(status, 200);
    assert_eq!(
        dump,
        "d.k: unit=SECOND requests_per_unit=5, shadow_mode: false, limit: 1 of 2 (burst)\n\
         d.k: unit=MINUTE requests_per_unit=20, shadow_mode: false, limit: 2 of 2 (sustained)\n"
    );

    let bad = kit::config_dir("domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .arg(bad.path())
        .output()
        .expect("check-config runs");
    assert_eq!(out.status.code(), Some(1));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let file = bad.path().join("config.yaml");
    assert!(
        text.contains(&format!(
            "{}:4: rate_limits must list at least one rate limit",
            file.display()
        )),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shadow_and_quota_mode_apply_to_every_limit_of_a_list() {
    let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
    let store = pinned_store(StoreKind::Memory, None, &clock).await;
    let yaml = "domain: d
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limits:
      - {name: s1, unit: second, requests_per_unit: 1}
      - {name: s2, unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limits:
      - {name: q1, unit: second, requests_per_unit: 1}
      - {name: q2, unit: minute, requests_per_unit: 5}
";
    let limiter = pinned_limiter(store, &clock, yaml, RlsOptions::default());
    assert_eq!(
        ask(&limiter, &[("shadow", "a")]).await.overall_code,
        Code::Ok as i32
    );
    // Over s1, answered OK all the same, with nothing left.
    let shadowed = ask(&limiter, &[("shadow", "a")]).await;
    assert_eq!(shadowed.overall_code, Code::Ok as i32);
    assert_eq!(shadowed.statuses[0].code, Code::Ok as i32);
    assert_eq!(shadowed.statuses[0].limit_remaining, 0);
    assert_eq!(
        shadowed.statuses[0].current_limit.as_ref().unwrap().name,
        "s1"
    );
    // A quota descriptor over its list beside one that is not: OK overall.
    let both = request(
        "d",
        vec![descriptor(&[("quota", "a")]), descriptor(&[("quota", "b")])],
    );
    assert_eq!(
        ask(&limiter, &[("quota", "a")]).await.overall_code,
        Code::Ok as i32
    );
    let r = limiter.should_rate_limit(&both, None).await.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_override_from_envoy_keeps_one_unit() {
    let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS + 30)));
    let store = pinned_store(StoreKind::Memory, None, &clock).await;
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: \
                {unit: minute, unit_multiplier: 5, requests_per_unit: 3}\n";
    let limiter = pinned_limiter(store, &clock, yaml, with_headers());
    let mut overridden = descriptor(&[("k", "a")]);
    overridden.limit = Some(sluice::proto::RateLimitOverride {
        requests_per_unit: 2,
        unit: sluice::proto::OverrideUnit::Minute as i32,
    });
    let r = limiter
        .should_rate_limit(&request("d", vec![overridden]), None)
        .await
        .unwrap();
    // One minute, 30 s into it: 30 s left (the config's 5-minute window would leave 270).
    assert_eq!(reset_secs(&r), 30, "{r:?}");
    assert_eq!(header(&r, "RateLimit-Policy"), "\"default\";q=2;w=60");
    // The config's limit on another value: its 5-minute window.
    let configured = ask(&limiter, &[("k", "b")]).await;
    assert_eq!(reset_secs(&configured), 270);
}

/// 5 per hour and 6 per day on one descriptor: after an hour, what the day still admits shows
/// what the first hour charged it.
const HOUR_AND_DAY: &str = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {name: hour, unit: hour, requests_per_unit: 5}
      - {name: day, unit: day, requests_per_unit: 6}
";

/// The same with the hour counted by a sliding-window log.
const LOG_HOUR_AND_DAY: &str = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {name: hour, unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}
      - {name: day, unit: day, requests_per_unit: 6}
";

/// The same, with every value starting `a` sharing the counters (`share_threshold`).
const SHARED_HOUR_AND_DAY: &str = "domain: d
descriptors:
  - key: k
    value: a*
    share_threshold: true
    rate_limits:
      - {name: hour, unit: hour, requests_per_unit: 5}
      - {name: day, unit: day, requests_per_unit: 6}
";

/// Issue #27 item 7: one request carrying the same `rate_limits` descriptor twice (a virtual
/// host's and a route's action can both produce it). Each copy's trial must see what the copy
/// before it charges, so the copy that goes over is refused as a whole and charges neither
/// limit. Before the fix both copies were tried against the same state, both looked admitted
/// and both were charged: the hour and day counters went to 6 and the next hour admitted 0.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_descriptor_is_all_or_nothing_per_copy() {
    for yaml in [HOUR_AND_DAY, LOG_HOUR_AND_DAY] {
        for stop in [false, true] {
            repeated_descriptor(yaml, stop, ("a", "a"), "d_k_a").await;
        }
    }
}

/// The same for two different descriptors of one request that share their counters: the
/// second is judged after what the first charges.
#[tokio::test(flavor = "multi_thread")]
async fn descriptors_sharing_counters_are_all_or_nothing_per_descriptor() {
    for stop in [false, true] {
        repeated_descriptor(SHARED_HOUR_AND_DAY, stop, ("a1", "a2"), "d_k_a*").await;
    }
}

async fn repeated_descriptor(
    yaml: &'static str,
    stop: bool,
    values: (&'static str, &'static str),
    key: &'static str,
) {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(secs(BOUNDARY_SECS) + 100_000));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let options = RlsOptions {
            stop_increment_when_over: stop,
            ..Default::default()
        };
        let limiter = pinned_limiter(store, &clock, yaml, options);
        let case = format!("{kind:?}, stop {stop}, {}", &yaml[40..]);
        for i in 0..4 {
            let one = ask(&limiter, &[("k", values.0)]).await;
            assert_eq!(one.overall_code, Code::Ok as i32, "{case}: request {i}");
        }
        // Four charged; the first copy takes the hour's fifth, the second copy would be the
        // sixth: the request is refused, and only the first copy is charged.
        let twice = limiter
            .should_rate_limit(
                &request(
                    "d",
                    vec![
                        descriptor(&[("k", values.0)]),
                        descriptor(&[("k", values.1)]),
                    ],
                ),
                None,
            )
            .await
            .expect("a valid request is decided");
        assert_eq!(twice.overall_code, Code::OverLimit as i32, "{case}");
        let codes: Vec<i32> = twice.statuses.iter().map(|s| s.code).collect();
        assert_eq!(
            codes,
            vec![Code::Ok as i32, Code::OverLimit as i32],
            "{case}: {twice:?}"
        );
        assert_eq!(
            twice.statuses[1]
                .current_limit
                .as_ref()
                .map(|l| l.name.as_str()),
            Some("hour"),
            "{case}"
        );
        // Charged: the first copy (the fifth hit), except under STOP_CACHE_KEY_INCREMENT_WHEN_
        // OVERLIMIT, where a call with a refused check charges only what goes over (here
        // nothing: a refused group charges nothing).
        let day_used = if stop { 4 } else { 5 };
        if let Some(server) = &redis {
            let day_start = BOUNDARY_SECS - BOUNDARY_SECS % 86_400;
            let day = server
                .cli(&["GET", &format!("{{{key}}}:fixed_window:86400_{day_start}")])
                .unwrap_or_default();
            assert_eq!(day.trim(), day_used.to_string(), "{case}: the day counter");
        }
        // The next hour (same day) admits what the day has left.
        clock.advance_micros(secs(3_601));
        let mut next_hour = 0;
        for _ in 0..4 {
            if ask(&limiter, &[("k", values.0)]).await.overall_code == Code::Ok as i32 {
                next_hour += 1;
            }
        }
        assert_eq!(
            next_hour,
            6 - day_used,
            "{case}: the day's counter after the repeated descriptor"
        );
    })
    .await;
}
