//! Where counters live: the [`Store`] trait and its two implementations.
//!
//! A store receives every counted descriptor of one request as a batch of [`Check`]s and answers
//! them in one atomic step per key (one Lua script call on Redis, one shard lock per key in
//! memory). The algorithm runs inside the store because only there can the read-modify-write be
//! atomic across service replicas; the memory store and the scripts in `lua/` implement the same
//! semantics and are tested against each other.

pub mod algorithms;
pub mod breaker;
mod cluster;
mod coalesce;
pub mod instrumented;
pub mod memory;
pub mod redis;
mod script;
pub mod slot;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

pub use instrumented::Instrumented;
pub use memory::{MemoryStore, MemoryStoreOptions};
pub use redis::{RedisOptions, RedisStore, TlsFiles};

/// How a check is counted, with the numbers it needs. Everything a store needs comes with the
/// check, so stores hold no config and a config reload never has to reach them. Times are in
/// microseconds except where named otherwise.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// Upstream's fixed window: the key names the window; admitted while the count after this
    /// request is at most `limit`.
    FixedWindow {
        limit: u64,
        window_secs: u64,
        /// Unix seconds, on the service clock; also part of the key.
        window_start: u64,
    },
    SlidingWindowLog {
        limit: u64,
        window: u64,
    },
    SlidingWindowCounter {
        limit: u64,
        window: u64,
    },
    /// GCRA, which is also the token bucket and the leaky bucket (meter).
    Gcra {
        interval: u64,
        burst: u64,
    },
    WarmUp {
        permits_per_window: u64,
        window: u64,
        warmup: u64,
        cold_factor: f64,
    },
}

/// One descriptor's decision request.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Built by [`crate::limiter::KeyBuilder`]; the store uses it verbatim.
    pub key: String,
    /// Cost of the request; 0 looks without counting.
    pub hits: u64,
    pub rule: Rule,
}

/// A store's answer for one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
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
    #[error("store call timed out after {0:?} (the hits may or may not have been counted)")]
    Timeout(std::time::Duration),
    #[error("redis error: {0}")]
    Redis(String),
    /// The store ran the script and answered with an error reply (a wrong type, a number out
    /// of range): a bug or an input the script cannot represent, never an outage. It does not
    /// count toward the circuit breaker.
    #[error("script error: {0}")]
    Script(String),
    #[error("no redis connection available: {0}")]
    Unavailable(String),
    #[error("store returned a malformed reply: {0}")]
    Protocol(String),
    /// Settings the store cannot start with (bad URL, unreadable certificate).
    #[error("{0}")]
    Setup(String),
}

impl StoreError {
    /// Whether this error says the store cannot serve (a transport failure, a deadline, a server
    /// that refuses every call), as opposed to an answer to this one call. Only these count
    /// toward the circuit breaker: a caller that can provoke a script error must not be able to
    /// open it for everyone.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Timeout(_) | StoreError::Redis(_) | StoreError::Unavailable(_) => true,
            StoreError::Script(_) | StoreError::Protocol(_) | StoreError::Setup(_) => false,
        }
    }

    /// The `error` label of `sluice_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Redis(_) => "redis",
            StoreError::Script(_) => "script",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Protocol(_) => "protocol",
            StoreError::Setup(_) => "setup",
        }
    }
}

pub type StoreFuture<'a, T = Vec<Outcome>> =
    Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The keys of one named limiter (native API). They share one Redis Cluster hash tag, so one
/// script can read the config and decide on the state atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterKeys {
    pub config: String,
    /// State and epoch (which config generation the state belongs to) shared by all callers.
    pub shared: StateKeys,
    /// The calling client's, used when the limiter is per client.
    pub client: Option<StateKeys>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateKeys {
    pub state: String,
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

/// How `set_limiter` treats an existing limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Only create; an existing limiter is left alone.
    TrySet,
    UpdateKeepState,
    UpdateResetState,
}

/// What an acquisition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    NoSuchLimiter,
    /// The limiter is per client and the call named none.
    NeedsClient,
    /// The outcome and the limiter's capacity at that moment.
    Decided {
        outcome: Outcome,
        capacity: u64,
    },
}

/// An operation on the registry of named limiters: which exist, and until when each is kept
/// while nobody uses it. Times are on the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryOp<'a> {
    /// Registers `name`, or keeps it another `idle_ms` if it is registered; a new name is
    /// refused while `max` names are live (0: no maximum).
    Touch {
        name: &'a str,
        idle_ms: u64,
        max: u64,
    },
    /// Removes and returns up to `at_most` names whose time has passed.
    TakeExpired { at_most: usize },
    /// Removes `name`.
    Remove { name: &'a str },
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

pub trait Store: Send + Sync + Debug {
    /// Decides every check, returning one outcome per check in the same order.
    fn check<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a>;

    /// Creates or changes a named limiter; returns whether it was written and the record now in
    /// force.
    fn set_limiter<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, (bool, LimiterRecord)>;

    fn get_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, Option<LimiterRecord>>;

    /// Removes the config and the shared state; returns whether a config existed.
    fn delete_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, bool>;

    /// Takes `permits` (0: only looks) under the limiter's current config, atomically with
    /// reading it.
    fn acquire<'a>(&'a self, keys: &'a LimiterKeys, permits: u64) -> StoreFuture<'a, Acquisition>;

    /// Changes or reads the registry of named limiters kept under `key`.
    fn registry<'a>(&'a self, key: &'a str, op: RegistryOp<'a>) -> StoreFuture<'a, RegistryReply>;

    /// A short name for logs and health output.
    fn kind(&self) -> &'static str;
}

/// Shared fixed-window arithmetic, so both stores (and the Lua script, by the same formula)
/// derive admitted/remaining/reset identically from the count.
pub(crate) fn fixed_window_outcome(
    count: u64,
    limit: u64,
    window_secs: u64,
    window_start: u64,
    now_ms: u64,
) -> Outcome {
    let window_ms = window_secs * 1000;
    let end_ms = (window_start + window_secs) * 1000;
    let reset_ms = end_ms.saturating_sub(now_ms).clamp(1, window_ms);
    Outcome {
        admitted: count <= limit,
        remaining: limit.saturating_sub(count),
        reset_ms,
        used: count,
    }
}
