//! The layer's own behaviour, on a store that fails as told: which errors degrade, every
//! algorithm's share, the mark, the named limiters' learnt records. (`tests/degraded.rs` does
//! the same with a real Redis killed, through Envoy.)

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::clock::ManualClock;
use crate::store::layers::Layered;
use crate::store::{Marks, MemoryStoreOptions, RegistryOp, RegistryReply, Rule, StateKeys, Store};

/// A store that answers with `failure` while it is set, and as the memory store otherwise.
#[derive(Debug)]
struct Failing {
    failure: Mutex<Option<StoreError>>,
    up: MemoryStore,
}

impl Failing {
    fn new(failure: Option<StoreError>) -> Self {
        Self {
            failure: Mutex::new(failure),
            up: MemoryStore::new(MemoryStoreOptions::default(), clock()),
        }
    }

    fn failure(&self) -> Option<StoreError> {
        self.failure.lock().unwrap().clone()
    }
}

impl Store for Failing {
    fn kind(&self) -> &'static str {
        "failing"
    }
}

impl CounterStore for Failing {
    fn check_with<'a>(
        &'a self,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a> {
        match self.failure() {
            Some(e) => Box::pin(async move { Err(e) }),
            None => self.up.check_with(call, checks, charging),
        }
    }
}

impl LimiterStore for Failing {
    fn set_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.up.set_limiter(call, keys, record, mode)
    }
    fn get_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.up.get_limiter(call, keys)
    }
    fn delete_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, bool> {
        self.up.delete_limiter(call, keys)
    }
    fn acquire<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        match self.failure() {
            Some(e) => Box::pin(async move { Err(e) }),
            None => self.up.acquire(call, keys, permits, max_clients),
        }
    }
    fn release<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        lease: crate::store::Lease,
    ) -> StoreFuture<'a, crate::store::Release> {
        self.up.release(call, keys, lease)
    }
    fn registry<'a>(
        &'a self,
        call: Call<'a>,
        key: &'a str,
        op: RegistryOp<'a>,
    ) -> StoreFuture<'a, RegistryReply> {
        self.up.registry(call, key, op)
    }
}

/// 30 a minute, in the minute the test clock is in.
fn fixed_window() -> Rule {
    Rule::FixedWindow {
        limit: 30,
        window_secs: 60,
        window_start: crate::store::window_start(1_000_000, 60),
    }
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_000_000_000_000))
}

/// The layer over `store`, three replicas configured, counting its local decisions.
fn layered(store: Failing) -> (Layered<LocalShare, Failing>, Arc<AtomicU64>) {
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    let local = Arc::new(MemoryStore::new(MemoryStoreOptions::default(), clock()));
    let on_degraded: OnDegraded = Arc::new(move || {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    let layer = LocalShare::new(local, Replicas::new(Some(3)), on_degraded);
    (Layered::new(layer, store), count)
}

fn down() -> Failing {
    Failing::new(Some(StoreError::Unavailable("circuit breaker open".into())))
}

/// How many one-hit checks of `rule` on one key are admitted in a row (the clock stands still),
/// each a call of `marks`.
async fn admitted_in_a_row(store: &impl CounterStore, rule: &Rule, marks: &Marks) -> u64 {
    let check = Check {
        key: "k".into(),
        hits: 1,
        rule: rule.clone(),
        record_refused: false,
        group: None,
    };
    let mut admitted = 0;
    for _ in 0..1_000 {
        let outcomes = store
            .check_with(marks.call(None), &[&check], Charging::Each)
            .await
            .expect("decided");
        if !outcomes[0].admitted {
            break;
        }
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn every_algorithm_decides_with_a_third_of_its_limit() {
    let window = 60_000_000;
    let cases = [
        (fixed_window(), 10),
        (Rule::SlidingWindowLog { limit: 30, window }, 10),
        (Rule::SlidingWindowCounter { limit: 30, window }, 10),
        (
            Rule::Gcra {
                interval: 2_000_000,
                burst: 30,
            },
            10,
        ),
    ];
    for (rule, share) in cases {
        let (layer, count) = layered(down());
        let marks = Marks::new();
        let admitted = admitted_in_a_row(&layer, &rule, &marks).await;
        assert_eq!(admitted, share, "{rule:?}");
        assert!(marks.degraded(), "{rule:?}: not marked");
        assert_eq!(count.load(Ordering::Relaxed), share + 1, "{rule:?}");
        // The whole limit when the store answers.
        let (layer, count) = layered(Failing::new(None));
        let whole = admitted_in_a_row(&layer, &rule, &Marks::new()).await;
        assert_eq!(whole, 30, "{rule:?}");
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }
}

#[tokio::test]
async fn warm_up_decides_with_a_share_of_its_permits() {
    let rule = Rule::WarmUp {
        permits_per_window: 30,
        window: 1_000_000,
        warmup: 10_000_000,
        cold_factor: 3.0,
    };
    let clock = clock();
    let memory = || MemoryStore::new(MemoryStoreOptions::default(), clock.clone());
    let up = Failing {
        failure: Mutex::new(None),
        up: memory(),
    };
    let degraded = Failing {
        failure: Mutex::new(Some(StoreError::Unavailable("down".into()))),
        up: memory(),
    };
    let never = || -> OnDegraded { Arc::new(|| {}) };
    let layer = || LocalShare::new(Arc::new(memory()), Replicas::new(Some(3)), never());
    let up = Layered::new(layer(), up);
    let degraded = Layered::new(layer(), degraded);
    let alone = memory();
    let share = share::rule(&rule, 3);
    let check = |rule: &Rule| Check {
        key: "k".into(),
        hits: 1,
        rule: rule.clone(),
        record_refused: false,
        group: None,
    };
    let (whole, shared, expected) = (check(&rule), check(&rule), check(&share));
    let mut admitted = [0u32; 3];
    // Three seconds, a request every 5 ms to each.
    for _ in 0..600 {
        clock.advance_micros(5_000);
        admitted[0] += u32::from(up.check(&[&whole]).await.unwrap()[0].admitted);
        admitted[1] += u32::from(degraded.check(&[&shared]).await.unwrap()[0].admitted);
        admitted[2] += u32::from(alone.check(&[&expected]).await.unwrap()[0].admitted);
    }
    let [whole, shared, expected] = admitted;
    assert!(shared >= 1 && shared * 2 < whole, "{shared} of {whole}");
    assert_eq!(
        shared, expected,
        "not the memory store's answer on the share"
    );
}

#[tokio::test]
async fn outages_and_late_calls_degrade_script_errors_and_callers_deadlines_do_not() {
    let fixed = fixed_window();
    let degrading = [
        StoreError::Unavailable("breaker open".into()),
        StoreError::Timeout(Duration::from_millis(18)),
        StoreError::Late(Duration::from_millis(18)),
        StoreError::Redis("connection reset".into()),
    ];
    for error in degrading {
        let (layer, _) = layered(Failing::new(Some(error.clone())));
        let admitted = admitted_in_a_row(&layer, &fixed, &Marks::new()).await;
        assert_eq!(admitted, 10, "{error}");
    }
    for error in [
        StoreError::Script("ERR wrong type".into()),
        StoreError::Protocol("short reply".into()),
        StoreError::CallerDeadline(Duration::ZERO),
    ] {
        let (layer, count) = layered(Failing::new(Some(error.clone())));
        let check = Check {
            key: "k".into(),
            hits: 1,
            rule: fixed.clone(),
            record_refused: false,
            group: None,
        };
        let marks = Marks::new();
        let answer = layer
            .check_with(marks.call(None), &[&check], Charging::Each)
            .await;
        assert!(answer.is_err(), "{error} was decided locally");
        assert!(!marks.degraded());
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }
}

#[tokio::test]
async fn the_store_answers_again_at_once() {
    let (layer, _) = layered(down());
    let rule = fixed_window();
    assert_eq!(admitted_in_a_row(&layer, &rule, &Marks::new()).await, 10);
    *layer.store().failure.lock().unwrap() = None;
    let marks = Marks::new();
    let admitted = admitted_in_a_row(&layer, &rule, &marks).await;
    assert_eq!(admitted, 30, "not the store's count");
    assert!(!marks.degraded());
}

fn limiter_keys(name: &str) -> LimiterKeys {
    let state = |kind: &str| StateKeys {
        state: format!("{{limiter_{name}}}:{kind}:state"),
        epoch: format!("{{limiter_{name}}}:{kind}:epoch"),
    };
    LimiterKeys {
        config: format!("{{limiter_{name}}}:config"),
        shared: state("shared"),
        client: None,
        clients: format!("{{limiter_{name}}}:clients"),
        client_id: String::new(),
    }
}

#[tokio::test]
async fn named_limiters_decide_locally_once_their_record_is_learnt() {
    let (layer, count) = layered(Failing::new(None));
    let keys = limiter_keys("api");
    let unknown = limiter_keys("never-seen");
    let record = LimiterRecord {
        rule: Rule::Gcra {
            interval: 1_000_000,
            burst: 9,
        },
        capacity: 9,
        per_client: false,
        description: Vec::new(),
    };
    layer
        .set_limiter(Call::detached(), &keys, &record, SetMode::TrySet)
        .await
        .unwrap();
    *layer.store().failure.lock().unwrap() = Some(StoreError::Timeout(Duration::from_millis(5)));
    let mut granted = 0;
    for _ in 0..20 {
        let marks = Marks::new();
        let acquisition = layer.acquire(marks.call(None), &keys, 1, 0).await;
        assert!(marks.degraded());
        match acquisition.unwrap() {
            Acquisition::Decided { outcome, .. } if outcome.admitted => granted += 1,
            Acquisition::Decided { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(granted, 3, "a third of the burst");
    assert_eq!(count.load(Ordering::Relaxed), 20);
    // A limiter this replica never learnt gets the store's error, unmarked.
    let marks = Marks::new();
    let unknown = layer.acquire(marks.call(None), &unknown, 1, 0).await;
    assert!(
        matches!(unknown, Err(StoreError::Timeout(_))),
        "{unknown:?}"
    );
    assert!(!marks.degraded());
}
