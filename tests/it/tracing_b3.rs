//! Zipkin's B3 trace headers beside W3C `traceparent` (upstream's envoyproxy/ratelimit#1110):
//! a call that carries only B3 (the single `b3` header, or the `X-B3-*` headers) gets its
//! request span exported under the caller's B3 trace and span, read back from an OTLP
//! collector in the test; a call that carries both is joined to its W3C parent.

use sluice_test_kit as kit;

use kit::otlp::{Collector, hex};
use kit::*;

#[tokio::test(flavor = "multi_thread")]
async fn b3_headers_make_the_callers_span_the_parent() {
    let (collector, endpoint) = Collector::start().await;
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    );
    let env = [
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let sluice = Sluice::start(dir.path(), None, &env);
    let mut c = sluice.client().await;
    let call = |headers: &[(&'static str, String)]| {
        let mut req = tonic::Request::new(request("app", vec![descriptor(&[("user", "a")])]));
        for (k, v) in headers {
            req.metadata_mut().insert(*k, v.parse().unwrap());
        }
        req
    };

    // The single header, with the caller's own parent after the sampling state.
    let (trace, span) = ("463ac35c9f6413ad48485a3953bb6124", "a2fb4a1d1a96d312");
    c.should_rate_limit(call(&[(
        "b3",
        format!("{trace}-{span}-1-05e3ac9a4f6e3b90"),
    )]))
    .await
    .unwrap();
    let root = collector.span(trace, "ShouldRateLimit").await;
    assert_eq!(hex(&root.parent_span_id), span, "the b3 span is the parent");

    // The multi headers, a 64-bit trace id (padded on the left to 128 bits).
    let (short, span) = ("48485a3953bb6125", "b7ad6b7169203331");
    c.should_rate_limit(call(&[
        ("x-b3-traceid", short.to_string()),
        ("x-b3-spanid", span.to_string()),
        ("x-b3-sampled", "1".to_string()),
    ]))
    .await
    .unwrap();
    let root = collector
        .span(&format!("0000000000000000{short}"), "ShouldRateLimit")
        .await;
    assert_eq!(
        hex(&root.parent_span_id),
        span,
        "the X-B3 span is the parent"
    );

    // Both: W3C wins.
    let (w3c_trace, w3c_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    c.should_rate_limit(call(&[
        ("traceparent", format!("00-{w3c_trace}-{w3c_span}-01")),
        (
            "b3",
            "11111111111111111111111111111111-2222222222222222-1".to_string(),
        ),
    ]))
    .await
    .unwrap();
    let root = collector.span(w3c_trace, "ShouldRateLimit").await;
    assert_eq!(hex(&root.parent_span_id), w3c_span, "traceparent wins");
}
