//! A limit of N admits exactly N across two client processes hammering it at once, through
//! both APIs, on both stores. On Redis each process talks to a Sluice replica of its own, both
//! sharing one Redis, as a fleet does.
//!
//! The client processes are this test binary run again with the `worker` test, which is ignored
//! in a normal run and reads what to do from the environment.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Redis, Sluice, Store};
use sluice_client::limiter::{Algorithm, SetMode};
use sluice_client::{
    AnsweredBy, Client, Descriptor, FailurePolicy, LimiterConfig, RateLimitRequest,
};

/// Concurrent tasks per process, and calls per task: 2 × 8 × 25 = 400 attempts at each limit.
const TASKS: usize = 8;
const CALLS_PER_TASK: usize = 25;
/// The `shared` rule of `common::CONFIG`, and the native limiter made to match it.
const LIMIT: u64 = 40;
const NATIVE_LIMITER: &str = "shared_native";

#[test]
fn memory_store_admits_exactly_the_limit_across_two_processes() {
    exactly_the_limit(Store::Memory);
}

#[test]
fn redis_store_admits_exactly_the_limit_across_two_processes_and_replicas() {
    exactly_the_limit(Store::Redis);
}

fn exactly_the_limit(store: Store) {
    let redis = (store == Store::Redis).then(Redis::start);
    let first = Sluice::start(redis.as_ref(), &[]);
    // On Redis the second process asks another replica; in memory there is one counter table.
    let second = redis.as_ref().map(|r| Sluice::start(Some(r), &[]));
    let endpoints = [
        first.endpoint(),
        second.as_ref().unwrap_or(&first).endpoint(),
    ];
    create_native_limiter(&first);

    for api in ["rls", "native"] {
        // Both workers start hammering at the same instant, well after both have started.
        let start_at =
            SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(3);
        let workers: Vec<_> = endpoints
            .iter()
            .map(|endpoint| spawn_worker(endpoint, api, start_at))
            .collect();
        let mut admitted = 0;
        for worker in workers {
            let output = worker.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "{api} worker failed:\n{stdout}");
            let own = worker_count(&stdout, "admitted");
            eprintln!("{api} on {store:?}: a client process admitted {own}");
            admitted += own;
            assert_eq!(worker_count(&stdout, "errors"), 0, "{api}:\n{stdout}");
        }
        assert_eq!(
            admitted, LIMIT,
            "{api} on {store:?}: {admitted} admitted, limit {LIMIT}"
        );
    }
}

fn create_native_limiter(sluice: &Sluice) {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = sluice.client(FailurePolicy::Closed).await;
        let config = LimiterConfig::new(
            NATIVE_LIMITER,
            Algorithm::FixedWindow,
            LIMIT,
            Duration::from_secs(86_400),
        );
        let set = client
            .set_rate(config, SetMode::UpdateResetState)
            .await
            .unwrap();
        assert!(set.applied);
    });
}

fn spawn_worker(endpoint: &str, api: &str, start_at: Duration) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .arg(sluice_test_kit::test_path(module_path!(), "worker"))
        .args(["--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("WORKER_ENDPOINT", endpoint)
        .env("WORKER_API", api)
        .env("WORKER_START_AT_MS", start_at.as_millis().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The number a worker printed as `name=<n>` (libtest may print its own text before it).
fn worker_count(stdout: &str, name: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.split_once(&format!("{name}="))?.1.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}= line in the worker's output:\n{stdout}"))
}

/// One client process: `TASKS` tasks sharing one client, each making `CALLS_PER_TASK` calls;
/// prints how many were admitted and how many failed. Fail-closed, so a failure can never be
/// counted as admitted.
#[test]
#[ignore = "a client process of the tests above, run by them"]
fn worker() {
    // Run on its own (`--include-ignored`), it has nothing to do.
    let Ok(endpoint) = std::env::var("WORKER_ENDPOINT") else {
        eprintln!("the worker runs only as a child of the tests in this file");
        return;
    };
    let api = std::env::var("WORKER_API").unwrap();
    let start_at: u64 = std::env::var("WORKER_START_AT_MS")
        .unwrap()
        .parse()
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (admitted, errors) = runtime.block_on(async {
        let client = Client::builder()
            .failure_policy(FailurePolicy::Closed)
            .deadline(Duration::from_secs(10))
            .connect(endpoint)
            .await
            .unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        tokio::time::sleep(Duration::from_millis(start_at).saturating_sub(now)).await;
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| tokio::spawn(hammer(client.clone(), api.clone())))
            .collect();
        let mut totals = (0, 0);
        for task in tasks {
            let (admitted, errors) = task.await.unwrap();
            totals = (totals.0 + admitted, totals.1 + errors);
        }
        totals
    });
    println!("admitted={admitted}");
    println!("errors={errors}");
}

/// (admitted, errors) of one task's calls.
async fn hammer(client: Client, api: String) -> (u64, u64) {
    let (mut admitted, mut errors) = (0, 0);
    for _ in 0..CALLS_PER_TASK {
        let answer = if api == "rls" {
            let request = RateLimitRequest::new("client_test")
                .descriptor(Descriptor::new().entry("shared", "one_budget"));
            client
                .should_rate_limit(request)
                .await
                .map(|d| (d.allowed, d.answered_by))
                .map_err(|e| e.to_string())
        } else {
            client
                .try_acquire(NATIVE_LIMITER, "", 1, Duration::ZERO)
                .await
                .map(|a| (a.acquired, a.answered_by))
                .map_err(|e| e.to_string())
        };
        match answer {
            Ok((true, AnsweredBy::Sluice)) => admitted += 1,
            Ok((false, AnsweredBy::Sluice)) => {}
            other => {
                eprintln!("{api}: {other:?}");
                errors += 1;
            }
        }
    }
    (admitted, errors)
}
