//! The named limiters' side of the memory store (native API): their configs and states, the
//! bounds on their client states, and the registry of limiters that `named::` sweeps.
//!
//! The native API's limiters keep their configs and states in a table of their own
//! ([`NamedTable`]), not in the shards: a flood of per-client states must not evict, reset or
//! slow an RLS counter (issue #27: 20 000 fresh client ids on a long window used to push 640
//! users over their limit out of a 6 400-counter store). That table has its own bound, `max_limiter_states`
//! client states over all limiters, and each per-client limiter at most the `max_clients` its
//! caller passes. A new client beyond either is refused (nothing is evicted there): evicting
//! would let fresh ids reset the budget of a client over its limit, which a refusal cannot.
//! Expired client states are dropped when a full limiter needs room (at most once per expiry
//! passed, see [`NamedLimiter::next_expiry`]) and by the sweep.

use std::collections::HashMap;
use std::sync::Mutex;

use super::state::{Entry, run_rule};
use super::table::{KeyId, lock};
use crate::store::algorithms::State;
use crate::store::concurrency;
use crate::store::{
    Acquisition, Lease, LimiterKeys, LimiterRecord, LimiterSet, RegistryOp, RegistryReply, Release,
    Rule, SetMode,
};

/// The named limiters' configs and states (native API).
#[derive(Debug, Default)]
struct Named {
    /// By config key.
    limiters: HashMap<String, NamedLimiter>,
    /// Client states held over all limiters (expired ones not yet dropped included).
    client_states: usize,
}

#[derive(Debug)]
struct NamedLimiter {
    record: LimiterRecord,
    /// The state of an `OVERALL` limiter.
    shared: Option<Entry>,
    /// A `PER_CLIENT` limiter's states, by the keyed hash of the client's state key.
    clients: HashMap<KeyId, Entry>,
    /// No client state expires before this (microseconds; a lower bound, since a state used
    /// again lives longer): until then a full limiter has nothing to drop, so a flood of new
    /// clients is refused without a scan of its states each.
    next_expiry: u64,
}

impl NamedLimiter {
    fn new(record: LimiterRecord) -> Self {
        Self {
            record,
            shared: None,
            clients: HashMap::new(),
            next_expiry: u64::MAX,
        }
    }

    /// The limiter's rule for a decision at `now`: a fixed window's start is picked on the
    /// store's clock.
    fn rule_at(&self, now: u64) -> Rule {
        let mut rule = self.record.rule.clone();
        if let Rule::FixedWindow {
            window_secs,
            window_start,
            ..
        } = &mut rule
        {
            // The window is picked on the store's clock; the state expires when it ends.
            *window_start = crate::store::window_start(now / 1_000_000, *window_secs);
        }
        rule
    }

    /// Drops the client states expired at `now`, when any can be; returns how many.
    fn drop_expired(&mut self, now: u64) -> usize {
        if now < self.next_expiry {
            return 0;
        }
        let before = self.clients.len();
        self.clients.retain(|_, e| e.expires_at > now);
        self.next_expiry = self
            .clients
            .values()
            .map(|e| e.expires_at)
            .min()
            .unwrap_or(u64::MAX);
        before - self.clients.len()
    }
}

/// A concurrency grant's lease: the expiry step its leases were counted in at `now` (as
/// `concurrency::concurrency` counts them); `None` for any other rule, or nothing taken.
fn lease_taken(rule: &Rule, took: bool, now: u64) -> Option<u64> {
    match *rule {
        Rule::Concurrency { lease, .. } if took => Some(concurrency::expiry_of(now, lease)),
        _ => None,
    }
}

/// The named limiters' table, under one lock, and its bound (see the module doc).
#[derive(Debug)]
pub(super) struct NamedTable {
    named: Mutex<Named>,
    max_limiter_states: usize,
}

impl NamedTable {
    pub(super) fn new(max_limiter_states: usize) -> Self {
        Self {
            named: Mutex::default(),
            max_limiter_states,
        }
    }

    /// Client states held (expired ones not yet dropped included).
    pub(super) fn states(&self) -> usize {
        lock(&self.named).client_states
    }

    /// Drops the states expired at `now` (the sweep's part for the named limiters).
    pub(super) fn sweep(&self, now: u64) {
        let mut named = lock(&self.named);
        let Named {
            limiters,
            client_states,
        } = &mut *named;
        for limiter in limiters.values_mut() {
            *client_states -= limiter.drop_expired(now);
            if limiter.shared.as_ref().is_some_and(|e| e.expires_at <= now) {
                limiter.shared = None;
            }
        }
    }

    /// A named limiter's acquisition, under the named table's lock (see the module doc).
    /// `key_id` names a client's state (the store's keyed hash, as for the counters).
    pub(super) fn acquire(
        &self,
        key_id: impl Fn(&str) -> KeyId,
        keys: &LimiterKeys,
        permits: u64,
        max_clients: u64,
        now: u64,
    ) -> Acquisition {
        let mut named = lock(&self.named);
        let Named {
            limiters,
            client_states,
        } = &mut *named;
        let Some(limiter) = limiters.get_mut(&keys.config) else {
            return Acquisition::NoSuchLimiter;
        };
        let per_client = limiter.record.per_client;
        let client = match (per_client, &keys.client) {
            (true, None) => return Acquisition::NeedsClient,
            (true, Some(client)) => Some(key_id(&client.state)),
            (false, _) => None,
        };
        let capacity = limiter.record.capacity;
        if permits > capacity {
            return Acquisition::TooManyPermits { capacity };
        }
        let rule = limiter.rule_at(now);
        // The state is taken out of its place and put back below. A log is handed to the
        // algorithm as it is (it may hold many entries), and handed back unless empty; other
        // states are a few words, cloned so that "keep as it was" has them.
        let held = match client {
            Some(id) => limiter.clients.remove(&id),
            None => limiter.shared.take(),
        };
        let had_place = held.is_some();
        let (found, as_it_was) = match held.filter(|e| e.expires_at > now) {
            Some(e) if matches!(e.state, State::Log(_)) => (Some(e.state), None),
            Some(e) => (Some(e.state.clone()), Some(e)),
            None => (None, None),
        };
        let step = run_rule(&rule, found, permits, false, true, now);
        let next = match step.keep {
            Some((state, ttl)) => Some(Entry {
                state,
                expires_at: now + ttl,
            }),
            None => as_it_was,
        };
        match (client, next) {
            (Some(id), Some(entry)) => {
                if !had_place {
                    // A new client takes a place only if there is one: nothing live is pushed
                    // out for it.
                    if let Err(max) = self.admit_client(limiter, client_states, max_clients, now) {
                        return Acquisition::TooManyClients { max };
                    }
                }
                limiter.next_expiry = limiter.next_expiry.min(entry.expires_at);
                limiter.clients.insert(id, entry);
            }
            (Some(_), None) => {
                if had_place {
                    *client_states -= 1;
                }
            }
            (None, entry) => limiter.shared = entry,
        }
        Acquisition::Decided {
            outcome: step.outcome,
            capacity,
            per_client,
            lease: lease_taken(&rule, step.outcome.admitted && permits > 0, now),
        }
    }

    /// A concurrency limiter's release of `lease` (`LimiterStore::release`), under the named
    /// table's lock. An emptied state is left to expire, as the acquisition leaves it.
    pub(super) fn release(
        &self,
        key_id: impl Fn(&str) -> KeyId,
        keys: &LimiterKeys,
        lease: Lease,
        now: u64,
    ) -> Release {
        let mut named = lock(&self.named);
        let Some(limiter) = named.limiters.get_mut(&keys.config) else {
            return Release::NoSuchLimiter;
        };
        let Rule::Concurrency { limit, .. } = limiter.record.rule else {
            return Release::NotLeases;
        };
        let entry = match (limiter.record.per_client, &keys.client) {
            (true, None) => return Release::NeedsClient,
            (true, Some(client)) => limiter.clients.get_mut(&key_id(&client.state)),
            (false, _) => limiter.shared.as_mut(),
        };
        let (given_back, held) = match entry {
            Some(Entry {
                state: State::Leases(leases),
                expires_at,
            }) if *expires_at > now => (
                leases.give_back_at(lease.expiry, lease.permits, now),
                leases.held(),
            ),
            _ => (0, 0),
        };
        Release::Released {
            given_back,
            remaining: limit.saturating_sub(held),
        }
    }

    /// Counts a new client of `limiter` in, when there is room: under its cap of `max_clients`
    /// (0: none) and the table's bound, once the limiter's expired states are dropped; else
    /// `Err` with the bound it met.
    fn admit_client(
        &self,
        limiter: &mut NamedLimiter,
        client_states: &mut usize,
        max_clients: u64,
        now: u64,
    ) -> Result<(), u64> {
        let full = |l: &NamedLimiter, held: usize| {
            if max_clients > 0 && l.clients.len() as u64 >= max_clients {
                Some(max_clients)
            } else if held >= self.max_limiter_states {
                Some(self.max_limiter_states as u64)
            } else {
                None
            }
        };
        if full(limiter, *client_states).is_some() {
            *client_states -= limiter.drop_expired(now);
        }
        if let Some(max) = full(limiter, *client_states) {
            return Err(max);
        }
        *client_states += 1;
        Ok(())
    }

    /// A limiter's config set as `mode` says (`LimiterStore::set_limiter`).
    pub(super) fn set(
        &self,
        keys: &LimiterKeys,
        record: &LimiterRecord,
        mode: SetMode,
    ) -> LimiterSet {
        let mut named = lock(&self.named);
        let Named {
            limiters,
            client_states,
        } = &mut *named;
        match (limiters.get_mut(&keys.config), mode) {
            (Some(current), SetMode::TrySet) => LimiterSet {
                applied: false,
                state_reset: false,
                current: current.record.clone(),
            },
            (Some(current), SetMode::UpdateKeepState) if current.record.keeps_state_of(record) => {
                current.record = record.clone();
                LimiterSet {
                    applied: true,
                    state_reset: false,
                    current: record.clone(),
                }
            }
            (current, _) => {
                // A new, empty state: the old states (shared and every client's) go with the
                // old entry, so none is read again, also after a switch back.
                if let Some(old) = current {
                    *client_states -= old.clients.len();
                }
                limiters.insert(keys.config.clone(), NamedLimiter::new(record.clone()));
                LimiterSet {
                    applied: true,
                    state_reset: true,
                    current: record.clone(),
                }
            }
        }
    }

    pub(super) fn get(&self, keys: &LimiterKeys) -> Option<LimiterRecord> {
        lock(&self.named)
            .limiters
            .get(&keys.config)
            .map(|l| l.record.clone())
    }

    /// Deletes a limiter and its states; whether there was one.
    pub(super) fn delete(&self, keys: &LimiterKeys) -> bool {
        let mut named = lock(&self.named);
        let removed = named.limiters.remove(&keys.config);
        if let Some(old) = &removed {
            named.client_states -= old.clients.len();
        }
        removed.is_some()
    }
}

/// The registry of named limiters: name → until when it is kept while idle (ms on the
/// store's clock). Bounded by the service's maximum count of limiters.
#[derive(Debug, Default)]
pub(super) struct Registry(Mutex<HashMap<String, u64>>);

impl Registry {
    /// The same operations as `lua/registry.lua`, on one map (one registry per process).
    pub(super) fn apply(&self, op: RegistryOp<'_>, now_ms: u64) -> RegistryReply {
        let mut registry = lock(&self.0);
        match op {
            RegistryOp::Touch { name, idle_ms, max } => {
                let keep_until = now_ms + idle_ms;
                if let Some(until) = registry.get_mut(name) {
                    *until = keep_until;
                    RegistryReply::Touched(true)
                } else if max > 0
                    && registry.values().filter(|&&until| until > now_ms).count() as u64 >= max
                {
                    RegistryReply::Touched(false)
                } else {
                    registry.insert(name.to_string(), keep_until);
                    RegistryReply::Touched(true)
                }
            }
            RegistryOp::TakeExpired { at_most } => {
                let gone: Vec<String> = registry
                    .iter()
                    .filter(|&(_, &until)| until <= now_ms)
                    .map(|(name, _)| name.clone())
                    .take(at_most)
                    .collect();
                for name in &gone {
                    registry.remove(name);
                }
                RegistryReply::Expired(gone)
            }
            RegistryOp::Remove { name } => {
                registry.remove(name);
                RegistryReply::Removed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::tests::store;
    use super::super::{MemoryStore, MemoryStoreOptions};
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::LimiterStore;

    fn limiter_keys(name: &str) -> LimiterKeys {
        crate::rls::KeyBuilder::default().limiter(name, None)
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
        store
            .acquire(crate::store::Call::detached(), keys, permits, 0)
            .await
            .unwrap()
    }

    /// The named limiters' states live in a table of their own: they never take a counter's
    /// place, a per-client limiter holds at most its cap of clients and the table at most its
    /// bound, new clients beyond are refused without pushing anyone out, and expired states
    /// make room again.
    #[tokio::test]
    async fn named_states_are_bounded_apart_from_the_counters() {
        let clock = Arc::new(ManualClock::new(1_000 * 1_000_000));
        let store = MemoryStore::new(
            MemoryStoreOptions {
                max_counters: 64,
                max_limiter_states: 30,
                ..Default::default()
            },
            clock.clone(),
        );
        let rule = Rule::SlidingWindowLog {
            limit: 1,
            window: 10_000_000,
        };
        let per_client = |name: &str| {
            let keys = limiter_keys(name);
            let record = LimiterRecord {
                per_client: true,
                ..limiter(rule.clone(), 1)
            };
            (keys, record)
        };
        let client =
            |name: &str, id: &str| crate::rls::KeyBuilder::default().limiter(name, Some(id));
        for name in ["a", "b"] {
            let (keys, record) = per_client(name);
            store
                .set_limiter(
                    crate::store::Call::detached(),
                    &keys,
                    &record,
                    SetMode::TrySet,
                )
                .await
                .unwrap();
        }
        let acquire = |keys: LimiterKeys| {
            let store = &store;
            async move {
                store
                    .acquire(crate::store::Call::detached(), &keys, 1, 20)
                    .await
                    .unwrap()
            }
        };
        for i in 0..20 {
            let got = acquire(client("a", &format!("c{i}"))).await;
            assert!(matches!(got, Acquisition::Decided { outcome, .. } if outcome.admitted));
        }
        // The cap of one limiter.
        let got = acquire(client("a", "c20")).await;
        assert_eq!(got, Acquisition::TooManyClients { max: 20 });
        // A known client is still decided (and still over its limit: nobody was pushed out).
        let got = acquire(client("a", "c0")).await;
        assert!(matches!(got, Acquisition::Decided { outcome, .. } if !outcome.admitted));
        // The table's bound over all limiters.
        for i in 0..10 {
            let got = acquire(client("b", &format!("c{i}"))).await;
            assert!(matches!(got, Acquisition::Decided { .. }), "{got:?}");
        }
        let got = acquire(client("b", "c10")).await;
        assert_eq!(got, Acquisition::TooManyClients { max: 30 });
        assert_eq!(store.limiter_states(), 30);
        // None of it is in the counters' shards.
        assert_eq!(store.len(), 0);
        // Once the states expire, there is room again.
        clock.advance_micros(11_000_000);
        let got = acquire(client("a", "c20")).await;
        assert!(matches!(got, Acquisition::Decided { outcome, .. } if outcome.admitted));
        store.sweep_expired();
        assert_eq!(store.limiter_states(), 1);
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
            .set_limiter(
                crate::store::Call::detached(),
                &keys,
                &limiter(fixed, 10),
                SetMode::TrySet,
            )
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
            async move {
                store
                    .set_limiter(crate::store::Call::detached(), keys, &record, mode)
                    .await
                    .unwrap()
            }
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
}
