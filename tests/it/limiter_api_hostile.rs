//! Hostile callers of the native API (issue #27, items 2, 5, 6 and part of 9), through the real
//! binary, on both stores where a store is involved: the API cannot evict Envoy's counters, a
//! per-client limiter holds a bounded number of client states, a waiting line is per budget,
//! a change of the state's shape starts afresh and says so, and every number the API takes is
//! bounded alike on both stores.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::native::{self, LimiterSluice, available, config, limiter_client, per_client, take};
use kit::*;
use sluice::proto::Code;
use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    Algorithm, AvailablePermitsRequest, LimiterConfig, SetMode, SetRateRequest,
};
use tonic::transport::Channel;

/// Sets `config` with `mode`: whether it was applied and whether the state was reset.
async fn set(
    c: &mut LimiterClient<Channel>,
    config: LimiterConfig,
    mode: SetMode,
) -> Result<(bool, bool), tonic::Status> {
    let r = native::set(c, config, mode).await?;
    Ok((r.applied, r.state_reset))
}

/// Whether one permit of `name` is granted to `client` at once.
async fn acquired(c: &mut LimiterClient<Channel>, name: &str, client: &str) -> bool {
    native::acquired(c, name, client, 1).await
}

const FLOOD_CONFIG: &str = r#"
domain: flood
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
"#;

/// Item 2, the reported attack: on the memory store with `MEMORY_MAX_COUNTERS=6400`, 640 RLS
/// users over their 5-per-day limit, then a per-client limiter of 1 per 366 days and 20 000
/// fresh client ids through the native API. Every user must still be refused: the API's states
/// live in a table of their own. Before: 640 of 640 were admitted again.
#[tokio::test(flavor = "multi_thread")]
async fn the_native_api_cannot_evict_envoys_counters() {
    // A day's window: the margin of 5 minutes is then kept before midnight only, not before
    // every hour, where waiting it out held a test thread for up to 5 minutes.
    avoid_window_edge(86_400, 300).await;
    let dir = config_dir(FLOOD_CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[("MEMORY_MAX_COUNTERS", "6400")]);
    let mut rls = sluice.client().await;
    let victims: Vec<String> = (0..640).map(|i| format!("victim{i}")).collect();
    let users = |names: &[String]| {
        request(
            "flood",
            names
                .iter()
                .map(|n| descriptor(&[("user", n.as_str())]))
                .collect(),
        )
    };
    for round in 1..=6 {
        for batch in victims.chunks(64) {
            let response = ask(&mut rls, users(batch)).await;
            let want = if round <= 5 {
                Code::Ok
            } else {
                Code::OverLimit
            };
            assert!(
                response.statuses.iter().all(|s| s.code == want as i32),
                "round {round}"
            );
        }
    }

    let mut api = limiter_client(sluice.grpc).await;
    let year = per_client(config(
        "year",
        Algorithm::FixedWindow,
        1,
        Duration::from_secs(366 * 86_400),
    ));
    set(&mut api, year, SetMode::UpdateResetState)
        .await
        .unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for part in 0..16 {
        let mut api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut granted = 0;
            for i in (part..20_000).step_by(16) {
                let r = api
                    .try_acquire(take("year", &format!("fresh{i}"), 1, Duration::ZERO))
                    .await
                    .unwrap()
                    .into_inner();
                granted += usize::from(r.acquired);
            }
            granted
        }));
    }
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    println!(
        "20 000 fresh client ids in {:?}: {granted} granted",
        started.elapsed()
    );
    assert_eq!(granted, 20_000, "each fresh client gets its one permit");

    let mut admitted = 0;
    for batch in victims.chunks(64) {
        let response = ask(&mut rls, users(batch)).await;
        admitted += response
            .statuses
            .iter()
            .filter(|s| s.code == Code::Ok as i32)
            .count();
    }
    println!(
        "{admitted} of 640 users over their limit admitted again after the flood, {} RLS evictions",
        sluice.metric("sluice_memory_store_evictions_total")
    );
    assert_eq!(admitted, 0, "of 640 users over their limit");
    let states = sluice.metric("sluice_memory_limiter_states");
    assert_eq!(
        states, 20_000.0,
        "the API's states are counted on their own"
    );
    sluice.terminate();
}

/// Item 2, the per-limiter cap: a per-client limiter holds at most `LIMITER_MAX_CLIENTS`
/// client states. A new client beyond it is refused (RESOURCE_EXHAUSTED) rather than allowed to
/// push out someone's state, so a flood of fresh ids can neither reset a client over its limit
/// nor grow the store; once states expire, new clients get room again. On both stores.
#[tokio::test(flavor = "multi_thread")]
async fn a_per_client_limiter_holds_at_most_its_cap_of_clients() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[("LIMITER_MAX_CLIENTS", "50")]);
        let mut c = sluice.client().await;
        // A client that stays over its limit for the whole test, and one whose state expires
        // within seconds, to show that room comes back.
        let long = per_client(config(
            "capped",
            Algorithm::SlidingWindowLog,
            1,
            Duration::from_secs(3_600),
        ));
        set(&mut c, long, SetMode::UpdateResetState).await.unwrap();
        assert!(acquired(&mut c, "capped", "victim").await, "{kind:?}");
        assert!(!acquired(&mut c, "capped", "victim").await, "{kind:?}");

        let (mut granted, mut exhausted) = (0, 0);
        for i in 0..80 {
            match c
                .try_acquire(take("capped", &format!("fresh{i}"), 1, Duration::ZERO))
                .await
            {
                Ok(r) => granted += usize::from(r.into_inner().acquired),
                Err(s) if s.code() == tonic::Code::ResourceExhausted => exhausted += 1,
                Err(s) => panic!("{kind:?}: {s:?}"),
            }
        }
        println!("{kind:?}: 80 fresh clients, cap 50: {granted} granted, {exhausted} refused");
        assert_eq!((granted, exhausted), (49, 31), "{kind:?}");
        // Nobody's state was pushed out: the victim is still over its limit, a client that got
        // in is still known.
        assert!(!acquired(&mut c, "capped", "victim").await, "{kind:?}");
        assert!(!acquired(&mut c, "capped", "fresh0").await, "{kind:?}");
        if let Some(redis) = &redis {
            // The places are a sorted set that expires with its latest member, like every key
            // the scripts write.
            let mut conn = redis.connection();
            let held: u64 = redis::cmd("ZCARD")
                .arg("{limiter_capped}:clients")
                .query(&mut conn)
                .unwrap();
            let ttl: i64 = redis::cmd("PTTL")
                .arg("{limiter_capped}:clients")
                .query(&mut conn)
                .unwrap();
            assert_eq!(held, 50, "{kind:?}");
            assert!(ttl > 0 && ttl <= 3_600_000, "{kind:?}: TTL {ttl} ms");
        }
        // Another limiter has a cap of its own.
        let other = per_client(config(
            "other",
            Algorithm::TokenBucket,
            1,
            Duration::from_secs(1),
        ));
        set(&mut c, other, SetMode::UpdateResetState).await.unwrap();
        assert!(acquired(&mut c, "other", "fresh79").await, "{kind:?}");

        // States that expire make room: a 1 s sliding window fills the cap, and a second later
        // new clients are served again.
        let short = per_client(config(
            "short",
            Algorithm::SlidingWindowLog,
            1,
            Duration::from_secs(1),
        ));
        set(&mut c, short, SetMode::UpdateResetState).await.unwrap();
        for i in 0..50 {
            assert!(
                acquired(&mut c, "short", &format!("s{i}")).await,
                "{kind:?}"
            );
        }
        let status = c
            .try_acquire(take("short", "late", 1, Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{kind:?}");
        let mut late_refused = 1;
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match c
                .try_acquire(take("short", "late", 1, Duration::ZERO))
                .await
            {
                Ok(r) => {
                    assert!(r.into_inner().acquired, "{kind:?}");
                    break;
                }
                Err(s) => {
                    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{kind:?}");
                    late_refused += 1;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{kind:?}: expired client states never made room"
            );
        }
        // Every refusal counted, on both stores (before, only the memory store's).
        let refused = sluice.sluice.metric("sluice_limiter_clients_refused_total");
        assert_eq!(refused, f64::from(31 + late_refused), "{kind:?}");
    })
    .await;
}

/// Item 5: an `OVERALL` limiter has one budget, so one line whatever the client ids. On a
/// drained 2-per-second bucket, eight waiters arrive 30 ms apart, then a caller naming
/// `client_id: "jump"`: it is served last, and the line still costs about one store call per
/// grant. Before: "jump" was served first (memory) or third (Redis).
#[tokio::test(flavor = "multi_thread")]
async fn a_late_caller_with_a_client_id_waits_behind_the_line() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[("LIMITER_MAX_WAIT", "60s")]);
        let mut c = sluice.client().await;
        let bucket = config("line", Algorithm::TokenBucket, 2, Duration::from_secs(1));
        set(&mut c, bucket, SetMode::UpdateResetState)
            .await
            .unwrap();
        // Drained.
        let drained = c
            .try_acquire(take("line", "", 2, Duration::ZERO))
            .await
            .unwrap()
            .into_inner();
        assert!(drained.acquired, "{kind:?}");

        let store = if redis.is_some() { "redis" } else { "memory" };
        let series =
            format!("sluice_store_call_seconds_count{{operation=\"acquire\",store=\"{store}\"}}");
        let calls_before = sluice.sluice.metric(&series);
        let clients: Vec<String> = (0..8)
            .map(|_| String::new())
            .chain(["jump".to_string()])
            .collect();
        let requests = clients
            .iter()
            .map(|client| take("line", client, 1, Duration::from_secs(30)))
            .collect();
        let mut done = native::acquire_in_order(&c, requests, Duration::from_millis(30)).await;
        let calls = sluice.sluice.metric(&series) - calls_before;
        assert!(done.iter().all(|(_, acquired, _)| *acquired), "{kind:?}");
        done.sort_by_key(|(_, _, at)| *at);
        let order: Vec<usize> = done.iter().map(|(i, _, _)| *i).collect();
        let place = order.iter().position(|&i| i == 8).unwrap() + 1;
        println!(
            "{kind:?}: served in order {order:?}; \"jump\" {place} of 9; {calls} store calls for 9 grants"
        );
        assert_eq!(place, 9, "{kind:?}: the late caller jumped the line: {order:?}");
        assert!(
            calls / 9.0 <= 2.0,
            "{kind:?}: {calls} store calls for 9 grants"
        );
    })
    .await;
}

/// Item 6: `UPDATE_KEEP_STATE` between `OVERALL` and `PER_CLIENT` cannot keep anything (one
/// shared state against one per client), so it answers `state_reset: true`, and the states of
/// the mode left behind do not come back when switching back. On both stores.
#[tokio::test(flavor = "multi_thread")]
async fn a_mode_change_resets_the_state_and_says_so() {
    for_each_store(|kind, redis| async move {
        avoid_window_edge(3_600, 60).await;
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let overall = config(
            "modes",
            Algorithm::FixedWindow,
            2,
            Duration::from_secs(3_600),
        );
        let clients = per_client(overall.clone());

        set(&mut c, clients.clone(), SetMode::UpdateResetState)
            .await
            .unwrap();
        assert!(acquired(&mut c, "modes", "a").await, "{kind:?}");
        assert!(acquired(&mut c, "modes", "a").await, "{kind:?}");
        assert_eq!(available(&mut c, "modes", "a").await, 0, "{kind:?}");

        let (applied, reset) = set(&mut c, overall.clone(), SetMode::UpdateKeepState)
            .await
            .unwrap();
        assert!(applied, "{kind:?}");
        assert!(
            reset,
            "{kind:?}: PER_CLIENT -> OVERALL kept no state, yet said so"
        );
        assert_eq!(available(&mut c, "modes", "").await, 2, "{kind:?}");
        assert!(acquired(&mut c, "modes", "").await, "{kind:?}");
        assert!(acquired(&mut c, "modes", "").await, "{kind:?}");

        let (_, reset) = set(&mut c, clients.clone(), SetMode::UpdateKeepState)
            .await
            .unwrap();
        assert!(
            reset,
            "{kind:?}: OVERALL -> PER_CLIENT kept no state, yet said so"
        );
        // Client a's old state must not come back.
        assert_eq!(
            available(&mut c, "modes", "a").await,
            2,
            "{kind:?}: an old per-client state came back"
        );
        let (_, reset) = set(&mut c, overall, SetMode::UpdateKeepState)
            .await
            .unwrap();
        assert!(reset, "{kind:?}");
        assert_eq!(
            available(&mut c, "modes", "").await,
            2,
            "{kind:?}: the old shared state came back"
        );
        // The same mode keeps its state, as before.
        assert!(acquired(&mut c, "modes", "").await, "{kind:?}");
        let same = config(
            "modes",
            Algorithm::FixedWindow,
            3,
            Duration::from_secs(3_600),
        );
        let (_, reset) = set(&mut c, same, SetMode::UpdateKeepState).await.unwrap();
        assert!(!reset, "{kind:?}");
        assert_eq!(available(&mut c, "modes", "").await, 2, "{kind:?}");
    })
    .await;
}

/// Item 9: every number of the API is bounded so both stores compute with it alike, and
/// unknown enum values are refused. A warm-up period of 2^62 s used to be accepted (Redis then
/// failed every acquisition, memory admitted), and so was an unknown mode.
#[tokio::test(flavor = "multi_thread")]
async fn out_of_range_numbers_and_unknown_enums_are_refused_on_both_stores() {
    for_each_store(|kind, redis| async move {
        let sluice = LimiterSluice::start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let warm = |rate: u64, warmup: Duration| LimiterConfig {
            warmup_period: Some(warmup.try_into().unwrap()),
            ..config("warm", Algorithm::WarmUp, rate, Duration::from_secs(1))
        };
        let invalid = |r: Result<(bool, bool), tonic::Status>, what: &str| match r {
            Err(s) => assert_eq!(
                s.code(),
                tonic::Code::InvalidArgument,
                "{kind:?} {what}: {s:?}"
            ),
            Ok(r) => panic!("{kind:?} {what}: accepted {r:?}"),
        };
        invalid(
            set(
                &mut c,
                warm(10, Duration::from_secs(1 << 62)),
                SetMode::TrySet,
            )
            .await,
            "warmup 2^62 s",
        );
        invalid(
            set(
                &mut c,
                warm(10, Duration::from_secs(367 * 86_400)),
                SetMode::TrySet,
            )
            .await,
            "warmup 367 days",
        );
        // Within 366 days, but a million a second warmed up for a year stores more permits than
        // the scripts count exactly.
        invalid(
            set(
                &mut c,
                warm(1_000_000, Duration::from_secs(366 * 86_400)),
                SetMode::TrySet,
            )
            .await,
            "warmup stored permits",
        );
        let mut mode = config("m", Algorithm::FixedWindow, 1, Duration::from_secs(1));
        mode.mode = 7;
        invalid(set(&mut c, mode, SetMode::TrySet).await, "mode 7");
        let mut algorithm = config("m", Algorithm::FixedWindow, 1, Duration::from_secs(1));
        algorithm.algorithm = 42;
        invalid(
            set(&mut c, algorithm, SetMode::TrySet).await,
            "algorithm 42",
        );
        let status = c
            .set_rate(SetRateRequest {
                config: Some(config(
                    "m",
                    Algorithm::FixedWindow,
                    1,
                    Duration::from_secs(1),
                )),
                set_mode: 9,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{kind:?}");
        let mut cold = warm(10, Duration::from_secs(10));
        cold.cold_factor = f64::NAN;
        invalid(set(&mut c, cold, SetMode::TrySet).await, "cold factor NaN");

        // The largest accepted warm-up behaves alike: one permit now, then none.
        set(
            &mut c,
            warm(10, Duration::from_secs(366 * 86_400)),
            SetMode::UpdateResetState,
        )
        .await
        .unwrap();
        assert!(acquired(&mut c, "warm", "").await, "{kind:?}");
        assert!(!acquired(&mut c, "warm", "").await, "{kind:?}");
    })
    .await;
}

/// Item 9: the `Bearer` scheme is case-insensitive (RFC 7235, section 2.1).
#[tokio::test(flavor = "multi_thread")]
async fn the_bearer_scheme_is_case_insensitive() {
    let token = "s3cret-token-for-tests";
    let sluice = LimiterSluice::start(None, &[("LIMITER_API_TOKEN", token)]);
    let mut c = sluice.client().await;
    let call = |header: String| {
        let mut r = tonic::Request::new(AvailablePermitsRequest {
            name: "none".into(),
            client_id: String::new(),
        });
        r.metadata_mut()
            .insert("authorization", header.parse().unwrap());
        r
    };
    for accepted in [
        format!("Bearer {token}"),
        format!("bearer {token}"),
        format!("BEARER {token}"),
        format!("bEaReR   {token}"),
    ] {
        let status = c
            .available_permits(call(accepted.clone()))
            .await
            .unwrap_err();
        // Past the token check: the limiter does not exist.
        assert_eq!(status.code(), tonic::Code::NotFound, "{accepted:?}");
    }
    for refused in [
        format!("Basic {token}"),
        format!("Bearer{token}"),
        format!("Bearer {token}x"),
        "bearer".to_string(),
    ] {
        let status = c
            .available_permits(call(refused.clone()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
    }
}
