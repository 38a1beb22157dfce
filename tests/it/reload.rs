//! Live configuration: file writes and symlink swaps apply under load without a failed request;
//! a bad config keeps the old one; a file written in place is never applied half-written.

use sluice_test_kit as kit;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kit::*;
use sluice::proto::Code;

fn limits(name: &str) -> String {
    format!(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 1000000, name: {name}}}\n"
    )
}

/// The limit name the service answers with now.
async fn current_name(sluice: &Sluice) -> String {
    let mut c = sluice.client().await;
    let r = ask(
        &mut c,
        request("app", vec![descriptor(&[("user", "probe")])]),
    )
    .await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.name.clone())
        .unwrap_or_default()
}

/// How long a change may take to apply: a poll (100 ms here) and `SETTLE` (1 s) take about
/// 1.1 s on a quiet machine.
const RELOAD_BOUND: Duration = Duration::from_secs(15);

async fn wait_for_name(sluice: &Sluice, want: &str) -> Duration {
    let started = Instant::now();
    while current_name(sluice).await != want {
        assert!(
            started.elapsed() < RELOAD_BOUND,
            "config {want} never applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_and_symlink_swaps_apply_under_load_and_bad_configs_are_refused() {
    // The layout Kubernetes gives a ConfigMap: versioned directories, `..data` pointing at the
    // current one, and the files linked through it.
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("config");
    std::fs::create_dir_all(config.join("..v1")).unwrap();
    std::fs::write(config.join("..v1/limits.yaml"), limits("first")).unwrap();
    std::os::unix::fs::symlink("..v1", config.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/limits.yaml", config.join("limits.yaml")).unwrap();

    let sluice = Sluice::start(&config, None, &[("CONFIG_RELOAD_INTERVAL", "100ms")]);
    assert_eq!(current_name(&sluice).await, "first");

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = sluice.client().await;
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let req = request("app", vec![descriptor(&[("user", &format!("{t}-{n}"))])]);
                match c.should_rate_limit(req).await {
                    Ok(r) if r.get_ref().statuses[0].current_limit.is_some() => {
                        ok.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                n += 1;
            }
        }));
    }

    // 1. Kubernetes-style swap: a new version directory, then `..data` renamed over.
    std::fs::create_dir_all(config.join("..v2")).unwrap();
    std::fs::write(config.join("..v2/limits.yaml"), limits("second")).unwrap();
    std::os::unix::fs::symlink("..v2", config.join("..data_tmp")).unwrap();
    std::fs::rename(config.join("..data_tmp"), config.join("..data")).unwrap();
    let took = wait_for_name(&sluice, "second").await;
    println!("symlink swap applied after {took:?}");

    // 2. A plain file write (a new file next to the link).
    std::fs::write(config.join("more.yaml"), "domain: other\n").unwrap();
    std::fs::write(config.join("..v2/limits.yaml"), limits("third")).unwrap();
    let took = wait_for_name(&sluice, "third").await;
    println!("file write applied after {took:?}");

    // 3. A bad file: refused (once it has settled), the previous config stays.
    std::fs::write(
        config.join("broken.yaml"),
        "domain: app2\ndescriptors:\n  - key: k\n    colour: red\n",
    )
    .unwrap();
    let refused = Instant::now();
    while sluice.metric("ratelimit_service_config_load_error") < 1.0 {
        assert!(
            refused.elapsed() < RELOAD_BOUND,
            "the bad config was never read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(current_name(&sluice).await, "third");
    // Fixing it applies again.
    std::fs::remove_file(config.join("broken.yaml")).unwrap();
    std::fs::write(config.join("..v2/limits.yaml"), limits("fourth")).unwrap();
    wait_for_name(&sluice, "fourth").await;

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads"
    );
    assert!(ok.load(Ordering::Relaxed) > 100);

    // The refusal was counted (above) and logged with file, line and reason.
    let log: Vec<String> = sluice.stdout_rest.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("broken.yaml:4: config error, unknown key 'colour'")),
        "{log:#?}"
    );
}

/// Issue #40: a config file written in place (truncated, then written in two parts with a
/// pause, as a script or an editor without atomic rename may) is never applied half-written.
/// The first part is valid YAML with fewer rules: `b`'s limit is missing, so while it was in
/// force `b` was unlimited. Before, a poll during the pause applied it until the next poll; now
/// the directory must stay unchanged for `SETTLE` (1 s) before it is read, longer than the
/// pause (300 ms), and `b` stays refused throughout.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_written_in_place_is_never_applied_half_written() {
    avoid_window_edge(3600, 60).await;
    let b_limit = "  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, format!("{}{b_limit}", limits("v1"))).unwrap();
    let sluice = Sluice::start(dir.path(), None, &[("CONFIG_RELOAD_INTERVAL", "100ms")]);
    let b = || request("app", vec![descriptor(&[("b", "x")])]);
    let mut c = sluice.client().await;
    assert_eq!(ask(&mut c, b()).await.overall_code, Code::Ok as i32);
    assert_eq!(ask(&mut c, b()).await.overall_code, Code::OverLimit as i32);

    // Asks for `b` all along: any call admitted means a config without its limit was in force.
    let stop = Arc::new(AtomicBool::new(false));
    let checker = tokio::spawn({
        let (stop, mut c) = (stop.clone(), sluice.client().await);
        async move {
            let (mut asked, mut admitted) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                if ask(&mut c, b()).await.overall_code == Code::Ok as i32 {
                    admitted += 1;
                }
                asked += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (asked, admitted)
        }
    });
    for version in ["v2", "v3"] {
        let mut writer = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&file)
            .unwrap();
        writer.write_all(limits(version).as_bytes()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        writer.write_all(b_limit.as_bytes()).unwrap();
        drop(writer);
        let took = wait_for_name(&sluice, version).await;
        println!("{version} written in place, applied after {took:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let (asked, admitted) = checker.await.unwrap();
    assert!(asked > 10, "{asked} calls");
    assert_eq!(admitted, 0, "{admitted} of {asked} calls for b admitted");
    assert_eq!(ask(&mut c, b()).await.overall_code, Code::OverLimit as i32);
}
