//! Logging and tracing settings (`crate::telemetry`): `LOG_LEVEL` and `LOG_FORMAT`, and whether and
//! where request spans are exported over OTLP (upstream's `TRACING_*` and OpenTelemetry's
//! `OTEL_*` variables).

use crate::telemetry::{LogSettings, OtlpProtocol, TraceSettings};

use super::{Env, SettingsError};

/// `LOG_LEVEL` and `LOG_FORMAT` (text or JSON).
pub(super) fn log_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<LogSettings, SettingsError> {
    let log_format = env.string("LOG_FORMAT", "text").to_ascii_lowercase();
    if log_format != "text" && log_format != "json" {
        return Err(env.error("LOG_FORMAT", "expected text or json"));
    }
    Ok(LogSettings {
        // Upstream defaults to WARN; we log start-up and config events at INFO.
        level: env.string("LOG_LEVEL", "info").to_ascii_lowercase(),
        json: log_format == "json",
    })
}

/// Tracing is on when upstream's `TRACING_ENABLED=true`, or when an OTLP endpoint is set
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). The endpoint follows the
/// OpenTelemetry rules upstream's exporters follow: the traces endpoint as given, else the
/// general one (with `/v1/traces` added for HTTP), else the collector's standard local port.
pub(super) fn trace_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<TraceSettings>, SettingsError> {
    let traces_endpoint = env.raw("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let endpoint = env.raw("OTEL_EXPORTER_OTLP_ENDPOINT");
    if traces_endpoint.is_none() && endpoint.is_none() && !env.bool("TRACING_ENABLED", false)? {
        return Ok(None);
    }
    let protocol = match env.raw("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("") | Some("http") => OtlpProtocol::Http,
        Some("grpc") => OtlpProtocol::Grpc,
        Some(_) => return Err(env.error("TRACING_EXPORTER_PROTOCOL", "expected http or grpc")),
    };
    let endpoint = match (protocol, traces_endpoint, endpoint) {
        (_, Some(traces), _) => traces,
        (OtlpProtocol::Http, None, Some(base)) => {
            format!("{}/v1/traces", base.trim_end_matches('/'))
        }
        (OtlpProtocol::Grpc, None, Some(base)) => base,
        (OtlpProtocol::Http, None, None) => "http://localhost:4318/v1/traces".into(),
        (OtlpProtocol::Grpc, None, None) => "http://localhost:4317".into(),
    };
    if protocol == OtlpProtocol::Http && !endpoint.starts_with("http://") {
        let variable = if env.raw("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        } else {
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        };
        return Err(env.error(
            variable,
            "OTLP over HTTP needs an http:// URL (no TLS); for a TLS collector set \
             TRACING_EXPORTER_PROTOCOL=grpc",
        ));
    }
    let sampling_rate = match env.raw("TRACING_SAMPLING_RATE").map(|v| v.parse::<f64>()) {
        None => 1.0,
        Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
        Some(_) => return Err(env.error("TRACING_SAMPLING_RATE", "expected a number from 0 to 1")),
    };
    Ok(Some(TraceSettings {
        protocol,
        endpoint,
        // Upstream's variable first, then OpenTelemetry's, then upstream's default.
        service_name: env
            .raw("TRACING_SERVICE_NAME")
            .or_else(|| env.raw("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "RateLimit".into()),
        service_namespace: env.raw("TRACING_SERVICE_NAMESPACE").unwrap_or_default(),
        service_instance_id: env.raw("TRACING_SERVICE_INSTANCE_ID"),
        sampling_rate,
    }))
}

#[cfg(test)]
mod tests {
    use crate::settings::tests::settings;
    use crate::telemetry::OtlpProtocol;

    #[test]
    fn traces_follow_upstreams_protocol_and_the_otlp_endpoint_rules() {
        assert!(settings(&[]).unwrap().trace.is_none(), "off by default");
        let trace = |vars: &[(&str, &str)]| settings(vars).unwrap().trace.unwrap();
        // Upstream's default: OTLP/HTTP to the local collector, service RateLimit.
        let t = trace(&[("TRACING_ENABLED", "true")]);
        assert_eq!(t.protocol, OtlpProtocol::Http);
        assert_eq!(t.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(t.service_name, "RateLimit");
        assert_eq!(
            (t.service_namespace.as_str(), t.service_instance_id),
            ("", None)
        );
        // The general endpoint gets the signal's path; the traces endpoint is used as given.
        let t = trace(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"),
        ]);
        assert_eq!(t.endpoint, "http://c:4318/v1/traces");
        let t = trace(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/spans"),
        ]);
        assert_eq!(t.endpoint, "http://t:9/spans");
        let t = trace(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ]);
        assert_eq!(
            (t.protocol, t.endpoint.as_str()),
            (OtlpProtocol::Grpc, "http://localhost:4317")
        );
        let t = trace(&[
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"),
            ("TRACING_SERVICE_NAME", "rl"),
            ("OTEL_SERVICE_NAME", "ignored"),
            ("TRACING_SERVICE_NAMESPACE", "ns"),
            ("TRACING_SERVICE_INSTANCE_ID", "i-1"),
        ]);
        assert_eq!(t.endpoint, "https://c:4317", "TLS is the gRPC exporter's");
        assert_eq!(t.service_name, "rl", "upstream's variable first");
        assert_eq!(
            (
                t.service_namespace.as_str(),
                t.service_instance_id.as_deref()
            ),
            ("ns", Some("i-1"))
        );
        // Refused, naming the variable: an unknown protocol, and TLS over OTLP/HTTP.
        let refused = |vars: &[(&str, &str)]| settings(vars).unwrap_err().variable;
        assert_eq!(
            refused(&[
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "udp")
            ]),
            "TRACING_EXPORTER_PROTOCOL"
        );
        assert_eq!(
            refused(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]),
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        );
    }
}
