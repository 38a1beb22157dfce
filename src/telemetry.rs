//! Logs and traces: the `tracing` subscriber, and the OpenTelemetry pipeline that exports the
//! request spans over OTLP/gRPC when tracing is configured.
//!
//! The request path's spans (`ShouldRateLimit` → `should_rate_limit` → `store`) are at DEBUG
//! level. Logs (`LOG_LEVEL`, INFO by default) do not enable them, so with tracing off they cost
//! nothing: a disabled span is a cached no-op. With tracing on, only the OpenTelemetry layer
//! enables them, and sampling (`TRACING_SAMPLING_RATE`, honouring the caller's decision) decides
//! what is exported.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::settings::{LogSettings, TraceSettings};

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

/// Lets a warning that repeats per request through at most once a second, with the number held
/// back since, so a store outage at tens of thousands of requests a second does not write as
/// many log lines (and slow the service down with them).
#[derive(Debug, Default)]
pub struct LogThrottle {
    last_second: AtomicU64,
    held_back: AtomicU64,
}

impl LogThrottle {
    pub const fn new() -> Self {
        Self {
            last_second: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last logged one)` when this occurrence should be logged.
    pub fn allow(&self, now_secs: u64) -> Option<u64> {
        let last = self.last_second.load(Ordering::Relaxed);
        if now_secs > last
            && self
                .last_second
                .compare_exchange(last, now_secs, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.held_back.swap(0, Ordering::Relaxed))
        } else {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LogThrottle;

    #[test]
    fn lets_one_through_per_second_and_counts_the_rest() {
        let throttle = LogThrottle::new();
        assert_eq!(throttle.allow(100), Some(0));
        assert_eq!(throttle.allow(100), None);
        assert_eq!(throttle.allow(100), None);
        assert_eq!(throttle.allow(101), Some(2));
        assert_eq!(throttle.allow(101), None);
        assert_eq!(throttle.allow(105), Some(1));
    }
}
