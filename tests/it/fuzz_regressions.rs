//! Regression tests for what fuzzing found (see docs/fuzzing.md): one test per distinct bug,
//! with the smallest input that shows it. All of them are fixed; a newly found bug that cannot be
//! fixed at once would be `#[ignore]`d with its reason (`-- --include-ignored` runs it), so CI
//! stays green until the fix removes the attribute.
//!
//! A stack overflow aborts the whole process (it is not a panic), which would take every other
//! test of this binary down with it. Such a test therefore runs its input in a child process
//! (this test binary, filtered to the one test) and judges the child's exit status.

use std::path::PathBuf;
use std::process::Command;

use sluice::config::{ConfigErrors, LoadOptions, RateLimitConfig, load_sources};

/// Set in the child process to the name of the test it must run in-process.
const CHILD_ENV: &str = "SLUICE_FUZZ_REGRESSION_CHILD";

fn load(text: String) -> Result<RateLimitConfig, ConfigErrors> {
    load_sources(
        vec![(PathBuf::from("fuzz.yaml"), text)],
        &LoadOptions::default(),
    )
}

/// True in the child started by [`in_child_process`] for `test`.
fn is_child(test: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(test)
}

/// Runs `test` of this binary in a child process and fails with its exit status and the end of
/// its output unless it succeeded.
fn in_child_process(test: &str) {
    let output = Command::new(std::env::current_exe().expect("own path"))
        .arg(sluice_test_kit::test_path(module_path!(), test))
        .args(["--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, test)
        .output()
        .expect("start the test binary again");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: String = stderr
        .lines()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        output.status.success(),
        "the child running {test} failed: {}\n{tail}",
        output.status
    );
}

/// The line of an error, as `check-config` prints it.
fn error_lines(text: &str) -> Vec<usize> {
    match load(text.to_string()) {
        Ok(_) => panic!("{text:?} loaded"),
        Err(errors) => errors.0.iter().filter_map(|e| e.line).collect(),
    }
}

/// Found by the first `config_loader` run (input: the example config cut at 51 lines, no final
/// newline). yaml-rust2 notices `c` is not a key only at the end of the stream and reports the
/// line after the last one: 3 here, in a 2-line file. Not a bug, but the harness bound is one
/// past the end, and this pins it: an error must never point further away than that.
#[test]
fn an_error_at_the_end_names_at_most_the_line_after_the_last() {
    assert_eq!(error_lines("domain: d\nc"), vec![3]);
    assert_eq!(error_lines("domain: d\nc\n"), vec![3]);
}

/// Found by the first run as well (input `\r\r\r\r\r\xe5`): the error is on line 6, which looked
/// wrong to `str::lines` (one line). YAML counts a lone CR as a line break, and so do old Mac
/// editors: line 6 is right, and must stay consistent with CR LF and LF files.
#[test]
fn a_lone_carriage_return_ends_a_line() {
    assert_eq!(error_lines("\r\r\r\r\r\u{e5}"), vec![6]);
    assert_eq!(error_lines("\r\n\r\n\r\n\r\n\r\n\u{e5}"), vec![6]);
    assert_eq!(error_lines("\n\n\n\n\n\u{e5}"), vec![6]);
}

/// BUG: a deeply nested block collection aborts the process with a stack overflow instead of
/// failing to load. `sluice::config::yaml::parse` (src/config/yaml.rs:62) calls
/// `yaml_rust2::parser::Parser::load`, whose `load_node` → `load_sequence`/`load_mapping`
/// recursion has no depth limit (yaml-rust2 only limits *flow* nesting, `[[[`, and returns
/// "recursion limit exceeded" for that). 50 000 levels of `- ` are a 100 KB file; about 5 000 are
/// enough on a 2 MiB thread (Tokio's worker default), 20 000 on an 8 MiB main thread.
/// `sluice check-config` and `serve` die with SIGABRT; upstream's yaml.v2 stops at a depth of
/// 10 000 with an error. The tree built from it would overflow again when `to_proto_value`
/// (src/config/load.rs) converts it and when it is dropped, both recursive, so the fix is a depth
/// limit applied while reading events (drive `Parser::next_token` in a loop rather than `load`).
#[test]
fn deeply_nested_block_yaml_is_an_error_not_an_abort() {
    const NAME: &str = "deeply_nested_block_yaml_is_an_error_not_an_abort";
    if !is_child(NAME) {
        return in_child_process(NAME);
    }
    let text = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      a:\n        {}x\n",
        "- ".repeat(50_000)
    );
    assert!(load(text).is_err(), "a 50 000-deep document loaded");
}

/// BUG: YAML aliases are expanded without any bound ("billion laughs"). `TreeBuilder`
/// (src/config/yaml.rs:155, `Event::Alias`) clones the anchored node for every alias, so each
/// level of ten aliases multiplies the tree by ten: this 364-byte file builds a million nodes
/// (~180 MB; seven levels take 1.8 GB and 3.6 s, nine exhaust any machine). Config files are
/// operator input, but a ConfigMap typo or a hostile file then takes the service down by memory
/// instead of being refused with a line number. Upstream's yaml.v2 refuses such a document
/// ("document contains excessive aliasing"). Fix: count expanded nodes (or alias uses against
/// document size) in `TreeBuilder` and fail past a bound.
#[test]
fn alias_expansion_is_bounded() {
    let mut text = String::from(
        "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      l0: &a0 [x,x,x,x,x,x,x,x,x,x]\n",
    );
    for level in 1..6 {
        let previous = format!("*a{}", level - 1);
        let list = [previous.as_str(); 10].join(",");
        text.push_str(&format!("      l{level}: &a{level} [{list}]\n"));
    }
    assert!(text.len() < 400, "{} bytes", text.len());
    assert!(
        load(text).is_err(),
        "a document that expands to a million nodes loaded"
    );
}

/// Issue #27 item 9: an xDS resource is turned into a tree and validated as a file is, but the
/// nesting limit lived only in the YAML reader, so a control plane could nest descriptors (or
/// metadata) as deep as protobuf decoding allows (100), deeper than any file may. One limit for
/// every source: whatever depth a file may have, a resource may have, and one level more is
/// refused by both with the same reason.
#[test]
fn xds_resources_have_the_nesting_limit_of_files() {
    use sluice::config::load_resources;
    use sluice::proto::ratelimit::config::ratelimit::v3 as rl;

    // Descriptors nested `levels` deep, the innermost limited.
    let file = |levels: usize| {
        let mut text = String::from("domain: d\ndescriptors:\n");
        for level in 0..levels {
            let pad = "    ".repeat(level);
            text.push_str(&format!("{pad}  - key: k{level}\n"));
            if level + 1 < levels {
                text.push_str(&format!("{pad}    descriptors:\n"));
            } else {
                text.push_str(&format!(
                    "{pad}    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
                ));
            }
        }
        text
    };
    let resource = |levels: usize| {
        let mut descriptor = rl::RateLimitDescriptor {
            key: format!("k{}", levels - 1),
            rate_limit: Some(rl::RateLimitPolicy {
                unit: rl::RateLimitUnit::Hour as i32,
                requests_per_unit: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        for level in (0..levels - 1).rev() {
            descriptor = rl::RateLimitDescriptor {
                key: format!("k{level}"),
                descriptors: vec![descriptor],
                ..Default::default()
            };
        }
        rl::RateLimitConfig {
            name: "deep".into(),
            domain: "d".into(),
            descriptors: vec![descriptor],
        }
    };
    let options = LoadOptions::default();
    let deepest = (1..100)
        .take_while(|&levels| load(file(levels)).is_ok())
        .last()
        .expect("a one-level file loads");
    let refused = load(file(deepest + 1)).unwrap_err().to_string();
    assert!(
        refused.contains("nesting deeper than 64 levels"),
        "{refused}"
    );
    assert!(
        load_resources(&[resource(deepest)], &options).is_ok(),
        "{deepest} levels load from a file and must from xDS"
    );
    let refused = match load_resources(&[resource(deepest + 1)], &options) {
        Ok(_) => panic!("{} levels of descriptors loaded from xDS", deepest + 1),
        Err(errors) => errors.to_string(),
    };
    assert!(
        refused.starts_with("deep: nesting deeper than 64 levels"),
        "{refused}"
    );

    // Metadata nested 90 deep (protobuf decodes up to 100).
    let mut metadata = prost_types::Struct::default();
    for _ in 0..90 {
        let mut outer = prost_types::Struct::default();
        outer.fields.insert(
            "m".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StructValue(metadata)),
            },
        );
        metadata = outer;
    }
    let mut config = resource(1);
    config.descriptors[0].metadata = Some(metadata);
    assert!(
        load_resources(&[config], &options).is_err(),
        "metadata 90 levels deep loaded from xDS"
    );
}
