//! The caller's trace context, which our request spans join: W3C `traceparent`/`tracestate`,
//! else Zipkin's B3 (the single `b3` header, else the `X-B3-*` headers), as upstream accepts
//! both since envoyproxy/ratelimit#1110. Meshes that trace with Zipkin (Envoy's Zipkin tracer,
//! older Istio) send only B3; without it their traces would lose our spans' parent.
//!
//! When a call carries both, W3C wins: it is the standard, and a proxy that sends both has
//! derived one from the other. Only extraction lives here: Sluice calls nothing downstream, so
//! it never injects either format.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The parent of a call's spans, from its gRPC metadata: the W3C context when valid, else the
/// B3 one, else none (an empty context: our spans start a trace of their own).
pub(super) fn parent(metadata: &tonic::metadata::MetadataMap) -> Context {
    let carrier = Metadata(metadata);
    let w3c = TraceContextPropagator::new().extract(&carrier);
    if w3c.span().span_context().is_valid() {
        return w3c;
    }
    match b3(&carrier) {
        Some(remote) => Context::new().with_remote_span_context(remote),
        None => w3c,
    }
}

/// The B3 context of `carrier`: the single header when it names a span, else the multi
/// headers (the single one takes precedence, as B3's specification says).
fn b3(carrier: &dyn Extractor) -> Option<SpanContext> {
    if let Some(single) = carrier.get("b3") {
        return b3_single(single);
    }
    let trace_id = trace_id(carrier.get("x-b3-traceid")?)?;
    let span_id = span_id(carrier.get("x-b3-spanid")?)?;
    // `X-B3-Flags: 1` is debug, which implies sampled.
    let sampled = carrier.get("x-b3-flags").map(str::trim) == Some("1")
        || matches!(
            carrier.get("x-b3-sampled").map(str::trim),
            Some("1" | "true")
        );
    Some(remote(trace_id, span_id, sampled))
}

/// `b3: {TraceId}-{SpanId}[-{SamplingState}[-{ParentSpanId}]]`; a lone sampling state (`0`,
/// `1`, `d`) names no span, so it gives no parent.
fn b3_single(value: &str) -> Option<SpanContext> {
    let mut fields = value.trim().split('-');
    let trace = trace_id(fields.next()?)?;
    let span = span_id(fields.next()?)?;
    let sampled = match fields.next() {
        Some("1" | "d") => true,
        Some("0") | None => false,
        Some(_) => return None,
    };
    // The caller's own parent: checked, then dropped (our spans' parent is the caller's span).
    if let Some(parent) = fields.next() {
        span_id(parent)?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(remote(trace, span, sampled))
}

/// A remote span context. A B3 context that defers the sampling decision (no sampling state)
/// counts as not sampled, as OpenTelemetry's Go B3 propagator (upstream's) reads it.
fn remote(trace_id: TraceId, span_id: SpanId, sampled: bool) -> SpanContext {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
}

/// A 128-bit trace id, or a 64-bit one (16 hex digits) zero-padded on the left; never all zero.
fn trace_id(text: &str) -> Option<TraceId> {
    let text = text.trim();
    if !(text.len() == 16 || text.len() == 32) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = u128::from_str_radix(text, 16).ok()?;
    (id != 0).then(|| TraceId::from_bytes(id.to_be_bytes()))
}

/// A 64-bit span id (16 hex digits); never all zero.
fn span_id(text: &str) -> Option<SpanId> {
    let text = text.trim();
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = u64::from_str_radix(text, 16).ok()?;
    (id != 0).then(|| SpanId::from_bytes(id.to_be_bytes()))
}

/// Reads string metadata (keys are lowercase in gRPC metadata, as B3 and W3C are matched).
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&'static str, &str)]) -> tonic::metadata::MetadataMap {
        let mut map = tonic::metadata::MetadataMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map
    }

    fn ids(cx: &Context) -> Option<(String, String, bool)> {
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid().then(|| {
            (
                sc.trace_id().to_string(),
                sc.span_id().to_string(),
                sc.is_sampled(),
            )
        })
    }

    const TRACE: &str = "463ac35c9f6413ad48485a3953bb6124";
    const SPAN: &str = "a2fb4a1d1a96d312";

    #[test]
    fn w3c_wins_over_b3() {
        let cx = parent(&metadata(&[
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("b3", &format!("{TRACE}-{SPAN}-1")),
        ]));
        assert_eq!(
            ids(&cx),
            Some((
                "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                "00f067aa0ba902b7".into(),
                true
            ))
        );
    }

    #[test]
    fn b3_single_and_multi() {
        let want = Some((TRACE.to_string(), SPAN.to_string(), true));
        let single = format!("{TRACE}-{SPAN}-1-05e3ac9a4f6e3b90");
        assert_eq!(ids(&parent(&metadata(&[("b3", &single)]))), want);
        assert_eq!(
            ids(&parent(&metadata(&[
                ("x-b3-traceid", TRACE),
                ("x-b3-spanid", SPAN),
                ("x-b3-sampled", "1"),
            ]))),
            want
        );
        // Debug implies sampled; no sampling state defers, read as not sampled.
        let debug = parent(&metadata(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-flags", "1"),
        ]));
        assert!(ids(&debug).unwrap().2);
        let deferred = parent(&metadata(&[("b3", &format!("{TRACE}-{SPAN}"))]));
        assert!(!ids(&deferred).unwrap().2);
        // The single header wins over the multi headers.
        let both = parent(&metadata(&[
            ("b3", &format!("{TRACE}-{SPAN}-0")),
            ("x-b3-traceid", "0000000000000000000000000000000a"),
            ("x-b3-spanid", "000000000000000b"),
        ]));
        assert_eq!(ids(&both), Some((TRACE.into(), SPAN.into(), false)));
    }

    #[test]
    fn short_trace_ids_are_padded() {
        let cx = parent(&metadata(&[("b3", &format!("48485a3953bb6124-{SPAN}-1"))]));
        assert_eq!(ids(&cx).unwrap().0, "000000000000000048485a3953bb6124");
    }

    #[test]
    fn malformed_b3_gives_no_parent() {
        for bad in [
            "1",
            "d",
            "0",
            "zz3ac35c9f6413ad48485a3953bb6124-a2fb4a1d1a96d312-1",
            "463ac35c9f6413ad-a2fb4a1d1a96d3-1",
            "00000000000000000000000000000000-a2fb4a1d1a96d312-1",
            "463ac35c9f6413ad48485a3953bb6124-a2fb4a1d1a96d312-x",
            "463ac35c9f6413ad48485a3953bb6124-a2fb4a1d1a96d312-1-bad",
            "463ac35c9f6413ad48485a3953bb6124-a2fb4a1d1a96d312-1-05e3ac9a4f6e3b90-x",
        ] {
            assert_eq!(ids(&parent(&metadata(&[("b3", bad)]))), None, "{bad}");
        }
        assert_eq!(
            ids(&parent(&metadata(&[("x-b3-traceid", TRACE)]))),
            None,
            "no span id"
        );
    }
}
