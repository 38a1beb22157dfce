//! An OTLP trace collector in the test process, over gRPC or over HTTP (upstream's default
//! protocol): Sluice exports its request spans to it, and a test reads them back (trace and
//! span ids, parents, names), with the resource attributes they came under.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// What a collector received: the spans, each export's resource attributes, and over HTTP each
/// post's path and content type.
#[derive(Default, Clone)]
pub struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<Attributes>>>,
    posts: Arc<Mutex<Vec<String>>>,
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

    /// Serves a collector over OTLP/HTTP (protobuf) on a free loopback port, taking posts to
    /// any path (a test checks which with [`Collector::posts`]); its endpoint for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub async fn start_http() -> (Collector, String) {
        let collector = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = collector.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let server = server.clone();
                async move {
                    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
                    server.posts.lock().unwrap().push(format!(
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
        (collector, format!("http://{addr}"))
    }

    /// Each OTLP/HTTP post received: `<path> <content type>`.
    pub fn posts(&self) -> Vec<String> {
        self.posts.lock().unwrap().clone()
    }

    /// The string attribute `key` of the first export's resource.
    pub fn resource_attribute(&self, key: &str) -> Option<String> {
        let resources = self.resources.lock().unwrap();
        let first = resources.first()?;
        first.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

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
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}
