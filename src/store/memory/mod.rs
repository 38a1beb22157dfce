//! The embedded store: counters in process memory, for a single replica or for trying Sluice out.
//!
//! Counters are spread over shards, each a mutex around a table (the entries in a vector, found
//! through an index keyed by a 128-bit keyed hash of the counter key), so concurrent requests on
//! different keys rarely contend and one key's read-modify-write is atomic. Every entry holds an
//! algorithm's state (see `algorithms.rs`) and its expiry, after which it is indistinguishable
//! from a new key. A background task sweeps expired entries; it holds only a weak reference and
//! ends when the store is dropped.
//!
//! # Memory bound
//!
//! `max_counters` bounds the number of live counters (split evenly over the shards). When a shard
//! is full, a new counter looks at 16 of its counters drawn uniformly at random: it drops the
//! expired ones among them, or else one holding nothing, or else evicts the live one nearest its
//! expiry, holding the fewest hits among those. The sweeper removes the other expired counters.
//! Eviction never fails a request and never panics; it is counted in
//! [`MemoryStore::evictions`].
//!
//! What a flood of fresh keys can do (SECURITY.md has the figures): a counter is evicted only
//! when it is drawn and nothing else drawn ranks below it (expires sooner, or at the same time
//! with fewer hits). A counter over its limit among one-hit counters of the same window is
//! therefore safe unless the 16 draws all land on counters like it. When every other
//! counter outranks it, each eviction in its shard takes it with probability 16/n (n counters
//! per shard): it lasts n/16 evictions there on average, `max_counters / 16` new counters over
//! the whole store. So size the bound above the number of keys live in one window.
//!
//! # Named limiters
//!
//! The native API's limiters keep their configs and states in a table of their own ([`Named`]),
//! not in the shards: a flood of per-client states must not evict, reset or slow an RLS counter
//! (issue #27: 20 000 fresh client ids on a long window used to push 640 users over their
//! limit out of a 6 400-counter store). That table has its own bound, `max_limiter_states`
//! client states over all limiters, and each per-client limiter at most the `max_clients` its
//! caller passes. A new client beyond either is refused (nothing is evicted there): evicting
//! would let fresh ids reset the budget of a client over its limit, which a refusal cannot.
//! Expired client states are dropped when a full limiter needs room (at most once per expiry
//! passed, see [`NamedLimiter::next_expiry`]) and by the sweep.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::Rng;

use super::algorithms::{self, State};
use super::{
    Acquisition, Charging, Check, CounterStore, LimiterKeys, LimiterRecord, LimiterSet,
    LimiterStore, Outcome, RegistryOp, RegistryReply, Rule, SetMode, Store, StoreFuture,
};
use crate::clock::Clock;

const SHARDS: usize = 64;
/// How many counters are looked at to choose one to evict from a full shard.
const EVICTION_SAMPLE: usize = 16;

#[derive(Debug, Clone)]
pub struct MemoryStoreOptions {
    /// Most live counters kept at once (at least one per shard).
    pub max_counters: usize,
    /// Most client states the named limiters keep, over all limiters
    /// (`MEMORY_MAX_LIMITER_STATES`); a new client beyond is refused. Shared states are not
    /// counted: there is one per limiter, and limiters are bounded by `LIMITER_MAX_COUNT`.
    pub max_limiter_states: usize,
    /// How often expired counters are swept.
    pub sweep_interval: Duration,
}

impl Default for MemoryStoreOptions {
    fn default() -> Self {
        Self {
            max_counters: 1_000_000,
            max_limiter_states: 1_000_000,
            sweep_interval: Duration::from_secs(5),
        }
    }
}

#[derive(Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
    /// The registry of named limiters: name → until when it is kept while idle (ms on the
    /// store's clock). Bounded by the service's maximum count of limiters.
    registry: Mutex<HashMap<String, u64>>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    /// The two SipHash keys of [`KeyId`].
    key_hashes: [RandomState; 2],
    per_shard: usize,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
    /// The named limiters, apart from the counters (see the module doc).
    named: Mutex<Named>,
    max_limiter_states: usize,
    /// New clients refused because a limiter or the table was full.
    clients_refused: AtomicU64,
}

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

/// A key's 128-bit keyed hash, from two SipHash keys drawn at start-up. Entries are stored
/// under it rather than under the key text, which halves the memory per counter. Two keys meet
/// only if their 128-bit hashes do: about 2^-128 per pair, and not something a client can aim
/// for without the per-process keys.
type KeyId = u128;

type Shard = Mutex<Table>;

/// A [`KeyId`] as the index's key: two words, so that an index bucket (key and position) takes
/// 24 bytes where a `u128` key (16-byte aligned) would pad it to 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IndexKey([u64; 2]);

impl IndexKey {
    fn of(id: KeyId) -> Self {
        Self([id as u64, (id >> 64) as u64])
    }
}

impl std::hash::Hash for IndexKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The low half is already a keyed hash (see KeyIdHasher).
        state.write_u64(self.0[0]);
    }
}

/// Uses the already-random low 64 bits of a [`KeyId`] as its hash.
#[derive(Default)]
struct KeyIdHasher(u64);

impl Hasher for KeyIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; mixing keeps this correct for anything else.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, low: u64) {
        self.0 = low;
    }
}

/// One shard's counters: the entries in an array, so that eviction can draw a sample at
/// uniformly random positions in O(1) each, and an index from key to position. Removing
/// moves the last entry into the hole, so the array never has gaps. A hash map alone offers
/// no random access: its iteration order is fixed, and sampling the first entries of it let a
/// flood of new keys sweep a shard from one end.
#[derive(Debug)]
struct Table {
    slots: Slots,
    index: HashMap<IndexKey, usize, BuildHasherDefault<KeyIdHasher>>,
}

#[derive(Debug)]
struct Slot {
    id: KeyId,
    entry: Entry,
}

/// Slots per chunk of [`Slots`] (768 KiB): a whole shard at the default bound.
const CHUNK: usize = 16_384;

/// A growable array in fixed-size chunks, each allocated whole at its first slot: its pages
/// become resident only as slots are written, and it never moves. A vector that doubles copies
/// itself and frees the old buffer; measured at a million counters with mimalloc, that (or
/// chunks of 1 024 slots) cost 137 to 172 bytes of RSS per counter, against 126 to 131 with
/// these chunks and 120 to 126 for the hash map this replaced. Emptied chunks are kept, so a
/// full shard that evicts and inserts allocates nothing.
#[derive(Debug)]
struct Slots {
    chunks: Vec<Vec<Slot>>,
    len: usize,
    /// Slots per chunk: [`CHUNK`], or the shard's bound when smaller.
    chunk: usize,
    /// Chunks [`Self::push`] had to allocate itself, under the shard's lock.
    #[cfg(test)]
    allocated_in_push: usize,
}

impl Slots {
    fn get(&self, at: usize) -> Option<&Slot> {
        self.chunks.get(at / self.chunk)?.get(at % self.chunk)
    }

    fn get_mut(&mut self, at: usize) -> Option<&mut Slot> {
        self.chunks
            .get_mut(at / self.chunk)?
            .get_mut(at % self.chunk)
    }

    /// Whether the next [`Self::push`] needs a chunk that is not there yet.
    fn wants_chunk(&self) -> bool {
        self.len == self.chunks.len() * self.chunk
    }

    fn push(&mut self, slot: Slot) {
        let at = self.len / self.chunk;
        if at == self.chunks.len() {
            // Callers that hold the shard's lock allocate the chunk before they take it
            // (`Inner::lock_with_room`); this is the fallback, which keeps `push` total.
            #[cfg(test)]
            {
                self.allocated_in_push += 1;
            }
            self.chunks.push(Vec::with_capacity(self.chunk));
        }
        self.chunks[at].push(slot);
        self.len += 1;
    }

    fn swap(&mut self, a: usize, b: usize) {
        let (low, high) = (a.min(b), a.max(b));
        if high >= self.len || low == high {
            return;
        }
        let (low_chunk, high_chunk) = (low / self.chunk, high / self.chunk);
        if low_chunk == high_chunk {
            self.chunks[low_chunk].swap(low % self.chunk, high % self.chunk);
        } else {
            let (before, from) = self.chunks.split_at_mut(high_chunk);
            std::mem::swap(
                &mut before[low_chunk][low % self.chunk],
                &mut from[0][high % self.chunk],
            );
        }
    }

    fn truncate(&mut self, len: usize) {
        while self.len > len {
            self.len -= 1;
            self.chunks[self.len / self.chunk].pop();
        }
    }

    /// Removes the slot at `at`, moving the last one into its place.
    fn swap_remove(&mut self, at: usize) -> Option<Slot> {
        if at >= self.len {
            return None;
        }
        self.len -= 1;
        let last = self.chunks[self.len / self.chunk].pop()?;
        if at == self.len {
            return Some(last);
        }
        self.get_mut(at).map(|place| std::mem::replace(place, last))
    }
}

impl Table {
    fn new(bound: usize) -> Self {
        Self {
            slots: Slots {
                chunks: Vec::new(),
                len: 0,
                chunk: bound.clamp(1, CHUNK),
                #[cfg(test)]
                allocated_in_push: 0,
            },
            index: HashMap::default(),
        }
    }

    fn len(&self) -> usize {
        self.slots.len
    }

    fn get(&self, id: &KeyId) -> Option<&Entry> {
        let at = *self.index.get(&IndexKey::of(*id))?;
        self.slots.get(at).map(|slot| &slot.entry)
    }

    fn contains(&self, id: &KeyId) -> bool {
        self.index.contains_key(&IndexKey::of(*id))
    }

    fn get_mut(&mut self, id: &KeyId) -> Option<&mut Entry> {
        let at = *self.index.get(&IndexKey::of(*id))?;
        self.slots.get_mut(at).map(|slot| &mut slot.entry)
    }

    fn insert(&mut self, id: KeyId, entry: Entry) {
        if let Some(existing) = self.get_mut(&id) {
            *existing = entry;
            return;
        }
        self.index.insert(IndexKey::of(id), self.slots.len);
        self.slots.push(Slot { id, entry });
    }

    fn remove(&mut self, id: &KeyId) -> Option<Entry> {
        let at = self.index.remove(&IndexKey::of(*id))?;
        self.remove_at(at)
    }

    /// Removes the slot at `at` (its index entry already gone) and moves the last one there.
    fn remove_at(&mut self, at: usize) -> Option<Entry> {
        let removed = self.slots.swap_remove(at)?;
        if let Some(moved) = self.slots.get(at) {
            self.index.insert(IndexKey::of(moved.id), at);
        }
        Some(removed.entry)
    }

    fn retain_live(&mut self, now: u64) {
        let live = |slot: &Slot| slot.entry.expires_at > now;
        let expired = (0..self.slots.len)
            .filter(|&at| self.slots.get(at).is_some_and(|slot| !live(slot)))
            .count();
        if expired * 2 > self.slots.len {
            // Most are gone (every fixed window of one length ends at the same instant): move the
            // live ones to the front and index them afresh, one insertion per survivor, rather
            // than two index operations per removal.
            let mut kept = 0;
            for at in 0..self.slots.len {
                if self.slots.get(at).is_some_and(live) {
                    self.slots.swap(kept, at);
                    kept += 1;
                }
            }
            self.slots.truncate(kept);
            self.index.clear();
            for at in 0..kept {
                if let Some(slot) = self.slots.get(at) {
                    self.index.insert(IndexKey::of(slot.id), at);
                }
            }
            return;
        }
        let mut at = 0;
        while let Some(slot) = self.slots.get(at) {
            if slot.entry.expires_at <= now {
                self.index.remove(&IndexKey::of(slot.id));
                self.remove_at(at);
            } else {
                at += 1;
            }
        }
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
                .map(|_| Mutex::new(Table::new(per_shard)))
                .collect(),
            key_hashes: [RandomState::new(), RandomState::new()],
            per_shard,
            clock,
            evictions: AtomicU64::new(0),
            named: Mutex::default(),
            max_limiter_states: options.max_limiter_states,
            clients_refused: AtomicU64::new(0),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep(Arc::downgrade(&inner), options.sweep_interval));
        }
        Self {
            inner,
            registry: Mutex::new(HashMap::new()),
        }
    }

    /// Client states the named limiters hold (expired ones not yet dropped included).
    pub fn limiter_states(&self) -> usize {
        lock(&self.inner.named).client_states
    }

    /// New clients of named limiters refused because a limiter (`LIMITER_MAX_CLIENTS`) or the
    /// table (`MEMORY_MAX_LIMITER_STATES`) was full.
    pub fn limiter_clients_refused(&self) -> u64 {
        self.inner.clients_refused.load(Ordering::Relaxed)
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
        let mut shard = self.inner.lock_with_room(self.inner.shard_index(id), &[id]);
        self.decide_in(&mut shard, id, check, Hits::Charge(check.hits), now, take)
    }

    /// Decides `checks` when a trial comes first ([`super::needs_trial`]: under
    /// [`Charging::StopWhenOver`], or with a group): the shards of all their keys are locked at
    /// once (in index order, so two such calls never wait on each other in a cycle), each
    /// check is first tried without writing ([`super::trial`], which lets each see what the
    /// checks before it charge), and then each is charged what
    /// [`super::charged_hits`] says. A check that would go over and is charged nothing keeps
    /// its trial outcome (decided with 0 hits it could look admitted).
    fn decide_together(&self, checks: &[&Check], now: u64, charging: Charging) -> Vec<Outcome> {
        let ids: Vec<KeyId> = checks.iter().map(|c| self.inner.key_id(&c.key)).collect();
        let mut shard_indexes: Vec<usize> =
            ids.iter().map(|&id| self.inner.shard_index(id)).collect();
        shard_indexes.sort_unstable();
        shard_indexes.dedup();
        // Taken in index order; `lock_with_room` may let go of the shard it is taking (never
        // of one already held) while it allocates, which keeps that order.
        let mut held: Vec<(usize, std::sync::MutexGuard<'_, Table>)> = shard_indexes
            .into_iter()
            .map(|i| (i, self.inner.lock_with_room(i, &ids)))
            .collect();
        let tried: Vec<Outcome> = super::trial(checks, |i, hits| {
            let table = held_table(&mut held, self.inner.shard_index(ids[i]));
            self.decide_in(table, ids[i], checks[i], Hits::Try(hits), now, false)
        });
        let over: Vec<bool> = tried.iter().map(|t| !t.admitted).collect();
        let charged = super::charged_hits(checks, charging, &over);
        checks
            .iter()
            .zip(&ids)
            .zip(charged)
            .zip(tried)
            .map(|(((check, &id), hits), tried)| {
                if !tried.admitted && hits == 0 {
                    return tried;
                }
                let table = held_table(&mut held, self.inner.shard_index(id));
                let charged = self.decide_in(table, id, check, Hits::Charge(hits), now, false);
                // Refused in the trial, which counted what the checks before it charge: a
                // charge that now fits only fits because fewer were charged than assumed
                // (`StopWhenOver`), and the call's decision stays the trial's.
                if !tried.admitted && charged.admitted {
                    tried
                } else {
                    charged
                }
            })
            .collect()
    }

    /// Decides one check on its shard's table, which the caller holds locked.
    fn decide_in(
        &self,
        shard: &mut Table,
        id: KeyId,
        check: &Check,
        hits: Hits,
        now: u64,
        take: bool,
    ) -> Outcome {
        let (hits, dry_run) = match hits {
            Hits::Charge(hits) => (hits, false),
            Hits::Try(hits) => (hits, true),
        };
        // A log is never copied (it may hold up to `limit` entries, and this runs on every
        // check): a trial reads it in place, a charge moves it out of its entry and the
        // algorithm hands back the log to keep. The other states are a few words, and a dry run
        // clones them, since it keeps nothing.
        if let (true, Rule::SlidingWindowLog { limit, window }) = (dry_run, &check.rule) {
            let state = shard
                .get(&id)
                .filter(|e| e.expires_at > now)
                .map(|e| &e.state);
            return algorithms::sliding_window_log_trial(state, hits, *limit, *window, now);
        }
        let mut moved_log = false;
        let found = shard.get_mut(&id).filter(|e| e.expires_at > now).map(|e| {
            if matches!(e.state, State::Log(_)) && !dry_run {
                moved_log = true;
                std::mem::replace(&mut e.state, State::Count(0))
            } else {
                e.state.clone()
            }
        });
        let step = run_rule(&check.rule, found, hits, check.record_refused, take, now);
        if dry_run {
            return step.outcome;
        }
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
                        self.inner.make_room(shard, now);
                    }
                    shard.insert(id, entry);
                }
            }
        }
        step.outcome
    }
}

/// Runs `rule`'s algorithm on the state `found` (`None`: none, or expired). One place for the
/// counters and the named limiters.
fn run_rule(
    rule: &Rule,
    found: Option<State>,
    hits: u64,
    record_refused: bool,
    take: bool,
    now: u64,
) -> algorithms::Step {
    match *rule {
        Rule::FixedWindow {
            limit,
            window_secs,
            window_start,
        } => algorithms::fixed_window(found, hits, take, limit, (window_secs, window_start), now),
        Rule::SlidingWindowLog { limit, window } => {
            algorithms::sliding_window_log(found, hits, record_refused, limit, window, now)
        }
        Rule::SlidingWindowCounter { limit, window } => {
            algorithms::sliding_window_counter(found, hits, record_refused, limit, window, now)
        }
        Rule::Gcra { interval, burst } => {
            algorithms::gcra(found, hits, record_refused, interval, burst, now)
        }
        Rule::WarmUp {
            permits_per_window,
            window,
            warmup,
            cold_factor,
        } => algorithms::warm_up(
            found,
            hits,
            record_refused,
            permits_per_window,
            window,
            warmup,
            cold_factor,
            now,
        ),
    }
}

/// The table of shard `index` among the locked ones (sorted by index).
fn held_table<'h>(
    held: &'h mut [(usize, std::sync::MutexGuard<'_, Table>)],
    index: usize,
) -> &'h mut Table {
    let at = held
        .binary_search_by_key(&index, |(i, _)| *i)
        .expect("every check's shard is held");
    &mut held[at].1
}

/// The hits a check is decided with, and whether the decision is kept.
#[derive(Debug, Clone, Copy)]
enum Hits {
    /// Decided and kept (0: a look).
    Charge(u64),
    /// Decided as if charged, and nothing kept: would the check go over?
    Try(u64),
}

impl Inner {
    fn key_id(&self, key: &str) -> KeyId {
        let [high, low] = &self.key_hashes;
        (u128::from(high.hash_one(key)) << 64) | u128::from(low.hash_one(key))
    }

    /// The shard of `id` (tests look into it).
    #[cfg(test)]
    fn shard(&self, id: KeyId) -> &Shard {
        &self.shards[self.shard_index(id)]
    }

    /// The shard from the high bits; the index inside uses the low ones.
    fn shard_index(&self, id: KeyId) -> usize {
        (id >> 64) as usize % self.shards.len()
    }

    /// Locks shard `index` for deciding `ids` (those of other shards are ignored). When one of
    /// them is new there and its insertion would need a fresh chunk of slots (768 KiB at the
    /// default bound: the first insert into each shard), the chunk is allocated first, with the
    /// lock let go: allocating it under the lock held every other key of the shard for up to
    /// 18 ms at warm-up on a busy machine (docs/BENCHMARKS.md). Whatever the caller then does
    /// under the lock is decided afresh, so letting go in between changes no answer.
    fn lock_with_room(&self, index: usize, ids: &[KeyId]) -> std::sync::MutexGuard<'_, Table> {
        let shard = &self.shards[index];
        let needs_chunk = |table: &Table| {
            // A full shard makes room by evicting, into slots it already has.
            table.slots.wants_chunk()
                && table.len() < self.per_shard
                && ids
                    .iter()
                    .any(|&id| self.shard_index(id) == index && !table.contains(&id))
        };
        loop {
            let table = lock(shard);
            if !needs_chunk(&table) {
                return table;
            }
            let size = table.slots.chunk;
            drop(table);
            let chunk = Vec::with_capacity(size);
            let mut table = lock(shard);
            if needs_chunk(&table) {
                table.slots.chunks.push(chunk);
                return table;
            }
            // Another caller added one meanwhile: free this one outside the lock, look again.
            drop(table);
            drop(chunk);
        }
    }

    /// Frees one place in a full shard by looking at a sample, never the whole shard: a scan per
    /// new key would cost tens of microseconds under the shard lock once the store is full of
    /// live counters, which is exactly the state an attacker with fresh keys creates. The sample
    /// is 16 distinct positions drawn uniformly (Floyd's algorithm: 16 draws, no retries) from a
    /// per-thread CSPRNG, so no order of requests steers which counters are looked at; a shard
    /// of 16 or fewer is looked at whole.
    ///
    /// Among the sample, what cannot change an answer goes first: the expired counters (all of
    /// them), else one whose state counts nothing. Only then is a live counter evicted: the one
    /// nearest its expiry, which forgives for the shortest time, and among those, the one holding
    /// the fewest hits, which forgives the fewest. So a flood of fresh keys, whose counters hold
    /// one hit each, evicts its own counters rather than a counter over its limit in the same
    /// window. Expired counters outside the sample are left to the sweeper.
    fn make_room(&self, shard: &mut Table, now: u64) {
        let len = shard.len();
        let size = len.min(EVICTION_SAMPLE);
        let mut rng = rand::rng();
        let mut sample = [0; EVICTION_SAMPLE];
        for (drawn, last) in (len - size..len).enumerate() {
            let at = rng.random_range(0..=last);
            sample[drawn] = if sample[..drawn].contains(&at) {
                last
            } else {
                at
            };
        }
        let mut expired = [0; EVICTION_SAMPLE];
        let mut expired_count = 0;
        // (holds something, expiry, hits held): the smallest is the best to evict.
        let mut best: Option<(KeyId, (bool, u64, u64))> = None;
        for &at in &sample[..size] {
            // Every position drawn is below `len`, so each is found.
            let Some(slot) = shard.slots.get(at) else {
                continue;
            };
            if slot.entry.expires_at <= now {
                expired[expired_count] = slot.id;
                expired_count += 1;
                continue;
            }
            let held = hits_held(&slot.entry.state, now);
            let rank = (held > 0, slot.entry.expires_at, held);
            if best.is_none_or(|(_, best)| rank < best) {
                best = Some((slot.id, rank));
            }
        }
        if expired_count > 0 {
            for id in &expired[..expired_count] {
                shard.remove(id);
            }
        } else if let Some((victim, (holds_something, _, _))) = best {
            shard.remove(&victim);
            if holds_something {
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn sweep_expired(&self) {
        let now = self.clock.now_micros();
        for shard in self.shards.iter() {
            lock(shard).retain_live(now);
        }
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
    fn acquire(&self, keys: &LimiterKeys, permits: u64, max_clients: u64, now: u64) -> Acquisition {
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
            (true, Some(client)) => Some(self.key_id(&client.state)),
            (false, _) => None,
        };
        let capacity = limiter.record.capacity;
        if permits > capacity {
            return Acquisition::TooManyPermits { capacity };
        }
        let mut rule = limiter.record.rule.clone();
        if let Rule::FixedWindow {
            window_secs,
            window_start,
            ..
        } = &mut rule
        {
            // The window is picked on the store's clock; the state expires when it ends.
            *window_start = super::window_start(now / 1_000_000, *window_secs);
        }
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
                        self.clients_refused.fetch_add(1, Ordering::Relaxed);
                        return Acquisition::TooManyClients { max };
                    }
                    *client_states += 1;
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
        }
    }
}

/// What a state holds against its key's limit, in hits where the state says (0: the same as no
/// state, so dropping it changes no answer). The algorithms store no empty state and give every
/// state an expiry at the moment it would count nothing again, so 0 is a guard, not a case seen
/// in practice.
fn hits_held(state: &State, now: u64) -> u64 {
    match state {
        State::Count(count) => *count,
        State::Log(log) => log.hits(),
        State::Windows {
            current, previous, ..
        } => u64::from(*current) + u64::from(*previous),
        // A theoretical arrival time not in the future: the bucket is full again. Otherwise
        // at least one hit is outstanding (how many would take the rule's interval).
        State::Tat(tat) => u64::from(*tat > now),
        // How far from cold it is depends on the rule's shape, which the state does not hold.
        State::WarmUp { .. } => 1,
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
        // 5 to 12 ms at a million counters: off the async workers, so requests do not wait
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
    fn kind(&self) -> &'static str {
        "memory"
    }
}

impl CounterStore for MemoryStore {
    fn check_with<'a>(&'a self, checks: &'a [&'a Check], charging: Charging) -> StoreFuture<'a> {
        let now = self.inner.clock.now_micros();
        let outcomes = match charging {
            _ if super::needs_trial(checks, charging) => {
                self.decide_together(checks, now, charging)
            }
            Charging::Each | Charging::StopWhenOver => {
                checks.iter().map(|c| self.decide(c, now, false)).collect()
            }
            Charging::LookOnly => checks
                .iter()
                .map(|c| {
                    let id = self.inner.key_id(&c.key);
                    let mut shard = self.inner.lock_with_room(self.inner.shard_index(id), &[id]);
                    self.decide_in(&mut shard, id, c, Hits::Charge(0), now, false)
                })
                .collect(),
        };
        Box::pin(std::future::ready(Ok(outcomes)))
    }
}

impl LimiterStore for MemoryStore {
    fn set_limiter<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        let mut named = lock(&self.inner.named);
        let Named {
            limiters,
            client_states,
        } = &mut *named;
        let result = match (limiters.get_mut(&keys.config), mode) {
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
        };
        Box::pin(std::future::ready(Ok(result)))
    }

    fn get_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, Option<LimiterRecord>> {
        let found = lock(&self.inner.named)
            .limiters
            .get(&keys.config)
            .map(|l| l.record.clone());
        Box::pin(std::future::ready(Ok(found)))
    }

    fn delete_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, bool> {
        let mut named = lock(&self.inner.named);
        let removed = named.limiters.remove(&keys.config);
        if let Some(old) = &removed {
            named.client_states -= old.clients.len();
        }
        Box::pin(std::future::ready(Ok(removed.is_some())))
    }

    fn acquire<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        let now = self.inner.clock.now_micros();
        Box::pin(std::future::ready(Ok(self.inner.acquire(
            keys,
            permits,
            max_clients,
            now,
        ))))
    }

    /// The same operations as `lua/registry.lua`, on one map (one registry per process, so
    /// `_key` names nothing here).
    fn registry<'a>(&'a self, _key: &'a str, op: RegistryOp<'a>) -> StoreFuture<'a, RegistryReply> {
        let now_ms = self.inner.clock.now_millis();
        let mut registry = lock(&self.registry);
        let reply = match op {
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
        };
        Box::pin(std::future::ready(Ok(reply)))
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
            group: None,
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
        store.check(&[&check]).await.unwrap()[0]
    }

    /// Every shard's first counter needs a chunk of slots: it is allocated before the shard's
    /// lock is taken, on each path that inserts (one check, a trial with several).
    #[tokio::test]
    async fn chunks_are_allocated_outside_the_shard_lock() {
        let clock = Arc::new(ManualClock::new(120_500_000));
        let store = store(&clock, 64 * 100);
        for i in 0..2_000 {
            let key = format!("one-{i}");
            one(&store, fixed(&key, 1, 10, 120)).await;
        }
        // Fresh shards for the other paths.
        let store_two = self::store(&clock, 64 * 100);
        for i in 0..1_000 {
            let (a, b) = (
                fixed(&format!("a-{i}"), 1, 10, 120),
                fixed(&format!("b-{i}"), 1, 10, 120),
            );
            store_two
                .check_with(&[&a, &b], Charging::StopWhenOver)
                .await
                .unwrap();
        }
        for store in [&store, &store_two] {
            for shard in store.inner.shards.iter() {
                let table = lock(shard);
                assert!(table.len() > 0, "every shard got counters");
                assert_eq!(
                    table.slots.allocated_in_push, 0,
                    "a chunk allocated under the lock"
                );
            }
        }
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

    fn hourly(key: &str, hits: u64) -> Check {
        Check {
            key: key.into(),
            hits,
            rule: Rule::FixedWindow {
                limit: 5,
                window_secs: 3600,
                window_start: 0,
            },
            record_refused: false,
            group: None,
        }
    }

    /// Hits `key` until it is refused, so that its counter is over its limit.
    async fn push_over_limit(store: &MemoryStore, key: &str) {
        for _ in 0..5 {
            assert!(one(store, hourly(key, 1)).await.admitted);
        }
        assert!(!one(store, hourly(key, 1)).await.admitted);
    }

    /// The reported attack: counters over their limit, then a flood of requests with fresh
    /// descriptor values under the same rule. Each new counter in a full shard evicts one; the
    /// victims hold more hits than any flood counter with the same expiry, so a random sample
    /// finds a flood counter to evict unless all 16 draws land on victims ((30/400)^16, about
    /// 10^-18, per eviction here). The old sample (the first 16 entries of the shard's map)
    /// swept each shard in map order and let every victim in again.
    #[tokio::test]
    async fn a_flood_of_fresh_keys_does_not_reset_counters_over_their_limit() {
        let clock = Arc::new(ManualClock::new(0));
        let store = store(&clock, SHARDS * 400);
        let victims = SHARDS * 30;
        for i in 0..victims {
            push_over_limit(&store, &format!("victim{i}")).await;
        }
        for i in 0..SHARDS * 1_250 {
            one(&store, hourly(&format!("fresh{i}"), 1)).await;
        }
        assert!(store.evictions() > 40_000, "{}", store.evictions());
        let mut admitted = Vec::new();
        for i in 0..victims {
            if one(&store, hourly(&format!("victim{i}"), 1)).await.admitted {
                admitted.push(i);
            }
        }
        assert!(
            admitted.is_empty(),
            "{} of {victims} victims admitted again, e.g. {:?}",
            admitted.len(),
            &admitted[..admitted.len().min(5)]
        );
    }

    /// Floods a store of `per_shard` counters per shard with counters that all outrank its
    /// victims (they expire an hour later), keeping one victim over its limit in every shard
    /// and a new one whenever one is evicted, until `deaths` victims were evicted. Returns the
    /// mean number of evictions a victim's shard makes while it lives, the one that takes it
    /// included: all evictions its shards made while a victim lived (so that victims still
    /// alive at the end count too: stopping at the first `deaths` alone would favour short
    /// lives) over the victims evicted.
    async fn evictions_survived(per_shard: usize, deaths: usize) -> f64 {
        let clock = Arc::new(ManualClock::new(0));
        let store = store(&clock, SHARDS * per_shard);
        let inner = &store.inner;
        // 6 hits against a limit of 5 in [0, 60): over its limit, gone at 60 s.
        let mut placed = 0;
        let mut place = async |shard: usize| -> KeyId {
            loop {
                let key = format!("victim{placed}");
                placed += 1;
                let id = inner.key_id(&key);
                if inner.shard_index(id) == shard {
                    assert!(!one(&store, fixed(&key, 6, 5, 0)).await.admitted);
                    return id;
                }
            }
        };
        let mut victims = Vec::new();
        for shard in 0..SHARDS {
            victims.push(place(shard).await);
        }
        let mut evicted = 0;
        let mut exposure = 0;
        for i in 0.. {
            let key = format!("fresh{i}");
            let id = inner.key_id(&key);
            let shard = inner.shard_index(id);
            let full = lock(inner.shard(id)).len() >= inner.per_shard;
            one(&store, hourly(&key, 1)).await;
            if !full {
                continue;
            }
            exposure += 1;
            if lock(inner.shard(id)).get(&victims[shard]).is_none() {
                evicted += 1;
                if evicted == deaths {
                    break;
                }
                victims[shard] = place(shard).await;
            }
        }
        exposure as f64 / evicted as f64
    }

    /// The worst case SECURITY.md states: every other counter outranks the victim, so each
    /// eviction in its shard takes it exactly when it is in the sample, with probability 16/n
    /// for n counters per shard: it survives n/16 of them on average (25 here). Over 640
    /// victims the mean's standard deviation is about 1, so the bounds below are 7 of them
    /// away. A sample that is not uniform fails it: the old one (the first 16 of the shard's
    /// map) left a victim that is not among the first entries alone for hundreds of evictions,
    /// and a full scan would take it at once.
    #[tokio::test]
    async fn a_counter_every_other_outranks_survives_n_over_16_evictions_on_average() {
        let per_shard = 400;
        let mean = evictions_survived(per_shard, SHARDS * 10).await;
        let expected = (per_shard / EVICTION_SAMPLE) as f64;
        assert!(
            (0.7 * expected..1.4 * expected).contains(&mean),
            "mean {mean}, expected {expected}"
        );
    }

    /// The same at the default bound (15 625 counters per shard), for SECURITY.md:
    /// `cargo test --lib store::memory -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "an experiment: about a million checks"]
    async fn measure_evictions_survived_at_the_default_bound() {
        let per_shard = MemoryStoreOptions::default().max_counters / SHARDS;
        let deaths = 512;
        let mean = evictions_survived(per_shard, deaths).await;
        println!(
            "{per_shard} per shard: a victim every other counter outranks survived {mean:.0} \
             evictions in its shard on average over {deaths} victims evicted (expected {})",
            per_shard / EVICTION_SAMPLE
        );
    }

    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// Cost per check and memory per counter at the default bound, for docs/BENCHMARKS.md:
    /// `cargo test --release --lib store::memory::tests::measure_cost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "a measurement: run it in release"]
    async fn measure_cost_at_the_default_bound() {
        let clock = Arc::new(ManualClock::new(0));
        let max = MemoryStoreOptions::default().max_counters;
        let store = store(&clock, max);
        let keys: Vec<String> = (0..max).map(|i| format!("key{i}")).collect();
        let before = resident_bytes();
        for key in &keys {
            store.check(&[&hourly(key, 1)]).await.unwrap();
        }
        let bytes = resident_bytes() - before;
        println!(
            "{:.0} bytes of RSS per counter over {} counters",
            bytes as f64 / store.len() as f64,
            store.len()
        );
        let rounds = 500_000;
        let started = std::time::Instant::now();
        for i in 0..rounds {
            // A stride through the keys, so that consecutive checks touch unrelated memory.
            let key = &keys[i * 7919 % max];
            store.check(&[&hourly(key, 1)]).await.unwrap();
        }
        let known = started.elapsed().as_nanos() as f64 / rounds as f64;
        let started = std::time::Instant::now();
        for i in 0..rounds {
            store
                .check(&[&hourly(&format!("new{i}"), 1)])
                .await
                .unwrap();
        }
        let new = started.elapsed().as_nanos() as f64 / rounds as f64;
        println!(
            "per check: {known:.0} ns on a known key, {new:.0} ns on a new key in the full store \
             ({} evictions)",
            store.evictions()
        );
        let started = std::time::Instant::now();
        store.sweep_expired();
        let live = started.elapsed();
        clock.set_micros(3_600_000_000);
        let started = std::time::Instant::now();
        store.sweep_expired();
        let expired = started.elapsed();
        println!("sweep of {max} counters: {live:?} when live, {expired:?} when all expired");
    }

    /// The table across chunk boundaries (chunks of 3 slots): every key stays reachable through
    /// removals in the middle, at the end and by the sweep, and freed places are reused.
    #[test]
    fn the_table_keeps_its_index_right_across_chunks() {
        let entry = |expires_at| Entry {
            state: State::Count(1),
            expires_at,
        };
        let mut table = Table::new(3);
        for id in 0..10 {
            table.insert(id, entry(100 + id as u64));
        }
        assert_eq!(table.slots.chunks.len(), 4);
        assert!(table.remove(&4).is_some());
        assert!(table.remove(&9).is_some());
        assert!(table.remove(&0).is_some());
        assert!(table.remove(&4).is_none());
        table.insert(3, entry(200));
        let present =
            |table: &Table| -> Vec<u128> { (0..12).filter(|id| table.get(id).is_some()).collect() };
        assert_eq!(present(&table), [1, 2, 3, 5, 6, 7, 8]);
        assert_eq!(table.get(&3).map(|e| e.expires_at), Some(200));
        assert_eq!(table.len(), 7);
        // 1, 2, 5 and 6 expire by 106: most of the table, which is compacted and re-indexed.
        table.retain_live(106);
        assert_eq!(present(&table), [3, 7, 8]);
        for id in 10..12 {
            table.insert(id, entry(300));
        }
        assert_eq!(present(&table), [3, 7, 8, 10, 11]);
        assert_eq!(table.slots.chunks.len(), 4, "emptied chunks are reused");
        // Only 7 expires by 107: removed on its own.
        table.retain_live(107);
        assert_eq!(present(&table), [3, 8, 10, 11]);
        assert_eq!(table.len(), 4);
        for id in [3, 8, 10, 11] {
            let at = table.index[&IndexKey::of(id)];
            assert_eq!(table.slots.get(at).map(|slot| slot.id), Some(id));
        }
    }

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
        store.acquire(keys, permits, 0).await.unwrap()
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
                .set_limiter(&keys, &record, SetMode::TrySet)
                .await
                .unwrap();
        }
        let acquire = |keys: LimiterKeys| {
            let store = &store;
            async move { store.acquire(&keys, 1, 20).await.unwrap() }
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
        assert_eq!(store.limiter_clients_refused(), 2);
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
            group: None,
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

    /// One shard hammered from many threads at once: callers on one hot key, callers pushing
    /// fresh keys into the full shard (an eviction per new key), callers adding counters that
    /// are already expired, and a thread sweeping. A limit of N still admits exactly N: the
    /// hot key's read-modify-write is atomic under the shard's lock, and it is never the one
    /// evicted (every other counter in its shard holds fewer hits with the same expiry, and
    /// the sample is the whole shard here).
    #[test]
    fn one_shard_hammered_with_checks_sweeps_and_evictions_admits_exactly_the_limit() {
        const LIMIT: u64 = 3_000;
        const HOT_CALLERS: u64 = 4;
        const CALLS_EACH: u64 = 1_500;
        let clock = Arc::new(ManualClock::new(120_500_000)); // window [120, 180)
        let store = store(&clock, SHARDS * EVICTION_SAMPLE);
        let inner = &store.inner;
        let shard = inner.shard_index(inner.key_id("hot"));
        let same_shard = |prefix: &str, count: usize| -> Vec<String> {
            (0..)
                .map(|i| format!("{prefix}{i}"))
                .filter(|key| inner.shard_index(inner.key_id(key)) == shard)
                .take(count)
                .collect()
        };
        let fresh = same_shard("fresh", 4_000);
        let stale = same_shard("stale", 1_000);
        // Eviction takes the counter holding the fewest hits: a hot counter still at one hit
        // ties with every fresh one, and a busy machine can hold the hot callers back while the
        // fresh keys churn. A few hits first keep it out of reach, which is what this is about:
        // exactness under concurrent sweeps and evictions of other counters.
        const PRIMED: u64 = 5;
        for _ in 0..PRIMED {
            let check = fixed("hot", 1, LIMIT, 120);
            assert!(futures::executor::block_on(store.check(&[&check])).unwrap()[0].admitted);
        }
        let done = std::sync::atomic::AtomicBool::new(false);
        let admitted = PRIMED
            + std::thread::scope(|scope| {
                let hot: Vec<_> = (0..HOT_CALLERS)
                    .map(|_| {
                        scope.spawn(|| {
                            // Only once the shard evicts, so that the hot counter is counted
                            // while others come and go, however the threads are scheduled.
                            while store.evictions() == 0 {
                                std::thread::yield_now();
                            }
                            (0..CALLS_EACH)
                                .filter(|_| {
                                    let check = fixed("hot", 1, LIMIT, 120);
                                    futures::executor::block_on(store.check(&[&check])).unwrap()[0]
                                        .admitted
                                })
                                .count() as u64
                        })
                    })
                    .collect();
                let others: Vec<_> = [&fresh[..2_000], &fresh[2_000..]]
                    .into_iter()
                    .map(|keys| {
                        let (store, done) = (&store, &done);
                        scope.spawn(move || {
                            for key in keys.iter().cycle() {
                                if done.load(Ordering::Relaxed) {
                                    break;
                                }
                                futures::executor::block_on(
                                    store.check(&[&fixed(key, 1, LIMIT, 120)]),
                                )
                                .unwrap();
                            }
                        })
                    })
                    .collect();
                let (store_ref, done_ref, stale) = (&store, &done, &stale);
                // A window that ended at 60 s: its counter is stored already expired.
                let expired = scope.spawn(move || {
                    for key in stale.iter().cycle() {
                        if done_ref.load(Ordering::Relaxed) {
                            break;
                        }
                        futures::executor::block_on(store_ref.check(&[&fixed(key, 1, LIMIT, 0)]))
                            .unwrap();
                    }
                });
                let sweeper = scope.spawn(move || {
                    while !done_ref.load(Ordering::Relaxed) {
                        store_ref.sweep_expired();
                    }
                });
                let admitted: u64 = hot.into_iter().map(|h| h.join().unwrap()).sum();
                done.store(true, Ordering::Relaxed);
                for handle in others {
                    handle.join().unwrap();
                }
                expired.join().unwrap();
                sweeper.join().unwrap();
                admitted
            });
        assert_eq!(admitted, LIMIT);
        assert!(store.evictions() > 0, "the shard never evicted");
        let look = futures::executor::block_on(store.check(&[&fixed("hot", 0, LIMIT, 120)]));
        assert_eq!(look.unwrap()[0].used, PRIMED + HOT_CALLERS * CALLS_EACH);
        assert!(
            store.len() <= SHARDS * EVICTION_SAMPLE,
            "{} counters",
            store.len()
        );
    }
}
