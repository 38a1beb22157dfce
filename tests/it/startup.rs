//! Start-up and `check-config`: a bad config is refused with file, line and reason.

use sluice_test_kit as kit;

use std::process::Command;

use kit::*;

/// What `sluice serve` on `dir` printed on standard error as it refused to start (the kit's
/// `refused_start` fails the test when it starts, or keeps running).
fn refusal(dir: &std::path::Path) -> String {
    refused_start(&mut sluice_command(dir)).1
}

#[test]
fn bad_configs_stop_the_service_with_file_line_and_reason() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "syntax.yaml",
            "domain: d\ndescriptors:\n  - key: [oops\n",
            "syntax.yaml:",
        ),
        (
            "unknown.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    colour: red\n",
            "unknown.yaml:4: config error, unknown key 'colour'",
        ),
        (
            "unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
            "unit.yaml:4: invalid rate limit unit 'fortnight'",
        ),
    ];
    for (name, text, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name), text).unwrap();
        let stderr = refusal(dir.path());
        assert!(stderr.contains(want), "{name}: want {want:?} in\n{stderr}");
    }

    // Duplicate domain across two files.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: d\n").unwrap();
    std::fs::write(dir.path().join("b.yaml"), "domain: d\n").unwrap();
    let stderr = refusal(dir.path());
    assert!(
        stderr.contains("b.yaml:1: duplicate domain 'd' in config file"),
        "{stderr}"
    );

    // Unreadable: a dangling link and a file that is not UTF-8.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(dir.path().join("missing"), dir.path().join("gone.yaml")).unwrap();
    std::fs::write(dir.path().join("binary.yaml"), [0xff, 0xfe, 0x00]).unwrap();
    let stderr = refusal(dir.path());
    assert!(stderr.contains("gone.yaml: cannot read file"), "{stderr}");
    assert!(stderr.contains("binary.yaml: cannot read file"), "{stderr}");

    // A missing directory.
    let stderr = refusal(&dir.path().join("nope"));
    assert!(stderr.contains("cannot read config directory"), "{stderr}");
}

#[test]
fn check_config_prints_limits_or_errors() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/config");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check-config", example])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fixed_window"), "{stdout}");
    assert!(stdout.contains(": OK,"), "{stdout}");

    let dir = config_dir(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: nope}\n  - value: x\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("config.yaml:4: invalid rate limit unit 'nope'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("config.yaml:5: descriptor has empty key"),
        "{stderr}"
    );
    assert!(stderr.contains("2 error(s)"), "{stderr}");
}

#[test]
fn check_config_loads_every_file_as_upstream_and_warns_on_an_empty_directory() {
    let check = |dir: &std::path::Path, env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("check-config")
            .arg(dir)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let limit = |domain: &str| {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yml"), limit("yml")).unwrap();
    std::fs::write(dir.path().join("limits"), limit("bare")).unwrap();
    std::fs::write(dir.path().join(".dot.yaml"), limit("dot")).unwrap();
    // Kubernetes' ConfigMap layout: the real files under `..<timestamp>`, reached through `..data`.
    std::fs::create_dir(dir.path().join("..2026_11_24")).unwrap();
    std::fs::write(dir.path().join("..2026_11_24/limits.yml"), limit("yml")).unwrap();
    std::os::unix::fs::symlink("..2026_11_24", dir.path().join("..data")).unwrap();

    let (stdout, stderr) = check(dir.path(), &[]);
    for file in ["limits.yml", "limits", ".dot.yaml"] {
        let line = format!("loaded {}", dir.path().join(file).display());
        assert!(stdout.contains(&line), "{line} missing in\n{stdout}");
    }
    assert!(!stdout.contains("..2026"), "{stdout}");
    assert!(stdout.contains("OK, 3 file(s), 3 domain(s)"), "{stdout}");
    assert!(!stderr.contains("warning"), "{stderr}");

    let (stdout, _) = check(dir.path(), &[("RUNTIME_IGNOREDOTFILES", "true")]);
    assert!(stdout.contains("OK, 2 file(s), 2 domain(s)"), "{stdout}");

    let empty = tempfile::tempdir().unwrap();
    let (stdout, stderr) = check(empty.path(), &[]);
    assert!(stdout.contains("OK, 0 file(s), 0 domain(s)"), "{stdout}");
    assert!(
        stderr.contains("warning: ") && stderr.contains("no domain loaded"),
        "{stderr}"
    );
}

#[test]
fn serve_reads_upstreams_environment_without_flags() {
    // RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, as upstream's manifests set them.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("limits.yaml"),
        "domain: env\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, name: from_env}\n",
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("serve")
        .env_clear()
        .env("RUNTIME_ROOT", root.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("DEBUG_PORT", "0")
        .env("LOG_FORMAT", "json");
    let sluice = Sluice::spawn(cmd);
    let (status, _) = sluice.http("GET", "/healthcheck", "");
    assert_eq!(status, 200);
    let (status, body) = sluice.http(
        "POST",
        "/json",
        r#"{"domain":"env","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("from_env"),
        "the limit came from the env-named directory: {body}"
    );
}
