//! Checks of the deployment files under `deploy/`, offline (no network, no helm, no Envoy):
//!
//! * every YAML file that is not a Helm template parses, and the Grafana dashboards parse and
//!   query only metrics Sluice exports;
//! * the files agree with each other and with the image: ports, config directory, rate limit
//!   domain, and the descriptors Envoy sends have a limit in the configs it is paired with.
//!
//! Each assertion says which files disagree and on what, so a change in one place that was
//! not made in the others fails here with the fix in the message.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn read(path: &str) -> String {
    let full = root().join(path);
    fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// Every document of a YAML file; empty documents (a comment-only prefix) are dropped.
fn yaml_docs(path: &str) -> Vec<Yaml> {
    let docs = YamlLoader::load_from_str(&read(path))
        .unwrap_or_else(|e| panic!("{path} is not valid YAML: {e}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn yaml_one(path: &str) -> Yaml {
    let mut docs = yaml_docs(path);
    assert_eq!(
        docs.len(),
        1,
        "{path}: expected one YAML document, found {}",
        docs.len()
    );
    docs.remove(0)
}

/// Files under `dir` (recursively), sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot list {}: {e}", d.display()))
        {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Every hash anywhere in `node` (depth first, document order).
fn all_hashes<'a>(node: &'a Yaml, out: &mut Vec<&'a Yaml>) {
    match node {
        Yaml::Hash(h) => {
            out.push(node);
            for v in h.values() {
                all_hashes(v, out);
            }
        }
        Yaml::Array(a) => a.iter().for_each(|v| all_hashes(v, out)),
        _ => {}
    }
}

fn str_at<'a>(node: &'a Yaml, path: &[&str], file: &str) -> &'a str {
    let mut n = node;
    for k in path {
        n = &n[*k];
    }
    n.as_str()
        .unwrap_or_else(|| panic!("{file}: {} is not a string (found {n:?})", path.join(".")))
}

fn int_at(node: &Yaml, path: &[&str], file: &str) -> i64 {
    let mut n = node;
    for k in path {
        n = &n[*k];
    }
    n.as_i64()
        .unwrap_or_else(|| panic!("{file}: {} is not an integer (found {n:?})", path.join(".")))
}

/// A duration as Envoy (`0.02s`) or Go (`15ms`, `1s`) writes it, in microseconds.
fn duration_us(text: &str) -> u64 {
    let text = text.trim();
    let (number, unit) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1_000.0)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000_000.0)
    } else {
        panic!("unsupported duration {text:?} (expected Ns, Nms or Nus)")
    };
    let n: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("bad duration {text:?}"));
    (n * unit).round() as u64
}

// ------------------------------------------------------------------------------------------
// Fixed points
// ------------------------------------------------------------------------------------------

const GRPC_PORT: i64 = 8081;
const HTTP_PORT: i64 = 8080;
const ENVOY: &str = "deploy/envoy/envoy.yaml";
const LIMITS: &str = "deploy/envoy/limits.yaml";
const ISTIO: &str = "deploy/istio/envoyfilter.yaml";
const VALUES: &str = "deploy/helm/sluice/values.yaml";
const DEPLOYMENT_TPL: &str = "deploy/helm/sluice/templates/deployment.yaml";
const DOCKERFILE: &str = "deploy/docker/Dockerfile";

/// What Sluice exports on GET /metrics (docs/operators.md, Metrics). Counters and gauges by name.
const SERIES: &[&str] = &[
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_over_limit",
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_within_limit",
    "ratelimit_service_rate_limit_shadow_mode",
    "ratelimit_service_config_load_success",
    "ratelimit_service_config_load_error",
    "ratelimit_service_global_shadow_mode",
    "ratelimit_service_should_rate_limit_error",
    "ratelimit_service_total_requests",
    "sluice_failed_open_total",
    "sluice_circuit_breaker_open",
    "sluice_serving_degraded",
    "sluice_memory_store_entries",
    "sluice_memory_store_evictions_total",
    "sluice_store_errors_total",
    "sluice_connections_open",
    "sluice_connections_rejected_total",
    "sluice_connections_closed_total",
    "sluice_descriptors_refused_total",
    "sluice_long_descriptor_parts_total",
    "sluice_script_errors_total",
    "sluice_request_bytes_held",
    "sluice_requests_waiting",
    "sluice_requests_ended_total",
    "sluice_memory_resident_bytes",
    "sluice_memory_limit_bytes",
    "sluice_overload_action_active",
    "sluice_overload_actions_total",
    "sluice_rlqs_streams",
    "sluice_rlqs_refused_total",
    "sluice_rlqs_assignments_total",
    "sluice_rlqs_requests_total",
    "sluice_rlqs_reports_total",
    "sluice_admin_calls_total",
    "sluice_admin_counters_reset_total",
    "sluice_decision_log_lines_total",
    "sluice_concurrency_releases_total",
];
/// Histograms: only their `_bucket`, `_sum` and `_count` series exist.
const HISTOGRAMS: &[&str] = &[
    "ratelimit_service_response_time_seconds",
    "sluice_store_call_seconds",
];

// ------------------------------------------------------------------------------------------
// (a) Files parse
// ------------------------------------------------------------------------------------------

#[test]
fn every_deploy_yaml_file_parses() {
    let templates = root().join("deploy/helm/sluice/templates");
    let mut checked = Vec::new();
    for path in files_under(&root().join("deploy")) {
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if !is_yaml || path.starts_with(&templates) {
            continue;
        }
        let text = fs::read_to_string(&path).expect("readable");
        let docs = YamlLoader::load_from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", rel(&path)));
        assert!(
            docs.iter().any(|d| !d.is_null()),
            "{} holds no YAML document",
            rel(&path)
        );
        checked.push(rel(&path));
    }
    for expected in [
        ENVOY,
        LIMITS,
        ISTIO,
        VALUES,
        "deploy/helm/sluice/Chart.yaml",
    ] {
        assert!(
            checked.iter().any(|c| c == expected),
            "{expected} was not found among the checked YAML files {checked:?}"
        );
    }
    // The chart's limits are YAML inside YAML: each must parse too.
    let values = yaml_one(VALUES);
    for (file, content) in values["limits"]
        .as_hash()
        .expect("values.yaml: limits is a map")
    {
        let file = file.as_str().expect("limits: file names are strings");
        if let Some(text) = content.as_str() {
            YamlLoader::load_from_str(text)
                .unwrap_or_else(|e| panic!("{VALUES}: limits.{file} is not valid YAML: {e}"));
        }
    }
}

/// Identifiers of a PromQL expression outside string literals (metric, label and function
/// names; `$variables` give their name without the `$`).
fn promql_identifiers(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c.is_ascii_digit() {
            // A number or a duration (5m, 1h30m): not an identifier.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Whether `name` is a series Sluice exports; Err says why not.
fn exported_series(name: &str) -> Result<&'static str, String> {
    if let Some(s) = SERIES.iter().find(|s| **s == name) {
        return Ok(s);
    }
    for h in HISTOGRAMS {
        for suffix in ["_bucket", "_sum", "_count"] {
            if name.strip_suffix(suffix) == Some(h) {
                return Ok(h);
            }
        }
        if name == *h {
            return Err(format!(
                "{name} is a histogram: query {name}_bucket, _sum or _count"
            ));
        }
    }
    Err(format!("{name} is not a metric Sluice exports"))
}

/// Every PromQL expression of a Grafana dashboard: panel targets' `expr` (at any depth, so
/// collapsed rows count) and query variables.
fn dashboard_queries(dash: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(v: &serde_json::Value, path: String, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if k == "expr" {
                        if let Some(e) = v.as_str() {
                            out.push((format!("{path}.expr"), e.to_string()));
                        }
                    } else if k != "templating" {
                        walk(v, format!("{path}.{k}"), out);
                    }
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dash, "$".into(), &mut out);
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] == "query" {
            let q = var["query"]["query"]
                .as_str()
                .or_else(|| var["query"].as_str())
                .unwrap_or_else(|| panic!("variable {} has no query", var["name"]));
            out.push((format!("variable {}", var["name"]), q.to_string()));
        }
    }
    out
}

#[test]
fn grafana_dashboards_parse_and_query_only_exported_metrics() {
    let dir = root().join("deploy/grafana");
    let dashboards: Vec<PathBuf> = files_under(&dir)
        .into_iter()
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    assert!(
        !dashboards.is_empty(),
        "no *.json dashboard under deploy/grafana"
    );
    for path in dashboards {
        let file = rel(&path);
        let text = fs::read_to_string(&path).expect("readable");
        let dash: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file} is not valid JSON: {e}"));

        let queries = dashboard_queries(&dash);
        assert!(
            queries.len() >= 10,
            "{file}: only {} PromQL expressions found",
            queries.len()
        );
        let mut used = BTreeSet::new();
        for (at, expr) in &queries {
            let metrics: Vec<String> = promql_identifiers(expr)
                .into_iter()
                .filter(|i| i.starts_with("ratelimit_service_") || i.starts_with("sluice_"))
                .collect();
            assert!(
                !metrics.is_empty(),
                "{file} {at}: queries no Sluice metric: {expr}"
            );
            for m in metrics {
                match exported_series(&m) {
                    Ok(base) => {
                        used.insert(base);
                    }
                    Err(why) => panic!("{file} {at}: {why}: {expr}"),
                }
            }
            if expr.contains("histogram_quantile") {
                assert!(
                    expr.contains("_bucket"),
                    "{file} {at}: histogram_quantile needs _bucket: {expr}"
                );
                assert!(
                    expr.contains("by (le") || expr.contains("by(le"),
                    "{file} {at}: histogram_quantile needs the le label kept (sum by (le, ...)): {expr}"
                );
            }
        }

        if file.ends_with("sluice-dashboard.json") {
            // The main dashboard shows everything Sluice exports.
            let missing: Vec<&&str> = SERIES
                .iter()
                .chain(HISTOGRAMS)
                .filter(|m| !used.contains(**m))
                .collect();
            assert!(missing.is_empty(), "{file}: no panel shows {missing:?}");

            let vars = dash["templating"]["list"]
                .as_array()
                .expect("templating.list");
            let var = |name: &str| {
                vars.iter()
                    .find(|v| v["name"] == name)
                    .unwrap_or_else(|| panic!("{file}: no `{name}` variable"))
            };
            let ds = var("datasource");
            assert_eq!(
                ds["type"], "datasource",
                "{file}: `datasource` must be a data source variable"
            );
            assert_eq!(
                ds["query"], "prometheus",
                "{file}: `datasource` must pick Prometheus"
            );
            let domain = var("domain");
            let q = domain["query"]["query"]
                .as_str()
                .or(domain["query"].as_str())
                .unwrap_or("");
            assert!(
                q.starts_with("label_values(") && q.trim_end_matches(')').ends_with("domain"),
                "{file}: `domain` must come from label_values(..., domain), is {q:?}"
            );
            let schema = dash["schemaVersion"].as_i64().unwrap_or(0);
            assert!(
                (36..=41).contains(&schema),
                "{file}: schemaVersion {schema}"
            );
        }

        // Panels: unique ids, and every query panel on the ${datasource} variable.
        let mut ids = BTreeSet::new();
        let mut panels: Vec<&serde_json::Value> = Vec::new();
        for p in dash["panels"].as_array().expect("panels") {
            panels.push(p);
            panels.extend(p["panels"].as_array().into_iter().flatten());
        }
        for p in panels {
            let id = p["id"]
                .as_i64()
                .unwrap_or_else(|| panic!("{file}: panel without id: {}", p["title"]));
            assert!(ids.insert(id), "{file}: panel id {id} used twice");
            if p["type"] != "row" {
                assert_eq!(
                    p["datasource"]["uid"], "${datasource}",
                    "{file}: panel {} does not use the ${{datasource}} variable",
                    p["title"]
                );
                let targets = p["targets"].as_array().filter(|t| !t.is_empty());
                let targets =
                    targets.unwrap_or_else(|| panic!("{file}: panel {} has no query", p["title"]));
                for t in targets {
                    assert!(
                        t["datasource"].is_null() || t["datasource"]["uid"] == "${datasource}",
                        "{file}: a query of panel {} does not use the ${{datasource}} variable",
                        p["title"]
                    );
                }
            }
        }
        for var in dash["templating"]["list"].as_array().into_iter().flatten() {
            if var["type"] == "query" {
                assert_eq!(
                    var["datasource"]["uid"], "${datasource}",
                    "{file}: variable {} does not use the ${{datasource}} variable",
                    var["name"]
                );
            }
        }
    }
}

#[test]
fn promql_identifier_extraction() {
    let ids = promql_identifiers(
        r#"histogram_quantile(0.99, sum by (le) (rate(sluice_store_call_seconds_bucket{job=~"sluice_x"}[5m]))) or vector(0)"#,
    );
    assert_eq!(
        ids,
        [
            "histogram_quantile",
            "sum",
            "by",
            "le",
            "rate",
            "sluice_store_call_seconds_bucket",
            "job",
            "or",
            "vector"
        ]
    );
    assert!(exported_series("sluice_store_call_seconds_count").is_ok());
    assert!(exported_series("sluice_store_call_seconds").is_err());
    assert!(exported_series("sluice_failed_open").is_err());
    assert!(exported_series("ratelimit_service_rate_limit_over_limit").is_ok());
}

// ------------------------------------------------------------------------------------------
// (b) Consistency
// ------------------------------------------------------------------------------------------

/// One value of a descriptor entry as Envoy sends it: known in the config, or the request's.
#[derive(Debug, Clone)]
enum Value {
    Exact(String),
    Any,
}

type Descriptor = Vec<(String, Value)>;

fn show(d: &Descriptor) -> String {
    let parts: Vec<String> = d
        .iter()
        .map(|(k, v)| match v {
            Value::Exact(v) => format!("{k}={v}"),
            Value::Any => format!("{k}=<from request>"),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// The descriptors of every `rate_limits` list in an Envoy config tree.
fn envoy_descriptors(file: &str, docs: &[Yaml]) -> Vec<Descriptor> {
    let mut hashes = Vec::new();
    for d in docs {
        all_hashes(d, &mut hashes);
    }
    let mut out = Vec::new();
    for h in hashes {
        let Some(list) = h["rate_limits"].as_vec() else {
            continue;
        };
        for entry in list {
            let actions = entry["actions"]
                .as_vec()
                .unwrap_or_else(|| panic!("{file}: rate_limits entry without actions"));
            let mut d = Descriptor::new();
            for a in actions {
                let (kind, body) = a.as_hash().and_then(|h| h.iter().next()).expect("action");
                let kind = kind.as_str().expect("action name");
                let key = |default: &str| {
                    body["descriptor_key"]
                        .as_str()
                        .unwrap_or(default)
                        .to_string()
                };
                d.push(match kind {
                    "remote_address" => ("remote_address".into(), Value::Any),
                    "generic_key" => (
                        key("generic_key"),
                        Value::Exact(str_at(body, &["descriptor_value"], file).into()),
                    ),
                    "header_value_match" => (
                        key("header_match"),
                        Value::Exact(str_at(body, &["descriptor_value"], file).into()),
                    ),
                    "request_headers" => (key(""), Value::Any),
                    other => {
                        panic!("{file}: action {other} is not understood by this test; extend it")
                    }
                });
            }
            out.push(d);
        }
    }
    assert!(!out.is_empty(), "{file}: no rate_limits actions found");
    out
}

/// Upstream's `*` glob.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            text.starts_with(head)
                && (0..=text.len() - head.len()).any(|i| {
                    text.is_char_boundary(head.len() + i) && glob(tail, &text[head.len() + i..])
                })
        }
    }
}

/// Where a descriptor lands in a config's tree, as upstream matches it (exact value, then
/// wildcard values, then the key-only entry). Err says where it stopped.
fn find_limit<'a>(config: &'a Yaml, d: &Descriptor) -> Result<&'a Yaml, String> {
    let mut level = config["descriptors"]
        .as_vec()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut node = None;
    for (i, (key, value)) in d.iter().enumerate() {
        let same_key = || {
            level
                .iter()
                .filter(move |e| e["key"].as_str() == Some(key.as_str()))
        };
        let found = match value {
            Value::Exact(v) => same_key()
                .find(|e| e["value"].as_str() == Some(v.as_str()))
                .or_else(|| {
                    same_key().find(|e| {
                        e["value"]
                            .as_str()
                            .is_some_and(|p| p.contains('*') && glob(p, v))
                    })
                })
                .or_else(|| same_key().find(|e| e["value"].is_badvalue())),
            Value::Any => {
                same_key().find(|e| e["value"].is_badvalue() || e["value"].as_str() == Some("*"))
            }
        };
        let Some(entry) = found else {
            let (path, wanted) = (
                show(&d[..i].to_vec()),
                show(&vec![(key.clone(), value.clone())]),
            );
            let under = if i == 0 {
                "at the top level".to_string()
            } else {
                format!("under {path}")
            };
            return Err(format!("no entry matches {wanted} {under}"));
        };
        node = Some(entry);
        level = entry["descriptors"]
            .as_vec()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
    }
    let node = node.ok_or("empty descriptor")?;
    if node["rate_limit"].is_badvalue() {
        return Err(
            "its last entry has no rate_limit (upstream does not fall back to a parent)".into(),
        );
    }
    Ok(node)
}

/// The config with `domain` among the `*.yaml` files of a directory.
fn config_for_domain(dir: &str, domain: &str) -> (String, Yaml) {
    let mut domains = Vec::new();
    for path in files_under(&root().join(dir)) {
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let file = rel(&path);
        let doc = yaml_one(&file);
        let d = str_at(&doc, &["domain"], &file).to_string();
        if d == domain {
            return (file, doc);
        }
        domains.push(format!("{d} ({file})"));
    }
    panic!("no config file in {dir} has domain `{domain}`; domains there: {domains:?}")
}

/// The ratelimit HTTP filter's typed_config in an Envoy config tree.
fn ratelimit_filter<'a>(file: &str, docs: &'a [Yaml]) -> &'a Yaml {
    let mut hashes = Vec::new();
    for d in docs {
        all_hashes(d, &mut hashes);
    }
    let filters: Vec<&Yaml> = hashes
        .into_iter()
        .filter(|h| h["name"].as_str() == Some("envoy.filters.http.ratelimit"))
        .collect();
    assert_eq!(
        filters.len(),
        1,
        "{file}: expected one envoy.filters.http.ratelimit filter, found {}",
        filters.len()
    );
    &filters[0]["typed_config"]
}

fn chart_redis_timeout_us() -> u64 {
    duration_us(str_at(&yaml_one(VALUES), &["redis", "timeout"], VALUES))
}

fn check_descriptors_limited(source: &str, descriptors: &[Descriptor], domain: &str) {
    let limits = yaml_one(LIMITS);
    let (example_file, example) = config_for_domain("examples/config", domain);
    let values = yaml_one(VALUES);
    let chart_limits: Vec<(String, Yaml)> = values["limits"]
        .as_hash()
        .expect("values.yaml: limits")
        .iter()
        .map(|(k, v)| {
            let text = v.as_str().expect("limits values are YAML strings");
            (
                k.as_str().unwrap().to_string(),
                YamlLoader::load_from_str(text).unwrap().remove(0),
            )
        })
        .collect();
    let (chart_file, chart_default) = chart_limits
        .iter()
        .find(|(_, doc)| doc["domain"].as_str() == Some(domain))
        .unwrap_or_else(|| {
            panic!("{VALUES}: no default `limits` file has domain `{domain}` ({source}'s)")
        });
    for d in descriptors {
        for (name, config) in [
            (LIMITS.to_string(), &limits),
            (example_file.clone(), &example),
            (format!("{VALUES} limits.{chart_file}"), chart_default),
        ] {
            if let Err(why) = find_limit(config, d) {
                panic!(
                    "{source} sends {} (domain {domain}), but {name} has no limit for it: {why}",
                    show(d)
                );
            }
        }
    }
}

#[test]
fn envoy_example_matches_sluice_port_domain_and_limits() {
    let docs = yaml_docs(ENVOY);
    let filter = ratelimit_filter(ENVOY, &docs);
    let domain = str_at(filter, &["domain"], ENVOY);

    // The filter's cluster ends on Sluice's gRPC port, over HTTP/2.
    let cluster_name = str_at(
        filter,
        &[
            "rate_limit_service",
            "grpc_service",
            "envoy_grpc",
            "cluster_name",
        ],
        ENVOY,
    );
    let clusters = docs[0]["static_resources"]["clusters"]
        .as_vec()
        .expect("static_resources.clusters");
    let cluster = clusters
        .iter()
        .find(|c| c["name"].as_str() == Some(cluster_name))
        .unwrap_or_else(|| {
            panic!(
                "{ENVOY}: the ratelimit filter uses cluster `{cluster_name}`, which is not defined"
            )
        });
    let mut ports = Vec::new();
    for group in cluster["load_assignment"]["endpoints"]
        .as_vec()
        .expect("endpoints")
    {
        for ep in group["lb_endpoints"].as_vec().expect("lb_endpoints") {
            ports.push(int_at(
                ep,
                &["endpoint", "address", "socket_address", "port_value"],
                ENVOY,
            ));
        }
    }
    assert!(
        !ports.is_empty(),
        "{ENVOY}: cluster `{cluster_name}` has no endpoint"
    );
    for p in ports {
        assert_eq!(
            p, GRPC_PORT,
            "{ENVOY}: cluster `{cluster_name}` points at port {p}, Sluice's gRPC port is {GRPC_PORT}"
        );
    }
    assert!(
        !cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["explicit_http_config"]["http2_protocol_options"]
            .is_badvalue(),
        "{ENVOY}: cluster `{cluster_name}` must speak HTTP/2 (gRPC)"
    );
    let health = cluster["health_checks"]
        .as_vec()
        .and_then(|h| h.first())
        .expect("health_checks");
    assert_eq!(
        str_at(health, &["grpc_health_check", "service_name"], ENVOY),
        "ratelimit",
        "{ENVOY}: Sluice's gRPC health service is named `ratelimit`"
    );

    // The domain has a config on both sides of the example: limits.yaml (mounted in the
    // Envoy demo, the chart's default) and examples/config (baked into the image).
    let limits = yaml_one(LIMITS);
    let limits_domain = str_at(&limits, &["domain"], LIMITS);
    assert_eq!(
        domain, limits_domain,
        "{ENVOY}: the ratelimit filter's domain is `{domain}`, but {LIMITS} configures `{limits_domain}`"
    );
    let (example_file, _) = config_for_domain("examples/config", domain);
    assert!(example_file.starts_with("examples/config/"));

    // Every descriptor Envoy sends is limited by all three configs.
    check_descriptors_limited(ENVOY, &envoy_descriptors(ENVOY, &docs), domain);

    // Envoy waits longer than Sluice's own store deadline (docs/envoy.md, Errors).
    let envoy_timeout = duration_us(str_at(filter, &["timeout"], ENVOY));
    let redis_timeout = chart_redis_timeout_us();
    assert!(
        envoy_timeout > redis_timeout,
        "{ENVOY}: filter timeout {envoy_timeout} us must exceed the chart's redis.timeout {redis_timeout} us"
    );
}

#[test]
fn chart_values_match_the_image() {
    let values = yaml_one(VALUES);
    let docker = Dockerfile::parse(&read(DOCKERFILE));

    // Ports: values.yaml, the image's defaults and EXPOSE.
    let grpc = int_at(&values, &["service", "grpcPort"], VALUES);
    let http = int_at(&values, &["service", "httpPort"], VALUES);
    assert_eq!(
        grpc, GRPC_PORT,
        "{VALUES}: service.grpcPort is {grpc}, Sluice's gRPC port is {GRPC_PORT}"
    );
    assert_eq!(
        http, HTTP_PORT,
        "{VALUES}: service.httpPort is {http}, Sluice's HTTP port is {HTTP_PORT}"
    );
    assert_eq!(
        docker.env("GRPC_PORT"),
        GRPC_PORT.to_string(),
        "{DOCKERFILE}: ENV GRPC_PORT disagrees with {GRPC_PORT}"
    );
    assert_eq!(
        docker.env("PORT"),
        HTTP_PORT.to_string(),
        "{DOCKERFILE}: ENV PORT disagrees with {HTTP_PORT}"
    );
    for port in [GRPC_PORT, HTTP_PORT] {
        assert!(
            docker.expose.contains(&port.to_string()),
            "{DOCKERFILE}: EXPOSE {:?} lacks {port}",
            docker.expose
        );
    }

    // Config directory: where the image bakes its config and points Sluice at, where the chart
    // mounts the ConfigMap and points Sluice at.
    let image_dir = docker.config_dir();
    assert!(
        docker
            .copy_destinations
            .iter()
            .any(|d| d.trim_end_matches('/') == image_dir),
        "{DOCKERFILE}: RUNTIME_ROOT/RUNTIME_APPDIRECTORY is {image_dir}, but no COPY puts the config there ({:?})",
        docker.copy_destinations
    );
    let tpl = read(DEPLOYMENT_TPL);
    let env_value = |name: &str| template_env(&tpl, name);
    assert_eq!(
        env_value("RUNTIME_ROOT"),
        docker.env("RUNTIME_ROOT"),
        "{DEPLOYMENT_TPL}: RUNTIME_ROOT disagrees with {DOCKERFILE}"
    );
    assert_eq!(
        env_value("RUNTIME_APPDIRECTORY"),
        docker.env("RUNTIME_APPDIRECTORY"),
        "{DEPLOYMENT_TPL}: RUNTIME_APPDIRECTORY disagrees with {DOCKERFILE}"
    );
    assert_eq!(
        env_value("GRPC_PORT"),
        GRPC_PORT.to_string(),
        "{DEPLOYMENT_TPL}: GRPC_PORT"
    );
    assert_eq!(
        env_value("PORT"),
        HTTP_PORT.to_string(),
        "{DEPLOYMENT_TPL}: PORT"
    );
    let mount = template_field_after(&tpl, "- name: config", "mountPath:");
    assert_eq!(
        mount, image_dir,
        "{DEPLOYMENT_TPL}: the config volume is mounted at {mount}, the image reads {image_dir} ({DOCKERFILE})"
    );
    assert_eq!(
        template_field_after(&tpl, "- name: grpc", "containerPort:"),
        GRPC_PORT.to_string(),
        "{DEPLOYMENT_TPL}: containerPort of `grpc`"
    );
    assert_eq!(
        template_field_after(&tpl, "- name: http", "containerPort:"),
        HTTP_PORT.to_string(),
        "{DEPLOYMENT_TPL}: containerPort of `http`"
    );
    // values.yaml documents the mount path in its comments; they must not drift either.
    for (n, line) in read(VALUES).lines().enumerate() {
        if let Some(at) = line.find("/srv/") {
            let path: String = line[at..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != ',' && *c != ')')
                .collect();
            let path = path.trim_end_matches(['.', ':']);
            assert_eq!(
                path,
                image_dir,
                "{VALUES}:{}: mentions {path}, the image's config directory is {image_dir}",
                n + 1
            );
        }
    }

    // Metrics: the ServiceMonitor scrapes /metrics on the `http` port, off by default.
    assert_eq!(
        str_at(&values, &["serviceMonitor", "path"], VALUES),
        "/metrics",
        "{VALUES}: serviceMonitor.path"
    );
    assert_eq!(
        values["serviceMonitor"]["enabled"].as_bool(),
        Some(false),
        "{VALUES}: serviceMonitor.enabled must default to false (the CRD may be missing)"
    );
    let sm = read("deploy/helm/sluice/templates/servicemonitor.yaml");
    assert!(
        sm.contains("- port: http"),
        "servicemonitor.yaml: must scrape the port named `http`"
    );
    assert!(
        sm.contains("path: {{ .Values.serviceMonitor.path }}"),
        "servicemonitor.yaml: must use serviceMonitor.path"
    );

    // Tracing and failure policy values exist with the service's defaults.
    assert_eq!(
        str_at(&values, &["tracing", "otlpEndpoint"], VALUES),
        "",
        "{VALUES}: tracing off by default"
    );
    assert_eq!(
        values["tracing"]["samplingRate"].as_i64(),
        Some(1),
        "{VALUES}: tracing.samplingRate default 1"
    );
    // The chart's own default (the service's is fail_closed): decisions go on while Redis is
    // down, each pod with its share (issue #42).
    assert_eq!(
        str_at(&values, &["failurePolicy"], VALUES),
        "local_share",
        "{VALUES}: failurePolicy default"
    );
    assert_eq!(
        str_at(&values, &["redis", "type"], VALUES),
        "single",
        "{VALUES}: redis.type default"
    );
    for var in [
        "FAILURE_POLICY",
        "DEGRADED_REPLICAS",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "TRACING_SAMPLING_RATE",
        "REDIS_TYPE",
        "CONFIG_RELOAD_INTERVAL",
    ] {
        assert!(
            tpl.contains(&format!("- name: {var}\n")),
            "{DEPLOYMENT_TPL}: does not set {var}"
        );
    }
}

#[test]
fn chart_default_limits_are_the_envoy_example_limits() {
    let values = yaml_one(VALUES);
    let text = values["limits"]["example.yaml"]
        .as_str()
        .unwrap_or_else(|| {
            panic!("{VALUES}: limits.example.yaml missing (its comments say it is {LIMITS})")
        });
    let chart = YamlLoader::load_from_str(text)
        .expect("chart limits parse")
        .remove(0);
    assert_eq!(
        chart,
        yaml_one(LIMITS),
        "{VALUES} limits.example.yaml and {LIMITS} differ; the chart's default is documented as that file"
    );
}

#[test]
fn istio_envoyfilter_matches_sluice_port_domain_and_limits() {
    let docs = yaml_docs(ISTIO);
    assert_eq!(
        docs.len(),
        2,
        "{ISTIO}: expected the filter and the actions EnvoyFilters"
    );
    for d in &docs {
        assert_eq!(str_at(d, &["kind"], ISTIO), "EnvoyFilter");
    }
    let filter = ratelimit_filter(ISTIO, &docs);
    let domain = str_at(filter, &["domain"], ISTIO);
    let limits = yaml_one(LIMITS);
    let limits_domain = str_at(&limits, &["domain"], LIMITS);
    assert_eq!(
        domain, limits_domain,
        "{ISTIO}: the ratelimit filter's domain is `{domain}`, but {LIMITS} (the chart's default limits) configures `{limits_domain}`"
    );
    let envoy_domain = str_at(
        ratelimit_filter(ENVOY, &yaml_docs(ENVOY)),
        &["domain"],
        ENVOY,
    )
    .to_string();
    assert_eq!(
        domain, envoy_domain,
        "{ISTIO} uses domain `{domain}`, {ENVOY} uses `{envoy_domain}`"
    );

    // outbound|<port>||<FQDN>: Istio's cluster for the chart's Service port. Envoy sends it as
    // the :authority, `|` included, which Sluice serves (tests/it/authority.rs).
    let envoy_grpc = &filter["rate_limit_service"]["grpc_service"]["envoy_grpc"];
    let cluster = str_at(envoy_grpc, &["cluster_name"], ISTIO);
    let parts: Vec<&str> = cluster.split('|').collect();
    assert!(
        parts.len() == 4 && parts[0] == "outbound" && parts[2].is_empty(),
        "{ISTIO}: cluster_name {cluster:?} is not outbound|<port>||<host>"
    );
    let values = yaml_one(VALUES);
    let chart_grpc = int_at(&values, &["service", "grpcPort"], VALUES);
    assert_eq!(
        parts[1],
        GRPC_PORT.to_string(),
        "{ISTIO}: cluster_name {cluster} names port {}, Sluice's gRPC port is {GRPC_PORT}",
        parts[1]
    );
    assert_eq!(
        parts[1],
        chart_grpc.to_string(),
        "{ISTIO}: cluster_name {cluster} names port {}, the chart's Service has grpcPort {chart_grpc}",
        parts[1]
    );
    // Release `sluice` in namespace `sluice` (deploy/README.md): Service sluice.sluice.svc...
    assert_eq!(
        parts[3], "sluice.sluice.svc.cluster.local",
        "{ISTIO}: the host is not the chart's Service for release `sluice` in namespace `sluice`"
    );

    // The descriptors the gateway sends are limited by the same configs as Envoy's.
    check_descriptors_limited(ISTIO, &envoy_descriptors(ISTIO, &docs), domain);

    let timeout = duration_us(str_at(filter, &["timeout"], ISTIO));
    let redis_timeout = chart_redis_timeout_us();
    assert!(
        timeout > redis_timeout,
        "{ISTIO}: filter timeout {timeout} us must exceed the chart's redis.timeout {redis_timeout} us"
    );
}

/// The uid and gid envoyproxy/ratelimit's container runs as under Envoy Gateway
/// (deploy/envoy-gateway/README.md); Sluice's image and chart use the same.
const NOBODY: i64 = 65534;

/// The image runs where upstream's image runs: `/bin/ratelimit` is Sluice's binary, the
/// image's user is uid/gid 65534 by number, and the chart runs it so with a read-only root.
#[test]
fn image_runs_where_upstreams_runs() {
    let docker = Dockerfile::parse(&read(DOCKERFILE));
    assert_eq!(
        docker.user.as_deref(),
        Some(format!("{NOBODY}:{NOBODY}").as_str()),
        "{DOCKERFILE}: the runtime image must run as USER {NOBODY}:{NOBODY} (numbers, no name lookup)"
    );
    // The binary is copied to one place and /bin/ratelimit names that same file.
    let binary = docker
        .copy_destinations
        .iter()
        .find(|d| d.ends_with("/bin/sluice"))
        .unwrap_or_else(|| {
            panic!(
                "{DOCKERFILE}: no COPY installs the sluice binary ({:?})",
                docker.copy_destinations
            )
        });
    let link = format!("ln -s {binary} /bin/ratelimit");
    assert!(
        docker
            .copy_destinations
            .iter()
            .any(|d| d == "/bin/ratelimit")
            || docker.runtime_runs.iter().any(|r| r.contains(&link)),
        "{DOCKERFILE}: /bin/ratelimit (where Envoy Gateway starts the rate limit service) must be \
         the sluice binary; expected `RUN {link}` in the runtime stage, found {:?}",
        docker.runtime_runs
    );

    let values = yaml_one(VALUES);
    for field in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert_eq!(
            int_at(&values, &["podSecurityContext", field], VALUES),
            NOBODY,
            "{VALUES}: podSecurityContext.{field} must be the image's {NOBODY}"
        );
    }
    for (field, want) in [
        ("readOnlyRootFilesystem", true),
        ("runAsNonRoot", true),
        ("allowPrivilegeEscalation", false),
    ] {
        assert_eq!(
            values["securityContext"][field].as_bool(),
            Some(want),
            "{VALUES}: securityContext.{field} must be {want}"
        );
    }
}

/// A read-only root filesystem only works if the service writes no file: no code outside
/// tests opens a file for writing or makes a temporary file (logs go to stdout, counters to
/// memory or Redis). A write added later must come with a volume in the chart and an entry in
/// ALLOWED saying why it is fine.
/// Every directory Cargo must see to build the workspace (its members and patched crates) is in
/// the image's build context, which `Dockerfile.dockerignore` filters by an allow-list: a
/// member left out fails `cargo build --locked` inside the image, where no test runs it.
#[test]
fn the_image_build_context_holds_the_workspace() {
    let manifest = read("Cargo.toml");
    let allowed: Vec<&str> = DOCKERIGNORE_ALLOW
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .collect();
    let members = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = "))
        .expect("Cargo.toml has a workspace members list");
    let patches = manifest
        .lines()
        .filter(|l| l.contains("{ path = "))
        .filter_map(|l| l.split('"').nth(1));
    let needed: Vec<&str> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .chain(patches)
        .filter(|dir| *dir != ".")
        .collect();
    assert!(!needed.is_empty());
    for dir in needed {
        assert!(
            allowed
                .iter()
                .any(|a| dir.starts_with(a.trim_end_matches('/'))),
            "deploy/docker/Dockerfile.dockerignore leaves {dir}/ out of the image's build \
             context, but Cargo.toml needs it (allowed: {allowed:?})"
        );
    }
}

const DOCKERIGNORE_ALLOW: &str = include_str!("../../deploy/docker/Dockerfile.dockerignore");

#[test]
fn the_service_writes_no_file() {
    /// (file, call, why): writes the service makes only where the operator asked for a file.
    const ALLOWED: &[(&str, &str, &str)] = &[
        // GRPC_UDS (off by default): the gRPC Unix socket, at a path the operator picks (a
        // mounted volume); a stale socket there is replaced, and removed on exit.
        ("src/server/mod.rs", "fs::remove", "GRPC_UDS socket"),
        ("src/app/listeners.rs", "fs::remove", "GRPC_UDS socket"),
    ];
    const WRITES: &[&str] = &[
        "fs::write",
        "File::create",
        "OpenOptions",
        "tempfile",
        "create_dir",
        "fs::rename",
        "fs::copy",
        "fs::remove",
        "set_permissions",
    ];
    let mut found = Vec::new();
    for path in files_under(&root().join("src")) {
        let name = rel(&path);
        if !name.ends_with(".rs") || name.ends_with("/tests.rs") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        // Unit tests sit at the end of a file, after `#[cfg(test)]`.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for w in WRITES {
                let allowed = ALLOWED.iter().any(|(f, c, _)| *f == name && c == w);
                if line.contains(w) && !allowed {
                    found.push(format!("{name}:{}: {w}", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the service must write no file (the image runs with a read-only root): {found:#?}"
    );
}

const ENVOY_GATEWAY: &str = "deploy/envoy-gateway/README.md";

/// The `EnvoyGateway` resource of deploy/envoy-gateway/README.md: the ```yaml block with
/// `kind: EnvoyGateway`.
fn envoy_gateway_resource() -> Yaml {
    let text = read(ENVOY_GATEWAY);
    let block = text
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .find(|block| block.contains("kind: EnvoyGateway"))
        .unwrap_or_else(|| panic!("{ENVOY_GATEWAY}: no ```yaml block with kind: EnvoyGateway"));
    YamlLoader::load_from_str(block)
        .unwrap_or_else(|e| panic!("{ENVOY_GATEWAY}: the EnvoyGateway block is not YAML: {e}"))
        .remove(0)
}

/// The EnvoyGateway resource swaps the rate limit Deployment's image, leaves the store to
/// EG's `REDIS_*` variables (no BACKEND_TYPE, so Sluice picks Redis as upstream does), and keeps
/// Sluice's Redis deadline below the proxies' timeout.
#[test]
fn envoy_gateway_resource_swaps_the_image() {
    let eg = envoy_gateway_resource();
    assert_eq!(
        str_at(&eg, &["apiVersion"], ENVOY_GATEWAY),
        "gateway.envoyproxy.io/v1alpha1"
    );
    let container = &eg["provider"]["kubernetes"]["rateLimitDeployment"]["container"];
    let image = str_at(container, &["image"], ENVOY_GATEWAY);
    assert!(
        image.contains("sluice"),
        "{ENVOY_GATEWAY}: provider.kubernetes.rateLimitDeployment.container.image is {image}"
    );
    let env: BTreeMap<&str, &str> = container["env"]
        .as_vec()
        .unwrap_or_else(|| panic!("{ENVOY_GATEWAY}: container.env is not a list"))
        .iter()
        .map(|e| {
            (
                str_at(e, &["name"], ENVOY_GATEWAY),
                str_at(e, &["value"], ENVOY_GATEWAY),
            )
        })
        .collect();
    assert_eq!(
        env.get("BACKEND_TYPE"),
        None,
        "{ENVOY_GATEWAY}: EG's REDIS_URL selects Redis when BACKEND_TYPE is unset"
    );
    assert_eq!(
        str_at(&eg, &["rateLimit", "backend", "type"], ENVOY_GATEWAY),
        "Redis"
    );
    let proxy_timeout = duration_us(str_at(&eg, &["rateLimit", "timeout"], ENVOY_GATEWAY));
    let redis_timeout = duration_us(
        env.get("REDIS_TIMEOUT")
            .unwrap_or_else(|| panic!("{ENVOY_GATEWAY}: container.env sets no REDIS_TIMEOUT")),
    );
    assert!(
        redis_timeout < proxy_timeout,
        "{ENVOY_GATEWAY}: REDIS_TIMEOUT {redis_timeout} us must be below rateLimit.timeout {proxy_timeout} us"
    );
}

/// What this test reads from the Dockerfile: ENV, EXPOSE and COPY destinations (continuation
/// lines joined, comments dropped).
struct Dockerfile {
    env: BTreeMap<String, String>,
    expose: Vec<String>,
    copy_destinations: Vec<String>,
    /// The `RUN` commands of the last stage (the runtime image) and the stages it starts from,
    /// as written.
    runtime_runs: Vec<String>,
    /// The last `USER` (of the runtime image).
    user: Option<String>,
}

impl Dockerfile {
    fn parse(text: &str) -> Self {
        let mut instructions = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.starts_with('#') || trimmed.is_empty() && current.is_empty() {
                continue;
            }
            match trimmed.strip_suffix('\\') {
                Some(part) => {
                    current.push_str(part);
                    current.push(' ');
                }
                None => {
                    current.push_str(trimmed);
                    instructions.push(std::mem::take(&mut current));
                }
            }
        }
        let mut file = Dockerfile {
            env: BTreeMap::new(),
            expose: Vec::new(),
            copy_destinations: Vec::new(),
            runtime_runs: Vec::new(),
            user: None,
        };
        // Each named stage's RUNs, its parent stage's included.
        let mut current_stage: Option<String> = None;
        let mut stages: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for ins in instructions {
            let mut words = ins.split_whitespace();
            match words.next().map(str::to_ascii_uppercase).as_deref() {
                // A new stage: only the last one's RUNs shape the image, with those of the
                // stage it starts from (`FROM runtime-base AS runtime`).
                Some("FROM") => {
                    let rest: Vec<&str> = words.collect();
                    let parent = rest.iter().find(|w| !w.starts_with("--")).copied();
                    file.runtime_runs = parent
                        .and_then(|p| stages.get(p).cloned())
                        .unwrap_or_default();
                    if let [.., as_word, name] = rest[..]
                        && as_word.eq_ignore_ascii_case("AS")
                    {
                        stages.insert(name.to_string(), file.runtime_runs.clone());
                        current_stage = Some(name.to_string());
                    } else {
                        current_stage = None;
                    }
                }
                Some("RUN") => {
                    let run = words.collect::<Vec<_>>().join(" ");
                    if let Some(stage) = &current_stage {
                        stages.get_mut(stage).unwrap().push(run.clone());
                    }
                    file.runtime_runs.push(run);
                }
                Some("USER") => file.user = words.next().map(str::to_string),
                Some("ENV") => {
                    for w in words {
                        let (k, v) = w
                            .split_once('=')
                            .unwrap_or_else(|| panic!("{DOCKERFILE}: ENV {w} (use KEY=VALUE)"));
                        file.env
                            .insert(k.to_string(), v.trim_matches('"').to_string());
                    }
                }
                Some("EXPOSE") => file
                    .expose
                    .extend(words.map(|w| w.trim_end_matches("/tcp").to_string())),
                Some("COPY") => {
                    if let Some(dest) = words.rfind(|w| !w.starts_with("--")) {
                        file.copy_destinations.push(dest.to_string());
                    }
                }
                _ => {}
            }
        }
        file
    }

    fn env(&self, name: &str) -> String {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("{DOCKERFILE}: no ENV {name}"))
            .clone()
    }

    /// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, as Sluice joins them.
    fn config_dir(&self) -> String {
        let mut dir = PathBuf::from(self.env("RUNTIME_ROOT"));
        if let Some(sub) = self
            .env
            .get("RUNTIME_SUBDIRECTORY")
            .filter(|s| !s.is_empty())
        {
            dir.push(sub);
        }
        dir.push(self.env("RUNTIME_APPDIRECTORY"));
        dir.display().to_string()
    }
}

/// The literal `value:` of `- name: <NAME>` in the deployment template's env list.
fn template_env(tpl: &str, name: &str) -> String {
    let value = template_field_after(tpl, &format!("- name: {name}"), "value:");
    value.trim_matches('"').to_string()
}

/// The first `<field> X` on the lines after the line `<anchor>` (before the next `- name:`).
fn template_field_after(tpl: &str, anchor: &str, field: &str) -> String {
    let mut lines = tpl.lines().skip_while(|l| l.trim() != anchor);
    assert!(
        lines.next().is_some(),
        "{DEPLOYMENT_TPL}: no line `{anchor}`"
    );
    for l in lines {
        let t = l.trim();
        if t.starts_with("- name:") {
            break;
        }
        if let Some(v) = t.strip_prefix(field) {
            assert!(
                !v.contains("{{"),
                "{DEPLOYMENT_TPL}: `{anchor}` {field} is templated ({v}); this test reads literals"
            );
            return v.trim().to_string();
        }
    }
    panic!("{DEPLOYMENT_TPL}: no `{field}` after `{anchor}`")
}
