//! Sluice's native API (`sluice.v1.Limiter`) from Rust: named limiters that live in Sluice's
//! store, created with [`Client::set_rate`] and spent with [`Client::try_acquire`] and
//! [`Client::acquire`]. Sluice serves it only with `LIMITER_API_ENABLED=true`.
//!
//! Each of Sluice's answers that is about the request maps to one [`LimiterError`] variant, so
//! a caller can match on "no such limiter" or "would wait too long" without reading status codes.
//! The protocol's enums have counterparts of the crate's own ([`Algorithm`], [`Mode`],
//! [`SetMode`]), so the API does not change with the generated code.

use std::time::Duration;

use crate::client::{AnsweredBy, Client, FailurePolicy};
use crate::error::{Error, ErrorKind, GrpcCode};
use crate::proto::sluice::v1 as wire;

/// How a limiter's permits come back (the algorithms of Sluice's config, README "Algorithms").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// At most `rate` per window of `interval`, windows aligned on the epoch.
    FixedWindow,
    /// At most `rate` in any trailing `interval`, each acquisition logged.
    SlidingWindowLog,
    /// About `rate` per trailing `interval`, from the current and previous windows' counts.
    SlidingWindowCounter,
    /// At most `burst` at once, then `rate` per `interval`.
    TokenBucket,
    /// The token bucket's rule as the generic cell rate algorithm (burst tolerance `burst`).
    Gcra,
    /// The token bucket's rule as a bucket that drains `rate` per `interval`.
    LeakyBucket,
    /// One at a time, spaced by an interval that shrinks from `cold_factor` times the full
    /// rate's to the full rate's over the warm-up period ([`LimiterConfig::warm_up`]).
    WarmUp,
    /// At most `rate` held at once: each acquisition answers a lease
    /// ([`Acquired::lease_id`]), given back by [`Client::release`] or, if never given back,
    /// after `interval` ([`crate::SluiceLeaseLayer`] holds one for a request's life).
    Concurrency,
}

impl From<Algorithm> for wire::Algorithm {
    fn from(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::FixedWindow => wire::Algorithm::FixedWindow,
            Algorithm::SlidingWindowLog => wire::Algorithm::SlidingWindowLog,
            Algorithm::SlidingWindowCounter => wire::Algorithm::SlidingWindowCounter,
            Algorithm::TokenBucket => wire::Algorithm::TokenBucket,
            Algorithm::Gcra => wire::Algorithm::Gcra,
            Algorithm::LeakyBucket => wire::Algorithm::LeakyBucket,
            Algorithm::WarmUp => wire::Algorithm::WarmUp,
            Algorithm::Concurrency => wire::Algorithm::Concurrency,
        }
    }
}

impl Algorithm {
    fn from_wire(number: i32) -> Option<Self> {
        Some(match wire::Algorithm::try_from(number).ok()? {
            wire::Algorithm::Unspecified => return None,
            wire::Algorithm::FixedWindow => Algorithm::FixedWindow,
            wire::Algorithm::SlidingWindowLog => Algorithm::SlidingWindowLog,
            wire::Algorithm::SlidingWindowCounter => Algorithm::SlidingWindowCounter,
            wire::Algorithm::TokenBucket => Algorithm::TokenBucket,
            wire::Algorithm::Gcra => Algorithm::Gcra,
            wire::Algorithm::LeakyBucket => Algorithm::LeakyBucket,
            wire::Algorithm::WarmUp => Algorithm::WarmUp,
            wire::Algorithm::Concurrency => Algorithm::Concurrency,
        })
    }
}

/// Whose budget an acquisition spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Mode {
    /// One budget shared by every caller.
    #[default]
    Overall,
    /// A budget per `client_id`.
    PerClient,
}

impl From<Mode> for wire::Mode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Overall => wire::Mode::Overall,
            Mode::PerClient => wire::Mode::PerClient,
        }
    }
}

impl Mode {
    fn from_wire(number: i32) -> Option<Self> {
        Some(match wire::Mode::try_from(number).ok()? {
            wire::Mode::Overall => Mode::Overall,
            wire::Mode::PerClient => Mode::PerClient,
        })
    }
}

/// What [`Client::set_rate`] does to a limiter that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SetMode {
    /// Create the limiter only if it does not exist; never change an existing one.
    TrySet,
    /// Create or replace the config; what is already counted stays in force.
    UpdateKeepState,
    /// Create or replace the config, and start from an empty state.
    UpdateResetState,
}

impl From<SetMode> for wire::SetMode {
    fn from(mode: SetMode) -> Self {
        match mode {
            SetMode::TrySet => wire::SetMode::TrySet,
            SetMode::UpdateKeepState => wire::SetMode::UpdateKeepState,
            SetMode::UpdateResetState => wire::SetMode::UpdateResetState,
        }
    }
}

/// Why a native API call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// `NOT_FOUND`: no limiter of that name (create it with [`Client::set_rate`]).
    #[error("no such limiter: {0}")]
    NotFound(String),
    /// `INVALID_ARGUMENT`: a config Sluice refuses, more permits than the limiter can ever
    /// grant, a per-client limiter called without a client id.
    #[error("refused by Sluice: {0}")]
    Invalid(String),
    /// `DEADLINE_EXCEEDED` from [`Client::acquire`]: the wait would pass Sluice's
    /// `LIMITER_MAX_WAIT`.
    #[error("the wait would be longer than Sluice allows: {0}")]
    WaitTooLong(String),
    /// `RESOURCE_EXHAUSTED`: `LIMITER_MAX_COUNT` limiters exist, or a per-client limiter holds
    /// `LIMITER_MAX_CLIENTS` clients.
    #[error("Sluice holds no more limiters or clients: {0}")]
    TooMany(String),
    /// `UNAUTHENTICATED`: the bearer token is missing or wrong.
    #[error("Sluice refused the bearer token: {0}")]
    Unauthenticated(String),
    /// Any other failure, including those the failure policy covers ([`Error::is_unanswered`]).
    #[error(transparent)]
    Call(#[from] Error),
}

impl LimiterError {
    fn from_call(error: Error, waiting: bool) -> Self {
        let Some(code) = error.code() else {
            return LimiterError::Call(error);
        };
        let message = error.message().to_string();
        match code {
            GrpcCode::NotFound => LimiterError::NotFound(message),
            GrpcCode::InvalidArgument => LimiterError::Invalid(message),
            // Only `Acquire` answers DEADLINE_EXCEEDED for its maximum wait; elsewhere it is a
            // deadline like any other.
            GrpcCode::DeadlineExceeded if waiting => LimiterError::WaitTooLong(message),
            GrpcCode::ResourceExhausted => LimiterError::TooMany(message),
            GrpcCode::Unauthenticated => LimiterError::Unauthenticated(message),
            _ => LimiterError::Call(error),
        }
    }
}

/// A limiter's config: `rate` permits per `interval` under `algorithm`; made with
/// [`LimiterConfig::new`], the rest set with the methods of the fields' names.
///
/// ```
/// use std::time::Duration;
/// use sluice_client::LimiterConfig;
/// use sluice_client::limiter::{Algorithm, Mode};
///
/// let config = LimiterConfig::new("exports", Algorithm::TokenBucket, 5, Duration::from_secs(1))
///     .burst(2)
///     .mode(Mode::PerClient);
/// assert_eq!((config.rate, config.burst), (5, 2));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LimiterConfig {
    /// The limiter's name, which every call on it gives.
    pub name: String,
    /// How permits come back (token bucket, fixed window, ...).
    pub algorithm: Algorithm,
    /// Permits per `interval`.
    pub rate: u64,
    /// The period `rate` is counted over.
    pub interval: Duration,
    /// Bucket algorithms: most permits taken at once; 0 means `rate`.
    pub burst: u64,
    /// One budget for all callers (`OVERALL`), or one per `client_id` (`PER_CLIENT`).
    pub mode: Mode,
    /// `WARM_UP` only: how long the rate takes to climb, and how much slower it starts.
    pub warm_up: Option<(Duration, f64)>,
}

impl LimiterConfig {
    /// `rate` per `interval` under `algorithm`, one budget for every caller.
    pub fn new(
        name: impl Into<String>,
        algorithm: Algorithm,
        rate: u64,
        interval: Duration,
    ) -> Self {
        Self {
            name: name.into(),
            algorithm,
            rate,
            interval,
            burst: 0,
            mode: Mode::Overall,
            warm_up: None,
        }
    }

    /// Bucket algorithms: most permits taken at once (0, the default, means `rate`).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = burst;
        self
    }

    /// One budget for all callers ([`Mode::Overall`], the default), or one per `client_id`
    /// ([`Mode::PerClient`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// [`Algorithm::WarmUp`] only: the rate climbs to `rate` over `period`, starting
    /// `cold_factor` times slower.
    pub fn warm_up(mut self, period: Duration, cold_factor: f64) -> Self {
        self.warm_up = Some((period, cold_factor));
        self
    }

    fn into_wire(self) -> wire::LimiterConfig {
        let (warmup, cold_factor) = self.warm_up.unzip();
        wire::LimiterConfig {
            name: self.name,
            algorithm: wire::Algorithm::from(self.algorithm) as i32,
            rate: self.rate,
            interval: wire_duration(self.interval),
            burst: self.burst,
            mode: wire::Mode::from(self.mode) as i32,
            warmup_period: warmup.and_then(wire_duration),
            cold_factor: cold_factor.unwrap_or_default(),
        }
    }

    /// The config Sluice reports; `None` for an algorithm or mode this crate does not know.
    fn from_wire(config: wire::LimiterConfig) -> Option<Self> {
        let duration = |d: Option<prost_types::Duration>| {
            d.and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default()
        };
        let warm_up = config
            .warmup_period
            .map(|w| (duration(Some(w)), config.cold_factor));
        Some(Self {
            algorithm: Algorithm::from_wire(config.algorithm)?,
            mode: Mode::from_wire(config.mode)?,
            interval: duration(config.interval),
            name: config.name,
            rate: config.rate,
            burst: config.burst,
            warm_up,
        })
    }
}

/// The answer to [`Client::set_rate`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RateSet {
    /// False when `TRY_SET` found a limiter and left it alone.
    pub applied: bool,
    /// The config in force after the call; `None` if Sluice sent none, or one with an
    /// algorithm or mode this crate does not know (a newer Sluice's).
    pub config: Option<LimiterConfig>,
    /// The limiter starts from an empty state because of this call.
    pub state_reset: bool,
}

/// The answer to an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquired {
    /// The permits were taken.
    pub acquired: bool,
    /// How long Sluice waited before answering.
    pub waited: Duration,
    /// Permits left after the call.
    pub remaining: u64,
    /// When refused: how long until the same request would succeed.
    pub retry_after: Duration,
    /// Sluice, or the failure policy when Sluice could not answer.
    pub answered_by: AnsweredBy,
    /// A [`Algorithm::Concurrency`] limiter's grant: what [`Client::release`] gives back.
    /// `None` for other limiters, refusals and the failure policy's grants.
    pub lease_id: Option<String>,
}

/// The answer to [`Client::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released {
    /// False when nothing was given back: the lease had expired or was released already.
    pub released: bool,
    /// Permits that could be acquired now.
    pub remaining: u64,
}

impl Acquired {
    fn from_wire(response: wire::AcquireResponse) -> Self {
        let duration = |d: Option<prost_types::Duration>| {
            d.and_then(|d| d.try_into().ok()).unwrap_or_default()
        };
        Self {
            acquired: response.acquired,
            waited: duration(response.waited),
            remaining: response.remaining,
            retry_after: duration(response.retry_after),
            answered_by: AnsweredBy::Sluice,
            lease_id: (!response.lease_id.is_empty()).then_some(response.lease_id),
        }
    }
}

/// In the calls below, `client_id` names the caller of a `PER_CLIENT` limiter (its own budget);
/// `OVERALL` limiters ignore it, so pass `""`.
impl Client {
    /// Creates or changes limiter `config.name` (see [`SetMode`]).
    pub async fn set_rate(
        &self,
        config: LimiterConfig,
        mode: SetMode,
    ) -> Result<RateSet, LimiterError> {
        let message = wire::SetRateRequest {
            config: Some(config.into_wire()),
            set_mode: wire::SetMode::from(mode) as i32,
        };
        let mut api = self.limiter.clone();
        let deadline = self.deadline();
        let call = api.set_rate(self.request(message, deadline));
        let set = Client::call(deadline, call)
            .await
            .map_err(|e| LimiterError::from_call(e, false))?;
        Ok(RateSet {
            applied: set.applied,
            config: set.config.and_then(LimiterConfig::from_wire),
            state_reset: set.state_reset,
        })
    }

    /// Takes `permits` (0 means 1) if Sluice can grant them within `wait`; Sluice waits, so a
    /// refusal comes after at most `wait`. The call's deadline is `wait` plus the client's
    /// deadline. A refusal takes nothing.
    pub async fn try_acquire(
        &self,
        name: &str,
        client_id: &str,
        permits: u64,
        wait: Duration,
    ) -> Result<Acquired, LimiterError> {
        let message = wire::TryAcquireRequest {
            name: name.to_string(),
            permits,
            timeout: wire_duration(wait),
            client_id: client_id.to_string(),
        };
        let mut api = self.limiter.clone();
        let deadline = wait.saturating_add(self.deadline());
        let call = api.try_acquire(self.request(message, deadline));
        self.acquisition(Client::call(deadline, call).await, false)
    }

    /// Takes `permits`, letting Sluice wait as long as needed within `deadline` (sent as
    /// `grpc-timeout`: Sluice stops waiting when it passes, and nothing is taken).
    /// [`LimiterError::WaitTooLong`] when the wait would pass Sluice's `LIMITER_MAX_WAIT`;
    /// [`LimiterError::Call`] with [`ErrorKind::Deadline`] when `deadline` passes first. A
    /// deadline passing is an answer here (the permits did not come in time), so the failure
    /// policy never turns it into permits; it covers the other failures.
    pub async fn acquire(
        &self,
        name: &str,
        client_id: &str,
        permits: u64,
        deadline: Duration,
    ) -> Result<Acquired, LimiterError> {
        let message = wire::AcquireRequest {
            name: name.to_string(),
            permits,
            client_id: client_id.to_string(),
        };
        let mut api = self.limiter.clone();
        let call = api.acquire(self.request(message, deadline));
        self.acquisition(Client::call(deadline, call).await, true)
    }

    /// The most permits a `try_acquire` would get now, taking none.
    pub async fn available_permits(
        &self,
        name: &str,
        client_id: &str,
    ) -> Result<u64, LimiterError> {
        let message = wire::AvailablePermitsRequest {
            name: name.to_string(),
            client_id: client_id.to_string(),
        };
        let mut api = self.limiter.clone();
        let deadline = self.deadline();
        let call = api.available_permits(self.request(message, deadline));
        let available = Client::call(deadline, call)
            .await
            .map_err(|e| LimiterError::from_call(e, false))?;
        Ok(available.permits)
    }

    /// Gives back the leases `lease_id` names ([`Acquired::lease_id`]) to the concurrency
    /// limiter `name`; `client_id` as in the acquisition. Not covered by the failure policy:
    /// a release that fails leaves the lease to expire after the limiter's interval.
    pub async fn release(
        &self,
        name: &str,
        client_id: &str,
        lease_id: &str,
    ) -> Result<Released, LimiterError> {
        let message = wire::ReleaseRequest {
            name: name.to_string(),
            lease_id: lease_id.to_string(),
            client_id: client_id.to_string(),
        };
        let mut api = self.limiter.clone();
        let deadline = self.deadline();
        let call = api.release(self.request(message, deadline));
        let released = Client::call(deadline, call)
            .await
            .map_err(|e| LimiterError::from_call(e, false))?;
        Ok(Released {
            released: released.released,
            remaining: released.remaining,
        })
    }

    /// Removes limiter `name` and its state; false when there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, LimiterError> {
        let message = wire::DeleteRequest {
            name: name.to_string(),
        };
        let mut api = self.limiter.clone();
        let deadline = self.deadline();
        let call = api.delete(self.request(message, deadline));
        let deleted = Client::call(deadline, call)
            .await
            .map_err(|e| LimiterError::from_call(e, false))?;
        Ok(deleted.deleted)
    }

    /// An acquisition's result under the failure policy. `waiting` for `Acquire`, whose wait
    /// ends in answers that look like failures: Sluice's DEADLINE_EXCEEDED (the wait would be
    /// too long) and the call's own deadline passing (the permits did not come in time). Both
    /// are refusals, so the policy never turns them into permits.
    fn acquisition(
        &self,
        result: Result<wire::AcquireResponse, Error>,
        waiting: bool,
    ) -> Result<Acquired, LimiterError> {
        let error = match result {
            Ok(response) => return Ok(Acquired::from_wire(response)),
            Err(error) => error,
        };
        let refused_by_waiting = waiting && ends_a_wait(&error);
        if !refused_by_waiting && error.is_unanswered() && self.policy == FailurePolicy::Open {
            return Ok(Acquired {
                acquired: true,
                waited: Duration::ZERO,
                remaining: 0,
                retry_after: Duration::ZERO,
                answered_by: AnsweredBy::FailurePolicy(error.to_string()),
                lease_id: None,
            });
        }
        Err(LimiterError::from_call(error, waiting))
    }
}

/// How a wait ends without permits: the call's deadline passed (here, or at Sluice, which
/// answers `CANCELLED` when a call's `grpc-timeout` passes), or Sluice's maximum wait
/// (`DEADLINE_EXCEEDED`).
fn ends_a_wait(error: &Error) -> bool {
    error.kind() == ErrorKind::Deadline
        || matches!(
            error.code(),
            Some(GrpcCode::Cancelled | GrpcCode::DeadlineExceeded)
        )
}

fn wire_duration(d: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}
