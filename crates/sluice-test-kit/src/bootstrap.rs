//! Envoy bootstraps made for a test, where the shipped ones (`envoy::shipped_config`) do not
//! have what the test needs: a listener whose routes send rate limit descriptors to a `sluice`
//! cluster (one Sluice or several) through one or more ratelimit filters, or whose requests
//! Sluice decides as the quota server of a `rate_limit_quota` filter (RLQS), and an upstream
//! cluster per route, all on loopback. One builder instead of a hand-written YAML per test, so
//! the parts every test shares (the HTTP/2 cluster to Sluice, its gRPC health check, the
//! filter's service) are written once; what a test varies is said by its calls.
//!
//! ```text
//! let yaml = Bootstrap::new("costly", &[sluice.grpc], app.addr)
//!     .route(Route::to("app").prefix("/costly").per_filter(PER_ROUTE))
//!     .yaml(listener, admin);
//! ```

use std::net::SocketAddr;

/// One route: requests whose path starts with `prefix` go to the upstream cluster `cluster`
/// (made by the bootstrap, pointing at the test's upstream), with the route's `rate_limits`
/// and `typed_per_filter_config`, each YAML written from column 0 (the builder indents it), or
/// empty for none.
#[derive(Clone, Copy, Debug)]
pub struct Route<'a> {
    pub prefix: &'a str,
    pub cluster: &'a str,
    /// The route's `rate_limits`: a YAML list.
    pub rate_limits: &'a str,
    /// The route's `typed_per_filter_config`: a YAML mapping from filter name to config.
    pub per_filter: &'a str,
}

impl<'a> Route<'a> {
    /// All requests (`/`) to `cluster`, no rate limits of the route's own.
    pub fn to(cluster: &'a str) -> Route<'a> {
        Route {
            prefix: "/",
            cluster,
            rate_limits: "",
            per_filter: "",
        }
    }

    pub fn prefix(self, prefix: &'a str) -> Route<'a> {
        Route { prefix, ..self }
    }

    pub fn rate_limits(self, rate_limits: &'a str) -> Route<'a> {
        Route {
            rate_limits,
            ..self
        }
    }

    pub fn per_filter(self, per_filter: &'a str) -> Route<'a> {
        Route { per_filter, ..self }
    }
}

/// One `envoy.filters.http.ratelimit` filter of the listener, asking the `sluice` cluster.
#[derive(Clone, Copy, Debug)]
pub struct Filter<'a> {
    /// The filter's name, which a route's `typed_per_filter_config` refers to.
    pub name: &'a str,
    /// Which routes' `rate_limits` it applies (those of its stage); none written: stage 0.
    pub stage: Option<u32>,
    pub failure_mode_deny: bool,
    /// `enable_x_ratelimit_headers: DRAFT_VERSION_03`.
    pub x_ratelimit_headers: bool,
}

impl<'a> Filter<'a> {
    /// A filter named `name` failing open, stage 0, no headers.
    pub fn named(name: &'a str) -> Filter<'a> {
        Filter {
            name,
            stage: None,
            failure_mode_deny: false,
            x_ratelimit_headers: false,
        }
    }
}

/// One `envoy.filters.http.rate_limit_quota` filter (RLQS) of the listener, reporting to the
/// `sluice` cluster in the bootstrap's domain. Its bucket matcher has no match list: every
/// request falls to `on_no_match`, whose settings build the bucket id from request headers
/// (a request without one of them lands in no bucket, and the filter lets it through).
#[derive(Clone, Copy, Debug)]
pub struct QuotaFilter<'a> {
    /// The bucket id: for each `(key, header)`, the id's entry `key` is the request's `header`.
    pub bucket_id: &'a [(&'a str, &'a str)],
    /// How often the bucket's usage is reported (Envoy 1.40 reports every 5 s whatever it says).
    pub reporting_interval: &'a str,
    /// The `blanket_rule` applied until Sluice assigns the bucket something.
    pub no_assignment: &'a str,
    /// The `blanket_rule` applied once an assignment expired without a new one.
    pub expired_assignment: &'a str,
}

impl<'a> QuotaFilter<'a> {
    /// Buckets by `bucket_id`, reported every second, everything allowed while Sluice has not
    /// assigned a bucket or its assignment expired: a Sluice away never refuses a request.
    pub fn by_headers(bucket_id: &'a [(&'a str, &'a str)]) -> QuotaFilter<'a> {
        QuotaFilter {
            bucket_id,
            reporting_interval: "1s",
            no_assignment: "ALLOW_ALL",
            expired_assignment: "ALLOW_ALL",
        }
    }
}

/// A bootstrap for one test: an admin interface, a listener with its routes, ratelimit filters
/// and optional quota filter, the `sluice` cluster and one upstream cluster per route.
#[derive(Clone, Debug)]
pub struct Bootstrap<'a> {
    domain: &'a str,
    timeout: &'a str,
    sluices: Vec<SocketAddr>,
    app: SocketAddr,
    routes: Vec<Route<'a>>,
    filters: Vec<Filter<'a>>,
    quota: Option<QuotaFilter<'a>>,
    health_check: bool,
    use_remote_address: Option<bool>,
}

impl<'a> Bootstrap<'a> {
    /// Descriptors of `domain` to the Sluices at `sluices` (Envoy's default balancing, round
    /// robin, when there are several), the routes' upstreams at `app`. Until said otherwise:
    /// one filter `envoy.filters.http.ratelimit` failing open, a 5 s filter timeout (see
    /// `envoy::RATELIMIT_TIMEOUT`), Sluice's gRPC health checked every second, no route.
    pub fn new(domain: &'a str, sluices: &[SocketAddr], app: SocketAddr) -> Bootstrap<'a> {
        Bootstrap {
            domain,
            timeout: "5s",
            sluices: sluices.to_vec(),
            app,
            routes: Vec::new(),
            filters: vec![Filter::named("envoy.filters.http.ratelimit")],
            quota: None,
            health_check: true,
            use_remote_address: None,
        }
    }

    /// The filters' `timeout` for Sluice's answer.
    pub fn timeout(self, timeout: &'a str) -> Self {
        Bootstrap { timeout, ..self }
    }

    /// Replaces the filters, in the order they run.
    pub fn filters(self, filters: &[Filter<'a>]) -> Self {
        Bootstrap {
            filters: filters.to_vec(),
            ..self
        }
    }

    /// Adds a `rate_limit_quota` filter, run before the ratelimit filters (`filters(&[])` for
    /// none: Sluice then decides only as the quota server).
    pub fn quota_filter(self, quota: QuotaFilter<'a>) -> Self {
        Bootstrap {
            quota: Some(quota),
            ..self
        }
    }

    /// Adds a route, after the ones already added (Envoy takes the first that matches).
    pub fn route(mut self, route: Route<'a>) -> Self {
        self.routes.push(route);
        self
    }

    /// Adds routes, in order.
    pub fn routes(mut self, routes: &[Route<'a>]) -> Self {
        self.routes.extend_from_slice(routes);
        self
    }

    /// No health check of the `sluice` cluster: Envoy sends to every Sluice whatever its
    /// health says.
    pub fn without_health_check(self) -> Self {
        Bootstrap {
            health_check: false,
            ..self
        }
    }

    /// The connection manager's `use_remote_address` (unset: Envoy's default, false).
    pub fn use_remote_address(self, on: bool) -> Self {
        Bootstrap {
            use_remote_address: Some(on),
            ..self
        }
    }

    /// The YAML, with the listener and the admin interface on the given loopback ports.
    pub fn yaml(&self, listener: u16, admin: u16) -> String {
        let remote = self
            .use_remote_address
            .map(|on| format!("\n                use_remote_address: {on}"))
            .unwrap_or_default();
        format!(
            r#"
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
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress{remote}
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
{routes}
                http_filters:
{filters}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{sluice}
{upstreams}
"#,
            routes = indent(&self.routes_yaml(), 24),
            filters = indent(&self.filters_yaml(), 18),
            sluice = indent(&self.sluice_cluster(), 4),
            upstreams = indent(&self.upstream_clusters(), 4),
        )
    }

    fn routes_yaml(&self) -> String {
        let mut yaml = String::new();
        for r in &self.routes {
            yaml.push_str(&format!(
                "- match: {{ prefix: \"{}\" }}\n  route:\n    cluster: {}\n",
                r.prefix, r.cluster
            ));
            if !r.rate_limits.is_empty() {
                yaml.push_str("    rate_limits:\n");
                yaml.push_str(&indent(r.rate_limits, 6));
                yaml.push('\n');
            }
            if !r.per_filter.is_empty() {
                yaml.push_str("  typed_per_filter_config:\n");
                yaml.push_str(&indent(r.per_filter, 4));
                yaml.push('\n');
            }
        }
        yaml
    }

    fn filters_yaml(&self) -> String {
        let mut yaml = self.quota.map(|q| self.quota_yaml(&q)).unwrap_or_default();
        for f in &self.filters {
            let stage = f
                .stage
                .map(|s| format!("\n    stage: {s}"))
                .unwrap_or_default();
            let headers = if f.x_ratelimit_headers {
                "\n    enable_x_ratelimit_headers: DRAFT_VERSION_03"
            } else {
                ""
            };
            yaml.push_str(&format!(
                r#"- name: {name}
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
    domain: {domain}{stage}
    timeout: {timeout}
    failure_mode_deny: {deny}{headers}
    rate_limit_service:
      transport_api_version: V3
      grpc_service:
        envoy_grpc: {{ cluster_name: sluice }}
"#,
                name = f.name,
                domain = self.domain,
                timeout = self.timeout,
                deny = f.failure_mode_deny,
            ));
        }
        yaml
    }

    /// The `rate_limit_quota` filter entry of `quota`.
    fn quota_yaml(&self, quota: &QuotaFilter) -> String {
        let id: String = quota
            .bucket_id
            .iter()
            .map(|(key, header)| {
                format!(
                    r#"{key}:
  custom_value:
    name: {key}
    typed_config:
      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
      header_name: {header}
"#
                )
            })
            .collect();
        format!(
            r#"- name: envoy.filters.http.rate_limit_quota
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
    rlqs_server:
      envoy_grpc: {{ cluster_name: sluice }}
    domain: {domain}
    bucket_matchers:
      on_no_match:
        action:
          name: rate_limit_quota
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
            bucket_id_builder:
              bucket_id_builder:
{id}
            reporting_interval: {interval}
            no_assignment_behavior:
              fallback_rate_limit: {{ blanket_rule: {no_assignment} }}
            expired_assignment_behavior:
              fallback_rate_limit: {{ blanket_rule: {expired} }}
"#,
            domain = self.domain,
            id = indent(&id, 16),
            interval = quota.reporting_interval,
            no_assignment = quota.no_assignment,
            expired = quota.expired_assignment,
        )
    }

    /// The `sluice` cluster: HTTP/2 to each Sluice, health-checked over gRPC unless said not.
    fn sluice_cluster(&self) -> String {
        let health = if self.health_check {
            "
health_checks:
  - timeout: 1s
    interval: 1s
    unhealthy_threshold: 2
    healthy_threshold: 1
    grpc_health_check: { service_name: ratelimit }"
        } else {
            ""
        };
        format!(
            r#"- name: sluice
  type: STATIC
  connect_timeout: 1s
  typed_extension_protocol_options:
    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
      "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
      explicit_http_config: {{ http2_protocol_options: {{}} }}
  load_assignment:
    cluster_name: sluice
    endpoints:
      - lb_endpoints:
{endpoints}{health}"#,
            endpoints = indent(&endpoints(&self.sluices), 10),
            health = indent(health, 2),
        )
    }

    /// One cluster per distinct route cluster, each the test's upstream.
    fn upstream_clusters(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for r in &self.routes {
            if !names.contains(&r.cluster) {
                names.push(r.cluster);
            }
        }
        names
            .iter()
            .map(|name| {
                format!(
                    "- name: {name}\n  type: STATIC\n  connect_timeout: 1s\n  load_assignment:\n    \
                     cluster_name: {name}\n    endpoints:\n      - lb_endpoints:\n{}",
                    indent(&endpoints(&[self.app]), 10)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `lb_endpoints` entries for `addrs`.
fn endpoints(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| {
            format!(
                "- endpoint:\n    address:\n      socket_address: {{ address: {}, port_value: {} }}",
                a.ip(),
                a.port()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` with every non-empty line indented by `n` more spaces (empty lines left empty).
pub fn indent(text: &str, n: usize) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use yaml_rust2::{Yaml, YamlLoader};

    /// The parts land under the keys Envoy reads them from (Envoy itself reads the whole in the
    /// tests that start it): routes, filters, both kinds of cluster.
    #[test]
    fn parts_land_under_their_keys() {
        let sluices: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:5".parse().unwrap(),
        ];
        let app: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let text = Bootstrap::new("d", &sluices, app)
            .timeout("0.5s")
            .route(Route::to("a").rate_limits("- actions: [{ remote_address: {} }]"))
            .route(
                Route::to("b")
                    .prefix("/b")
                    .per_filter("envoy.filters.http.ratelimit: { \"@type\": x }"),
            )
            .yaml(3, 4);
        let yaml = &YamlLoader::load_from_str(&text).unwrap()[0];
        let listener = &yaml["static_resources"]["listeners"][0];
        assert_eq!(
            listener["address"]["socket_address"]["port_value"],
            Yaml::Integer(3)
        );
        let manager = &listener["filter_chains"][0]["filters"][0]["typed_config"];
        let routes = &manager["route_config"]["virtual_hosts"][0]["routes"];
        assert_eq!(routes[0]["route"]["cluster"].as_str(), Some("a"));
        assert!(routes[0]["route"]["rate_limits"][0]["actions"].is_array());
        assert_eq!(routes[1]["match"]["prefix"].as_str(), Some("/b"));
        assert!(
            !routes[1]["typed_per_filter_config"]["envoy.filters.http.ratelimit"].is_badvalue()
        );
        let filter = &manager["http_filters"][0]["typed_config"];
        assert_eq!(filter["domain"].as_str(), Some("d"));
        assert_eq!(filter["timeout"].as_str(), Some("0.5s"));
        assert_eq!(
            manager["http_filters"][1]["name"].as_str(),
            Some("envoy.filters.http.router")
        );
        let clusters = yaml["static_resources"]["clusters"].as_vec().unwrap();
        let names: Vec<&str> = clusters
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["sluice", "a", "b"]);
        let sluice_hosts = &clusters[0]["load_assignment"]["endpoints"][0]["lb_endpoints"];
        assert_eq!(sluice_hosts.as_vec().unwrap().len(), 2);
        assert!(
            clusters[0]["health_checks"][0]["grpc_health_check"]
                .as_hash()
                .is_some()
        );
        let upstream = &clusters[1]["load_assignment"]["endpoints"][0]["lb_endpoints"][0];
        let address = &upstream["endpoint"]["address"]["socket_address"];
        assert_eq!(address["port_value"], Yaml::Integer(2));
        assert_eq!(
            yaml["admin"]["address"]["socket_address"]["port_value"],
            Yaml::Integer(4)
        );
    }

    fn parse(text: &str) -> Yaml {
        YamlLoader::load_from_str(text).unwrap().remove(0)
    }

    fn http_filters(yaml: &Yaml) -> &Yaml {
        let listener = &yaml["static_resources"]["listeners"][0];
        &listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    }

    /// A quota filter reports to the `sluice` cluster in the bootstrap's domain, every request
    /// in a bucket whose id is read from the headers named, allowed while unassigned or expired;
    /// it runs before any ratelimit filter, and alone with `filters(&[])`.
    #[test]
    fn a_quota_filter_buckets_requests_by_their_headers() {
        let at: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let ids = [("tenant", "x-tenant"), ("plan", "x-plan")];
        let both = Bootstrap::new("q", &[at], at)
            .quota_filter(QuotaFilter::by_headers(&ids))
            .route(Route::to("backend"));
        let yaml = parse(&both.yaml(3, 4));
        let names: Vec<&str> = http_filters(&yaml)
            .as_vec()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "envoy.filters.http.rate_limit_quota",
                "envoy.filters.http.ratelimit",
                "envoy.filters.http.router"
            ]
        );
        let quota = &http_filters(&yaml)[0]["typed_config"];
        assert_eq!(
            quota["@type"].as_str(),
            Some(
                "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
            )
        );
        assert_eq!(
            quota["rlqs_server"]["envoy_grpc"]["cluster_name"].as_str(),
            Some("sluice")
        );
        assert_eq!(quota["domain"].as_str(), Some("q"));
        let settings = &quota["bucket_matchers"]["on_no_match"]["action"]["typed_config"];
        let id = &settings["bucket_id_builder"]["bucket_id_builder"];
        for (key, header) in ids {
            let value = &id[key]["custom_value"];
            assert_eq!(value["name"].as_str(), Some(key));
            assert_eq!(value["typed_config"]["header_name"].as_str(), Some(header));
        }
        assert_eq!(settings["reporting_interval"].as_str(), Some("1s"));
        for behavior in ["no_assignment_behavior", "expired_assignment_behavior"] {
            let rule = &settings[behavior]["fallback_rate_limit"]["blanket_rule"];
            assert_eq!(rule.as_str(), Some("ALLOW_ALL"), "{behavior}");
        }

        let alone = parse(&both.filters(&[]).without_health_check().yaml(3, 4));
        let filters = http_filters(&alone).as_vec().unwrap();
        assert_eq!(filters.len(), 2, "{filters:?}");
        assert_eq!(
            filters[0]["name"].as_str(),
            Some("envoy.filters.http.rate_limit_quota")
        );
        let sluice = &alone["static_resources"]["clusters"][0];
        assert!(sluice["health_checks"].is_badvalue(), "{sluice:?}");
    }

    /// A filter failing closed with Envoy's own headers, and a route whose rate limits span
    /// several lines (a descriptor Envoy keeps out of its headers, `x_ratelimit_option`): each
    /// field lands where Envoy reads it.
    #[test]
    fn rate_limits_of_several_lines_keep_their_nesting() {
        let at: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let filter = Filter {
            stage: Some(1),
            failure_mode_deny: true,
            x_ratelimit_headers: true,
            ..Filter::named("closed")
        };
        let rate_limits = r#"- actions:
    - generic_key: { descriptor_key: internal, descriptor_value: all }
  x_ratelimit_option: "OFF"
- actions:
    - request_headers: { header_name: x-user, descriptor_key: user }"#;
        let yaml = parse(
            &Bootstrap::new("h", &[at], at)
                .filters(&[filter])
                .route(Route::to("backend").rate_limits(rate_limits))
                .yaml(3, 4),
        );
        let config = &http_filters(&yaml)[0]["typed_config"];
        assert_eq!(config["stage"], Yaml::Integer(1));
        assert_eq!(config["failure_mode_deny"], Yaml::Boolean(true));
        assert_eq!(
            config["enable_x_ratelimit_headers"].as_str(),
            Some("DRAFT_VERSION_03")
        );
        let listener = &yaml["static_resources"]["listeners"][0];
        let manager = &listener["filter_chains"][0]["filters"][0]["typed_config"];
        let route = &manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        let limits = &route["rate_limits"];
        assert_eq!(limits.as_vec().map(Vec::len), Some(2), "{route:?}");
        assert_eq!(limits[0]["x_ratelimit_option"].as_str(), Some("OFF"));
        let internal = &limits[0]["actions"][0]["generic_key"];
        assert_eq!(internal["descriptor_value"].as_str(), Some("all"));
        let user = &limits[1]["actions"][0]["request_headers"];
        assert_eq!(user["header_name"].as_str(), Some("x-user"));
        assert!(limits[1]["x_ratelimit_option"].is_badvalue());
    }
}
