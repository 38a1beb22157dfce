//! What readiness probes and load balancers see of a Sluice, reached by address (a process of
//! the harness or a pod played from the chart): `/healthcheck`, the gRPC health service, one
//! series of `/metrics`, and a Redis circuit breaker opened by calls, as traffic opens it.
//! Used by the tests of issue #42's "readiness follows the ability to answer"
//! (`tests/it/degraded_health.rs`, `tests/it/chart_degraded.rs`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice::proto::RateLimitServiceClient;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::{descriptor, http_request, request};

/// The value of one series of `/metrics` at `http` (`name` or `name{label="value"}`); 0 when
/// the series does not exist yet.
pub fn metric_at(http: SocketAddr, series: &str) -> f64 {
    let (_, text) = http_request(http, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
        .unwrap_or(0.0)
}

/// What the gRPC health service at `grpc` says of `service` (`ratelimit`, or "" for the whole
/// server), as Envoy's and Kubernetes' gRPC health checks ask it.
pub async fn grpc_health(grpc: SocketAddr, service: &str) -> ServingStatus {
    let channel = Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    ServingStatus::try_from(answer.status).unwrap()
}

/// Sends calls for `descriptor key=value` in `domain` (answered or not) until the breaker of
/// the `redis` store is open, as traffic opens it once Redis is gone; panics after 60 s (the
/// breaker opens after 5 failures, well under a second on a quiet machine).
pub async fn open_breaker(
    client: &mut RateLimitServiceClient<Channel>,
    http: SocketAddr,
    domain: &str,
    entry: (&str, &str),
) {
    let started = Instant::now();
    while metric_at(http, "sluice_circuit_breaker_open{store=\"redis\"}") != 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the redis circuit breaker never opened"
        );
        let _ = client
            .should_rate_limit(request(domain, vec![descriptor(&[entry])]))
            .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether an answer says it was decided locally (`x-sluice-degraded: true`).
pub fn marked_degraded(answer: &sluice::proto::RateLimitResponse) -> bool {
    answer
        .response_headers_to_add
        .iter()
        .any(|h| h.key == "x-sluice-degraded" && h.value == "true")
}
