//! Reading config files: discovery, schema validation and compilation into [`RateLimitConfig`].
//!
//! Validation follows upstream's rules and messages (prefixed here with `file:line:`), and goes on
//! after an error so that one run reports every problem. Keys upstream accepts anywhere but
//! ignores where they stand produce warnings, not errors, so upstream's files keep loading.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost_types::value::Kind;

use super::yaml::{self, Node, Value};
use super::{
    Algorithm, AlgorithmField, Children, ConfigError, ConfigErrors, Domain, Level, Limit,
    MAX_WINDOW_SECS, Member, Origin, Quota, RateLimitConfig, Stats, TreeNode, Unit, WarmUpProblem,
    Wildcard,
};

/// Loader switches that come from the environment (upstream's variable names in brackets).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Several files may add descriptors to one domain [`MERGE_DOMAIN_CONFIG`].
    pub merge_domains: bool,
    /// Skip files and directories whose name starts with a dot [`RUNTIME_IGNOREDOTFILES`].
    pub ignore_dotfiles: bool,
}

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
const EXTENSION_KEYS: &[&str] = &[
    "algorithm",
    "burst",
    "warmup_period",
    "cold_factor",
    "record_refused_hits",
    "unit_multiplier",
];

/// Loads every regular file under `dir` (recursively, in path order), whatever its name ends
/// with, as upstream's runtime loader does: `limits.yml` and `limits` are config files too.
///
/// Names starting with `..` are Kubernetes' ConfigMap internals (`..data`, `..2024_…`): the same
/// files are visible through the top-level links, so they are always skipped. Other dot-files
/// are loaded unless [`LoadOptions::ignore_dotfiles`]. A directory that yields no domain loads,
/// with a warning, since upstream's service starts on it too.
pub fn load_dir(dir: &Path, options: &LoadOptions) -> Result<RateLimitConfig, ConfigErrors> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    collect_files(dir, options, &mut files, &mut errors);
    files.sort();
    let mut sources = Vec::with_capacity(files.len());
    for file in &files {
        match fs::read_to_string(file) {
            Ok(text) => sources.push((file.clone(), text)),
            Err(e) => errors.push(ConfigError {
                file: file.clone(),
                line: None,
                reason: format!("cannot read file: {e}"),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let mut config = load_sources(sources, options)?;
    if config.domains.is_empty() {
        config.warnings.push(ConfigError {
            file: dir.to_path_buf(),
            line: None,
            reason: format!(
                "no domain loaded from {} file(s): every request will be answered OK \
                 with no limit",
                files.len()
            ),
        });
    }
    config.files = files;
    Ok(config)
}

fn collect_files(
    dir: &Path,
    options: &LoadOptions,
    files: &mut Vec<PathBuf>,
    errors: &mut Vec<ConfigError>,
) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(ConfigError {
                file: dir.to_path_buf(),
                line: None,
                reason: format!("cannot read config directory: {e}"),
            });
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("..") || (options.ignore_dotfiles && name.starts_with('.')) {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks, as ConfigMap mounts need.
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => collect_files(&path, options, files, errors),
            Ok(meta) if meta.is_file() => files.push(path),
            // Sockets, pipes, devices: not files anyone writes limits into.
            Ok(_) => {}
            Err(e) => errors.push(ConfigError {
                file: path,
                line: None,
                reason: format!("cannot read file: {e}"),
            }),
        }
    }
}

/// Validates and compiles config files given as `(path, contents)`.
pub fn load_sources(
    sources: Vec<(PathBuf, String)>,
    options: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let documents = sources
        .into_iter()
        .map(|(path, text)| (path, Document::Text(text)))
        .collect();
    load_documents(documents, options)
}

/// One config document on its way to the validator: a file's text, or a tree built from
/// something else (an xDS resource), checked by the same rules.
pub(super) enum Document {
    Text(String),
    /// Built, not written: its nodes carry no meaningful line, so errors name the source only.
    Tree(Node),
}

/// Validates and compiles documents, each named by its source (a file path or a resource name).
/// Every source of configuration goes through here, so files and xDS share one validator.
pub(super) fn load_documents(
    documents: Vec<(PathBuf, Document)>,
    options: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    // Domain name → (descriptors in file order, where the domain was first declared).
    let mut domains: Vec<(String, Vec<DescriptorSpec>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();

    for (path, document) in documents {
        let mut checker = FileChecker {
            file: Arc::from(path.as_path()),
            lines: matches!(document, Document::Text(_)),
            errors: &mut errors,
            warnings: &mut warnings,
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

    let mut config = RateLimitConfig::default();
    for (name, descriptors) in domains {
        let mut domain = Domain::default();
        domain.root = build_level(
            &mut domain.nodes,
            &name,
            0,
            &[],
            &StatsPath::default(),
            descriptors,
            &mut errors,
        );
        config.domains.insert(name.into(), domain);
    }
    // Number the limits (in domain-name order, so the same files give the same ids), so
    // per-limit state kept beside the config (metric handles) can be found by id.
    let mut domains: Vec<_> = config.domains.iter_mut().collect();
    domains.sort_by(|a, b| a.0.cmp(b.0));
    let limits = domains.into_iter().flat_map(|(_, d)| d.nodes.iter_mut());
    let mut count = 0;
    for (id, limit) in limits.flat_map(|n| n.limits.iter_mut()).enumerate() {
        limit.id = Some(id);
        count = id + 1;
    }
    config.limit_count = count;
    if errors.is_empty() {
        config.warnings = warnings;
        Ok(config)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// What one file declares, after validation.
struct FileSpec {
    domain: String,
    domain_line: usize,
    descriptors: Vec<DescriptorSpec>,
}

struct DescriptorSpec {
    file: Arc<Path>,
    /// `None` for a descriptor built from an xDS resource.
    line: Option<usize>,
    key: String,
    value: String,
    /// Empty: no limit; else `rate_limit`'s one limit or `rate_limits`' list.
    limits: Vec<LimitSpec>,
    /// The limits came as a `rate_limits` list (even of one).
    listed: bool,
    shadow_mode: bool,
    quota_mode: bool,
    share_threshold: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    metadata: Option<prost_types::Struct>,
    children: Vec<DescriptorSpec>,
}

struct LimitSpec {
    /// Where an entry of `rate_limits` starts (`None` for `rate_limit`, or without lines).
    line: Option<usize>,
    name: String,
    quota: Quota,
    replaces: Vec<String>,
    record_refused_hits: bool,
}

/// Turns a validated descriptor list into one level of the lookup tree, checking upstream's
/// duplicate composite keys (`key_value`, or `key` alone) among siblings.
fn build_level(
    nodes: &mut Vec<TreeNode>,
    parent_path: &str,
    depth: usize,
    parent_shared: &[(usize, Box<str>)],
    parent_stats: &StatsPath,
    specs: Vec<DescriptorSpec>,
    errors: &mut Vec<ConfigError>,
) -> Level {
    let mut level = Level::default();
    let mut seen = HashSet::new();
    for spec in specs {
        let composite = if spec.value.is_empty() {
            spec.key.clone()
        } else {
            format!("{}_{}", spec.key, spec.value)
        };
        let path = format!("{parent_path}.{composite}");
        if !seen.insert(composite.clone()) {
            errors.push(ConfigError {
                file: spec.file.to_path_buf(),
                line: spec.line,
                reason: format!("duplicate descriptor composite key '{path}'"),
            });
            continue;
        }
        let wildcard = Wildcard::new(&spec.value);
        let mut shared = parent_shared.to_vec();
        if spec.share_threshold {
            shared.push((depth, spec.value.as_str().into()));
        }
        let mut stats = parent_stats.clone();
        stats.segments.push(composite.clone());
        if spec.value_to_metric {
            stats.value_levels.push(depth);
        }
        let of = spec.limits.len();
        let limits = spec
            .limits
            .into_iter()
            .enumerate()
            .map(|(at, l)| {
                let member = spec.listed.then(|| Member {
                    position: at + 1,
                    of,
                    label: Member::label_for(at + 1, &l.name),
                });
                // Each limit of a list is counted in its own stats, named by its label.
                let suffix = member
                    .as_ref()
                    .map_or(String::new(), |m| format!("_{}", m.label));
                Limit {
                    id: None,
                    name: l.name,
                    quota: l.quota,
                    replaces: l.replaces,
                    record_refused_hits: l.record_refused_hits,
                    shadow_mode: spec.shadow_mode,
                    quota_mode: spec.quota_mode,
                    metadata: spec.metadata.clone(),
                    shared_values: shared.clone(),
                    stats: Stats {
                        key: format!("{}{suffix}", stats.segments.join(".")),
                        segments: stats.segments.clone(),
                        value_levels: stats.value_levels.clone(),
                        detailed: spec.detailed_metric,
                        suffix,
                    },
                    path: path.clone(),
                    origin: Some(Origin {
                        file: spec.file.clone(),
                        line: l.line.or(spec.line),
                    }),
                    member,
                }
            })
            .collect();
        let id = nodes.len();
        nodes.push(TreeNode {
            limits,
            children: Level::default(),
        });
        nodes[id].children = build_level(
            nodes,
            &path,
            depth + 1,
            &shared,
            &stats,
            spec.children,
            errors,
        );

        let children: &mut Children = level.by_key.entry(spec.key.into()).or_default();
        match wildcard {
            _ if spec.value.is_empty() => children.any_value = Some(id),
            Some(w) => children.wildcards.push((w, id)),
            None => {
                children.exact.insert(spec.value.into(), id);
            }
        }
    }
    level
}

/// The stats naming gathered on the way down the tree.
#[derive(Debug, Clone, Default)]
struct StatsPath {
    segments: Vec<String>,
    value_levels: Vec<usize>,
}

/// Validates one file's YAML tree, recording errors and warnings against its path.
struct FileChecker<'a> {
    file: Arc<Path>,
    /// Whether node lines mean anything (false for trees built from xDS resources).
    lines: bool,
    errors: &'a mut Vec<ConfigError>,
    warnings: &'a mut Vec<ConfigError>,
}

impl FileChecker<'_> {
    fn error(&mut self, line: usize, reason: impl Into<String>) {
        self.errors.push(self.at(line, reason));
    }

    fn warn(&mut self, line: usize, reason: impl Into<String>) {
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
        let single = fields.get("rate_limit").filter(|n| !n.is_null());
        let list = fields.get("rate_limits");
        let (limits, listed) = match (single, list) {
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
        };
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

    fn limit(&mut self, node: &Node) -> Option<LimitSpec> {
        const FIELDS: &[&str] = &[
            "unit",
            "requests_per_unit",
            "unlimited",
            "name",
            "replaces",
            "algorithm",
            "burst",
            "warmup_period",
            "cold_factor",
            "record_refused_hits",
            "unit_multiplier",
        ];
        let fields = self.mapping(node, "rate_limit", FIELDS)?;
        let record_refused_hits = fields
            .get("record_refused_hits")
            .and_then(|n| self.boolean(n, "record_refused_hits"))
            .unwrap_or(false);
        let unlimited = fields
            .get("unlimited")
            .and_then(|n| self.boolean(n, "unlimited"))
            .unwrap_or(false);
        let name = fields
            .get("name")
            .and_then(|n| self.string(n, "name"))
            .unwrap_or_default();
        let unit_text = fields
            .get("unit")
            .filter(|n| !n.is_null())
            .and_then(|n| self.string(n, "unit"));
        let requests_per_unit = fields
            .get("requests_per_unit")
            .and_then(|n| self.count(n, "requests_per_unit"))
            .unwrap_or(0);

        let quota = if unlimited {
            // Upstream refuses only a valid unit here; any other text (`unit: ""`) is ignored.
            match unit_text.as_deref() {
                Some(text) if Unit::parse(text).is_some() => self.error(
                    node.line,
                    "should not specify rate limit unit when unlimited",
                ),
                Some(text) if !text.is_empty() => self.warn(
                    fields.get("unit").map_or(node.line, |n| n.line),
                    format!("unit '{text}' is not a unit; ignored on an unlimited rate limit"),
                ),
                _ => {}
            }
            if let Some(key) = EXTENSION_KEYS.iter().find(|k| fields.contains_key(**k)) {
                self.error(
                    fields[*key].line,
                    format!("{key} has no meaning on an unlimited rate limit"),
                );
            }
            Quota::Unlimited
        } else {
            let text = unit_text.unwrap_or_default();
            match Unit::parse(&text) {
                Some(unit) => {
                    let unit_multiplier = match fields.get("unit_multiplier") {
                        Some(n) => self.unit_multiplier(n, unit)?,
                        None => 1,
                    };
                    let window_secs = unit.window_secs() * u64::from(unit_multiplier);
                    Quota::PerUnit {
                        requests_per_unit,
                        unit,
                        unit_multiplier,
                        algorithm: self.algorithm(
                            &fields,
                            node.line,
                            requests_per_unit,
                            window_secs,
                        )?,
                    }
                }
                None => {
                    let line = fields.get("unit").map_or(node.line, |n| n.line);
                    self.error(line, format!("invalid rate limit unit '{text}'"));
                    return None;
                }
            }
        };

        let mut replaces = Vec::new();
        if let Some(list) = fields.get("replaces").filter(|n| !n.is_null()) {
            let Value::Sequence(items) = &list.value else {
                self.error(list.line, "replaces must be a list of {name: ...} maps");
                return None;
            };
            for item in items {
                let Some(entry) = self.mapping(item, "replaces entry", &["name"]) else {
                    continue;
                };
                let replaced = entry
                    .get("name")
                    .and_then(|n| self.string(n, "name"))
                    .unwrap_or_default();
                if replaced.is_empty() {
                    self.error(item.line, "should not have an empty replaces entry");
                } else if replaced == name {
                    self.error(
                        item.line,
                        "replaces should not contain name of same descriptor",
                    );
                } else {
                    replaces.push(replaced);
                }
            }
        }
        // The fixed window always records refused hits (upstream's INCRBY); saying so is a
        // mistake, not a no-op.
        if record_refused_hits
            && matches!(
                quota,
                Quota::PerUnit {
                    algorithm: Algorithm::FixedWindow,
                    ..
                }
            )
        {
            self.error(
                fields["record_refused_hits"].line,
                "record_refused_hits does not apply to algorithm fixed_window (it always counts \
                 refused hits)",
            );
            return None;
        }
        Some(LimitSpec {
            line: None,
            name,
            quota,
            replaces,
            record_refused_hits,
        })
    }

    /// Reads `rate_limits` (a Sluice extension): a non-empty list of complete `rate_limit`s, all
    /// of which must admit a request. Each is counted apart, so two with the same algorithm and
    /// window would be the same counter (and its keys, `rls::key`, tell them apart by those):
    /// refused, as is `unlimited`, which would make the others pointless. Each limit's stats
    /// are named by its label (`Member::label_for`: its name, or `limit<position>`), so two
    /// with one label would count into the same stats and neither could be read apart: refused
    /// too.
    fn limit_list(&mut self, node: &Node) -> Vec<LimitSpec> {
        let Value::Sequence(items) = &node.value else {
            self.error(
                node.line,
                format!(
                    "rate_limits must be a list of rate limits, found a {}",
                    node.kind()
                ),
            );
            return Vec::new();
        };
        if items.is_empty() {
            self.error(node.line, "rate_limits must list at least one rate limit");
            return Vec::new();
        }
        let mut limits: Vec<LimitSpec> = Vec::with_capacity(items.len());
        let mut seen: Vec<(&'static str, u64, usize)> = Vec::new();
        let mut labels: Vec<(String, usize)> = Vec::new();
        for item in items {
            let Some(mut limit) = self.limit(item) else {
                continue;
            };
            limit.line = self.lines.then_some(item.line);
            let Quota::PerUnit { algorithm, .. } = limit.quota else {
                self.error(
                    item.line,
                    "unlimited has no meaning in rate_limits (use rate_limit: {unlimited: true})",
                );
                continue;
            };
            let window = limit.quota.window_secs().unwrap_or(0);
            if let Some((_, _, first)) = seen
                .iter()
                .find(|(name, secs, _)| *name == algorithm.name() && *secs == window)
            {
                self.error(
                    item.line,
                    format!(
                        "two limits of one rate_limits list with algorithm {} and a window of \
                         {window}s (the first on line {first}); they would share one counter",
                        algorithm.name()
                    ),
                );
                continue;
            }
            let label = Member::label_for(limits.len() + 1, &limit.name);
            if let Some((_, first)) = labels.iter().find(|(l, _)| *l == label) {
                let reason = if label == limit.name {
                    format!(
                        "two limits of one rate_limits list named '{label}' (the first on line \
                         {first}); their stats would merge"
                    )
                } else {
                    format!(
                        "two limits of one rate_limits list whose stats are named '{label}' (the \
                         first on line {first}); give them different names"
                    )
                };
                self.error(item.line, reason);
                continue;
            }
            labels.push((label, item.line));
            seen.push((algorithm.name(), window, item.line));
            limits.push(limit);
        }
        limits
    }

    /// Reads and checks `algorithm` and its parameters.
    fn algorithm(
        &mut self,
        fields: &HashMap<&str, &Node>,
        line: usize,
        requests_per_unit: u32,
        window_secs: u64,
    ) -> Option<Algorithm> {
        let name = match fields.get("algorithm") {
            Some(n) => self.string(n, "algorithm")?,
            None => "fixed_window".to_string(),
        };
        let at = |key: &str| fields.get(key).map_or(line, |n| n.line);
        let burst_value = match fields.get("burst") {
            Some(n) => match self.count(n, "burst")? {
                0 => {
                    self.error(n.line, "burst must be at least 1");
                    return None;
                }
                b => b,
            },
            None => requests_per_unit,
        };
        let algorithm = match name.as_str() {
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_window_log" => Algorithm::SlidingWindowLog,
            "sliding_window_counter" => Algorithm::SlidingWindowCounter,
            "token_bucket" => Algorithm::TokenBucket { burst: burst_value },
            "gcra" => Algorithm::Gcra { burst: burst_value },
            "leaky_bucket" => Algorithm::LeakyBucket { burst: burst_value },
            "warm_up" => {
                let Some(node) = fields.get("warmup_period") else {
                    self.error(line, "warm_up needs warmup_period (for example 10s)");
                    return None;
                };
                let text = self.string(node, "warmup_period")?;
                let warmup = match crate::util::parse_go_duration(&text) {
                    Ok(d) => d,
                    Err(reason) => {
                        self.error(node.line, format!("warmup_period: {reason}"));
                        return None;
                    }
                };
                let cold_factor = match fields.get("cold_factor") {
                    None => None,
                    Some(n) => match &n.value {
                        Value::Scalar { text, plain: true } => match text.parse::<f64>() {
                            Ok(f) => Some((f, n.line, text.clone())),
                            Err(_) => {
                                self.error(n.line, "cold_factor must be a number");
                                return None;
                            }
                        },
                        _ => {
                            self.error(n.line, "cold_factor must be a number");
                            return None;
                        }
                    },
                };
                match Algorithm::warm_up(warmup, cold_factor.as_ref().map(|c| c.0)) {
                    Ok(algorithm) => algorithm,
                    Err(problem @ WarmUpProblem::PeriodTooShort) => {
                        self.error(node.line, problem.to_string());
                        return None;
                    }
                    Err(problem @ WarmUpProblem::ColdFactor) => {
                        let (line, text) =
                            cold_factor.map_or((line, String::new()), |c| (c.1, c.2));
                        self.error(line, format!("{problem}, found '{text}'"));
                        return None;
                    }
                }
            }
            other => {
                self.error(
                    at("algorithm"),
                    format!(
                        "unknown algorithm '{other}' (expected one of: {})",
                        Algorithm::NAMES.join(", ")
                    ),
                );
                return None;
            }
        };

        // Parameters that belong to another algorithm are mistakes, not silent no-ops.
        let takes_burst = algorithm.burst().is_some();
        let takes_warmup = matches!(algorithm, Algorithm::WarmUp { .. });
        for (key, allowed) in [
            ("burst", takes_burst),
            ("warmup_period", takes_warmup),
            ("cold_factor", takes_warmup),
        ] {
            if !allowed && fields.contains_key(key) {
                self.error(
                    at(key),
                    format!("{key} does not apply to algorithm {}", algorithm.name()),
                );
                return None;
            }
        }

        if let Err(problem) =
            algorithm.check_numbers(u64::from(requests_per_unit), window_secs * 1_000_000)
        {
            let field = match problem.field {
                AlgorithmField::Rate => "requests_per_unit",
                AlgorithmField::Burst => "burst",
                AlgorithmField::WarmupPeriod => "warmup_period",
            };
            self.error(
                at(field),
                problem.reason.replace("the rate", "requests_per_unit"),
            );
            return None;
        }
        Some(algorithm)
    }

    /// Reads `unit_multiplier`: a whole number from 1 on, with the window it makes (`unit` times
    /// it) at most [`MAX_WINDOW_SECS`].
    fn unit_multiplier(&mut self, node: &Node, unit: Unit) -> Option<u32> {
        let most = MAX_WINDOW_SECS / unit.window_secs();
        let whole = match &node.value {
            Value::Scalar { text, plain: true } => match yaml11_number(text) {
                Some(Number::Int(n)) => Some(n),
                Some(Number::Float(f)) if f.fract() == 0.0 && f.abs() < 1e30 => Some(f as i128),
                _ => None,
            },
            _ => None,
        };
        match whole {
            Some(n) if n >= 1 && n <= i128::from(most) => u32::try_from(n).ok(),
            Some(n) if n >= 1 => {
                self.error(
                    node.line,
                    format!(
                        "unit_multiplier {n} makes a window longer than 100 years (at most \
                         {most} for unit {})",
                        unit.name()
                    ),
                );
                None
            }
            _ => {
                self.error(
                    node.line,
                    format!(
                        "unit_multiplier must be a whole number of at least 1, found: {}",
                        describe(node)
                    ),
                );
                None
            }
        }
    }

    /// Checks that `node` is a map with string keys that upstream knows, and returns the entries
    /// that belong at this place. Keys upstream ignores here are warned about and dropped.
    fn mapping<'n>(
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

    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
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

    fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
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

    fn count(&mut self, node: &Node, field: &str) -> Option<u32> {
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

/// YAML 1.1 booleans, as upstream's yaml.v2 reads them.
fn yaml11_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "y" => Some(true),
        "false" | "no" | "off" | "n" => Some(false),
        _ => None,
    }
}

fn describe(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, .. } => format!("'{text}'"),
        _ => format!("a {}", node.kind()),
    }
}

/// A plain scalar that YAML 1.1, as yaml.v2 resolves it, reads as a number.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Number {
    Int(i128),
    Float(f64),
}

/// yaml.v2's number resolution (upstream reads its files with it): underscores are dropped
/// anywhere (`1_000`), a sign may lead (`+5`), Go's integer prefixes apply (`0x10`, `0o17`,
/// `0b101`, and a leading `0` for octal: `010` is 8), and else a decimal float (`1e3`, `2.5`,
/// `08`). Anything else (`.inf`, `1:30`, `ten`) is not a number.
fn yaml11_number(text: &str) -> Option<Number> {
    if !text.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') {
        return None;
    }
    let plain = text.replace('_', "");
    let (negative, unsigned) = match plain.as_bytes().first() {
        Some(b'-') => (true, &plain[1..]),
        Some(b'+') => (false, &plain[1..]),
        _ => (false, plain.as_str()),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    // `from_str_radix` would take a second sign after the prefix; Go does not.
    if !digits.is_empty()
        && !digits.starts_with(['+', '-'])
        && let Ok(n) = i128::from_str_radix(digits, radix)
    {
        return Some(Number::Int(if negative { -n } else { n }));
    }
    let float = plain.strip_prefix(['+', '-']).unwrap_or(&plain);
    let (mantissa, exponent) = match float.find(['e', 'E']) {
        Some(at) => (&float[..at], Some(&float[at + 1..])),
        None => (float, None),
    };
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            (whole.is_empty() && digits_only(fraction))
                || (digits_only(whole) && (fraction.is_empty() || digits_only(fraction)))
        }
        None => digits_only(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits_only(e.strip_prefix(['+', '-']).unwrap_or(e)));
    if mantissa_ok && exponent_ok {
        return plain.parse().ok().map(Number::Float);
    }
    None
}

/// Converts free-form YAML (descriptor `metadata`) into a protobuf `Value`, typing plain scalars
/// the way yaml.v2 does (null, YAML 1.1 booleans, numbers, else strings). Errors carry the
/// offending line.
fn to_proto_value(node: &Node) -> Result<prost_types::Value, usize> {
    let kind = match &node.value {
        _ if node.is_null() => Kind::NullValue(0),
        Value::Scalar { text, plain: false } => Kind::StringValue(text.clone()),
        Value::Scalar { text, plain: true } => match yaml11_bool(text) {
            Some(b) => Kind::BoolValue(b),
            None => match yaml11_number(text) {
                Some(Number::Int(n)) => Kind::NumberValue(n as f64),
                Some(Number::Float(f)) if f.is_finite() => Kind::NumberValue(f),
                _ => Kind::StringValue(text.clone()),
            },
        },
        Value::Sequence(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(to_proto_value).collect::<Result<_, _>>()?,
        }),
        Value::Mapping(pairs) => {
            let mut fields = std::collections::BTreeMap::new();
            for (k, v) in pairs {
                let Value::Scalar { text, .. } = &k.value else {
                    return Err(k.line);
                };
                fields.insert(text.clone(), to_proto_value(v)?);
            }
            Kind::StructValue(prost_types::Struct { fields })
        }
    };
    Ok(prost_types::Value { kind: Some(kind) })
}
