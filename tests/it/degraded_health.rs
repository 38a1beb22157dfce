//! Readiness follows the ability to answer (issue #42): the real binary on a real
//! `redis-server`, `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true` (the chart's default), Redis
//! killed and the circuit breaker opened by traffic.
//!
//! With `FAILURE_POLICY=local_share` the replica still decides every call (a limit of 3: 3
//! admitted, then refused, each answer marked), so it stays ready: `/healthcheck` 200 in every
//! probe, the gRPC health service SERVING, and the degraded state shown by
//! `sluice_serving_degraded`, `/healthcheck`'s body and one log line; when Redis is back the
//! mark goes. With `fail_closed` and `fail_open` the replica cannot decide, and health is as
//! upstream's: `/healthcheck` 500 and NOT_SERVING while the breaker is open.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::readiness::{grpc_health, marked_degraded, metric_at, open_breaker};
use kit::{RedisServer, Sluice, ask, avoid_window_edge, config_dir, descriptor, request};
use sluice::proto::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const LIMITS: &str = "\
domain: ready
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 3 }
";

/// Probes `/healthcheck` as a readiness probe would, `times` times `every` apart; the statuses
/// and the last body.
fn probe(sluice: &Sluice, times: usize, every: Duration) -> (Vec<u16>, String) {
    let mut statuses = Vec::new();
    let mut body = String::new();
    for i in 0..times {
        if i > 0 {
            std::thread::sleep(every);
        }
        let (status, text) = sluice.http("GET", "/healthcheck", "");
        statuses.push(status);
        body = text;
    }
    (statuses, body)
}

/// The log lines received so far that contain `text`.
fn logged(sluice: &Sluice, text: &str) -> Vec<String> {
    sluice
        .stdout_rest
        .try_iter()
        .filter(|l| l.contains(text))
        .collect()
}

fn start(dir: &tempfile::TempDir, redis: &RedisServer, policy: &str) -> Sluice {
    Sluice::start(
        dir.path(),
        Some(redis),
        &[
            ("FAILURE_POLICY", policy),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
            ("REDIS_TIMEOUT", "200ms"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_deciding_with_its_share_stays_ready_and_says_it_is_degraded() {
    avoid_window_edge(3600, 120).await;
    let mut redis = RedisServer::start();
    let dir = config_dir(LIMITS);
    let sluice = start(&dir, &redis, "local_share");
    let mut client = sluice.client().await;
    assert_eq!(sluice.http("GET", "/healthcheck", ""), (200, "OK".into()));
    assert_eq!(sluice.metric("sluice_serving_degraded"), 0.0);

    redis.kill();
    open_breaker(&mut client, sluice.http, "ready", ("user", "trip")).await;

    // Four probes a second apart (the chart's readiness probe takes a pod out after 2 failures
    // 5 s apart): every one 200, the body saying why.
    let (statuses, body) = probe(&sluice, 4, Duration::from_secs(1));
    assert_eq!(statuses, [200; 4], "readiness while deciding locally");
    assert!(
        body.starts_with("OK\n") && body.contains("DEGRADED") && body.contains("local_share"),
        "{body:?}"
    );
    for service in ["ratelimit", ""] {
        assert_eq!(
            grpc_health(sluice.grpc, service).await,
            ServingStatus::Serving,
            "gRPC health of {service:?}"
        );
    }
    assert_eq!(sluice.metric("sluice_serving_degraded"), 1.0);
    assert_eq!(
        sluice.metric("sluice_circuit_breaker_open{store=\"redis\"}"),
        1.0,
        "the breaker is still open: the probes above saw the degraded state"
    );
    let lines = logged(&sluice, "staying ready");
    assert_eq!(lines.len(), 1, "one log line for the change: {lines:?}");

    // And it decides: a limit of 3, this replica's share of it (1 replica learnt) is 3.
    let u1 = || request("ready", vec![descriptor(&[("user", "u1")])]);
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = ask(&mut client, u1()).await;
        assert!(marked_degraded(&answer), "{answer:?}");
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    // Liveness (the chart's /metrics) is untouched.
    assert_eq!(sluice.http("GET", "/metrics", "").0, 200);

    // Redis back: the breaker's own probe closes it, and the mark goes.
    redis.restart();
    kit::wait_until("the degraded mark gone", || {
        metric_at(sluice.http, "sluice_serving_degraded") == 0.0
    });
    assert_eq!(sluice.http("GET", "/healthcheck", ""), (200, "OK".into()));
    let answer = ask(&mut client, u1()).await;
    assert!(!marked_degraded(&answer), "decided on redis again");
    assert!(!logged(&sluice, "no longer degraded").is_empty());
}

/// `fail_closed` and `fail_open` keep upstream's behaviour: with the active-connection check,
/// an open breaker takes the replica out of service.
#[tokio::test(flavor = "multi_thread")]
async fn without_local_share_an_open_breaker_still_makes_the_replica_unready() {
    for policy in ["fail_closed", "fail_open"] {
        let mut redis = RedisServer::start();
        let dir = config_dir(LIMITS);
        let sluice = start(&dir, &redis, policy);
        let mut client = sluice.client().await;
        assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200, "{policy}");

        redis.kill();
        open_breaker(&mut client, sluice.http, "ready", ("user", "trip")).await;
        let (statuses, body) = probe(&sluice, 4, Duration::from_secs(1));
        assert_eq!(statuses, [500; 4], "{policy}: readiness with redis down");
        assert_eq!(body, "NOT SERVING", "{policy}");
        assert_eq!(
            grpc_health(sluice.grpc, "ratelimit").await,
            ServingStatus::NotServing,
            "{policy}"
        );
        assert_eq!(sluice.metric("sluice_serving_degraded"), 0.0, "{policy}");
        let answer = client
            .should_rate_limit(request("ready", vec![descriptor(&[("user", "u1")])]))
            .await;
        match policy {
            "fail_closed" => assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable),
            _ => assert_eq!(answer.unwrap().into_inner().overall_code, Code::Ok as i32),
        }
        assert!(logged(&sluice, "staying ready").is_empty(), "{policy}");
    }
}
