//! statsd_exporter's mapping from statsd stat names to Prometheus series, which upstream uses for
//! its Prometheus sink: the built-in default (upstream's `default_mapper.yaml` rules) or a file
//! named by `PROMETHEUS_MAPPER_YAML` in the same format.
//!
//! The rules, as statsd_exporter applies them: mappings are tried in file order and the first
//! that matches wins. A `glob` match (the default `match_type`) is anchored at both ends and each
//! `*` matches one dot-free run of characters; a `regex` match is *not* anchored. `$1`, `${1}`
//! (and named groups) in `name` and label values are replaced by the captures, as Go's
//! `Regexp.Expand` does. `action: drop` drops the stat. A stat no mapping matches keeps its name,
//! with every character outside `[a-zA-Z0-9_]` replaced by `_` (a leading digit gets a `_` in
//! front; a run of dashes becomes one `_`), and no labels.
//!
//! Unlike upstream, which ignores a mapper file it cannot load and carries on with unmapped
//! names, a bad file stops the start-up with the file and the reason.

use std::path::Path;

use regex::Regex;
use yaml_rust2::{Yaml, YamlLoader};

/// What a stat becomes on `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    Drop,
    Series {
        name: String,
        labels: Vec<(String, String)>,
    },
}

/// The kind of a stat, for `match_metric_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    Counter,
    Gauge,
    Timer,
}

/// Why `PROMETHEUS_MAPPER_YAML` could not be used; the server does not start on it.
#[derive(Debug, thiserror::Error)]
pub enum MapperError {
    /// The file cannot be read, or its mappings do not parse.
    #[error("{path}: {reason}")]
    File {
        /// The file as configured.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

#[derive(Debug)]
struct Mapping {
    regex: Regex,
    name: String,
    labels: Vec<(String, String)>,
    drop: bool,
    kind: Option<StatKind>,
}

/// A list of mappings, applied first match first.
#[derive(Debug)]
pub struct Mapper {
    mappings: Vec<Mapping>,
}

/// Upstream's default mapping (envoyproxy/ratelimit `src/stats/prom/default_mapper.yaml`),
/// rule for rule: per-rule stats of a one-segment stats key by glob, of a three-or-more-segment
/// key by regex; the service, gRPC and config stats by glob.
const DEFAULT_MAPPINGS: &str = r#"
mappings:
  - {match: "ratelimit.service.rate_limit.*.*.near_limit", name: ratelimit_service_rate_limit_near_limit, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.over_limit", name: ratelimit_service_rate_limit_over_limit, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.total_hits", name: ratelimit_service_rate_limit_total_hits, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.within_limit", name: ratelimit_service_rate_limit_within_limit, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.shadow_mode", name: ratelimit_service_rate_limit_shadow_mode, labels: {domain: "$1", key1: "$2"}}
  - {match: 'ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)(\..*)\.near_limit', match_type: regex, name: ratelimit_service_rate_limit_near_limit, labels: {domain: "$1", key1: "$2", key2: "$3"}}
  - {match: 'ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)(\..*)\.over_limit', match_type: regex, name: ratelimit_service_rate_limit_over_limit, labels: {domain: "$1", key1: "$2", key2: "$3"}}
  - {match: 'ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)(\..*)\.total_hits', match_type: regex, name: ratelimit_service_rate_limit_total_hits, labels: {domain: "$1", key1: "$2", key2: "$3"}}
  - {match: 'ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)(\..*)\.within_limit', match_type: regex, name: ratelimit_service_rate_limit_within_limit, labels: {domain: "$1", key1: "$2", key2: "$3"}}
  - {match: 'ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)(\..*)\.shadow_mode', match_type: regex, name: ratelimit_service_rate_limit_shadow_mode, labels: {domain: "$1", key1: "$2", key2: "$3"}}
  - {match: "ratelimit.service.call.should_rate_limit.*", name: ratelimit_service_should_rate_limit_error, match_metric_type: counter, labels: {err_type: "$1"}}
  - {match: "ratelimit_server.*.total_requests", name: ratelimit_service_total_requests, match_metric_type: counter, labels: {grpc_method: "$1"}}
  - {match: "ratelimit_server.*.response_time", name: ratelimit_service_response_time_seconds, labels: {grpc_method: "$1"}}
  - {match: "ratelimit.service.config_load_success", name: ratelimit_service_config_load_success, match_metric_type: counter}
  - {match: "ratelimit.service.config_load_error", name: ratelimit_service_config_load_error, match_metric_type: counter}
"#;

impl Mapper {
    /// Upstream's default mapping.
    pub fn upstream_default() -> Self {
        match Self::parse(DEFAULT_MAPPINGS) {
            Ok(mapper) => mapper,
            // The text is a constant checked by the tests below.
            Err(reason) => unreachable!("the built-in mapping is valid: {reason}"),
        }
    }

    /// The mapping in the file at `path` (`PROMETHEUS_MAPPER_YAML`).
    pub fn from_file(path: &Path) -> Result<Self, MapperError> {
        let fail = |reason: String| MapperError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Self::parse(&text).map_err(fail)
    }

    /// Parses statsd_exporter's mapping format; the error names the mapping and the reason.
    pub fn parse(text: &str) -> Result<Self, String> {
        let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
        let root = docs.into_iter().next().unwrap_or(Yaml::Null);
        let default_type = match &root["defaults"]["match_type"] {
            Yaml::BadValue | Yaml::Null => "glob".to_string(),
            y => text_of(y).ok_or("defaults.match_type is not a string")?,
        };
        let list = match &root["mappings"] {
            Yaml::Array(list) => list.as_slice(),
            Yaml::BadValue | Yaml::Null => &[],
            _ => return Err("`mappings` is not a list".into()),
        };
        let mappings = list
            .iter()
            .enumerate()
            .map(|(i, m)| parse_mapping(m, &default_type).map_err(|e| format!("mapping {i}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(Self { mappings })
    }

    /// What the stat `name` of `kind` becomes: the first mapping that matches it, or its escaped
    /// name with no labels.
    pub fn map(&self, name: &str, kind: StatKind) -> Mapped {
        for m in &self.mappings {
            let Some(caps) = m.regex.captures(name) else {
                continue;
            };
            if m.kind.is_some_and(|k| k != kind) {
                continue;
            }
            if m.drop {
                return Mapped::Drop;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                caps.expand(&go_template(template), &mut out);
                out
            };
            return Mapped::Series {
                name: escape_metric_name(&expand(&m.name)),
                labels: m
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
            };
        }
        Mapped::Series {
            name: escape_metric_name(name),
            labels: Vec::new(),
        }
    }
}

fn text_of(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Real(r) => Some(r.clone()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn parse_mapping(m: &Yaml, default_type: &str) -> Result<Mapping, String> {
    if !matches!(m, Yaml::Hash(_)) {
        return Err("not a map".into());
    }
    let field = |k: &str| match &m[k] {
        Yaml::BadValue | Yaml::Null => Ok(None),
        y => text_of(y).map(Some).ok_or(format!("`{k}` is not a string")),
    };
    let pattern = field("match")?.ok_or("no `match`")?;
    let name = field("name")?.ok_or("metric mapping didn't set a metric name")?;
    if !valid_name_template(&name) {
        return Err(format!("metric name '{name}' is not a valid metric name"));
    }
    let match_type = field("match_type")?.unwrap_or_else(|| default_type.to_string());
    let regex = match match_type.as_str() {
        "glob" | "" => glob_regex(&pattern)?,
        "regex" => Regex::new(&pattern).map_err(|e| format!("invalid regex {pattern}: {e}"))?,
        other => return Err(format!("unknown match_type '{other}'")),
    };
    let drop = match field("action")?.as_deref() {
        None | Some("map") => false,
        Some("drop") => true,
        Some(other) => return Err(format!("unknown action '{other}'")),
    };
    let kind = match field("match_metric_type")?.as_deref() {
        None | Some("") => None,
        Some("counter") => Some(StatKind::Counter),
        Some("gauge") => Some(StatKind::Gauge),
        Some("observer" | "timer" | "histogram" | "summary" | "distribution") => {
            Some(StatKind::Timer)
        }
        Some(other) => return Err(format!("unknown match_metric_type '{other}'")),
    };
    let mut labels = Vec::new();
    match &m["labels"] {
        Yaml::BadValue | Yaml::Null => {}
        Yaml::Hash(h) => {
            for (k, v) in h {
                let k = text_of(k).ok_or("a label name is not a string")?;
                if !valid_label_name(&k) {
                    return Err(format!("invalid label key: {k}"));
                }
                let v = text_of(v).ok_or(format!("label {k}: value is not a string"))?;
                labels.push((k, v));
            }
        }
        _ => return Err("`labels` is not a map".into()),
    }
    Ok(Mapping {
        regex,
        name,
        labels,
        drop,
        kind,
    })
}

/// A glob `match` as statsd_exporter accepts it (dot-separated identifiers or `*`, at least
/// two parts), as an anchored regex where `*` captures a dot-free run.
fn glob_regex(pattern: &str) -> Result<Regex, String> {
    let parts: Vec<&str> = pattern.split('.').collect();
    let ident = |p: &str| {
        let mut chars = p.chars();
        p.len() >= 2
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && !p.ends_with('-')
            && !p.contains("--")
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if parts.len() < 2 || !parts.iter().all(|p| *p == "*" || ident(p)) {
        return Err(format!("invalid match: {pattern}"));
    }
    let body: Vec<String> = parts
        .iter()
        .map(|p| match *p {
            "*" => "([^.]*)".to_string(),
            p => regex::escape(p),
        })
        .collect();
    Regex::new(&format!("^{}$", body.join(r"\."))).map_err(|e| e.to_string())
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() >= 2
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `[a-zA-Z_]` then `[a-zA-Z0-9_]`, where `$n` / `${n}` may stand anywhere.
fn valid_name_template(name: &str) -> bool {
    let plain = name.replace(['$', '{', '}'], "");
    !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && plain.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Go's `Regexp.Expand` reads `$name` as the longest run of `[A-Za-z0-9_]`; the regex crate
/// stops a bare number at the first non-digit. Braces make both read the same.
fn go_template(template: &str) -> String {
    let mut out = String::with_capacity(template.len() + 4);
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if len == 0 || after.starts_with('{') {
            out.push('$');
            rest = after;
        } else {
            out.push_str("${");
            out.push_str(&after[..len]);
            out.push('}');
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    out
}

/// statsd_exporter's escaping of a metric name: `[a-zA-Z0-9_]` kept, anything else `_`, a run
/// of dashes one `_`, a leading digit preceded by `_`.
pub(super) fn escape_metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous = None;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && previous == Some('-')) {
            out.push('_');
        }
        previous = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)]) -> Mapped {
        Mapped::Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn upstream_default_by_key_depth() {
        let m = Mapper::upstream_default();
        let counter = |name: &str| m.map(name, StatKind::Counter);
        // One segment after the domain: the glob rules, domain and key1.
        assert_eq!(
            counter("ratelimit.service.rate_limit.app.k_v.total_hits"),
            series(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "app"), ("key1", "k_v")]
            )
        );
        // Two segments: no rule matches (the glob wants one, the regex at least three), so the
        // whole name is escaped, without labels.
        assert_eq!(
            counter("ratelimit.service.rate_limit.app.a_1.b_2.over_limit"),
            series("ratelimit_service_rate_limit_app_a_1_b_2_over_limit", &[])
        );
        // Three segments: the regex rules; key2 is the second segment, the rest is dropped.
        assert_eq!(
            counter("ratelimit.service.rate_limit.app.a_1.b_2.c_3.near_limit"),
            series(
                "ratelimit_service_rate_limit_near_limit",
                &[("domain", "app"), ("key1", "a_1"), ("key2", "b_2")]
            )
        );
        // A value with dots (here `host: api.example.com` on a one-level key) makes more
        // segments, so the regex rules apply and cut the value apart.
        assert_eq!(
            counter("ratelimit.service.rate_limit.app.host_api.example.com.within_limit"),
            series(
                "ratelimit_service_rate_limit_within_limit",
                &[("domain", "app"), ("key1", "host_api"), ("key2", "example")]
            )
        );
        // With more segments than the rules name, the greedy first group takes the extra ones.
        assert_eq!(
            counter("ratelimit.service.rate_limit.app.a.b.c.d.total_hits"),
            series(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "app.a"), ("key1", "b"), ("key2", "c")]
            )
        );
        assert_eq!(
            counter("ratelimit.service.call.should_rate_limit.redis_error"),
            series(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")]
            )
        );
        // match_metric_type: a gauge of that name is not mapped.
        assert_eq!(
            m.map("ratelimit.service.config_load_success", StatKind::Gauge),
            series("ratelimit_service_config_load_success", &[])
        );
        assert_eq!(
            counter("ratelimit.service.rate_limit.app.k.over_limit_with_local_cache"),
            series(
                "ratelimit_service_rate_limit_app_k_over_limit_with_local_cache",
                &[]
            )
        );
    }

    #[test]
    fn file_rules_drop_regex_and_first_match() {
        let m = Mapper::parse(
            r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    action: drop
    name: dropped
  - match: 'ratelimit\.service\.rate_limit\.([^.]+)\.(.+)\.([a-z_]+)$'
    match_type: regex
    name: "rl_$3"
    labels: {domain: "$1", path: "${2}", both: "$1-$2"}
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: never_reached
"#,
        )
        .unwrap();
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.k.near_limit",
                StatKind::Counter
            ),
            Mapped::Drop
        );
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.k.total_hits",
                StatKind::Counter
            ),
            series(
                "rl_total_hits",
                &[("domain", "d"), ("path", "k"), ("both", "d-k")]
            )
        );
    }

    #[test]
    fn bad_files_name_the_reason() {
        for (text, reason) in [
            ("mappings:\n  - match: aa.bb\n", "didn't set a metric name"),
            ("mappings:\n  - {match: 'a..b', name: x}\n", "invalid match"),
            (
                "mappings:\n  - {match: '(', match_type: regex, name: x}\n",
                "invalid regex",
            ),
            (
                "mappings:\n  - {match: aa.bb, name: x, labels: {'a-b': c}}\n",
                "invalid label key",
            ),
            ("mappings: [", "while parsing"),
        ] {
            let err = Mapper::parse(text).unwrap_err();
            assert!(err.contains(reason), "{text}: {err}");
        }
    }

    #[test]
    fn escaping_follows_statsd_exporter() {
        assert_eq!(escape_metric_name("a.b-c:d"), "a_b_c_d");
        assert_eq!(escape_metric_name("a--b"), "a_b");
        assert_eq!(escape_metric_name("1a"), "_1a");
        assert_eq!(go_template("x$1y${2}$$"), "x${1y}${2}$$");
    }
}
