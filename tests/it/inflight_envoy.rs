//! `algorithm: concurrency` through a real Envoy 1.40 on the shipped example
//! `deploy/envoy/inflight.yaml` (addresses rewritten): a lease taken at request time, given back
//! by the stream-done descriptor that ends in `sluice_release` (issue #44). Twenty concurrent slow
//! requests against 5 in flight: 5 run and 15 are refused while they do, then 5 run again, and
//! no lease is left behind, on both stores. With Sluice killed mid-stream the releases are lost
//! and the leases expire after their unit (on Redis, which outlives the Sluice process).

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::envoy::{Envoy, Upstream, example_config};
use kit::*;
use sluice::proto::Code;

const INFLIGHT_ENVOY_YAML: &str = include_str!("../../deploy/envoy/inflight.yaml");
const INFLIGHT_LIMITS_YAML: &str = include_str!("../../deploy/envoy/inflight-limits.yaml");

/// The RLS calls Sluice has answered (upstream's `ratelimit_server.ShouldRateLimit.total_requests`).
fn calls_answered(sluice: &Sluice) -> usize {
    let (status, body) = http_request(sluice.debug, "GET", "/stats", "");
    assert_eq!(status, 200, "sluice /stats: {body}");
    body.lines()
        .find_map(|l| l.strip_prefix("ratelimit_server.ShouldRateLimit.total_requests: "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn envoy_for(sluice: &Sluice, app: &Upstream) -> Envoy {
    Envoy::start_bootstrap(
        |listener, admin| {
            example_config(INFLIGHT_ENVOY_YAML, listener, admin, sluice.grpc, app.addr)
        },
        "sluice",
        sluice.grpc,
        app.addr,
    )
}

/// `n` requests for `user` at once, each held `delay_ms` by the upstream; their statuses.
fn burst(envoy: &Envoy, user: &str, n: usize, delay_ms: u64) -> Vec<u16> {
    let delay = delay_ms.to_string();
    std::thread::scope(|scope| {
        let streams: Vec<_> = (0..n)
            .map(|_| {
                let delay = delay.as_str();
                scope.spawn(move || {
                    envoy
                        .request("/", &[("x-user-id", user), ("x-delay-ms", delay)])
                        .status
                })
            })
            .collect();
        streams.into_iter().map(|s| s.join().unwrap()).collect()
    })
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// The leases free for `user` (5 less those held), read with a zero-cost look, which takes
/// nothing (and is refused when no lease is free).
async fn leases_free(sluice: &Sluice, user: &str) -> u32 {
    let mut client = sluice.client().await;
    let mut look = descriptor(&[("inflight", user)]);
    look.hits_addend = Some(0);
    let answer = ask(&mut client, request("inflight", vec![look])).await;
    let free = answer.statuses[0].limit_remaining;
    let code = if free > 0 { Code::Ok } else { Code::OverLimit };
    assert_eq!(answer.overall_code, code as i32, "{answer:?}");
    free
}

#[tokio::test(flavor = "multi_thread")]
async fn five_in_flight_of_twenty_then_five_again_and_no_lease_left() {
    let redis = RedisServer::start();
    for server in [None, Some(&redis)] {
        let config = config_dir(INFLIGHT_LIMITS_YAML);
        let sluice = Sluice::start(config.path(), server, &[]);
        let app = Upstream::metered();
        let envoy = envoy_for(&sluice, &app);
        for round in 1..=2 {
            // Held 4 s: the 15 refusals come back while the 5 admitted still run.
            let statuses = burst(&envoy, "alice", 20, 4000);
            assert_eq!(
                (count(&statuses, 200), count(&statuses, 429)),
                (5, 15),
                "round {round}, redis {}: {statuses:?}",
                server.is_some()
            );
            // Each admitted stream's release reaches Sluice after the client has its response.
            wait_until("every check and release answered", || {
                calls_answered(&sluice) >= 25 * round
            });
            assert_eq!(calls_answered(&sluice), 25 * round);
        }
        assert_eq!(
            leases_free(&sluice, "alice").await,
            5,
            "no lease left behind"
        );
        assert_eq!(
            sluice.metric("sluice_concurrency_releases_total{result=\"returned\"}"),
            10.0
        );
        assert_eq!(
            sluice.metric("sluice_concurrency_releases_total{result=\"nothing_held\"}"),
            0.0
        );
    }
    assert_eq!(
        redis
            .cli(&["--raw", "KEYS", "*"])
            .unwrap_or_default()
            .trim(),
        "",
        "no lease key left on Redis"
    );
}

/// Kills `sluice` (SIGKILL, as after a crash) and waits until it refuses connections.
fn kill_and_wait(sluice: &Sluice) {
    std::process::Command::new("kill")
        .args(["-KILL", &sluice.pid().to_string()])
        .status()
        .unwrap();
    wait_until("sluice stops listening", || {
        std::net::TcpStream::connect(sluice.grpc).is_err()
    });
}

/// Sluice killed while 5 streams hold every lease: their releases are lost, so a new Sluice on
/// the same Redis (and port) refuses the user until the leases expire, one unit (20 s) after
/// they were taken, and no sooner; then it admits again.
#[tokio::test(flavor = "multi_thread")]
async fn leases_of_a_killed_sluice_expire_after_their_unit() {
    let limits = INFLIGHT_LIMITS_YAML.replace(
        "      unit: minute\n",
        "      unit: second\n      unit_multiplier: 20\n",
    );
    assert_ne!(limits, INFLIGHT_LIMITS_YAML);
    let config = config_dir(&limits);
    let redis = RedisServer::start();
    let port = free_port().to_string();
    let env = [("GRPC_PORT", port.as_str())];
    let sluice = Sluice::start(config.path(), Some(&redis), &env);
    let app = Upstream::metered();
    let envoy = envoy_for(&sluice, &app);
    let sent = Instant::now();
    let statuses = std::thread::scope(|scope| {
        let envoy = &envoy;
        let held = scope.spawn(move || burst(envoy, "bob", 5, 3000));
        wait_until("the five checks", || calls_answered(&sluice) == 5);
        kill_and_wait(&sluice);
        held.join().unwrap()
    });
    assert_eq!(statuses, [200; 5], "the held responses reach the client");
    drop(sluice);
    // Envoy keeps trying a call to Sluice until the filter's timeout (the harness's 5 s): a
    // Sluice back on the port before that would still get the releases.
    std::thread::sleep(Duration::from_secs(7));
    let again = Sluice::start(config.path(), Some(&redis), &env);
    // Asked directly: the new Sluice finds the five leases the lost releases never gave back.
    assert_eq!(
        leases_free(&again, "bob").await,
        0,
        "the leases are still held"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while leases_free(&again, "bob").await < 5 {
        assert!(Instant::now() < deadline, "the leases never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_secs(20),
        "leases expired after {waited:?}, before their unit"
    );
    // Through Envoy again, once it reaches the new Sluice (until then it fails open): five in
    // flight, the sixth refused.
    wait_until("envoy reaches the new sluice", || {
        burst(&envoy, "carol", 1, 0);
        calls_answered(&again) >= 2
    });
    let statuses = burst(&envoy, "bob", 6, 3000);
    assert_eq!(
        (count(&statuses, 200), count(&statuses, 429)),
        (5, 1),
        "{statuses:?}"
    );
    drop(again);
}
