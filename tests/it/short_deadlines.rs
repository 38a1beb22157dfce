//! Deadlines that cannot be used against the limit (issue #40, item 2): a real `sluice` process
//! on each store, a real `redis-server`, callers that send `grpc-timeout` and wait for the
//! server's answer (`kit::untimed`: tonic's own channel would give up first).
//!
//! - A call whose deadline is already past or below `GRPC_MIN_TIMEOUT` (`1n`, `0n`, a few µs)
//!   on a limit already used up is answered `DEADLINE_EXCEEDED`, on both stores, under
//!   `fail_open` and `local_share`: never an admission, never the failure policy's answer
//!   (before: `fail_open` answered OK, `local_share` decided on counts of its own, the memory
//!   store answered as if the caller had waited).
//! - 200 such calls among normal callers never open the circuit breaker: health stays SERVING,
//!   the normal callers get exact answers.
//! - The native API answers such calls the same way.
//! - A 500 ms pause of Redis (`CLIENT PAUSE`) after a quiet second, at low traffic, is no
//!   outage (issue #40, "late, not down" judged store-wide): callers with a short deadline get
//!   `DEADLINE_EXCEEDED`, never a local decision; callers without one time out late, and the
//!   breaker stays closed.

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kit::untimed::{limiter_client, rls_client, with_deadline};
use kit::*;
use sluice::proto::Code;
use tokio::time::Instant;

const LIMIT: u64 = 5;
const CONFIG: &str = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: shared\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: free\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n";

/// Deadlines no store call can meet: past at arrival, or below `GRPC_MIN_TIMEOUT` (100 µs).
const TOO_SHORT: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_micros(3),
    Duration::from_micros(20),
    Duration::from_micros(60),
];

/// Upstream's error stats (`ratelimit.service.call.should_rate_limit.*_error`), summed.
fn upstream_errors(sluice: &Sluice) -> u64 {
    let (status, body) = http_request(sluice.debug, "GET", "/stats", "");
    assert_eq!(status, 200, "sluice /stats: {body}");
    body.lines()
        .filter_map(|l| l.strip_prefix("ratelimit.service.call.should_rate_limit."))
        .filter_map(|l| l.split_once("_error: "))
        .map(|(_, n)| n.trim().parse::<u64>().unwrap())
        .sum()
}

fn tenant(name: &str) -> sluice::proto::RateLimitRequest {
    request("d", vec![descriptor(&[("tenant", name)])])
}

fn start(
    kind: StoreKind,
    redis: Option<&RedisServer>,
    policy: &str,
) -> (Sluice, tempfile::TempDir) {
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        redis.filter(|_| kind == StoreKind::Redis),
        &[
            ("FAILURE_POLICY", policy),
            ("REDIS_POOL_SIZE", "4"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ],
    );
    (sluice, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_that_cannot_be_met_are_deadline_exceeded_never_an_admission() {
    avoid_window_edge(3600, 30).await;
    for_each_store(|kind, redis| async move {
        let policies: &[&str] = match kind {
            StoreKind::Memory => &["fail_closed"],
            StoreKind::Redis => &["fail_open", "local_share"],
        };
        for policy in policies {
            let (sluice, _dir) = start(kind, redis.as_ref(), policy);
            let mut client = rls_client(sluice.grpc);
            let name = format!("{kind:?}-{policy}");
            // The limit used up, by callers that wait.
            for i in 0..=LIMIT {
                let answer = client
                    .should_rate_limit(with_deadline(tenant(&name), Duration::from_secs(5)))
                    .await
                    .unwrap()
                    .into_inner();
                let expected = if i < LIMIT { Code::Ok } else { Code::OverLimit };
                assert_eq!(answer.overall_code, expected as i32, "{name}: call {i}");
            }
            let mut sent = 0;
            for round in 0..6 {
                for timeout in TOO_SHORT {
                    sent += 1;
                    let answer = client
                        .should_rate_limit(with_deadline(tenant(&name), timeout))
                        .await;
                    match answer {
                        Err(status) => assert_eq!(
                            status.code(),
                            tonic::Code::DeadlineExceeded,
                            "{name}, {timeout:?}, round {round}: {status:?}"
                        ),
                        Ok(answer) => panic!(
                            "{name}, {timeout:?}, round {round}: answered {:?} instead of \
                             DEADLINE_EXCEEDED",
                            answer.into_inner()
                        ),
                    }
                }
            }
            // Still exact for callers that wait.
            let answer = client
                .should_rate_limit(with_deadline(tenant(&name), Duration::from_secs(5)))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.overall_code, Code::OverLimit as i32, "{name}");
            let refused = sluice.metric(
                "sluice_calls_deadline_too_short_total{service=\"envoy.service.ratelimit.v3.RateLimitService\",stage=\"before_store\"}",
            );
            assert_eq!(refused, f64::from(sent), "{name}: each counted once");
            for series in [
                "sluice_failed_open_total",
                "sluice_degraded_decisions_total{store=\"redis\"}",
            ] {
                assert_eq!(sluice.metric(series), 0.0, "{name}: {series}");
            }
            assert_eq!(upstream_errors(&sluice), 0, "{name}: upstream's error stats");
            println!("SHORT-DEADLINE: {name}: {sent} calls with deadlines of 0 to 60 µs, all DEADLINE_EXCEEDED");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_api_answers_deadlines_that_cannot_be_met_the_same_way() {
    use sluice::proto::sluice::v1::{Algorithm, LimiterConfig, SetRateRequest, TryAcquireRequest};

    for_each_store(|kind, redis| async move {
        let (sluice, _dir) = start(kind, redis.as_ref(), "local_share");
        let mut client = limiter_client(sluice.grpc);
        let config = LimiterConfig {
            name: "api".into(),
            algorithm: Algorithm::FixedWindow as i32,
            rate: 2,
            interval: Some(Duration::from_secs(3600).try_into().unwrap()),
            ..Default::default()
        };
        let set = SetRateRequest {
            config: Some(config),
            set_mode: 0,
        };
        client
            .set_rate(with_deadline(set, Duration::from_secs(5)))
            .await
            .unwrap();
        let take = || TryAcquireRequest {
            name: "api".into(),
            permits: 1,
            timeout: None,
            client_id: String::new(),
        };
        let mut granted = 0;
        for _ in 0..3 {
            let answer = client
                .try_acquire(with_deadline(take(), Duration::from_secs(5)))
                .await
                .unwrap()
                .into_inner();
            granted += u32::from(answer.acquired);
        }
        assert_eq!(granted, 2, "{kind:?}");
        for timeout in TOO_SHORT {
            let status = client
                .try_acquire(with_deadline(take(), timeout))
                .await
                .expect_err("no store call fits such a deadline");
            assert_eq!(
                status.code(),
                tonic::Code::DeadlineExceeded,
                "{kind:?}, {timeout:?}: {status:?}"
            );
        }
        let refused = sluice.metric(
            "sluice_calls_deadline_too_short_total{service=\"sluice.v1.Limiter\",stage=\"before_store\"}",
        );
        assert_eq!(refused, TOO_SHORT.len() as f64, "{kind:?}");
    })
    .await;
}

/// What the normal callers saw.
#[derive(Default)]
struct Normal {
    admitted: AtomicU64,
    over: AtomicU64,
    failed: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_deadlines_among_normal_calls_never_open_the_breaker() {
    avoid_window_edge(3600, 60).await;
    for_each_store(|kind, redis| async move {
        for policy in ["fail_open", "local_share"] {
            let (sluice, _dir) = start(kind, redis.as_ref(), policy);
            let name = format!("{kind:?}-{policy}");
            let stop = Arc::new(AtomicBool::new(false));
            let normal = Arc::new(Normal::default());
            // Four callers that wait, on one limit of 100 and on one they never reach.
            let callers: Vec<_> = (0..4)
                .map(|i| {
                    let (grpc, stop, normal, name) =
                        (sluice.grpc, stop.clone(), normal.clone(), name.clone());
                    tokio::spawn(async move {
                        let mut client = rls_client(grpc);
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            n += 1;
                            let (key, value) = if n.is_multiple_of(2) {
                                ("shared", name.clone())
                            } else {
                                ("free", format!("{name}-{i}"))
                            };
                            let call = request("d", vec![descriptor(&[(key, &value)])]);
                            let answer = client
                                .should_rate_limit(with_deadline(call, Duration::from_secs(5)))
                                .await;
                            match answer.map(|a| a.into_inner().overall_code) {
                                Ok(c) if c == Code::OverLimit as i32 => {
                                    normal.over.fetch_add(1, Ordering::Relaxed);
                                }
                                Ok(_) if key == "shared" => {
                                    normal.admitted.fetch_add(1, Ordering::Relaxed);
                                }
                                Ok(_) => {}
                                Err(_) => {
                                    normal.failed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    })
                })
                .collect();
            // Health and the breaker, sampled while the calls run.
            let (http, watch_stop) = (sluice.http, stop.clone());
            let monitor = tokio::task::spawn_blocking(move || {
                let (mut samples, mut bad) = (0, 0);
                while !watch_stop.load(Ordering::Relaxed) {
                    samples += 1;
                    let healthy = http_request(http, "GET", "/healthcheck", "").0 == 200;
                    let (_, metrics) = http_request(http, "GET", "/metrics", "");
                    let open = metrics.lines().any(|l| {
                        l.starts_with("sluice_circuit_breaker_open{") && !l.ends_with(" 0")
                    });
                    bad += u32::from(!healthy || open);
                    std::thread::sleep(Duration::from_millis(20));
                }
                (samples, bad)
            });
            // 200 calls that cannot be met, 8 at a time, on the shared limit.
            let short_client = rls_client(sluice.grpc);
            let mut wrong = Vec::new();
            for round in 0..25 {
                let calls = (0..8).map(|j| {
                    let timeout = TOO_SHORT[(round + j) % TOO_SHORT.len()];
                    let call = request("d", vec![descriptor(&[("shared", &name)])]);
                    let mut client = short_client.clone();
                    async move { client.should_rate_limit(with_deadline(call, timeout)).await }
                });
                for answer in futures::future::join_all(calls).await {
                    match answer {
                        Err(s) if s.code() == tonic::Code::DeadlineExceeded => {}
                        other => wrong.push(format!("{other:?}")),
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The normal callers go on until the shared limit is used up, and a little after.
            let waited = Instant::now();
            while normal.over.load(Ordering::Relaxed) == 0 {
                assert!(
                    waited.elapsed() < Duration::from_secs(60),
                    "{name}: no over-limit answer"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.store(true, Ordering::Relaxed);
            for caller in callers {
                caller.await.unwrap();
            }
            let (samples, bad) = monitor.await.unwrap();
            let (admitted, over, failed) = (
                normal.admitted.load(Ordering::Relaxed),
                normal.over.load(Ordering::Relaxed),
                normal.failed.load(Ordering::Relaxed),
            );
            println!(
                "SHORT-DEADLINE: {name}: 200 short calls among normal ones: {} not \
                 DEADLINE_EXCEEDED; normal: {admitted} admitted of 100, {over} over, {failed} \
                 failed; {bad} of {samples} health samples unhealthy or breaker open",
                wrong.len()
            );
            assert!(wrong.is_empty(), "{name}: {wrong:?}");
            assert_eq!(failed, 0, "{name}: a normal caller failed");
            assert_eq!(bad, 0, "{name}: health left SERVING or the breaker opened");
            assert!(over > 0, "{name}: the shared limit was never reached");
            assert_eq!(admitted, 100, "{name}: the shared limit of 100");
            assert_eq!(sluice.metric("sluice_failed_open_total"), 0.0, "{name}");
        }
    })
    .await;
}

/// Runs `redis-cli CLIENT PAUSE ms ALL` on `redis` (every client's commands held for `ms`).
fn pause(redis: &RedisServer, ms: u64) {
    let out = redis.cli(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
    assert_eq!(out.as_deref().map(str::trim), Some("OK"), "CLIENT PAUSE");
}

/// Sequential calls from `callers` callers until `until`, each with `deadline` sent as
/// `grpc-timeout` (`None`: none, and the client waits 5 s); every status but OK, by code and
/// message.
async fn calls_until(
    sluice: &Sluice,
    callers: usize,
    deadline: Option<Duration>,
    until: Instant,
) -> (u64, Vec<tonic::Status>) {
    let runs = (0..callers).map(|i| {
        let grpc = sluice.grpc;
        async move {
            let mut client = rls_client(grpc);
            let (mut ok, mut failed) = (0u64, Vec::new());
            while Instant::now() < until {
                let call = tenant(&format!("pause-{i}"));
                let call = match deadline {
                    Some(d) => with_deadline(call, d),
                    None => tonic::Request::new(call),
                };
                let answer =
                    tokio::time::timeout(Duration::from_secs(5), client.should_rate_limit(call))
                        .await
                        .expect("no answer within 5 s");
                match answer {
                    Ok(answer) => {
                        let answer = answer.into_inner();
                        let marked = answer
                            .response_headers_to_add
                            .iter()
                            .any(|h| h.key == sluice::rls::DEGRADED_HEADER);
                        assert!(!marked, "a local decision during a 500 ms pause");
                        ok += 1;
                    }
                    Err(status) => failed.push(status),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, failed)
        }
    });
    let mut total = (0, Vec::new());
    for (ok, failed) in futures::future::join_all(runs).await {
        total.0 += ok;
        total.1.extend(failed);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_pause_of_redis_at_low_traffic_is_no_outage() {
    let redis = RedisServer::start();
    let dir = config_dir(
        "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n",
    );

    // Callers with a deadline shorter than the store's own timeout, under local_share.
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[
            ("FAILURE_POLICY", "local_share"),
            ("REDIS_POOL_SIZE", "4"),
            ("REDIS_TIMEOUT", "5s"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ],
    );
    let warm = Instant::now() + Duration::from_millis(300);
    let (ok, failed) = calls_until(&sluice, 4, Some(Duration::from_secs(1)), warm).await;
    assert!(ok > 0 && failed.is_empty(), "{failed:?}");
    // Quiet for longer than a second: no connection has read a reply for that long.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pause(&redis, 500);
    let (ok, failed) = calls_until(
        &sluice,
        2,
        Some(Duration::from_millis(100)),
        Instant::now() + Duration::from_millis(900),
    )
    .await;
    let codes: Vec<_> = failed.iter().map(|s| s.code()).collect();
    println!("PAUSE: local_share, callers' deadline 100 ms: {ok} answered, failed: {codes:?}");
    assert!(!failed.is_empty(), "the pause held no call");
    for status in &failed {
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    }
    assert_eq!(
        sluice.metric("sluice_degraded_decisions_total{store=\"redis\"}"),
        0.0
    );
    assert_eq!(
        sluice.metric("sluice_circuit_breaker_open{store=\"redis\"}"),
        0.0
    );
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200);

    // Callers without a deadline, the store's own timeout shorter than the pause: late, not
    // down.
    drop(sluice);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[
            ("REDIS_POOL_SIZE", "4"),
            ("REDIS_TIMEOUT", "100ms"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ],
    );
    let warm = Instant::now() + Duration::from_millis(300);
    let (ok, failed) = calls_until(&sluice, 4, None, warm).await;
    assert!(ok > 0 && failed.is_empty(), "{failed:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pause(&redis, 500);
    let (ok, failed) = calls_until(
        &sluice,
        2,
        None,
        Instant::now() + Duration::from_millis(900),
    )
    .await;
    let messages: Vec<_> = failed.iter().map(|s| s.message().to_string()).collect();
    println!(
        "PAUSE: fail_closed, no caller deadline, REDIS_TIMEOUT=100ms: {ok} answered, failed: {messages:?}"
    );
    assert!(
        failed.len() >= 5,
        "fewer late calls than the breaker needs: {messages:?}"
    );
    for status in &failed {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("while redis was answering"),
            "a 500 ms pause taken for an outage: {status:?}"
        );
    }
    assert_eq!(
        sluice.metric("sluice_circuit_breaker_open{store=\"redis\"}"),
        0.0
    );
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200);
}
