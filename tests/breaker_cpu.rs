//! The circuit breaker on a machine whose CPU is saturated (issue #28, "a breaker for outages,
//! not for a busy CPU"): a real `sluice` process, a real `redis-server` (behind our fault proxy
//! where the network must misbehave), both cores kept busy by two spinning shell processes for
//! each test's duration.
//!
//! What the breaker must tell apart (`crates/sluice/src/store/layers/breaker.rs`, `StoreError::Late` and
//! `store/redis/wire.rs`, `Watch`):
//! - a Redis that is slow but answering (replies late, a long script run by another client)
//!   must never open it: calls time out, but `sluice_circuit_breaker_open` stays 0, health stays
//!   SERVING and no caller is told "circuit breaker open";
//! - a Redis that is dead (killed) or unreachable (the proxy holds every reply) still opens it,
//!   within `BREAKER_FAILURES` (5) failed calls once nothing is heard from Redis, and it closes
//!   again within about one cool-down once Redis answers.
//!
//! Each test prints one `BREAKER-CPU` line with its figures, quoted in docs/reliability.md
//! (`cargo test --test breaker_cpu -- --nocapture 2>/dev/null | grep BREAKER-CPU`).
//!
//! A binary of its own, not a module of `tests/it`: every test here keeps both cores busy
//! ([`kit::CpuHog`]) on purpose, and would starve the tests that `tests/it` runs beside it in
//! parallel threads; alone, it is the only load besides what it starts.

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kit::proxy::{FaultProxy, Faults, Leg};
use kit::*;
use tokio::time::Instant;

/// What a store call may take. The late replies below come 3× later than this, the busy script
/// lasts 3× as long; both stay well inside the 1 s after which a connection that owes replies
/// and reads none counts as dead (`STALLED_AFTER` in wire.rs).
const REDIS_TIMEOUT: &str = "100ms";
const CALLERS: usize = 32;
/// How long a caller waits, on its own side: far past anything Sluice takes to answer. Not sent
/// as `grpc-timeout`: a caller's deadline would rule the store's calls instead of
/// `REDIS_TIMEOUT` (`src/store/deadline.rs`), and these tests need calls that time out after
/// `REDIS_TIMEOUT` while Redis answers.
const DEADLINE: Duration = Duration::from_secs(5);
/// The breaker's default: failures in a row that open it.
const BREAKER_FAILURES: usize = 5;

const CONFIG: &str = "domain: b\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n";

/// Sluice on `redis_url`, and its config directory (kept while it runs).
fn sluice_on(redis_url: &str) -> (Sluice, tempfile::TempDir) {
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis_url),
            ("REDIS_TIMEOUT", REDIS_TIMEOUT),
            // Health follows the breaker, so an open breaker shows as NOT_SERVING.
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ],
    );
    (sluice, dir)
}

/// One call without `grpc-timeout` (see [`DEADLINE`]), given up on after `DEADLINE`.
async fn call(
    client: &mut sluice::proto::RateLimitServiceClient<tonic::transport::Channel>,
    i: usize,
) -> Result<sluice::proto::RateLimitResponse, tonic::Status> {
    match tokio::time::timeout(DEADLINE, client.should_rate_limit(tenant(i))).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "no answer within DEADLINE",
        )),
    }
}

fn tenant(i: usize) -> sluice::proto::RateLimitRequest {
    request("b", vec![descriptor(&[("tenant", &format!("t{i}"))])])
}

/// What the callers saw.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Calls refused by an open breaker (the status message says so).
    breaker_open: AtomicU64,
}

/// `CALLERS` callers, each on its own connection, asking until `stop` is set.
fn start_callers(
    sluice: &Sluice,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let grpc = format!("http://{}", sluice.grpc);
    (0..CALLERS)
        .map(|i| {
            let (grpc, stop, tally) = (grpc.clone(), stop.clone(), tally.clone());
            tokio::spawn(async move {
                let mut client = sluice::proto::RateLimitServiceClient::connect(grpc)
                    .await
                    .unwrap();
                while !stop.load(Ordering::Relaxed) {
                    match call(&mut client, i).await {
                        Ok(_) => tally.ok.fetch_add(1, Ordering::Relaxed),
                        Err(status) => {
                            if status.message().contains("circuit breaker open") {
                                tally.breaker_open.fetch_add(1, Ordering::Relaxed);
                            }
                            // Do not spin on failures.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            tally.failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect()
}

/// What the monitor saw while sampling health and the breaker gauge.
#[derive(Default)]
struct Watched {
    samples: AtomicU64,
    not_serving: AtomicU64,
    gauge_open: AtomicU64,
}

/// Samples `/healthcheck` and `sluice_circuit_breaker_open` every 20 ms until `stop`.
fn start_monitor(
    sluice: &Sluice,
    stop: &Arc<AtomicBool>,
    watched: &Arc<Watched>,
) -> tokio::task::JoinHandle<()> {
    let (http, stop, watched) = (sluice.http, stop.clone(), watched.clone());
    tokio::task::spawn_blocking(move || {
        while !stop.load(Ordering::Relaxed) {
            watched.samples.fetch_add(1, Ordering::Relaxed);
            if http_request(http, "GET", "/healthcheck", "").0 != 200 {
                watched.not_serving.fetch_add(1, Ordering::Relaxed);
            }
            let (_, metrics) = http_request(http, "GET", "/metrics", "");
            let open = metrics.lines().any(|l| {
                l.strip_prefix("sluice_circuit_breaker_open{store=\"redis\"} ")
                    .is_some_and(|v| v.trim() != "0")
            });
            if open {
                watched.gauge_open.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// A script run by another client that keeps Redis busy for `ms` (wall clock), as a slow Lua
/// script or `DEBUG SLEEP` would: nothing else is answered meanwhile.
fn busy_script(redis: &RedisServer, ms: u64) {
    let script = format!(
        "local s = redis.call('TIME') \
         while true do \
           local n = redis.call('TIME') \
           if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) >= {us} then return 1 end \
         end",
        us = ms * 1000
    );
    let out = redis.cli(&["EVAL", &script, "0"]);
    assert_eq!(out.as_deref().map(str::trim), Some("1"), "busy script ran");
}

/// What the calls before the breaker opened saw.
struct UntilOpen {
    /// Calls that failed before one was refused by the open breaker.
    failed: usize,
    /// Of those, the outages at the end, with no answer or late call between them: what the
    /// breaker counts. A call that times out while the connection it was written to read a
    /// reply within the last second is late, not an outage (`StoreError::Late`), and it
    /// starts the count again; on a starved CPU the first calls after a kill can be late.
    outages_in_a_row: usize,
    /// Calls that failed late (the status says "while redis was answering").
    late: usize,
    /// Calls told that Redis refused the connection (rather than that they ran out of time).
    refused: usize,
    took: Duration,
}

/// Sequential calls until one is refused by the open breaker. Panics past `within`.
async fn calls_until_open(sluice: &Sluice, within: Duration) -> UntilOpen {
    let mut client = sluice.client().await;
    let started = Instant::now();
    let (mut failed, mut outages_in_a_row, mut late, mut refused) = (0, 0, 0, 0);
    loop {
        assert!(
            started.elapsed() < within,
            "the breaker did not open within {within:?} ({failed} calls failed)"
        );
        match call(&mut client, 0).await {
            Err(status) if status.message().contains("circuit breaker open") => {
                let took = started.elapsed();
                return UntilOpen {
                    failed,
                    outages_in_a_row,
                    late,
                    refused,
                    took,
                };
            }
            Err(status) if status.message().contains("while redis was answering") => {
                (failed, late, outages_in_a_row) = (failed + 1, late + 1, 0);
            }
            Err(status) => {
                (failed, outages_in_a_row) = (failed + 1, outages_in_a_row + 1);
                if status.message().contains("refused") {
                    refused += 1;
                }
            }
            Ok(_) => outages_in_a_row = 0,
        }
    }
}

/// Calls until one is answered; how long after `since` that was. Panics past `within`.
async fn first_answer_after(sluice: &Sluice, since: Instant, within: Duration) -> Duration {
    let mut client = sluice.client().await;
    loop {
        if call(&mut client, 0).await.is_ok() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < within,
            "no answer {within:?} after Redis answered again"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Lines Sluice logged that say the breaker opened.
fn breaker_logs(sluice: &Sluice) -> usize {
    sluice
        .stdout_rest
        .try_iter()
        .filter(|line| line.contains("circuit breaker open"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_redis_that_answers_never_opens_the_breaker() {
    let _hog = CpuHog::start();
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(([127, 0, 0, 1], redis.port).into()).await;
    let (sluice, _dir) = sluice_on(&proxy.url());
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let watched = Arc::new(Watched::default());
    let monitor = start_monitor(&sluice, &stop, &watched);
    let callers = start_callers(&sluice, &stop, &tally);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ok_before = tally.ok.load(Ordering::Relaxed);

    // Every reply 300 ms late (3× REDIS_TIMEOUT): every call times out, Redis keeps answering.
    proxy.set(Faults {
        down: Leg {
            latency: Duration::from_millis(300),
            ..Leg::default()
        },
        ..Faults::default()
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.clear();
    let failed_late = tally.failed.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Redis itself busy: a 300 ms script from another client, three times.
    let failed_before_scripts = tally.failed.load(Ordering::Relaxed);
    for _ in 0..3 {
        tokio::task::block_in_place(|| busy_script(&redis, 300));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let failed_scripts = tally.failed.load(Ordering::Relaxed) - failed_before_scripts;
    tokio::time::sleep(Duration::from_millis(500)).await;

    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    monitor.await.unwrap();
    let (ok, failed, refused) = (
        tally.ok.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.breaker_open.load(Ordering::Relaxed),
    );
    let (samples, not_serving, gauge_open) = (
        watched.samples.load(Ordering::Relaxed),
        watched.not_serving.load(Ordering::Relaxed),
        watched.gauge_open.load(Ordering::Relaxed),
    );
    let logged = breaker_logs(&sluice);
    println!(
        "BREAKER-CPU slow-but-answering: calls ok={ok} failed={failed} (late replies {failed_late}, \
         busy scripts {failed_scripts}) refused-by-open-breaker={refused}; \
         health/gauge samples={samples} not-serving={not_serving} gauge-open={gauge_open}; \
         breaker-open log lines={logged}"
    );
    // The slowness was felt (else this test could not fail): calls timed out under both.
    assert!(ok_before > 0, "answers before the fault");
    assert!(failed_late > 0, "late replies made calls time out");
    assert!(failed_scripts > 0, "the busy script made calls time out");
    // And it never became an outage.
    assert_eq!(refused, 0, "calls refused by an open breaker");
    assert_eq!(logged, 0, "the breaker opened (log)");
    assert!(samples > 10, "the monitor sampled");
    assert_eq!(not_serving, 0, "health left SERVING");
    assert_eq!(gauge_open, 0, "sluice_circuit_breaker_open was 1");
    assert!(ok > ok_before, "answers after the fault");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_redis_opens_the_breaker_within_five_calls_and_it_closes_after_one_cool_down() {
    let _hog = CpuHog::start();
    let mut redis = RedisServer::start();
    let (sluice, _dir) = sluice_on(&format!("127.0.0.1:{}", redis.port));
    let mut client = sluice.client().await;
    client.should_rate_limit(tenant(0)).await.unwrap();

    redis.kill();
    let opened = calls_until_open(&sluice, Duration::from_secs(10)).await;
    let UntilOpen {
        failed,
        late,
        refused,
        took,
        ..
    } = opened;
    assert!(
        (1..=BREAKER_FAILURES).contains(&opened.outages_in_a_row),
        "{} outages in a row before the breaker opened ({failed} failed, {late} of them late)",
        opened.outages_in_a_row
    );
    // A connect Redis refuses fails the calls waiting for it at once, with the reason, instead
    // of leaving them to wait out their deadline (conn.rs, `Refusals`).
    assert!(refused > 0, "no call was told the connection was refused");
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 500, "NOT_SERVING");
    assert_eq!(
        sluice.metric("sluice_circuit_breaker_open{store=\"redis\"}"),
        1.0
    );

    // Callers keep calling through the outage, calls in flight included.
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let callers = start_callers(&sluice, &stop, &tally);
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| redis.restart());
    // Ten times the longest cool-down (1 s).
    let back = first_answer_after(&sluice, Instant::now(), Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    wait_until("health SERVING again", || {
        sluice.http("GET", "/healthcheck", "").0 == 200
    });
    println!(
        "BREAKER-CPU redis-killed: opened after {failed} failed calls ({refused} refused, {late} \
         late) in {took:?}; answered again {back:?} after Redis was back; refused-by-open-breaker={}",
        tally.breaker_open.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_redis_opens_the_breaker_and_it_closes_after_one_cool_down() {
    let _hog = CpuHog::start();
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(([127, 0, 0, 1], redis.port).into()).await;
    let (sluice, _dir) = sluice_on(&proxy.url());
    let mut client = sluice.client().await;
    client.should_rate_limit(tenant(0)).await.unwrap();

    // The proxy holds every reply: nothing comes back, the sockets stay open. Late for the
    // first second (the last reply is recent), then dead.
    proxy.set(Faults {
        stall: true,
        ..Faults::default()
    });
    let UntilOpen { failed, took, .. } = calls_until_open(&sluice, Duration::from_secs(20)).await;
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 500, "NOT_SERVING");

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let callers = start_callers(&sluice, &stop, &tally);
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.clear();
    let back = first_answer_after(&sluice, Instant::now(), Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    wait_until("health SERVING again", || {
        sluice.http("GET", "/healthcheck", "").0 == 200
    });
    println!(
        "BREAKER-CPU redis-unreachable: opened after {failed} failed calls ({took:?}); \
         answered again {back:?} after the proxy let replies through"
    );
}
