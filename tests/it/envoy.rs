//! Sluice behind a real Envoy: HTTP goes through Envoy's ratelimit filter, and the tests read
//! what the client got (200, 429, 500) and Envoy's own ratelimit stats.
//!
//! A gRPC client can only show what Sluice answered; what matters to users is what Envoy does
//! with it. An error answer, a reset stream or a timeout all become "let it through" under the
//! shipped `failure_mode_deny: false`, so a bug that turns a decision into an error shows up
//! here as over-admission, and in `cluster.backend.ratelimit.error`.
//!
//! Envoy runs the shipped `deploy/envoy/envoy.yaml` (ports and addresses rewritten, see
//! crates/sluice-test-kit/src/envoy.rs) and Sluice, in the first tests, the shipped `deploy/envoy/limits.yaml`.
//! Every request comes from 127.0.0.1, so all of them count against one per-address counter.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::envoy::{
    Envoy, RatelimitStats, SHIPPED_LIMITS_YAML, StatusCounts, Upstream, replace_once,
};
use kit::{RedisServer, Sluice, StoreKind, avoid_window_edge, config_dir, for_each_store};

/// `requests_per_unit` of the limit called `name` in the shipped limits.yaml, so the tests
/// follow that file instead of repeating its numbers.
fn shipped_limit(name: &str) -> usize {
    let rest = SHIPPED_LIMITS_YAML
        .split_once(&format!("name: {name}\n"))
        .unwrap_or_else(|| panic!("no limit named {name} in limits.yaml"))
        .1;
    rest.lines()
        .find_map(|l| l.trim().strip_prefix("requests_per_unit: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no requests_per_unit after {name} in limits.yaml"))
}

/// Sluice on the shipped limits.yaml, for the given store.
fn shipped_sluice(redis: Option<&RedisServer>) -> (tempfile::TempDir, Sluice) {
    let config = config_dir(SHIPPED_LIMITS_YAML);
    let sluice = Sluice::start(config.path(), redis, &[]);
    (config, sluice)
}

/// The per-address limit of limits.yaml counts requests per minute. The counting part of a
/// test takes about a second here (100 requests through Envoy); it must not straddle a minute
/// boundary, so it starts with at least 20 s left in the minute.
async fn stay_in_one_minute() {
    avoid_window_edge(60, 20).await;
}

/// Sends the per-address limit's worth of plain requests, all admitted, then a few more, all
/// refused; checks Envoy's count of Sluice's answers agrees.
fn count_to_the_per_address_limit(store: StoreKind, envoy: &Envoy) {
    let limit = shipped_limit("per_address");
    let under = envoy.send(limit, 4, Duration::ZERO, "/", &[]);
    assert_eq!(
        under,
        StatusCounts([(200, limit)].into()),
        "{store:?}: requests under the per-address limit"
    );
    let over = envoy.send(3, 1, Duration::ZERO, "/", &[]);
    assert_eq!(
        over,
        StatusCounts([(429, 3)].into()),
        "{store:?}: requests over the per-address limit"
    );
}

/// The shipped Envoy and Sluice configs work together: requests are admitted up to the
/// per-address limit and refused with 429 after it, on either store, and Envoy counted an OK
/// or OVER_LIMIT answer for each, never an error.
#[tokio::test]
async fn shipped_config_limits_per_address_through_envoy() {
    for_each_store(|store, redis| async move {
        let (_config, sluice) = shipped_sluice(redis.as_ref());
        let app = Upstream::start();
        let envoy = Envoy::start(sluice.grpc, app.addr, &[]);
        stay_in_one_minute().await;
        count_to_the_per_address_limit(store, &envoy);
        let limit = shipped_limit("per_address") as u64;
        assert_eq!(
            envoy.ratelimit_stats(),
            RatelimitStats {
                ok: limit,
                over_limit: 3,
                error: 0,
                failure_mode_allowed: 0,
            },
            "{store:?}: Envoy's ratelimit stats"
        );
    })
    .await;
}

/// Issue "One long header value bypasses every limit": a client over its per-address limit
/// adds an `x-user-id` of 5000 bytes, which envoy.yaml turns into a `[user=<value>]`
/// descriptor. Sluice used to refuse the whole call with INVALID_ARGUMENT (value too long);
/// Envoy treats that as a failure of the limiter and, failing open as shipped, let the request
/// through. It must get 429 like any other request from that address, and 429 (not 500) with
/// `failure_mode_deny: true` too; Envoy must see no error.
#[tokio::test]
async fn long_header_value_does_not_bypass_the_limit() {
    for_each_store(|store, redis| async move {
        let (_config, sluice) = shipped_sluice(redis.as_ref());
        let app = Upstream::start();
        let envoy = Envoy::start(sluice.grpc, app.addr, &[]);
        let long_user = "u".repeat(5000);
        let long = [("x-user-id", long_user.as_str())];
        stay_in_one_minute().await;

        count_to_the_per_address_limit(store, &envoy);
        assert_eq!(
            envoy.get("/", &long),
            429,
            "{store:?}: long x-user-id, over"
        );
        let stats = envoy.ratelimit_stats();
        assert_eq!(
            (stats.error, stats.failure_mode_allowed),
            (0, 0),
            "{store:?}: Envoy saw Sluice fail: {stats:?}"
        );

        // Failing closed, an error would have been a 500; the answer is still the limit's.
        let closed = Envoy::start(
            sluice.grpc,
            app.addr,
            &[("failure_mode_deny: false", "failure_mode_deny: true")],
        );
        assert_eq!(
            closed.get("/", &long),
            429,
            "{store:?}: long x-user-id, failure_mode_deny"
        );
        let stats = closed.ratelimit_stats();
        assert_eq!(
            (stats.over_limit, stats.error),
            (1, 0),
            "{store:?}: failure_mode_deny Envoy's stats: {stats:?}"
        );
    })
    .await;
}

/// Sluice closes each gRPC connection after GRPC_MAX_CONNECTION_AGE (plus _GRACE for calls in
/// flight). Envoy keeps one HTTP/2 connection to it and sends every check on it; if Sluice cuts
/// it under calls (no GOAWAY first, or in-flight streams reset), those calls fail and Envoy,
/// failing open, lets their requests through. With the connection aged out several times
/// under steady load, the admitted count must still be exactly the limit, and Envoy must have
/// seen no error.
#[tokio::test]
async fn connection_age_through_envoy_loses_no_decision() {
    const LIMIT: usize = 300;
    const REQUESTS: usize = 3000;
    // A day, so the whole run falls in one window without waiting for an edge (the edge of
    // an hour would make the test sleep a minute once in 60 runs).
    let config = config_dir(&format!(
        "domain: example\n\
         descriptors:\n\
         \x20 - key: user\n\
         \x20   rate_limit: {{ unit: day, requests_per_unit: {LIMIT} }}\n"
    ));
    let sluice = Sluice::start(
        config.path(),
        None,
        &[
            ("GRPC_MAX_CONNECTION_AGE", "1s"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"),
        ],
    );
    let app = Upstream::start();
    let envoy = Envoy::start(sluice.grpc, app.addr, &[]);
    // The run takes about 5 s, several connection ages; it must not cross midnight UTC.
    avoid_window_edge(24 * 3600, 60).await;

    let started = std::time::Instant::now();
    let counts = envoy.send(
        REQUESTS,
        4,
        Duration::from_secs(5),
        "/",
        &[("x-user-id", "aged")],
    );
    let took = started.elapsed();
    let stats = envoy.ratelimit_stats();
    eprintln!("{REQUESTS} requests in {took:?}: {counts:?}, {stats:?}");
    assert_eq!(
        counts,
        StatusCounts([(200, LIMIT), (429, REQUESTS - LIMIT)].into()),
        "statuses through Envoy ({stats:?})"
    );
    assert_eq!(
        stats,
        RatelimitStats {
            ok: LIMIT as u64,
            over_limit: (REQUESTS - LIMIT) as u64,
            error: 0,
            failure_mode_allowed: 0,
        },
        "Envoy's ratelimit stats"
    );
    // The connection really was aged out under the load, or this test proves nothing (health
    // checks have connections of their own, not counted here).
    let connections = envoy.stat("cluster.sluice.upstream_cx_total");
    assert!(
        connections >= 2,
        "Envoy opened {connections} connection(s) to Sluice"
    );
    // And none of them went away with a call still on it: that is the cut the errors above
    // come from.
    assert_eq!(
        envoy.stat("cluster.sluice.upstream_cx_destroy_with_active_rq"),
        0,
        "connections to Sluice closed under calls"
    );
}

/// `GRPC_MAX_CONNECTION_IDLE` (1 s here) under a real Envoy: its connections to Sluice that sit
/// idle get a GOAWAY and close, and Envoy's next calls go over a new connection without a
/// single decision lost (issue #27, item 4: the idle timeout must not break a healthy Envoy).
#[tokio::test]
async fn idle_timeout_through_envoy_loses_no_decision() {
    const LIMIT: usize = 5;
    let config = config_dir(&format!(
        "domain: example\n\
         descriptors:\n\
         \x20 - key: user\n\
         \x20   rate_limit: {{ unit: day, requests_per_unit: {LIMIT} }}\n"
    ));
    let sluice = Sluice::start(config.path(), None, &[("GRPC_MAX_CONNECTION_IDLE", "1s")]);
    let app = Upstream::start();
    let envoy = Envoy::start(sluice.grpc, app.addr, &[]);
    avoid_window_edge(24 * 3600, 60).await;
    let user = [("x-user-id", "idle")];

    let first = envoy.send(3, 1, Duration::ZERO, "/", &user);
    // Three idle periods: the connection gets its GOAWAY and closes.
    std::thread::sleep(Duration::from_secs(3));
    let idle_closed =
        sluice.metric("sluice_connections_closed_total{listener=\"grpc\",reason=\"idle\"}");
    let second = envoy.send(4, 1, Duration::ZERO, "/", &user);
    let stats = envoy.ratelimit_stats();
    eprintln!("{first:?} then {second:?}; {idle_closed} idle connections closed; {stats:?}");
    assert_eq!(first, StatusCounts([(200, 3)].into()));
    assert_eq!(second, StatusCounts([(200, 2), (429, 2)].into()));
    assert_eq!(
        stats,
        RatelimitStats {
            ok: LIMIT as u64,
            over_limit: 2,
            error: 0,
            failure_mode_allowed: 0,
        },
        "Envoy's ratelimit stats"
    );
    assert!(idle_closed >= 1.0, "no connection was closed for idleness");
    assert_eq!(
        envoy.stat("cluster.sluice.upstream_cx_destroy_with_active_rq"),
        0,
        "connections to Sluice closed under calls"
    );
}

/// Under Istio the rate limit cluster is named `outbound|8081||<host>`, and Envoy sends that
/// name as the `:authority` of its calls (and of its gRPC health checks). Sluice answers them
/// (it used to reset every one, and Envoy, failing open, admitted everything).
#[tokio::test]
async fn istio_cluster_names_as_authority_are_answered() {
    const ISTIO: &str = "outbound|8081||sluice.default.svc.cluster.local";
    let (_config, sluice) = shipped_sluice(None);
    let app = Upstream::start();
    let filter = "cluster_name: sluice\n                  - name: envoy.filters.http.router";
    let renamed_filter =
        format!("cluster_name: \"{ISTIO}\"\n                  - name: envoy.filters.http.router");
    let cluster = "    - name: sluice\n      type: STRICT_DNS";
    let renamed_cluster = format!("    - name: \"{ISTIO}\"\n      type: STRICT_DNS");
    let assignment = "load_assignment:\n        cluster_name: sluice";
    let renamed_assignment = format!("load_assignment:\n        cluster_name: \"{ISTIO}\"");
    let make = |listener, admin| {
        let yaml = kit::envoy::shipped_config(listener, admin, sluice.grpc, app.addr);
        let yaml = replace_once(&yaml, filter, &renamed_filter);
        let yaml = replace_once(&yaml, cluster, &renamed_cluster);
        replace_once(&yaml, assignment, &renamed_assignment)
    };
    // Ready only once Envoy's gRPC health checks, which carry the same :authority, pass.
    let envoy = Envoy::start_bootstrap(make, ISTIO, sluice.grpc, app.addr);
    // Three requests, far under every shipped limit: each is admitted on Sluice's answer, not
    // on a failed call (which Envoy, failing open, would admit too).
    let sent = envoy.send(3, 1, Duration::ZERO, "/", &[]);
    assert_eq!(sent, StatusCounts([(200, 3)].into()));
    let stats = envoy.ratelimit_stats();
    assert_eq!(
        (stats.ok, stats.error, stats.failure_mode_allowed),
        (3, 0, 0),
        "{stats:?}"
    );
}
