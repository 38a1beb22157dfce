//! Traces: an in-process OTLP collector (gRPC, and HTTP: upstream's default protocol) receives
//! the request spans, children of the caller's `traceparent`, under upstream's resource
//! attributes.

use sluice_test_kit as kit;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kit::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// A resource's string attributes.
type Attributes = Vec<(String, String)>;

/// What a collector received: the spans, and each export's resource attributes.
#[derive(Default, Clone)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<Attributes>>>,
}

impl Collector {
    fn keep(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.resource_spans {
            let attributes = resource
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|kv| match kv.value?.value? {
                    Value::StringValue(s) => Some((kv.key, s)),
                    _ => None,
                })
                .collect();
            self.resources.lock().unwrap().push(attributes);
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }

    fn resource_attribute(&self, key: &str) -> Option<String> {
        let resources = self.resources.lock().unwrap();
        let first = resources.first()?;
        first.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn request_spans_reach_a_grpc_collector_under_the_callers_trace() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = collector.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(server))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let endpoint = format!("http://{addr}");
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
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let paths = Arc::new(Mutex::new(Vec::<String>::new()));
    let (server, seen) = (collector.clone(), paths.clone());
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let (server, seen) = (server.clone(), seen.clone());
            async move {
                let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
                seen.lock().unwrap().push(format!(
                    "{} {}",
                    uri.path(),
                    content_type.unwrap_or("-")
                ));
                server.keep(ExportTraceServiceRequest::decode(body).unwrap());
                let mut reply = Vec::new();
                ExportTraceServiceResponse {
                    partial_success: None,
                }
                .encode(&mut reply)
                .unwrap();
                ([("content-type", "application/x-protobuf")], reply)
            }
        },
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let endpoint = format!("http://{addr}");
    let env = [
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("TRACING_SERVICE_NAMESPACE", "payments"),
        ("TRACING_SERVICE_INSTANCE_ID", "replica-7"),
    ];
    spans_arrive_under_the_callers_trace(&collector, &env).await;
    assert!(
        paths
            .lock()
            .unwrap()
            .iter()
            .all(|p| p == "/v1/traces application/x-protobuf"),
        "{:?}",
        paths.lock().unwrap()
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
    let mut req = tonic::Request::new(request("app", vec![descriptor(&[("user", "alice")])]));
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    c.should_rate_limit(req).await.unwrap();

    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        {
            let spans = collector.spans.lock().unwrap();
            let ours: Vec<&Span> = spans
                .iter()
                .filter(|s| hex(&s.trace_id) == trace_id)
                .collect();
            if let Some(root) = ours.iter().find(|s| s.name == "ShouldRateLimit") {
                assert_eq!(
                    hex(&root.parent_span_id),
                    parent_id,
                    "the caller's span is the parent"
                );
                let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
                if names.contains(&"should_rate_limit") && names.contains(&"store") {
                    let decision = ours.iter().find(|s| s.name == "should_rate_limit").unwrap();
                    assert_eq!(
                        decision.parent_span_id, root.span_id,
                        "decision under the request"
                    );
                    return;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "spans never arrived: {:?}",
            collector
                .spans
                .lock()
                .unwrap()
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
