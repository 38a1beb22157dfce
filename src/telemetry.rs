//! Logs and traces: the `tracing` subscriber (text, or JSON with upstream's field names), and the
//! OpenTelemetry pipeline that exports the request spans over OTLP (HTTP, upstream's default, or
//! gRPC) when tracing is configured.
//!
//! The request path's spans (`ShouldRateLimit` → `should_rate_limit` → `store`) are at DEBUG
//! level. Logs (`LOG_LEVEL`, INFO by default) do not enable them, so with tracing off they cost
//! nothing: a disabled span is a cached no-op. With tracing on, only the OpenTelemetry layer
//! enables them, and sampling (`TRACING_SAMPLING_RATE`, honouring the caller's decision) decides
//! what is exported.

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("LOG_LEVEL={0:?} is not a valid level or filter")]
    LogLevel(String),
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(String),
}

/// Keeps the trace pipeline alive; dropping it flushes the spans not yet exported.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber. Must run inside a Tokio runtime when tracing is on (the
/// exporter's gRPC channel lives on it).
pub fn init(log: &LogSettings, trace: Option<&TraceSettings>) -> Result<Telemetry, TelemetryError> {
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_new(&log.level).map_err(|_| TelemetryError::LogLevel(log.level.clone()))?;
    let logs = if log.json {
        fmt::layer()
            .event_format(json_log::UpstreamJson)
            .with_filter(filter)
            .boxed()
    } else {
        fmt::layer()
            .with_ansi(std::io::stdout().is_terminal())
            .with_filter(filter)
            .boxed()
    };

    let Some(trace) = trace else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = match trace.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(trace.endpoint.clone())
            .build(),
        OtlpProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(OnRuntime::new())
            .with_endpoint(trace.endpoint.clone())
            .build(),
    }
    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    // Upstream's resource: name, namespace (empty when unset) and an instance id, a random UUID
    // when none is given, so each replica's spans tell apart.
    let instance_id = trace
        .service_instance_id
        .clone()
        .unwrap_or_else(random_uuid);
    tracing::info!(
        protocol = trace.protocol.name(),
        endpoint = %trace.endpoint,
        service_name = %trace.service_name,
        service_namespace = %trace.service_namespace,
        service_instance_id = %instance_id,
        "exporting request spans over OTLP"
    );
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            trace.sampling_rate,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(trace.service_name.clone())
                .with_attribute(KeyValue::new(
                    "service.namespace",
                    trace.service_namespace.clone(),
                ))
                .with_attribute(KeyValue::new("service.instance.id", instance_id))
                .build(),
        )
        .build();
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("sluice"))
        .with_filter(Targets::new().with_target("sluice", Level::DEBUG));
    tracing_subscriber::registry().with(logs).with(spans).init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// How spans travel to the collector (`TRACING_EXPORTER_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies, usually port 4318; upstream's default.
    Http,
    /// OTLP/gRPC, usually port 4317.
    Grpc,
}

impl OtlpProtocol {
    pub fn name(self) -> &'static str {
        match self {
            OtlpProtocol::Http => "http",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

/// OTLP trace export (upstream's `TRACING_*` variables and the standard `OTEL_EXPORTER_OTLP_*`
/// endpoints).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    pub protocol: OtlpProtocol,
    /// For HTTP the whole URL spans are posted to (`…/v1/traces`); for gRPC the collector's
    /// address, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    pub service_name: String,
    /// `service.namespace` (upstream sends it even when empty).
    pub service_namespace: String,
    /// `service.instance.id`; a random UUID per process when `None`, as upstream.
    pub service_instance_id: Option<String>,
    /// Share of new traces exported (0 to 1); a caller's sampling decision is kept.
    pub sampling_rate: f64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing` filter: a level (`warn`, `INFO`, …) or directives.
    pub level: String,
    pub json: bool,
}

/// A random (version 4) UUID in its usual text form: upstream's default `service.instance.id`.
fn random_uuid() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The OTLP/HTTP client. The SDK's batch processor exports from a thread of its own, outside
/// the Tokio runtime, where hyper's client cannot open connections; each request is therefore
/// run on the runtime `init` was called in and only awaited from the exporter's thread.
#[derive(Debug)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
}

impl OnRuntime {
    /// Must be called inside the runtime (as `init` is).
    fn new() -> Self {
        OnRuntime {
            // The exporter's own timeout (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s) bounds each export;
            // this one only has to be no shorter.
            client: opentelemetry_http::hyper::HyperClient::with_default_connector(
                std::time::Duration::from_secs(30),
                None,
            ),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

#[tonic::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<opentelemetry_http::Response<opentelemetry_http::Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| -> HttpError { Box::new(e) })?
    }
}

/// `LOG_FORMAT=json` as upstream writes it (logrus' JSON formatter, as upstream configures it):
/// one object per line with `@timestamp` (RFC 3339), `level` (`debug`, `info`, `warning`,
/// `error`), `@message`, and each of the event's fields as a key of its own, so log pipelines
/// built for upstream's lines keep parsing Sluice's.
mod json_log {
    use std::fmt;

    use serde_json::{Map, Value};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
    use tracing_subscriber::registry::LookupSpan;

    pub(super) struct UpstreamJson;

    /// Collects an event's fields; `message` becomes `@message`.
    struct Fields(Map<String, Value>);

    impl Fields {
        fn put(&mut self, field: &Field, value: Value) {
            let name = match field.name() {
                "message" => "@message",
                name => name,
            };
            self.0.insert(name.to_owned(), value);
        }
    }

    impl Visit for Fields {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.put(field, Value::from(value));
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.put(field, Value::from(value));
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.put(field, Value::from(value));
        }
        fn record_bool(&mut self, field: &Field, value: bool) {
            self.put(field, Value::from(value));
        }
        fn record_f64(&mut self, field: &Field, value: f64) {
            self.put(field, Value::from(value));
        }
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.put(field, Value::from(format!("{value:?}")));
        }
    }

    /// logrus' level names.
    fn level_name(level: &Level) -> &'static str {
        match *level {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        }
    }

    impl<S, N> FormatEvent<S, N> for UpstreamJson
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            _ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> fmt::Result {
            let mut fields = Fields(Map::new());
            event.record(&mut fields);
            let mut line = fields.0;
            let mut timestamp = String::new();
            SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
            line.insert("@timestamp".into(), Value::from(timestamp));
            let metadata = event.metadata();
            line.insert("level".into(), Value::from(level_name(metadata.level())));
            line.insert("target".into(), Value::from(metadata.target()));
            let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
            writeln!(writer, "{text}")
        }
    }
}
