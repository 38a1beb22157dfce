//! `/metrics` after a scripted sequence shows the counts upstream's rules give.

use sluice_test_kit as kit;

use kit::*;

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn per_rule_counts_follow_upstream() {
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 20}\n  - key: s\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: d\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    );
    let sluice = Sluice::start(dir.path(), None, &[]);
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 10).await;
    let with_hits = |key: &str, value: &str, hits: u32| {
        let mut r = request("app", vec![descriptor(&[(key, value)])]);
        r.hits_addend = hits;
        r
    };
    // Upstream's worked example: limit 20, 15 hits then 7 → within 15, near 4, over 2.
    ask(&mut c, with_hits("k", "x", 15)).await;
    ask(&mut c, with_hits("k", "x", 7)).await;
    // Shadow rule: the second hit is over, answered OK, counted as shadow_mode.
    ask(&mut c, with_hits("s", "x", 1)).await;
    ask(&mut c, with_hits("s", "x", 1)).await;
    // detailed_metric: the runtime value is in the key.
    ask(&mut c, with_hits("d", "alice", 1)).await;
    // An unknown domain, an error.
    ask(&mut c, request("nope", vec![descriptor(&[("k", "x")])])).await;
    let _ = c
        .should_rate_limit(request("", vec![descriptor(&[("k", "x")])]))
        .await;

    let (status, text) = sluice.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    let series = |name: &str, key: &str| {
        format!("ratelimit_service_rate_limit_{name}{{domain=\"app\",key1=\"{key}\"}}")
    };
    let expect = [
        (series("total_hits", "k"), 22.0),
        (series("within_limit", "k"), 15.0),
        (series("near_limit", "k"), 4.0),
        (series("over_limit", "k"), 2.0),
        (series("total_hits", "s"), 2.0),
        (series("over_limit", "s"), 1.0),
        (series("shadow_mode", "s"), 1.0),
        (series("total_hits", "d_alice"), 1.0),
        ("ratelimit_service_config_load_success".to_string(), 1.0),
        (
            "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"}".to_string(),
            1.0,
        ),
        (
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}".to_string(),
            7.0,
        ),
        (
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"}"
                .to_string(),
            7.0,
        ),
        ("sluice_memory_store_entries".to_string(), 3.0),
    ];
    for (series, want) in expect {
        assert_eq!(value(&text, &series), Some(want), "{series}\n{text}");
    }
    assert!(text.contains("ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.01\"}"));
    // The within_limit series of the shadow rule counts its first, admitted hit.
    assert_eq!(value(&text, &series("within_limit", "s")), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn use_prometheus_serves_metrics_on_their_own_listener() {
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 20}\n",
    );
    let port = free_port();
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("USE_PROMETHEUS", "true"),
            ("USE_STATSD", "false"),
            ("PROMETHEUS_ADDR", &format!("127.0.0.1:{port}")),
            ("PROMETHEUS_PATH", "/stats"),
        ],
    );
    let mut c = sluice.client().await;
    ask(&mut c, request("app", vec![descriptor(&[("k", "x")])])).await;
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let (status, text) = http_request(addr, "GET", "/stats", "");
    assert_eq!(status, 200);
    assert_eq!(
        value(
            &text,
            "ratelimit_service_rate_limit_total_hits{domain=\"app\",key1=\"k\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // Only the metrics path is served there; /metrics on the HTTP port stays.
    assert_eq!(http_request(addr, "GET", "/json", "").0, 404);
    assert_eq!(sluice.http("GET", "/metrics", "").0, 200);
    assert!(sluice.terminate().success());
}
