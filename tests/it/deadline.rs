//! The caller's deadline rules the store's (issue #28): a real `sluice` process on a real
//! `redis-server` behind our fault proxy (`crates/sluice-test-kit/src/proxy.rs`), which delays every reply.
//!
//! - A caller that grants more time than `REDIS_TIMEOUT` gets its answer from a Redis slower
//!   than `REDIS_TIMEOUT` (before the change: `UNAVAILABLE` after `REDIS_TIMEOUT`). This also
//!   fails if `server/serving.rs` stops running the handler inside `store::deadline::scope`, or
//!   if the store's call leaves the handler's task: the store would not see the deadline.
//! - A caller that grants less than `REDIS_TIMEOUT` gets an answer before its own deadline, not
//!   `CANCELLED` from its client or the server's enforcement: the store gives up first, with the
//!   margin. While Redis answers (late), that answer is `DEADLINE_EXCEEDED`: the caller's
//!   deadline was too short for the store, which is no store failure (issue #40).
//! - A Redis that answers nothing at all while every caller grants less than `REDIS_TIMEOUT`
//!   (Envoy's 20 ms) still opens the circuit breaker: after a second of replies owed and none
//!   read, the callers' timeouts count as outages.
//! - A caller without a deadline is bounded by `REDIS_TIMEOUT`, as before.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::proxy::{FaultProxy, Faults, Leg};
use kit::*;
use sluice::proto::Code;
use tokio::time::Instant;

const CONFIG: &str = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";

/// Sluice on Redis behind a proxy; `redis_timeout` is its `REDIS_TIMEOUT`.
async fn sluice_behind_proxy(
    redis_timeout: &str,
) -> (Sluice, FaultProxy, RedisServer, tempfile::TempDir) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(([127, 0, 0, 1], redis.port).into()).await;
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &proxy.url()),
            ("REDIS_TIMEOUT", redis_timeout),
        ],
    );
    (sluice, proxy, redis, dir)
}

fn replies_late_by(latency: Duration) -> Faults {
    Faults {
        down: Leg {
            latency,
            ..Leg::default()
        },
        ..Faults::default()
    }
}

fn tenant(name: &str) -> sluice::proto::RateLimitRequest {
    request("d", vec![descriptor(&[("tenant", name)])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_waits_longer_than_redis_timeout_gets_its_decision() {
    // Replies 300 ms late: six times REDIS_TIMEOUT, a sixth of the caller's deadline.
    let (sluice, proxy, _redis, _dir) = sluice_behind_proxy("50ms").await;
    let mut client = sluice.client().await;
    // Warm: the connection is open and the script loaded before replies slow down.
    assert_eq!(
        ask(&mut client, tenant("warm")).await.overall_code,
        Code::Ok as i32
    );
    proxy.set(replies_late_by(Duration::from_millis(300)));

    let mut call = tonic::Request::new(tenant("slow"));
    call.set_timeout(Duration::from_secs(3));
    let answer = client
        .should_rate_limit(call)
        .await
        .expect("the store had the caller's 3 s, not REDIS_TIMEOUT's 50 ms");
    assert_eq!(answer.get_ref().overall_code, Code::Ok as i32);

    // Without a caller deadline, REDIS_TIMEOUT still bounds the call.
    let status = client
        .should_rate_limit(tonic::Request::new(tenant("no-deadline")))
        .await
        .expect_err("REDIS_TIMEOUT (50 ms) is shorter than the 300 ms reply");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    println!(
        "DEADLINE: 300 ms late replies, REDIS_TIMEOUT=50ms: caller 3 s → OK, no deadline → UNAVAILABLE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_waits_less_than_redis_timeout_gets_an_answer_before_its_deadline() {
    let (sluice, proxy, _redis, _dir) = sluice_behind_proxy("10s").await;
    let mut client = sluice.client().await;
    assert_eq!(
        ask(&mut client, tenant("warm")).await.overall_code,
        Code::Ok as i32
    );
    // Replies 5 s late: past the caller's deadline, well inside REDIS_TIMEOUT.
    proxy.set(replies_late_by(Duration::from_secs(5)));

    let deadline = Duration::from_secs(1);
    let mut call = tonic::Request::new(tenant("late"));
    call.set_timeout(deadline);
    let sent = Instant::now();
    // tonic's client gives up at the deadline itself (CANCELLED, "Timeout expired"), so a
    // DEADLINE_EXCEEDED here is the server's answer, arrived in time: Redis owed its reply for
    // less than a second, so it is slow, and the caller's deadline was the shorter.
    let status = client
        .should_rate_limit(call)
        .await
        .expect_err("Redis cannot answer within the caller's deadline");
    let took = sent.elapsed();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(took < deadline, "{took:?}");
    println!(
        "DEADLINE: 5 s late replies, REDIS_TIMEOUT=10s: caller 1 s → DEADLINE_EXCEEDED after {took:?}"
    );
}

/// Redis black-holed (the proxy holds every reply), `REDIS_TIMEOUT` at its default of 10 s,
/// every caller granting 100 ms (Envoy's default is 20 ms: the same rule, with room for a busy
/// machine's scheduler): the calls run out of the callers' time, never of the store's, yet the
/// breaker must learn of the outage (`store/redis/timeout.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_redis_opens_the_breaker_though_every_caller_grants_less_than_redis_timeout() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(([127, 0, 0, 1], redis.port).into()).await;
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &proxy.url()),
            ("REDIS_TIMEOUT", "10s"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ],
    );
    let mut client = kit::untimed::rls_client(sluice.grpc);
    let short = || kit::untimed::with_deadline(tenant("envoy"), Duration::from_millis(100));
    // The first call connects to Redis through the proxy: given time, since a busy machine may
    // take longer than a short deadline for it.
    let first = kit::untimed::with_deadline(tenant("envoy"), Duration::from_secs(10));
    assert_eq!(
        client
            .should_rate_limit(first)
            .await
            .unwrap()
            .get_ref()
            .overall_code,
        Code::Ok as i32
    );
    proxy.set(Faults {
        stall: true,
        ..Faults::default()
    });
    let silent = Instant::now();
    // `cut`: answered by the server's own enforcement of the deadline (`CANCELLED`), when a
    // busy machine ran the store's answer too late.
    let (mut deadline_exceeded, mut outages, mut cut) = (0, 0, 0);
    let opened = loop {
        assert!(
            silent.elapsed() < Duration::from_secs(30),
            "the breaker never opened: {deadline_exceeded} DEADLINE_EXCEEDED, {outages} \
             outages, {cut} cut"
        );
        let status = client
            .should_rate_limit(short())
            .await
            .expect_err("Redis answers nothing");
        match status.code() {
            tonic::Code::DeadlineExceeded => deadline_exceeded += 1,
            tonic::Code::Unavailable if status.message().contains("circuit breaker open") => {
                break silent.elapsed();
            }
            tonic::Code::Unavailable => outages += 1,
            tonic::Code::Cancelled => cut += 1,
            other => panic!("{other:?}: {status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(outages >= 1, "opened without an outage counted");
    let health = sluice.http("GET", "/healthcheck", "").0;
    assert_ne!(health, 200, "health follows the breaker");
    println!(
        "DEADLINE: Redis silent, callers 100 ms, REDIS_TIMEOUT=10s: breaker open after \
         {opened:?} ({deadline_exceeded} DEADLINE_EXCEEDED while Redis owed replies for under a \
         second, then {outages} outages; {cut} cut by the server at the deadline)"
    );
}

/// The native API's calls carry `grpc-timeout` too, and their store calls get it the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_api_follows_the_callers_deadline_too() {
    use sluice::proto::sluice::v1::limiter_client::LimiterClient;
    use sluice::proto::sluice::v1::{Algorithm, GetConfigRequest, LimiterConfig, SetRateRequest};

    let (sluice, proxy, _redis, _dir) = sluice_behind_proxy("50ms").await;
    let mut client = LimiterClient::connect(format!("http://{}", sluice.grpc))
        .await
        .unwrap();
    client
        .set_rate(SetRateRequest {
            config: Some(LimiterConfig {
                name: "api".into(),
                algorithm: Algorithm::TokenBucket as i32,
                rate: 10,
                interval: Some(Duration::from_secs(1).try_into().unwrap()),
                ..Default::default()
            }),
            set_mode: 0,
        })
        .await
        .expect("set while Redis answers at once");
    proxy.set(replies_late_by(Duration::from_millis(300)));

    let get = || GetConfigRequest { name: "api".into() };
    let mut call = tonic::Request::new(get());
    call.set_timeout(Duration::from_secs(3));
    let config = client
        .get_config(call)
        .await
        .expect("the store had the caller's 3 s")
        .into_inner();
    assert_eq!(config.rate, 10);
    let status = client
        .get_config(tonic::Request::new(get()))
        .await
        .expect_err("REDIS_TIMEOUT (50 ms) is shorter than the 300 ms reply");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}
