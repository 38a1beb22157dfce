//! Waiting in the native API: callers of one replica are served in arrival order, and waiting
//! costs about one store call per grant, on both stores.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::native::{self, LimiterSluice, config};
use kit::*;
use sluice::proto::sluice::v1::{Algorithm, LimiterConfig, SetMode};

const WAITERS: usize = 40;

#[tokio::test(flavor = "multi_thread")]
async fn waiters_are_served_in_arrival_order_with_few_store_calls() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[("LIMITER_MAX_WAIT", "60s")]);
        let mut c = sluice.client().await;
        // 5 a second, one at a time.
        let line = LimiterConfig {
            burst: 1,
            ..config("line", Algorithm::Gcra, 5, Duration::from_secs(1))
        };
        native::set(&mut c, line, SetMode::TrySet).await.unwrap();
        let take = |timeout: Duration| native::take("line", "", 1, timeout);
        assert!(c.try_acquire(take(Duration::ZERO)).await.unwrap().into_inner().acquired);

        let store = if redis.is_some() { "redis" } else { "memory" };
        let series = format!(
            "sluice_store_call_seconds_count{{operation=\"acquire\",store=\"{store}\"}}"
        );
        let calls_before = sluice.sluice.metric(&series);
        let started = Instant::now();
        let requests = (0..WAITERS).map(|_| take(Duration::from_secs(60))).collect();
        // Arrivals 100 ms apart (grants come every 200 ms, so a line still forms), so their
        // order is known even when a busy machine delays the server's tasks by tens of
        // milliseconds (a quiet one: well under 1 ms).
        let mut done = native::acquire_in_order(&c, requests, Duration::from_millis(100)).await;
        let calls = sluice.sluice.metric(&series) - calls_before;
        let per_grant = calls / WAITERS as f64;
        println!(
            "{kind:?}: {WAITERS} waiters granted in {:?} with {calls} store calls ({per_grant:.2} per grant)",
            started.elapsed()
        );
        assert!(done.iter().all(|(_, acquired, _)| *acquired), "{kind:?}");
        done.sort_by_key(|(_, _, at)| *at);
        let order: Vec<usize> = done.iter().map(|(i, _, _)| *i).collect();
        assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "{kind:?}: served out of order");
        assert!(per_grant <= 2.0, "{kind:?}: {per_grant:.2} store calls per grant");
    })
    .await;
}
