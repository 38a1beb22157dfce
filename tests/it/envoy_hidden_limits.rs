//! A limit hidden from the response headers, through a real Envoy.
//!
//! Envoy's per-descriptor `x_ratelimit_option` (envoyproxy/envoy#43131) never reaches the rate
//! limit service: Envoy keeps it beside the descriptors it sends and reads it only when it
//! builds its own `X-RateLimit-*` headers. Sluice's own headers (`LIMIT_RESPONSE_HEADERS_*`)
//! take the same wish from the limit itself: `hide_from_headers: true` in its `rate_limit`.
//! Here one route sends two descriptors, an internal limit (2 a day, hidden in both places) and
//! a per-user one (5 a day): the internal one is the tighter and then refuses, and Sluice's
//! headers describe the per-user limit throughout and never name the internal one.

use sluice_test_kit as kit;

use std::net::SocketAddr;

use kit::bootstrap::{Bootstrap, Filter, Route};
use kit::envoy::{Envoy, Response, Upstream};
use kit::{Sluice, avoid_window_edge, config_dir};

const LIMITS: &str = "\
domain: hidden
descriptors:
  - key: internal
    value: all
    rate_limit: { name: internal, unit: day, requests_per_unit: 2, hide_from_headers: true }
  - key: user
    rate_limit: { name: per_user, unit: day, requests_per_unit: 5 }
";

/// The route's descriptors: first `internal=all`, which says `x_ratelimit_option: "OFF"`, then
/// `user=<x-user>`.
const RATE_LIMITS: &str = r#"- actions:
    - generic_key: { descriptor_key: internal, descriptor_value: all }
  x_ratelimit_option: "OFF"
- actions:
    - request_headers: { header_name: x-user, descriptor_key: user }"#;

/// Envoy with the ratelimit filter (failing closed, DRAFT_VERSION_03 headers) and one route
/// sending RATE_LIMITS.
fn bootstrap(listener: u16, admin: u16, sluice: SocketAddr, app: SocketAddr) -> String {
    let filter = Filter {
        failure_mode_deny: true,
        x_ratelimit_headers: true,
        ..Filter::named("envoy.filters.http.ratelimit")
    };
    Bootstrap::new("hidden", &[sluice], app)
        .filters(&[filter])
        .route(Route::to("backend").rate_limits(RATE_LIMITS))
        .yaml(listener, admin)
}

/// No header of `r` names the hidden limit or carries its numbers as the limit.
fn never_names_internal(r: &Response, i: usize) {
    for (name, value) in &r.headers {
        assert!(
            !value.contains("internal"),
            "request {i}: {name}: {value}: {r:?}"
        );
    }
    assert_ne!(r.header("ratelimit-limit"), Some("2"), "request {i}: {r:?}");
}

#[tokio::test]
async fn a_hidden_limit_stays_out_of_sluices_headers_while_another_shows() {
    let config = config_dir(LIMITS);
    let sluice = Sluice::start(
        config.path(),
        None,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESPONSE_HEADERS_DRAFT", "true"),
        ],
    );
    let app = Upstream::start();
    let envoy = Envoy::start_bootstrap(
        |listener, admin| bootstrap(listener, admin, sluice.grpc, app.addr),
        "sluice",
        sluice.grpc,
        app.addr,
    );
    avoid_window_edge(24 * 3600, 60).await;
    // internal: 1 then 0 left of 2, then refusing; per_user: 4, 3, then 2 left of 5 (the
    // fixed window counts a refused request too).
    for (i, (status, user_left)) in [(200, "4"), (200, "3"), (429, "2")].into_iter().enumerate() {
        let r = envoy.request("/", &[("x-user", "u1")]);
        assert_eq!(r.status, status, "request {i}: {r:?}");
        never_names_internal(&r, i);
        assert_eq!(r.header("ratelimit-limit"), Some("5"), "request {i}: {r:?}");
        assert_eq!(
            r.header("ratelimit-remaining"),
            Some(user_left),
            "request {i}: {r:?}"
        );
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"per_user\";q=5;w=86400"),
            "request {i}: {r:?}"
        );
        // Envoy's own rule for its headers differs: the status with the least remaining is
        // the hidden one, so Envoy adds none at all.
        assert_eq!(r.header("x-ratelimit-limit"), None, "request {i}: {r:?}");
    }
}
