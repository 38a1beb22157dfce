//! Live configuration: file writes and symlink swaps apply under load without a failed request;
//! a bad config keeps the old one.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;

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

async fn wait_for_name(sluice: &Sluice, want: &str) -> Duration {
    let started = Instant::now();
    while current_name(sluice).await != want {
        assert!(
            started.elapsed() < Duration::from_secs(10),
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

    // 3. A bad file: refused, the previous config stays.
    std::fs::write(
        config.join("broken.yaml"),
        "domain: app2\ndescriptors:\n  - key: k\n    colour: red\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
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

    // The refusal was counted…
    let errors = sluice.metric("ratelimit_service_config_load_error");
    // At least one (a poll may also catch the file half-written, which is refused too).
    assert!(errors >= 1.0, "{errors} config load errors counted");
    // …and logged with file, line and reason.
    let log: Vec<String> = sluice.stdout_rest.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("broken.yaml:4: config error, unknown key 'colour'")),
        "{log:#?}"
    );
}
