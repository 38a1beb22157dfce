//! xDS resources (`ratelimit.config.ratelimit.v3.RateLimitConfig`) into a [`RateLimitConfig`].
//!
//! Each resource is turned into the document tree a YAML file would give and handed to the same
//! validator as files (`load::load_documents`), so both sources accept and refuse exactly the
//! same configurations and compile them alike; errors name the resource instead of a file and
//! line. This is upstream's approach too (its xDS provider converts to its YAML structs).
//! The fields that exist only in files (`share_threshold`, `value_to_metric`, Sluice's
//! algorithms) have no field in the resource, so an xDS config never uses them.

use std::path::PathBuf;

use prost_types::value::Kind;

use super::load::{self, Document, LoadOptions};
use super::yaml::{Node, Value};
use super::{ConfigErrors, RateLimitConfig};
use crate::proto::ratelimit::config::ratelimit::v3 as xds;

/// Validates and compiles one xDS response's resources into a whole configuration.
/// `MERGE_DOMAIN_CONFIG` (in `options`) decides whether two resources may declare one domain.
pub fn load_resources(
    resources: &[xds::RateLimitConfig],
    options: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let documents = resources
        .iter()
        .enumerate()
        .map(|(i, resource)| {
            // Errors are prefixed by the resource name, as upstream's are.
            let name = if resource.name.is_empty() {
                format!("resource #{i}")
            } else {
                resource.name.clone()
            };
            (PathBuf::from(name), Document::Tree(config_tree(resource)))
        })
        .collect();
    load::load_documents(documents, options)
}

fn config_tree(resource: &xds::RateLimitConfig) -> Node {
    mapping(vec![
        ("domain", string(&resource.domain)),
        ("descriptors", descriptors(&resource.descriptors)),
    ])
}

fn descriptors(list: &[xds::RateLimitDescriptor]) -> Node {
    node(Value::Sequence(list.iter().map(descriptor).collect()))
}

fn descriptor(d: &xds::RateLimitDescriptor) -> Node {
    let mut fields = vec![("key", string(&d.key)), ("value", string(&d.value))];
    if let Some(policy) = &d.rate_limit {
        fields.push(("rate_limit", rate_limit(policy)));
    }
    if !d.descriptors.is_empty() {
        fields.push(("descriptors", descriptors(&d.descriptors)));
    }
    // proto3 booleans cannot be told unset from false; false is the files' default as well.
    for (name, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            fields.push((name, plain("true")));
        }
    }
    if let Some(metadata) = &d.metadata {
        fields.push(("metadata", struct_tree(metadata)));
    }
    mapping(fields)
}

fn rate_limit(policy: &xds::RateLimitPolicy) -> Node {
    let mut fields = vec![(
        "requests_per_unit",
        plain(&policy.requests_per_unit.to_string()),
    )];
    // UNKNOWN is the enum's zero, which is also what an unlimited policy leaves unset; upstream
    // treats it as "no unit": fine when unlimited, "invalid rate limit unit 'UNKNOWN'" otherwise.
    let unit = xds::RateLimitUnit::try_from(policy.unit).unwrap_or(xds::RateLimitUnit::Unknown);
    if unit != xds::RateLimitUnit::Unknown || !policy.unlimited {
        fields.push(("unit", string(unit.as_str_name())));
    }
    if policy.unlimited {
        fields.push(("unlimited", plain("true")));
    }
    if !policy.name.is_empty() {
        fields.push(("name", string(&policy.name)));
    }
    if !policy.replaces.is_empty() {
        let entries = policy
            .replaces
            .iter()
            .map(|r| mapping(vec![("name", string(&r.name))]))
            .collect();
        fields.push(("replaces", node(Value::Sequence(entries))));
    }
    mapping(fields)
}

/// A `google.protobuf.Struct` as the YAML tree that `load` converts back into the same Struct.
fn struct_tree(value: &prost_types::Struct) -> Node {
    node(Value::Mapping(
        value
            .fields
            .iter()
            .map(|(k, v)| (string(k), value_tree(v)))
            .collect(),
    ))
}

fn value_tree(value: &prost_types::Value) -> Node {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => plain("null"),
        Some(Kind::BoolValue(b)) => plain(if *b { "true" } else { "false" }),
        // Rust's shortest round-trip form, which `load` parses back to the same f64.
        Some(Kind::NumberValue(n)) if n.is_finite() => plain(&n.to_string()),
        Some(Kind::NumberValue(n)) => string(&n.to_string()),
        Some(Kind::StringValue(s)) => string(s),
        Some(Kind::ListValue(list)) => node(Value::Sequence(
            list.values.iter().map(value_tree).collect(),
        )),
        Some(Kind::StructValue(s)) => struct_tree(s),
    }
}

fn node(value: Value) -> Node {
    Node { line: 0, value }
}

/// A string exactly as given: never read as a number, boolean or null.
fn string(text: &str) -> Node {
    node(Value::Scalar {
        text: text.to_string(),
        plain: false,
    })
}

/// A plain scalar (`true`, a number).
fn plain(text: &str) -> Node {
    node(Value::Scalar {
        text: text.to_string(),
        plain: true,
    })
}

fn mapping(fields: Vec<(&str, Node)>) -> Node {
    node(Value::Mapping(
        fields.into_iter().map(|(k, v)| (string(k), v)).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Quota;

    fn limit(unit: xds::RateLimitUnit, requests_per_unit: u32) -> Option<xds::RateLimitPolicy> {
        Some(xds::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        })
    }

    fn resource(
        name: &str,
        domain: &str,
        descriptors: Vec<xds::RateLimitDescriptor>,
    ) -> xds::RateLimitConfig {
        xds::RateLimitConfig {
            name: name.into(),
            domain: domain.into(),
            descriptors,
        }
    }

    /// Envoy Gateway's shape: top key = value = the rule name, a header child, and the limit on
    /// the last node of `masked_remote_address` / `remote_address`.
    #[test]
    fn envoy_gateway_resource_compiles_like_its_yaml() {
        let rule = "httproute/default/backend/rule/0/match/0/*";
        let leaf = xds::RateLimitDescriptor {
            key: "remote_address".into(),
            rate_limit: limit(xds::RateLimitUnit::Week, 3),
            shadow_mode: true,
            ..Default::default()
        };
        let masked = xds::RateLimitDescriptor {
            key: "masked_remote_address".into(),
            value: "0.0.0.0/0".into(),
            descriptors: vec![leaf],
            ..Default::default()
        };
        let header = xds::RateLimitDescriptor {
            key: "rule-0-match-0".into(),
            value: "rule-0-match-0".into(),
            descriptors: vec![masked],
            ..Default::default()
        };
        let top = xds::RateLimitDescriptor {
            key: rule.into(),
            value: rule.into(),
            descriptors: vec![header],
            ..Default::default()
        };
        let from_xds = load_resources(
            &[resource("default/eg/http", "default/eg/http", vec![top])],
            &LoadOptions::default(),
        )
        .unwrap();
        let yaml = format!(
            "domain: default/eg/http\ndescriptors:\n  - key: '{rule}'\n    value: '{rule}'\n    descriptors:\n      - key: rule-0-match-0\n        value: rule-0-match-0\n        descriptors:\n          - key: masked_remote_address\n            value: 0.0.0.0/0\n            descriptors:\n              - key: remote_address\n                shadow_mode: true\n                rate_limit: {{unit: week, requests_per_unit: 3}}\n"
        );
        let from_file =
            super::super::load_sources(vec![("x.yaml".into(), yaml)], &LoadOptions::default())
                .unwrap();
        let lines = |c: &RateLimitConfig| {
            c.limits()
                .iter()
                .map(|l| l.to_string().split(" (").next().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(lines(&from_xds), lines(&from_file));
        let limits = from_xds.limits();
        assert_eq!(limits.len(), 1);
        assert!(limits[0].shadow_mode);
        assert!(matches!(
            limits[0].quota,
            Quota::PerUnit {
                requests_per_unit: 3,
                ..
            }
        ));
        assert_eq!(
            limits[0].origin.as_ref().unwrap().to_string(),
            "default/eg/http"
        );
    }

    #[test]
    fn errors_are_prefixed_by_the_resource_name() {
        let bad = xds::RateLimitDescriptor {
            key: "k".into(),
            rate_limit: limit(xds::RateLimitUnit::Unknown, 1),
            ..Default::default()
        };
        let errors = load_resources(
            &[resource("first", "d", vec![bad])],
            &LoadOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(errors, "first: invalid rate limit unit 'UNKNOWN'");
    }

    #[test]
    fn unlimited_needs_no_unit_and_refuses_one() {
        let unlimited = |unit: xds::RateLimitUnit| xds::RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(xds::RateLimitPolicy {
                unit: unit as i32,
                unlimited: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let ok = load_resources(
            &[resource(
                "r",
                "d",
                vec![unlimited(xds::RateLimitUnit::Unknown)],
            )],
            &LoadOptions::default(),
        );
        assert!(matches!(ok.unwrap().limits()[0].quota, Quota::Unlimited));
        let refused = load_resources(
            &[resource(
                "r",
                "d",
                vec![unlimited(xds::RateLimitUnit::Second)],
            )],
            &LoadOptions::default(),
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "r: should not specify rate limit unit when unlimited"
        );
    }

    #[test]
    fn one_domain_in_two_resources_needs_merge_domain_config() {
        let d = |key: &str| xds::RateLimitDescriptor {
            key: key.into(),
            rate_limit: limit(xds::RateLimitUnit::Second, 1),
            ..Default::default()
        };
        let both = [
            resource("a", "d", vec![d("x")]),
            resource("b", "d", vec![d("y")]),
        ];
        let refused = load_resources(&both, &LoadOptions::default()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "b: duplicate domain 'd' in config file"
        );
        let merged = LoadOptions {
            merge_domains: true,
            ..LoadOptions::default()
        };
        assert_eq!(load_resources(&both, &merged).unwrap().limits().len(), 2);
    }

    #[test]
    fn metadata_survives_the_trip() {
        let mut fields = std::collections::BTreeMap::new();
        let text = |s: &str| prost_types::Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        fields.insert("team".to_string(), text("true"));
        fields.insert(
            "weight".to_string(),
            prost_types::Value {
                kind: Some(Kind::NumberValue(0.25)),
            },
        );
        let metadata = prost_types::Struct { fields };
        let d = xds::RateLimitDescriptor {
            key: "k".into(),
            rate_limit: limit(xds::RateLimitUnit::Minute, 5),
            metadata: Some(metadata.clone()),
            ..Default::default()
        };
        let config =
            load_resources(&[resource("r", "d", vec![d])], &LoadOptions::default()).unwrap();
        assert_eq!(config.limits()[0].metadata.as_ref(), Some(&metadata));
    }

    #[test]
    fn no_resources_is_an_empty_config() {
        let config = load_resources(&[], &LoadOptions::default()).unwrap();
        assert_eq!(config.domain_names().count(), 0);
    }
}
