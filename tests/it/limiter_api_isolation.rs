//! The native API (`sluice.v1.Limiter`) cannot disturb the Envoy path: it is off unless enabled,
//! can sit on its own port behind a bearer token, and nothing a caller does with it (bad calls,
//! calls that make the store's script fail) changes an RLS answer or RLS health.

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kit::native::{self, config, limiter_client, set_request};
use kit::*;
use sluice::proto::Code;
use sluice::proto::sluice::v1::{
    AcquireRequest, Algorithm, AvailablePermitsRequest, Mode, SetMode, SetRateRequest,
    TryAcquireRequest,
};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const CONFIG: &str = "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 300}\n";

/// Sets limiter `name`, `rate` per minute, resetting its state.
fn set_rate(name: &str, algorithm: Algorithm, rate: u64) -> SetRateRequest {
    let config = config(name, algorithm, rate, Duration::from_secs(60));
    set_request(config, SetMode::UpdateResetState)
}

/// A `try_acquire` of the shared budget with the server's default wait.
fn take(name: &str, permits: u64) -> TryAcquireRequest {
    native::take(name, "", permits, None)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_native_api_is_off_unless_enabled() {
    let dir = config_dir(CONFIG);
    let mut cmd = sluice_command(dir.path());
    cmd.env_remove("LIMITER_API_ENABLED");
    let sluice = Sluice::spawn(cmd);
    let mut c = limiter_client(sluice.grpc).await;
    let status = c
        .set_rate(set_rate("a", Algorithm::FixedWindow, 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    // RLS is there as always.
    let mut rls = sluice.client().await;
    let r = ask(&mut rls, request("app", vec![descriptor(&[("user", "u")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);

    // Its settings without the switch are a start-up error, not silently ignored.
    let mut cmd = sluice_command(dir.path());
    cmd.env_remove("LIMITER_API_ENABLED")
        .env("LIMITER_API_TOKEN", "0123456789abcdef");
    let (_, stderr) = refused_start(&mut cmd);
    assert!(
        stderr.contains("LIMITER_API_TOKEN") && stderr.contains("LIMITER_API_ENABLED"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("0123456789abcdef"),
        "the token is never printed: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn its_own_port_and_a_bearer_token() {
    let dir = config_dir(CONFIG);
    let token = "s3cret-token-for-tests";
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[("LIMITER_GRPC_PORT", "0"), ("LIMITER_API_TOKEN", token)],
    );
    let api = sluice.limiter_api.expect("the API listens on its own port");
    assert_ne!(api, sluice.grpc);

    // Not on the gRPC port Envoy reaches.
    let mut on_rls_port = limiter_client(sluice.grpc).await;
    let status = on_rls_port
        .set_rate(set_rate("a", Algorithm::FixedWindow, 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");

    // On its port: no token, a wrong one, then the right one.
    let mut c = limiter_client(api).await;
    let status = c
        .set_rate(set_rate("a", Algorithm::FixedWindow, 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    fn with<T>(bearer: &str, body: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(body);
        r.metadata_mut()
            .insert("authorization", format!("Bearer {bearer}").parse().unwrap());
        r
    }
    let status = c
        .set_rate(with(
            "s3cret-token-for-test",
            set_rate("a", Algorithm::FixedWindow, 1),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let r = c
        .set_rate(with(token, set_rate("a", Algorithm::FixedWindow, 1)))
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied);
    let got = c.try_acquire(with(token, take("a", 1))).await.unwrap();
    assert!(got.into_inner().acquired);

    // RLS is not served on the API's port.
    let mut rls_on_api = sluice::proto::RateLimitServiceClient::connect(format!("http://{api}"))
        .await
        .unwrap();
    let status = rls_on_api
        .should_rate_limit(request("app", vec![descriptor(&[("user", "u")])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

/// Script errors are answers, not outages: a key of the wrong type makes every call on it fail
/// in Redis, and still neither breaker opens, health stays 200 and other keys are decided.
#[tokio::test(flavor = "multi_thread")]
async fn script_errors_never_open_a_breaker() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("BREAKER_FAILURES", "2")]);
    let mut rls = sluice.client().await;
    let mut api = limiter_client(sluice.grpc).await;
    // A limiter whose config key another writer turned into a string: WRONGTYPE in the script.
    let mut conn = redis.connection();
    redis::cmd("SET")
        .arg("{limiter_poisoned}:config")
        .arg("x")
        .exec(&mut conn)
        .unwrap();
    // And an RLS counter of the wrong type (the fixed-window keys name the hour; both hours, in
    // case the test runs across the boundary).
    let hour = now_secs() / 3600 * 3600;
    for window in [hour, hour + 3600] {
        redis::cmd("RPUSH")
            .arg(format!("app_user_poisoned_{window}"))
            .arg("x")
            .exec(&mut conn)
            .unwrap();
    }
    for _ in 0..10 {
        let status = api.try_acquire(take("poisoned", 1)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let status = rls
            .should_rate_limit(request("app", vec![descriptor(&[("user", "poisoned")])]))
            .await
            .unwrap_err();
        assert!(status.message().contains("script error"), "{status:?}");
    }
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200);
    let r = ask(
        &mut rls,
        request("app", vec![descriptor(&[("user", "fine")])]),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 299);
    assert_eq!(
        sluice.metric(
            "sluice_store_errors_total{error=\"script\",operation=\"check\",store=\"redis\"}"
        ),
        10.0
    );
    assert_eq!(
        sluice.metric("sluice_circuit_breaker_open{store=\"redis\"}"),
        0.0
    );
    assert_eq!(
        sluice.metric("sluice_circuit_breaker_open{store=\"redis_limiter_api\"}"),
        0.0
    );
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// One client hammers the native API with every kind of bad call while another sends
/// `ShouldRateLimit`: every RLS answer is exact and health stays SERVING throughout.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_native_client_cannot_disturb_rls() {
    for_each_store(|kind, redis| async move {
        let dir = config_dir(CONFIG);
        let sluice = Sluice::start(dir.path(), redis.as_ref(), &[("BREAKER_FAILURES", "2")]);
        if let Some(redis) = &redis {
            let mut conn = redis.connection();
            redis::cmd("SET")
                .arg("{limiter_poisoned}:config")
                .arg("x")
                .exec(&mut conn)
                .unwrap();
        }
        let seconds = if redis.is_some() { 10 } else { 4 };
        avoid_window_edge(3600, seconds + 30).await;
        // At least this long and at least 400 RLS calls (past the limit of 300), however slow
        // the machine; the hostile client runs until then.
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let bad_calls = Arc::new(AtomicU64::new(0));

        let hostile = {
            let mut c = limiter_client(sluice.grpc).await;
            let bad_calls = bad_calls.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                c.set_rate(set_rate("bomb", Algorithm::FixedWindow, 10))
                    .await
                    .unwrap();
                let mut per_client = set_rate("pc", Algorithm::TokenBucket, 5);
                per_client.config.as_mut().unwrap().mode = Mode::PerClient as i32;
                c.set_rate(per_client).await.unwrap();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    // Each of these must be answered (OK or an error status), never hang.
                    let _ = c.try_acquire(take("bomb", u64::MAX)).await;
                    let _ = c.try_acquire(take("bomb", 11)).await;
                    let _ = c.try_acquire(take("poisoned", 1)).await;
                    let _ = c.try_acquire(take(&"n".repeat(300), 1)).await;
                    let _ = c.try_acquire(take("missing", 1)).await;
                    let _ = c.try_acquire(take("pc", 1)).await;
                    let _ = c
                        .acquire(AcquireRequest {
                            name: "bomb".into(),
                            permits: u64::MAX,
                            client_id: String::new(),
                        })
                        .await;
                    let _ = c
                        .available_permits(AvailablePermitsRequest {
                            name: "poisoned".into(),
                            client_id: String::new(),
                        })
                        .await;
                    let _ = c.set_rate(set_rate("bad", Algorithm::Unspecified, 0)).await;
                    let _ = c
                        .set_rate(set_rate(
                            &format!("churn{}", round % 50),
                            Algorithm::Gcra,
                            3,
                        ))
                        .await;
                    bad_calls.fetch_add(10, Ordering::Relaxed);
                }
            })
        };

        let mut rls = sluice.client().await;
        let channel = Channel::from_shared(format!("http://{}", sluice.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let (mut admitted, mut refused, mut asked) = (0u32, 0u32, 0u32);
        while started.elapsed() < Duration::from_secs(seconds) || asked < 400 {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{kind:?}: too slow"
            );
            // 300 an hour: the first 300 are admitted, every later one refused, none failed.
            let r = rls
                .should_rate_limit(request("app", vec![descriptor(&[("user", "victim")])]))
                .await
                .unwrap_or_else(|s| panic!("{kind:?}: RLS answered {s:?}"))
                .into_inner();
            asked += 1;
            if r.overall_code == Code::Ok as i32 {
                admitted += 1;
                assert_eq!(r.statuses[0].limit_remaining, 300 - admitted, "{kind:?}");
                assert_eq!(refused, 0, "{kind:?}: admitted after a refusal");
            } else {
                refused += 1;
            }
            if asked % 50 == 0 {
                let status = health
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .status;
                assert_eq!(status, ServingStatus::Serving as i32, "{kind:?}");
                assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200, "{kind:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        hostile.await.unwrap();
        println!(
            "{kind:?}: {asked} RLS calls ({admitted} admitted) beside {} hostile native calls",
            bad_calls.load(Ordering::Relaxed)
        );
        assert_eq!(admitted, 300, "{kind:?}");
        assert!(bad_calls.load(Ordering::Relaxed) > 0);
    })
    .await;
}

/// The native API's state is bounded: at most `LIMITER_MAX_COUNT` limiters, idle ones deleted
/// after `LIMITER_IDLE_EXPIRY`, names and client ids of at most 256 bytes. On both stores.
#[tokio::test(flavor = "multi_thread")]
async fn named_state_is_bounded() {
    for_each_store(|kind, redis| async move {
        let dir = config_dir(CONFIG);
        let sluice = Sluice::start(
            dir.path(),
            redis.as_ref(),
            &[("LIMITER_MAX_COUNT", "3"), ("LIMITER_IDLE_EXPIRY", "2s")],
        );
        let mut c = limiter_client(sluice.grpc).await;
        for name in ["a", "b", "kept"] {
            c.set_rate(set_rate(name, Algorithm::FixedWindow, 100))
                .await
                .unwrap();
        }
        let status = c
            .set_rate(set_rate("d", Algorithm::FixedWindow, 100))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{kind:?}: {status:?}"
        );
        // Changing an existing one is not creating one.
        c.set_rate(set_rate("a", Algorithm::FixedWindow, 50))
            .await
            .unwrap();
        c.delete(sluice::proto::sluice::v1::DeleteRequest { name: "b".into() })
            .await
            .unwrap();
        c.set_rate(set_rate("d", Algorithm::FixedWindow, 100))
            .await
            .unwrap();

        // Lengths.
        let status = c.try_acquire(take(&"n".repeat(257), 1)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{kind:?}");
        let mut long_client = take("a", 1);
        long_client.client_id = "c".repeat(257);
        let status = c.try_acquire(long_client).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{kind:?}");

        // Idle ones go; one used every 200 ms stays. The sweep runs every second. ("a" was last
        // used when it was set above.)
        let started = Instant::now();
        loop {
            let kept = c.try_acquire(take("kept", 1)).await.unwrap().into_inner();
            assert!(kept.acquired, "{kind:?}: the limiter in use was deleted");
            let idle = c.try_acquire(take("d", 1)).await;
            if started.elapsed() < Duration::from_millis(1_500) {
                // Well within its idle time (the try above is itself a use, so only look early).
                assert!(idle.is_ok(), "{kind:?}: {idle:?}");
            }
            // Looking at its config is not a use.
            let gone = c
                .get_config(sluice::proto::sluice::v1::GetConfigRequest { name: "a".into() })
                .await;
            if gone
                .as_ref()
                .is_err_and(|s| s.code() == tonic::Code::NotFound)
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{kind:?}: an idle limiter was never deleted"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "{kind:?}: an idle limiter was deleted {:?} after its last use",
            started.elapsed()
        );
        if let Some(redis) = &redis {
            let mut conn = redis.connection();
            let exists: i64 = redis::cmd("EXISTS")
                .arg("{limiter_a}:config")
                .query(&mut conn)
                .unwrap();
            assert_eq!(exists, 0, "the deleted limiter's config is gone from Redis");
        }
        // Its place is free again.
        c.set_rate(set_rate("e", Algorithm::FixedWindow, 100))
            .await
            .unwrap();
    })
    .await;
}
