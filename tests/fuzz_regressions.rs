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
        .args([test, "--exact", "--include-ignored", "--nocapture"])
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
