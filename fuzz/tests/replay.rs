//! The plain runner replays every target's seeds through its worker process without a finding,
//! and refuses a target it does not know. Being an integration test also makes `cargo test
//! --workspace --no-run` build `plain` itself, with the same features as everything else in that
//! build, so the test command fuzzes with the binary of its one build instead of building the
//! fuzz crate again.

use std::path::Path;
use std::process::Command;

fn replay(target: &str) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let artifacts = std::env::temp_dir().join(format!(
        "sluice-fuzz-replay-{}-{target}",
        std::process::id()
    ));
    let output = Command::new(env!("CARGO_BIN_EXE_plain"))
        .args([target, "--seconds", "0", "--artifacts"])
        .arg(&artifacts)
        .arg(root.join("seeds").join(target))
        .output()
        .expect("running the plain runner");
    let _ = std::fs::remove_dir_all(&artifacts);
    output
}

#[test]
fn every_target_replays_its_seeds_without_a_finding() {
    for target in ["config_loader", "request"] {
        let output = replay(target);
        assert!(
            output.status.success(),
            "{target}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(said.contains("plain: "), "{target} said nothing: {said}");
    }
}

#[test]
fn an_unknown_target_is_refused() {
    let output = replay("no_such_target");
    assert!(!output.status.success());
}
