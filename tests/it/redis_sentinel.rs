//! Redis Sentinel: a master, a replica and three sentinels, started by the test; the master is
//! killed and the service follows the promoted replica without a restart. The scenario is
//! [`the_service_follows_a_failover`]; `tests/it/redis_sentinel_tls.rs` runs it over TLS with
//! passwords.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::sentinel::SentinelSetup;
use kit::*;
use sluice::proto::RateLimitServiceClient;

/// The limits of the scenario: 100 an hour per user.
pub(crate) const LIMITS: &str = "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

#[tokio::test(flavor = "multi_thread")]
async fn the_service_follows_a_sentinel_failover() {
    the_service_follows_a_failover(SentinelSetup::start()).await;
}

/// Sluice on `setup` counts two calls on the master, the master is killed, and Sluice follows
/// the promoted replica (within 30 s, failing calls meanwhile only as `Unavailable`), counting
/// on from where it was, without a restart.
pub(crate) async fn the_service_follows_a_failover(setup: SentinelSetup) {
    let over = if setup.options.tls { " over TLS" } else { "" };
    let dir = config_dir(LIMITS);
    let mut cmd = setup.sluice_command(dir.path());
    cmd.env("REDIS_TIMEOUT", "500ms");
    let sluice = Sluice::spawn(cmd);
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 60).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 99);
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 98);
    // The rest of the setup (its certificates) stays until the end.
    let SentinelSetup {
        mut master,
        replica,
        sentinels,
        ..
    } = setup;
    assert_eq!(master.dbsize(), 1, "the counter lives on the master{over}");
    // Replication is asynchronous: a master killed before its replica got the write loses it
    // (docs/reliability.md gives that bound). This test is about following the failover, so it
    // waits until the replica has the counter.
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.dbsize() != 1 {
        assert!(
            Instant::now() < deadline,
            "the replica never got the counter"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    master.kill();
    let killed = Instant::now();
    let failures = calls_until_answered(&mut c, killed).await;
    println!(
        "sentinel failover{over}: {failures} failed calls, recovered after {:?}",
        killed.elapsed()
    );
    // The sentinel that led the failover may not be this one: the others learn the new master
    // from it a moment later, and Sluice may have found it first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sentinels[0].master() != Some(replica.port) {
        assert!(
            Instant::now() < deadline,
            "sentinel names {:?} as master, not the promoted replica",
            sentinels[0].master()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..20 {
        assert!(c.should_rate_limit(alice()).await.is_ok());
    }
    assert!(
        replica.dbsize() >= 1,
        "counting goes on on the promoted replica"
    );
}

/// Calls every 100 ms from the master's death (`killed`) until one is answered (30 s at most),
/// each failure `Unavailable`; how many failed.
async fn calls_until_answered(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    killed: Instant,
) -> u32 {
    let mut failures = 0;
    loop {
        match c.should_rate_limit(alice()).await {
            Ok(r) => {
                // The promoted replica had the counter: counting goes on from where it was.
                let remaining = r.into_inner().statuses[0].limit_remaining;
                assert!(remaining <= 97, "remaining {remaining}");
                return failures;
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                failures += 1;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "service did not follow the failover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
