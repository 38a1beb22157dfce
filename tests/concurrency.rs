//! A limit of L admits exactly L under many concurrent callers, on each store and across two
//! service processes sharing one Redis.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use sluice::proto::Code;

const LIMIT: usize = 1000;
const REQUESTS: usize = 20_000;
const CLIENTS: usize = 64;

fn config() -> tempfile::TempDir {
    config_dir(&format!(
        "domain: load\ndescriptors:\n  - key: hot\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}\n"
    ))
}

/// Sends REQUESTS requests for one key from CLIENTS concurrent callers spread over `servers`
/// and returns how many were admitted.
async fn hammer(servers: &[&Sluice]) -> usize {
    // A day window: make sure it does not roll during the run.
    avoid_window_edge(86_400, 120).await;
    let sent = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let mut client = servers[i % servers.len()].client().await;
        let (sent, admitted) = (sent.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            while sent.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                let r = ask(
                    &mut client,
                    request("load", vec![descriptor(&[("hot", "k")])]),
                )
                .await;
                if r.overall_code == Code::Ok as i32 {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_admits_exactly_the_limit() {
    let dir = config();
    let sluice = Sluice::start(dir.path(), None, &[]);
    assert_eq!(hammer(&[&sluice]).await, LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_admits_exactly_the_limit() {
    let redis = RedisServer::start();
    let dir = config();
    let sluice = Sluice::start(dir.path(), Some(&redis), &[]);
    assert_eq!(hammer(&[&sluice]).await, LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_redis_admit_exactly_the_limit_in_total() {
    let redis = RedisServer::start();
    let dir = config();
    let a = Sluice::start(dir.path(), Some(&redis), &[]);
    let b = Sluice::start(dir.path(), Some(&redis), &[]);
    assert_eq!(hammer(&[&a, &b]).await, LIMIT);
}
