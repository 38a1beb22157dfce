//! Redis Cluster: a real 3-master cluster (with replicas for failover), started by the tests.

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kit::load::{Call, Load};
use kit::*;
use sluice::proto::{Code, RateLimitRequest, RateLimitResponse};

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

/// Twelve token buckets of one request, their keys in many slots: each master decides the ones
/// it holds in one call of the algorithm's lean script across its slots, and every bucket is
/// charged once per request (burst 50: 47 left after three requests).
#[tokio::test(flavor = "multi_thread")]
async fn one_algorithm_over_many_slots_takes_one_lean_call_per_master() {
    const ROUNDS: u64 = 3;
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[("REDIS_TIMEOUT", "2s")]);
    let mut c = sluice.client().await;
    for &port in &cluster.master_ports() {
        cluster.node(port).cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    let buckets = || {
        request(
            "c",
            (0..12)
                .map(|i| descriptor(&[("bucket", &format!("many{i}"))]))
                .collect(),
        )
    };
    for round in 1..=ROUNDS {
        let r = ask(&mut c, buckets()).await;
        assert_eq!(r.statuses.len(), 12);
        for (i, status) in r.statuses.iter().enumerate() {
            assert_eq!(status.code, Code::Ok as i32, "bucket {i}, round {round}");
            assert_eq!(
                status.limit_remaining,
                50 - round as u32,
                "bucket {i}, round {round}"
            );
        }
    }
    let scripts: u64 = cluster
        .master_ports()
        .iter()
        .map(|&port| command_calls(cluster.node(port), "evalsha"))
        .sum();
    // At most one per master per request (a registry sweep may add one or two).
    assert!(
        scripts <= ROUNDS * 3 + 2,
        "{scripts} script calls for {ROUNDS} requests on 3 masters"
    );
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
    let sample: Vec<&Call> = calls.failed().chain(hot_calls.failed()).take(5).collect();
    assert_eq!(
        errors + hot_errors,
        0,
        "callers saw errors, e.g. {sample:?}"
    );
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

/// Two replicas' 32 callers share one token bucket of 50 on a cluster: exactly 50 are admitted,
/// and the callers' concurrent calls are merged on the node that holds it.
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
    // Concurrent calls of the token bucket's lean script on one node went merged, across slots
    // (src/store/redis/merge.rs): fewer script calls than the 1 280 requests.
    let scripts: u64 = cluster
        .master_ports()
        .iter()
        .map(|&port| command_calls(cluster.node(port), "evalsha"))
        .sum();
    eprintln!("1280 requests in {scripts} script calls");
    assert!(scripts < 1280, "{scripts} script calls");
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` on a cluster is decided per slot call: k1 going
/// over freezes k10 when both keys are in one slot, and not when they are in different slots
/// (docs/upstream-differences.md).
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
/// hour's 3, a refused request leaves the day's count at 3, whichever node holds the values (the
/// hour, a fixed window that refuses it, counts it as a lone fixed window would: 5).
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
        assert_eq!(
            get(&hour_key),
            "5",
            "{value}: the hour counts what it refused"
        );
        let r = ask(&mut c, one()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
    assert!(slots.len() > 1, "the values spread over slots: {slots:?}");
    drop(sluice);
}

/// The start of this hour's fixed window, as the keys name it.
fn this_hour() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        * 3600
}

/// The counter of descriptor `k<i>` with `value` in this hour's window.
fn counter_key(i: u32, value: &str) -> String {
    format!("c_k{i}_{value}_{}", this_hour())
}

/// The port of the master serving `slot`, as the cluster's `CLUSTER SLOTS` says.
fn owner_port(cluster: &RedisCluster, slot: u16) -> u16 {
    let mut conn = cluster.node(cluster.master_ports()[0]).connection();
    let ranges: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).unwrap();
    let redis::Value::Array(ranges) = ranges else {
        panic!("CLUSTER SLOTS: {ranges:?}")
    };
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        if let (redis::Value::Int(start), redis::Value::Int(end), redis::Value::Array(master)) =
            (&parts[0], &parts[1], &parts[2])
            && (*start..=*end).contains(&i64::from(slot))
            && let redis::Value::Int(port) = master[1]
        {
            return port as u16;
        }
    }
    panic!("no master serves slot {slot}")
}

/// `INFO commandstats` calls of `command` on `node` since its last `CONFIG RESETSTAT`.
fn command_calls(node: &RedisServer, command: &str) -> u64 {
    let info = node.cli(&["INFO", "commandstats"]).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap().trim().parse().unwrap()
        })
}

/// A counter's value on the node `port`, read with `ASKING` first so that a slot being
/// imported there answers too.
fn count_on(cluster: &RedisCluster, port: u16, key: &str) -> Option<u64> {
    let mut conn = cluster.node(port).connection();
    let ((), count): ((), Option<u64>) = redis::pipe()
        .cmd("ASKING")
        .cmd("GET")
        .arg(key)
        .query(&mut conn)
        .unwrap();
    count
}

/// Each descriptor's answers, as (code, remaining) sorted: what concurrent requests got,
/// whatever order they ran in.
async fn answers_to_ten(sluice: &Sluice, requests: usize, value: &str) -> Vec<Vec<(i32, u32)>> {
    let c = sluice.client().await;
    let replies = futures::future::join_all((0..requests).map(|_| {
        let mut c = c.clone();
        async move { ask(&mut c, ten(value)).await }
    }))
    .await;
    let mut per_descriptor = vec![Vec::new(); 10];
    for reply in replies {
        assert_eq!(reply.statuses.len(), 10);
        for (i, status) in reply.statuses.iter().enumerate() {
            per_descriptor[i].push((status.code, status.limit_remaining));
        }
    }
    for answers in &mut per_descriptor {
        answers.sort_unstable();
    }
    per_descriptor
}

/// Ten descriptors over three masters: the same answers as on one server, each limit admitting
/// exactly its N under concurrency, and each check counted by one `INCRBY` (Redis 7: plain
/// commands), or one script call per master a request touches, not one per slot (Redis 6.2).
#[tokio::test(flavor = "multi_thread")]
async fn ten_descriptors_answer_as_on_one_server_in_one_call_per_master() {
    const REQUESTS: usize = 24;
    let cluster = RedisCluster::start(3, 0);
    let server = RedisServer::start();
    let dir = config();
    let on_cluster = start(&cluster, &dir, &[("REDIS_TIMEOUT", "2s")]);
    let alone = Sluice::start(dir.path(), Some(&server), &[("REDIS_TIMEOUT", "2s")]);
    avoid_window_edge(3600, 30).await;
    for &port in &cluster.master_ports() {
        cluster.node(port).cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }

    let expected = answers_to_ten(&alone, REQUESTS, "shared").await;
    let got = answers_to_ten(&on_cluster, REQUESTS, "shared").await;
    for (i, answers) in expected.iter().enumerate() {
        let admitted = answers
            .iter()
            .filter(|(c, _)| *c == Code::Ok as i32)
            .count();
        assert_eq!(admitted, i + 1, "k{} on one server", i + 1);
    }
    assert_eq!(got, expected, "per descriptor: (code, remaining), sorted");

    // Every check counted once, on the master of its slot.
    let slots: std::collections::BTreeSet<u16> = (1..=10)
        .map(|i| sluice::store::redis::slot::slot(counter_key(i, "shared").as_bytes()))
        .collect();
    let mut masters = std::collections::BTreeSet::new();
    for i in 1..=10 {
        let key = counter_key(i, "shared");
        let owner = owner_port(&cluster, sluice::store::redis::slot::slot(key.as_bytes()));
        masters.insert(owner);
        assert_eq!(
            count_on(&cluster, owner, &key),
            Some(REQUESTS as u64),
            "{key}"
        );
    }
    assert!(
        slots.len() > masters.len(),
        "some master serves several of the slots: {slots:?} on {masters:?}"
    );
    let calls = |command: &str| -> u64 {
        cluster
            .master_ports()
            .iter()
            .map(|&port| command_calls(cluster.node(port), command))
            .sum()
    };
    // A registry sweep may add a script call or two.
    let (scripts, counts) = (calls("evalsha"), calls("incrby"));
    if scripts < 5 {
        // Redis 7 and later: plain commands, one INCRBY per check and no script call.
        assert_eq!(counts, (REQUESTS * 10) as u64, "INCRBY calls");
    } else {
        // Redis 6.2 (and, seen once on Valkey 9 in a loaded CI run, not yet explained: the store
        // had not taken the plain path): one lean script call per master a request touches, not
        // one per slot.
        let per_master = (REQUESTS * masters.len()) as u64;
        assert!(
            (per_master..per_master + 5).contains(&scripts),
            "{scripts} script calls for {REQUESTS} requests on {} masters ({} slots)",
            masters.len(),
            slots.len()
        );
    }
}

/// A slot of a master that serves other slots of the request is migrated while requests run:
/// first `ASK` (the slot migrating, its counter created on the importing node), then `MOVED`
/// (the slot handed over, Sluice's map stale). The master refuses the call across its slots
/// before writing, the checks go one slot at a time, and every check is counted exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_migrating_slot_is_decided_once_per_check_through_ask_and_moved() {
    use sluice::store::redis::slot::slot;
    const ROUNDS: u64 = 6;
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[("REDIS_TIMEOUT", "2s")]);
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 60).await;
    let value = "moving";
    let owners: Vec<(String, u16, u16)> = (1..=10)
        .map(|i| {
            let key = counter_key(i, value);
            let s = slot(key.as_bytes());
            (key, s, owner_port(&cluster, s))
        })
        .collect();
    // A slot whose master also serves another slot of the request.
    let (_, moving, from) = owners
        .iter()
        .find(|(_, s, port)| owners.iter().any(|(_, t, q)| q == port && t != s))
        .cloned()
        .expect("ten slots on three masters");
    let to = *cluster.master_ports().iter().find(|&&p| p != from).unwrap();
    let (from_id, to_id) = (cluster.node(from).node_id(), cluster.node(to).node_id());
    let moving_s = moving.to_string();
    let setslot = |port: u16, how: &[&str]| {
        let mut args = vec!["CLUSTER", "SETSLOT", &moving_s];
        args.extend_from_slice(how);
        assert_eq!(cluster.node(port).cli(&args).unwrap().trim(), "OK");
    };
    setslot(to, &["IMPORTING", &from_id]);
    setslot(from, &["MIGRATING", &to_id]);
    for &port in &cluster.master_ports() {
        cluster.node(port).cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }

    let mut admitted = [0u64; 10];
    let round = |admitted: &mut [u64; 10], r: RateLimitResponse| {
        assert_eq!(r.statuses.len(), 10);
        for (i, status) in r.statuses.iter().enumerate() {
            if status.code == Code::Ok as i32 {
                admitted[i] += 1;
            }
        }
    };
    for _ in 0..ROUNDS / 2 {
        round(&mut admitted, ask(&mut c, ten(value)).await);
    }
    assert!(
        command_calls(cluster.node(to), "asking") > 0,
        "the migrating slot's check went through ASK"
    );
    // Hand the slot over; its keys are all on the importing node already.
    assert_eq!(
        cluster
            .node(from)
            .cli(&["CLUSTER", "COUNTKEYSINSLOT", &moving_s])
            .unwrap()
            .trim(),
        "0"
    );
    for port in cluster.master_ports() {
        setslot(port, &["NODE", &to_id]);
    }
    for _ in ROUNDS / 2..ROUNDS {
        round(&mut admitted, ask(&mut c, ten(value)).await);
    }

    for (i, (key, s, port)) in owners.iter().enumerate() {
        let port = if *s == moving { to } else { *port };
        assert_eq!(count_on(&cluster, port, key), Some(ROUNDS), "{key}");
        assert_eq!(admitted[i], ROUNDS.min(i as u64 + 1), "{key}");
    }
}

/// A master's connection breaks with script calls of requests on it: those calls fail and are
/// not resent (they may have run), while the other masters' checks of the same requests are
/// counted once. `CLIENT PAUSE WRITE` holds the calls unrun and `CLIENT KILL` closes Sluice's
/// connections, so a call that Sluice did resend would run once the pause ends and show in the
/// counts.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_lost_mid_request_fails_its_checks_without_resending() {
    use sluice::store::redis::slot::slot;
    const STUCK: usize = 8;
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[("REDIS_TIMEOUT", "10s")]);
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 60).await;
    let value = "victim";
    ask(&mut c, ten(value)).await;
    let owners: Vec<(String, u16)> = (1..=10)
        .map(|i| {
            let key = counter_key(i, value);
            let port = owner_port(&cluster, slot(key.as_bytes()));
            (key, port)
        })
        .collect();
    // The master with the most of the request's keys (several slots: one call across them).
    let victim = cluster
        .master_ports()
        .into_iter()
        .max_by_key(|&p| owners.iter().filter(|(_, q)| *q == p).count())
        .unwrap();
    assert!(owners.iter().filter(|(_, q)| *q == victim).count() > 1);

    let paused = std::time::Instant::now();
    let pause = Duration::from_millis(3000);
    let pause_ms = pause.as_millis().to_string();
    let victim_node = cluster.node(victim);
    assert_eq!(
        victim_node
            .cli(&["CLIENT", "PAUSE", &pause_ms, "WRITE"])
            .unwrap()
            .trim(),
        "OK"
    );
    // One at a time, so each call goes out on the connection already open.
    let mut stuck = Vec::new();
    for _ in 0..STUCK {
        let mut c = c.clone();
        stuck.push(tokio::spawn(async move {
            c.should_rate_limit(ten(value)).await
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Every client connection but redis-cli's own: Sluice's, with the held calls on them.
    let killed: u64 = victim_node
        .cli(&["CLIENT", "KILL", "TYPE", "normal"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(killed > 0, "Sluice had a connection to the paused master");
    assert!(paused.elapsed() < pause, "the pause outlasted the calls");
    let replies = futures::future::join_all(stuck).await;
    let failed = replies
        .iter()
        .filter(|r| r.as_ref().unwrap().is_err())
        .count();
    assert_eq!(failed, STUCK, "the requests whose calls were lost failed");
    // Anything resent would run once the pause ends.
    tokio::time::sleep((pause + Duration::from_millis(500)).saturating_sub(paused.elapsed())).await;

    for (key, port) in &owners {
        let count = count_on(&cluster, *port, key).unwrap_or(0);
        let expected = if *port == victim { 1 } else { 1 + STUCK as u64 };
        assert_eq!(
            count,
            expected,
            "{key} (on the victim: {})",
            *port == victim
        );
    }
}

/// Merged calls on a node whose slot is migrating (src/store/redis/merge.rs): three sliding logs
/// of 50 on one master, one of them in a slot set MIGRATING to another master, take 32
/// concurrent callers. A merged call that holds the migrating log's key is refused before it
/// writes anything (the key is not on the node: `ASK`), and its calls go again one each, which
/// the cluster follows to the importing node; every log admits exactly 50, with no error.
#[tokio::test(flavor = "multi_thread")]
async fn merged_calls_on_a_migrating_slot_go_again_one_each() {
    use sluice::store::redis::slot::slot;
    let cluster = RedisCluster::start(3, 0);
    let dir = config();
    let sluice = start(&cluster, &dir, &[("REDIS_TIMEOUT", "3s")]);
    let masters = cluster.master_ports();
    let (from, to) = (masters[0], masters[1]);
    // The log's key is `{c_log_<value>}:sliding_window_log`: its slot is the tag's.
    let log_slot = |value: &str| slot(format!("c_log_{value}").as_bytes());
    let values: Vec<String> = (0..)
        .map(|i| format!("m{i}"))
        .filter(|v| owner_port(&cluster, log_slot(v)) == from)
        .take(3)
        .collect();
    let moving = log_slot(&values[0]).to_string();
    assert!(
        values[1..]
            .iter()
            .all(|v| log_slot(v).to_string() != moving)
    );
    let (from_id, to_id) = (cluster.node(from).node_id(), cluster.node(to).node_id());
    for (port, how, id) in [(to, "IMPORTING", &from_id), (from, "MIGRATING", &to_id)] {
        let out = cluster
            .node(port)
            .cli(&["CLUSTER", "SETSLOT", &moving, how, id])
            .unwrap();
        assert_eq!(out.trim(), "OK");
    }
    for &port in &masters {
        cluster.node(port).cli(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    avoid_window_edge(3600, 60).await;
    let values = Arc::new(values);
    let admitted: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
    let errors = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for caller in 0..32 {
        let mut c = sluice.client().await;
        let (values, admitted, errors) = (values.clone(), admitted.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..30 {
                let which = (caller + n) % 3;
                let r = c
                    .should_rate_limit(request("c", vec![descriptor(&[("log", &values[which])])]))
                    .await;
                match r {
                    Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => {
                        admitted[which].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0, "callers saw errors");
    let admitted: Vec<usize> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    assert_eq!(admitted, [50, 50, 50]);
    assert!(
        command_calls(cluster.node(to), "asking") > 0,
        "the migrating slot's calls went through ASK"
    );
    let scripts = command_calls(cluster.node(from), "evalsha");
    eprintln!("960 requests, {scripts} script calls on the migrating master");
}
