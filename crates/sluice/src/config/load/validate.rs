//! Validation: each document's YAML tree checked against upstream's schema and turned into
//! specs (`FileSpec`, `DescriptorSpec`, `LimitSpec`) that compilation can trust. A `rate_limit`
//! and its algorithm are checked in `rate_limit.rs`, on the same `FileChecker`.
//!
//! Validation follows upstream's rules and messages (prefixed here with `file:line:`), and goes on
//! after an error so that one run reports every problem. Keys upstream accepts anywhere but
//! ignores where they stand produce warnings, not errors, so upstream's files keep loading.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost_types::value::Kind;

use super::scalars::{Number, describe, to_proto_value, yaml11_bool, yaml11_number};
use super::{Document, LoadOptions};
use crate::config::yaml::{self, Node, Value};
use crate::config::{ConfigError, Quota};

/// Every key upstream's loader accepts, at any depth.
const UPSTREAM_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Sluice's own keys, valid under `rate_limit` only.
pub(super) const EXTENSION_KEYS: &[&str] = &[
    "algorithm",
    "burst",
    "warmup_period",
    "cold_factor",
    "record_refused_hits",
    "unit_multiplier",
    "hide_from_headers",
    "calendar",
];

/// Validates every document, each named by its source, and gathers the descriptors of each
/// domain in document order: those of a domain declared again are added to it under
/// [`LoadOptions::merge_domains`], else refused as a duplicate.
pub(super) fn documents(
    documents: Vec<(PathBuf, Document)>,
    options: &LoadOptions,
    errors: &mut Vec<ConfigError>,
    warnings: &mut Vec<ConfigError>,
) -> Vec<(String, Vec<DescriptorSpec>)> {
    // Domain name → (descriptors in file order, where the domain was first declared).
    let mut domains: Vec<(String, Vec<DescriptorSpec>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();

    for (path, document) in documents {
        let mut checker = FileChecker {
            file: Arc::from(path.as_path()),
            lines: matches!(document, Document::Text(_)),
            errors,
            warnings,
        };
        let spec = match &document {
            Document::Text(text) => checker.file(text),
            // A file's text is held to the limit as it is read (`yaml.rs`); a tree is checked
            // here, before anything walks it, so every source has the one limit.
            Document::Tree(tree) if yaml::nests_too_deep(tree) => {
                checker.error(0, format!("nesting deeper than {} levels", yaml::MAX_DEPTH));
                None
            }
            Document::Tree(tree) => checker.document(tree),
        };
        let Some(spec) = spec else {
            continue;
        };
        match index.get(&spec.domain) {
            Some(&at) if options.merge_domains => domains[at].1.extend(spec.descriptors),
            Some(_) => checker.error(
                spec.domain_line,
                format!("duplicate domain '{}' in config file", spec.domain),
            ),
            None => {
                index.insert(spec.domain.clone(), domains.len());
                domains.push((spec.domain, spec.descriptors));
            }
        }
    }
    domains
}

/// What one file declares, after validation.
struct FileSpec {
    domain: String,
    domain_line: usize,
    descriptors: Vec<DescriptorSpec>,
}

pub(super) struct DescriptorSpec {
    pub(super) file: Arc<Path>,
    /// `None` for a descriptor built from an xDS resource.
    pub(super) line: Option<usize>,
    pub(super) key: String,
    pub(super) value: String,
    /// Empty: no limit; else `rate_limit`'s one limit or `rate_limits`' list.
    pub(super) limits: Vec<LimitSpec>,
    /// The limits came as a `rate_limits` list (even of one).
    pub(super) listed: bool,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) share_threshold: bool,
    pub(super) detailed_metric: bool,
    pub(super) value_to_metric: bool,
    pub(super) metadata: Option<prost_types::Struct>,
    pub(super) children: Vec<DescriptorSpec>,
}

pub(super) struct LimitSpec {
    /// Where an entry of `rate_limits` starts (`None` for `rate_limit`, or without lines).
    pub(super) line: Option<usize>,
    pub(super) name: String,
    pub(super) quota: Quota,
    pub(super) replaces: Vec<String>,
    pub(super) record_refused_hits: bool,
    /// `hide_from_headers`: never the limit Sluice's own response headers describe.
    pub(super) hide_from_headers: bool,
    pub(super) calendar: Option<Arc<crate::config::Calendar>>,
}

/// Validates one file's YAML tree, recording errors and warnings against its path.
pub(super) struct FileChecker<'a> {
    file: Arc<Path>,
    /// Whether node lines mean anything (false for trees built from xDS resources).
    pub(super) lines: bool,
    errors: &'a mut Vec<ConfigError>,
    warnings: &'a mut Vec<ConfigError>,
}

impl FileChecker<'_> {
    pub(super) fn error(&mut self, line: usize, reason: impl Into<String>) {
        self.errors.push(self.at(line, reason));
    }

    pub(super) fn warn(&mut self, line: usize, reason: impl Into<String>) {
        let warning = self.at(line, reason);
        self.warnings.push(warning);
    }

    fn at(&self, line: usize, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line: self.lines.then_some(line),
            reason: reason.into(),
        }
    }

    fn file(&mut self, text: &str) -> Option<FileSpec> {
        let doc = match yaml::parse(text) {
            Ok(Some(doc)) => doc,
            Ok(None) => {
                self.error(1, "config file cannot have empty domain");
                return None;
            }
            Err(e) => {
                self.error(e.line, format!("error loading config file: {}", e.message));
                return None;
            }
        };
        self.document(&doc)
    }

    /// Validates one document's tree.
    fn document(&mut self, doc: &Node) -> Option<FileSpec> {
        let before = self.errors.len();
        let fields = self.mapping(doc, "config file", &["domain", "descriptors"])?;
        let domain = match fields.get("domain") {
            Some(node) => self.string(node, "domain").unwrap_or_default(),
            None => String::new(),
        };
        let domain_line = fields.get("domain").map_or(doc.line, |n| n.line);
        if domain.is_empty() {
            self.error(domain_line, "config file cannot have empty domain");
        }
        let descriptors = match fields.get("descriptors") {
            Some(node) => self.descriptor_list(node),
            None => Vec::new(),
        };
        (self.errors.len() == before).then_some(FileSpec {
            domain,
            domain_line,
            descriptors,
        })
    }

    fn descriptor_list(&mut self, node: &Node) -> Vec<DescriptorSpec> {
        if node.is_null() {
            return Vec::new();
        }
        let Value::Sequence(items) = &node.value else {
            self.error(
                node.line,
                format!("descriptors must be a list, found a {}", node.kind()),
            );
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|item| self.descriptor(item))
            .collect()
    }

    fn descriptor(&mut self, node: &Node) -> Option<DescriptorSpec> {
        const FIELDS: &[&str] = &[
            "key",
            "value",
            "rate_limit",
            "rate_limits",
            "descriptors",
            "shadow_mode",
            "quota_mode",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
            "metadata",
        ];
        let fields = self.mapping(node, "descriptor", FIELDS)?;
        let key = fields
            .get("key")
            .and_then(|n| self.string(n, "key"))
            .unwrap_or_default();
        if key.is_empty() {
            self.error(node.line, "descriptor has empty key");
        }
        let value = fields
            .get("value")
            .and_then(|n| self.string(n, "value"))
            .unwrap_or_default();
        let flag = |this: &mut Self, name: &str| {
            fields
                .get(name)
                .and_then(|n| this.boolean(n, name))
                .unwrap_or(false)
        };
        let shadow_mode = flag(self, "shadow_mode");
        let quota_mode = flag(self, "quota_mode");
        let share_threshold = flag(self, "share_threshold");
        // Stats-only switches: they name metrics, they never change decisions.
        let detailed_metric = flag(self, "detailed_metric");
        let value_to_metric = flag(self, "value_to_metric");
        if share_threshold && !value.contains('*') {
            self.error(
                node.line,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), \
                     but found key '{key}'"
                ),
            );
        }
        let metadata = fields.get("metadata").and_then(|n| self.metadata(n));
        let (limits, listed) = self.descriptor_limits(&fields);
        let children = match fields.get("descriptors") {
            Some(n) => self.descriptor_list(n),
            None => Vec::new(),
        };
        Some(DescriptorSpec {
            file: self.file.clone(),
            line: self.lines.then_some(node.line),
            key,
            value,
            limits,
            listed,
            shadow_mode,
            quota_mode,
            share_threshold,
            detailed_metric,
            value_to_metric,
            metadata,
            children,
        })
    }

    /// A descriptor's limits: `rate_limit`'s one, or `rate_limits`' list (then `true`), never
    /// both.
    fn descriptor_limits(&mut self, fields: &HashMap<&str, &Node>) -> (Vec<LimitSpec>, bool) {
        let single = fields.get("rate_limit").filter(|n| !n.is_null());
        let list = fields.get("rate_limits");
        match (single, list) {
            (Some(_), Some(list)) => {
                self.error(
                    list.line,
                    "a descriptor has rate_limit or rate_limits, not both",
                );
                (Vec::new(), false)
            }
            (Some(n), None) => (self.limit(n).into_iter().collect(), false),
            (None, Some(list)) => (self.limit_list(list), true),
            (None, None) => (Vec::new(), false),
        }
    }

    /// Checks that `node` is a map with string keys that upstream knows, and returns the entries
    /// that belong at this place. Keys upstream ignores here are warned about and dropped.
    pub(super) fn mapping<'n>(
        &mut self,
        node: &'n Node,
        what: &str,
        allowed: &[&str],
    ) -> Option<HashMap<&'n str, &'n Node>> {
        let Value::Mapping(pairs) = &node.value else {
            let shown = match &node.value {
                Value::Scalar { text, .. } => text.clone(),
                _ => node.kind().to_string(),
            };
            if what == "descriptor" || what == "replaces entry" {
                self.error(
                    node.line,
                    format!(
                        "config error, yaml file contains list of type other than map: {shown}"
                    ),
                );
            } else {
                self.error(node.line, format!("{what} must be a map, found: {shown}"));
            }
            return None;
        };
        let mut fields = HashMap::with_capacity(pairs.len());
        for (key, value) in pairs {
            let Value::Scalar { text, .. } = &key.value else {
                self.error(
                    key.line,
                    format!("config error, key is not of type string: {}", key.kind()),
                );
                continue;
            };
            if allowed.contains(&text.as_str()) {
                // yaml.v2 keeps the last of duplicate keys; so do we, loudly.
                if fields.insert(text.as_str(), value).is_some() {
                    self.warn(
                        key.line,
                        format!("duplicate key '{text}': this later value is the one used"),
                    );
                }
            } else if EXTENSION_KEYS.contains(&text.as_str()) {
                self.error(
                    key.line,
                    format!("config error, '{text}' is only valid under rate_limit"),
                );
            } else if text == "rate_limits" {
                // Sluice's own, like the keys above, but it belongs on a descriptor.
                self.error(
                    key.line,
                    "config error, 'rate_limits' is only valid on a descriptor (instead of \
                     rate_limit)",
                );
            } else if UPSTREAM_KEYS.contains(&text.as_str()) {
                self.warn(
                    key.line,
                    format!("key '{text}' has no effect in a {what}; it is ignored"),
                );
            } else {
                self.error(key.line, format!("config error, unknown key '{text}'"));
            }
        }
        Some(fields)
    }

    pub(super) fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            _ if node.is_null() => Some(String::new()),
            Value::Scalar { text, .. } => Some(text.clone()),
            _ => {
                self.error(
                    node.line,
                    format!("{field} must be a string, found a {}", node.kind()),
                );
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        if let Value::Scalar { text, plain: true } = &node.value
            && let Some(b) = yaml11_bool(text)
        {
            return Some(b);
        }
        self.error(
            node.line,
            format!("{field} must be true or false, found: {}", describe(node)),
        );
        None
    }

    pub(super) fn count(&mut self, node: &Node, field: &str) -> Option<u32> {
        if let Value::Scalar { text, plain: true } = &node.value {
            match yaml11_number(text) {
                Some(Number::Int(n)) => {
                    if let Ok(n) = u32::try_from(n) {
                        return Some(n);
                    }
                }
                // yaml.v2 would cut `1.5` to 1 without a word; a fraction of a request is a
                // mistake, so only whole numbers written as floats (`1e3`) are taken.
                Some(Number::Float(f))
                    if f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f) =>
                {
                    return Some(f as u32);
                }
                _ => {}
            }
        }
        self.error(
            node.line,
            format!(
                "{field} must be a whole number from 0 to {}, found: {}",
                u32::MAX,
                describe(node)
            ),
        );
        None
    }

    fn metadata(&mut self, node: &Node) -> Option<prost_types::Struct> {
        if node.is_null() {
            return None;
        }
        match to_proto_value(node) {
            Ok(prost_types::Value {
                kind: Some(Kind::StructValue(s)),
            }) => Some(s),
            Ok(_) => {
                self.error(node.line, "metadata must be a map");
                None
            }
            Err(line) => {
                self.error(line, "metadata map keys must be strings");
                None
            }
        }
    }
}
