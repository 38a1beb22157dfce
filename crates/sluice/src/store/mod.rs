//! Where counters live: the store traits and their two implementations (memory, Redis).
//!
//! [`CounterStore`] is what the Envoy decision path needs, [`LimiterStore`] what the named
//! limiters need; both stores implement both, and so does a store with a layer in front
//! ([`layers`]: the circuit breaker, the measurements, `FAILURE_POLICY=local_share`). Every
//! operation takes its [`Call`]: the caller's deadline and the request's marks (`call.rs`). A counter store receives every counted descriptor of one
//! request as a batch of [`Check`]s and answers them in one atomic step per key (one Lua script
//! call on Redis, one shard lock per key in memory), or for the whole batch under
//! [`Charging::StopWhenOver`] or when it holds a group of checks that are all or nothing (the
//! limits of one descriptor's `rate_limits`, see [`charged_hits`]): the same script call, the
//! shards of all its keys locked together in memory. The algorithm runs inside the store because only there can the read-modify-write
//! be atomic across service replicas; the memory store and the scripts in `lua/` implement the
//! same semantics and are tested against each other.

pub(crate) mod algorithms;
mod call;
pub(crate) mod concurrency;
pub mod deadline;
pub mod layers;
pub mod memory;
/// The Redis store (feature `redis`, on by default).
#[cfg(feature = "redis")]
pub mod redis;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use call::{Call, Marks};

pub use memory::{MemoryStore, MemoryStoreOptions};
#[cfg(feature = "redis")]
pub use redis::{ConnectionCounts, RedisOptions, RedisStore, TlsFiles};

/// How a check is counted, with the numbers it needs. Everything a store needs comes with the
/// check, so stores hold no config and a config reload never has to reach them. Times are in
/// microseconds except where named otherwise.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// Upstream's fixed window: the key names the window; admitted while the count after this
    /// request is at most `limit`.
    FixedWindow {
        /// Hits the window admits.
        limit: u64,
        /// The window's length, in seconds (upstream counts in seconds).
        window_secs: u64,
        /// Unix seconds, on the service clock; also part of the key.
        window_start: u64,
    },
    /// Exact: at most `limit` hits in any trailing `window`, one log entry per admitting call.
    SlidingWindowLog {
        /// Hits any trailing window admits.
        limit: u64,
        /// The window's length.
        window: u64,
    },
    /// The previous window's count weighted by how much of it the trailing window still
    /// overlaps, plus the current one's.
    SlidingWindowCounter {
        /// Hits the weighted window admits.
        limit: u64,
        /// The window's length.
        window: u64,
    },
    /// GCRA, which is also the token bucket and the leaky bucket (meter).
    Gcra {
        /// Time one hit takes to come back.
        interval: u64,
        /// Hits admitted at once beyond the steady spacing.
        burst: u64,
    },
    /// Guava's SmoothWarmingUp: spacing that starts `cold_factor` times slower and reaches
    /// the stable rate after `warmup` of steady use.
    WarmUp {
        /// The stable rate: permits per `window`.
        permits_per_window: u64,
        /// The window the stable rate is given in.
        window: u64,
        /// How long steady use takes to warm up.
        warmup: u64,
        /// How many times slower a cold limiter spaces requests.
        cold_factor: f64,
    },
    /// Leases held at once (`algorithm: concurrency`): an acquisition of `hits` leases is
    /// admitted while the leases held plus `hits` stay within `limit`; each lease lives `lease`
    /// unless given back. With `release`, the check gives back up to `hits` leases (those that
    /// would expire soonest) and is answered admitted when it found all of them held, refused
    /// when it found fewer (the caller answers a release OK either way and counts the
    /// shortfall).
    Concurrency {
        /// Leases held at once.
        limit: u64,
        /// How long a lease lives when never given back.
        lease: u64,
        /// Give back instead of take.
        release: bool,
    },
}

impl Rule {
    /// Whether a state counted under `self` means the same under `other`, so that
    /// `UPDATE_KEEP_STATE` can keep it: the same algorithm's state (GCRA's TAT is also the token
    /// bucket's and the leaky bucket's), and for the fixed window the same window length (a
    /// count belongs to one window). Any other change starts a new, empty state.
    pub fn keeps_state_of(&self, other: &Rule) -> bool {
        match (self, other) {
            (
                Rule::FixedWindow { window_secs: a, .. },
                Rule::FixedWindow { window_secs: b, .. },
            ) => a == b,
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

/// One descriptor's decision request.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Built by [`crate::rls::KeyBuilder`]; the store uses it verbatim.
    pub key: String,
    /// Cost of the request; 0 looks without counting.
    pub hits: u64,
    /// How it is counted, with every number the store needs.
    pub rule: Rule,
    /// Charge the hits even when the request is refused (`record_refused_hits`), bounded as
    /// `algorithms.rs` describes. A fixed window on its own always does (upstream's rule); the
    /// RLS path sets this on every fixed window so that it does in a group too (`rls::plan`).
    pub record_refused: bool,
    /// The checks of one call with the same group (the limits of one descriptor's
    /// `rate_limits`) are all or nothing: see [`charged_hits`]. `None`: on its own.
    pub group: Option<u32>,
}

/// A store's answer for one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The hits were admitted (and charged).
    pub admitted: bool,
    /// What could still be admitted now.
    pub remaining: u64,
    /// Refused: milliseconds until the same request would be admitted. Admitted: milliseconds
    /// until the limit is fully replenished (fixed window: the window end). Never 0.
    pub reset_ms: u64,
    /// What the algorithm counts as used after this request (windows: the count; buckets:
    /// burst minus remaining).
    pub used: u64,
}

/// Why a store could not decide. Messages never contain credentials.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The call ran out of time while a Redis server it waited on had owed replies (or a
    /// connect) for a second and read none on any connection (see `redis/wire.rs`, `Watch`),
    /// whoever's deadline ended it. An outage.
    #[error("store call timed out after {0:?} (the hits may or may not have been counted)")]
    Timeout(std::time::Duration),
    /// The call ran out of its own time (`REDIS_TIMEOUT`, or a caller's deadline at least as
    /// long) while Redis kept answering (see `redis/wire.rs`, `Watch`): Redis, or the machine,
    /// is slow (a busy CPU, a long script), not down. This call failed, and the failure policy
    /// answers it, but it does not count toward the circuit breaker: opening it would turn
    /// slowness into an outage for every caller.
    #[error(
        "store call timed out after {0:?} while redis was answering (slow, not down; the hits may or may not have been counted)"
    )]
    Late(std::time::Duration),
    /// The call ran out of its caller's deadline, which granted less than the store's own
    /// timeout (`REDIS_TIMEOUT`), while Redis was answering; or that deadline had passed before
    /// the call started. The caller asked for less time than the store may take: this says
    /// nothing of the store. It is answered `DEADLINE_EXCEEDED` to that caller, never by the
    /// failure policy (`fail_open`'s OK, `local_share`'s local decision), and the circuit
    /// breaker neither counts it nor takes it for an answer: otherwise a caller could choose
    /// its deadline to be admitted, or to open the breaker for everyone.
    #[error(
        "the caller's deadline ran out after {0:?}, shorter than the store may take (the hits may or may not have been counted)"
    )]
    CallerDeadline(std::time::Duration),
    /// Redis cannot serve now (`BUSY`, `LOADING`, `READONLY`, `OOM`, refused credentials) or
    /// the connection failed: an outage.
    #[error("redis error: {0}")]
    Redis(String),
    /// The store ran the script and answered with an error reply (a wrong type, a number out
    /// of range): a bug or an input the script cannot represent, never an outage. It does not
    /// count toward the circuit breaker.
    #[error("script error: {0}")]
    Script(String),
    /// No connection could be had in time (connect refused, no master for a slot, the circuit
    /// breaker open): an outage.
    #[error("no redis connection available: {0}")]
    Unavailable(String),
    /// A reply the store cannot read (a bug, or something other than Redis on the port).
    #[error("store returned a malformed reply: {0}")]
    Protocol(String),
    /// Settings the store cannot start with (bad URL, unreadable certificate).
    #[error("{0}")]
    Setup(String),
}

impl StoreError {
    /// Whether this error says the store cannot serve (a transport failure, a deadline with
    /// nothing heard from Redis, a server that refuses every call), as opposed to an answer to
    /// this one call or a late one from a Redis that is answering ([`StoreError::Late`]). Only these count
    /// toward the circuit breaker: a caller that can provoke a script error must not be able to
    /// open it for everyone.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Timeout(_) | StoreError::Redis(_) | StoreError::Unavailable(_) => true,
            StoreError::Late(_)
            | StoreError::CallerDeadline(_)
            | StoreError::Script(_)
            | StoreError::Protocol(_)
            | StoreError::Setup(_) => false,
        }
    }

    /// The `error` label of `sluice_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            // One label for both: a timeout is a timeout to whoever reads the metric; the
            // breaker is what tells them apart.
            StoreError::Timeout(_) | StoreError::Late(_) => "timeout",
            StoreError::CallerDeadline(_) => "caller_deadline",
            StoreError::Redis(_) => "redis",
            StoreError::Script(_) => "script",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Protocol(_) => "protocol",
            StoreError::Setup(_) => "setup",
        }
    }
}

/// What every store operation returns: boxed, so the traits stay object-safe
/// (`Arc<dyn CounterStore>`), and `Send`, so a call may move between threads.
pub type StoreFuture<'a, T = Vec<Outcome>> =
    Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The keys of one named limiter (native API). They share one Redis Cluster hash tag, so one
/// script can read the config and decide on the state atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterKeys {
    /// The limiter's config (its [`LimiterRecord`]).
    pub config: String,
    /// State and epoch (which config generation the state belongs to) shared by all callers.
    pub shared: StateKeys,
    /// The calling client's, used when the limiter is per client.
    pub client: Option<StateKeys>,
    /// Which clients hold a state, for the per-limiter cap (Redis: a sorted set of client ids
    /// by expiry).
    pub clients: String,
    /// The calling client's id as the cap counts it (empty without a client).
    pub client_id: String,
}

/// The keys of one budget of a named limiter (its shared one, or one client's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateKeys {
    /// The algorithm's state.
    pub state: String,
    /// Which config generation the state was counted under: a state of an older one is
    /// read as empty, so a reset never has to find every client's state.
    pub epoch: String,
}

/// A named limiter's config as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterRecord {
    /// How acquisitions are counted. A fixed window's start is picked by the store, on its clock.
    pub rule: Rule,
    /// Most permits one call can ever get.
    pub capacity: u64,
    /// One budget per client instead of one shared budget.
    pub per_client: bool,
    /// Opaque to the store (the API's encoded config), returned as it was stored.
    pub description: Vec<u8>,
}

impl LimiterRecord {
    /// Whether `UPDATE_KEEP_STATE` from `self` to `other` keeps the states counted: the rule
    /// must keep them ([`Rule::keeps_state_of`]) and the mode must stay, since one shared state
    /// and one state per client are different shapes. Any other change starts a new
    /// generation, so the states of the mode left behind are never read again (switching back
    /// does not bring them back).
    pub fn keeps_state_of(&self, other: &LimiterRecord) -> bool {
        self.per_client == other.per_client && self.rule.keeps_state_of(&other.rule)
    }
}

/// How `set_limiter` treats an existing limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Only create; an existing limiter is left alone.
    TrySet,
    /// Create or change; the states counted so far are kept where the change allows
    /// ([`LimiterRecord::keeps_state_of`]).
    UpdateKeepState,
    /// Create or change, starting every state afresh.
    UpdateResetState,
}

/// What `set_limiter` did.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSet {
    /// False when `TrySet` found an existing limiter.
    pub applied: bool,
    /// The limiter starts from an empty state because of this call: it was created, reset, or
    /// kept its state across a change [`LimiterRecord::keeps_state_of`] does not allow.
    pub state_reset: bool,
    /// The record in force after the call.
    pub current: LimiterRecord,
}

/// What an acquisition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    /// No config is stored under the keys.
    NoSuchLimiter,
    /// The limiter is per client and the call named none.
    NeedsClient,
    /// More permits than the limiter's capacity (which is given): refused before any state was
    /// read, since no wait could grant them.
    TooManyPermits {
        /// The most one call can get.
        capacity: u64,
    },
    /// The limiter is per client, the call's client holds no state, and `max` clients do
    /// (`LIMITER_MAX_CLIENTS`, or on the memory store its `MEMORY_MAX_LIMITER_STATES` over all
    /// limiters): refused before anything was written, so that no flood of fresh client ids
    /// can grow the store or push out another client's state.
    TooManyClients {
        /// The bound reached.
        max: u64,
    },
    /// The outcome, the limiter's capacity and mode at that moment.
    Decided {
        /// Granted or not, and what is left.
        outcome: Outcome,
        /// The most one call can get, under the config read.
        capacity: u64,
        /// One budget per client: the waiting line is the client's, not the limiter's.
        per_client: bool,
        /// A concurrency limiter's grant: when the leases it took expire (microseconds on the
        /// store's clock, the step they were counted in), which the lease id carries so that a
        /// release gives back to that step. `None` for any other grant or refusal.
        lease: Option<u64>,
    },
}

/// The leases one native API release gives back, as its lease id names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// When they expire: the step they were counted in (microseconds on the store's clock).
    pub expiry: u64,
    /// How many were taken.
    pub permits: u64,
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// No config is stored under the keys.
    NoSuchLimiter,
    /// The limiter is per client and the call named none.
    NeedsClient,
    /// The limiter is not a concurrency limiter: it holds no leases.
    NotLeases,
    /// Given back what the lease's step still held.
    Released {
        /// Leases given back: at most the lease's permits, 0 when its step had expired or held
        /// none (released already, or an id this limiter never gave).
        given_back: u64,
        /// Leases that could be taken now.
        remaining: u64,
    },
}

/// An operation on the registry of named limiters: which exist, and until when each is kept
/// while nobody uses it. Times are on the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryOp<'a> {
    /// Registers `name`, or keeps it another `idle_ms` if it is registered; a new name is
    /// refused while `max` names are live (0: no maximum).
    Touch {
        /// The limiter.
        name: &'a str,
        /// How long it is kept from now if nobody uses it.
        idle_ms: u64,
        /// The most names the registry holds.
        max: u64,
    },
    /// Removes and returns up to `at_most` names whose time has passed.
    TakeExpired {
        /// The most names one call removes, so one call stays short.
        at_most: usize,
    },
    /// Removes `name`.
    Remove {
        /// The limiter.
        name: &'a str,
    },
}

/// What a registry operation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryReply {
    /// `Touch`: whether the name is registered now (false: the registry is full).
    Touched(bool),
    /// `TakeExpired`: the names removed.
    Expired(Vec<String>),
    /// `Remove`: done.
    Removed,
}

/// What every store is: shareable across tasks, with a short name.
pub trait Store: Send + Sync + Debug {
    /// A short name for logs and health output.
    fn kind(&self) -> &'static str;
}

/// Which checks of one store call are charged their hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Charging {
    /// Every check is charged (upstream's default).
    #[default]
    Each,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when any check of the call would go over its
    /// limit (charged now, it would be refused), only those checks are charged; the others are
    /// only looked at (decided as with 0 hits) and their state is left as it was. Decided in
    /// the same atomic step as the charges: one script call on Redis (one per slot on a
    /// cluster), the shards of all the call's keys held at once in memory.
    StopWhenOver,
    /// No check is charged; each is only looked at (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`
    /// when the over-limit cache already refused another descriptor of the request).
    LookOnly,
}

/// Whether a call must first try its checks without writing (to learn which would go over)
/// before charging them: under [`Charging::StopWhenOver`] with more than one check, and
/// whenever a check belongs to a group.
///
/// [`Charging::StopWhenOver`] spares only the *other* checks of a call when one would go over
/// ([`charged_hits`]): a call of one check on its own is charged exactly as under
/// [`Charging::Each`], so it needs no trial and takes `Each`'s paths. On Redis that is plain
/// commands rather than the full script, a fifth of the Redis time per decision (a request with
/// one descriptor under `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`; docs/BENCHMARKS.md).
pub fn needs_trial(checks: &[&Check], charging: Charging) -> bool {
    let any_group = || checks.iter().any(|c| c.group.is_some());
    match charging {
        Charging::LookOnly => false,
        Charging::StopWhenOver => checks.len() > 1 || any_group(),
        Charging::Each => any_group(),
    }
}

/// The trial pass of a call that needs one ([`needs_trial`]): every check tried without
/// writing (`try_hits(index, hits)`), each seeing what the checks before it in the same call
/// will charge to its key. One request can name a counter twice (the same descriptor from a
/// virtual host's and a route's action, or two values sharing a `share_threshold` counter);
/// tried against the stored state alone, both copies would look admitted, both would be
/// charged, and the second copy's refusal would have charged its whole group (issue #27).
///
/// The checks are taken a unit at a time, in the order of each unit's first check: a group (its
/// checks have distinct keys, the loader sees to that) or a check on its own. A unit is tried
/// with each check's hits plus those pending on its key, then adds to the pending hits what
/// [`charged_hits`] would charge it under [`Charging::Each`]: a group all of its hits, or only
/// those of its refused checks with `record_refused` when one goes over; a check on its own
/// its hits when admitted, or when refused hits count (the fixed window, `record_refused`).
/// Under [`Charging::StopWhenOver`] fewer hits may be charged than assumed, never more, so a
/// trial errs only toward refusing; the stores answer a check the trial refused as refused
/// whatever its charge then gives. `lua/decide.lua` mirrors this.
pub fn trial(checks: &[&Check], mut try_hits: impl FnMut(usize, u64) -> Outcome) -> Vec<Outcome> {
    let mut pending: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    let mut tried: Vec<Option<Outcome>> = vec![None; checks.len()];
    for first in 0..checks.len() {
        if tried[first].is_some() {
            continue;
        }
        let group = checks[first].group;
        let unit: Vec<usize> = match group {
            None => vec![first],
            Some(g) => (first..checks.len())
                .filter(|&i| checks[i].group == Some(g))
                .collect(),
        };
        let outcomes: Vec<Outcome> = unit
            .iter()
            .map(|&i| {
                let before = pending.get(checks[i].key.as_str()).copied().unwrap_or(0);
                try_hits(i, before.saturating_add(checks[i].hits))
            })
            .collect();
        let unit_over = group.is_some() && outcomes.iter().any(|o| !o.admitted);
        for (&i, outcome) in unit.iter().zip(&outcomes) {
            let check = checks[i];
            let refused_counts =
                check.record_refused || matches!(check.rule, Rule::FixedWindow { .. });
            let charged = if unit_over {
                !outcome.admitted && check.record_refused
            } else {
                outcome.admitted || refused_counts
            };
            if charged && check.hits > 0 {
                let held = pending.entry(check.key.as_str()).or_insert(0);
                *held = held.saturating_add(check.hits);
            }
            tried[i] = Some(*outcome);
        }
    }
    tried
        .into_iter()
        .map(|o| o.expect("every check belongs to one unit"))
        .collect()
}

/// The hits each check of one call is charged, given which checks would go over if charged
/// (`over`, from a trial without writing; all false when no trial was needed). The one
/// statement of the rule in Rust; `lua/decide.lua` mirrors it and the conformance tests hold
/// the two together.
///
/// * A group (the checks sharing a [`Check::group`]) in which any check would go over is
///   refused as a whole: a refused request counts against none of the limits that would have
///   admitted it. A check with `record_refused` that itself goes over is still charged (every
///   fixed window is one, `rls::plan`), so a charge too large for a limit is counted there.
/// * Otherwise a check is charged as [`Charging`] says: every one under `Each`; under
///   `StopWhenOver`, when any check of the call would go over, only those that would.
///
/// A check that goes over and is charged nothing is answered with its trial outcome (see the
/// stores), so it stays refused.
pub fn charged_hits(checks: &[&Check], charging: Charging, over: &[bool]) -> Vec<u64> {
    if charging == Charging::LookOnly {
        return vec![0; checks.len()];
    }
    let any_over = over.contains(&true);
    let group_over = |group: u32| {
        checks
            .iter()
            .zip(over)
            .any(|(c, &o)| o && c.group == Some(group))
    };
    checks
        .iter()
        .zip(over)
        .map(|(check, &over)| match check.group {
            Some(group) if group_over(group) => {
                if over && check.record_refused {
                    check.hits
                } else {
                    0
                }
            }
            _ if charging == Charging::StopWhenOver && any_over && !over => 0,
            _ => check.hits,
        })
        .collect()
}

/// What the Envoy decision path (`rls`) needs of a store: one atomic decision per batch of
/// checks. Wrappers and test doubles of the RLS path implement only this.
pub trait CounterStore: Store {
    /// Decides every check, returning one outcome per check in the same order, charging the
    /// checks `charging` says. The checks are borrowed: a caller that splits one request's
    /// checks into parts (the over-limit cache, the per-second store, Redis Cluster slots)
    /// hands each part references, never copies.
    fn check_with<'a>(
        &'a self,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a>;

    /// Decides every check, charging each ([`Charging::Each`]), as a call with no deadline whose
    /// marks nobody reads ([`Call::detached`]).
    fn check<'a>(&'a self, checks: &'a [&'a Check]) -> StoreFuture<'a> {
        self.check_with(Call::detached(), checks, Charging::Each)
    }

    /// Removes the counters named `keys` (the admin API's reset), returning how many existed.
    /// A counter removed is as if never charged: the next check starts it afresh, for every
    /// algorithm (each keeps its whole state under its one key). The default refuses, so a test
    /// double of the decision path need not implement it; every store and layer does.
    fn reset<'a>(&'a self, call: Call<'a>, keys: &'a [&'a str]) -> StoreFuture<'a, u64> {
        let _ = (call, keys);
        Box::pin(std::future::ready(Err(StoreError::Setup(
            "this store cannot reset counters".into(),
        ))))
    }

    /// Gives back up to `check.hits` hits to each check's counter (the admin API's refund),
    /// never past empty or a full bucket, returning the hits given back per check. Only the
    /// fixed window (its count goes down) and [`Rule::Gcra`] (its arrival time moves back one
    /// interval per hit) can; any other rule is refused before a store is asked
    /// ([`refundable`]). The default refuses, as [`CounterStore::reset`]'s does.
    fn refund<'a>(&'a self, call: Call<'a>, checks: &'a [&'a Check]) -> StoreFuture<'a, Vec<u64>> {
        let _ = (call, checks);
        Box::pin(std::future::ready(Err(StoreError::Setup(
            "this store cannot refund counters".into(),
        ))))
    }
}

/// Whether a refund can give hits back under `rule`: a fixed window's count and a bucket's
/// arrival time say how many hits they hold; a log of hits, two weighted windows and a warm-up's
/// spacing do not say which hits to take back.
pub fn refundable(rule: &Rule) -> bool {
    matches!(rule, Rule::FixedWindow { .. } | Rule::Gcra { .. })
}

/// What the named limiters (`named`) need of a store: limiter configs, acquisitions and the
/// registry, each atomic with what it reads.
pub trait LimiterStore: Store {
    /// Creates or changes a named limiter.
    fn set_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet>;

    /// The limiter's config, `None` when it has none.
    fn get_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>>;

    /// Removes the config and the shared state; returns whether a config existed.
    fn delete_limiter<'a>(&'a self, call: Call<'a>, keys: &'a LimiterKeys)
    -> StoreFuture<'a, bool>;

    /// Takes `permits` (0: only looks) under the limiter's current config, atomically with
    /// reading it. Unlike [`CounterStore::check`], a refused acquisition never changes the state, for
    /// every algorithm including the fixed window. A per-client limiter keeps at most
    /// `max_clients` client states (0: no cap); a new client beyond is
    /// [`Acquisition::TooManyClients`].
    fn acquire<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition>;

    /// Gives back a concurrency limiter's `lease`, atomically with reading its config: at most
    /// its permits, and only from the step it names, while that step is live.
    fn release<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        lease: Lease,
    ) -> StoreFuture<'a, Release>;

    /// Changes or reads the registry of named limiters kept under `key`.
    fn registry<'a>(
        &'a self,
        call: Call<'a>,
        key: &'a str,
        op: RegistryOp<'a>,
    ) -> StoreFuture<'a, RegistryReply>;
}

/// A store for both decision paths: what the server stacks its layers over (every store and
/// every layered store is one). As `Arc<dyn FullStore>` it becomes either path's trait object.
pub trait FullStore: CounterStore + LimiterStore {}

impl<S: CounterStore + LimiterStore + ?Sized> FullStore for S {}

// A shared store is a store: layers stack over `Arc<dyn CounterStore>` as over a store they own.
impl<S: Store + ?Sized> Store for Arc<S> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
}

impl<S: CounterStore + ?Sized> CounterStore for Arc<S> {
    fn check_with<'a>(
        &'a self,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a> {
        (**self).check_with(call, checks, charging)
    }

    fn reset<'a>(&'a self, call: Call<'a>, keys: &'a [&'a str]) -> StoreFuture<'a, u64> {
        (**self).reset(call, keys)
    }

    fn refund<'a>(&'a self, call: Call<'a>, checks: &'a [&'a Check]) -> StoreFuture<'a, Vec<u64>> {
        (**self).refund(call, checks)
    }
}

impl<S: LimiterStore + ?Sized> LimiterStore for Arc<S> {
    fn set_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        (**self).set_limiter(call, keys, record, mode)
    }

    fn get_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>> {
        (**self).get_limiter(call, keys)
    }

    fn delete_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, bool> {
        (**self).delete_limiter(call, keys)
    }

    fn acquire<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        (**self).acquire(call, keys, permits, max_clients)
    }

    fn release<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        lease: Lease,
    ) -> StoreFuture<'a, Release> {
        (**self).release(call, keys, lease)
    }

    fn registry<'a>(
        &'a self,
        call: Call<'a>,
        key: &'a str,
        op: RegistryOp<'a>,
    ) -> StoreFuture<'a, RegistryReply> {
        (**self).registry(call, key, op)
    }
}

/// The start (unix seconds) of the fixed window of `window_secs` that holds `now_secs`:
/// upstream's rule, which its keys name, so both services count in the same windows. The one
/// place it is written in Rust (the named limiters' script computes it on Redis's clock).
pub fn window_start(now_secs: u64, window_secs: u64) -> u64 {
    now_secs / window_secs * window_secs
}
