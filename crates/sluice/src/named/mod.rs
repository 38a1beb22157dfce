//! Named limiters: the native API's behaviour (`sluice.v1.Limiter`), between its gRPC adapter
//! (`server::named`) and the store.
//!
//! A limiter's config is kept in the store next to its state (same hash tag), and every
//! acquisition reads it in the same atomic step, so a change made through one replica applies on
//! every replica's next call. Set semantics follow what Redisson users know, without its traps:
//! `TRY_SET` never overwrites (Redisson's `trySetRate`), `UPDATE_KEEP_STATE` changes the rate
//! and keeps what was counted when the new algorithm reads the same state (otherwise it starts
//! afresh and says so), `UPDATE_RESET_STATE` starts over (Redisson's `setRate`). Waiting is
//! done here, asynchronously, for as long as the algorithm says; a request that could never be
//! granted is refused at once instead of waiting forever, and a refused attempt never changes
//! the limiter's state.
//!
//! # Waiting in line
//!
//! Callers that wait for the same budget on one replica form a line (`Line`) and are served in
//! arrival order. A budget is the limiter's for an `OVERALL` limiter, whatever client ids the
//! callers name (the store ignores them there), and the client's for a `PER_CLIENT` one; the
//! mode is learnt from the store's replies (and from `SetRate` on this replica), so a caller of
//! a limiter this replica has not used yet makes one store call before it joins a line. Only
//! the caller at its head asks the store, once per wake-up, after the delay
//! the algorithm gave it; the others wait on the line without store calls. When the head is
//! granted the last permit, it leaves the next one a hint (the shortest time seen between two
//! grants), so a steady-rate limiter costs about one store call per grant instead of one per
//! waiter per wake-up. A caller that does not wait (timeout 0) is answered at once, line or not. Callers on
//! other replicas are not in this line; the store still decides every grant.

mod lease;

pub use lease::{LeaseId, MAX_LEASE_ID_BYTES, Released};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;

use crate::config::Algorithm as ConfigAlgorithm;
use crate::proto::sluice::v1::{Algorithm as ApiAlgorithm, LimiterConfig, Mode};
use crate::rls::{KeyBuilder, rule_for};
use crate::store::{
    Acquisition, Call, LimiterRecord, LimiterStore, Outcome, RegistryOp, RegistryReply, SetMode,
    StoreError,
};

/// Longest limiter name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Longest client id, in bytes.
pub const MAX_CLIENT_ID_BYTES: usize = 256;

/// How many limiters may exist and how long an unused one is kept: the native API's state is
/// bounded whatever its callers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `LIMITER_MAX_COUNT`: live limiters at most; creating one more is RESOURCE_EXHAUSTED.
    /// 0: no maximum.
    pub max_count: u64,
    /// `LIMITER_IDLE_EXPIRY`: a limiter neither set nor acquired from for this long is deleted
    /// (config and shared state; per-client states expire on their own).
    pub idle: Duration,
    /// `LIMITER_MAX_CLIENTS`: client states one `PER_CLIENT` limiter keeps at most; a new
    /// client beyond is RESOURCE_EXHAUSTED until one expires (never by pushing out another
    /// client's state, which would reset its budget). 0: no cap.
    pub max_clients: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_count: 10_000,
            idle: Duration::from_secs(7 * 86_400),
            max_clients: 100_000,
        }
    }
}

/// Longest `interval` and `warmup_period`: 366 days, a leap year's fixed window.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 86_400);

/// Most permits one call may ask for: no limiter grants more at once (rate and burst are at most
/// this), and anything larger is refused before it reaches the store, whose scripts could not
/// represent every such number.
pub const MAX_PERMITS: u64 = u32::MAX as u64;

/// Why a named limiter call got no answer. Each maps to one gRPC status (`server::named`).
#[derive(Debug, thiserror::Error)]
pub enum NamedError {
    /// A field of the call is out of range or malformed; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The limiter does not exist (never set, deleted, or swept as idle).
    #[error("no limiter named {0:?}")]
    NotFound(String),
    /// The limiter is `PER_CLIENT` and the call named no client.
    #[error("limiter {0:?} is per client: the call must name a client_id")]
    NeedsClient(String),
    /// More permits than the limiter can ever grant at once: waiting would never end.
    #[error(
        "{permits} permits can never be granted: limiter {name:?} grants at most {capacity} at once"
    )]
    TooManyPermits {
        /// The limiter.
        name: String,
        /// What the call asked for.
        permits: u64,
        /// The most it grants at once.
        capacity: u64,
    },
    /// `acquire` would have to wait longer than `LIMITER_MAX_WAIT`, the server's bound (given).
    #[error("acquiring would wait longer than the server's maximum of {0:?}")]
    WaitTooLong(Duration),
    /// Creating one more limiter would pass `LIMITER_MAX_COUNT` (the count is given).
    #[error("{0} limiters exist, the most this server keeps (LIMITER_MAX_COUNT)")]
    TooManyLimiters(u64),
    /// A new client would pass a bound on client states; it is not admitted until one expires.
    #[error(
        "limiter {name:?} keeps the state of {max} clients, the most it may hold \
         (LIMITER_MAX_CLIENTS, or MEMORY_MAX_LIMITER_STATES over all limiters); \
         a new client gets a place when one expires"
    )]
    TooManyClients {
        /// The limiter.
        name: String,
        /// The bound reached.
        max: u64,
    },
    /// The store could not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What `set_rate` did.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSet {
    /// False when `TRY_SET` found an existing limiter.
    pub applied: bool,
    /// The limiter starts from an empty state because of this call (created, reset, or kept
    /// across a change of the state's shape).
    pub state_reset: bool,
    /// The config in force.
    pub config: LimiterConfig,
}

/// The outcome of an acquisition, after any waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The permits were granted.
    pub acquired: bool,
    /// How long the call waited in line and for the budget, on this replica.
    pub waited: Duration,
    /// Permits left after this call.
    pub remaining: u64,
    /// When not acquired: until the same request would succeed.
    pub retry_after: Duration,
    /// A concurrency limiter's grant: the leases taken, for [`NamedLimiters::release`].
    pub lease: Option<LeaseId>,
}

/// One store call's answer: the outcome, and the lease when it granted a concurrency
/// limiter's permits.
type Taken = (Outcome, Option<LeaseId>);

/// The named limiters of the native API (`sluice.v1.Limiter`): their configs live in the
/// store, so every replica on one Redis sees the same limiters; what a replica keeps to itself
/// is the order its own callers wait in.
#[derive(Debug)]
pub struct NamedLimiters {
    store: Arc<dyn LimiterStore>,
    keys: KeyBuilder,
    /// Bound of `Acquire` (and of any `TryAcquire` timeout).
    max_wait: Duration,
    /// The waiting lines, by budget (limiter name, and the client for a per-client limiter); a
    /// line is dropped when its last caller leaves.
    lines: Mutex<HashMap<Budget, Arc<Line>>>,
    /// Whether each limiter is per client, as this replica last learnt it: which line a
    /// caller joins. A change made through another replica is learnt at the next reply; until
    /// then only the order of this replica's waiters can be off, never a grant.
    modes: Mutex<HashMap<String, bool>>,
    bounds: Bounds,
    /// Where the store keeps the registry of limiters.
    registry: String,
    /// When this replica last told the registry a limiter was used: it does so at most once per
    /// [`NamedLimiters::touch_period`], not on every acquisition.
    touched: Mutex<HashMap<String, Instant>>,
}

/// A budget: a limiter's, or one client's of a per-client limiter.
type Budget = (String, Option<String>);

/// The callers of one replica waiting for one budget. tokio's mutex hands itself over in the
/// order it was asked for, which is the arrival order; it guards what the heads learnt.
#[derive(Debug, Default)]
struct Line {
    head: tokio::sync::Mutex<Hint>,
}

/// What a head leaves the next one.
#[derive(Debug, Default, Clone, Copy)]
struct Hint {
    /// When the next store call is worth making; `None`: at once.
    next_at: Option<Instant>,
    /// When the previous head was granted.
    granted_at: Option<Instant>,
    /// The shortest time seen between two grants of this line: how long one permit takes to
    /// come back. The shortest, because a late wake-up makes a period longer and must not
    /// make the next head later still.
    period: Option<Duration>,
}

impl NamedLimiters {
    /// The limiters kept in `store` under `keys`' prefix; no call waits longer than `max_wait`
    /// (`LIMITER_MAX_WAIT`). Bounded by [`Bounds::default`] until [`Self::with_bounds`].
    pub fn new(store: Arc<dyn LimiterStore>, keys: KeyBuilder, max_wait: Duration) -> Self {
        Self {
            store,
            registry: keys.limiter_registry(),
            keys,
            max_wait,
            lines: Mutex::default(),
            modes: Mutex::default(),
            bounds: Bounds::default(),
            touched: Mutex::default(),
        }
    }

    /// Bounds the limiters' number, idle time and clients (the server's `LIMITER_*` settings).
    pub fn with_bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// How often a used limiter's idle time is pushed back in the registry, per replica.
    fn touch_period(&self) -> Duration {
        self.bounds.idle / 16
    }

    fn idle_ms(&self) -> u64 {
        u64::try_from(self.bounds.idle.as_millis()).unwrap_or(u64::MAX / 4)
    }

    /// Registers `name` or keeps it for another idle period; false when the registry is full.
    async fn touch(&self, call: Call<'_>, name: &str) -> Result<bool, NamedError> {
        if self.bounds.idle.is_zero() && self.bounds.max_count == 0 {
            return Ok(true);
        }
        let op = RegistryOp::Touch {
            name,
            // Zero: kept until deleted.
            idle_ms: if self.bounds.idle.is_zero() {
                u64::MAX / 4
            } else {
                self.idle_ms()
            },
            max: self.bounds.max_count,
        };
        match self.store.registry(call, &self.registry, op).await? {
            RegistryReply::Touched(registered) => Ok(registered),
            other => Err(StoreError::Protocol(format!("registry answered {other:?}")).into()),
        }
    }

    /// After a use of `name`: pushes its idle time back, at most once per touch period.
    async fn used(&self, call: Call<'_>, name: &str) {
        if self.bounds.idle.is_zero() {
            return;
        }
        let now = Instant::now();
        {
            let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
            if touched
                .get(name)
                .is_some_and(|at| now.duration_since(*at) < self.touch_period())
            {
                return;
            }
            // Bounded like the registry: forgetting only costs an early touch.
            if touched.len() as u64 >= self.bounds.max_count.max(1024) {
                touched.clear();
            }
            touched.insert(name.to_string(), now);
        }
        // A full registry or a store error must not fail the acquisition that was granted; the
        // limiter exists, so it is kept until the sweep (a later touch registers it).
        if let Err(e) = self.touch(call, name).await {
            tracing::debug!(error = %e, limiter = name, "could not refresh the limiter's idle time");
        }
    }

    /// Deletes the limiters unused for the idle period, as the registry lists them. Every
    /// replica runs this now and then; deleting twice is harmless.
    pub(crate) async fn sweep_idle(&self) -> Result<usize, NamedError> {
        const BATCH: usize = 100;
        let call = Call::detached();
        let mut deleted = 0;
        loop {
            let op = RegistryOp::TakeExpired { at_most: BATCH };
            let RegistryReply::Expired(names) =
                self.store.registry(call, &self.registry, op).await?
            else {
                return Err(StoreError::Protocol("registry answered no names".into()).into());
            };
            for name in &names {
                self.store
                    .delete_limiter(call, &self.keys.limiter(name, None))
                    .await?;
                tracing::info!(limiter = %name, idle = ?self.bounds.idle, "idle limiter deleted");
            }
            deleted += names.len();
            if names.len() < BATCH {
                return Ok(deleted);
            }
        }
    }

    /// Sweeps idle limiters every `every` for as long as the limiters exist.
    pub async fn sweep_idle_forever(limiters: std::sync::Weak<NamedLimiters>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(limiters) = limiters.upgrade() else {
                return;
            };
            if let Err(e) = limiters.sweep_idle().await {
                tracing::warn!(error = %e, "sweeping idle limiters failed; will try again");
            }
        }
    }

    /// Whether `name` is per client, as last learnt; `None`: not known here.
    fn mode(&self, name: &str) -> Option<bool> {
        let modes = self.modes.lock().unwrap_or_else(|p| p.into_inner());
        modes.get(name).copied()
    }

    /// Remembers `name`'s mode (`None`: forgets it).
    fn learn_mode(&self, name: &str, per_client: Option<bool>) {
        let mut modes = self.modes.lock().unwrap_or_else(|p| p.into_inner());
        match per_client {
            Some(per_client) => {
                if modes.get(name) != Some(&per_client) {
                    // Bounded like the registry: forgetting costs one store call before a wait.
                    if modes.len() as u64 >= self.bounds.max_count.max(1024) {
                        modes.clear();
                    }
                    modes.insert(name.to_string(), per_client);
                }
            }
            None => {
                modes.remove(name);
            }
        }
    }

    /// The line of the budget `client` draws on, created when nobody waits on it: the
    /// limiter's, unless it is per client.
    fn line(&self, name: &str, client: &str, per_client: bool) -> (Budget, Arc<Line>) {
        let budget = (name.to_string(), per_client.then(|| client.to_string()));
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let line = lines.entry(budget.clone()).or_default().clone();
        (budget, line)
    }

    /// Drops `line` from the map when the caller leaving was its last user. Clones are only made
    /// under the map's lock, so the count cannot grow meanwhile.
    fn leave(&self, budget: &Budget, line: Arc<Line>) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&line) == 2 {
            lines.remove(budget);
        }
    }

    /// Creates or changes a limiter.
    pub async fn set_rate(
        &self,
        call: Call<'_>,
        config: LimiterConfig,
        mode: SetMode,
    ) -> Result<RateSet, NamedError> {
        let (config, record) = compile(config)?;
        if !self.touch(call, &config.name).await? {
            return Err(NamedError::TooManyLimiters(self.bounds.max_count));
        }
        let keys = self.keys.limiter(&config.name, None);
        let set = self.store.set_limiter(call, &keys, &record, mode).await?;
        self.learn_mode(&config.name, Some(set.current.per_client));
        Ok(RateSet {
            applied: set.applied,
            state_reset: set.state_reset,
            config: describe(&set.current)?,
        })
    }

    /// The config of the limiter `name` (`GetLimiter`).
    pub async fn config(&self, call: Call<'_>, name: &str) -> Result<LimiterConfig, NamedError> {
        check_name(name)?;
        let keys = self.keys.limiter(name, None);
        match self.store.get_limiter(call, &keys).await? {
            Some(record) => describe(&record),
            None => Err(NamedError::NotFound(name.to_string())),
        }
    }

    /// Deletes the limiter `name` with its states (`DeleteLimiter`); `false` when there was none.
    pub async fn delete(&self, call: Call<'_>, name: &str) -> Result<bool, NamedError> {
        check_name(name)?;
        let deleted = self
            .store
            .delete_limiter(call, &self.keys.limiter(name, None))
            .await?;
        self.learn_mode(name, None);
        self.store
            .registry(call, &self.registry, RegistryOp::Remove { name })
            .await?;
        Ok(deleted)
    }

    /// Permits that could be taken now.
    pub async fn available(
        &self,
        call: Call<'_>,
        name: &str,
        client: &str,
    ) -> Result<u64, NamedError> {
        let (outcome, _) = self.attempt(call, name, client, 0).await?;
        Ok(outcome.remaining)
    }

    /// Takes `permits`, waiting up to `timeout` (at most the server's maximum) in line behind
    /// the callers of this replica that came first (see the module doc). Dropping the future (a
    /// cancelled call) ends the wait and gives up the place in line.
    pub async fn try_acquire(
        &self,
        call: Call<'_>,
        name: &str,
        client: &str,
        permits: u64,
        timeout: Duration,
    ) -> Result<Acquired, NamedError> {
        if permits > MAX_PERMITS {
            return Err(NamedError::Invalid(format!(
                "permits must be at most {MAX_PERMITS}"
            )));
        }
        let timeout = timeout.min(self.max_wait);
        let started = Instant::now();
        // Which line to join depends on the mode; when this replica does not know it yet, the
        // first call tells it (and may already settle the request).
        let mut first = None;
        let per_client = match self.mode(name) {
            Some(per_client) => per_client,
            None => {
                let taken = self.attempt(call, name, client, permits).await?;
                if let Some(done) = settled(taken, started, timeout) {
                    return Ok(done);
                }
                first = Some(taken.0);
                self.mode(name).unwrap_or(true)
            }
        };
        let (budget, line) = self.line(name, client, per_client);
        let result = self
            .wait_in_line(call, &line, name, client, permits, timeout, started, first)
            .await;
        self.leave(&budget, line);
        result
    }

    /// Waits in `line` for `permits`. `first`: the refusal of a call already made (to learn
    /// the limiter's mode), which stands for the first attempt.
    #[allow(clippy::too_many_arguments)]
    async fn wait_in_line(
        &self,
        call: Call<'_>,
        line: &Line,
        name: &str,
        client: &str,
        permits: u64,
        timeout: Duration,
        started: Instant,
        first: Option<Outcome>,
    ) -> Result<Acquired, NamedError> {
        let settled = |taken: Taken| settled(taken, started, timeout);
        // Nobody ahead, or not willing to wait: ask at once.
        let mut refused = first;
        if refused.is_none() && (timeout.is_zero() || line.head.try_lock().is_ok()) {
            let taken = self.attempt(call, name, client, permits).await?;
            if let Some(done) = settled(taken) {
                return Ok(done);
            }
            refused = Some(taken.0);
        }
        let deadline = tokio::time::Instant::from_std(started + timeout);
        let Ok(mut hint) = tokio::time::timeout_at(deadline, line.head.lock()).await else {
            // Those ahead kept the line until the deadline.
            return Ok(Acquired {
                acquired: false,
                waited: started.elapsed(),
                remaining: 0,
                retry_after: refused.map_or(Duration::from_millis(1), |o| {
                    Duration::from_millis(o.reset_ms)
                }),
                lease: None,
            });
        };
        loop {
            // The algorithm's own delay, or the hint the previous head left.
            let wait = match refused {
                Some(outcome) => Duration::from_millis(outcome.reset_ms),
                None => hint.next_at.map_or(Duration::ZERO, |at| {
                    at.saturating_duration_since(Instant::now())
                }),
            };
            if started.elapsed() + wait > timeout {
                return Ok(Acquired {
                    acquired: false,
                    waited: started.elapsed(),
                    remaining: 0,
                    retry_after: wait.max(Duration::from_millis(1)),
                    lease: None,
                });
            }
            tokio::time::sleep(wait).await;
            let taken = self.attempt(call, name, client, permits).await?;
            let outcome = taken.0;
            if outcome.admitted {
                // When we took the last permit, the next one comes back about one period
                // later. An early guess costs one refused call, which gives the exact delay.
                let now = Instant::now();
                let period = match (hint.granted_at.map(|at| now - at), hint.period) {
                    (Some(seen), Some(known)) => Some(seen.min(known)),
                    (seen, known) => seen.or(known),
                };
                *hint = Hint {
                    next_at: period.filter(|_| outcome.remaining == 0).map(|p| now + p),
                    granted_at: Some(now),
                    period,
                };
                return Ok(answer(taken, started));
            }
            if let Some(done) = settled(taken) {
                return Ok(done);
            }
            refused = Some(outcome);
        }
    }

    /// Takes `permits`, waiting as long as needed up to the server's maximum.
    pub async fn acquire(
        &self,
        call: Call<'_>,
        name: &str,
        client: &str,
        permits: u64,
    ) -> Result<Acquired, NamedError> {
        let acquired = self
            .try_acquire(call, name, client, permits, self.max_wait)
            .await?;
        if acquired.acquired {
            Ok(acquired)
        } else {
            Err(NamedError::WaitTooLong(self.max_wait))
        }
    }

    async fn attempt(
        &self,
        call: Call<'_>,
        name: &str,
        client: &str,
        permits: u64,
    ) -> Result<Taken, NamedError> {
        check_name(name)?;
        if client.len() > MAX_CLIENT_ID_BYTES {
            return Err(NamedError::Invalid(format!(
                "a client_id may have at most {MAX_CLIENT_ID_BYTES} bytes"
            )));
        }
        let client = (!client.is_empty()).then_some(client);
        let keys = self.keys.limiter(name, client);
        let acquisition = self
            .store
            .acquire(call, &keys, permits, self.bounds.max_clients)
            .await?;
        let lease = LeaseId::of(&acquisition, permits);
        match acquisition {
            Acquisition::NoSuchLimiter => {
                self.learn_mode(name, None);
                Err(NamedError::NotFound(name.to_string()))
            }
            Acquisition::NeedsClient => {
                self.learn_mode(name, Some(true));
                Err(NamedError::NeedsClient(name.to_string()))
            }
            Acquisition::TooManyClients { max } => {
                self.learn_mode(name, Some(true));
                Err(NamedError::TooManyClients {
                    name: name.to_string(),
                    max,
                })
            }
            // Refused by the store before it touched any state.
            Acquisition::TooManyPermits { capacity } => Err(NamedError::TooManyPermits {
                name: name.to_string(),
                permits,
                capacity,
            }),
            Acquisition::Decided {
                outcome,
                per_client,
                ..
            } => {
                self.learn_mode(name, Some(per_client));
                self.used(call, name).await;
                Ok((outcome, lease))
            }
        }
    }
}

/// The reply when `outcome` settles the request: granted, or refused for longer than the
/// caller's `timeout` allows; `None` while waiting could still get it.
fn settled(taken: Taken, started: Instant, timeout: Duration) -> Option<Acquired> {
    let outcome = taken.0;
    let wait = Duration::from_millis(outcome.reset_ms);
    (outcome.admitted || started.elapsed() + wait > timeout).then(|| answer(taken, started))
}

/// The reply for a final outcome.
fn answer((outcome, lease): Taken, started: Instant) -> Acquired {
    Acquired {
        lease: lease.filter(|_| outcome.admitted),
        acquired: outcome.admitted,
        waited: started.elapsed(),
        remaining: outcome.remaining,
        retry_after: if outcome.admitted {
            Duration::ZERO
        } else {
            Duration::from_millis(outcome.reset_ms)
        },
    }
}

fn check_name(name: &str) -> Result<(), NamedError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(NamedError::Invalid(format!(
            "a limiter name must have 1 to {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Validates a config, fills its defaults, and derives what the store keeps.
fn compile(mut config: LimiterConfig) -> Result<(LimiterConfig, LimiterRecord), NamedError> {
    let invalid = |m: String| Err(NamedError::Invalid(m));
    check_name(&config.name)?;
    let interval = match config.interval.map(Duration::try_from) {
        Some(Ok(d)) if d >= Duration::from_millis(1) && d <= MAX_INTERVAL => d,
        _ => return invalid("interval must be from 1ms to 366 days".into()),
    };
    let window = interval.as_micros() as u64;
    if config.rate == 0 || config.rate > u64::from(u32::MAX) {
        return invalid(format!("rate must be from 1 to {}", u32::MAX));
    }
    if config.burst > u64::from(u32::MAX) {
        return invalid(format!("burst must be at most {}", u32::MAX));
    }
    let burst = if config.burst == 0 {
        config.rate
    } else {
        config.burst
    };
    config.burst = burst;
    let burst = u32::try_from(burst).map_err(|_| {
        NamedError::Invalid(format!(
            "burst (default: rate) must be at most {}",
            u32::MAX
        ))
    })?;
    // Unknown enum values are refused, never read as a default: a client built against a newer
    // proto must not get a limiter that counts otherwise than it asked.
    let Ok(api) = ApiAlgorithm::try_from(config.algorithm) else {
        return invalid(format!("unknown algorithm {}", config.algorithm));
    };
    let Ok(mode) = Mode::try_from(config.mode) else {
        return invalid(format!("unknown mode {}", config.mode));
    };
    let algorithm = match api {
        ApiAlgorithm::Unspecified => return invalid("algorithm is required".into()),
        ApiAlgorithm::FixedWindow => {
            if interval.subsec_nanos() != 0 {
                return invalid("a fixed_window interval must be whole seconds".into());
            }
            ConfigAlgorithm::FixedWindow
        }
        ApiAlgorithm::SlidingWindowLog => ConfigAlgorithm::SlidingWindowLog,
        ApiAlgorithm::SlidingWindowCounter => ConfigAlgorithm::SlidingWindowCounter,
        ApiAlgorithm::TokenBucket => ConfigAlgorithm::TokenBucket { burst },
        ApiAlgorithm::Gcra => ConfigAlgorithm::Gcra { burst },
        ApiAlgorithm::LeakyBucket => ConfigAlgorithm::LeakyBucket { burst },
        ApiAlgorithm::Concurrency => ConfigAlgorithm::Concurrency,
        ApiAlgorithm::WarmUp => {
            // Bounded like the interval, so that every time the algorithm derives from it
            // stays exact on both stores.
            let warmup = match config.warmup_period.map(Duration::try_from) {
                Some(Ok(d)) if d <= MAX_INTERVAL => d,
                _ => return invalid("warm_up needs a warmup_period from 1ms to 366 days".into()),
            };
            // 0 is proto3's "not set".
            let cold_factor = (config.cold_factor != 0.0).then_some(config.cold_factor);
            let algorithm = ConfigAlgorithm::warm_up(warmup, cold_factor)
                .map_err(|p| NamedError::Invalid(p.to_string()))?;
            if let ConfigAlgorithm::WarmUp { cold_factor, .. } = algorithm {
                config.cold_factor = cold_factor;
            }
            algorithm
        }
    };
    if algorithm.burst().is_none() {
        config.burst = 0;
    }
    algorithm
        .check_numbers(config.rate, window)
        .map_err(|p| NamedError::Invalid(p.reason))?;
    let capacity = algorithm.burst().map_or(config.rate, u64::from);
    let record = LimiterRecord {
        rule: rule_for(algorithm, config.rate, window),
        capacity,
        per_client: mode == Mode::PerClient,
        description: config.encode_to_vec(),
    };
    Ok((config, record))
}

fn describe(record: &LimiterRecord) -> Result<LimiterConfig, NamedError> {
    LimiterConfig::decode(record.description.as_slice())
        .map_err(|e| NamedError::Store(StoreError::Protocol(format!("stored config: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::{MemoryStore, MemoryStoreOptions};

    fn limiters() -> (NamedLimiters, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000_000_000_000_000));
        let store = Arc::new(MemoryStore::new(
            MemoryStoreOptions::default(),
            clock.clone(),
        ));
        (
            NamedLimiters::new(store, KeyBuilder::default(), Duration::from_secs(5)),
            clock,
        )
    }

    fn config(name: &str, algorithm: ApiAlgorithm, rate: u64, interval: Duration) -> LimiterConfig {
        LimiterConfig {
            name: name.into(),
            algorithm: algorithm as i32,
            rate,
            interval: Some(interval.try_into().unwrap()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn try_set_never_overwrites_and_updates_keep_or_reset() {
        let (l, _) = limiters();
        let one = config(
            "a",
            ApiAlgorithm::SlidingWindowLog,
            2,
            Duration::from_secs(60),
        );
        let set = l
            .set_rate(crate::store::Call::detached(), one.clone(), SetMode::TrySet)
            .await
            .unwrap();
        assert!(set.applied && set.state_reset);
        let other = config(
            "a",
            ApiAlgorithm::SlidingWindowLog,
            5,
            Duration::from_secs(60),
        );
        let set = l
            .set_rate(
                crate::store::Call::detached(),
                other.clone(),
                SetMode::TrySet,
            )
            .await
            .unwrap();
        assert!(!set.applied && !set.state_reset);
        assert_eq!(set.config.rate, 2);

        let take = || l.try_acquire(crate::store::Call::detached(), "a", "", 1, Duration::ZERO);
        assert!(take().await.unwrap().acquired);
        assert!(take().await.unwrap().acquired);
        assert!(!take().await.unwrap().acquired);
        // Keep state: 2 of 5 used.
        l.set_rate(
            crate::store::Call::detached(),
            other.clone(),
            SetMode::UpdateKeepState,
        )
        .await
        .unwrap();
        assert_eq!(
            l.available(crate::store::Call::detached(), "a", "")
                .await
                .unwrap(),
            3
        );
        // Reset: all 5 back.
        l.set_rate(
            crate::store::Call::detached(),
            other,
            SetMode::UpdateResetState,
        )
        .await
        .unwrap();
        assert_eq!(
            l.available(crate::store::Call::detached(), "a", "")
                .await
                .unwrap(),
            5
        );
        assert_eq!(
            l.config(crate::store::Call::detached(), "a")
                .await
                .unwrap()
                .rate,
            5
        );
    }

    #[tokio::test]
    async fn impossible_requests_and_bad_configs_are_refused() {
        let (l, _) = limiters();
        let bucket = config("b", ApiAlgorithm::TokenBucket, 10, Duration::from_secs(1));
        l.set_rate(crate::store::Call::detached(), bucket, SetMode::TrySet)
            .await
            .unwrap();
        let err = l
            .try_acquire(
                crate::store::Call::detached(),
                "b",
                "",
                11,
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, NamedError::TooManyPermits { capacity: 10, .. }),
            "{err}"
        );
        assert!(matches!(
            l.try_acquire(
                crate::store::Call::detached(),
                "nope",
                "",
                1,
                Duration::ZERO
            )
            .await,
            Err(NamedError::NotFound(_))
        ));
        let bad = config("c", ApiAlgorithm::Unspecified, 1, Duration::from_secs(1));
        assert!(matches!(
            l.set_rate(crate::store::Call::detached(), bad, SetMode::TrySet)
                .await,
            Err(NamedError::Invalid(_))
        ));
        let bad = config(
            "c",
            ApiAlgorithm::FixedWindow,
            1,
            Duration::from_millis(1500),
        );
        assert!(matches!(
            l.set_rate(crate::store::Call::detached(), bad, SetMode::TrySet)
                .await,
            Err(NamedError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn per_client_budgets_need_a_client() {
        let (l, _) = limiters();
        let mut c = config("p", ApiAlgorithm::FixedWindow, 1, Duration::from_secs(60));
        c.mode = Mode::PerClient as i32;
        l.set_rate(crate::store::Call::detached(), c, SetMode::TrySet)
            .await
            .unwrap();
        assert!(
            l.try_acquire(crate::store::Call::detached(), "p", "x", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
        assert!(
            !l.try_acquire(crate::store::Call::detached(), "p", "x", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
        assert!(
            l.try_acquire(crate::store::Call::detached(), "p", "y", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
        assert!(matches!(
            l.try_acquire(crate::store::Call::detached(), "p", "", 1, Duration::ZERO)
                .await,
            Err(NamedError::NeedsClient(_))
        ));
    }
}
