//! Redis Sentinel over TLS with passwords on the servers and on the sentinels, with upstream's
//! variables (envoyproxy/ratelimit#1015): `REDIS_TLS=true` covers the sentinels and the master
//! they name, `REDIS_AUTH` authenticates to the master, `REDIS_SENTINEL_AUTH` to the sentinels,
//! `REDIS_TLS_CACERT`/`REDIS_TLS_CLIENT_CERT`/`REDIS_TLS_CLIENT_KEY` serve both. Everything
//! speaks TLS only (no plain port anywhere), so a connection that skipped TLS or a password
//! would fail. Then the master is killed and the service follows the failover, still over TLS.

use sluice_test_kit as kit;

use std::process::Command;
use std::time::{Duration, Instant};

use kit::sentinel_tls::{MASTER_PASSWORD, SENTINEL_PASSWORD, TlsSentinelSetup};
use kit::*;

const LIMITS: &str = "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// Sluice on `setup` with upstream's variables, `sentinel_auth` for the sentinels.
fn sluice_command_for(
    setup: &TlsSentinelSetup,
    config: &std::path::Path,
    sentinel_auth: &str,
) -> Command {
    let mut cmd = sluice_command(config);
    cmd.env("BACKEND_TYPE", "redis")
        .env("REDIS_TYPE", "sentinel")
        .env("REDIS_URL", setup.url())
        .env("REDIS_TLS", "true")
        .env("REDIS_TLS_CACERT", setup.pki.path("ca.pem"))
        .env("REDIS_TLS_CLIENT_CERT", setup.pki.path("client.pem"))
        .env("REDIS_TLS_CLIENT_KEY", setup.pki.path("client.key"))
        .env("REDIS_AUTH", MASTER_PASSWORD)
        .env("REDIS_SENTINEL_AUTH", sentinel_auth)
        .env("REDIS_TIMEOUT", "500ms");
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_over_tls_with_passwords_follows_a_failover() {
    let setup = TlsSentinelSetup::start();
    let dir = config_dir(LIMITS);

    // A wrong sentinel password: the sentinels refuse, start-up fails, the password unprinted.
    let out = sluice_command_for(&setup, dir.path(), "wrong-sentinel-pw-9d")
        .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "started with a wrong sentinel password"
    );
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!printed.contains("wrong-sentinel-pw-9d"), "{printed}");

    let sluice = Sluice::spawn(sluice_command_for(&setup, dir.path(), SENTINEL_PASSWORD));
    let mut c = sluice.client().await;
    let alice = || request("app", vec![descriptor(&[("user", "alice")])]);
    avoid_window_edge(3600, 60).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 99);
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 98);
    let TlsSentinelSetup {
        mut master,
        replica,
        sentinels,
        pki: _pki,
    } = setup;
    assert_eq!(master.dbsize(), 1, "the counter lives on the TLS master");
    // Replication is asynchronous: wait until the replica has the counter, so the failover
    // keeps it (this test is about following the failover, not about replication's bound).
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
                let remaining = r.into_inner().statuses[0].limit_remaining;
                assert!(remaining <= 97, "remaining {remaining}");
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
        "sentinel failover over TLS: {failures} failed calls, recovered after {:?}",
        killed.elapsed()
    );
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
