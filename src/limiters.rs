//! Named limiters: the native API's behaviour (`sluice.v1.Limiter`), between its gRPC adapter
//! (`server::limiter_api`) and the store.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use crate::config::Algorithm as ConfigAlgorithm;
use crate::limiter::{KeyBuilder, rule_for};
use crate::proto::sluice::v1::{Algorithm as ApiAlgorithm, LimiterConfig, Mode};
use crate::store::{Acquisition, LimiterRecord, SetMode, Store, StoreError};

/// Longest limiter name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Most permits one call may ask for: no limiter grants more at once (rate and burst are at most
/// this), and anything larger is refused before it reaches the store, whose scripts could not
/// represent every such number.
pub const MAX_PERMITS: u64 = u32::MAX as u64;

#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("{0}")]
    Invalid(String),
    #[error("no limiter named {0:?}")]
    NotFound(String),
    #[error("limiter {0:?} is per client: the call must name a client_id")]
    NeedsClient(String),
    #[error(
        "{permits} permits can never be granted: limiter {name:?} grants at most {capacity} at once"
    )]
    TooManyPermits {
        name: String,
        permits: u64,
        capacity: u64,
    },
    #[error("acquiring would wait longer than the server's maximum of {0:?}")]
    WaitTooLong(Duration),
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
    pub acquired: bool,
    pub waited: Duration,
    pub remaining: u64,
    /// When not acquired: until the same request would succeed.
    pub retry_after: Duration,
}

#[derive(Debug)]
pub struct NamedLimiters {
    store: Arc<dyn Store>,
    keys: KeyBuilder,
    /// Bound of `Acquire` (and of any `TryAcquire` timeout).
    max_wait: Duration,
}

impl NamedLimiters {
    pub fn new(store: Arc<dyn Store>, keys: KeyBuilder, max_wait: Duration) -> Self {
        Self {
            store,
            keys,
            max_wait,
        }
    }

    /// Creates or changes a limiter.
    pub async fn set_rate(
        &self,
        config: LimiterConfig,
        mode: SetMode,
    ) -> Result<RateSet, LimiterError> {
        let (config, record) = compile(config)?;
        let keys = self.keys.limiter(&config.name, None);
        let set = self.store.set_limiter(&keys, &record, mode).await?;
        Ok(RateSet {
            applied: set.applied,
            state_reset: set.state_reset,
            config: describe(&set.current)?,
        })
    }

    pub async fn config(&self, name: &str) -> Result<LimiterConfig, LimiterError> {
        check_name(name)?;
        let keys = self.keys.limiter(name, None);
        match self.store.get_limiter(&keys).await? {
            Some(record) => describe(&record),
            None => Err(LimiterError::NotFound(name.to_string())),
        }
    }

    pub async fn delete(&self, name: &str) -> Result<bool, LimiterError> {
        check_name(name)?;
        Ok(self
            .store
            .delete_limiter(&self.keys.limiter(name, None))
            .await?)
    }

    /// Permits that could be taken now.
    pub async fn available(&self, name: &str, client: &str) -> Result<u64, LimiterError> {
        let outcome = self.attempt(name, client, 0).await?;
        Ok(outcome.remaining)
    }

    /// Takes `permits`, waiting up to `timeout` (at most the server's maximum). Dropping the
    /// future (a cancelled call) ends the wait.
    pub async fn try_acquire(
        &self,
        name: &str,
        client: &str,
        permits: u64,
        timeout: Duration,
    ) -> Result<Acquired, LimiterError> {
        if permits > MAX_PERMITS {
            return Err(LimiterError::Invalid(format!(
                "permits must be at most {MAX_PERMITS}"
            )));
        }
        let timeout = timeout.min(self.max_wait);
        let started = Instant::now();
        loop {
            let outcome = self.attempt(name, client, permits).await?;
            let waited = started.elapsed();
            let retry_after = Duration::from_millis(outcome.reset_ms);
            if outcome.admitted || waited + retry_after > timeout {
                return Ok(Acquired {
                    acquired: outcome.admitted,
                    waited,
                    remaining: outcome.remaining,
                    retry_after: if outcome.admitted {
                        Duration::ZERO
                    } else {
                        retry_after
                    },
                });
            }
            // The algorithm's own delay: by then the same request would be admitted, unless
            // another caller took the permits first, in which case we go round again.
            tokio::time::sleep(retry_after).await;
        }
    }

    /// Takes `permits`, waiting as long as needed up to the server's maximum.
    pub async fn acquire(
        &self,
        name: &str,
        client: &str,
        permits: u64,
    ) -> Result<Acquired, LimiterError> {
        let acquired = self
            .try_acquire(name, client, permits, self.max_wait)
            .await?;
        if acquired.acquired {
            Ok(acquired)
        } else {
            Err(LimiterError::WaitTooLong(self.max_wait))
        }
    }

    async fn attempt(
        &self,
        name: &str,
        client: &str,
        permits: u64,
    ) -> Result<crate::store::Outcome, LimiterError> {
        check_name(name)?;
        let client = (!client.is_empty()).then_some(client);
        let keys = self.keys.limiter(name, client);
        match self.store.acquire(&keys, permits).await? {
            Acquisition::NoSuchLimiter => Err(LimiterError::NotFound(name.to_string())),
            Acquisition::NeedsClient => Err(LimiterError::NeedsClient(name.to_string())),
            // Refused by the store before it touched any state.
            Acquisition::TooManyPermits { capacity } => Err(LimiterError::TooManyPermits {
                name: name.to_string(),
                permits,
                capacity,
            }),
            Acquisition::Decided { outcome, .. } => Ok(outcome),
        }
    }
}

fn check_name(name: &str) -> Result<(), LimiterError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(LimiterError::Invalid(format!(
            "a limiter name must have 1 to {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Validates a config, fills its defaults, and derives what the store keeps.
fn compile(mut config: LimiterConfig) -> Result<(LimiterConfig, LimiterRecord), LimiterError> {
    let invalid = |m: String| Err(LimiterError::Invalid(m));
    check_name(&config.name)?;
    let interval = match config.interval.map(Duration::try_from) {
        Some(Ok(d)) if d >= Duration::from_millis(1) && d <= Duration::from_secs(366 * 86_400) => d,
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
        LimiterError::Invalid(format!(
            "burst (default: rate) must be at most {}",
            u32::MAX
        ))
    })?;
    let api = ApiAlgorithm::try_from(config.algorithm).unwrap_or(ApiAlgorithm::Unspecified);
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
        ApiAlgorithm::WarmUp => {
            let warmup = match config.warmup_period.map(Duration::try_from) {
                Some(Ok(d)) if d >= Duration::from_millis(1) => d,
                _ => return invalid("warm_up needs a warmup_period of at least 1ms".into()),
            };
            if config.cold_factor == 0.0 {
                config.cold_factor = 3.0;
            }
            if !(config.cold_factor > 1.0 && config.cold_factor <= 1000.0) {
                return invalid("cold_factor must be above 1 and at most 1000".into());
            }
            ConfigAlgorithm::WarmUp {
                warmup,
                cold_factor: config.cold_factor,
            }
        }
    };
    if algorithm.burst().is_none() {
        config.burst = 0;
    }
    algorithm
        .check_numbers(config.rate, window)
        .map_err(|p| LimiterError::Invalid(p.reason))?;
    let capacity = algorithm.burst().map_or(config.rate, u64::from);
    let record = LimiterRecord {
        rule: rule_for(algorithm, config.rate, window),
        capacity,
        per_client: config.mode == Mode::PerClient as i32,
        description: config.encode_to_vec(),
    };
    Ok((config, record))
}

fn describe(record: &LimiterRecord) -> Result<LimiterConfig, LimiterError> {
    LimiterConfig::decode(record.description.as_slice())
        .map_err(|e| LimiterError::Store(StoreError::Protocol(format!("stored config: {e}"))))
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
        let set = l.set_rate(one.clone(), SetMode::TrySet).await.unwrap();
        assert!(set.applied && set.state_reset);
        let other = config(
            "a",
            ApiAlgorithm::SlidingWindowLog,
            5,
            Duration::from_secs(60),
        );
        let set = l.set_rate(other.clone(), SetMode::TrySet).await.unwrap();
        assert!(!set.applied && !set.state_reset);
        assert_eq!(set.config.rate, 2);

        let take = || l.try_acquire("a", "", 1, Duration::ZERO);
        assert!(take().await.unwrap().acquired);
        assert!(take().await.unwrap().acquired);
        assert!(!take().await.unwrap().acquired);
        // Keep state: 2 of 5 used.
        l.set_rate(other.clone(), SetMode::UpdateKeepState)
            .await
            .unwrap();
        assert_eq!(l.available("a", "").await.unwrap(), 3);
        // Reset: all 5 back.
        l.set_rate(other, SetMode::UpdateResetState).await.unwrap();
        assert_eq!(l.available("a", "").await.unwrap(), 5);
        assert_eq!(l.config("a").await.unwrap().rate, 5);
    }

    #[tokio::test]
    async fn impossible_requests_and_bad_configs_are_refused() {
        let (l, _) = limiters();
        let bucket = config("b", ApiAlgorithm::TokenBucket, 10, Duration::from_secs(1));
        l.set_rate(bucket, SetMode::TrySet).await.unwrap();
        let err = l
            .try_acquire("b", "", 11, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LimiterError::TooManyPermits { capacity: 10, .. }),
            "{err}"
        );
        assert!(matches!(
            l.try_acquire("nope", "", 1, Duration::ZERO).await,
            Err(LimiterError::NotFound(_))
        ));
        let bad = config("c", ApiAlgorithm::Unspecified, 1, Duration::from_secs(1));
        assert!(matches!(
            l.set_rate(bad, SetMode::TrySet).await,
            Err(LimiterError::Invalid(_))
        ));
        let bad = config(
            "c",
            ApiAlgorithm::FixedWindow,
            1,
            Duration::from_millis(1500),
        );
        assert!(matches!(
            l.set_rate(bad, SetMode::TrySet).await,
            Err(LimiterError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn per_client_budgets_need_a_client() {
        let (l, _) = limiters();
        let mut c = config("p", ApiAlgorithm::FixedWindow, 1, Duration::from_secs(60));
        c.mode = Mode::PerClient as i32;
        l.set_rate(c, SetMode::TrySet).await.unwrap();
        assert!(
            l.try_acquire("p", "x", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
        assert!(
            !l.try_acquire("p", "x", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
        assert!(
            l.try_acquire("p", "y", 1, Duration::ZERO)
                .await
                .unwrap()
                .acquired
        );
        assert!(matches!(
            l.try_acquire("p", "", 1, Duration::ZERO).await,
            Err(LimiterError::NeedsClient(_))
        ));
    }
}
