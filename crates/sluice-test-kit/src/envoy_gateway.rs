//! The Envoy Gateway scenario, shared by the binary's test (`tests/gateway/envoy_gateway.rs`) and the
//! image's (`tests/gateway/image.rs`): Sluice where Envoy Gateway puts envoyproxy/ratelimit, started as
//! EG starts it, configured by an xDS server shaped as EG's, behind an Envoy configured as EG
//! configures it. The caller says how Sluice starts (a process, a container); the rest is here.
//!
//! - Sluice: no arguments and EG's environment (`internal/infrastructure/
//!   kubernetes/ratelimit/resource.go`): `CONFIG_TYPE=GRPC_XDS_SOTW`, node `envoy-ratelimit`,
//!   mTLS to the xDS server, TLS on the gRPC port, `FORCE_START_WITHOUT_INITIAL_CONFIG=true`,
//!   Redis over TCP with no `BACKEND_TYPE`, Prometheus on its own listener. What differs is
//!   only what a test must change: file paths (a temporary directory for `/certs`, unless a
//!   container mounts it there), ports (free
//!   ones for 8081/8080/19001/6070, loopback hosts), the xDS server's address, JSON logs (the
//!   harness reads the listening addresses from them) and short xDS backoffs.
//! - The xDS server (`crates/sluice-test-kit/src/xds.rs`): EG's TLS (1.3 only, client certificate required),
//!   go-control-plane's re-push after a NACK, and EG's resources: domain `default/eg/http`, top
//!   descriptor key = value = the rule name, a `rule-0-match-0` header descriptor, then
//!   `masked_remote_address` / `remote_address` with the limit on the last node.
//! - Envoy: EG's filter (domain, 20 ms timeout, `DRAFT_VERSION_03` headers, fail open) with
//!   per-route descriptors, and a TLS 1.3 cluster to Sluice presenting a client certificate.
//!   EG's 20 ms can run out on a busy machine; such calls are Envoy's timeouts (a 504 it makes
//!   itself, the request let through) and are told apart from errors Sluice would cause.
//! - Certificates: RSA 2048, PKCS#1 keys, no EKU, one CA; the xDS server's names are EG's
//!   (plus `localhost`, the address the test dials), the rate limit service's CN is `*` with SAN
//!   `*.envoy-gateway-system`.

use std::borrow::Borrow;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::envoy::{Envoy, Upstream, http_status};
use crate::xds::*;
use crate::*;
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitUnit as U;

pub const DOMAIN: &str = "default/eg/http";
pub const RULE: &str = "httproute/default/backend/rule/0/match/0/*";
pub const NAMESPACE: &str = "envoy-gateway-system";
/// The warm-up route's rule, limited but never reached.
pub const OPEN_RULE: &str = "httproute/default/backend/rule/1/match/-1/*";
pub const OPEN_MATCH: &str = "rule-1-match--1";

/// EG's resource for one HTTPRoute rule limiting each client address that sends
/// `x-user-id: one` to `per_hour` requests an hour.
pub fn eg_snapshot(version: &str, per_hour: u32, unit: U) -> Snapshot {
    let remote = limited(node("remote_address", ""), unit, per_hour);
    let masked = with_children(node("masked_remote_address", "0.0.0.0/0"), vec![remote]);
    let header = with_children(node("rule-0-match-0", "rule-0-match-0"), vec![masked]);
    let top = with_children(node(RULE, RULE), vec![header]);
    // A second rule with no match (EG's `rule-<i>-match--1`): two levels, so EG's mapper gives
    // its series `domain`, `key1` and `key2`; the four-level rule above is dropped by that
    // mapper, as it is with upstream.
    let open = limited(node(OPEN_MATCH, OPEN_MATCH), U::Hour, 1_000_000);
    let open_rule = with_children(node(OPEN_RULE, OPEN_RULE), vec![open]);
    Snapshot::new(version, &[config(DOMAIN, DOMAIN, vec![top, open_rule])])
}

/// Envoy as EG configures it for that route.
pub fn eg_envoy_bootstrap(
    listener: u16,
    admin: u16,
    sluice: SocketAddr,
    app: SocketAddr,
    pki: &EgPki,
) -> String {
    let file = |name: &str| pki.path(name).display().to_string();
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: default/eg/http
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listener} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: http
          use_remote_address: true
          route_config:
            name: default/eg/http
            virtual_hosts:
            - name: default/eg/http/www_example_com
              domains: ["*"]
              routes:
              # A rule with no match, limited far above what the test sends: it opens Envoy's
              # TLS connection to Sluice before anything is measured.
              - name: {OPEN_RULE}
                match: {{ path: "/warm-up" }}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: {{ descriptor_key: "{OPEN_RULE}", descriptor_value: "{OPEN_RULE}" }}
                    - generic_key: {{ descriptor_key: "{OPEN_MATCH}", descriptor_value: "{OPEN_MATCH}" }}
              - name: {RULE}
                match: {{ prefix: "/" }}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: {{ descriptor_key: "{RULE}", descriptor_value: "{RULE}" }}
                    - header_value_match:
                        descriptor_key: rule-0-match-0
                        descriptor_value: rule-0-match-0
                        expect_match: true
                        headers:
                        - name: x-user-id
                          string_match: {{ exact: one }}
                    - masked_remote_address: {{ v4_prefix_mask_len: 0, v6_prefix_mask_len: 0 }}
                    - remote_address: {{}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {DOMAIN}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              failure_mode_deny: false
              timeout: 0.020s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: ratelimit_cluster }}
                  timeout: 0.020s
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 5s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {app_ip}, port_value: {app_port} }} }} }}
  - name: ratelimit_cluster
    type: STATIC
    connect_timeout: 10s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: ratelimit_cluster
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {rl_ip}, port_value: {rl_port} }} }} }}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context:
          tls_params: {{ tls_maximum_protocol_version: TLSv1_3 }}
          tls_certificates:
          - certificate_chain: {{ filename: "{envoy_cert}" }}
            private_key: {{ filename: "{envoy_key}" }}
          validation_context:
            trusted_ca: {{ filename: "{ca}" }}
"#,
        app_ip = app.ip(),
        app_port = app.port(),
        rl_ip = sluice.ip(),
        rl_port = sluice.port(),
        envoy_cert = file("envoy.crt"),
        envoy_key = file("envoy.key"),
        ca = file("ca.crt"),
    )
}

/// What the scenario gives the code that starts Sluice: EG's certificates (issued in
/// `pki.dir`, with EG's statsd_exporter mapping beside them), and the addresses Sluice is to use.
pub struct EgLaunch<'a> {
    pub pki: &'a EgPki,
    pub observers: Observers,
    xds_port: u16,
    redis_port: u16,
}

impl EgLaunch<'_> {
    /// EG's environment for Sluice (see the module comment for what a test has to change), with
    /// `certs` the directory holding `pki`'s files as Sluice sees it (EG's is `/certs`).
    pub fn environment(&self, certs: &Path) -> Vec<(String, String)> {
        let file = |name: &str| certs.join(name).display().to_string();
        let vars = [
            // EG's list.
            ("RUNTIME_ROOT", "/data".to_string()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".to_string()),
            ("RUNTIME_IGNOREDOTFILES", "true".to_string()),
            ("RUNTIME_WATCH_ROOT", "false".to_string()),
            ("LOG_LEVEL", "info".to_string()),
            ("USE_STATSD", "false".to_string()),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_string()),
            (
                "CONFIG_GRPC_XDS_SERVER_URL",
                format!("localhost:{}", self.xds_port),
            ),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_string()),
            ("GRPC_SERVER_USE_TLS", "true".to_string()),
            ("GRPC_SERVER_TLS_CERT", file("tls.crt")),
            ("GRPC_SERVER_TLS_KEY", file("tls.key")),
            ("GRPC_SERVER_TLS_CA_CERT", file("ca.crt")),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_string()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", file("tls.crt")),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", file("tls.key")),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", file("ca.crt")),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_string()),
            ("REDIS_SOCKET_TYPE", "tcp".to_string()),
            ("REDIS_URL", format!("127.0.0.1:{}", self.redis_port)),
            ("USE_PROMETHEUS", "true".to_string()),
            (
                "PROMETHEUS_ADDR",
                format!(":{}", self.observers.prometheus.port()),
            ),
            // EG mounts its mapping at /etc/statsd-exporter/conf.yaml; here it sits with the
            // certificates.
            ("PROMETHEUS_MAPPER_YAML", file(MAPPER)),
            // What a test changes: ports, hosts, log format, backoffs.
            ("GRPC_HOST", "127.0.0.1".to_string()),
            ("GRPC_PORT", free_port().to_string()),
            ("HOST", "127.0.0.1".to_string()),
            ("PORT", free_port().to_string()),
            ("DEBUG_HOST", "127.0.0.1".to_string()),
            ("DEBUG_PORT", self.observers.debug.port().to_string()),
            ("LOG_FORMAT", "json".to_string()),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms".to_string()),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "500ms".to_string()),
        ];
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// EG's statsd_exporter mapping, in `pki.dir`: the one shipped in deploy/grafana, which has
/// EG's shape.
const MAPPER: &str = "statsd-exporter-conf.yaml";

/// Where EG's tools read Sluice: Prometheus (EG's 19001) and the debug port (EG's 6070).
pub struct Observers {
    pub prometheus: SocketAddr,
    pub debug: SocketAddr,
}

/// Status and headers of one GET through Envoy with `x-user-id: one`.
fn get_limited(envoy: &Envoy) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(envoy.listener).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: www.example.com\r\nx-user-id: one\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    let status = raw.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, raw.to_ascii_lowercase())
}

/// Every call Envoy made to Sluice got Sluice's answer, or ran out of time: on Envoy's side,
/// or on Sluice's, which answers when a store call outlives the caller's deadline.
fn assert_only_envoy_timeouts(envoy: &Envoy, observers: &Observers) {
    // EG's 20 ms is short for a busy test machine: a call Envoy gave up on is let through
    // (EG fails open) and counted as an error with an Envoy-made 504. Sluice, bounding its
    // store calls by the caller's deadline (`grpc-timeout`, #28), may answer just before that:
    // `DEADLINE_EXCEEDED` since #40 (`sluice_calls_deadline_too_short_total`: the deadline was
    // below its floor, or ran out while the store answered), `UNAVAILABLE` counted as a failed
    // store call before (upstream's `redis_error`; Redis stays up in this test, so each is a late
    // one). Those are the machine's; any other error would be Sluice's (another status, a
    // reset), and there must be none.
    let rl = envoy.ratelimit_stats();
    let timed_out = envoy.stat("cluster.ratelimit_cluster.internal.upstream_rq_504");
    let (_, stats) = http_request(observers.debug, "GET", "/stats", "");
    let (_, metrics) = http_request(observers.prometheus, "GET", "/metrics", "");
    let late_in_sluice: u64 = stats
        .lines()
        .filter_map(|l| l.strip_prefix("ratelimit.service.call.should_rate_limit.redis_error: "))
        .chain(
            metrics
                .lines()
                .filter(|l| l.starts_with("sluice_calls_deadline_too_short_total"))
                .filter_map(|l| l.rsplit(' ').next()),
        )
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        .sum();
    let cluster: Vec<String> = envoy
        .stats()
        .into_iter()
        .filter(|(name, value)| name.starts_with("cluster.ratelimit_cluster.") && *value > 0)
        .map(|(name, value)| format!("{name}: {value}"))
        .collect();
    assert!(
        rl.error >= timed_out && rl.error <= timed_out + late_in_sluice,
        "{rl:?}: {timed_out} timed out in Envoy, {late_in_sluice} late in Sluice\n{cluster:#?}"
    );
    assert_eq!(rl.failure_mode_allowed, rl.error, "{rl:?}");
}

/// The whole scenario: EG's certificates, xDS server and Redis, Sluice started by `start`, Envoy
/// in front; then the limits, updates under traffic, a NACK, the xDS server's absence, and what
/// EG's tools read.
// Long because it is one story told in order: each step depends on the state the last left.
pub fn run_scenario<S: Borrow<Sluice>>(start: impl FnOnce(&EgLaunch) -> S) {
    // One scenario at a time in a process: two Envoys each with a 20 ms timeout on one
    // machine time out calls neither would alone (tests/gateway/main.rs).
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let pki = EgPki::new();
    let eg_names = [
        "envoy-gateway".to_string(),
        format!("envoy-gateway.{NAMESPACE}"),
        format!("envoy-gateway.{NAMESPACE}.svc"),
        format!("envoy-gateway.{NAMESPACE}.svc.cluster.local"),
        "localhost".to_string(),
    ];
    let eg_names: Vec<&str> = eg_names.iter().map(String::as_str).collect();
    pki.issue("envoy-gateway", "envoy-gateway", &eg_names);
    let wildcard = format!("*.{NAMESPACE}");
    // EG's secret for the rate limit service (`/certs/tls.crt`, `tls.key`) and for Envoy.
    pki.issue("tls", "*", &[&wildcard]);
    pki.issue("envoy", "*", &[&wildcard]);

    let mut xds = AdsServer::start(Some(AdsTls {
        cert: pki.path("envoy-gateway.crt"),
        key: pki.path("envoy-gateway.key"),
        client_ca: pki.path("ca.crt"),
    }));
    xds.set(eg_snapshot("1", 3, U::Hour));
    let redis = RedisServer::start();
    std::fs::write(
        pki.path(MAPPER),
        include_str!("../../../deploy/grafana/ratelimit-mapper.yaml"),
    )
    .unwrap();
    let launch = EgLaunch {
        pki: &pki,
        observers: Observers {
            prometheus: SocketAddr::from(([127, 0, 0, 1], free_port())),
            debug: SocketAddr::from(([127, 0, 0, 1], free_port())),
        },
        xds_port: xds.addr.port(),
        redis_port: redis.port,
    };
    let running = start(&launch);
    let sluice: &Sluice = running.borrow();
    let observers = &launch.observers;
    let first = xds.wait_for_request(|r| r.version_info.is_empty());
    assert_eq!(first.node.unwrap().id, "envoy-ratelimit");
    xds.wait_for_request(|r| r.version_info == "1" && r.error_detail.is_none());

    let app = Upstream::start();
    let envoy = Envoy::start_bootstrap(
        |listener, admin| eg_envoy_bootstrap(listener, admin, sluice.grpc, app.addr, &pki),
        "ratelimit_cluster",
        sluice.grpc,
        app.addr,
    );

    wait_until("Envoy's connection to Sluice", || {
        http_status(envoy.listener, "/warm-up", &[]);
        envoy.ratelimit_stats().ok > 0
    });
    // Limits exact: 3 a window for this client on this rule, with EG's draft-03 headers. EG's
    // 20 ms can run out on a busy machine, and a call Envoy gave up on is let through, so an
    // attempt with a timeout cannot be judged: it is tried again on a fresh counter (a longer
    // window, so a new key), at most five times (the debug binary in a container, as the image
    // tests run it, can need more than three on a busy machine).
    let attempts = [
        (U::Hour, "HOUR", 3600),
        (U::Day, "DAY", 86400),
        (U::Week, "WEEK", 604_800),
        (U::Month, "MONTH", 2_592_000),
        (U::Year, "YEAR", 31_536_000),
    ];
    let mut judged = None;
    for (attempt, (unit, unit_name, window)) in attempts.into_iter().enumerate() {
        if attempt > 0 {
            let version = format!("1.{attempt}");
            xds.set(eg_snapshot(&version, 3, unit));
            xds.wait_for_request(|r| r.version_info == version && r.error_detail.is_none());
            wait_until("the fresh window in force", || {
                let (_, rlconfig) = http_request(observers.debug, "GET", "/rlconfig", "");
                rlconfig.contains(&format!("unit={unit_name} requests_per_unit=3"))
            });
        }
        let before = envoy.ratelimit_stats();
        let answers: Vec<(u16, String)> = (0..5).map(|_| get_limited(&envoy)).collect();
        if envoy.ratelimit_stats().error == before.error {
            judged = Some((answers, window));
            break;
        }
        eprintln!("attempt {attempt}: Envoy's 20 ms ran out; trying a fresh counter");
    }
    let (answers, window) =
        judged.expect("Envoy's 20 ms ran out in five attempts: too busy a machine to judge");
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{}", envoy.log());
    assert!(
        answers[3]
            .1
            .contains(&format!("x-ratelimit-limit: 3, 3;w={window}")),
        "{}",
        answers[3].1
    );
    assert!(
        answers[3].1.contains("x-ratelimit-remaining: 0"),
        "{}",
        answers[3].1
    );
    assert_eq!(
        http_status(envoy.listener, "/", &[("x-user-id", "two")]),
        200
    );

    // v2 raises the limit while requests flow: every answer is a decision (200 or 429), never
    // an error, and no request that starts after v2 is in force (as the debug port's
    // /rlconfig, which reads the limiter's active config, shows it) is refused.
    let statuses = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    let status = get_limited(&envoy).0;
                    statuses.lock().unwrap().push((started, status));
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        xds.set(eg_snapshot("2", 100_000, U::Hour));
        xds.wait_for_request(|r| r.version_info == "2" && r.error_detail.is_none());
        wait_until("v2 in force", || {
            let (_, rlconfig) = http_request(observers.debug, "GET", "/rlconfig", "");
            rlconfig.contains("requests_per_unit=100000")
        });
        // Seen in force by now: any request started later is decided under v2.
        let applied = Instant::now();
        std::thread::sleep(Duration::from_millis(500));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let statuses = statuses.lock().unwrap();
        let other: Vec<_> = statuses
            .iter()
            .filter(|(_, s)| *s != 200 && *s != 429)
            .collect();
        assert!(
            other.is_empty(),
            "failed requests under an update: {other:?}"
        );
        assert!(
            statuses.iter().any(|(_, s)| *s == 429),
            "v1 was not in force before v2"
        );
        let late_429 = statuses
            .iter()
            .filter(|(at, s)| *at > applied && *s == 429)
            .count();
        assert_eq!(late_429, 0, "refusals that started after v2 was in force");
        assert!(
            statuses
                .iter()
                .filter(|(at, s)| *at > applied && *s == 200)
                .count()
                > 0
        );
    });
    assert_only_envoy_timeouts(&envoy, observers);

    // A bad snapshot is NACKed and v2 stays.
    xds.set(eg_snapshot("3", 5, U::Unknown));
    let nack = xds.wait_for_request(|r| r.error_detail.is_some());
    assert_eq!(nack.version_info, "2");
    assert!(
        nack.error_detail
            .unwrap()
            .message
            .starts_with("default/eg/http: invalid rate limit unit")
    );
    assert_eq!(get_limited(&envoy).0, 200);

    // The xDS server goes away: Sluice keeps answering from v2; the next version (1 an hour, so
    // this client is over it at once: counters survived every update) arrives after the server
    // returns.
    xds.set(eg_snapshot("2", 100_000, U::Hour));
    xds.stop();
    for _ in 0..3 {
        assert_eq!(get_limited(&envoy).0, 200);
    }
    xds.set(eg_snapshot("4", 1, U::Hour));
    xds.restart();
    xds.wait_for_request(|r| r.version_info == "4" && r.error_detail.is_none());
    wait_until("v4 in force", || get_limited(&envoy).0 == 429);
    assert_only_envoy_timeouts(&envoy, observers);

    // ----- Observability, as EG reads it: `egctl x config ratelimit` reads `/rlconfig` on the
    // debug port (upstream's line format), EG's dashboards read `ratelimit_service_rate_limit_*`
    // with labels `domain`, `key1`, `key2` from Prometheus.
    let (status, rlconfig) = http_request(observers.debug, "GET", "/rlconfig", "");
    assert_eq!(status, 200);
    let line = rlconfig
        .lines()
        .find(|l| l.starts_with(DOMAIN) && l.contains("remote_address"))
        .unwrap_or_else(|| panic!("no EG limit in /rlconfig:\n{rlconfig}"));
    assert!(line.contains("unit=HOUR requests_per_unit=1"), "{line}");
    assert!(line.contains(RULE), "{line}");
    let (status, metrics) = http_request(observers.prometheus, "GET", "/metrics", "");
    assert_eq!(status, 200);
    let key1 = format!("{OPEN_RULE}_{OPEN_RULE}");
    let key2 = format!("{OPEN_MATCH}_{OPEN_MATCH}");
    let total_hits = metrics
        .lines()
        .find(|l| {
            l.starts_with("ratelimit_service_rate_limit_total_hits{")
                && l.contains(&format!("domain=\"{DOMAIN}\""))
                && l.contains(&format!("key1=\"{key1}\""))
                && l.contains(&format!("key2=\"{key2}\""))
        })
        .unwrap_or_else(|| panic!("no total_hits series for the two-level rule:\n{metrics}"));
    let value: f64 = total_hits.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 1.0, "{total_hits}");
    // The four-level rule: counted under upstream's name (the debug port's /stats), dropped by
    // EG's mapper as upstream's Prometheus sink drops it.
    let (status, stats) = http_request(observers.debug, "GET", "/stats", "");
    assert_eq!(status, 200);
    assert!(
        stats.lines().any(|l| l.starts_with(&format!(
            "ratelimit.service.rate_limit.{DOMAIN}.{RULE}_{RULE}.rule-0-match-0_rule-0-match-0."
        )) && l.contains(".over_limit: ")),
        "{stats}"
    );
    assert!(
        !metrics.contains("rule-0-match-0"),
        "EG's mapper drops four-level keys:\n{metrics}"
    );
}
