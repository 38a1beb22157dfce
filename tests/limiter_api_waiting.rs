//! Waiting in the native API: callers of one replica are served in arrival order, and waiting
//! costs about one store call per grant, on both stores.

mod common;

use std::time::{Duration, Instant};

use common::*;
use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    Algorithm, LimiterConfig, SetMode, SetRateRequest, TryAcquireRequest,
};

const WAITERS: usize = 40;

#[tokio::test(flavor = "multi_thread")]
async fn waiters_are_served_in_arrival_order_with_few_store_calls() {
    for_each_store(|kind, redis| async move {
        let dir = config_dir("domain: unused\n");
        let sluice = Sluice::start(dir.path(), redis.as_ref(), &[("LIMITER_MAX_WAIT", "60s")]);
        let mut c = LimiterClient::connect(format!("http://{}", sluice.grpc))
            .await
            .unwrap();
        // 5 a second, one at a time.
        c.set_rate(SetRateRequest {
            config: Some(LimiterConfig {
                name: "line".into(),
                algorithm: Algorithm::Gcra as i32,
                rate: 5,
                burst: 1,
                interval: Some(Duration::from_secs(1).try_into().unwrap()),
                ..Default::default()
            }),
            set_mode: SetMode::TrySet as i32,
        })
        .await
        .unwrap();
        let take = |timeout: Duration| TryAcquireRequest {
            name: "line".into(),
            permits: 1,
            timeout: Some(timeout.try_into().unwrap()),
            client_id: String::new(),
        };
        assert!(c.try_acquire(take(Duration::ZERO)).await.unwrap().into_inner().acquired);

        let store = if redis.is_some() { "redis" } else { "memory" };
        let series = format!(
            "sluice_store_call_seconds_count{{operation=\"acquire\",store=\"{store}\"}}"
        );
        let calls_before = sluice.metric(&series);
        let started = Instant::now();
        let mut waiters = Vec::new();
        for i in 0..WAITERS {
            let mut c = c.clone();
            let request = take(Duration::from_secs(60));
            let (queued, on_the_way) = tokio::sync::oneshot::channel();
            waiters.push(tokio::spawn(async move {
                let mut call = std::pin::pin!(c.try_acquire(request));
                // The first poll puts the request on the channel's queue, behind the earlier
                // waiters' (a task scheduled late must not overtake them on the client side).
                if let std::task::Poll::Ready(r) = futures::poll!(call.as_mut()) {
                    panic!("answered before waiting: {r:?}");
                }
                queued.send(()).unwrap();
                let r = call.await.unwrap().into_inner();
                (i, r.acquired, Instant::now())
            }));
            on_the_way.await.unwrap();
            // Arrivals 100 ms apart (grants come every 200 ms, so a line still forms), so their
            // order is known even when a busy machine delays the server's tasks by tens of
            // milliseconds (a quiet one: well under 1 ms).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut done = Vec::new();
        for w in waiters {
            done.push(w.await.unwrap());
        }
        let calls = sluice.metric(&series) - calls_before;
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
