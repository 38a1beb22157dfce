//! The memory store and the Redis script give the same answers for the same checks at the same
//! (pinned) time. Production always uses Redis's clock; `RedisOptions::pinned_clock` exists so
//! this comparison can be exact.

use sluice_test_kit as kit;

use std::sync::Arc;
use std::time::Duration;

use kit::{RedisServer, fixed_window_check};
use sluice::clock::{Clock, ManualClock};
use sluice::config::Algorithm as ConfigAlgorithm;
use sluice::named::{NamedError, NamedLimiters};
use sluice::proto::sluice::v1::{Algorithm, LimiterConfig, Mode};
use sluice::rls::{KeyBuilder, rule_for};
use sluice::store::{
    Charging, Check, CounterStore, MemoryStore, MemoryStoreOptions, Outcome, RedisOptions,
    RedisStore, Rule, SetMode,
};

/// Microseconds; 20 s into the minute window that starts at 1 699 999 980 s.
const T0: u64 = 1_700_000_000_000_000;

struct Pair {
    clock: Arc<ManualClock>,
    memory: MemoryStore,
    redis: RedisStore,
    _server: RedisServer,
}

async fn pair() -> Pair {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::new(MemoryStoreOptions::default(), clock.clone());
    let redis = RedisStore::new(RedisOptions {
        pinned_clock: Some(clock.clone()),
        ..server.store_options()
    })
    .unwrap();
    redis
        .wait_until_ready(&sluice::store::redis::StartupRetry::within(Some(
            Duration::from_secs(5),
        )))
        .await
        .unwrap();
    Pair {
        clock,
        memory,
        redis,
        _server: server,
    }
}

impl Pair {
    /// Runs `checks` on both stores and asserts equal outcomes; returns them.
    async fn both(&self, checks: &[Check]) -> Vec<Outcome> {
        self.both_charging(checks, Charging::Each).await
    }

    /// [`Pair::both`] with the given charging.
    async fn both_charging(&self, checks: &[Check], charging: Charging) -> Vec<Outcome> {
        let checks: Vec<&Check> = checks.iter().collect();
        let m = self
            .memory
            .check_with(sluice::store::Call::detached(), &checks, charging)
            .await
            .unwrap();
        let r = self
            .redis
            .check_with(sluice::store::Call::detached(), &checks, charging)
            .await
            .unwrap();
        assert_eq!(m, r, "memory vs redis for {checks:?} ({charging:?})");
        m
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_answers_agree() {
    let p = pair().await;
    let now = || p.clock.now_micros();
    // 20 s + 250 ms into a minute window.
    p.clock.set_micros(T0 + 250_000);

    let out = p.both(&[fixed_window_check("a", 1, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 2,
            reset_ms: 39_750,
            used: 1
        }
    );
    let out = p.both(&[fixed_window_check("a", 2, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 0,
            reset_ms: 39_750,
            used: 3
        }
    );
    let out = p.both(&[fixed_window_check("a", 1, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: false,
            remaining: 0,
            reset_ms: 39_750,
            used: 4
        }
    );
    // Zero hits looks without counting, also for a key that does not exist.
    let out = p
        .both(&[
            fixed_window_check("a", 0, 3, 60, now()),
            fixed_window_check("fresh", 0, 3, 60, now()),
        ])
        .await;
    assert_eq!((out[0].used, out[1].used), (4, 0));

    // Several keys and windows in one call, in order.
    p.clock.advance_micros(39_000_000); // 59.25 s into the window
    let out = p
        .both(&[
            fixed_window_check("b", 5, 5, 1, now()),
            fixed_window_check("a", 1, 3, 60, now()),
            fixed_window_check("b", 1, 5, 1, now()),
        ])
        .await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 0,
            reset_ms: 750,
            used: 5
        }
    );
    assert_eq!(out[1].reset_ms, 750);
    assert!(!out[2].admitted);

    // The next window starts from zero (a new key).
    p.clock.advance_micros(1_000_000);
    let out = p.both(&[fixed_window_check("a", 1, 3, 60, now())]).await;
    assert_eq!(
        out[0],
        Outcome {
            admitted: true,
            remaining: 2,
            reset_ms: 59_750,
            used: 1
        }
    );

    // A cost beyond every limit is refused without overflow.
    let out = p
        .both(&[fixed_window_check(
            "c",
            1 << 32,
            u32::MAX as u64,
            3600,
            now(),
        )])
        .await;
    assert!(!out[0].admitted);
    assert_eq!(out[0].used, 1 << 32);
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_is_clamped_when_clocks_disagree() {
    // The key's window comes from the service clock; the reset from the store's. A store clock
    // past the window end reports 1 ms; one before the window start reports the whole window.
    let p = pair().await;
    let window_start = sluice::store::window_start(T0 / 1_000_000, 60);
    let check = |key: &str| Check {
        key: key.into(),
        hits: 1,
        rule: Rule::FixedWindow {
            limit: 10,
            window_secs: 60,
            window_start,
        },
        record_refused: false,
        group: None,
    };
    // Separate keys: the memory store expires by its (pinned) clock, Redis by its real one.
    p.clock.set_micros((window_start + 75) * 1_000_000);
    assert_eq!(p.both(&[check("late")]).await[0].reset_ms, 1);
    p.clock.set_micros((window_start - 30) * 1_000_000);
    assert_eq!(p.both(&[check("early")]).await[0].reset_ms, 60_000);
}

/// Every rule the limiter can produce, with small numbers so sequences cross every boundary.
fn rules() -> Vec<(&'static str, Rule)> {
    vec![
        (
            "log",
            Rule::SlidingWindowLog {
                limit: 5,
                window: 10_000_000,
            },
        ),
        (
            "counter",
            Rule::SlidingWindowCounter {
                limit: 5,
                window: 10_000_000,
            },
        ),
        (
            "gcra",
            Rule::Gcra {
                interval: 2_000_000,
                burst: 3,
            },
        ),
        (
            "warm_up",
            Rule::WarmUp {
                permits_per_window: 4,
                window: 1_000_000,
                warmup: 2_000_000,
                cold_factor: 3.0,
            },
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_algorithm_agrees_on_a_scripted_sequence() {
    let p = pair().await;
    // Arrivals (ms after T0) and costs: bursts, idle gaps, window edges, zero-cost looks, costs
    // above what any of the rules can grant, up to the largest (2^32).
    let steps: &[(u64, u64)] = &[
        (0, 1),
        (0, 1),
        (0, 2),
        (1, 1),
        (300, 0),
        (999, 1),
        (1_000, 1),
        (2_500, 3),
        (4_000, 1),
        (9_999, 1),
        (10_000, 1),
        (10_001, 2),
        (12_000, 9),
        (15_000, 1),
        (19_999, 1),
        (20_000, 0),
        (25_000, 5),
        // Far above every rule (a bucket's debt is one bucket however large the charge), then
        // checks while a debt is paid back.
        (26_000, 1 << 32),
        (27_000, 0),
        (33_000, 7),
        (37_999, 0),
        (38_000, 0),
        (40_000, 1),
        (40_100, 1),
        (40_200, 1),
        (40_300, 1),
        (40_400, 1),
        (41_000, 1),
    ];
    // Each rule as configured, then with refused hits recorded (`record_refused_hits`).
    for record_refused in [false, true] {
        for (name, rule) in rules() {
            for &(at_ms, hits) in steps {
                p.clock.set_micros(T0 + at_ms * 1000);
                let check = Check {
                    key: format!("seq:{name}:{record_refused}"),
                    hits,
                    rule: rule.clone(),
                    record_refused,
                    group: None,
                };
                p.both(std::slice::from_ref(&check)).await;
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Random arrival sequences: the two stores never disagree. Costs are mostly around the
    /// rules' limits (5, burst 3, 4 per window), sometimes far above them (up to 2^32), which
    /// with recorded refusals puts a bucket into its deepest debt.
    #[test]
    fn random_sequences_agree(
        rule_index in 0usize..4,
        record_refused in proptest::bool::ANY,
        steps in proptest::collection::vec(
            (
                0u64..3_000_000,
                proptest::prop_oneof![8 => 0u64..7, 1 => 7u64..1_000, 1 => proptest::strategy::Just(1u64 << 32)],
            ),
            1..60,
        ),
    ) {
        runtime().block_on(async {
            let p = shared_pair().await;
            let (name, rule) = rules().swap_remove(rule_index);
            // A fresh key per case, so cases do not see each other's state.
            let key = format!("prop:{name}:{}", CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let mut now = T0 + 1_000_000_000;
            for (gap, hits) in steps {
                now += gap;
                p.clock.set_micros(now);
                let check = Check { key: key.clone(), hits, rule: rule.clone(), record_refused, group: None };
                p.both(std::slice::from_ref(&check)).await;
            }
        });
    }
}

static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One runtime for all proptest cases: the shared Redis connection lives on it.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Runtime::new().unwrap())
}

/// The value in `cell`, made by `make` the first time: one Redis for all proptest cases
/// (starting one per case would dominate the run time).
async fn shared<T: Sync, F: std::future::Future<Output = T>>(
    cell: &'static std::sync::OnceLock<T>,
    make: impl FnOnce() -> F,
) -> &'static T {
    if let Some(value) = cell.get() {
        return value;
    }
    let value = make().await;
    cell.get_or_init(|| value)
}

async fn shared_pair() -> &'static Pair {
    static PAIR: std::sync::OnceLock<Pair> = std::sync::OnceLock::new();
    shared(&PAIR, pair).await
}

/// Issue #40 (item 3), on both stores at a pinned time: `token_bucket`, 100 a minute,
/// `record_refused_hits: true` (the rule the config makes of it), a full bucket, then one charge
/// as Envoy sends it when a stream ends. A charge of 100 empties the bucket: 3 tokens are back
/// 2 s later. A charge of 200, or of 10^9 (Envoy's largest), is counted in full into a debt of
/// one bucket, as deep as a debt goes: no token 2 s later, checks refused until the refill has
/// paid the debt and one token is back (60.6 s), and the key kept until the bucket would be full
/// again (2 minutes). Both used to forgive all but one bucket and leave 3 tokens, as 100 did.
#[tokio::test(flavor = "multi_thread")]
async fn a_charge_above_the_bucket_leaves_a_debt_of_one_bucket() {
    let p = pair().await;
    let rule = rule_for(ConfigAlgorithm::TokenBucket { burst: 100 }, 100, 60_000_000);
    assert_eq!(
        rule,
        Rule::Gcra {
            interval: 600_000,
            burst: 100
        }
    );
    let check = |charge: u64, hits| Check {
        key: format!("debt:{charge}"),
        hits,
        rule: rule.clone(),
        record_refused: true,
        group: None,
    };
    let mut conn = p._server.connection();
    let mut in_debt = Vec::new();
    for charge in [100, 200, 1_000_000_000] {
        p.clock.set_micros(T0);
        let charged = p.both(&[check(charge, charge)]).await[0];
        assert_eq!(charged.admitted, charge == 100, "{charge}");
        assert_eq!(charged.remaining, 0, "{charge}");
        // Redis counts the key's TTL down on its own clock, from 60 s (emptied) or 120 s (in
        // debt); the test takes far less than the margins.
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("debt:{charge}"))
            .query(&mut conn)
            .unwrap();
        let want = if charge == 100 {
            30_000..=60_000
        } else {
            90_000..=120_000
        };
        assert!(want.contains(&ttl), "{charge}: TTL {ttl} ms");

        p.clock.set_micros(T0 + 2_000_000);
        let look = p.both(&[check(charge, 0)]).await[0];
        if charge == 100 {
            assert_eq!((look.admitted, look.remaining), (true, 3), "{charge}");
            continue;
        }
        let mut seen = vec![charged, look];
        assert_eq!(
            look,
            Outcome {
                admitted: false,
                remaining: 0,
                reset_ms: 58_600,
                used: 100
            },
            "{charge}"
        );
        // Still refused a minute after the charge; the first token is back 600 ms after the
        // debt is paid, and the look that sees it takes nothing.
        for (at, admitted) in [(60_000_000, false), (60_599_999, false), (60_600_000, true)] {
            p.clock.set_micros(T0 + at);
            let look = p.both(&[check(charge, 0)]).await[0];
            assert_eq!(look.admitted, admitted, "{charge} at {at} µs");
            seen.push(look);
        }
        assert_eq!(seen.last().map(|o| o.remaining), Some(1), "{charge}");
        in_debt.push(seen);
    }
    assert_eq!(in_debt[0], in_debt[1], "10^9 leaves the debt 200 leaves");
}

/// The longest bucket a config allows (a span of 2^51 µs) charged the largest cost (2^32) at an
/// odd microsecond: the TAT in Redis's Lua is the memory store's to the microsecond (two spans
/// ahead, below 2^53 where doubles stop being exact), and both stores refuse until it and admit
/// from it.
#[tokio::test(flavor = "multi_thread")]
async fn the_deepest_debt_of_the_longest_bucket_is_exact() {
    let p = pair().await;
    let span = 1u64 << 51;
    let now = T0 + 1;
    let check = |hits| Check {
        key: "longest".into(),
        hits,
        rule: Rule::Gcra {
            interval: span,
            burst: 1,
        },
        record_refused: true,
        group: None,
    };
    p.clock.set_micros(now);
    assert!(!p.both(&[check(1 << 32)]).await[0].admitted);
    let stored: String = redis::cmd("GET")
        .arg("longest")
        .query(&mut p._server.connection())
        .unwrap();
    assert_eq!(stored, (now + 2 * span).to_string());
    p.clock.set_micros(now + 2 * span - 1);
    assert!(!p.both(&[check(0)]).await[0].admitted);
    p.clock.set_micros(now + 2 * span);
    assert!(p.both(&[check(0)]).await[0].admitted);
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_admits_twice_the_limit_across_a_boundary_and_the_log_does_not() {
    // The same traffic on both algorithms: 5 requests at the last millisecond of a 10 s window
    // and 5 at the first millisecond of the next (limit 5 per 10 s).
    let p = pair().await;
    let window_start = sluice::store::window_start(T0 / 1_000_000, 10) + 10;
    let at = |ms: u64| window_start * 1_000_000 + ms * 1000;
    let mut admitted = [0, 0];
    for (slot, rule) in [
        Rule::FixedWindow {
            limit: 5,
            window_secs: 10,
            window_start: 0,
        },
        Rule::SlidingWindowLog {
            limit: 5,
            window: 10_000_000,
        },
    ]
    .into_iter()
    .enumerate()
    {
        for t in [at(9_999), at(10_000)] {
            for _ in 0..5 {
                p.clock.set_micros(t);
                let mut rule = rule.clone();
                let key = match &mut rule {
                    Rule::FixedWindow { window_start, .. } => {
                        *window_start = t / 1_000_000 / 10 * 10;
                        format!("edge_fixed_{window_start}")
                    }
                    _ => "edge_log".to_string(),
                };
                if p.both(&[Check {
                    key,
                    hits: 1,
                    rule,
                    record_refused: false,
                    group: None,
                }])
                .await[0]
                    .admitted
                {
                    admitted[slot] += 1;
                }
            }
        }
    }
    assert_eq!(
        admitted,
        [10, 5],
        "fixed window: 2N within 2 ms; sliding log: N"
    );
}

/// Every algorithm at the largest limits a config allows a log, with costs from 0 to above the
/// limit (issue #27: a cost is the client's to choose, and a decision must cost the store the
/// same whatever it is): both stores agree, refusals recorded or not, and the log holds one
/// entry per call that logged hits.
#[tokio::test(flavor = "multi_thread")]
async fn large_costs_agree() {
    let p = pair().await;
    let rules = [
        (
            "log",
            Rule::SlidingWindowLog {
                limit: 100_000,
                window: 10_000_000,
            },
        ),
        (
            "counter",
            Rule::SlidingWindowCounter {
                limit: 100_000,
                window: 10_000_000,
            },
        ),
        (
            "gcra",
            Rule::Gcra {
                interval: 100,
                burst: 100_000,
            },
        ),
        (
            "warm_up",
            Rule::WarmUp {
                permits_per_window: 100_000,
                window: 10_000_000,
                warmup: 20_000_000,
                cold_factor: 3.0,
            },
        ),
    ];
    // (ms after T0, hits)
    let steps: &[(u64, u64)] = &[
        (0, 100_000),
        (0, 1),
        (0, 0),
        (1_000, 100_001),
        (2_000, 60_000),
        (9_999, 99_999),
        (10_000, 1),
        (10_001, 40_000),
        (10_002, 60_000),
        (12_000, 1_000),
        (12_000, 1_000),
        (12_001, 99_000),
        (19_999, 100_000),
        (20_001, 100_000),
        (20_002, 3),
        (40_000, 100_000),
    ];
    for record_refused in [false, true] {
        for (name, rule) in &rules {
            let key = format!("large:{name}:{record_refused}");
            for &(at_ms, hits) in steps {
                p.clock.set_micros(T0 + at_ms * 1000);
                let check = Check {
                    key: key.clone(),
                    hits,
                    rule: rule.clone(),
                    record_refused,
                    group: None,
                };
                p.both(std::slice::from_ref(&check)).await;
            }
        }
    }
    let mut conn = p._server.connection();
    let entries: u64 = redis::cmd("ZCARD")
        .arg("large:log:false")
        .query(&mut conn)
        .unwrap();
    assert!(entries <= steps.len() as u64, "{entries} entries");
}

/// A log written by an earlier version (one sorted-set member per hit, named
/// `<time>:<position>`) is read as it was written: Redis, holding that layout, answers as the
/// memory store that logged the same hits, from the first call on, and rewrites it as entries.
#[tokio::test(flavor = "multi_thread")]
async fn a_log_of_the_old_layout_is_read_as_written() {
    let p = pair().await;
    let rule = Rule::SlidingWindowLog {
        limit: 10,
        window: 10_000_000,
    };
    let check = |hits| Check {
        key: "old_layout".into(),
        hits,
        rule: rule.clone(),
        record_refused: false,
        group: None,
    };
    // The history: 3 hits at 0 s, 1 at 1 s, 2 at 2 s; the memory store logs them by deciding,
    // Redis gets them written as the old script wrote them.
    let history: &[(u64, u64)] = &[(0, 3), (1, 1), (2, 2)];
    let mut conn = p._server.connection();
    let mut position = 0;
    for &(at_s, hits) in history {
        let at = T0 + at_s * 1_000_000;
        p.clock.set_micros(at);
        let checks = [check(hits)];
        let refs: Vec<&Check> = checks.iter().collect();
        assert!(
            p.memory
                .check_with(sluice::store::Call::detached(), &refs, Charging::Each)
                .await
                .unwrap()[0]
                .admitted
        );
        for _ in 0..hits {
            position += 1;
            redis::cmd("ZADD")
                .arg("old_layout")
                .arg(at)
                .arg(format!("{at}:{position}"))
                .exec(&mut conn)
                .unwrap();
        }
    }
    redis::cmd("PEXPIRE")
        .arg("old_layout")
        .arg(10_000)
        .exec(&mut conn)
        .unwrap();
    // Refused first (6 + 5 > 10: the oldest hit must go, 7 s away), then 4 fit; later the 3
    // hits of 0 s leave.
    for (at_ms, hits) in [
        (3_000, 5),
        (3_000, 4),
        (4_000, 1),
        (10_000, 0),
        (10_000, 3),
        (10_500, 1),
    ] {
        p.clock.set_micros(T0 + at_ms * 1000);
        p.both(&[check(hits)]).await;
    }
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("old_layout")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    assert!(
        members.iter().all(|m| m.contains('+')),
        "rewritten as entries: {members:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_counter_reports_no_reset_beyond_its_window() {
    // Limit 3 per 10 s, taken 1 s into a window: its hits weigh until the end of the next window,
    // 19 s away, but no reset beyond the window is reported, admitted or refused.
    let p = pair().await;
    let window_start = T0 / 10_000_000 * 10_000_000 + 10_000_000;
    p.clock.set_micros(window_start + 1_000_000);
    let check = |hits| Check {
        key: "counter_reset".into(),
        hits,
        rule: Rule::SlidingWindowCounter {
            limit: 3,
            window: 10_000_000,
        },
        record_refused: false,
        group: None,
    };
    let taken = p.both(&[check(3)]).await[0];
    assert!(taken.admitted);
    assert_eq!(taken.reset_ms, 10_000);
    for hits in [0, 1, 3, 4] {
        let refused = p.both(&[check(hits)]).await[0];
        assert!(!refused.admitted, "{hits}");
        assert!(refused.reset_ms <= 10_000, "{hits}: {refused:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn zero_cost_checks_then_charges_admit_at_most_the_limit() {
    // Upstream's check-then-charge: a zero-cost check, then (if admitted) a charge of one.
    // Limit 5 everywhere except the warm-up (one request at a time); nothing refills within the
    // run, which is at one instant.
    let p = pair().await;
    p.clock.set_micros(T0);
    let mut cases: Vec<(&str, Rule, usize)> = vec![
        (
            "fixed",
            Rule::FixedWindow {
                limit: 5,
                window_secs: 3600,
                window_start: T0 / 1_000_000 / 3600 * 3600,
            },
            6, // upstream's rule: refused only once the count is above the limit
        ),
        (
            "log",
            Rule::SlidingWindowLog {
                limit: 5,
                window: 3_600_000_000,
            },
            5,
        ),
        (
            "counter",
            Rule::SlidingWindowCounter {
                limit: 5,
                window: 3_600_000_000,
            },
            5,
        ),
        (
            "gcra",
            Rule::Gcra {
                interval: 720_000_000,
                burst: 5,
            },
            5,
        ),
    ];
    cases.push((
        "warm_up",
        Rule::WarmUp {
            permits_per_window: 5,
            window: 3_600_000_000,
            warmup: 1_000_000,
            cold_factor: 3.0,
        },
        1,
    ));
    for (name, rule, most) in cases {
        let check = |hits| Check {
            key: format!("charge:{name}"),
            hits,
            rule: rule.clone(),
            record_refused: false,
            group: None,
        };
        let mut admitted = 0;
        for _ in 0..20 {
            if p.both(&[check(0)]).await[0].admitted {
                admitted += 1;
                p.both(&[check(1)]).await;
            }
        }
        assert_eq!(admitted, most, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn larger_charges_stay_within_the_limit_only_when_refusals_are_recorded() {
    // Check-then-charge with charges of 2 (limits 5, burst 3): a charge that does not fit is
    // refused; unrecorded, the checks go on admitting; recorded, the limit is spent, so at most
    // ceil(5 / 2) = 3 requests pass.
    let p = pair().await;
    p.clock.set_micros(T0);
    for (name, rule) in rules() {
        for record_refused in [false, true] {
            let check = |hits| Check {
                key: format!("charge2:{name}:{record_refused}"),
                hits,
                rule: rule.clone(),
                record_refused,
                group: None,
            };
            let mut admitted = 0;
            for _ in 0..20 {
                if p.both(&[check(0)]).await[0].admitted {
                    admitted += 1;
                    p.both(&[check(2)]).await;
                }
            }
            if record_refused {
                assert!(admitted <= 3, "{name}: {admitted} admitted");
            } else if name != "warm_up" {
                assert_eq!(admitted, 20, "{name}: refused charges are not recorded");
            }
        }
    }
}

/// Named limiters (native API) over each store, at the same pinned time.
struct Limiters {
    clock: Arc<ManualClock>,
    memory: NamedLimiters,
    redis: NamedLimiters,
    _pair: Pair,
}

async fn limiters() -> Limiters {
    let p = pair().await;
    let wait = Duration::from_secs(5);
    let memory = MemoryStore::new(MemoryStoreOptions::default(), p.clock.clone());
    let redis = RedisStore::new(RedisOptions {
        pinned_clock: Some(p.clock.clone()),
        ..p._server.store_options()
    })
    .unwrap();
    Limiters {
        clock: p.clock.clone(),
        memory: NamedLimiters::new(Arc::new(memory), KeyBuilder::default(), wait),
        redis: NamedLimiters::new(Arc::new(redis), KeyBuilder::default(), wait),
        _pair: p,
    }
}

/// One native-API call of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    Set {
        limiter: usize,
        mode: usize,
        algorithm: usize,
        rate: u64,
        interval_secs: u64,
        burst: u64,
        per_client: bool,
    },
    /// Permits: 0, 1, the capacity, one more, u64::MAX; client: none, "a", "b".
    TryAcquire {
        limiter: usize,
        permits: usize,
        client: usize,
    },
    Available {
        limiter: usize,
        client: usize,
    },
    Delete {
        limiter: usize,
    },
    Wait {
        micros: u64,
    },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0usize..2, 0usize..3, 0usize..7, 1u64..5, prop_oneof![Just(60u64), Just(3600)], prop_oneof![Just(0u64), Just(2), Just(6)], proptest::bool::weighted(0.25))
            .prop_map(|(limiter, mode, algorithm, rate, interval_secs, burst, per_client)| Op::Set {
                limiter, mode, algorithm, rate, interval_secs, burst, per_client,
            }),
        6 => (0usize..2, 0usize..5, 0usize..3).prop_map(|(limiter, permits, client)| Op::TryAcquire { limiter, permits, client }),
        2 => (0usize..2, 0usize..3).prop_map(|(limiter, client)| Op::Available { limiter, client }),
        1 => (0usize..2).prop_map(|limiter| Op::Delete { limiter }),
        2 => prop_oneof![Just(0u64), 1u64..90_000_000].prop_map(|micros| Op::Wait { micros }),
    ]
}

const ALGORITHMS: [Algorithm; 7] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::WarmUp,
];

const CLIENTS: [&str; 3] = ["", "a", "b"];

const MODES: [SetMode; 3] = [
    SetMode::TrySet,
    SetMode::UpdateKeepState,
    SetMode::UpdateResetState,
];

/// An error as a comparable text (the variants carry no time-dependent data).
fn text<T>(r: Result<T, NamedError>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

impl Limiters {
    /// Runs one op on both and asserts equal replies.
    async fn both(&self, case: u64, op: &Op) {
        let name = |limiter: usize| format!("prop{case}-{limiter}");
        match *op {
            Op::Set {
                limiter,
                mode,
                algorithm,
                rate,
                interval_secs,
                burst,
                per_client,
            } => {
                let config = LimiterConfig {
                    name: name(limiter),
                    algorithm: ALGORITHMS[algorithm] as i32,
                    rate,
                    interval: Some(Duration::from_secs(interval_secs).try_into().unwrap()),
                    burst,
                    warmup_period: Some(Duration::from_secs(1).try_into().unwrap()),
                    mode: if per_client {
                        Mode::PerClient as i32
                    } else {
                        Mode::Overall as i32
                    },
                    ..Default::default()
                };
                let m = text(
                    self.memory
                        .set_rate(sluice::store::Call::detached(), config.clone(), MODES[mode])
                        .await,
                );
                let r = text(
                    self.redis
                        .set_rate(sluice::store::Call::detached(), config, MODES[mode])
                        .await,
                );
                assert_eq!(m, r, "{op:?}");
            }
            Op::TryAcquire {
                limiter,
                permits,
                client,
            } => {
                let client = CLIENTS[client];
                let name = name(limiter);
                let capacity = match self
                    .memory
                    .config(sluice::store::Call::detached(), &name)
                    .await
                {
                    Ok(c) if c.burst > 0 => c.burst,
                    Ok(c) => c.rate,
                    Err(_) => 1,
                };
                let permits = [0, 1, capacity, capacity + 1, u64::MAX][permits];
                let m = text(
                    self.memory
                        .try_acquire(
                            sluice::store::Call::detached(),
                            &name,
                            client,
                            permits,
                            Duration::ZERO,
                        )
                        .await,
                );
                let r = text(
                    self.redis
                        .try_acquire(
                            sluice::store::Call::detached(),
                            &name,
                            client,
                            permits,
                            Duration::ZERO,
                        )
                        .await,
                );
                // `waited` is the real time the call took.
                let m = m.map(|a| (a.acquired, a.remaining, a.retry_after));
                let r = r.map(|a| (a.acquired, a.remaining, a.retry_after));
                assert_eq!(m, r, "{op:?} ({permits} permits)");
            }
            Op::Available { limiter, client } => {
                let m = text(
                    self.memory
                        .available(
                            sluice::store::Call::detached(),
                            &name(limiter),
                            CLIENTS[client],
                        )
                        .await,
                );
                let r = text(
                    self.redis
                        .available(
                            sluice::store::Call::detached(),
                            &name(limiter),
                            CLIENTS[client],
                        )
                        .await,
                );
                assert_eq!(m, r, "{op:?}");
            }
            Op::Delete { limiter } => {
                let m = text(
                    self.memory
                        .delete(sluice::store::Call::detached(), &name(limiter))
                        .await,
                );
                let r = text(
                    self.redis
                        .delete(sluice::store::Call::detached(), &name(limiter))
                        .await,
                );
                assert_eq!(m, r, "{op:?}");
            }
            Op::Wait { micros } => self.clock.advance_micros(micros),
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// Random native-API sequences (every set mode and algorithm, permits at the edges): the two
    /// stores give the same replies.
    #[test]
    fn limiter_sequences_agree(ops in proptest::collection::vec(op(), 1..40)) {
        runtime().block_on(async {
            let l = shared_limiters().await;
            let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for op in &ops {
                l.both(case, op).await;
            }
        });
    }
}

async fn shared_limiters() -> &'static Limiters {
    static LIMITERS: std::sync::OnceLock<Limiters> = std::sync::OnceLock::new();
    shared(&LIMITERS, limiters).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limiter_created_again_at_the_same_instant_meets_none_of_its_old_states() {
    // Per client: client "a" takes the only permit, the limiter is deleted (its clients' states
    // cannot be named, so they stay until their epoch no longer matches) and created again at
    // the same (pinned) microsecond. Its generation must differ, so "a" starts afresh.
    let l = limiters().await;
    let config = LimiterConfig {
        name: "again".into(),
        algorithm: Algorithm::FixedWindow as i32,
        rate: 1,
        interval: Some(Duration::from_secs(60).try_into().unwrap()),
        mode: Mode::PerClient as i32,
        ..Default::default()
    };
    for limiters in [&l.memory, &l.redis] {
        limiters
            .set_rate(
                sluice::store::Call::detached(),
                config.clone(),
                SetMode::TrySet,
            )
            .await
            .unwrap();
        let taken = limiters
            .try_acquire(
                sluice::store::Call::detached(),
                "again",
                "a",
                1,
                Duration::ZERO,
            )
            .await
            .unwrap();
        assert!(taken.acquired);
        assert!(
            limiters
                .delete(sluice::store::Call::detached(), "again")
                .await
                .unwrap()
        );
        assert!(matches!(
            limiters
                .available(sluice::store::Call::detached(), "again", "a")
                .await,
            Err(NamedError::NotFound(_))
        ));
        let set = limiters
            .set_rate(
                sluice::store::Call::detached(),
                config.clone(),
                SetMode::TrySet,
            )
            .await
            .unwrap();
        assert!(set.applied && set.state_reset);
        assert_eq!(
            limiters
                .available(sluice::store::Call::detached(), "again", "a")
                .await
                .unwrap(),
            1
        );
    }
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (`Charging::StopWhenOver`) on both stores, for every
/// algorithm: while nothing would go over, every check is charged; once one would, only it is
/// charged and the others' states stay as they were (a look before and after agrees), with the
/// same answers from the memory store and the script.
#[tokio::test(flavor = "multi_thread")]
async fn stop_when_over_charges_only_what_would_go_over() {
    let p = pair().await;
    p.clock.set_micros(T0 + 250_000);
    let now = p.clock.now_micros();
    let mut cases = vec![(
        "fixed",
        fixed_window_check("w_fixed", 0, 5, 60, now).rule,
        fixed_window_check("t_fixed", 0, 2, 60, now).rule,
    )];
    for (name, rule) in rules() {
        cases.push((name, rule.clone(), rule));
    }
    for (name, wide_rule, tight_rule) in cases {
        let check = |key: String, hits, rule: &Rule| Check {
            key: if matches!(rule, Rule::FixedWindow { .. }) {
                format!("{key}_{}", now / 60_000_000 * 60)
            } else {
                key
            },
            hits,
            rule: rule.clone(),
            record_refused: false,
            group: None,
        };
        let wide = check(format!("w_{name}"), 1, &wide_rule);
        let tight = check(format!("t_{name}"), 1, &tight_rule);
        let look = |c: &Check| Check {
            hits: 0,
            ..c.clone()
        };
        // Use up the tight one alone, charging as usual, until it refuses.
        while p.both(std::slice::from_ref(&tight)).await[0].admitted {}
        // Fresh, nothing would go over... except the tight one: only it is charged.
        let wide_before = p.both(&[look(&wide)]).await[0];
        let batch = [wide.clone(), tight.clone()];
        for _ in 0..3 {
            let out = p.both_charging(&batch, Charging::StopWhenOver).await;
            assert!(
                out[0].admitted,
                "{name}: the one that fits is answered as a look"
            );
            assert_eq!(out[0], wide_before, "{name}: answered as a look");
            assert!(!out[1].admitted, "{name}");
        }
        assert_eq!(
            p.both(&[look(&wide)]).await[0],
            wide_before,
            "{name}: wide untouched"
        );
        // Nothing would go over: both are charged.
        let other = check(format!("o_{name}"), 1, &wide_rule);
        let other_before = p.both(&[look(&other)]).await[0];
        let out = p
            .both_charging(&[wide.clone(), other.clone()], Charging::StopWhenOver)
            .await;
        assert!(out.iter().all(|o| o.admitted), "{name}");
        assert_ne!(
            p.both(&[look(&wide)]).await[0],
            wide_before,
            "{name}: charged"
        );
        assert_ne!(
            p.both(&[look(&other)]).await[0],
            other_before,
            "{name}: charged"
        );
        // Looking only charges nothing.
        let wide_now = p.both(&[look(&wide)]).await[0];
        p.both_charging(&[wide.clone(), tight.clone()], Charging::LookOnly)
            .await;
        assert_eq!(
            p.both(&[look(&wide)]).await[0],
            wide_now,
            "{name}: looked at"
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// Groups (the limits of one descriptor's `rate_limits`) beside a check on its own, under
    /// both chargings: the two stores agree, and a group with a refused check leaves every
    /// check of it as it was (a look before and after agrees), unless that check records its
    /// refused hits.
    #[test]
    fn groups_agree_and_are_all_or_nothing(
        rules_of in proptest::collection::vec(0usize..5, 2..4),
        record in proptest::collection::vec(proptest::bool::ANY, 4),
        stop in proptest::bool::ANY,
        alone in proptest::bool::ANY,
        steps in proptest::collection::vec((0u64..2_000_000, 0u64..4), 1..30),
    ) {
        runtime().block_on(async {
            // A pair of its own: its clock must not move under the other property's cases,
            // which run beside these.
            static PAIR: std::sync::OnceLock<Pair> = std::sync::OnceLock::new();
            let p = shared(&PAIR, pair).await;
            let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let charging = if stop { Charging::StopWhenOver } else { Charging::Each };
            let mut now = T0 + 2_000_000_000;
            for (gap, hits) in steps {
                now += gap;
                p.clock.set_micros(now);
                let build = |i: usize, rule: usize, hits: u64| {
                    let mut check = match rules().get(rule) {
                        Some((name, r)) => Check {
                            key: format!("group:{case}:{i}:{name}"),
                            hits,
                            rule: r.clone(),
                            record_refused: record[i],
                            group: None,
                        },
                        None => fixed_window_check(&format!("group:{case}:{i}:fixed"), hits, 4, 2, now),
                    };
                    check.group = Some(7);
                    check
                };
                let mut checks: Vec<Check> = rules_of
                    .iter()
                    .enumerate()
                    .map(|(i, &rule)| build(i, rule, hits))
                    .collect();
                if alone {
                    let mut single = build(3, 0, 1);
                    single.group = None;
                    checks.push(single);
                }
                let looks: Vec<Check> = checks.iter().map(|c| Check { hits: 0, ..c.clone() }).collect();
                let before = p.both(&looks).await;
                let out = p.both_charging(&checks, charging).await;
                let after = p.both(&looks).await;
                let members = rules_of.len();
                if out[..members].iter().any(|o| !o.admitted) {
                    for i in 0..members {
                        let charged_anyway = !out[i].admitted && checks[i].record_refused;
                        if !charged_anyway && checks[i].hits > 0 {
                            assert_eq!(before[i], after[i], "check {i} of a refused group: {checks:?} {out:?}");
                        }
                    }
                }
            }
        });
    }
}
