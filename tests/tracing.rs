//! Traces: an in-process OTLP collector receives the request spans, children of the caller's
//! `traceparent`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;

#[derive(Default, Clone)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn request_spans_reach_the_collector_under_the_callers_trace() {
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

    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    );
    let endpoint = format!("http://{addr}");
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
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
