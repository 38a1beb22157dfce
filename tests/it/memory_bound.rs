//! The memory store's bound against a flood of fresh descriptor values, through the real binary
//! over gRPC: a client over its limit must stay refused however many new counters others (or it)
//! create. The store-level tests and the worst-case figures are in `src/store/memory/table.rs`.

use sluice_test_kit as kit;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kit::*;
use sluice::proto::{Code, RateLimitRequest};

const CONFIG: &str = r#"
domain: flood
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
"#;

/// Descriptors per request: the default `MAX_DESCRIPTORS_PER_REQUEST`.
const BATCH: usize = 64;

fn users(names: &[String]) -> RateLimitRequest {
    request(
        "flood",
        names
            .iter()
            .map(|n| descriptor(&[("user", n.as_str())]))
            .collect(),
    )
}

fn codes(response: &sluice::proto::RateLimitResponse) -> Vec<Code> {
    response
        .statuses
        .iter()
        .map(|s| Code::try_from(s.code).unwrap())
        .collect()
}

/// 640 users over their daily limit of 5 (10 per shard of 100 counters), then 20 000 requests'
/// worth of fresh users: every one of the 640 is still refused. Before eviction drew its sample
/// at random and ranked counters by the hits they hold, the flood swept each shard in map order
/// and most of them were admitted again.
#[tokio::test]
async fn users_over_their_limit_stay_refused_through_a_flood_of_fresh_values() {
    // The windows are days (UTC): do not start just before one ends.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = 86_400 - now.as_secs() % 86_400;
    if left < 120 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[("MEMORY_MAX_COUNTERS", "6400")]);
    let mut client = sluice.client().await;

    let victims: Vec<String> = (0..640).map(|i| format!("victim{i}")).collect();
    for round in 1..=6 {
        for batch in victims.chunks(BATCH) {
            let got = codes(&ask(&mut client, users(batch)).await);
            let want = if round <= 5 {
                Code::Ok
            } else {
                Code::OverLimit
            };
            assert!(got.iter().all(|c| *c == want), "round {round}: {got:?}");
        }
    }

    let fresh: Vec<String> = (0..20_000).map(|i| format!("fresh{i}")).collect();
    for batch in fresh.chunks(BATCH) {
        let got = codes(&ask(&mut client, users(batch)).await);
        assert!(got.iter().all(|c| *c == Code::Ok), "{got:?}");
    }
    let evictions = sluice.metric("sluice_memory_store_evictions_total");
    assert!(evictions > 10_000.0, "{evictions} evictions");

    let mut admitted = 0;
    for batch in victims.chunks(BATCH) {
        let got = codes(&ask(&mut client, users(batch)).await);
        admitted += got.iter().filter(|c| **c == Code::Ok).count();
    }
    assert_eq!(admitted, 0, "of {} users over their limit", victims.len());
    sluice.terminate();
}
