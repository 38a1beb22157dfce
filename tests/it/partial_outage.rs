//! `FAILURE_POLICY=local_share` when only some replicas lose Redis (issue #40): three real
//! `sluice` replicas learning their count from one real `redis-server`, each through its own
//! fault proxy (`crates/sluice-test-kit/src/proxy.rs`), so that one replica's path to Redis can be cut while
//! the others keep theirs.
//!
//! The cut-off replica stops beating, and after `LIVE` (10 s) it is no longer in the set the
//! others count. It is still serving, deciding alone with a third of each limit. Before the fix
//! the other two then learnt a count of 2 and, once they lost Redis too, each decided with half:
//! a window decided only locally admitted L/2 + L/2 + L/3 = L + L/3 (here 40 of 30). Now a
//! smaller count is believed only after an hour of seeing it (`store/layers/local_share/replicas.rs`), so
//! the three shares add up to at most L.
//!
//! While only one replica is cut off, the other two decide on Redis with the whole limit and it
//! with its share: such a window may admit L plus that share, the bound docs/reliability.md
//! gives a window with both kinds of answers; nothing shared between the replicas can tell Redis
//! of the cut-off replica's local answers.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::proxy::{FaultProxy, Faults};
use kit::*;
use sluice::proto::Code;
use tokio::time::Instant;

const LIMIT: u64 = 30;
const REPLICAS: u64 = 3;
const CONFIG: &str = "domain: p\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 30}\n";

/// The replica count `sluice` learnt, as it shows it.
fn learnt(sluice: &Sluice) -> f64 {
    sluice.metric("sluice_degraded_replicas")
}

/// Polls `check` every 100 ms (without blocking the runtime the proxies run on) until it holds;
/// panics naming `what` after `within`.
async fn until(what: &str, within: Duration, check: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not reached in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_cut_off_from_redis_do_not_grow_the_others_shares() {
    avoid_window_edge(3600, 120).await;
    let mut redis = RedisServer::start();
    let upstream = ([127, 0, 0, 1], redis.port).into();
    let mut proxies = Vec::new();
    for _ in 0..REPLICAS {
        proxies.push(FaultProxy::start(upstream).await);
    }
    let dir = config_dir(CONFIG);
    let sluices: Vec<Sluice> = proxies
        .iter()
        .map(|proxy| {
            Sluice::start(
                dir.path(),
                None,
                &[
                    ("BACKEND_TYPE", "redis"),
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", &proxy.url()),
                    ("REDIS_TIMEOUT", "200ms"),
                    ("FAILURE_POLICY", "local_share"),
                ],
            )
        })
        .collect();
    until(
        "every replica counts three",
        Duration::from_secs(30),
        || sluices.iter().all(|s| learnt(s) == REPLICAS as f64),
    )
    .await;

    // The third replica's path to Redis stalls: its beats go unanswered.
    proxies[2].set(Faults {
        stall: true,
        ..Faults::default()
    });
    let members = || {
        redis
            .cli(&["ZCARD", "{sluice_replicas}"])
            .map(|n| n.trim().to_string())
    };
    until(
        "the cut-off replica drops out of the set",
        Duration::from_secs(40),
        || members().as_deref() == Some("2"),
    )
    .await;
    // Three more beats of the two that see Redis, each seeing two members.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let counts: Vec<f64> = sluices.iter().map(learnt).collect();

    // Now Redis is lost by all: every replica decides alone, in one window of one counter.
    redis.kill();
    let mut admitted = Vec::new();
    for sluice in &sluices {
        let mut client = sluice.client().await;
        let mut granted = 0;
        for _ in 0..LIMIT {
            let call = request("p", vec![descriptor(&[("tenant", "after-the-cut")])]);
            let answer =
                tokio::time::timeout(Duration::from_secs(10), client.should_rate_limit(call))
                    .await
                    .expect("an answer within 10 s")
                    .expect("decided locally, never an error")
                    .into_inner();
            let marked = answer
                .response_headers_to_add
                .iter()
                .any(|h| h.key == sluice::rls::DEGRADED_HEADER);
            assert!(marked, "not a local decision: {answer:?}");
            granted += u64::from(answer.overall_code == Code::Ok as i32);
        }
        admitted.push(granted);
    }
    let total: u64 = admitted.iter().sum();
    println!(
        "PARTIAL-OUTAGE: replica counts after one was cut off {counts:?}; with Redis lost by \
         all, admitted {admitted:?} = {total} of a limit of {LIMIT}"
    );
    assert!(
        total <= LIMIT,
        "a window decided only locally admitted {total} of {LIMIT} ({admitted:?}; counts {counts:?})"
    );
    assert_eq!(
        counts,
        vec![REPLICAS as f64; REPLICAS as usize],
        "a replica cut off from Redis made the others' count shrink"
    );
    assert!(
        admitted.iter().all(|&a| a == LIMIT / REPLICAS),
        "{admitted:?}"
    );
    drop(proxies);
}
