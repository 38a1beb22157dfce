//! Redis Sentinel over TLS with passwords on the servers and on the sentinels, with upstream's
//! variables (envoyproxy/ratelimit#1015): `REDIS_TLS=true` covers the sentinels and the master
//! they name, `REDIS_AUTH` authenticates to the master, `REDIS_SENTINEL_AUTH` to the sentinels,
//! `REDIS_TLS_CACERT`/`REDIS_TLS_CLIENT_CERT`/`REDIS_TLS_CLIENT_KEY` serve both. Everything
//! speaks TLS only (no plain port anywhere), so a connection that skipped TLS or a password
//! would fail. Then the master is killed and the service follows the failover, still over TLS
//! (the scenario of `tests/it/redis_sentinel.rs`).

use sluice_test_kit as kit;

use kit::sentinel::{SentinelOptions, SentinelSetup};
use kit::*;

use crate::redis_sentinel::{LIMITS, the_service_follows_a_failover};

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_over_tls_with_passwords_follows_a_failover() {
    let setup = SentinelSetup::start_with(SentinelOptions {
        tls: true,
        passwords: true,
    });
    let dir = config_dir(LIMITS);

    // A wrong sentinel password: the sentinels refuse, start-up fails, the password unprinted.
    let mut cmd = setup.sluice_command(dir.path());
    cmd.env("REDIS_SENTINEL_AUTH", "wrong-sentinel-pw-9d")
        .env("REDIS_TIMEOUT", "500ms")
        .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s");
    let (stdout, stderr) = refused_start(&mut cmd);
    let printed = format!("{stdout}{stderr}");
    assert!(!printed.contains("wrong-sentinel-pw-9d"), "{printed}");

    the_service_follows_a_failover(setup).await;
}
