//! The network between Sluice and Redis misbehaving: a real `sluice` process talks to a real
//! `redis-server` through our fault proxy (`crates/sluice-test-kit/src/proxy.rs`), which delays, splits,
//! stalls, resets mid-reply and half-closes the traffic, or has Redis restarted behind it.
//! Sluice's own Redis connection (`src/store/redis/wire.rs`) hands replies to callers by their
//! order on the socket, so what these tests guard is that no such fault ever hands a caller
//! another caller's answer, admits beyond a limit, hangs a caller, or leaves a connection that
//! is never replaced. Each test prints one `PROXY-FAULT` line with its figures
//! (`cargo test --test it -- redis_faults:: --nocapture 2>/dev/null | grep PROXY-FAULT`), quoted in
//! docs/reliability.md.
//!
//! 64 callers, each on its own gRPC connection, each with two counters of its own:
//! - `tenant=t{i}` with its own limit `i + 1` an hour: admissions are counted per caller and may
//!   never exceed it;
//! - `id=c{i}` with a limit nobody reaches, charged up front with `(i + 1) * 1 000 000` hits, so
//!   its count (read back from `limit_remaining`) lies in a range no other caller's count can
//!   reach: a reply meant for another caller shows at once as a count outside the range.
//!
//! Redis runs with its AOF on, so that a restart keeps the counts and the checks stay exact
//! across it.
//!
//! On a Redis Cluster (three masters), each node sits behind its own proxy and announces the
//! proxy's port (`cluster-announce-port`), so the slot map and redirects lead Sluice to the
//! proxies; every fault but the restart runs there too (a node's death is a failover:
//! `tests/it/failover.rs`).

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kit::proxy::{Chunking, FaultProxy, Faults, Leg};
use kit::*;
use sluice::proto::{Code, RateLimitRequest, RateLimitResponse};
use tokio::time::Instant;

const CALLERS: usize = 64;
/// Where caller `i`'s identity counter starts: `(i + 1) * SPACING`.
const SPACING: u64 = 1_000_000;
const ID_LIMIT: u64 = 1_000_000_000;
/// What the store may take before a call is answered UNAVAILABLE.
const REDIS_TIMEOUT: &str = "500ms";
/// The deadline every answer must meet: ten times the slowest answer a quiet machine shows (the
/// Redis timeout, 0.5 s). Kept on the caller's side, not sent as `grpc-timeout`: a caller's
/// deadline would rule the store's calls instead of `REDIS_TIMEOUT` (`src/store/deadline.rs`),
/// and the stalls below must leave calls abandoned after `REDIS_TIMEOUT` with their replies still
/// to come (`tests/it/deadline.rs` covers the caller's deadline).
const DEADLINE: Duration = Duration::from_secs(5);
/// How long a fault lasts, unless the test says otherwise.
const FAULT_FOR: Duration = Duration::from_millis(1500);

fn budget(caller: usize) -> u64 {
    caller as u64 + 1
}

fn config() -> String {
    let mut yaml = String::from("domain: pf\ndescriptors:\n");
    for i in 0..CALLERS {
        yaml += &format!(
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: hour, requests_per_unit: {}}}\n",
            budget(i)
        );
    }
    yaml +=
        &format!("  - key: id\n    rate_limit: {{unit: hour, requests_per_unit: {ID_LIMIT}}}\n");
    yaml
}

fn decision(caller: usize) -> RateLimitRequest {
    request(
        "pf",
        vec![
            descriptor(&[("tenant", &format!("t{caller}"))]),
            descriptor(&[("id", &format!("c{caller}"))]),
        ],
    )
}

/// What one caller saw.
#[derive(Default)]
struct Seen {
    calls: u64,
    admitted: u64,
    /// Failed calls and their codes.
    failed: Vec<tonic::Code>,
    slowest: Duration,
    /// Answers to calls sent while the fault lasted: what the checks judged under it.
    answered_in_fault: u64,
    /// Answers that cannot be this caller's, or are otherwise wrong.
    wrong: Vec<String>,
    /// When the first answer to a call sent after the fault ended came.
    first_after_fault: Option<Instant>,
}

/// One caller's state: calls sent so far and the last identity count seen.
struct Caller {
    index: usize,
    base: u64,
    sent: u64,
    last_count: u64,
    seen: Seen,
}

impl Caller {
    /// Checks one answer against this caller's own counters.
    fn judge(&mut self, answer: &RateLimitResponse) {
        let i = self.index;
        let [tenant, id] = answer.statuses.as_slice() else {
            self.seen
                .wrong
                .push(format!("{} statuses", answer.statuses.len()));
            return;
        };
        let limit_of = |s: &sluice::proto::DescriptorStatus| {
            s.current_limit
                .as_ref()
                .map(|l| u64::from(l.requests_per_unit))
        };
        if limit_of(tenant) != Some(budget(i)) || limit_of(id) != Some(ID_LIMIT) {
            self.seen.wrong.push(format!("limits {answer:?}"));
        }
        // Every call sent so far may have been counted (a failed call may have run), and the
        // count only grows.
        // A wrong count is reported and not kept, so one wrong answer is reported once.
        let count = ID_LIMIT - u64::from(id.limit_remaining);
        let admitted = answer.overall_code == Code::Ok as i32;
        let floor = if admitted {
            self.last_count + 1
        } else {
            self.last_count
        };
        if count < floor.max(self.base) || count > self.base + self.sent {
            self.seen.wrong.push(format!(
                "caller {i} got count {count}, expected {}..={} (caller {:?}'s range)",
                floor.max(self.base),
                self.base + self.sent,
                (count / SPACING).checked_sub(1)
            ));
        } else {
            self.last_count = count;
        }
        if admitted {
            self.seen.admitted += 1;
        }
    }
}

/// What the callers share with the test.
struct Shared {
    stop: Arc<AtomicBool>,
    /// When the fault ended, once it has.
    fault_over: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Callers answered since the fault ended.
    recovered: Arc<AtomicUsize>,
    /// Set while the fault lasts.
    fault_on: Arc<AtomicBool>,
}

/// Runs a caller until told to stop.
async fn run_caller(sluice_grpc: String, index: usize, shared: Shared) -> Seen {
    let mut client = sluice::proto::RateLimitServiceClient::connect(sluice_grpc)
        .await
        .unwrap();
    let base = (index as u64 + 1) * SPACING;
    let mut caller = Caller {
        index,
        base,
        sent: 0,
        last_count: base,
        seen: Seen::default(),
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let call = tonic::Request::new(decision(index));
        let sent_at = Instant::now();
        let in_fault = shared.fault_on.load(Ordering::Relaxed);
        let after_fault = shared
            .fault_over
            .lock()
            .unwrap()
            .is_some_and(|end| sent_at >= end);
        caller.sent += 1;
        caller.seen.calls += 1;
        // A hung server must not hang the test: a second past the deadline is a failure too.
        let result = tokio::time::timeout(
            DEADLINE + Duration::from_secs(1),
            client.should_rate_limit(call),
        )
        .await;
        let took = sent_at.elapsed();
        caller.seen.slowest = caller.seen.slowest.max(took);
        match result {
            Ok(Ok(answer)) => {
                caller.judge(answer.get_ref());
                caller.seen.answered_in_fault += u64::from(in_fault);
                if after_fault && caller.seen.first_after_fault.is_none() {
                    caller.seen.first_after_fault = Some(Instant::now());
                    shared.recovered.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Err(status)) => {
                caller.seen.failed.push(status.code());
                // Do not spin while the store is down.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(_) => caller.seen.failed.push(tonic::Code::DeadlineExceeded),
        }
    }
    caller.seen
}

/// What happens to Redis or the network in one test.
enum Fault {
    Proxy(Faults),
    /// Redis killed, and started again (from its AOF) after the fault's time.
    RestartRedis,
}

/// Redis as the test runs it, behind its proxies.
struct Backend {
    /// Standalone: the server, restarted by [`Fault::RestartRedis`].
    server: Option<RedisServer>,
    /// Cluster: every node, each behind its own proxy.
    _cluster: Option<RedisCluster>,
    proxies: Vec<FaultProxy>,
    /// Sluice's `REDIS_TYPE`.
    kind: &'static str,
}

impl Backend {
    /// One server with its AOF on (counts survive a restart), behind one proxy. Each write is
    /// fsynced before its reply (`appendfsync always`): with the default `everysec`, a server
    /// whose previous fsync is slow (a busy machine) postpones writing the AOF for up to two
    /// seconds while it goes on replying, so a kill loses increments it has acknowledged.
    async fn standalone() -> Backend {
        let aof = ["--appendonly", "yes", "--appendfsync", "always"].map(String::from);
        let server = RedisServer::start_with(&aof, &[]);
        let proxy = FaultProxy::start(([127, 0, 0, 1], server.port).into()).await;
        Backend {
            server: Some(server),
            _cluster: None,
            proxies: vec![proxy],
            kind: "single",
        }
    }

    /// Three masters, each behind its own proxy and announcing the proxy's port
    /// (`cluster-announce-port`), so `CLUSTER SLOTS` and `MOVED` send Sluice to the proxies.
    /// The cluster bus keeps the real ports (its announced bus port is the real one).
    async fn cluster() -> Backend {
        let cluster = RedisCluster::start(3, 0);
        let mut proxies = Vec::new();
        for node in &cluster.nodes {
            let proxy = FaultProxy::start(([127, 0, 0, 1], node.port).into()).await;
            let port = proxy.addr.port().to_string();
            let set = node.cli(&["CONFIG", "SET", "cluster-announce-port", &port]);
            assert_eq!(set.as_deref().map(str::trim), Some("OK"));
            proxies.push(proxy);
        }
        // Every node's map names the proxies only, once gossip has spread the new ports.
        let real: Vec<String> = cluster.nodes.iter().map(|n| n.port.to_string()).collect();
        let announced: Vec<String> = proxies.iter().map(|p| p.addr.port().to_string()).collect();
        wait_until("the nodes announce their proxies", || {
            cluster.nodes.iter().all(|n| {
                let slots = n.cli(&["CLUSTER", "SLOTS"]).unwrap_or_default();
                let ports: Vec<&str> = slots.lines().map(str::trim).collect();
                announced.iter().all(|p| ports.contains(&p.as_str()))
                    && !real.iter().any(|r| ports.contains(&r.as_str()))
            })
        });
        Backend {
            server: None,
            _cluster: Some(cluster),
            proxies,
            kind: "cluster",
        }
    }

    fn url(&self) -> String {
        let urls: Vec<String> = self.proxies.iter().map(FaultProxy::url).collect();
        urls.join(",")
    }
}

/// Standalone Redis behind the proxy: sets up Redis, the proxy and Sluice, charges each
/// identity counter, runs the callers through a quiet start, the fault and the recovery, then
/// checks and prints what they saw.
async fn run(name: &str, fault: Fault) {
    run_on(Backend::standalone().await, name, fault, FAULT_FOR).await
}

/// [`run`] on `backend`, with the fault lasting `fault_for`.
async fn run_on(mut backend: Backend, name: &str, fault: Fault, fault_for: Duration) {
    let passes_traffic = matches!(
        fault,
        Fault::Proxy(f) if !f.stall && !f.half_close && f.reset_after.is_none()
    );
    let dir = config_dir(&config());
    let url = backend.url();
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", backend.kind),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &url),
            ("REDIS_TIMEOUT", REDIS_TIMEOUT),
        ],
    );
    // A run lasts seconds; the counters must stay in one window for the checks to hold.
    avoid_window_edge(3600, 30).await;
    let mut client = sluice.client().await;
    for i in 0..CALLERS {
        let mut charge = request("pf", vec![descriptor(&[("id", &format!("c{i}"))])]);
        charge.hits_addend = ((i as u64 + 1) * SPACING) as u32;
        assert_eq!(ask(&mut client, charge).await.overall_code, Code::Ok as i32);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let fault_over = Arc::new(std::sync::Mutex::new(None));
    let recovered = Arc::new(AtomicUsize::new(0));
    let fault_on = Arc::new(AtomicBool::new(false));
    let grpc = format!("http://{}", sluice.grpc);
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| {
            let shared = Shared {
                stop: stop.clone(),
                fault_over: fault_over.clone(),
                recovered: recovered.clone(),
                fault_on: fault_on.clone(),
            };
            tokio::spawn(run_caller(grpc.clone(), i, shared))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    fault_on.store(true, Ordering::Relaxed);
    match fault {
        Fault::Proxy(faults) => {
            backend.proxies.iter().for_each(|p| p.set(faults));
            tokio::time::sleep(fault_for).await;
            backend.proxies.iter().for_each(FaultProxy::clear);
        }
        Fault::RestartRedis => {
            let server = backend.server.as_mut().expect("a standalone server");
            server.kill();
            tokio::time::sleep(fault_for).await;
            server.restart();
        }
    }
    fault_on.store(false, Ordering::Relaxed);
    let ended = Instant::now();
    *fault_over.lock().unwrap() = Some(ended);
    // Every caller answered again, or 30 s passed (then the check below names the laggards);
    // then a little more traffic on the recovered connections.
    let give_up = ended + Duration::from_secs(30);
    while Instant::now() < give_up && recovered.load(Ordering::Relaxed) < CALLERS {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for caller in callers {
        seen.push(caller.await.unwrap());
    }
    // Sluice reached every node through its proxy (a node's real port would bypass the faults).
    for proxy in &backend.proxies {
        assert!(
            proxy.accepted() > 0,
            "no connection through {}",
            proxy.url()
        );
    }
    report_and_check(name, &seen, ended, &sluice, passes_traffic);
}

/// Checks what the callers saw (see the file's doc comment) and prints the figures.
/// `passes_traffic`: the fault lets replies through, so answers under it are expected (the
/// checks must have judged some).
fn report_and_check(
    name: &str,
    seen: &[Seen],
    ended: Instant,
    sluice: &Sluice,
    passes_traffic: bool,
) {
    let calls: u64 = seen.iter().map(|s| s.calls).sum();
    let admitted: u64 = seen.iter().map(|s| s.admitted).sum();
    let failed: usize = seen.iter().map(|s| s.failed.len()).sum();
    let in_fault: u64 = seen.iter().map(|s| s.answered_in_fault).sum();
    let slowest = seen.iter().map(|s| s.slowest).max().unwrap();
    let recovered: Vec<Option<Duration>> = seen
        .iter()
        .map(|s| s.first_after_fault.map(|t| t - ended))
        .collect();
    let recovery = recovered.iter().flatten().max().copied();
    let mut codes: Vec<tonic::Code> = seen.iter().flat_map(|s| s.failed.clone()).collect();
    codes.dedup();
    println!(
        "PROXY-FAULT {name}: {calls} calls, {admitted} admitted, {failed} failed, \
         {in_fault} answered during the fault, slowest {:?}, \
         every caller answered again {:?} after the fault ended",
        slowest, recovery
    );

    let wrong: Vec<&String> = seen.iter().flat_map(|s| &s.wrong).collect();
    assert!(
        wrong.is_empty(),
        "{} answers were not the caller's own, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    for (i, s) in seen.iter().enumerate() {
        assert!(
            s.admitted <= budget(i),
            "caller {i} was admitted {} times on a limit of {}",
            s.admitted,
            budget(i)
        );
        for code in &s.failed {
            assert_eq!(*code, tonic::Code::Unavailable, "caller {i}");
        }
    }
    assert!(
        slowest < DEADLINE,
        "an answer took {slowest:?}, past the deadline"
    );
    let laggards: Vec<usize> = (0..seen.len())
        .filter(|&i| recovered[i].is_none())
        .collect();
    assert!(
        laggards.is_empty(),
        "callers {laggards:?} got no answer after the fault ended"
    );
    assert!(
        !passes_traffic || in_fault > 0,
        "no answer while the fault was on: the checks judged nothing under it"
    );
    // Budgets were spent: the over-admission check had something to refuse.
    assert!(calls > admitted, "no call was refused");
    assert!(
        std::path::Path::new(&format!("/proc/{}", sluice.pid())).exists(),
        "sluice exited"
    );
}

fn both_ways(up: Leg, down: Leg) -> Fault {
    Fault::Proxy(Faults {
        up,
        down,
        ..Faults::default()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_and_jitter_in_each_direction() {
    let leg = |ms: u64, jitter: u64| Leg {
        latency: Duration::from_millis(ms),
        jitter: Duration::from_millis(jitter),
        chunking: Chunking::Whole,
    };
    run(
        "latency 5 ms up, 10 ms down, jitter 0-20 ms",
        both_ways(leg(5, 10), leg(10, 20)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replies_split_at_every_byte_boundary() {
    let leg = |chunking| Leg {
        chunking,
        ..Leg::default()
    };
    run(
        "replies one byte per write, commands in random pieces",
        both_ways(leg(Chunking::Random(7)), leg(Chunking::OneByte)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replies_in_random_pieces_with_jitter() {
    let leg = |chunking| Leg {
        chunking,
        jitter: Duration::from_millis(3),
        ..Leg::default()
    };
    run(
        "both ways in random pieces of 1-5 bytes, jitter 0-3 ms",
        both_ways(leg(Chunking::Random(5)), leg(Chunking::Random(5))),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replies_stalled_past_the_deadline() {
    let fault = Faults {
        stall: true,
        ..Faults::default()
    };
    run(
        "replies held 1.5 s (3x the Redis timeout)",
        Fault::Proxy(fault),
    )
    .await;
}

/// Held past the Redis timeout but not past the stall limit (1 s, `STALLED_AFTER` in wire.rs):
/// the connection is kept, the late replies go to the abandoned calls they belong to, and the
/// calls queued behind them get their own.
#[tokio::test(flavor = "multi_thread")]
async fn replies_stalled_past_the_timeout_but_not_the_stall_limit() {
    let fault = Faults {
        stall: true,
        ..Faults::default()
    };
    let name = "replies held 0.8 s (past the timeout, short of the stall limit)";
    let backend = Backend::standalone().await;
    run_on(
        backend,
        name,
        Fault::Proxy(fault),
        Duration::from_millis(800),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_reset_in_the_middle_of_a_reply() {
    let fault = Faults {
        reset_after: Some(5),
        ..Faults::default()
    };
    run(
        "every connection reset 5 bytes into its replies",
        Fault::Proxy(fault),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reply_direction_half_closed() {
    let fault = Faults {
        half_close: true,
        ..Faults::default()
    };
    run("replies stop with a FIN toward Sluice", Fault::Proxy(fault)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_restarted_behind_the_proxy() {
    run(
        "Redis killed, restarted from its AOF 1.5 s later",
        Fault::RestartRedis,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_replies_split_at_every_byte_boundary() {
    let leg = |chunking| Leg {
        chunking,
        ..Leg::default()
    };
    let fault = both_ways(leg(Chunking::Random(7)), leg(Chunking::OneByte));
    let name = "cluster: replies one byte per write, commands in random pieces";
    run_on(Backend::cluster().await, name, fault, FAULT_FOR).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_connections_reset_in_the_middle_of_a_reply() {
    let fault = Fault::Proxy(Faults {
        reset_after: Some(5),
        ..Faults::default()
    });
    let name = "cluster: every connection reset 5 bytes into its replies";
    run_on(Backend::cluster().await, name, fault, FAULT_FOR).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_replies_stalled_past_the_deadline() {
    let fault = Fault::Proxy(Faults {
        stall: true,
        ..Faults::default()
    });
    let name = "cluster: replies held 1.5 s (3x the Redis timeout) on every node";
    run_on(Backend::cluster().await, name, fault, FAULT_FOR).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_reply_direction_half_closed() {
    let fault = Fault::Proxy(Faults {
        half_close: true,
        ..Faults::default()
    });
    let name = "cluster: replies stop with a FIN toward Sluice on every node";
    run_on(Backend::cluster().await, name, fault, FAULT_FOR).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_latency_and_jitter() {
    let leg = |ms: u64, jitter: u64| Leg {
        latency: Duration::from_millis(ms),
        jitter: Duration::from_millis(jitter),
        chunking: Chunking::Whole,
    };
    let fault = both_ways(leg(5, 10), leg(10, 20));
    let name = "cluster: latency 5 ms up, 10 ms down, jitter 0-20 ms on every node";
    run_on(Backend::cluster().await, name, fault, FAULT_FOR).await;
}
