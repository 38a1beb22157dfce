//! An OTLP/gRPC trace collector in the test process: Sluice exports its request spans to it,
//! and a test reads them back (trace and span ids, parents, names).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;

/// The spans a collector received.
#[derive(Default, Clone)]
pub struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    /// Serves a collector on a free loopback port; its endpoint for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (with `TRACING_EXPORTER_PROTOCOL=grpc`).
    pub async fn start() -> (Collector, String) {
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
        (collector, format!("http://{addr}"))
    }

    /// Waits (15 s at most) for a span named `name` in trace `trace_id` (hex) and returns it.
    pub async fn span(&self, trace_id: &str, name: &str) -> Span {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(span) = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .find(|s| hex(&s.trace_id) == trace_id && s.name == name)
            {
                return span.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no span {name} in trace {trace_id}; received: {:?}",
                self.spans
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|s| format!("{} {}", hex(&s.trace_id), s.name))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Lowercase hex of an id.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
