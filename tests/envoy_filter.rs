//! Envoy's `envoy.filters.http.ratelimit` filter against Sluice, case by case: each kind of
//! route action, the `X-RateLimit-*` headers Envoy computes from Sluice's statuses, the
//! headers Sluice adds itself, per-descriptor `hits_addend`, `failure_mode_deny` both ways
//! with Sluice stopped and with Redis killed, and Envoy's own ratelimit counters; then the
//! shipped `deploy/envoy/envoy.yaml` with nothing but its addresses changed.
//!
//! Every case reads what a client of Envoy gets. The cases of one test share one Sluice and
//! one Envoy and run one after the other; each case routes to an Envoy cluster of its own
//! (all pointing at the same tiny upstream), because Envoy counts the filter's
//! `ok/over_limit/error/failure_mode_allowed` per route target cluster, so each case can
//! compare those counts with what it sent.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::envoy::{Envoy, RatelimitStats, SHIPPED_LIMITS_YAML, Upstream, shipped_config_as_is};
use common::{RedisServer, Sluice, avoid_window_edge, config_dir};

/// The limits of the filter tests (domain `filter`). Day windows, so a run never crosses a
/// window edge (checked against midnight UTC by `stay_in_one_day`).
const LIMITS: &str = "\
domain: filter
descriptors:
  - key: remote_address
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: generic_key
    value: gk
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: user
    rate_limit: { unit: day, requests_per_unit: 4 }
  - key: plan
    value: gold
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: generic_key
    value: api
    descriptors:
      - key: remote_address
        descriptors:
          - key: user
            rate_limit: { unit: day, requests_per_unit: 3 }
  - key: cost
    rate_limit: { name: per_cost_user, unit: day, requests_per_unit: 10 }
  - key: wide
    rate_limit: { name: wide, unit: hour, requests_per_unit: 50 }
";

/// Envoy's wait for Sluice in these tests (see RATELIMIT_TIMEOUT in tests/common/envoy.rs):
/// long, so that a busy machine cannot turn an answer into a timeout.
const TIMEOUT: &str = "5s";

/// One route of the test bootstrap: requests whose path starts with `/<cluster>` go to the
/// cluster `<cluster>` (the upstream), with `rate_limits` (YAML list items, indented by the
/// caller as the list under `rate_limits:`) and optional per-route filter config.
struct Route {
    cluster: &'static str,
    rate_limits: &'static str,
    /// `typed_per_filter_config` of the route, YAML, or empty.
    per_filter: &'static str,
}

/// A bootstrap made for these tests. Two ratelimit filters: `ratelimit_open` (stage 0,
/// `failure_mode_deny: false`, DRAFT_VERSION_03 headers) and `ratelimit_closed` (stage 1,
/// `failure_mode_deny: true`); a route picks one by the `stage` of its `rate_limits`.
/// `use_remote_address: false` and no trusted hops: the client address is the last
/// `x-forwarded-for` entry when there is one, so each case picks client addresses of its own.
fn filter_config(
    listener: u16,
    admin: u16,
    sluice: SocketAddr,
    app: SocketAddr,
    routes: &[Route],
) -> String {
    let mut route_yaml = String::new();
    let mut cluster_yaml = String::new();
    for r in routes {
        route_yaml.push_str(&format!(
            "
                - match: {{ prefix: \"/{cluster}\" }}
                  route:
                    cluster: {cluster}
                    rate_limits:
{rate_limits}
                  typed_per_filter_config: {{{per_filter}}}",
            cluster = r.cluster,
            rate_limits = indent(r.rate_limits, 22),
            per_filter = r.per_filter,
        ));
        cluster_yaml.push_str(&format!(
            "
    - name: {cluster}
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: {cluster}
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: {ip}, port_value: {port} }}",
            cluster = r.cluster,
            ip = app.ip(),
            port = app.port(),
        ));
    }
    let filter = |name: &str, stage: u32, deny: bool| {
        format!(
            "
          - name: {name}
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: filter
              stage: {stage}
              timeout: {TIMEOUT}
              failure_mode_deny: {deny}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: sluice }}"
        )
    };
    format!(
        "
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}
static_resources:
  listeners:
    - name: ingress
      address:
        socket_address: {{ address: 127.0.0.1, port_value: {listener} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                use_remote_address: false
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: [\"*\"]
                      routes:{routes}
                http_filters:{open}{closed}
                  - name: envoy.filters.http.router
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: sluice
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: sluice
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: {sluice_ip}, port_value: {sluice_port} }}
      health_checks:
        - timeout: 1s
          interval: 1s
          unhealthy_threshold: 2
          healthy_threshold: 1
          grpc_health_check: {{ service_name: ratelimit }}{clusters}
",
        routes = indent(&route_yaml, 8),
        open = indent(&filter("ratelimit_open", 0, false), 8),
        closed = indent(&filter("ratelimit_closed", 1, true), 8),
        sluice_ip = sluice.ip(),
        sluice_port = sluice.port(),
        clusters = cluster_yaml,
    )
}

/// `text` with every non-empty line indented by `n` more spaces.
fn indent(text: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    text.lines()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                format!("{pad}{l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sluice on LIMITS, an upstream, and Envoy on `filter_config(routes)`.
struct Setup {
    envoy: Envoy,
    // Dropped after Envoy, in this order.
    _app: Upstream,
    sluice: Sluice,
    _config: tempfile::TempDir,
}

fn setup(redis: Option<&RedisServer>, env: &[(&str, &str)], routes: &[Route]) -> Setup {
    let config = config_dir(LIMITS);
    let sluice = Sluice::start(config.path(), redis, env);
    let app = Upstream::start();
    let envoy = Envoy::start_with(sluice.grpc, app.addr, |listener, admin| {
        filter_config(listener, admin, sluice.grpc, app.addr, routes)
    });
    Setup {
        envoy,
        _app: app,
        sluice,
        _config: config,
    }
}

/// The day windows of LIMITS must not end during a test (a few seconds).
async fn stay_in_one_day() {
    avoid_window_edge(24 * 3600, 60).await;
}

/// Sends `n` GETs one after the other; their statuses in order.
fn statuses(envoy: &Envoy, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    (0..n).map(|_| envoy.get(path, headers)).collect()
}

/// `admitted` 200s followed by `refused` 429s.
fn admitted_then_refused(admitted: usize, refused: usize) -> Vec<u16> {
    let mut want = vec![200; admitted];
    want.extend(vec![429; refused]);
    want
}

/// What Envoy should have counted for `ok` answers and `over_limit` answers, nothing failed.
fn answered(ok: u64, over_limit: u64) -> RatelimitStats {
    RatelimitStats {
        ok,
        over_limit,
        error: 0,
        failure_mode_allowed: 0,
    }
}

// ------------------------------------------------------------------------------------------
// Route actions
// ------------------------------------------------------------------------------------------

const ACTION_ROUTES: &[Route] = &[
    // [remote_address=<client>]
    Route {
        cluster: "remote_address",
        rate_limits: "- actions: [{ remote_address: {} }]",
        per_filter: "",
    },
    // [generic_key=gk]
    Route {
        cluster: "generic_key",
        rate_limits: "- actions: [{ generic_key: { descriptor_value: gk } }]",
        per_filter: "",
    },
    // [user=<x-user>], none without the header
    Route {
        cluster: "request_headers",
        rate_limits: "- actions: [{ request_headers: { header_name: x-user, descriptor_key: user } }]",
        per_filter: "",
    },
    // [plan=gold] when x-plan is gold, none otherwise
    Route {
        cluster: "header_value_match",
        rate_limits: "\
- actions:
    - header_value_match:
        descriptor_key: plan
        descriptor_value: gold
        headers: [{ name: x-plan, string_match: { exact: gold } }]",
        per_filter: "",
    },
    // [generic_key=api, remote_address=<client>, user=<x-user>]: one descriptor, three entries
    Route {
        cluster: "nested",
        rate_limits: "\
- actions:
    - generic_key: { descriptor_value: api }
    - remote_address: {}
    - request_headers: { header_name: x-user, descriptor_key: user }",
        per_filter: "",
    },
];

/// Each kind of route action builds the descriptor its limit is configured for: exactly the
/// limit's number of requests get 200, the next ones 429, and Envoy counted one OK or
/// OVER_LIMIT answer for each. Requests for which an action yields nothing (a header missing,
/// not matching) send no descriptor and are never limited, and Envoy does not call Sluice.
#[tokio::test]
async fn route_actions_build_the_descriptors_their_limits_count() {
    let s = setup(None, &[], ACTION_ROUTES);
    let envoy = &s.envoy;
    stay_in_one_day().await;

    // remote_address: 3 per client address; a second address has its own count.
    let client = |ip: &'static str| [("x-forwarded-for", ip)];
    assert_eq!(
        statuses(envoy, 5, "/remote_address", &client("10.0.0.1")),
        admitted_then_refused(3, 2),
        "remote_address, first client"
    );
    assert_eq!(
        statuses(envoy, 4, "/remote_address", &client("10.0.0.2")),
        admitted_then_refused(3, 1),
        "remote_address, second client"
    );
    assert_eq!(
        envoy.ratelimit_stats_of("remote_address"),
        answered(6, 3),
        "remote_address stats"
    );

    // generic_key: 2 in all, whoever asks.
    let mut got = statuses(envoy, 2, "/generic_key", &client("10.0.1.1"));
    got.extend(statuses(envoy, 2, "/generic_key", &client("10.0.1.2")));
    assert_eq!(got, admitted_then_refused(2, 2), "generic_key");
    assert_eq!(envoy.ratelimit_stats_of("generic_key"), answered(2, 2));

    // request_headers: 4 per user; without the header, no descriptor and no limit.
    assert_eq!(
        statuses(envoy, 6, "/request_headers", &[("x-user", "ann")]),
        admitted_then_refused(4, 2),
        "request_headers, user ann"
    );
    assert_eq!(
        statuses(envoy, 5, "/request_headers", &[("x-user", "bob")]),
        admitted_then_refused(4, 1),
        "request_headers, user bob"
    );
    assert_eq!(
        statuses(envoy, 8, "/request_headers", &[]),
        vec![200; 8],
        "request_headers, no header"
    );
    assert_eq!(
        envoy.ratelimit_stats_of("request_headers"),
        answered(8, 3),
        "request_headers stats: the requests without the header were not sent to Sluice"
    );

    // header_value_match: 2 for gold; other plans send no descriptor.
    assert_eq!(
        statuses(envoy, 4, "/header_value_match", &[("x-plan", "gold")]),
        admitted_then_refused(2, 2),
        "header_value_match, gold"
    );
    assert_eq!(
        statuses(envoy, 5, "/header_value_match", &[("x-plan", "silver")]),
        vec![200; 5],
        "header_value_match, silver"
    );
    assert_eq!(
        envoy.ratelimit_stats_of("header_value_match"),
        answered(2, 2)
    );

    // Nested: 3 per (address, user); a different address or user starts again, and the
    // descriptor does not touch the one-entry limits (the remote_address case's 10.0.0.1 is
    // used up, this one is not).
    let nested = |ip: &'static str, user: &'static str| {
        statuses(
            envoy,
            4,
            "/nested",
            &[("x-forwarded-for", ip), ("x-user", user)],
        )
    };
    assert_eq!(
        nested("10.0.0.1", "ann"),
        admitted_then_refused(3, 1),
        "nested"
    );
    assert_eq!(
        nested("10.0.0.1", "cy"),
        admitted_then_refused(3, 1),
        "nested, other user"
    );
    assert_eq!(
        nested("10.0.2.1", "ann"),
        admitted_then_refused(3, 1),
        "nested, other address"
    );
    assert_eq!(envoy.ratelimit_stats_of("nested"), answered(9, 3));
}

// ------------------------------------------------------------------------------------------
// Response headers and hits_addend
// ------------------------------------------------------------------------------------------

/// The per-route filter config's form of `rate_limits` (RateLimitPerRoute), the only place
/// where Envoy 1.40 reads a descriptor's `hits_addend`.
macro_rules! per_route_cost {
    ($cost:literal) => {
        concat!(
            "ratelimit_open: { \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute, ",
            "rate_limits: [{ actions: [{ request_headers: { header_name: x-key, descriptor_key: cost } }], ",
            "hits_addend: { number: ",
            $cost,
            " } }] }"
        )
    };
}

const HEADER_ROUTES: &[Route] = &[
    // [wide=<x-key>] (50/hour) and [cost=<x-key>] (10/day): two limits in one answer.
    Route {
        cluster: "headers",
        rate_limits: "\
- actions: [{ request_headers: { header_name: x-key, descriptor_key: wide } }]
- actions: [{ request_headers: { header_name: x-key, descriptor_key: cost } }]",
        per_filter: "",
    },
    // [cost=<x-key>] costing 0, 5, and (no hits_addend) 1.
    Route {
        cluster: "cost_zero",
        rate_limits: "[]",
        per_filter: per_route_cost!("0"),
    },
    Route {
        cluster: "cost_five",
        rate_limits: "[]",
        per_filter: per_route_cost!("5"),
    },
    Route {
        cluster: "cost_one",
        rate_limits: "- actions: [{ request_headers: { header_name: x-key, descriptor_key: cost } }]",
        per_filter: "",
    },
    // The same descriptor with `hits_addend` on the route's own rate_limits entry, which
    // Envoy 1.40 accepts and sends nowhere.
    Route {
        cluster: "cost_route_level",
        rate_limits: "\
- actions: [{ request_headers: { header_name: x-key, descriptor_key: cost } }]
  hits_addend: { number: 5 }",
        per_filter: "",
    },
];

/// Seconds from now to the end of the current UTC day (the day windows' reset).
fn seconds_to_midnight() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    24 * 3600 - now % (24 * 3600)
}

/// Envoy's DRAFT_VERSION_03 `X-RateLimit-*` headers carry what it computes from Sluice's
/// statuses (the limit and reset of the status with the least remaining, that least
/// remaining, and every limit's quota policy with its window and name), and the
/// `RateLimit-*` headers Sluice adds with LIMIT_RESPONSE_HEADERS_ENABLED reach the client
/// unchanged, on admitted (200) and refused (429) responses alike.
#[tokio::test]
async fn ratelimit_headers_reach_the_client() {
    let s = setup(
        None,
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
        HEADER_ROUTES,
    );
    stay_in_one_day().await;
    // [wide] allows 50 an hour, [cost] 10 a day: cost is the tighter one all along.
    let policies = "10, 50;w=3600;name=\"wide\", 10;w=86400;name=\"per_cost_user\"";
    for i in 1..=12usize {
        let r = s.envoy.request("/headers", &[("x-key", "h1")]);
        let remaining = 10usize.saturating_sub(i).to_string();
        let want_status = if i <= 10 { 200 } else { 429 };
        assert_eq!(r.status, want_status, "request {i}: {r:?}");
        assert_eq!(
            r.header("x-ratelimit-limit"),
            Some(policies),
            "request {i}: {r:?}"
        );
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.as_str()),
            "request {i}: {r:?}"
        );
        assert_eq!(
            r.header("ratelimit-limit"),
            Some("10"),
            "request {i}: {r:?}"
        );
        assert_eq!(
            r.header("ratelimit-remaining"),
            Some(remaining.as_str()),
            "request {i}: {r:?}"
        );
        // Both resets are the day window's, in whole seconds (a second may tick between).
        let midnight = seconds_to_midnight();
        for name in ["x-ratelimit-reset", "ratelimit-reset"] {
            let reset: u64 = r
                .header(name)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("request {i}: no number in {name}: {r:?}"));
            assert!(
                reset.abs_diff(midnight) <= 2,
                "request {i}: {name} is {reset}, the day ends in {midnight} s: {r:?}"
            );
        }
        assert_eq!(
            r.header("x-envoy-ratelimited"),
            (want_status == 429).then_some("true"),
            "request {i}: {r:?}"
        );
    }
    assert_eq!(s.envoy.ratelimit_stats_of("headers"), answered(10, 2));
}

/// A descriptor's `hits_addend`, from the per-route filter config's `rate_limits`, reaches
/// Sluice: 5 spends five of the ten, 0 checks without spending (and, once a refused hit put the
/// count above the limit, is refused too, as upstream's fixed window does). The same
/// `hits_addend` on the route's own `rate_limits` entry is dropped by Envoy 1.40: each request
/// counts one.
#[tokio::test]
async fn hits_addend_per_descriptor_through_envoy() {
    let s = setup(None, &[], HEADER_ROUTES);
    let envoy = &s.envoy;
    stay_in_one_day().await;
    let key = [("x-key", "c1")];

    assert_eq!(
        statuses(envoy, 3, "/cost_zero", &key),
        [200; 3],
        "cost 0 on a fresh counter"
    );
    assert_eq!(
        statuses(envoy, 2, "/cost_five", &key),
        [200; 2],
        "cost 5, twice: 10 of 10"
    );
    assert_eq!(
        statuses(envoy, 1, "/cost_zero", &key),
        [200],
        "cost 0 at the limit"
    );
    assert_eq!(
        statuses(envoy, 1, "/cost_one", &key),
        [429],
        "cost 1 past the limit"
    );
    assert_eq!(
        statuses(envoy, 1, "/cost_zero", &key),
        [429],
        "cost 0 above the limit"
    );
    assert_eq!(envoy.ratelimit_stats_of("cost_zero"), answered(4, 1));
    assert_eq!(envoy.ratelimit_stats_of("cost_five"), answered(2, 0));
    assert_eq!(envoy.ratelimit_stats_of("cost_one"), answered(0, 1));

    // Route-level hits_addend 5: ten requests fit in the limit of ten.
    let other = [("x-key", "c2")];
    assert_eq!(
        statuses(envoy, 11, "/cost_route_level", &other),
        admitted_then_refused(10, 1),
        "route-level hits_addend (Envoy 1.40 ignores it)"
    );
}
