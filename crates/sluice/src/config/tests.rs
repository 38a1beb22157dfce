//! Table-driven tests of loading, validation messages and upstream's matching rules.

use std::path::PathBuf;

use super::*;
use crate::proto::DescriptorEntry;

fn load(text: &str) -> Result<RateLimitConfig, ConfigErrors> {
    load_sources(
        vec![(PathBuf::from("limits.yaml"), text.to_string())],
        &LoadOptions::default(),
    )
}

fn errors_of(text: &str) -> Vec<String> {
    match load(text) {
        Ok(_) => panic!("config loaded but should have failed:\n{text}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<DescriptorEntry> {
    pairs
        .iter()
        .map(|(k, v)| DescriptorEntry {
            key: k.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
        })
        .collect()
}

/// The name of the limit a descriptor matches in domain `d`, or `None`.
fn matched<'c>(config: &'c RateLimitConfig, pairs: &[(&str, &str)]) -> Option<&'c str> {
    config
        .domain("d")
        .unwrap()
        .find(&entries(pairs))
        .map(|l| l.name.as_str())
}

const MATCHING: &str = r#"
domain: d
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: second, requests_per_unit: 1, name: exact1}
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 2, name: exact1_sub_any}
  - key: key1
    rate_limit: {unit: hour, requests_per_unit: 3, name: key1_any}
    descriptors:
      - key: sub
        value: x
        rate_limit: {unit: hour, requests_per_unit: 4, name: any_sub_x}
  - key: key1
    value: "pre*"
    rate_limit: {unit: day, requests_per_unit: 5, name: prefix}
  - key: key1
    value: "p*"
    rate_limit: {unit: day, requests_per_unit: 6, name: shorter_prefix_later}
  - key: key1
    value: "bar*b"
    rate_limit: {unit: day, requests_per_unit: 7, name: middle}
  - key: parent
    value: only_children
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 8, name: child}
  - key: empty
    value: ""
    rate_limit: {unit: second, requests_per_unit: 9, name: empty_is_key_only}
  - key: star
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 10, name: star}
"#;

#[test]
fn matching_follows_upstream_rules() {
    let config = load(MATCHING).unwrap();
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: &[Case] = &[
        // Exact beats wildcard and key-only.
        (&[("key1", "value1")], Some("exact1")),
        // Key-only is the default for any other value.
        (&[("key1", "other")], Some("key1_any")),
        // Wildcards in file order: the first match wins even if a later one is "shorter".
        (&[("key1", "prefix")], Some("prefix")),
        (&[("key1", "pxx")], Some("shorter_prefix_later")),
        (&[("key1", "bar123b")], Some("middle")),
        (&[("key1", "bara")], Some("key1_any")),
        // Nested: the exact node's subtree is used.
        (
            &[("key1", "value1"), ("sub", "anything")],
            Some("exact1_sub_any"),
        ),
        // No backtracking: value1 matched exactly, its subtree has no `sub=x`… but has key-only
        // `sub`, so that applies; the key-only sibling's `sub=x` is never considered.
        (&[("key1", "value1"), ("sub", "x")], Some("exact1_sub_any")),
        (&[("key1", "other"), ("sub", "x")], Some("any_sub_x")),
        // Depth must match: a deeper request than the tree gets no limit.
        (&[("key1", "other"), ("sub", "y")], None),
        (&[("key1", "value1"), ("sub", "a"), ("deeper", "b")], None),
        // A request that stops at a node without a limit gets none (no parent fallback).
        (&[("parent", "only_children")], None),
        (
            &[("parent", "only_children"), ("child", "c")],
            Some("child"),
        ),
        // Unknown key or value: no limit.
        (&[("nope", "x")], None),
        (&[("parent", "other")], None),
        // Empty config value is key-only; empty runtime values match key-only and `*`.
        (&[("empty", "")], Some("empty_is_key_only")),
        (&[("empty", "v")], Some("empty_is_key_only")),
        (&[("star", "")], Some("star")),
        (&[("star", "s")], Some("star")),
    ];
    for (request, want) in cases {
        assert_eq!(matched(&config, request), *want, "request {request:?}");
    }
}

#[test]
fn key_and_value_are_matched_separately() {
    // Upstream joins key and value with '_' before the lookup, so key "a" with value "b_c" would
    // hit a config node with key "a_b" and value "c". Here they never cross.
    let config = load(
        "domain: d\ndescriptors:\n  - key: a_b\n    value: c\n    rate_limit: {unit: second, requests_per_unit: 1, name: ab}\n",
    )
    .unwrap();
    assert_eq!(matched(&config, &[("a", "b_c")]), None);
    assert_eq!(matched(&config, &[("a_b", "c")]), Some("ab"));
}

#[test]
fn units_windows_and_parsing() {
    let windows: Vec<u64> = Unit::ALL.iter().map(|u| u.window_secs()).collect();
    assert_eq!(windows, [1, 60, 3600, 86400, 604800, 2592000, 31536000]);
    assert_eq!(Unit::parse("MiNuTe"), Some(Unit::Minute));
    assert_eq!(Unit::parse("fortnight"), None);
    assert_eq!(Unit::from_override(1), Some(Unit::Second));
    assert_eq!(Unit::from_override(6), Some(Unit::Year));
    assert_eq!(Unit::from_override(0), None);
    assert_eq!(
        Unit::from_override(7),
        None,
        "the override enum has no WEEK"
    );
}

#[test]
fn limit_fields_are_compiled() {
    let config = load(
        r#"
domain: d
descriptors:
  - key: files
    value: "dir/*"
    share_threshold: true
    shadow_mode: true
    quota_mode: yes
    metadata: {tier: gold, weight: 2, nested: {ok: true}}
    rate_limit:
      unit: MINUTE
      requests_per_unit: 4294967295
      name: shared
      replaces: [{name: other}]
"#,
    )
    .unwrap();
    let limit = config
        .domain("d")
        .unwrap()
        .find(&entries(&[("files", "dir/a")]))
        .unwrap();
    assert_eq!(
        limit.quota,
        Quota::PerUnit {
            requests_per_unit: u32::MAX,
            unit: Unit::Minute,
            unit_multiplier: 1,
            algorithm: Algorithm::FixedWindow,
        }
    );
    assert!(limit.shadow_mode && limit.quota_mode);
    assert_eq!(limit.replaces, vec!["other".to_string()]);
    assert_eq!(limit.shared_value(0), Some("dir/*"));
    assert_eq!(limit.path, "d.files_dir/*");
    assert_eq!(limit.origin.as_ref().unwrap().line, Some(4));
    let meta = limit.metadata.as_ref().unwrap();
    assert_eq!(meta.fields.len(), 3);
}

#[test]
fn share_threshold_on_an_ancestor_applies_to_the_leaf() {
    let config = load(
        r#"
domain: d
descriptors:
  - key: tenant
    value: "team-*"
    share_threshold: true
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1}
"#,
    )
    .unwrap();
    let limit = config
        .domain("d")
        .unwrap()
        .find(&entries(&[("tenant", "team-a"), ("path", "/x")]))
        .unwrap();
    assert_eq!(limit.shared_value(0), Some("team-*"));
    assert_eq!(limit.shared_value(1), None);
}

#[test]
fn errors_name_line_and_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "descriptors: []\n",
            "limits.yaml:1: config file cannot have empty domain",
        ),
        (
            "domain: \"\"\n",
            "limits.yaml:1: config file cannot have empty domain",
        ),
        ("", "limits.yaml:1: config file cannot have empty domain"),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "limits.yaml:3: descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n",
            "limits.yaml:5: invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
            // A block map's line is its first entry's.
            "limits.yaml:5: invalid rate limit unit ''",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
            "limits.yaml:4: should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - name: \"\"\n",
            "limits.yaml:7: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      name: me\n      replaces: [{name: me}]\n",
            "limits.yaml:7: replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "limits.yaml:3: share_threshold can only be used with wildcard values (containing '*'), but found key 'k'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    colour: blue\n",
            "limits.yaml:4: config error, unknown key 'colour'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n",
            "limits.yaml:6: requests_per_unit must be a whole number from 0 to 4294967295, found: '4294967296'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n",
            "limits.yaml:6: requests_per_unit must be a whole number from 0 to 4294967295, found: '-1'",
        ),
        (
            "domain: d\ndescriptors:\n  - just a string\n",
            "limits.yaml:3: config error, yaml file contains list of type other than map: just a string",
        ),
        (
            "domain: d\n[a]: b\n",
            "limits.yaml:2: config error, key is not of type string: list",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "limits.yaml:5: duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n",
            "limits.yaml:4: duplicate descriptor composite key 'd.a_b'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
            "limits.yaml:4: shadow_mode must be true or false, found: 'maybe'",
        ),
    ];
    for (text, want) in cases {
        let got = errors_of(text);
        assert!(
            got.iter().any(|e| e == want),
            "config:\n{text}\nwant: {want}\ngot:  {got:#?}"
        );
    }
}

#[test]
fn syntax_errors_carry_the_line() {
    let got = errors_of("domain: d\ndescriptors:\n  - key: k\n    value: [unclosed\n");
    assert_eq!(got.len(), 1);
    assert!(got[0].starts_with("limits.yaml:"), "{got:?}");
    assert!(got[0].contains("error loading config file"), "{got:?}");
}

#[test]
fn every_error_is_reported_in_one_run() {
    let got = errors_of(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: nope}\n  - key: b\n    bogus: 1\n",
    );
    assert_eq!(got.len(), 2, "{got:#?}");
}

#[test]
fn misplaced_upstream_keys_warn_but_load() {
    let config = load(
        "domain: d\ndescriptors:\n  - key: k\n    unit: second\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    assert_eq!(config.warnings.len(), 1);
    assert_eq!(config.warnings[0].line, Some(4));
}

#[test]
fn duplicate_domains_and_merging() {
    let a = (PathBuf::from("a.yaml"), "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1, name: x}\n".to_string());
    let b = (PathBuf::from("b.yaml"), "domain: d\ndescriptors:\n  - key: y\n    rate_limit: {unit: second, requests_per_unit: 1, name: y}\n".to_string());
    let err = load_sources(vec![a.clone(), b.clone()], &LoadOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "b.yaml:1: duplicate domain 'd' in config file"
    );

    let merged = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let config = load_sources(vec![a.clone(), b], &merged).unwrap();
    assert_eq!(matched(&config, &[("x", "1")]), Some("x"));
    assert_eq!(matched(&config, &[("y", "1")]), Some("y"));

    // Merging still refuses the same descriptor twice.
    let err = load_sources(
        vec![a.clone(), (PathBuf::from("c.yaml"), a.1.clone())],
        &merged,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "c.yaml:3: duplicate descriptor composite key 'd.x'"
    );
}

#[test]
fn loads_a_directory_recursively_and_skips_configmap_internals() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rel: &str, text: &str| {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("a.yaml", "domain: a\n");
    write("nested/b.yaml", "domain: b\n");
    // Every regular file is a config file, as upstream: `.yml`, no extension, anything.
    write("c.yml", "domain: c\n");
    write("limits", "domain: e\n");
    write("..data/a.yaml", "domain: a\n");
    write(".hidden.yaml", "domain: hidden\n");

    let config = load_dir(dir.path(), &LoadOptions::default()).unwrap();
    let mut names: Vec<&str> = config.domain_names().collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c", "e", "hidden"]);
    let files: Vec<_> = config
        .files
        .iter()
        .map(|f| f.strip_prefix(dir.path()).unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [".hidden.yaml", "a.yaml", "c.yml", "limits", "nested/b.yaml"]
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    // A file that is not YAML config is an error, as upstream, not skipped.
    write("notes.txt", "not yaml");
    let err = load_dir(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("notes.txt"), "{err}");
    std::fs::remove_file(dir.path().join("notes.txt")).unwrap();

    let options = LoadOptions {
        ignore_dotfiles: true,
        ..LoadOptions::default()
    };
    let config = load_dir(dir.path(), &options).unwrap();
    assert!(config.domain("hidden").is_none());

    // A directory with no domain loads, with a warning that says so.
    let empty = tempfile::tempdir().unwrap();
    let config = load_dir(empty.path(), &options).unwrap();
    assert_eq!(config.domain_names().count(), 0);
    assert!(
        config.warnings[0].to_string().contains("no domain loaded"),
        "{:?}",
        config.warnings
    );

    let missing = load_dir(&dir.path().join("missing"), &options).unwrap_err();
    assert!(
        missing.to_string().contains("cannot read config directory"),
        "{missing}"
    );
}

fn algorithm_of(rate_limit: &str) -> Result<Algorithm, Vec<String>> {
    let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{rate_limit}");
    match load(&text) {
        Ok(config) => {
            let limit = config
                .domain("d")
                .unwrap()
                .find(&entries(&[("k", "v")]))
                .unwrap();
            match limit.quota {
                Quota::PerUnit { algorithm, .. } => Ok(algorithm),
                Quota::Unlimited => panic!("unlimited"),
            }
        }
        Err(e) => Err(e.0.iter().map(ToString::to_string).collect()),
    }
}

#[test]
fn record_refused_hits_is_read_per_limit() {
    let limit_of = |rate_limit: &str| {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{rate_limit}");
        let config = load(&text).unwrap_or_else(|e| panic!("{e:?}"));
        let limit = config
            .domain("d")
            .unwrap()
            .find(&entries(&[("k", "v")]))
            .unwrap();
        limit.record_refused_hits
    };
    let gcra = "      unit: second\n      requests_per_unit: 5\n      algorithm: gcra\n";
    assert!(!limit_of(gcra));
    assert!(limit_of(&format!(
        "{gcra}      record_refused_hits: true\n"
    )));
    assert!(!limit_of(&format!(
        "{gcra}      record_refused_hits: false\n"
    )));
}

#[test]
fn hide_from_headers_is_read_per_limit() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, hide_from_headers: true}\n  - key: b\n    rate_limits:\n      - {name: s, unit: second, requests_per_unit: 5}\n      - {name: h, unit: hour, requests_per_unit: 50, hide_from_headers: true}\n";
    let config = load(text).unwrap_or_else(|e| panic!("{e:?}"));
    let domain = config.domain("d").unwrap();
    assert!(
        domain
            .find(&entries(&[("a", "v")]))
            .unwrap()
            .hide_from_headers
    );
    let listed = domain.find_all(&entries(&[("b", "v")]));
    let hidden: Vec<bool> = listed.iter().map(|l| l.hide_from_headers).collect();
    assert_eq!(hidden, [false, true]);
}

#[test]
fn algorithms_and_their_parameters() {
    let ok = |yaml: &str| algorithm_of(yaml).unwrap_or_else(|e| panic!("{yaml}: {e:?}"));
    assert_eq!(
        ok("      unit: second\n      requests_per_unit: 5\n"),
        Algorithm::FixedWindow
    );
    assert_eq!(
        ok("      unit: minute\n      requests_per_unit: 5\n      algorithm: sliding_window_log\n"),
        Algorithm::SlidingWindowLog
    );
    assert_eq!(
        ok(
            "      unit: minute\n      requests_per_unit: 5\n      algorithm: sliding_window_counter\n"
        ),
        Algorithm::SlidingWindowCounter
    );
    // burst defaults to requests_per_unit.
    assert_eq!(
        ok("      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n"),
        Algorithm::TokenBucket { burst: 5 }
    );
    assert_eq!(
        ok(
            "      unit: second\n      requests_per_unit: 5\n      algorithm: gcra\n      burst: 12\n"
        ),
        Algorithm::Gcra { burst: 12 }
    );
    assert_eq!(
        ok(
            "      unit: hour\n      requests_per_unit: 5\n      algorithm: leaky_bucket\n      burst: 1\n"
        ),
        Algorithm::LeakyBucket { burst: 1 }
    );
    // The longest bucket: 71 years (2^51 µs is 71.4), one token a year.
    assert_eq!(
        ok(
            "      unit: year\n      requests_per_unit: 1\n      algorithm: token_bucket\n      burst: 71\n"
        ),
        Algorithm::TokenBucket { burst: 71 }
    );
    assert_eq!(
        ok(
            "      unit: second\n      requests_per_unit: 5\n      algorithm: warm_up\n      warmup_period: 1m30s\n"
        ),
        Algorithm::WarmUp {
            warmup: std::time::Duration::from_secs(90),
            cold_factor: 3.0
        }
    );
    assert_eq!(
        ok(
            "      unit: second\n      requests_per_unit: 5\n      algorithm: warm_up\n      warmup_period: 500ms\n      cold_factor: 2.5\n"
        ),
        Algorithm::WarmUp {
            warmup: std::time::Duration::from_millis(500),
            cold_factor: 2.5
        }
    );
}

#[test]
fn algorithm_parameters_that_make_no_sense_are_refused() {
    let cases: &[(&str, &str)] = &[
        (
            "      unit: second\n      algorithm: sideways\n",
            "limits.yaml:6: unknown algorithm 'sideways' (expected one of: fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra, leaky_bucket, warm_up, concurrency)",
        ),
        (
            "      unit: minute\n      requests_per_unit: 5\n      algorithm: concurrency\n      record_refused_hits: true\n",
            "limits.yaml:8: record_refused_hits does not apply to algorithm concurrency",
        ),
        (
            "      unit: minute\n      requests_per_unit: 5\n      algorithm: concurrency\n      burst: 2\n",
            "limits.yaml:8: burst does not apply to algorithm concurrency",
        ),
        (
            "      unit: minute\n      requests_per_unit: 0\n      algorithm: concurrency\n",
            "limits.yaml:6: requests_per_unit must be at least 1 for concurrency (use fixed_window with 0 to refuse everything)",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n      burst: 0\n",
            "limits.yaml:8: burst must be at least 1",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      burst: 3\n",
            "limits.yaml:7: burst does not apply to algorithm fixed_window",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      algorithm: sliding_window_log\n      warmup_period: 1s\n",
            "limits.yaml:8: warmup_period does not apply to algorithm sliding_window_log",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      algorithm: warm_up\n",
            "limits.yaml:5: warm_up needs warmup_period (for example 10s)",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      algorithm: warm_up\n      warmup_period: soon\n",
            "limits.yaml:8: warmup_period: expected a duration such as 500ms, 10s or 1m30s, found \"soon\"",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      algorithm: warm_up\n      warmup_period: 1s\n      cold_factor: 1\n",
            "limits.yaml:9: cold_factor must be a number above 1 and at most 1000, found '1'",
        ),
        (
            "      unlimited: true\n      algorithm: gcra\n",
            "limits.yaml:6: algorithm has no meaning on an unlimited rate limit",
        ),
        (
            "      unlimited: true\n      record_refused_hits: true\n",
            "limits.yaml:6: record_refused_hits has no meaning on an unlimited rate limit",
        ),
        (
            "      unlimited: true\n      hide_from_headers: true\n",
            "limits.yaml:6: hide_from_headers has no meaning on an unlimited rate limit",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      hide_from_headers: yes please\n",
            "limits.yaml:7: hide_from_headers must be true or false, found: 'yes please'",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      record_refused_hits: true\n",
            "limits.yaml:7: record_refused_hits does not apply to algorithm fixed_window (it always counts refused hits)",
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      algorithm: gcra\n      record_refused_hits: maybe\n",
            "limits.yaml:8: record_refused_hits must be true or false, found: 'maybe'",
        ),
        (
            "      unit: second\n      requests_per_unit: 0\n      algorithm: gcra\n",
            "limits.yaml:6: requests_per_unit must be at least 1 for gcra (use fixed_window with 0 to refuse everything)",
        ),
        (
            "      unit: second\n      requests_per_unit: 2000000\n      algorithm: token_bucket\n",
            "limits.yaml:6: token_bucket counts in microseconds: at most 1000000 per second",
        ),
        (
            "      unit: day\n      requests_per_unit: 100001\n      algorithm: sliding_window_log\n",
            "limits.yaml:6: sliding_window_log keeps one entry per admitted request, so it allows at most 100000 per window; use sliding_window_counter above that",
        ),
        (
            "      unit: year\n      requests_per_unit: 1\n      algorithm: gcra\n      burst: 1000000\n",
            "limits.yaml:8: burst times the time per request exceeds 2^51 microseconds (about 71 years)",
        ),
        (
            // 72 years; 71 load (above): a TAT two bucket spans ahead must stay exact in Lua.
            "      unit: year\n      requests_per_unit: 1\n      algorithm: token_bucket\n      burst: 72\n",
            "limits.yaml:8: burst times the time per request exceeds 2^51 microseconds (about 71 years)",
        ),
    ];
    for (yaml, want) in cases {
        let got = algorithm_of(yaml).expect_err(yaml);
        assert!(
            got.iter().any(|e| e == want),
            "{yaml}\nwant: {want}\ngot:  {got:#?}"
        );
    }
    // Extension keys outside rate_limit.
    let got = errors_of("domain: d\ndescriptors:\n  - key: k\n    burst: 3\n");
    assert_eq!(
        got,
        ["limits.yaml:4: config error, 'burst' is only valid under rate_limit"]
    );
}

/// The limit `k=v` of domain `d` gets, as (requests per unit, unit) or "unlimited".
fn limit_of(config: &RateLimitConfig) -> String {
    let limit = config
        .domain("d")
        .unwrap()
        .find(&entries(&[("k", "v")]))
        .unwrap();
    match &limit.quota {
        Quota::PerUnit {
            requests_per_unit,
            unit,
            ..
        } => format!("{requests_per_unit}/{}", unit.name()),
        Quota::Unlimited => "unlimited".into(),
    }
}

#[test]
fn yaml_forms_upstreams_yaml_v2_accepts_load() {
    let one = |rate_limit: &str| {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n");
        match load(&text) {
            Ok(config) => Ok(limit_of(&config)),
            Err(e) => Err(e.to_string()),
        }
    };
    // YAML 1.1 integers, as yaml.v2 resolves them.
    for (written, read) in [
        ("1_000", 1000),
        ("0x10", 16),
        ("0X1f", 31),
        ("0o17", 15),
        ("010", 8),
        ("08", 8),
        ("0b101", 5),
        ("+5", 5),
        ("1e3", 1000),
        ("100.0", 100),
        ("4_294_967_295", u32::MAX),
    ] {
        assert_eq!(
            one(&format!("{{unit: minute, requests_per_unit: {written}}}")),
            Ok(format!("{read}/{}", Unit::Minute.name())),
            "{written}"
        );
    }
    for refused in [
        "-1",
        "4294967296",
        "1.5",
        "'5'",
        "ten",
        "0x",
        "+-5",
        "2001-12-14",
    ] {
        let err = one(&format!("{{unit: minute, requests_per_unit: {refused}}}")).unwrap_err();
        assert!(
            err.contains("requests_per_unit must be a whole number"),
            "{refused}: {err}"
        );
    }

    // `unit: ""` (or any text that is not a unit) beside `unlimited: true`, as upstream.
    assert_eq!(one("{unlimited: true, unit: \"\"}").unwrap(), "unlimited");
    let config = load("domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unlimited: true, unit: forever}\n").unwrap();
    assert_eq!(limit_of(&config), "unlimited");
    assert!(
        config.warnings[0].to_string().contains("unit 'forever'"),
        "{:?}",
        config.warnings
    );

    // Duplicate keys: the last one counts, with a warning.
    let config = load(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      requests_per_unit: 2\n",
    )
    .unwrap();
    assert_eq!(limit_of(&config), "2/second");
    assert_eq!(
        config.warnings[0].to_string(),
        "limits.yaml:8: duplicate key 'requests_per_unit': this later value is the one used"
    );

    // Merge keys, one map or a list of maps; the map's own keys win.
    let config = load(
        "domain: d\n\
         descriptors:\n\
         \x20 - key: k\n\
         \x20   value: v\n\
         \x20   rate_limit:\n\
         \x20     <<: [{unit: hour, requests_per_unit: 3}, {unit: day, name: n}]\n\
         \x20     requests_per_unit: 4\n\
         \x20 - &base\n\
         \x20   key: other\n\
         \x20   rate_limit: {unit: minute, requests_per_unit: 9}\n\
         \x20 - <<: *base\n\
         \x20   key: third\n",
    )
    .unwrap();
    assert_eq!(limit_of(&config), "4/hour");
    let third = config
        .domain("d")
        .unwrap()
        .find(&entries(&[("third", "x")]))
        .unwrap();
    assert!(
        matches!(
            third.quota,
            Quota::PerUnit {
                requests_per_unit: 9,
                ..
            }
        ),
        "{:?}",
        third.quota
    );
}

#[test]
fn metadata_scalars_are_typed_as_yaml_1_1() {
    let config = load(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    metadata: {a: 0x10, b: yes, c: 1_000, d: '0x10', e: .inf}\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let limit = config
        .domain("d")
        .unwrap()
        .find(&entries(&[("k", "v")]))
        .unwrap();
    let fields = &limit.metadata.as_ref().unwrap().fields;
    use prost_types::value::Kind;
    let kind = |k: &str| fields[k].kind.clone().unwrap();
    assert_eq!(kind("a"), Kind::NumberValue(16.0));
    assert_eq!(kind("b"), Kind::BoolValue(true));
    assert_eq!(kind("c"), Kind::NumberValue(1000.0));
    assert_eq!(kind("d"), Kind::StringValue("0x10".into()));
    assert_eq!(kind("e"), Kind::StringValue(".inf".into()));
}
