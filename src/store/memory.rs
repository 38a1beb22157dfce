//! The embedded store: counters in process memory, for a single replica or for trying Sluice out.
//!
//! Counters are spread over shards, each a mutex around a hash map keyed by a 128-bit keyed hash
//! of the counter key, so concurrent requests on different keys rarely contend and one key's
//! read-modify-write is atomic. Every entry holds an
//! algorithm's state (see `algorithms.rs`) and its expiry, after which it is indistinguishable
//! from a new key. A background task sweeps expired entries; it holds only a weak reference and
//! ends when the store is dropped.
//!
//! # Memory bound
//!
//! `max_counters` bounds the number of live counters (split evenly over the shards). When a shard
//! is full, a new counter looks at a sample of 16 counters: it drops the expired ones among them,
//! or if none expired, evicts the one closest to its expiry, which is the one whose loss forgives
//! the least. The sweeper removes the other expired counters. Eviction never fails a request and never panics; it is counted in
//! [`MemoryStore::evictions`], and a key that keeps being evicted is under-counted, so size the
//! bound above the number of keys live in one window.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::algorithms::{self, State, Step};
use super::{
    Acquisition, Check, LimiterKeys, LimiterRecord, LimiterSet, Outcome, Rule, SetMode, Store,
    StoreFuture, fixed_window_outcome, fixed_window_take,
};
use crate::clock::Clock;

const SHARDS: usize = 64;
/// How many counters are looked at to choose one to evict from a full shard.
const EVICTION_SAMPLE: usize = 16;

#[derive(Debug, Clone)]
pub struct MemoryStoreOptions {
    /// Most live counters kept at once (at least one per shard).
    pub max_counters: usize,
    /// How often expired counters are swept.
    pub sweep_interval: Duration,
}

impl Default for MemoryStoreOptions {
    fn default() -> Self {
        Self {
            max_counters: 1_000_000,
            sweep_interval: Duration::from_secs(5),
        }
    }
}

#[derive(Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
    /// Named limiters' configs (native API) and their generation. Their states live in the
    /// shards like any counter, under `<state key>#<generation>`, so a reset simply moves on to
    /// a new key and the old state expires; they count towards the memory bound, the configs
    /// do not (there is one per limiter an application created).
    limiters: Mutex<HashMap<String, (LimiterRecord, u64)>>,
    generations: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    /// The two SipHash keys of [`KeyId`].
    key_hashes: [RandomState; 2],
    per_shard: usize,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
}

/// A key's 128-bit keyed hash, from two SipHash keys drawn at start-up. Entries are stored
/// under it rather than under the key text, which halves the memory per counter. Two keys meet
/// only if their 128-bit hashes do: about 2^-128 per pair, and not something a client can aim
/// for without the per-process keys.
type KeyId = u128;

type Shard = Mutex<HashMap<KeyId, Entry, BuildHasherDefault<KeyIdHasher>>>;

/// Uses the already-random low 64 bits of a [`KeyId`] as its hash.
#[derive(Default)]
struct KeyIdHasher(u64);

impl Hasher for KeyIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u128` is used; mixing keeps this correct for anything else.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, id: u128) {
        self.0 = id as u64;
    }
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    /// Microseconds on the store's clock.
    expires_at: u64,
}

impl MemoryStore {
    /// Creates the store; when called inside a Tokio runtime it also starts the sweeper.
    pub fn new(options: MemoryStoreOptions, clock: Arc<dyn Clock>) -> Self {
        let per_shard = options.max_counters.div_ceil(SHARDS).max(1);
        let inner = Arc::new(Inner {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            key_hashes: [RandomState::new(), RandomState::new()],
            per_shard,
            clock,
            evictions: AtomicU64::new(0),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep(Arc::downgrade(&inner), options.sweep_interval));
        }
        Self {
            inner,
            limiters: Mutex::new(HashMap::new()),
            generations: AtomicU64::new(1),
        }
    }

    /// Entries currently held (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live counters evicted because the store was full.
    pub fn evictions(&self) -> u64 {
        self.inner.evictions.load(Ordering::Relaxed)
    }

    /// Drops every expired counter now.
    pub fn sweep_expired(&self) {
        self.inner.sweep_expired();
    }

    /// Decides one check atomically under its shard's lock. `take` selects the named limiters'
    /// fixed window, which counts hits only when they fit; the RLS one counts refused hits too,
    /// as upstream does. (The other algorithms never count refused hits.)
    fn decide(&self, check: &Check, now: u64, take: bool) -> Outcome {
        let id = self.inner.key_id(&check.key);
        let mut shard = lock(self.inner.shard(id));
        // A log is moved out of its entry rather than cloned (it may hold `limit` entries, and
        // this runs on every check); the algorithm hands back the log to keep. The other states
        // are a few words.
        let mut moved_log = false;
        let found = shard.get_mut(&id).filter(|e| e.expires_at > now).map(|e| {
            if matches!(e.state, State::Log(_)) {
                moved_log = true;
                std::mem::replace(&mut e.state, State::Count(0))
            } else {
                e.state.clone()
            }
        });
        let step = match check.rule {
            Rule::FixedWindow {
                limit,
                window_secs,
                window_start,
            } => {
                let before = match found {
                    Some(State::Count(count)) => count,
                    _ => 0,
                };
                let expires_at = (window_start + window_secs) * 1_000_000;
                let (outcome, count) = if take {
                    fixed_window_take(
                        before,
                        check.hits,
                        limit,
                        window_secs,
                        window_start,
                        now / 1000,
                    )
                } else {
                    let count = before.saturating_add(check.hits);
                    let outcome =
                        fixed_window_outcome(count, limit, window_secs, window_start, now / 1000);
                    // A zero-hit look creates nothing.
                    (outcome, (check.hits > 0).then_some(count))
                };
                Step {
                    outcome,
                    keep: count
                        .filter(|_| expires_at > now)
                        .map(|count| (State::Count(count), expires_at - now)),
                }
            }
            Rule::SlidingWindowLog { limit, window } => algorithms::sliding_window_log(
                found,
                check.hits,
                check.record_refused,
                limit,
                window,
                now,
            ),
            Rule::SlidingWindowCounter { limit, window } => algorithms::sliding_window_counter(
                found,
                check.hits,
                check.record_refused,
                limit,
                window,
                now,
            ),
            Rule::Gcra { interval, burst } => algorithms::gcra(
                found,
                check.hits,
                check.record_refused,
                interval,
                burst,
                now,
            ),
            Rule::WarmUp {
                permits_per_window,
                window,
                warmup,
                cold_factor,
            } => algorithms::warm_up(
                found,
                check.hits,
                check.record_refused,
                permits_per_window,
                window,
                warmup,
                cold_factor,
                now,
            ),
        };
        if step.keep.is_none() && moved_log {
            // Only an empty log is not handed back, and an empty log is no state.
            shard.remove(&id);
        }
        if let Some((state, ttl)) = step.keep {
            let entry = Entry {
                state,
                expires_at: now + ttl,
            };
            match shard.get_mut(&id) {
                Some(existing) => *existing = entry,
                None => {
                    if shard.len() >= self.inner.per_shard {
                        self.inner.make_room(&mut shard, now);
                    }
                    shard.insert(id, entry);
                }
            }
        }
        step.outcome
    }
}

impl Inner {
    fn key_id(&self, key: &str) -> KeyId {
        let [high, low] = &self.key_hashes;
        (u128::from(high.hash_one(key)) << 64) | u128::from(low.hash_one(key))
    }

    /// The shard from the high bits; the map inside uses the low ones.
    fn shard(&self, id: KeyId) -> &Shard {
        let index = (id >> 64) as usize % self.shards.len();
        &self.shards[index]
    }

    /// Frees one place in a full shard by looking at a sample, never the whole shard: a scan per
    /// new key would cost tens of microseconds under the shard lock once the store is full of
    /// live counters, which is exactly the state an attacker with fresh keys creates. Expired
    /// counters in the sample go first; otherwise the sampled one nearest its expiry is evicted.
    /// Expired counters outside the sample are left to the sweeper.
    fn make_room(
        &self,
        shard: &mut HashMap<KeyId, Entry, BuildHasherDefault<KeyIdHasher>>,
        now: u64,
    ) {
        let mut expired = [0; EVICTION_SAMPLE];
        let mut expired_count = 0;
        let mut nearest: Option<(KeyId, u64)> = None;
        for (id, entry) in shard.iter().take(EVICTION_SAMPLE) {
            if entry.expires_at <= now {
                expired[expired_count] = *id;
                expired_count += 1;
            } else if nearest.is_none_or(|(_, at)| entry.expires_at < at) {
                nearest = Some((*id, entry.expires_at));
            }
        }
        if expired_count > 0 {
            for id in &expired[..expired_count] {
                shard.remove(id);
            }
        } else if let Some((victim, _)) = nearest {
            shard.remove(&victim);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn sweep_expired(&self) {
        let now = self.clock.now_micros();
        for shard in self.shards.iter() {
            lock(shard).retain(|_, e| e.expires_at > now);
        }
    }
}

/// A poisoned shard only means another thread panicked while holding it; counters are plain
/// integers that are never left half-written, so the data is still good.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn sweep(inner: Weak<Inner>, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // About 3 ms at a million counters: off the async workers, so requests do not wait
        // behind it (each shard is locked only for its own part).
        if tokio::task::spawn_blocking(move || inner.sweep_expired())
            .await
            .is_err()
        {
            return;
        }
    }
}

impl Store for MemoryStore {
    fn check<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a> {
        let now = self.inner.clock.now_micros();
        let outcomes = checks.iter().map(|c| self.decide(c, now, false)).collect();
        Box::pin(std::future::ready(Ok(outcomes)))
    }

    fn set_limiter<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        let mut limiters = lock(&self.limiters);
        let result = match (limiters.get(&keys.config), mode) {
            (Some((current, _)), SetMode::TrySet) => LimiterSet {
                applied: false,
                state_reset: false,
                current: current.clone(),
            },
            (Some((current, generation)), SetMode::UpdateKeepState)
                if current.rule.keeps_state_of(&record.rule) =>
            {
                let generation = *generation;
                limiters.insert(keys.config.clone(), (record.clone(), generation));
                LimiterSet {
                    applied: true,
                    state_reset: false,
                    current: record.clone(),
                }
            }
            _ => {
                // A new generation: the states are named with it, so the old ones are never
                // read again and expire.
                let generation = self.generations.fetch_add(1, Ordering::Relaxed);
                limiters.insert(keys.config.clone(), (record.clone(), generation));
                LimiterSet {
                    applied: true,
                    state_reset: true,
                    current: record.clone(),
                }
            }
        };
        Box::pin(std::future::ready(Ok(result)))
    }

    fn get_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, Option<LimiterRecord>> {
        let found = lock(&self.limiters)
            .get(&keys.config)
            .map(|(r, _)| r.clone());
        Box::pin(std::future::ready(Ok(found)))
    }

    fn delete_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, bool> {
        let removed = lock(&self.limiters).remove(&keys.config);
        if let Some((_, generation)) = &removed {
            let id = self
                .inner
                .key_id(&format!("{}#{generation}", keys.shared.state));
            lock(self.inner.shard(id)).remove(&id);
        }
        Box::pin(std::future::ready(Ok(removed.is_some())))
    }

    fn acquire<'a>(&'a self, keys: &'a LimiterKeys, permits: u64) -> StoreFuture<'a, Acquisition> {
        let found = lock(&self.limiters).get(&keys.config).cloned();
        let acquisition = match found {
            None => Acquisition::NoSuchLimiter,
            Some((record, generation)) => {
                let state = if record.per_client {
                    keys.client.as_ref()
                } else {
                    Some(&keys.shared)
                };
                match state {
                    None => Acquisition::NeedsClient,
                    Some(_) if permits > record.capacity => Acquisition::TooManyPermits {
                        capacity: record.capacity,
                    },
                    Some(state) => {
                        let now = self.inner.clock.now_micros();
                        let mut rule = record.rule;
                        if let Rule::FixedWindow {
                            window_secs,
                            window_start,
                            ..
                        } = &mut rule
                        {
                            // The window is picked on the store's clock; the state expires when
                            // it ends.
                            let now_secs = now / 1_000_000;
                            *window_start = now_secs / *window_secs * *window_secs;
                        }
                        let check = Check {
                            key: format!("{}#{generation}", state.state),
                            hits: permits,
                            rule,
                            record_refused: false,
                        };
                        Acquisition::Decided {
                            outcome: self.decide(&check, now, true),
                            capacity: record.capacity,
                        }
                    }
                }
            }
        };
        Box::pin(std::future::ready(Ok(acquisition)))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn fixed(key: &str, hits: u64, limit: u64, window_start: u64) -> Check {
        Check {
            key: key.into(),
            hits,
            rule: Rule::FixedWindow {
                limit,
                window_secs: 60,
                window_start,
            },
            record_refused: false,
        }
    }

    fn store(clock: &Arc<ManualClock>, max_counters: usize) -> MemoryStore {
        MemoryStore::new(
            MemoryStoreOptions {
                max_counters,
                ..Default::default()
            },
            clock.clone(),
        )
    }

    async fn one(store: &MemoryStore, check: Check) -> Outcome {
        store.check(&[check]).await.unwrap()[0]
    }

    #[tokio::test]
    async fn counts_within_a_window_and_reports_reset() {
        let clock = Arc::new(ManualClock::new(120_500_000)); // 120.5 s: window [120, 180)
        let store = store(&clock, 100);
        let first = one(&store, fixed("k", 1, 2, 120)).await;
        assert_eq!(
            first,
            Outcome {
                admitted: true,
                remaining: 1,
                reset_ms: 59_500,
                used: 1
            }
        );
        assert!(one(&store, fixed("k", 1, 2, 120)).await.admitted);
        let third = one(&store, fixed("k", 1, 2, 120)).await;
        assert_eq!(
            third,
            Outcome {
                admitted: false,
                remaining: 0,
                reset_ms: 59_500,
                used: 3
            }
        );
        // hits 0 looks without counting.
        assert_eq!(one(&store, fixed("k", 0, 2, 120)).await.used, 3);
        assert_eq!(one(&store, fixed("absent", 0, 2, 120)).await.used, 0);
        assert_eq!(store.len(), 1, "a zero-hit look creates nothing");
    }

    #[tokio::test]
    async fn an_expired_counter_starts_again() {
        let clock = Arc::new(ManualClock::new(120_000_000));
        let store = store(&clock, 100);
        one(&store, fixed("k", 5, 2, 120)).await;
        clock.set_micros(180_000_000);
        // Same key (a stale window): the old count is gone.
        assert_eq!(one(&store, fixed("k", 1, 2, 120)).await.used, 1);
        store.sweep_expired();
        clock.set_micros(240_000_001);
        store.sweep_expired();
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn the_bound_evicts_instead_of_growing() {
        let clock = Arc::new(ManualClock::new(0));
        let store = store(&clock, SHARDS); // one counter per shard
        for i in 0..10_000 {
            one(&store, fixed(&format!("k{i}"), 1, 10, 0)).await;
        }
        assert!(store.len() <= SHARDS, "{} counters", store.len());
        assert!(store.evictions() >= 10_000 - SHARDS as u64);
    }

    #[tokio::test]
    async fn a_full_store_replaces_expired_counters_before_evicting_live_ones() {
        // 16 counters per shard: each shard fits in one eviction sample.
        let capacity = SHARDS * EVICTION_SAMPLE;
        let clock = Arc::new(ManualClock::new(0));
        let store = store(&clock, capacity);
        let mut i = 0;
        while store.len() < capacity {
            one(&store, fixed(&format!("old{i}"), 1, 10, 0)).await;
            i += 1;
        }
        let evicted_while_filling = store.evictions();
        // Every window [0, 60) is over. Four new keys per shard on average (far below 16 in
        // every shard) take expired places: nothing live is evicted.
        clock.set_micros(61_000_000);
        for i in 0..SHARDS * 4 {
            one(&store, fixed(&format!("new{i}"), 1, 10, 60)).await;
        }
        assert_eq!(store.evictions(), evicted_while_filling);
        // Full of live counters, the shards evict and stay within the bound.
        for i in 0..10_000 {
            one(&store, fixed(&format!("more{i}"), 1, 10, 60)).await;
        }
        assert!(store.evictions() > evicted_while_filling);
        assert!(store.len() <= capacity, "{} counters", store.len());
    }

    fn limiter_keys(name: &str) -> LimiterKeys {
        crate::limiter::KeyBuilder::default().limiter(name, None)
    }

    fn limiter(rule: Rule, capacity: u64) -> LimiterRecord {
        LimiterRecord {
            rule,
            capacity,
            per_client: false,
            description: Vec::new(),
        }
    }

    async fn take(store: &MemoryStore, keys: &LimiterKeys, permits: u64) -> Acquisition {
        store.acquire(keys, permits).await.unwrap()
    }

    fn remaining(acquisition: Acquisition) -> u64 {
        match acquisition {
            Acquisition::Decided { outcome, .. } => outcome.remaining,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_refused_acquisition_takes_nothing() {
        let clock = Arc::new(ManualClock::new(7_200_000_000));
        let store = store(&clock, 100);
        let keys = limiter_keys("fw");
        let fixed = Rule::FixedWindow {
            limit: 10,
            window_secs: 3600,
            window_start: 0,
        };
        store
            .set_limiter(&keys, &limiter(fixed, 10), SetMode::TrySet)
            .await
            .unwrap();
        assert!(matches!(
            take(&store, &keys, 8).await,
            Acquisition::Decided { outcome, .. } if outcome.admitted
        ));
        assert!(matches!(
            take(&store, &keys, 5).await,
            Acquisition::Decided { outcome, .. } if !outcome.admitted
        ));
        assert_eq!(remaining(take(&store, &keys, 0).await), 2);
        // Beyond the capacity: refused before the state is read.
        for permits in [11, u64::MAX] {
            assert_eq!(
                take(&store, &keys, permits).await,
                Acquisition::TooManyPermits { capacity: 10 }
            );
        }
        assert_eq!(remaining(take(&store, &keys, 2).await), 0);
    }

    #[tokio::test]
    async fn keep_state_keeps_only_a_state_of_the_same_shape() {
        let clock = Arc::new(ManualClock::new(7_200_000_000));
        let store = store(&clock, 100);
        let keys = limiter_keys("shape");
        let bucket = |burst| Rule::Gcra {
            interval: 1_000_000_000,
            burst,
        };
        let set = |rule: Rule, mode| {
            let record = limiter(rule, 5);
            let store = &store;
            let keys = &keys;
            async move { store.set_limiter(keys, &record, mode).await.unwrap() }
        };
        assert!(set(bucket(5), SetMode::TrySet).await.state_reset);
        take(&store, &keys, 2).await;
        // Another burst, same TAT: kept.
        let kept = set(bucket(4), SetMode::UpdateKeepState).await;
        assert!(kept.applied && !kept.state_reset);
        assert_eq!(remaining(take(&store, &keys, 0).await), 2);
        // Another shape: a fresh state, and said so.
        let log = Rule::SlidingWindowLog {
            limit: 5,
            window: 3_600_000_000,
        };
        assert!(set(log, SetMode::UpdateKeepState).await.state_reset);
        assert_eq!(remaining(take(&store, &keys, 0).await), 5);
    }

    #[tokio::test]
    async fn a_log_survives_refusals_and_looks() {
        // The log is moved out of its entry for each check and must always be put back.
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = store(&clock, 100);
        let check = |hits| Check {
            key: "log".into(),
            hits,
            rule: Rule::SlidingWindowLog {
                limit: 3,
                window: 10_000_000,
            },
            record_refused: false,
        };
        for _ in 0..3 {
            assert!(one(&store, check(1)).await.admitted);
        }
        for hits in [1, 0, 5, 0] {
            assert!(!one(&store, check(hits)).await.admitted);
        }
        assert_eq!(one(&store, check(0)).await.used, 3);
        clock.set_micros(11_000_000);
        assert_eq!(one(&store, check(0)).await.remaining, 3);
    }

    #[tokio::test]
    async fn concurrent_hits_are_exact() {
        let clock = Arc::new(ManualClock::new(0));
        let store = Arc::new(store(&clock, 1000));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..1000 {
                    if one(&store, fixed("hot", 1, 777, 0)).await.admitted {
                        admitted += 1;
                    }
                }
                admitted
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, 777);
    }
}
