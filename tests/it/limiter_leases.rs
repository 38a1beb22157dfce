//! The native API's `CONCURRENCY` limiters through the real binary, on both stores: acquisitions
//! answer a lease id, `Release` gives it back, a lease never released expires after the
//! limiter's interval, and a lease id gives back no more than it names.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::native::LimiterSluice;
use kit::*;
use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    AcquireResponse, Algorithm, LimiterConfig, Mode, ReleaseRequest, ReleaseResponse, SetMode,
    SetRateRequest, TryAcquireRequest,
};
use tonic::Code;
use tonic::transport::Channel;

async fn create(
    c: &mut LimiterClient<Channel>,
    name: &str,
    algorithm: Algorithm,
    rate: u64,
    interval: Duration,
    mode: Mode,
) {
    c.set_rate(SetRateRequest {
        config: Some(LimiterConfig {
            name: name.into(),
            algorithm: algorithm as i32,
            rate,
            interval: Some(interval.try_into().unwrap()),
            mode: mode as i32,
            ..Default::default()
        }),
        set_mode: SetMode::UpdateResetState as i32,
    })
    .await
    .unwrap();
}

async fn take(
    c: &mut LimiterClient<Channel>,
    name: &str,
    client: &str,
    permits: u64,
) -> AcquireResponse {
    c.try_acquire(TryAcquireRequest {
        name: name.into(),
        permits,
        timeout: Some(Duration::ZERO.try_into().unwrap()),
        client_id: client.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

async fn release(
    c: &mut LimiterClient<Channel>,
    name: &str,
    client: &str,
    lease_id: &str,
) -> Result<ReleaseResponse, tonic::Status> {
    c.release(ReleaseRequest {
        name: name.into(),
        lease_id: lease_id.into(),
        client_id: client.into(),
    })
    .await
    .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread")]
async fn n_leases_then_refused_until_one_is_released_on_both_stores() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let ctx = format!("{kind:?}");
        let (name, minute) = ("inflight", Duration::from_secs(60));
        create(
            &mut c,
            name,
            Algorithm::Concurrency,
            3,
            minute,
            Mode::Overall,
        )
        .await;

        let mut leases = Vec::new();
        for left in [2, 1, 0] {
            let r = take(&mut c, name, "", 1).await;
            assert!(r.acquired, "{ctx}");
            assert_eq!(r.remaining, left, "{ctx}");
            assert!(!r.lease_id.is_empty(), "{ctx}: a grant answers a lease id");
            leases.push(r.lease_id);
        }
        let refused = take(&mut c, name, "", 1).await;
        assert!(!refused.acquired, "{ctx}: the fourth is refused");
        assert!(
            refused.lease_id.is_empty(),
            "{ctx}: a refusal holds no lease"
        );

        let r = release(&mut c, name, "", &leases[0]).await.unwrap();
        assert!(r.released, "{ctx}");
        assert_eq!(r.remaining, 1, "{ctx}");
        let again = take(&mut c, name, "", 1).await;
        assert!(again.acquired, "{ctx}: admitted after the release");
        assert!(!take(&mut c, name, "", 1).await.acquired, "{ctx}");

        // Give every lease back: the limiter is empty again, nothing left behind.
        for id in leases.iter().skip(1).chain([&again.lease_id]) {
            assert!(
                release(&mut c, name, "", id).await.unwrap().released,
                "{ctx}"
            );
        }
        let r = take(&mut c, name, "", 3).await;
        assert!(r.acquired, "{ctx}: all three back");
        assert!(
            release(&mut c, name, "", &r.lease_id)
                .await
                .unwrap()
                .released
        );
        if let Some(redis) = &redis {
            let keys = redis.cli(&["--scan", "--pattern", "*limiter_inflight*state*"]);
            let held: u64 = keys
                .unwrap_or_default()
                .lines()
                .filter(|k| !k.is_empty())
                .map(|k| {
                    redis
                        .cli(&["HLEN", k])
                        .unwrap()
                        .trim()
                        .parse::<u64>()
                        .unwrap()
                })
                .sum();
            assert_eq!(held, 0, "{ctx}: no lease counter left in Redis");
        }
        // With nothing held, a release gives nothing back, says so and is counted.
        let nothing = release(&mut c, name, "", &r.lease_id).await.unwrap();
        assert!(!nothing.released, "{ctx}");
        assert_eq!(nothing.remaining, 3, "{ctx}");
        assert_eq!(
            sluice
                .sluice
                .metric("sluice_limiter_releases_total{result=\"nothing_held\"}"),
            1.0,
            "{ctx}"
        );
        assert_eq!(
            sluice
                .sluice
                .metric("sluice_limiter_releases_total{result=\"returned\"}"),
            5.0,
            "{ctx}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_never_released_expires_after_the_interval_on_both_stores() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let ctx = format!("{kind:?}");
        let lease = Duration::from_secs(1);
        create(
            &mut c,
            "short",
            Algorithm::Concurrency,
            2,
            lease,
            Mode::Overall,
        )
        .await;
        let held = take(&mut c, "short", "", 2).await;
        let taken_at = Instant::now();
        assert!(held.acquired, "{ctx}");
        assert!(!take(&mut c, "short", "", 1).await.acquired, "{ctx}");
        // Never released: admitted again once the lease has lived its interval, not before.
        loop {
            let r = take(&mut c, "short", "", 1).await;
            if r.acquired {
                assert!(taken_at.elapsed() >= lease, "{ctx}: expired early");
                break;
            }
            assert!(
                taken_at.elapsed() < Duration::from_secs(30),
                "{ctx}: the lease never expired"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The expired lease's id gives nothing back: not even the lease taken since.
        let late = release(&mut c, "short", "", &held.lease_id).await.unwrap();
        assert!(!late.released, "{ctx}");
        assert_eq!(late.remaining, 1, "{ctx}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_id_gives_back_only_what_it_names_on_both_stores() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let ctx = format!("{kind:?}");
        let minute = Duration::from_secs(60);
        create(
            &mut c,
            "users",
            Algorithm::Concurrency,
            2,
            minute,
            Mode::PerClient,
        )
        .await;
        let a = take(&mut c, "users", "a", 2).await;
        assert!(a.acquired, "{ctx}");
        // Client b names a's lease: b holds nothing, a keeps its leases.
        let r = release(&mut c, "users", "b", &a.lease_id).await.unwrap();
        assert!(!r.released, "{ctx}");
        assert!(!take(&mut c, "users", "a", 1).await.acquired, "{ctx}");
        // An id forged for more permits than its step holds gives back that step's, no more.
        let forged = a.lease_id.rsplit_once('.').unwrap().0.to_string() + ".1000";
        let r = release(&mut c, "users", "a", &forged).await.unwrap();
        assert!(r.released, "{ctx}");
        assert_eq!(r.remaining, 2, "{ctx}");
        // An id of a step nobody was counted in gives nothing.
        let expiry: u64 = a.lease_id.split('.').nth(1).unwrap().parse().unwrap();
        take(&mut c, "users", "a", 1).await;
        let r = release(&mut c, "users", "a", &format!("L1.{}.1", expiry + 1))
            .await
            .unwrap();
        assert!(!r.released, "{ctx}");
        assert_eq!(r.remaining, 1, "{ctx}");

        // Bad input gets a clear answer.
        for bad in ["", "L1.x.1", "L1.1.0", "1.2", &"9".repeat(100)] {
            let e = release(&mut c, "users", "a", bad).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{ctx}: {bad:?}: {e:?}");
        }
        let e = release(&mut c, "users", "", &a.lease_id).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{ctx}: {e:?}");
        let e = release(&mut c, "nope", "", &a.lease_id).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{ctx}: {e:?}");
        create(
            &mut c,
            "window",
            Algorithm::SlidingWindowLog,
            2,
            minute,
            Mode::Overall,
        )
        .await;
        let w = take(&mut c, "window", "", 1).await;
        assert!(
            w.acquired && w.lease_id.is_empty(),
            "{ctx}: no lease outside CONCURRENCY"
        );
        let e = release(&mut c, "window", "", &a.lease_id)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{ctx}: {e:?}");
    })
    .await;
}
