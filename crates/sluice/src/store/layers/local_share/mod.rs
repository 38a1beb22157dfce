//! The `local_share` failure policy (issue #28, "degraded decisions instead of none"): a store
//! layer (`layers/`) that, when the store behind it cannot answer (its breaker is open, the call
//! timed out, Redis is unreachable), decides in process with this replica's share of every
//! limit, and marks such answers on the request's marks (`Call::mark_degraded`).
//!
//! Every call still goes to the store first (an open breaker makes that instant), so the first
//! call after Redis answers again is exact. The store's call is given the caller's deadline less
//! a reserve (a tenth, at most [`RESERVE`]; half while the store is known to fail), so the
//! local decision, microseconds, still answers in time.
//! The local decisions run on a [`MemoryStore`] (the same algorithms, bounded by the memory
//! store's options), with each rule scaled to the share ([`share`]) by the replica count
//! ([`replicas`]).
//!
//! What degrades: the errors that say the store is down or late ([`StoreError::is_outage`], and
//! [`StoreError::Late`]). An error reply to the script ([`StoreError::Script`]) or a malformed
//! reply does not: Redis is up and answered, so the error is a bug or an input the script
//! cannot represent; deciding locally would hide it behind an approximate answer, and it goes
//! to the caller as before. Nor does a call that ran out of its caller's deadline, shorter than
//! the store may take, while Redis answered ([`StoreError::CallerDeadline`]): the local share
//! keeps counts of its own, so a caller that could reach it by sending a short deadline could
//! be admitted on a limit Redis has used up (issue #40).
//!
//! Local state is not read again once the store answers. It stays in the memory store until it
//! expires, so a second outage within the same window finds the first one's counts (stricter).
//! In the window that straddles the outage's start or end, the store's count and the local one
//! do not know each other: that window may admit the limit (store) plus the replicas' shares.
//!
//! The named limiters' configs live in the store; the layer learns each limiter's record from
//! the store's answers (`set_limiter`, `get_limiter`, and one `get_limiter` after an acquisition
//! at most every [`LEARN_AGAIN`]) into the memory store, scaled. An acquisition on a limiter it
//! has not learnt gets the store's error. Setting, deleting and the registry are never decided
//! locally.

pub mod replicas;
pub mod share;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use replicas::Replicas;

use super::{Layer, Op};
use crate::store::{
    Acquisition, Call, Charging, Check, CounterStore, LimiterKeys, LimiterRecord, LimiterSet,
    LimiterStore, MemoryStore, SetMode, StoreError, StoreFuture,
};
use crate::util::LogThrottle;

/// The most of the caller's time left kept back from the store for the local decision; at most
/// a tenth of what is left, so a short deadline still gives the store most of it (Envoy's
/// default 20 ms: 18 ms after the answer's margin, 1.8 ms kept). The decision itself takes
/// microseconds; the rest is for a busy machine's scheduler to wake the call that gave up
/// (tests/degraded.rs, both cores busy, missed Envoy's 0.5 s twice in 1 320 calls with 20 ms).
pub const RESERVE: Duration = Duration::from_millis(50);

/// How often a named limiter's record is read again after an acquisition, so a change made
/// through another replica reaches this one's local share.
pub const LEARN_AGAIN: Duration = Duration::from_secs(10);

/// Most named limiters whose learning time is remembered; past it, all are learnt again.
const MAX_LEARNT: usize = 100_000;

/// Called once per store call decided locally (the metric `sluice_degraded_decisions_total`,
/// which lives above the store).
pub type OnDegraded = Arc<dyn Fn() + Send + Sync>;

/// The layer: the store first, `local` when it cannot answer.
pub struct LocalShare {
    local: Arc<MemoryStore>,
    replicas: Arc<Replicas>,
    on_degraded: OnDegraded,
    log: LogThrottle,
    /// The last call was decided locally: the store is known to be failing.
    failing: AtomicBool,
    /// When each named limiter's record was last learnt (by config key).
    learnt: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for LocalShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalShare")
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl LocalShare {
    /// Local decisions on `local` (which several layers may share) when the store fails.
    pub fn new(local: Arc<MemoryStore>, replicas: Arc<Replicas>, on_degraded: OnDegraded) -> Self {
        Self {
            local,
            replicas,
            on_degraded,
            log: LogThrottle::new(),
            failing: AtomicBool::new(false),
            learnt: Mutex::new(HashMap::new()),
        }
    }

    /// The store's call, with time kept back for a local decision: [`RESERVE`] at most while
    /// the store answers, half of what is left while it is known to fail. A call that reaches
    /// a failing store (the breaker's probe, or every call before the breaker opens) may wait
    /// for a connection until its deadline; a Redis that is back answers in a millisecond, so
    /// half the time is plenty to notice it, and the other half keeps the local answer in time
    /// on a busy machine.
    async fn first_the_store<'a, T>(
        &self,
        call: Call<'a>,
        run: impl FnOnce(Call<'a>) -> StoreFuture<'a, T>,
    ) -> Result<T, StoreError> {
        let failing = self.failing.load(Ordering::Relaxed);
        let reserve = |left: Duration| {
            if failing {
                left / 2
            } else {
                (left / 10).min(RESERVE)
            }
        };
        let result = run(call.sooner(reserve)).await;
        match &result {
            // Says nothing of the store.
            Err(StoreError::CallerDeadline(_)) => {}
            Err(e) if degrades(e) => self.failing.store(true, Ordering::Relaxed),
            _ => self.failing.store(false, Ordering::Relaxed),
        }
        result
    }

    /// Counts, marks and logs (at most once a second) one local decision for `call` on the
    /// store of `kind`.
    fn noted(&self, call: Call<'_>, kind: &'static str, error: &StoreError, replicas: u64) {
        call.mark_degraded();
        (self.on_degraded)();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Some(held_back) = self.log.allow(now) {
            tracing::warn!(
                %error,
                replicas,
                held_back,
                store = kind,
                "store failed; deciding locally with this replica's share (FAILURE_POLICY=local_share)"
            );
        }
    }

    /// Keeps `record` (scaled to the share) as the local twin of the limiter at `keys`.
    async fn learn(&self, keys: &LimiterKeys, record: &LimiterRecord) {
        let share = share::record(record, self.replicas.count());
        // Same rule and mode: the local state is kept; otherwise it starts afresh.
        let _ = self
            .local
            .set_limiter(Call::detached(), keys, &share, SetMode::UpdateKeepState)
            .await;
        let mut learnt = self.learnt.lock().unwrap_or_else(|p| p.into_inner());
        if learnt.len() >= MAX_LEARNT {
            learnt.clear();
        }
        learnt.insert(keys.config.clone(), Instant::now());
    }

    /// Whether the limiter at `keys` is due to be learnt (again).
    fn due(&self, keys: &LimiterKeys) -> bool {
        let learnt = self.learnt.lock().unwrap_or_else(|p| p.into_inner());
        learnt
            .get(&keys.config)
            .is_none_or(|at| at.elapsed() >= LEARN_AGAIN)
    }
}

/// Whether `error` says the store could not answer in time, so a local decision stands in
/// (never [`StoreError::CallerDeadline`]: the caller's deadline, not the store, ended the call).
pub fn degrades(error: &StoreError) -> bool {
    error.is_outage() || matches!(error, StoreError::Late(_))
}

impl Layer for LocalShare {
    /// Operations it does not answer itself (the registry) go to the store as they are.
    fn around<'a, T: Send + 'a>(
        &'a self,
        _: Op,
        call: Call<'a>,
        run: impl FnOnce(Call<'a>) -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        run(call)
    }

    fn check_with<'a, S: CounterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a> {
        Box::pin(async move {
            let asked = self
                .first_the_store(call, |call| store.check_with(call, checks, charging))
                .await;
            let error = match asked {
                Err(e) if degrades(&e) => e,
                answered => return answered,
            };
            let replicas = self.replicas.count();
            let shared: Vec<Check> = checks
                .iter()
                .map(|check| Check {
                    rule: share::rule(&check.rule, replicas),
                    ..(*check).clone()
                })
                .collect();
            let shared: Vec<&Check> = shared.iter().collect();
            let outcomes = self.local.check_with(call, &shared, charging).await?;
            self.noted(call, store.kind(), &error, replicas);
            Ok(outcomes)
        })
    }

    fn set_limiter<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        Box::pin(async move {
            let set = store.set_limiter(call, keys, record, mode).await?;
            self.learn(keys, &set.current).await;
            Ok(set)
        })
    }

    fn get_limiter<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>> {
        Box::pin(async move {
            let record = store.get_limiter(call, keys).await?;
            if let Some(record) = &record {
                self.learn(keys, record).await;
            }
            Ok(record)
        })
    }

    fn delete_limiter<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let existed = store.delete_limiter(call, keys).await?;
            let _ = self.local.delete_limiter(Call::detached(), keys).await;
            Ok(existed)
        })
    }

    fn acquire<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        Box::pin(async move {
            let asked = self
                .first_the_store(call, |call| store.acquire(call, keys, permits, max_clients))
                .await;
            let error = match asked {
                Ok(acquisition) => {
                    if matches!(acquisition, Acquisition::Decided { .. }) && self.due(keys) {
                        // Learnt after the answer: its cost is one read per limiter per
                        // LEARN_AGAIN, and a failure here changes nothing.
                        if let Ok(Some(record)) = store.get_limiter(call, keys).await {
                            self.learn(keys, &record).await;
                        }
                    }
                    return Ok(acquisition);
                }
                Err(e) if degrades(&e) => e,
                Err(e) => return Err(e),
            };
            match self.local.acquire(call, keys, permits, max_clients).await? {
                // Never learnt: the store's error is the honest answer.
                Acquisition::NoSuchLimiter => Err(error),
                acquisition => {
                    self.noted(call, store.kind(), &error, self.replicas.count());
                    Ok(acquisition)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests;
