//! Logs and traces: the `tracing` subscriber, and the OpenTelemetry pipeline that exports the
//! request spans over OTLP/gRPC when tracing is configured.
//!
//! The request path's spans (`ShouldRateLimit` → `should_rate_limit` → `store`) are at DEBUG
//! level. Logs (`LOG_LEVEL`, INFO by default) do not enable them, so with tracing off they cost
//! nothing: a disabled span is a cached no-op. With tracing on, only the OpenTelemetry layer
//! enables them, and sampling (`TRACING_SAMPLING_RATE`, honouring the caller's decision) decides
//! what is exported.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
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
        fmt::layer().json().with_filter(filter).boxed()
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
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(trace.endpoint.clone())
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            trace.sampling_rate,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(trace.service_name.clone())
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

/// OTLP trace export (`OTEL_EXPORTER_OTLP_ENDPOINT`, or upstream's `TRACING_*` variables).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// OTLP/gRPC endpoint, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    pub service_name: String,
    /// Share of new traces exported (0 to 1); a caller's sampling decision is kept.
    pub sampling_rate: f64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing` filter: a level (`warn`, `INFO`, …) or directives.
    pub level: String,
    pub json: bool,
}
