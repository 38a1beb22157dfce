//! A Redis failover under load, through Envoy, measured (issue #28, "Failover, measured"):
//! Sentinel (a master, its replica, three sentinels) and Cluster (3 masters, 1 replica each).
//! A real Envoy (the shipped config, filter timeout 250 ms, `failure_mode_deny: false`) sends
//! every request's client address to Sluice; 16 callers keep sending while the master holding
//! the counter is killed, until Envoy has seen no error for a while.
//!
//! What each run prints (`FAILOVER` lines, copied into docs/reliability.md):
//! - Envoy's errors: each is a request Envoy let through undecided (`failure_mode_allowed`);
//! - the increments lost: answers Sluice gave (Envoy's `ok` + `over_limit`) that the promoted
//!   replica's counter does not hold. Replication is asynchronous, so what the dead master
//!   acknowledged but had not yet sent is gone: each lost increment is one more admission a
//!   limit would allow in that window. Calls that failed after their script ran count the other
//!   way, so the figure is a floor of the loss;
//! - recovery: from the kill to the last error Envoy counted.
//!
//! With `FAILURE_POLICY=local_share` (issue #28's degraded decisions) the same runs show what
//! the policy changes: the replica decides the failover window alone, so Envoy lets nothing
//! through undecided.
//!
//! The limit (a million an hour) is never reached, so every decided request is admitted and
//! the counter is the whole record of what Sluice counted.

use sluice_test_kit as kit;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kit::envoy::{Envoy, RatelimitStats, Upstream, http_status};
use kit::sentinel::SentinelSetup;
use kit::*;

const CALLERS: usize = 16;

/// The shipped Envoy config sends `remote_address`: one counter for every request of the test.
fn limits() -> String {
    "domain: example\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n"
        .to_string()
}

/// What one failover run saw.
struct Run {
    requests: usize,
    /// Requests that did not get 200 (Envoy closed, or answered an error of its own).
    not_ok: usize,
    before: RatelimitStats,
    after: RatelimitStats,
    /// From the kill to the last error Envoy counted (zero when there was none).
    recovery: Duration,
}

impl Run {
    fn errors(&self) -> u64 {
        self.after.error - self.before.error
    }

    /// Every answer Sluice gave in the run, before the kill too: all of them were counted in
    /// the one counter (this Envoy was started for the run).
    fn decided(&self) -> u64 {
        self.after.ok + self.after.over_limit
    }
}

/// Sends through Envoy from `CALLERS` threads until the run is over: `kill` is called after
/// `warm_up`, then the run goes on until Envoy has counted no new error for `quiet` (at most
/// `give_up` after the kill).
fn run_through_failover(envoy: &Envoy, warm_up: Duration, kill: impl FnOnce()) -> Run {
    let quiet = Duration::from_secs(3);
    let give_up = Duration::from_secs(60);
    let stop = AtomicBool::new(false);
    let requests = AtomicUsize::new(0);
    let not_ok = AtomicUsize::new(0);
    let last_error: Mutex<Option<Instant>> = Mutex::new(None);
    let mut before = RatelimitStats::default();
    let mut killed = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CALLERS {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if http_status(envoy.listener, "/", &[]) != 200 {
                        not_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(warm_up);
        before = envoy.ratelimit_stats();
        let errors_before = before.error;
        killed = Instant::now();
        kill();
        let mut seen = errors_before;
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let now = envoy.ratelimit_stats().error;
            if now > seen {
                seen = now;
                *last_error.lock().unwrap() = Some(Instant::now());
            }
            let calm_since = last_error.lock().unwrap().unwrap_or(killed);
            if calm_since.elapsed() >= quiet || killed.elapsed() >= give_up {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let recovery = last_error
        .into_inner()
        .unwrap()
        .map(|at| at - killed)
        .unwrap_or_default();
    Run {
        requests: requests.into_inner(),
        not_ok: not_ok.into_inner(),
        before,
        after: envoy.ratelimit_stats(),
        recovery,
    }
}

/// The value of the test's counter in `node`, if it holds it (the one integer key: under
/// `local_share` the replicas' sorted set is there too).
fn counter_on(node: &RedisServer) -> Option<u64> {
    let keys = node.cli(&["KEYS", "*"])?;
    keys.lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .find_map(|key| node.cli(&["GET", key])?.trim().parse().ok())
}

/// Prints the run's figures. Under `local_share` the answers decided locally are in no Redis
/// counter, so the difference between answers and counter is not a loss there.
fn report(topology: &str, run: &Run, counted: u64) {
    let decided = run.decided();
    let lost = if topology.contains("local_share") {
        "(local answers are counted in no Redis)".to_string()
    } else {
        decided.saturating_sub(counted).to_string()
    };
    println!(
        "FAILOVER {topology}: {} requests through Envoy ({CALLERS} callers), {} not 200; \
         Envoy errors (let through undecided) {}; decided {decided}, counter {counted}, \
         increments lost {lost}; recovery {:.2} s after the kill",
        run.requests,
        run.not_ok,
        run.errors(),
        run.recovery.as_secs_f64()
    );
}

/// Assertions both topologies share: Envoy answered everything, errors stopped on their own
/// well before the run gave up, and the counter went on from the replica's copy (it holds most
/// of what was counted, not a restart from zero).
fn assert_recovered(topology: &str, run: &Run, counted: u64) {
    assert_eq!(run.not_ok, 0, "{topology}: every request answered 200");
    assert!(
        run.recovery < Duration::from_secs(30),
        "{topology}: errors went on for {:?}",
        run.recovery
    );
    assert!(
        counted * 2 > run.decided(),
        "{topology}: the promoted replica holds {counted} of {} decisions",
        run.decided()
    );
}

/// Sluice on `redis_type` at `url` with `FAILURE_POLICY=policy`, and Envoy in front of it.
fn start_sluice_and_envoy(
    redis_type: &str,
    url: &str,
    policy: &str,
) -> (tempfile::TempDir, Sluice, Upstream, Envoy) {
    let config = config_dir(&limits());
    let mut cmd = sluice_command(config.path());
    cmd.env("BACKEND_TYPE", "redis")
        .env("REDIS_TYPE", redis_type)
        .env("REDIS_URL", url)
        .env("FAILURE_POLICY", policy);
    let sluice = Sluice::spawn(cmd);
    let app = Upstream::start();
    let envoy = Envoy::start(sluice.grpc, app.addr, &[("timeout: 5s", "timeout: 0.25s")]);
    (config, sluice, app, envoy)
}

/// A Sentinel failover under load with `policy`: the run and the promoted replica's count.
async fn sentinel_failover(policy: &str) -> (Run, u64) {
    let setup = SentinelSetup::start();
    let url = setup.url();
    let SentinelSetup {
        mut master,
        replica,
        sentinels: _sentinels,
        ..
    } = setup;
    let (_config, _sluice, _app, envoy) = start_sluice_and_envoy("sentinel", &url, policy);
    avoid_window_edge(3600, 120).await;
    let run = tokio::task::block_in_place(|| {
        run_through_failover(&envoy, Duration::from_secs(2), || master.kill())
    });
    (run, counter_on(&replica).unwrap_or(0))
}

/// A Cluster failover (the counter's master killed) under load with `policy`: the run and the
/// counter on whichever master holds it afterwards.
async fn cluster_failover(policy: &str) -> (Run, u64) {
    let mut cluster = RedisCluster::start(3, 1);
    let (_config, _sluice, _app, envoy) = start_sluice_and_envoy("cluster", &cluster.url(), policy);
    avoid_window_edge(3600, 120).await;
    let masters_before = cluster.master_ports();
    let run = tokio::task::block_in_place(|| {
        run_through_failover(&envoy, Duration::from_secs(2), || {
            let holder = masters_before
                .iter()
                .copied()
                .find(|&port| counter_on(cluster.node(port)).is_some())
                .expect("a master holds the counter");
            cluster.node_mut(holder).kill();
        })
    });
    // Whether Redis itself failed over: without a promoted replica no client could recover,
    // and a failure below must say which side it was.
    let masters = cluster.master_ports();
    println!(
        "cluster after the run: {} masters alive of 3 ({masters:?})",
        masters.len()
    );
    let counted = masters
        .iter()
        .find_map(|&port| counter_on(cluster.node(port)))
        .unwrap_or(0);
    (run, counted)
}

/// With `FAILURE_POLICY=local_share` the failover window is decided by the replica alone: Envoy
/// lets nothing through undecided. A call can still miss Envoy's 250 ms on a machine busy enough
/// (issue #28's degraded decisions keep a reserve for the local answer, not a guarantee), so
/// the bound is under 1 % of the requests, where `fail_closed` lets about 40 % through.
fn assert_decided_throughout(topology: &str, run: &Run) {
    assert_eq!(run.not_ok, 0, "{topology}: every request answered 200");
    assert!(
        run.errors() * 100 < run.requests as u64,
        "{topology}: Envoy let {} of {} requests through undecided",
        run.errors(),
        run.requests
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_failover_under_load_through_envoy() {
    let (run, counted) = sentinel_failover("fail_closed").await;
    report("sentinel (master killed, replica promoted)", &run, counted);
    assert_recovered("sentinel", &run, counted);
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_failover_under_load_through_envoy() {
    let (run, counted) = cluster_failover("fail_closed").await;
    report(
        "cluster (3 masters; the counter's master killed)",
        &run,
        counted,
    );
    assert_recovered("cluster", &run, counted);
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_failover_with_local_share_lets_nothing_through_undecided() {
    let (run, counted) = sentinel_failover("local_share").await;
    report("sentinel, local_share", &run, counted);
    assert_decided_throughout("sentinel, local_share", &run);
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_failover_with_local_share_lets_nothing_through_undecided() {
    let (run, counted) = cluster_failover("local_share").await;
    report("cluster, local_share", &run, counted);
    assert_decided_throughout("cluster, local_share", &run);
}
