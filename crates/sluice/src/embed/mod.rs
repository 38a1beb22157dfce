//! The façade for a Rust service that wants Sluice's limits in-process: [`Limits`] (a loaded
//! configuration), a [`Limiter`] on a store, and [`Limiter::check`], which answers a
//! [`Decision`] for one set of descriptor entries, with no protocol type in sight.
//!
//! It is a thin layer over the decision path the server runs ([`crate::rls::RateLimiter`]): a check
//! becomes a one-descriptor `RateLimitRequest` and the answer is read back from the response,
//! so matching, counter keys, the algorithms and the stores are exactly the server's, and so
//! are its answers. The server does not use it: it calls the decision path directly, with the
//! caller's deadline and the protocol's messages it already has. Why it looks as it does is in
//! docs/library.md ("The façade").
//!
//! Files: the limiter, its builder and errors here; [`Limits`] in `limits.rs`; [`Decision`] in
//! `decision.rs`.

mod decision;
mod limits;

use std::sync::Arc;

pub use decision::{AppliedLimit, Decision};
pub use limits::Limits;

use crate::clock::{Clock, SystemClock};
use crate::config::RateLimitConfig;
use crate::proto::{DescriptorEntry, RateLimitDescriptor, RateLimitRequest};
use crate::rls::{KeyBuilder, PrefixError, RateLimiter, RlsError, RlsOptions};
use crate::store::{CounterStore, MemoryStore, MemoryStoreOptions, StoreError};

/// Why a check got no decision, or a limiter could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The check itself is wrong (an empty domain, no entries); retrying cannot help.
    #[error("invalid check: {0}")]
    InvalidRequest(String),
    /// The store could not decide, or (building a limiter on Redis) could not be reached. The hits
    /// may or may not have been counted. Whether to admit the request anyway (fail open) or
    /// refuse it is the caller's choice: the façade never guesses.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The key prefix given to [`LimiterBuilder::key_prefix`] is not one counters can be
    /// named under.
    #[error(transparent)]
    KeyPrefix(#[from] PrefixError),
}

impl From<RlsError> for Error {
    fn from(error: RlsError) -> Error {
        match error {
            RlsError::InvalidRequest(reason) => Error::InvalidRequest(reason),
            // Cannot happen: a `Limiter` is built with its limits and never loses them.
            RlsError::NoConfig => Error::InvalidRequest(error.to_string()),
            RlsError::Store(e) | RlsError::CallerDeadline(e) => Error::Store(e),
        }
    }
}

/// Limits enforced in-process, on a store: cheap to clone (clones share the store and the
/// limits), so a service keeps one in its state and every handler checks through it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = sluice::Limits::from_yaml(
///     "
/// domain: api
/// descriptors:
///   - key: api_key
///     rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_log}
/// ",
/// )?;
/// let limiter = sluice::Limiter::memory(limits);
/// for expected in [true, true, false] {
///     let decision = limiter.check("api", &[("api_key", "k-1")], 1).await?;
///     assert_eq!(decision.allowed, expected);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Limiter {
    rls: Arc<RateLimiter>,
}

impl Limiter {
    /// A limiter on an in-process store of its own, with the store's default bound (a million
    /// live counters). Called inside a Tokio runtime, the store also sweeps expired counters.
    pub fn memory(limits: Limits) -> Limiter {
        Limiter::builder(limits).with_keys(KeyBuilder::default(), memory_store)
    }

    /// A limiter on Redis ([`RedisOptions::new`](crate::store::redis::RedisOptions::new) for a
    /// single server's URL), behind a circuit breaker as in the server: while Redis is down,
    /// checks fail at once with [`Error::Store`] instead of each waiting out the timeout, and
    /// the breaker probes Redis on its own until it answers again. Fails when Redis does not
    /// answer this first call: whether to start anyway is the caller's choice.
    #[cfg(feature = "redis")]
    pub async fn redis(
        limits: Limits,
        options: crate::store::RedisOptions,
    ) -> Result<Limiter, Error> {
        Limiter::builder(limits).build_redis(options).await
    }

    /// A builder for a limiter with a key prefix, a clock, the decision path's options or a
    /// store of the caller's making.
    pub fn builder(limits: Limits) -> LimiterBuilder {
        LimiterBuilder {
            limits,
            key_prefix: String::new(),
            clock: Arc::new(SystemClock),
            options: RlsOptions::default(),
        }
    }

    /// Decides one request of `domain` described by `entries` (the descriptor's `(key, value)`
    /// pairs, in order, matched as Envoy's descriptors are), charging `hits` when it is
    /// admitted (0 only looks). A request no limit matches is allowed, with no limit named.
    ///
    /// Fails with [`Error::InvalidRequest`] for an empty domain or no entries, and with
    /// [`Error::Store`] when the store cannot decide.
    pub async fn check(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        hits: u64,
    ) -> Result<Decision, Error> {
        if entries.is_empty() {
            // Envoy's rule would admit it unjudged: a caller that sends none has a bug.
            return Err(Error::InvalidRequest(
                "a check names at least one (key, value) entry".into(),
            ));
        }
        let descriptor = RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| DescriptorEntry {
                    key: key.as_bytes().to_vec(),
                    value: value.as_bytes().to_vec(),
                })
                .collect(),
            // The descriptor's own cost wins over the request's, and 0 means "only look".
            hits_addend: Some(hits),
            ..Default::default()
        };
        let request = RateLimitRequest {
            domain: domain.as_bytes().to_vec(),
            descriptors: vec![descriptor],
            hits_addend: 0,
        };
        let response = self.rls.should_rate_limit(&request, None).await?;
        Ok(Decision::from_response(&response))
    }

    /// Replaces the limits; checks already running finish under the old ones. Counters are not
    /// reset: they are named after the descriptor, not the limit, so a changed number applies
    /// to what was already counted.
    pub fn set_limits(&self, limits: Limits) {
        self.rls.set_config(limits.config().clone());
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        // A limiter is built with its limits; the empty default is never seen.
        let config = self.rls.config();
        config.map_or_else(|| RateLimitConfig::default().into(), Limits::from)
    }

    /// The decision path underneath, for what the façade does not offer (several descriptors
    /// in one atomic request, Envoy's overrides, response headers).
    pub fn rate_limiter(&self) -> &Arc<RateLimiter> {
        &self.rls
    }
}

/// A [`Limiter`] with more said than `Limiter::memory` and `Limiter::redis` say; finished by
/// one of its `build_*` methods, which picks the store.
#[derive(Debug)]
#[must_use = "a builder does nothing until one of its build_* methods is called"]
pub struct LimiterBuilder {
    limits: Limits,
    key_prefix: String,
    clock: Arc<dyn Clock>,
    options: RlsOptions,
}

impl LimiterBuilder {
    /// Names every counter under `prefix`, so that services sharing one Redis keep apart
    /// (upstream's `CACHE_KEY_PREFIX`). It may not contain `{` or `}` (Redis Cluster hash tags).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The clock fixed windows are picked by, and the memory store's (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests). Redis's scripts keep Redis's own.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The decision path's options (input bounds, the over-limit cache, shadow and quota
    /// modes, the failure policy); the defaults suit most services.
    pub fn options(mut self, options: RlsOptions) -> Self {
        self.options = options;
        self
    }

    /// On an in-process store of its own, as [`Limiter::memory`].
    pub fn build_memory(self) -> Result<Limiter, Error> {
        let keys = KeyBuilder::new(&self.key_prefix)?;
        Ok(self.with_keys(keys, memory_store))
    }

    /// On Redis, as [`Limiter::redis`].
    #[cfg(feature = "redis")]
    pub async fn build_redis(self, options: crate::store::RedisOptions) -> Result<Limiter, Error> {
        let keys = KeyBuilder::new(&self.key_prefix)?;
        let store = guarded_redis(options).await?;
        Ok(self.with_keys(keys, |_| store))
    }

    /// On `store`: one made with other options, or with layers of the caller's choosing
    /// ([`store::layers`](crate::store::layers)).
    pub fn build_on(self, store: Arc<dyn CounterStore>) -> Result<Limiter, Error> {
        let keys = KeyBuilder::new(&self.key_prefix)?;
        Ok(self.with_keys(keys, |_| store))
    }

    /// The limiter on the store `store` makes with the builder's clock.
    fn with_keys(
        self,
        keys: KeyBuilder,
        store: impl FnOnce(&Arc<dyn Clock>) -> Arc<dyn CounterStore>,
    ) -> Limiter {
        let store = store(&self.clock);
        let rls = RateLimiter::new(store, keys, self.clock, self.options);
        rls.set_config(self.limits.config().clone());
        Limiter { rls: Arc::new(rls) }
    }
}

/// The memory store with its default bound, on `clock`.
fn memory_store(clock: &Arc<dyn Clock>) -> Arc<dyn CounterStore> {
    Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ))
}

/// A Redis store that answered once, behind a circuit breaker whose probe runs while it is
/// open, as the server stacks it (`app::stores`), without the server's metrics.
#[cfg(feature = "redis")]
async fn guarded_redis(
    options: crate::store::RedisOptions,
) -> Result<Arc<dyn CounterStore>, StoreError> {
    use crate::store::RedisStore;
    use crate::store::layers::Layered;
    use crate::store::layers::breaker::{Breaker, BreakerOptions};
    use crate::store::redis::StartupRetry;

    let store = RedisStore::new(options)?;
    // Give up after the first try: a service decides itself whether to wait for Redis.
    let once = StartupRetry::within(Some(std::time::Duration::ZERO));
    store.wait_until_ready(&once).await?;
    let guarded = Arc::new(Layered::new(Breaker::new(BreakerOptions::default()), store));
    // Ends when the limiter, and so the store, is dropped.
    tokio::spawn(Layered::probe_while_open(
        Arc::downgrade(&guarded),
        RedisStore::probe,
    ));
    Ok(guarded)
}
