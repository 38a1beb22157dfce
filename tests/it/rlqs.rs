//! Sluice as the quota server (RLQS) of Envoy 1.40's `rate_limit_quota` filter, with real Envoys:
//! two Envoy processes report to Sluice (one Sluice, or two replicas sharing Redis), a tenant
//! limited to 20 per second gets three times that demand split 3:1 between them, and a tenant
//! without a limit rides along. What the clients of the Envoys get is counted per second: the
//! limited tenant's admissions together stay within 16-25 a second over 10 s once the shares
//! are settled, the free tenant is never refused, and every answer is 200 or 429.
//!
//! Envoy 1.40 applies `blanket_rule` and `token_bucket` assignments, reads durations in whole
//! seconds and reports every 5 s whatever `reporting_interval` says (the bootstrap asks for 1 s;
//! checked in its `rate_limit_quota` source and its debug log); these tests pin what they rely
//! on: token buckets whose fill interval is whole seconds, five-second reports,
//! `no_assignment_behavior` and `expired_assignment_behavior` `ALLOW_ALL`. `RLQS_DEBUG=1` prints
//! both Envoys' logs (run them with `--component-log-level rate_limit_quota:debug` to see the
//! reports and assignments) and their request counts.

use sluice_test_kit as kit;

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::io::{Read, Write};
use std::net::TcpStream;

use kit::bootstrap::{Bootstrap, QuotaFilter, Route};
use kit::envoy::{Envoy, Upstream};
use kit::{RedisServer, Sluice, config_dir};

/// Tenant `a` has 20 a second; every other tenant has no limit.
const LIMITS: &str = "\
domain: rlqs
descriptors:
  - key: tenant
    value: a
    rate_limit: { unit: second, requests_per_unit: 20 }
";

/// A bootstrap with the `rate_limit_quota` filter reporting to the cluster `sluice` every
/// second (no ratelimit filter, no health check), the bucket `{tenant: <x-tenant>}`; a request
/// without the header is not limited.
fn bootstrap(listener: u16, admin: u16, sluice: SocketAddr, app: SocketAddr) -> String {
    Bootstrap::new("rlqs", &[sluice], app)
        .filters(&[])
        .quota_filter(QuotaFilter::by_headers(&[("tenant", "x-tenant")]))
        .without_health_check()
        .route(Route::to("backend"))
        .yaml(listener, admin)
}

fn start_envoy(sluice: SocketAddr, app: SocketAddr) -> Envoy {
    Envoy::start_bootstrap(
        |listener, admin| bootstrap(listener, admin, sluice, app),
        "sluice",
        sluice,
        app,
    )
}

/// A GET with `headers` through Envoy at `addr`, on a connection of its own; the status, read
/// from the status line without waiting for the connection to close (Envoy holds a connection
/// it answered locally open for a second, `delayed_close_timeout`); 0 for no answer.
fn status_of(addr: SocketAddr, headers: &[(&str, &str)]) -> u16 {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return 0;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = String::from("GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut head = Vec::new();
    let mut byte = [0u8; 64];
    while !head.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&byte[..n]),
        }
    }
    // "HTTP/1.1 200 OK"
    std::str::from_utf8(head.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One answer a client got: when its request was sent (since the load started), for which
/// tenant, its status.
#[derive(Debug, Clone, Copy)]
struct Answer {
    at: Duration,
    tenant: &'static str,
    status: u16,
    /// The Envoy's listener port.
    via: u16,
}

/// One steady stream of requests: `rate` a second for `tenant` through `envoy`.
struct Load<'a> {
    envoy: &'a Envoy,
    tenant: &'static str,
    rate: u32,
}

/// Sends every load at its pace for `length` (request `i` of a load not before `i / rate`,
/// on a connection of its own, a few at a time so a slow answer does not hold the pace) and
/// returns every answer.
fn run(loads: &[Load], length: Duration) -> Vec<Answer> {
    let answers = Mutex::new(Vec::new());
    let nexts: Vec<AtomicUsize> = loads.iter().map(|_| AtomicUsize::new(0)).collect();
    let start = Instant::now();
    std::thread::scope(|s| {
        for (load, next) in loads.iter().zip(&nexts) {
            let n = (length.as_secs_f64() * f64::from(load.rate)) as usize;
            for _ in 0..4 {
                let answers = &answers;
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return;
                        }
                        let slot = start + Duration::from_secs_f64(i as f64 / f64::from(load.rate));
                        std::thread::sleep(slot.saturating_duration_since(Instant::now()));
                        let headers = [("x-tenant", load.tenant)];
                        let sent = start.elapsed();
                        let status = status_of(load.envoy.listener, &headers);
                        answers.lock().unwrap().push(Answer {
                            at: sent,
                            tenant: load.tenant,
                            status,
                            via: load.envoy.listener.port(),
                        });
                    }
                });
            }
        }
    });
    answers.into_inner().unwrap()
}

/// What a run admitted, per second of the load.
struct Tally {
    /// Tenant `a`'s 200s in each second.
    admitted: Vec<u32>,
    /// Answers other than 200 for the free tenant.
    free_refused: usize,
    /// Answers neither 200 nor 429.
    errors: Vec<u16>,
}

fn tally(answers: &[Answer], seconds: usize) -> Tally {
    let mut admitted = vec![0; seconds];
    let mut free_refused = 0;
    let mut errors = Vec::new();
    for a in answers {
        if a.status != 200 && a.status != 429 {
            errors.push(a.status);
        }
        match a.tenant {
            "a" if a.status == 200 => {
                if let Some(n) = admitted.get_mut(a.at.as_secs() as usize) {
                    *n += 1;
                }
            }
            "a" => {}
            _ if a.status != 200 => free_refused += 1,
            _ => {}
        }
    }
    Tally {
        admitted,
        free_refused,
        errors,
    }
}

/// Seconds of load before the measured ones: Envoy 1.40 reports every 5 s, and the shares settle
/// once a complete demand window (10 s) has been reported.
const SETTLING: usize = 16;
/// The measured seconds.
const MEASURED: usize = 10;

/// Drives the two Envoys: tenant `a` at 45/s through `busy` and 15/s through `quiet` (3× the
/// limit, 3:1), the free tenant at 10/s through each; checks what the clients got.
fn three_times_the_limit_skewed(busy: &Envoy, quiet: &Envoy, what: &str) {
    let loads = [
        Load {
            envoy: busy,
            tenant: "a",
            rate: 45,
        },
        Load {
            envoy: quiet,
            tenant: "a",
            rate: 15,
        },
        Load {
            envoy: busy,
            tenant: "free",
            rate: 10,
        },
        Load {
            envoy: quiet,
            tenant: "free",
            rate: 10,
        },
    ];
    let seconds = SETTLING + MEASURED;
    let answers = run(&loads, Duration::from_secs(seconds as u64));
    let t = tally(&answers, seconds);
    let measured = &t.admitted[SETTLING..];
    let total: u32 = measured.iter().sum();
    if std::env::var_os("RLQS_DEBUG").is_some() {
        eprintln!("BUSY LOG\n{}\nQUIET LOG\n{}", busy.log(), quiet.log());
        for (name, envoy) in [("busy", busy), ("quiet", quiet)] {
            let stats = envoy.stats();
            let rq: Vec<_> = stats
                .iter()
                .filter(|(k, _)| k.starts_with("http.ingress.downstream_rq_"))
                .collect();
            let port = envoy.listener.port();
            let of = |status| {
                answers
                    .iter()
                    .filter(|a| a.tenant == "a" && a.via == port && a.status == status)
                    .count()
            };
            eprintln!("{name}: {rq:?} tenant a 200s {} 429s {}", of(200), of(429));
        }
    }
    eprintln!(
        "{what}: tenant a admitted per second {:?} (settling {:?}), {total} in {MEASURED} s",
        measured,
        &t.admitted[..SETTLING]
    );
    assert!(
        t.errors.is_empty(),
        "{what}: answers other than 200/429: {:?}",
        t.errors
    );
    assert_eq!(
        t.free_refused, 0,
        "{what}: the tenant without a limit was refused"
    );
    assert!(
        (160..=250).contains(&total),
        "{what}: {total} admitted in {MEASURED} s, not 16-25 a second: {measured:?}\nbusy envoy:\n{}",
        busy.log()
    );
}

#[test]
fn two_envoys_share_a_limit_on_one_sluice() {
    let config = config_dir(LIMITS);
    let sluice = Sluice::start(config.path(), None, &[]);
    let app = Upstream::start();
    let busy = start_envoy(sluice.grpc, app.addr);
    let quiet = start_envoy(sluice.grpc, app.addr);
    three_times_the_limit_skewed(&busy, &quiet, "memory store");
    assert!(sluice.metric("sluice_rlqs_streams") >= 2.0);
    // A stream waits between its reports: never ended as a request that does not arrive.
    let ended = r#"sluice_requests_ended_total{reason="request_timeout"}"#;
    assert_eq!(sluice.metric(ended), 0.0, "quota streams were ended");
    let sent = sluice.metric(
        r#"sluice_rlqs_assignments_total{action="token_bucket",bucket="tenant_a",domain="rlqs"}"#,
    );
    assert!(sent > 0.0, "no token bucket was assigned");
}

#[test]
fn two_envoys_share_a_limit_across_two_replicas_on_redis() {
    let redis = RedisServer::start();
    let config = config_dir(LIMITS);
    let one = Sluice::start(config.path(), Some(&redis), &[]);
    let two = Sluice::start(config.path(), Some(&redis), &[]);
    let app = Upstream::start();
    let busy = start_envoy(one.grpc, app.addr);
    let quiet = start_envoy(two.grpc, app.addr);
    three_times_the_limit_skewed(&busy, &quiet, "two replicas on redis");
}

/// Sluice stopped under load (SIGTERM: its quota streams end at once rather than holding the
/// shutdown for its grace period) and started again on the same port: the Envoys keep the
/// shares they hold (an assignment lives three reports, 15 s) while the stream is down, so
/// tenant `a` stays limited; they open a new stream at their next report and get shares again.
/// No request fails at any point.
#[test]
fn envoys_keep_their_shares_while_sluice_restarts() {
    let config = config_dir(LIMITS);
    let port = kit::free_port().to_string();
    let env = [
        ("GRPC_PORT", port.as_str()),
        ("SHUTDOWN_GRACE_PERIOD", "60s"),
    ];
    let sluice = Sluice::start(config.path(), None, &env);
    let app = Upstream::start();
    let busy = start_envoy(sluice.grpc, app.addr);
    let quiet = start_envoy(sluice.grpc, app.addr);
    let loads = [
        Load {
            envoy: &busy,
            tenant: "a",
            rate: 45,
        },
        Load {
            envoy: &quiet,
            tenant: "a",
            rate: 15,
        },
        Load {
            envoy: &busy,
            tenant: "free",
            rate: 10,
        },
    ];
    // Down from 12 s to 20 s of the load; up again after.
    let (down_at, up_at, seconds) = (12, 20, 34);
    let answers = std::thread::scope(|s| {
        let load = s.spawn(|| run(&loads, Duration::from_secs(seconds)));
        std::thread::sleep(Duration::from_secs(down_at));
        let stopping = Instant::now();
        assert!(sluice.terminate().success());
        // Far below the grace period: the streams did not hold the shutdown.
        let stopped_in = stopping.elapsed();
        assert!(stopped_in < Duration::from_secs(20), "{stopped_in:?}");
        let rest = Duration::from_secs(up_at - down_at).saturating_sub(stopped_in);
        std::thread::sleep(rest);
        let again = Sluice::start(config.path(), None, &env);
        let answers = load.join().unwrap();
        drop(again);
        answers
    });
    let t = tally(&answers, seconds as usize);
    eprintln!(
        "sluice restarted: tenant a admitted per second {:?}",
        t.admitted
    );
    assert!(
        t.errors.is_empty(),
        "answers other than 200/429: {:?}",
        t.errors
    );
    assert_eq!(t.free_refused, 0, "the tenant without a limit was refused");
    let down = &t.admitted[down_at as usize..up_at as usize];
    assert!(
        down.iter().all(|&n| n <= 25) && down.iter().sum::<u32>() >= 16 * down.len() as u32,
        "while Sluice was down: {down:?}"
    );
    let settled = &t.admitted[seconds as usize - 5..];
    let total: u32 = settled.iter().sum();
    assert!(
        (80..=125).contains(&total),
        "after the restart: {settled:?}"
    );
}

/// Redis killed under load, two replicas with `FAILURE_POLICY=local_share`: each replica keeps
/// charging and assigning from what it sees (its own Envoy's demand), dividing each share by the
/// replica count as the layer divides the limit, so the two Envoys together stay near the limit
/// instead of falling back to allowing all (60/s); no request fails and the free tenant is never
/// refused.
#[test]
fn redis_down_with_local_share_keeps_each_replica_assigning() {
    let mut redis = RedisServer::start();
    let config = config_dir(LIMITS);
    let env = [
        ("FAILURE_POLICY", "local_share"),
        ("DEGRADED_REPLICAS", "2"),
        ("REDIS_TIMEOUT", "500ms"),
    ];
    let one = Sluice::start(config.path(), Some(&redis), &env);
    let two = Sluice::start(config.path(), Some(&redis), &env);
    let app = Upstream::start();
    let busy = start_envoy(one.grpc, app.addr);
    let quiet = start_envoy(two.grpc, app.addr);
    let loads = [
        Load {
            envoy: &busy,
            tenant: "a",
            rate: 45,
        },
        Load {
            envoy: &quiet,
            tenant: "a",
            rate: 15,
        },
        Load {
            envoy: &busy,
            tenant: "free",
            rate: 10,
        },
    ];
    let (down_at, seconds) = (14, 32);
    let answers = std::thread::scope(|s| {
        let load = s.spawn(|| run(&loads, Duration::from_secs(seconds)));
        std::thread::sleep(Duration::from_secs(down_at));
        redis.kill();
        load.join().unwrap()
    });
    let t = tally(&answers, seconds as usize);
    eprintln!(
        "redis down at {down_at} s: tenant a admitted per second {:?}",
        t.admitted
    );
    assert!(
        t.errors.is_empty(),
        "answers other than 200/429: {:?}",
        t.errors
    );
    assert_eq!(t.free_refused, 0, "the tenant without a limit was refused");
    // From the first reports after the outage began (Envoy reports every 5 s) to the end.
    let down = &t.admitted[down_at as usize + 6..];
    assert!(
        down.iter().all(|&n| (10..=25).contains(&n)),
        "while Redis was down: {down:?}"
    );
    assert!(one.metric(r#"sluice_degraded_decisions_total{store="redis"}"#) > 0.0);
}
