//! Redis Sentinel: a master, a replica and three sentinels, started by the test; the master is
//! killed and the service follows the promoted replica without a restart.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::sentinel::SentinelSetup;
use kit::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_service_follows_a_sentinel_failover() {
    let setup = SentinelSetup::start();
    let url = setup.url();
    let SentinelSetup {
        mut master,
        replica,
        sentinels,
    } = setup;
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
    );
    let mut cmd = sluice_command(dir.path());
    cmd.env("BACKEND_TYPE", "redis")
        .env("REDIS_TYPE", "sentinel")
        .env("REDIS_URL", &url)
        .env("REDIS_TIMEOUT", "500ms");
    let sluice = Sluice::spawn(cmd);
    let mut c = sluice.client().await;
    let alice = || request("app", vec![descriptor(&[("user", "alice")])]);
    avoid_window_edge(3600, 60).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 99);
    assert_eq!(master.dbsize(), 1, "the counter lives on the master");
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
    let mut failures = 0;
    loop {
        match c.should_rate_limit(alice()).await {
            Ok(r) => {
                // The promoted replica had the counter: counting goes on from where it was.
                let remaining = r.into_inner().statuses[0].limit_remaining;
                assert!(remaining <= 98, "remaining {remaining}");
                break;
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
    println!(
        "sentinel failover: {failures} failed calls, recovered after {:?}",
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
}
