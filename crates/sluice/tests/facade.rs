//! The façade (`sluice::Limits`, `sluice::Limiter`) on each store: what a check answers, how
//! hits are charged, limits replaced at run time, key prefixes, invalid checks, and a Redis
//! that is not there or goes away and comes back.

#![cfg(feature = "redis")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use sluice::clock::ManualClock;
use sluice::config::Unit;
use sluice::{Error, Limiter, Limits};

use common::STORES;

/// `n` per minute per `user`, over any trailing minute (no window boundary in a test).
fn per_user(n: u32) -> Limits {
    Limits::from_yaml(&format!(
        "domain: app
descriptors:
  - key: user
    rate_limit: {{name: per_user, unit: minute, requests_per_unit: {n}, algorithm: sliding_window_log}}
  - key: internal
    rate_limit: {{unlimited: true}}
"
    ))
    .unwrap()
}

/// Whether each of `hits` in turn was admitted for `user`.
async fn admitted(limiter: &Limiter, user: &str, hits: &[u64]) -> Vec<bool> {
    let mut all = Vec::new();
    for &h in hits {
        all.push(
            limiter
                .check("app", &[("user", user)], h)
                .await
                .unwrap()
                .allowed,
        );
    }
    all
}

#[test]
fn limits_report_every_problem_with_its_line() {
    let text = "domain: app
descriptors:
  - key: user
    rate_limit: {unit: fortnight, requests_per_unit: 3}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: -1}
";
    let errors = Limits::from_yaml(text).unwrap_err().0;
    let lines: Vec<Option<usize>> = errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [Some(4), Some(6)], "{errors:?}");
    assert!(errors.iter().all(|e| e.file.to_str() == Some("<yaml>")));
    assert!(
        errors[0].reason.contains("fortnight"),
        "{}",
        errors[0].reason
    );
}

#[test]
fn limits_load_from_a_directory_as_the_server_does() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: k\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b"),
        "domain: b\ndescriptors:\n  - key: k\n",
    )
    .unwrap();
    let mut domains: Vec<String> = Limits::from_dir(dir.path())
        .unwrap()
        .domains()
        .map(String::from)
        .collect();
    domains.sort();
    assert_eq!(domains, ["a", "b"]);

    std::fs::write(dir.path().join("c.yaml"), "domain: a\ndescriptors: []\n").unwrap();
    let errors = Limits::from_dir(dir.path()).unwrap_err();
    assert!(
        errors.0.iter().any(|e| e.file.ends_with("c.yaml")),
        "{errors}"
    );
}

#[tokio::test]
async fn a_decision_names_the_limit_what_remains_and_when_it_resets() {
    for store in STORES {
        let (limiter, _redis) = common::limiter(store, per_user(2)).await;
        let first = limiter.check("app", &[("user", "ann")], 1).await.unwrap();
        assert!(first.allowed, "{store:?}");
        let limit = first.limit.as_ref().expect("judged by per_user");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per_user", 2, Unit::Minute)
        );
        assert_eq!(first.remaining, Some(1), "{store:?}");
        assert_eq!(first.retry_after(), None, "{store:?}");
        let reset = first.reset_after.expect("a counted limit resets");
        assert!(
            reset > Duration::ZERO && reset <= Duration::from_secs(60),
            "{store:?}: {reset:?}"
        );

        let second = limiter.check("app", &[("user", "ann")], 1).await.unwrap();
        assert_eq!(
            (second.allowed, second.remaining),
            (true, Some(0)),
            "{store:?}"
        );
        let third = limiter.check("app", &[("user", "ann")], 1).await.unwrap();
        assert_eq!(
            (third.allowed, third.remaining),
            (false, Some(0)),
            "{store:?}"
        );
        let wait = third.retry_after().expect("a refusal says when to retry");
        assert!(
            wait >= Duration::from_secs(1) && wait <= Duration::from_secs(60),
            "{store:?}: {wait:?}"
        );
    }
}

#[tokio::test]
async fn what_no_limit_counts_is_allowed_without_a_limit() {
    for store in STORES {
        let (limiter, _redis) = common::limiter(store, per_user(1)).await;
        for (domain, key) in [("app", "internal"), ("app", "team"), ("elsewhere", "user")] {
            for _ in 0..3 {
                let d = limiter.check(domain, &[(key, "x")], 1).await.unwrap();
                assert!(
                    d.allowed && d.limit.is_none() && d.remaining.is_none(),
                    "{store:?} {domain} {key}: {d:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn hits_are_charged_as_asked_and_zero_only_looks() {
    for store in STORES {
        let (limiter, _redis) = common::limiter(store, per_user(5)).await;
        assert_eq!(
            admitted(&limiter, "bo", &[0, 0, 2, 2, 2, 1, 0]).await,
            [true, true, true, true, false, true, false],
            "{store:?}"
        );
        // 5 hits is more than a charge above the limit refuses; the rest is the budget.
        assert_eq!(
            admitted(&limiter, "cy", &[6, 5, 1]).await,
            [false, true, false],
            "{store:?}"
        );
    }
}

#[tokio::test]
async fn limits_replaced_at_run_time_apply_to_what_was_counted() {
    for store in STORES {
        let (limiter, _redis) = common::limiter(store, per_user(1)).await;
        assert_eq!(
            admitted(&limiter, "di", &[1, 1]).await,
            [true, false],
            "{store:?}"
        );
        limiter.set_limits(per_user(3));
        assert_eq!(limiter.limits().domains().collect::<Vec<_>>(), ["app"]);
        assert_eq!(
            admitted(&limiter, "di", &[1, 1, 1]).await,
            [true, true, false],
            "{store:?}"
        );
    }
}

#[tokio::test]
async fn invalid_checks_are_errors_and_count_nothing() {
    for store in STORES {
        let (limiter, _redis) = common::limiter(store, per_user(1)).await;
        let empty_domain = limiter.check("", &[("user", "ed")], 1).await;
        assert!(
            matches!(empty_domain, Err(Error::InvalidRequest(_))),
            "{store:?}: {empty_domain:?}"
        );
        let no_entries = limiter.check("app", &[], 1).await;
        assert!(
            matches!(no_entries, Err(Error::InvalidRequest(_))),
            "{store:?}: {no_entries:?}"
        );
        assert_eq!(
            admitted(&limiter, "ed", &[1, 1]).await,
            [true, false],
            "{store:?}"
        );
    }
}

#[tokio::test]
async fn key_prefixes_keep_limiters_on_one_redis_apart() {
    let redis = common::Redis::start();
    let on = |prefix: &str| {
        Limiter::builder(per_user(1))
            .key_prefix(prefix)
            .build_redis(redis.options())
    };
    let (a, b, same_as_a) = (
        on("a:").await.unwrap(),
        on("b:").await.unwrap(),
        on("a:").await.unwrap(),
    );
    assert_eq!(admitted(&a, "fay", &[1]).await, [true]);
    assert_eq!(admitted(&b, "fay", &[1]).await, [true]);
    assert_eq!(admitted(&same_as_a, "fay", &[1]).await, [false]);

    let tagged = Limiter::builder(per_user(1))
        .key_prefix("{tag}")
        .build_memory();
    assert!(matches!(tagged, Err(Error::KeyPrefix(_))), "{tagged:?}");
}

#[tokio::test]
async fn a_redis_that_is_not_there_is_a_store_error() {
    let nowhere = common::Redis::start();
    let options = nowhere.options();
    drop(nowhere);
    let refused = Limiter::redis(per_user(1), options).await;
    assert!(matches!(refused, Err(Error::Store(_))), "{refused:?}");

    let mut redis = common::Redis::start();
    let limiter = Limiter::redis(per_user(1), redis.options()).await.unwrap();
    assert_eq!(admitted(&limiter, "gil", &[1]).await, [true]);
    redis.kill();
    let mut failures = Vec::new();
    for _ in 0..10 {
        match limiter.check("app", &[("user", "gil")], 1).await {
            Err(Error::Store(e)) => failures.push(e.to_string()),
            other => panic!("a check on a dead redis: {other:?}"),
        }
    }
    // The breaker opened (5 outages in a row): the rest failed without trying Redis.
    assert!(
        failures[5..]
            .iter()
            .all(|e| e.contains("circuit breaker open")),
        "{failures:#?}"
    );

    // Back on the same port (empty): a probe closes the breaker and checks are decided again.
    let _back = common::Redis::start_on(redis.port);
    // 10 s: the probe runs within a second of Redis answering on a quiet machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match limiter.check("app", &[("user", "gil")], 1).await {
            Ok(decision) => break assert!(decision.allowed, "an empty redis has counted nothing"),
            Err(e) if std::time::Instant::now() < deadline => drop(e),
            Err(e) => panic!("redis is back but checks still fail: {e}"),
        }
    }
}

#[tokio::test]
async fn a_manual_clock_moves_the_windows_of_the_memory_store() {
    let limits = Limits::from_yaml(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new(1_000 * 60_000_000));
    let limiter = Limiter::builder(limits)
        .clock(clock.clone())
        .build_memory()
        .unwrap();
    assert_eq!(admitted(&limiter, "hal", &[1, 1]).await, [true, false]);
    clock.advance_micros(60_000_000);
    assert_eq!(admitted(&limiter, "hal", &[1, 1]).await, [true, false]);
}

#[test]
fn limits_warn_of_what_upstream_ignores() {
    // A `rate_limit` one level too far out: upstream loads the file and ignores the key, so
    // the descriptor has no limit; the warning is how a service can tell.
    let text = "domain: app\ndescriptors:\n  - key: user\nrate_limit: {unit: minute, requests_per_unit: 3}\n";
    let limits = Limits::from_yaml(text).unwrap();
    let warnings = limits.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].line, Some(4), "{warnings:?}");
}
