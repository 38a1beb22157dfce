//! Traces: an in-process OTLP collector (gRPC, and HTTP: upstream's default protocol) receives
//! the request spans, children of the caller's `traceparent`, under upstream's resource
//! attributes.

use sluice_test_kit as kit;

use kit::otlp::{Collector, hex};
use kit::*;

#[tokio::test(flavor = "multi_thread")]
async fn request_spans_reach_a_grpc_collector_under_the_callers_trace() {
    let (collector, endpoint) = Collector::start().await;
    let env = [
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "sluice-test"),
    ];
    spans_arrive_under_the_callers_trace(&collector, &env).await;
    assert_eq!(
        collector.resource_attribute("service.name").as_deref(),
        Some("sluice-test"),
        "OTEL_SERVICE_NAME names the service when TRACING_SERVICE_NAME is unset"
    );
}

/// Upstream's environment for traces: `TRACING_ENABLED=true` with no protocol is OTLP/HTTP,
/// posted to `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`, with upstream's resource attributes.
#[tokio::test(flavor = "multi_thread")]
async fn upstreams_tracing_environment_posts_spans_over_http() {
    let (collector, endpoint) = Collector::start_http().await;
    let env = [
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("TRACING_SERVICE_NAMESPACE", "payments"),
        ("TRACING_SERVICE_INSTANCE_ID", "replica-7"),
    ];
    spans_arrive_under_the_callers_trace(&collector, &env).await;
    let posts = collector.posts();
    assert!(
        posts
            .iter()
            .all(|p| p == "/v1/traces application/x-protobuf"),
        "{posts:?}"
    );
    for (key, want) in [
        ("service.name", "RateLimit"),
        ("service.namespace", "payments"),
        ("service.instance.id", "replica-7"),
    ] {
        assert_eq!(
            collector.resource_attribute(key).as_deref(),
            Some(want),
            "{key}"
        );
    }
}

/// Starts Sluice with `env`, sends one request under a known `traceparent`, and waits until the
/// collector holds its spans: `ShouldRateLimit`, child of the caller's span, with
/// `should_rate_limit` under it and a `store` span.
async fn spans_arrive_under_the_callers_trace(collector: &Collector, env: &[(&str, &str)]) {
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    );
    let mut env = env.to_vec();
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100"));
    let sluice = Sluice::start(dir.path(), None, &env);
    let mut c = sluice.client().await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut req = tonic::Request::new(alice());
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    c.should_rate_limit(req).await.unwrap();

    let root = collector.span(trace_id, "ShouldRateLimit").await;
    assert_eq!(
        hex(&root.parent_span_id),
        parent_id,
        "the caller's span is the parent"
    );
    let decision = collector.span(trace_id, "should_rate_limit").await;
    assert_eq!(
        decision.parent_span_id, root.span_id,
        "decision under the request"
    );
    collector.span(trace_id, "store").await;
}
