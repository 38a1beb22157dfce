//! What the client and the layer do when Sluice cannot answer (killed, or holding calls without
//! answering), that deadlines bound every call, and the native API's typed answers.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::services::{grpc_check, http_get, serve_grpc, serve_grpc_recording, serve_http};
use common::Sluice;
use sluice_client::limiter::{Algorithm, SetMode};
use sluice_client::{
    AnsweredBy, Client, Descriptor, ErrorKind, FailurePolicy, GrpcCode, LimiterConfig,
    LimiterError, RateLimitRequest, SluiceLayer, key,
};
use tonic::Code;

/// A bound on calls that should end at a short deadline: over 10x what a quiet machine takes.
const SLACK: Duration = Duration::from_secs(5);

fn one_user(user: &str) -> RateLimitRequest {
    RateLimitRequest::new("client_test").descriptor(Descriptor::new().entry("user", user))
}

fn layer(client: Client) -> SluiceLayer {
    SluiceLayer::builder(client, "client_test")
        .key("user", key::header("x-user"))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sluice_down_fail_open_admits_and_fail_closed_refuses() {
    let mut sluice = Sluice::start(None, &[]);
    let open = sluice.client(FailurePolicy::Open).await;
    let closed = sluice.client(FailurePolicy::Closed).await;
    let (http_open, http_closed) = (
        serve_http(layer(open.clone())).await,
        serve_http(layer(closed.clone())).await,
    );
    let grpc_closed = serve_grpc(layer(closed.clone())).await;
    let grpc_open = serve_grpc(layer(open.clone())).await;
    // A layer's own policy wins over its client's, either way.
    let closed_over_open = SluiceLayer::builder(open.clone(), "client_test")
        .key("user", key::header("x-user"))
        .failure_policy(FailurePolicy::Closed)
        .build();
    let open_over_closed = SluiceLayer::builder(closed.clone(), "client_test")
        .key("user", key::header("x-user"))
        .failure_policy(FailurePolicy::Open)
        .build();
    let (http_closed_over_open, http_open_over_closed) = (
        serve_http(closed_over_open).await,
        serve_http(open_over_closed).await,
    );
    // While Sluice is up, both ask it.
    assert_eq!(
        open.should_rate_limit(one_user("u1"))
            .await
            .unwrap()
            .answered_by,
        AnsweredBy::Sluice
    );
    assert_eq!(http_get(http_closed, &[("x-user", "u2")]).await.status, 200);

    sluice.kill();

    let decision = open.should_rate_limit(one_user("u3")).await.unwrap();
    assert!(decision.allowed);
    assert!(
        matches!(decision.answered_by, AnsweredBy::FailurePolicy(_)),
        "{decision:?}"
    );
    let error = closed.should_rate_limit(one_user("u3")).await.unwrap_err();
    assert!(error.is_unanswered(), "{error:?}");
    // In the crate's own terms: Sluice unreachable, whichever way the transport said it.
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");

    assert_eq!(http_get(http_open, &[("x-user", "u4")]).await.status, 200);
    assert_eq!(http_get(http_closed, &[("x-user", "u4")]).await.status, 503);
    let status = |addr| async move { http_get(addr, &[("x-user", "u4")]).await.status };
    assert_eq!(status(http_closed_over_open).await, 503);
    assert_eq!(status(http_open_over_closed).await, 200);
    grpc_check(grpc_open, Some("u5")).await.unwrap();
    let refused = grpc_check(grpc_closed, Some("u5")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");

    // The native API's decisions follow the same policy; its other calls always fail.
    let acquired = open
        .try_acquire("any", "", 1, Duration::ZERO)
        .await
        .unwrap();
    assert!(acquired.acquired);
    assert!(matches!(acquired.answered_by, AnsweredBy::FailurePolicy(_)));
    match closed.try_acquire("any", "", 1, Duration::ZERO).await {
        Err(LimiterError::Call(error)) => assert!(error.is_unanswered(), "{error:?}"),
        other => panic!("fail-closed acquisition: {other:?}"),
    }
    assert!(open.available_permits("any", "").await.is_err());
}

/// Accepts connections and never answers on them, as a hung Sluice would.
async fn silent_listener() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sluice_never_answers_ends_at_its_deadline() {
    let silent = silent_listener().await;
    let deadline = Duration::from_millis(200);
    let client = |policy| {
        Client::builder()
            .deadline(deadline)
            .failure_policy(policy)
            .connect_lazy(format!("http://{silent}"))
            .unwrap()
    };

    let started = Instant::now();
    let error = client(FailurePolicy::Closed)
        .should_rate_limit(one_user("x"))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(error.kind(), ErrorKind::Deadline, "{error:?}");
    assert_eq!(error.deadline(), Some(deadline), "{error:?}");
    assert!(took >= deadline && took < SLACK, "{took:?}");

    let started = Instant::now();
    let decision = client(FailurePolicy::Open)
        .should_rate_limit(one_user("x"))
        .await
        .unwrap();
    assert!(decision.allowed && decision.answered_by != AnsweredBy::Sluice);
    assert!(started.elapsed() < SLACK);

    // The layer answers by the same deadline.
    let http = serve_http(layer(client(FailurePolicy::Closed))).await;
    let started = Instant::now();
    assert_eq!(http_get(http, &[("x-user", "y")]).await.status, 503);
    assert!(started.elapsed() < SLACK);
}

/// A `grpc-timeout` value (digits and a unit) as a duration.
fn grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => panic!("not a grpc-timeout: {value}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_travels_as_grpc_timeout() {
    let (addr, received) = serve_grpc_recording(None).await;
    let client = Client::builder()
        .deadline(Duration::from_millis(250))
        .connect(format!("http://{addr}"))
        .await
        .unwrap();
    // UNIMPLEMENTED is about the request: an error even under the default fail-open policy.
    let error = client.should_rate_limit(one_user("z")).await.unwrap_err();
    assert!(!error.is_unanswered(), "{error:?}");
    assert_eq!(error.kind(), ErrorKind::Protocol, "{error:?}");
    assert_eq!(error.code(), Some(GrpcCode::Unimplemented), "{error:?}");
    // `acquire` sends its own deadline; `try_acquire` its wait plus the client's deadline.
    let _ = client.acquire("l", "", 1, Duration::from_secs(7)).await;
    let _ = client.try_acquire("l", "", 1, Duration::from_secs(2)).await;
    let seen: Vec<Duration> = received
        .lock()
        .unwrap()
        .iter()
        .map(|headers| grpc_timeout(headers["grpc-timeout"].to_str().unwrap()))
        .collect();
    let expected = [250, 7_000, 2_250].map(Duration::from_millis);
    assert_eq!(seen, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_on_the_server_until_its_deadline() {
    let sluice = Sluice::start(None, &[("LIMITER_MAX_WAIT", "3s")]);
    // Fail-open: a deadline passing while Sluice waits must still not grant permits.
    let client = sluice.client(FailurePolicy::Open).await;
    let bucket = |name: &str, interval_ms| {
        LimiterConfig::new(
            name,
            Algorithm::TokenBucket,
            1,
            Duration::from_millis(interval_ms),
        )
        .burst(1)
    };
    for name in ["refills_soon", "refills_late"] {
        let interval = if name == "refills_soon" { 500 } else { 2_500 };
        client
            .set_rate(bucket(name, interval), SetMode::UpdateResetState)
            .await
            .unwrap();
        assert!(
            client
                .try_acquire(name, "", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
    }

    // Within the deadline: Sluice waits for the refill and grants it.
    let acquired = client
        .acquire("refills_soon", "", 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        acquired.acquired && acquired.answered_by == AnsweredBy::Sluice,
        "{acquired:?}"
    );
    assert!(acquired.waited > Duration::ZERO, "{acquired:?}");

    // The deadline passes before the refill: an error, not permits, and soon after it.
    let deadline = Duration::from_millis(300);
    let started = Instant::now();
    let result = client.acquire("refills_late", "", 1, deadline).await;
    let took = started.elapsed();
    assert!(
        matches!(&result, Err(LimiterError::Call(e))
            if e.kind() == ErrorKind::Deadline && e.deadline() == Some(deadline)),
        "acquire past its deadline: {result:?}"
    );
    assert!(took >= deadline && took < SLACK, "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_api_answers_with_typed_errors() {
    let sluice = Sluice::start(None, &[("LIMITER_MAX_WAIT", "1s")]);
    let client = sluice.client(FailurePolicy::Open).await;
    let daily = LimiterConfig::new(
        "daily",
        Algorithm::FixedWindow,
        1,
        Duration::from_secs(86_400),
    );
    let set = client
        .set_rate(daily.clone(), SetMode::TrySet)
        .await
        .unwrap();
    assert!(set.applied && set.state_reset);
    assert_eq!(set.config.unwrap().rate, 1);
    // TRY_SET leaves an existing limiter alone.
    assert!(
        !client
            .set_rate(daily, SetMode::TrySet)
            .await
            .unwrap()
            .applied
    );

    assert_eq!(client.available_permits("daily", "").await.unwrap(), 1);
    assert!(
        client
            .try_acquire("daily", "", 1, Duration::ZERO)
            .await
            .unwrap()
            .acquired
    );
    let refused = client
        .try_acquire("daily", "", 1, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        !refused.acquired && refused.retry_after > Duration::ZERO,
        "{refused:?}"
    );
    assert_eq!(client.available_permits("daily", "").await.unwrap(), 0);

    // The next window is up to a day away, past LIMITER_MAX_WAIT.
    let waited = client
        .acquire("daily", "", 1, Duration::from_secs(30))
        .await;
    assert!(
        matches!(waited, Err(LimiterError::WaitTooLong(_))),
        "{waited:?}"
    );
    let missing = client
        .try_acquire("no_such_limiter", "", 1, Duration::ZERO)
        .await;
    assert!(
        matches!(missing, Err(LimiterError::NotFound(_))),
        "{missing:?}"
    );
    let too_many = client.try_acquire("daily", "", 5, Duration::ZERO).await;
    assert!(
        matches!(too_many, Err(LimiterError::Invalid(_))),
        "{too_many:?}"
    );
    let zero_rate = LimiterConfig::new("bad", Algorithm::TokenBucket, 0, Duration::from_secs(1));
    let bad = client.set_rate(zero_rate, SetMode::TrySet).await;
    assert!(matches!(bad, Err(LimiterError::Invalid(_))), "{bad:?}");
    assert!(client.delete("daily").await.unwrap());

    // A request the client can tell is wrong is never sent.
    let empty = client
        .should_rate_limit(RateLimitRequest::new("client_test"))
        .await;
    assert!(
        matches!(&empty, Err(e) if e.kind() == ErrorKind::InvalidRequest && e.code().is_none()),
        "{empty:?}"
    );
}
