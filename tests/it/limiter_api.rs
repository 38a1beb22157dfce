//! The native `sluice.v1.Limiter` API through the real binary, on both stores.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::native::{self, LimiterSluice, acquired, available, config, per_client, take};
use kit::*;
use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    AcquireRequest, Algorithm, DeleteRequest, GetConfigRequest, LimiterConfig, SetMode,
};
use tonic::transport::Channel;

/// Sets `config` with `mode`: whether it was applied, and the config in force after.
async fn set(
    c: &mut LimiterClient<Channel>,
    config: LimiterConfig,
    mode: SetMode,
) -> (bool, LimiterConfig) {
    let r = native::set(c, config, mode).await.unwrap();
    (r.applied, r.config.unwrap())
}

/// The limiter `api` of the first test: `rate` per minute, a sliding log.
fn api(rate: u64) -> LimiterConfig {
    config(
        "api",
        Algorithm::SlidingWindowLog,
        rate,
        Duration::from_secs(60),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn set_get_acquire_and_delete_on_both_stores() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let ctx = format!("{kind:?}");

        // try_set creates, then never overwrites.
        let (applied, current) = set(&mut c, api(2), SetMode::TrySet).await;
        assert!(applied, "{ctx}");
        assert_eq!(current.rate, 2);
        let (applied, current) = set(&mut c, api(9), SetMode::TrySet).await;
        assert!(!applied, "{ctx}");
        assert_eq!(current.rate, 2, "{ctx}");

        for want in [true, true, false] {
            assert_eq!(acquired(&mut c, "api", "", 1).await, want, "{ctx}");
        }
        // Update keeping state: 2 of 5 are used.
        set(&mut c, api(5), SetMode::UpdateKeepState).await;
        assert_eq!(available(&mut c, "api", "").await, 3, "{ctx}");
        // Update resetting state: all 5 back.
        set(&mut c, api(5), SetMode::UpdateResetState).await;
        assert_eq!(available(&mut c, "api", "").await, 5, "{ctx}");

        let got = c
            .get_config(GetConfigRequest { name: "api".into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (got.rate, got.algorithm),
            (5, Algorithm::SlidingWindowLog as i32)
        );

        // More permits than the limiter can ever grant: refused at once, not waited for.
        let started = Instant::now();
        let status = c
            .try_acquire(take("api", "", 6, Duration::from_secs(10)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{ctx}");
        assert!(started.elapsed() < Duration::from_secs(2));

        assert!(
            c.delete(DeleteRequest { name: "api".into() })
                .await
                .unwrap()
                .into_inner()
                .deleted
        );
        let status = c
            .get_config(GetConfigRequest { name: "api".into() })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        let status = c
            .try_acquire(take("api", "", 1, Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);

        // Per client: separate budgets, and a client id is required.
        let per_client = per_client(config(
            "pc",
            Algorithm::FixedWindow,
            1,
            Duration::from_secs(3600),
        ));
        set(&mut c, per_client, SetMode::TrySet).await;
        assert!(acquired(&mut c, "pc", "a", 1).await);
        assert!(!acquired(&mut c, "pc", "a", 1).await);
        assert!(acquired(&mut c, "pc", "b", 1).await);
        let status = c
            .try_acquire(take("pc", "", 1, Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn try_acquire_waits_server_side_within_its_timeout() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[("LIMITER_MAX_WAIT", "1s")]);
        let mut c = sluice.client().await;
        // Bounds below are far from what a quiet machine shows (a call takes a few ms), so a
        // busy one does not fail them.
        // One per 10 s: a timeout shorter than the wait is refused at once, with the wait to
        // expect.
        let mut slow = config("paced10", Algorithm::Gcra, 1, Duration::from_secs(10));
        slow.burst = 1;
        set(&mut c, slow, SetMode::TrySet).await;
        let take_one = |name: &str, timeout: Duration| take(name, "", 1, timeout);
        assert!(acquired(&mut c, "paced10", "", 1).await);
        let started = Instant::now();
        let r = c
            .try_acquire(take_one("paced10", Duration::from_millis(20)))
            .await
            .unwrap()
            .into_inner();
        assert!(!r.acquired, "{kind:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{kind:?}: refused only after {:?}",
            started.elapsed()
        );
        let retry: Duration = r.retry_after.unwrap().try_into().unwrap();
        assert!(
            retry > Duration::from_secs(5) && retry <= Duration::from_secs(10),
            "{retry:?}"
        );

        // Two per second, one at a time: with a timeout long enough, the server waits for the
        // next permit (500 ms after the last) and then grants.
        let mut paced = config("paced", Algorithm::Gcra, 2, Duration::from_secs(1));
        paced.burst = 1;
        set(&mut c, paced, SetMode::TrySet).await;
        assert!(acquired(&mut c, "paced", "", 1).await);
        let r = c
            .try_acquire(take_one("paced", Duration::from_millis(1_000)))
            .await
            .unwrap()
            .into_inner();
        assert!(r.acquired, "{kind:?}");
        let waited: Duration = r.waited.unwrap().try_into().unwrap();
        assert!(
            waited >= Duration::from_millis(250),
            "{kind:?}: waited {waited:?}"
        );

        // Acquire is bounded by LIMITER_MAX_WAIT.
        set(
            &mut c,
            config("slow", Algorithm::FixedWindow, 1, Duration::from_secs(3600)),
            SetMode::TrySet,
        )
        .await;
        let req = || AcquireRequest {
            name: "slow".into(),
            permits: 1,
            client_id: String::new(),
        };
        assert!(c.acquire(req()).await.unwrap().into_inner().acquired);
        let status = c.acquire(req()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{kind:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_wait_takes_nothing() {
    let sluice = LimiterSluice::start(None, &[]);
    let mut c = sluice.client().await;
    // One permit per 2 s.
    let mut slow = config("slow", Algorithm::TokenBucket, 1, Duration::from_secs(2));
    slow.burst = 1;
    set(&mut c, slow, SetMode::TrySet).await;
    assert!(acquired(&mut c, "slow", "", 1).await);

    // A waiter that would get the next permit in ~2 s gives up (its call is cancelled) at 300 ms.
    let mut waiter = c.clone();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        waiter.try_acquire(take("slow", "", 1, Duration::from_secs(10))),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the call should still have been waiting"
    );

    // Once the permit is due, it is still there: the cancelled wait ended on the server too.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert!(acquired(&mut c, "slow", "", 1).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_limiters_through_redis() {
    let redis = RedisServer::start();
    let a = LimiterSluice::start(Some(&redis), &[]);
    let b = LimiterSluice::start(Some(&redis), &[]);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let shared = |rate| {
        config(
            "shared",
            Algorithm::SlidingWindowCounter,
            rate,
            Duration::from_secs(3600),
        )
    };
    set(&mut ca, shared(3), SetMode::TrySet).await;
    let mut admitted = 0;
    for i in 0..6 {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        if acquired(c, "shared", "", 1).await {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    // A rate change made through A applies to B's next call.
    set(&mut ca, shared(4), SetMode::UpdateKeepState).await;
    assert!(acquired(&mut cb, "shared", "", 1).await);
    assert!(!acquired(&mut cb, "shared", "", 1).await);
}

/// Every algorithm at `rate` per hour (so nothing refills during a test), warm-up with a short
/// warm-up period. Bucket algorithms get the default burst (the rate).
fn every_algorithm(prefix: &str, rate: u64) -> Vec<(Algorithm, LimiterConfig)> {
    [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::WarmUp,
    ]
    .into_iter()
    .map(|algorithm| {
        let mut c = config(
            &format!("{prefix}-{}", algorithm.as_str_name()),
            algorithm,
            rate,
            Duration::from_secs(3600),
        );
        if algorithm == Algorithm::WarmUp {
            c.warmup_period = Some(Duration::from_secs(1).try_into().unwrap());
        }
        (algorithm, c)
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_attempts_change_nothing() {
    for_each_store(|kind, redis| async move {
        avoid_window_edge(3600, 60).await;
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        for (algorithm, limiter) in every_algorithm("refused", 5) {
            let ctx = format!("{kind:?} {algorithm:?}");
            let name = limiter.name.clone();
            set(&mut c, limiter, SetMode::TrySet).await;
            assert_eq!(available(&mut c, &name, "").await, 5, "{ctx}");
            // More than the capacity, and more than any script can represent: INVALID_ARGUMENT
            // (never UNAVAILABLE from a store error), and nothing taken.
            for permits in [6, 1 << 32, u64::MAX] {
                let status = c
                    .try_acquire(take(&name, "", permits, Duration::from_secs(1)))
                    .await
                    .unwrap_err();
                assert_eq!(
                    status.code(),
                    tonic::Code::InvalidArgument,
                    "{ctx} try_acquire {permits}: {status:?}"
                );
                let status = c
                    .acquire(AcquireRequest {
                        name: name.clone(),
                        permits,
                        client_id: String::new(),
                    })
                    .await
                    .unwrap_err();
                assert_eq!(
                    status.code(),
                    tonic::Code::InvalidArgument,
                    "{ctx} acquire {permits}: {status:?}"
                );
                assert_eq!(
                    available(&mut c, &name, "").await,
                    5,
                    "{ctx} after {permits}"
                );
            }
        }

        // Rate 10 per hour: 8 taken, 5 refused, then 2 still fit (8 + 2 = 10).
        for (algorithm, limiter) in every_algorithm("fits", 10) {
            if algorithm == Algorithm::WarmUp {
                continue; // one request at a time: the next waits for the first one's cost
            }
            let ctx = format!("{kind:?} {algorithm:?}");
            let name = limiter.name.clone();
            set(&mut c, limiter, SetMode::TrySet).await;
            assert!(acquired(&mut c, &name, "", 8).await, "{ctx}");
            assert!(!acquired(&mut c, &name, "", 5).await, "{ctx}");
            assert_eq!(available(&mut c, &name, "").await, 2, "{ctx}");
            assert!(
                acquired(&mut c, &name, "", 2).await,
                "{ctx}: 8 + 2 fit in 10"
            );
            assert!(!acquired(&mut c, &name, "", 1).await, "{ctx}");
            assert_eq!(available(&mut c, &name, "").await, 0, "{ctx}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn available_permits_is_what_try_acquire_would_grant() {
    for_each_store(|kind, redis| async move {
        avoid_window_edge(3600, 60).await;
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        for (algorithm, limiter) in every_algorithm("available", 50) {
            let ctx = format!("{kind:?} {algorithm:?}");
            let name = limiter.name.clone();
            set(&mut c, limiter, SetMode::TrySet).await;
            let n = available(&mut c, &name, "").await;
            assert_eq!(n, 50, "{ctx}");
            assert!(acquired(&mut c, &name, "", n).await, "{ctx}: {n} available");
            assert_eq!(available(&mut c, &name, "").await, 0, "{ctx}");
            assert!(!acquired(&mut c, &name, "", 1).await, "{ctx}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keeping_state_across_algorithms_never_breaks_a_limiter() {
    for_each_store(|kind, redis| async move {
        avoid_window_edge(3600, 60).await;
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let family = |a: Algorithm| match a {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => "bucket",
            other => other.as_str_name(),
        };
        for (from, _) in every_algorithm("", 5) {
            for (to, _) in every_algorithm("", 5) {
                let ctx = format!("{kind:?} {from:?} -> {to:?}");
                let name = format!("keep-{}-{}", from.as_str_name(), to.as_str_name());
                let rename = |mut l: LimiterConfig| {
                    l.name = name.clone();
                    l
                };
                let pick = |a: Algorithm| {
                    every_algorithm("", 5)
                        .into_iter()
                        .find(|(x, _)| *x == a)
                        .unwrap()
                        .1
                };
                let r = native::set(&mut c, rename(pick(from)), SetMode::TrySet)
                    .await
                    .unwrap();
                assert!(r.state_reset, "{ctx}: a new limiter starts empty");
                assert!(acquired(&mut c, &name, "", 2).await, "{ctx}");
                let r = native::set(&mut c, rename(pick(to)), SetMode::UpdateKeepState)
                    .await
                    .unwrap();
                let kept = family(from) == family(to);
                assert_eq!(r.state_reset, !kept, "{ctx}");
                // The limiter works at once, with its state kept or started afresh.
                let expected = match (kept, to) {
                    (true, Algorithm::WarmUp) => 0, // the first request's cost is still due
                    (true, _) => 3,
                    (false, _) => 5,
                };
                assert_eq!(available(&mut c, &name, "").await, expected, "{ctx}");
                assert_eq!(acquired(&mut c, &name, "", 1).await, expected > 0, "{ctx}");
                // Same algorithm, reset: reported too.
                let r = native::set(&mut c, rename(pick(to)), SetMode::UpdateResetState)
                    .await
                    .unwrap();
                assert!(r.state_reset && r.applied, "{ctx}");
                let r = native::set(&mut c, rename(pick(to)), SetMode::TrySet)
                    .await
                    .unwrap();
                assert!(!r.state_reset && !r.applied, "{ctx}");
            }
        }
    })
    .await;
}
