//! Redis Cluster: a real 3-master cluster (with replicas for failover), started by the tests.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::load::Load;
use common::*;
use sluice::proto::{Code, RateLimitRequest};

/// Ten keys with limits 1..=10, so each status says which descriptor it answers; a token bucket;
/// a sliding log.
fn config() -> tempfile::TempDir {
    let mut yaml = String::from("domain: c\ndescriptors:\n");
    for i in 1..=10 {
        yaml.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: {i}}}\n"
        ));
    }
    yaml.push_str("  - key: bucket\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 50}\n");
    yaml.push_str("  - key: log\n    rate_limit: {unit: hour, requests_per_unit: 50, algorithm: sliding_window_log}\n");
    yaml.push_str("  - key: pair\n    rate_limits:\n      - {unit: hour, requests_per_unit: 3}\n      - {unit: day, requests_per_unit: 5}\n");
    config_dir(&yaml)
}

fn start(cluster: &RedisCluster, dir: &tempfile::TempDir, env: &[(&str, &str)]) -> Sluice {
    let mut vars = vec![("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "cluster")];
    vars.extend_from_slice(env);
    let url = cluster.url();
    let mut cmd = sluice_command(dir.path());
    cmd.env("REDIS_URL", &url);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    Sluice::spawn(cmd)
}

/// All ten k-descriptors with one value, in order.
fn ten(value: &str) -> RateLimitRequest {
    request(
        "c",
        (1..=10)
            .map(|i| descriptor(&[(&format!("k{i}"), value)]))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_split_across_nodes_are_correct_and_in_order() {
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[]);
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 10).await;

    // Each round spends one hit of every limit; descriptor i allows i.
    for round in 1..=11u32 {
        let r = ask(&mut c, ten("v")).await;
        assert_eq!(r.statuses.len(), 10);
        for (i, status) in r.statuses.iter().enumerate() {
            let limit = (i + 1) as u32;
            assert_eq!(
                status.current_limit.as_ref().unwrap().requests_per_unit,
                limit,
                "order"
            );
            let want = if round <= limit {
                Code::Ok
            } else {
                Code::OverLimit
            };
            assert_eq!(
                status.code, want as i32,
                "round {round}, descriptor k{limit}"
            );
            assert_eq!(status.limit_remaining, limit.saturating_sub(round));
        }
    }

    // Many descriptor values: keys land on every master.
    for i in 0..300 {
        ask(
            &mut c,
            request(
                "c",
                vec![
                    descriptor(&[("k5", &format!("user{i}"))]),
                    descriptor(&[("bucket", &format!("user{i}"))]),
                ],
            ),
        )
        .await;
    }
    for port in cluster.master_ports() {
        assert!(
            cluster.node(port).dbsize() > 20,
            "master {port} holds few keys"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_multi_slot_requests_never_fail() {
    // Values with braces, colons and underscores, several algorithms in one request: every
    // request spans several slots, and no script call may ever see CROSSSLOT.
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[]);
    let mut c = sluice.client().await;
    let values = [
        "{a}", "}{", "x:{y}", "{}", "a_b", "{{z}}", "plain", "%7B", "*",
    ];
    for i in 0..400 {
        let v = format!("{}{}", values[i % values.len()], i);
        let mut descriptors: Vec<_> = (1..=10)
            .map(|k| descriptor(&[(&format!("k{k}"), &v)]))
            .collect();
        descriptors.push(descriptor(&[("bucket", &v)]));
        descriptors.push(descriptor(&[("log", &v)]));
        let r = c.should_rate_limit(request("c", descriptors)).await;
        assert!(r.is_ok(), "request {i} failed: {r:?}");
    }
}

/// Spread over many slots (a fresh value per request) plus one hot shared counter.
fn mixed(n: u64) -> (usize, RateLimitRequest) {
    let request = request(
        "c",
        vec![
            descriptor(&[("k10", &format!("spread{n}"))]),
            descriptor(&[("bucket", &format!("spread{n}"))]),
        ],
    );
    (n as usize, request)
}

fn hot(_: u64) -> (usize, RateLimitRequest) {
    (0, request("c", vec![descriptor(&[("log", "hot")])]))
}

#[tokio::test(flavor = "multi_thread")]
async fn script_flush_on_every_node_under_load_is_invisible() {
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[("REDIS_TIMEOUT", "2s")]);
    avoid_window_edge(3600, 30).await;
    let load = Load::start(&sluice, 32, mixed).await;
    let hot_load = Load::start(&sluice, 32, hot).await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        for port in cluster.master_ports() {
            assert_eq!(
                cluster.node(port).cli(&["SCRIPT", "FLUSH"]).unwrap().trim(),
                "OK"
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (calls, hot_calls) = (load.finish().await, hot_load.finish().await);
    let errors = calls.failed().count();
    let (hot_admitted, hot_errors) = (hot_calls.admitted(), hot_calls.failed().count());
    assert_eq!(errors + hot_errors, 0, "callers saw errors");
    assert_eq!(
        hot_admitted, 50,
        "the hot sliding log admits exactly its limit"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resharding_under_load_keeps_answers_correct() {
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(
        &cluster,
        &dir,
        &[("REDIS_TIMEOUT", "3s"), ("LOG_LEVEL", "info,redis=debug")],
    );
    avoid_window_edge(3600, 60).await;
    let load = Load::start(&sluice, 32, mixed).await;
    let hot_load = Load::start(&sluice, 32, hot).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Move 2000 slots from one master to another while the load runs.
    let masters = cluster.master_ports();
    let (from, to) = (
        cluster.node(masters[0]).node_id(),
        cluster.node(masters[1]).node_id(),
    );
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", masters[0])])
        .args([
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            "2000",
            "--cluster-yes",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (calls, hot_calls) = (load.finish().await, hot_load.finish().await);
    let (admitted, errors) = (calls.admitted(), calls.failed().count());
    let (hot_admitted, hot_errors) = (hot_calls.admitted(), hot_calls.failed().count());
    assert_eq!(
        errors + hot_errors,
        0,
        "callers saw errors during resharding"
    );
    assert!(admitted > 100, "load ran ({admitted} admitted)");
    assert_eq!(hot_admitted, 50, "no double counting and no lost counts");
}

#[tokio::test(flavor = "multi_thread")]
async fn exact_admission_across_two_replicas_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let a = start(&cluster, &dir, &[("REDIS_TIMEOUT", "2s")]);
    let b = start(&cluster, &dir, &[("REDIS_TIMEOUT", "2s")]);
    avoid_window_edge(3600, 30).await;
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let mut c = if i % 2 == 0 {
            a.client().await
        } else {
            b.client().await
        };
        let admitted = admitted.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let r = ask(
                    &mut c,
                    request("c", vec![descriptor(&[("bucket", "shared")])]),
                )
                .await;
                if r.overall_code == Code::Ok as i32 {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 50);
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` on a cluster is decided per slot call: k1 going
/// over freezes k10 when both keys are in one slot, and not when they are in different slots
/// (README, "What differs").
#[tokio::test(flavor = "multi_thread")]
async fn stop_increment_is_decided_per_slot() {
    use sluice::store::redis::slot::slot;
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(
        &cluster,
        &dir,
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 30).await;
    let hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        * 3600;
    // The two keys differ in more than their values' part: k1 and k10 with one value always
    // land a fixed CRC apart, so k10 gets a value of its own, searched for.
    let k1_slot = |v: &str| slot(format!("c_k1_{v}_{hour}").as_bytes());
    let k10_slot = |v: &str| slot(format!("c_k10_{v}_{hour}").as_bytes());
    for (round, same, k10_left) in [(0, true, 9), (1, false, 8)] {
        let k1_value = format!("a{round}");
        let k10_value = (0..)
            // No `_`: the key escapes it, and the slot here is computed on the raw value.
            .map(|i| format!("b{round}x{i}"))
            .find(|v| (k10_slot(v) == k1_slot(&k1_value)) == same)
            .unwrap();
        let pair = request(
            "c",
            vec![
                descriptor(&[("k1", &k1_value)]),
                descriptor(&[("k10", &k10_value)]),
            ],
        );
        assert_eq!(
            ask(&mut c, pair.clone()).await.overall_code,
            Code::Ok as i32
        );
        let r = ask(&mut c, pair).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        let mut look = descriptor(&[("k10", &k10_value)]);
        look.hits_addend = Some(0);
        let left = ask(&mut c, request("c", vec![look])).await.statuses[0].limit_remaining;
        assert_eq!(left, k10_left, "same slot: {same}");
    }
}

/// A descriptor with two limits (`rate_limits`) on a cluster: both keys carry the descriptor as
/// hash tag, so they are in one slot and decided in one script call, all or nothing: after the
/// hour's 3, a refused request leaves the day's count at 3, whichever node holds the values.
#[tokio::test(flavor = "multi_thread")]
async fn a_two_limit_descriptor_is_one_slot_and_all_or_nothing() {
    use sluice::store::redis::slot::slot;
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[]);
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 30).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (hour, day) = (now / 3600 * 3600, now / 86_400 * 86_400);
    let port = cluster.master_ports()[0];
    let mut slots = std::collections::BTreeSet::new();
    for value in ["a", "b", "c", "d", "e", "f"] {
        let one = || request("c", vec![descriptor(&[("pair", value)])]);
        let codes: Vec<i32> = futures::future::join_all((0..5).map(|_| {
            let mut c = c.clone();
            async move { ask(&mut c, one()).await.overall_code }
        }))
        .await;
        assert_eq!(
            codes
                .iter()
                .filter(|&&code| code == Code::Ok as i32)
                .count(),
            3,
            "{value}: {codes:?}"
        );
        let hour_key = format!("{{c_pair_{value}}}:fixed_window:3600_{hour}");
        let day_key = format!("{{c_pair_{value}}}:fixed_window:86400_{day}");
        assert_eq!(slot(hour_key.as_bytes()), slot(day_key.as_bytes()));
        slots.insert(slot(hour_key.as_bytes()));
        let get = |key: &str| {
            cluster
                .node(port)
                .cli(&["-c", "GET", key])
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        assert_eq!(
            get(&day_key),
            "3",
            "{value}: refused requests charged the day"
        );
        assert_eq!(get(&hour_key), "3", "{value}");
        let r = ask(&mut c, one()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
    assert!(slots.len() > 1, "the values spread over slots: {slots:?}");
    drop(sluice);
}
