//! Compilation: validated specs turned into the lookup tree of each domain (`Domain`, `Level`,
//! `TreeNode`), with every `Limit` carrying what a decision and its stats need, and the limits
//! numbered so per-limit state kept beside the config can find them by id.

use std::collections::HashSet;

use super::validate::DescriptorSpec;
use crate::config::{
    Children, ConfigError, Domain, Level, Limit, Member, Origin, RateLimitConfig, Stats, TreeNode,
    Wildcard,
};

/// Compiles each domain's validated descriptors into its lookup tree, in declaration order.
pub(super) fn domains(
    domains: Vec<(String, Vec<DescriptorSpec>)>,
    errors: &mut Vec<ConfigError>,
) -> RateLimitConfig {
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
            errors,
        );
        config.domains.insert(name.into(), domain);
    }
    config
}

/// Numbers the limits (in domain-name order, so the same files give the same ids), so
/// per-limit state kept beside the config (metric handles) can be found by id.
pub(super) fn number_limits(config: &mut RateLimitConfig) {
    let mut domains: Vec<_> = config.domains.iter_mut().collect();
    domains.sort_by(|a, b| a.0.cmp(b.0));
    let limits = domains.into_iter().flat_map(|(_, d)| d.nodes.iter_mut());
    let mut count = 0;
    for (id, limit) in limits.flat_map(|n| n.limits.iter_mut()).enumerate() {
        limit.id = Some(id);
        count = id + 1;
    }
    config.limit_count = count;
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
    for mut spec in specs {
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
        let limits = limits_of(&mut spec, &shared, &stats, &path);
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

/// The limits of one descriptor, each carrying what its decisions and stats need: the
/// descriptor's modes and metadata, the shared wildcard values and stats naming gathered on the
/// way down, and, for a `rate_limits` list, its place in the list.
fn limits_of(
    spec: &mut DescriptorSpec,
    shared: &[(usize, Box<str>)],
    stats: &StatsPath,
    path: &str,
) -> Vec<Limit> {
    let of = spec.limits.len();
    std::mem::take(&mut spec.limits)
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
                hide_from_headers: l.hide_from_headers,
                shadow_mode: spec.shadow_mode,
                quota_mode: spec.quota_mode,
                metadata: spec.metadata.clone(),
                shared_values: shared.to_vec(),
                stats: Stats {
                    key: format!("{}{suffix}", stats.segments.join(".")),
                    segments: stats.segments.clone(),
                    value_levels: stats.value_levels.clone(),
                    detailed: spec.detailed_metric,
                    suffix,
                },
                path: path.to_owned(),
                origin: Some(Origin {
                    file: spec.file.clone(),
                    line: l.line.or(spec.line),
                }),
                member,
                calendar: l.calendar,
            }
        })
        .collect()
}

/// The stats naming gathered on the way down the tree.
#[derive(Debug, Clone, Default)]
struct StatsPath {
    segments: Vec<String>,
    value_levels: Vec<usize>,
}
