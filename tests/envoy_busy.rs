//! Envoy's load on a machine whose both cores are busy (issue #28, "the caller's deadline
//! rules", quick form): a real Envoy (filter timeout 250 ms, `failure_mode_deny: false`) in front
//! of a real `sluice`, 64 callers sending a few thousand requests against one limit of a few
//! hundred, while two spinning shell processes keep both cores busy.
//!
//! Envoy fails open, so every call Sluice does not answer in time is a request let through: the
//! figures that matter are the admissions (exactly the limit) and Envoy's `ratelimit.error`
//! (0). Before the caller's deadline reached the store, a Redis call gave up after
//! `REDIS_TIMEOUT` (15 ms, the old default, set here explicitly) although Envoy would wait
//! 250 ms: on a busy machine some calls ran out, each an error and an admission past the limit.
//! Now the store has until Envoy's deadline less the margin (`src/store/deadline.rs`). The
//! memory store runs the same load.
//!
//! A binary of its own, not a module of `tests/it`: it keeps both cores busy ([`kit::CpuHog`]) on
//! purpose, and would starve the tests that `tests/it` runs beside it in parallel threads.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::envoy::{Envoy, Upstream};
use kit::{CpuHog, Sluice, avoid_window_edge, config_dir, for_each_store};

const LIMIT: usize = 500;
const REQUESTS: usize = 5_000;
const CALLERS: usize = 64;

/// Every request from 127.0.0.1 counts against one per-address counter of `LIMIT` an hour.
fn limits() -> String {
    format!(
        "domain: example\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}\n"
    )
}

#[tokio::test]
async fn envoy_on_a_busy_machine_admits_exactly_the_limit() {
    for_each_store(|store, redis| async move {
        let config = config_dir(&limits());
        // The old default, far below Envoy's 250 ms: the caller's deadline must rule anyway.
        let sluice = Sluice::start(config.path(), redis.as_ref(), &[("REDIS_TIMEOUT", "15ms")]);
        let app = Upstream::start();
        let envoy = Envoy::start(sluice.grpc, app.addr, &[("timeout: 5s", "timeout: 0.25s")]);
        // A run lasts seconds on a busy machine; the counter must stay in one hour.
        avoid_window_edge(3600, 120).await;

        let hog = CpuHog::start();
        let started = Instant::now();
        let counts = envoy.send(REQUESTS, CALLERS, Duration::ZERO, "/", &[]);
        let took = started.elapsed();
        drop(hog);

        let stats = envoy.ratelimit_stats();
        println!(
            "ENVOY-BUSY {store:?}: {REQUESTS} requests, {CALLERS} callers, limit {LIMIT}: \
             {} admitted, {} refused, Envoy ratelimit.error {} (failure_mode_allowed {}), {took:?}",
            counts.get(200),
            counts.get(429),
            stats.error,
            stats.failure_mode_allowed
        );
        assert_eq!(
            counts.total(),
            REQUESTS,
            "{store:?}: every request answered: {counts:?}"
        );
        assert_eq!(
            (counts.get(200), stats.error),
            (LIMIT, 0),
            "{store:?}: admitted and Envoy errors: {counts:?} {stats:?}\n{}",
            envoy.log()
        );
    })
    .await;
}
