//! The decision path: from a `RateLimitRequest` to a `RateLimitResponse`.
//!
//! In order: refuse a request that names no domain or no descriptor (the only requests that get
//! an error), find the domain, match each descriptor to a limit (or take Envoy's override;
//! a descriptor beyond the input limits is refused on its own, see [`Refusal`]), drop limits
//! named by another's `replaces`, answer
//! `unlimited` ones directly, turn the rest into [`Check`](crate::store::Check)s with their
//! counter keys, ask the store
//! once for all of them, and build the statuses and the overall code with upstream's rules for
//! per-rule shadow mode, quota mode and global shadow mode. Response headers and dynamic metadata
//! are added when enabled. The protocol adapters in `server` only translate errors and transports.
//!
//! This file holds the limiter, its options and the request path read top to bottom
//! ([`RateLimiter::should_rate_limit`]); each step lives in a file of its own, where a newcomer
//! would look for it: matching and the checks (`plan.rs`), the store call with the over-limit
//! cache and the per-second store (`store_call.rs`), the statuses, their tally and the overall
//! code (`answer.rs`).

mod admin;
mod answer;
mod decision_log;
pub mod key;
mod local_cache;
mod plan;
mod response;
mod store_call;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;

pub use admin::{AdminError, CounterReport};
pub use decision_log::{DecisionLogOptions, LogValues, value_hash};
use key::LongParts;
pub use key::{KeyBuilder, PrefixError};
pub use plan::Refusal;
pub use response::{DEGRADED_HEADER, DEGRADED_METADATA, HeaderNames};

use self::decision_log::DecisionLog;
use self::local_cache::OverLimitCache;
use crate::clock::Clock;
use crate::config::{Algorithm as ConfigAlgorithm, RateLimitConfig};
use crate::metrics::{ConfigCounters, Metrics};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::deadline::Deadline;
use crate::store::{CounterStore, Marks, Outcome, Rule, StoreError};
use crate::util::{self, LogThrottle};

/// Remaining count reported for `unlimited` descriptors, as upstream does.
pub const UNLIMITED_REMAINING: u32 = u32::MAX;

/// A cost larger than any `requests_per_unit` can admit. Larger costs are counted as this, which
/// keeps every counter far from Redis's 64-bit `INCRBY` overflow without changing any answer.
pub const MAX_HITS: u64 = u32::MAX as u64 + 1;

/// Bounds on what one request can cost. None of them makes a request fail: a domain, key or
/// value over its byte limit is judged under a digest of its text (see [`key`]), and a descriptor
/// past the descriptor or entry count is refused on its own ([`Refusal`]).
#[derive(Debug, Clone)]
pub struct InputLimits {
    /// `MAX_DESCRIPTORS_PER_REQUEST`: descriptors past this many are refused.
    pub max_descriptors: usize,
    /// `MAX_ENTRIES_PER_DESCRIPTOR`: a descriptor with more entries is refused.
    pub max_entries: usize,
    /// `MAX_DOMAIN_BYTES`: a longer domain is keyed by its digest.
    pub max_domain_bytes: usize,
    /// `MAX_DESCRIPTOR_KEY_BYTES`: a longer entry key is keyed by its digest.
    pub max_key_bytes: usize,
    /// `MAX_DESCRIPTOR_VALUE_BYTES`: a longer entry value is keyed by its digest.
    pub max_value_bytes: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        Self {
            max_descriptors: 64,
            max_entries: 16,
            max_domain_bytes: 256,
            max_key_bytes: 256,
            max_value_bytes: 4096,
        }
    }
}

/// Service-wide switches (upstream's environment variables).
#[derive(Debug, Clone, Default)]
pub struct RlsOptions {
    /// `SHADOW_MODE`: an overall OVER_LIMIT is answered OK (statuses keep showing it).
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every limit behaves as if it had `quota_mode: true`.
    pub quota_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` with the header names.
    pub response_headers: Option<HeaderNames>,
    /// `LIMIT_RESPONSE_HEADERS_DRAFT`: also the IETF draft's `RateLimit-Policy` and `RateLimit`.
    pub draft_headers: bool,
    /// `RESPONSE_DYNAMIC_METADATA`.
    pub dynamic_metadata: bool,
    /// What one request may carry before parts of it are digested or refused.
    pub input_limits: InputLimits,
    /// `FAILURE_POLICY`: what to answer when the store cannot decide.
    pub failure_policy: FailurePolicy,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: memory for remembering fixed windows already over their
    /// limit, so their later requests skip the store; 0 turns it off.
    pub local_cache_bytes: usize,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when any descriptor of a request would go over
    /// its limit, only those are counted (see [`Charging::StopWhenOver`](crate::store::Charging::StopWhenOver)).
    pub stop_increment_when_over: bool,
}

/// What the service answers when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// A gRPC `UNAVAILABLE` error: Envoy then applies its `failure_mode_deny` (allow by default,
    /// refuse with `failure_mode_deny: true`).
    #[default]
    FailClosed,
    /// Answer OK here, counted and logged (at most once a second).
    FailOpen,
    /// `local_share`: while the store is down or late, each replica decides alone with its
    /// share of every limit (`store::layers::local_share`, stacked by `app`), and the answer is marked
    /// ([`DEGRADED_HEADER`]). What still fails (a script error) is answered as `FailClosed`.
    LocalShare,
}

/// Why a request got no decision. Each maps to one gRPC status (see `server::rls`).
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    /// The request itself is wrong; retrying it cannot help.
    #[error("{0}")]
    InvalidRequest(String),
    /// No configuration was ever installed ([`RateLimiter::set_config`]); the server holds
    /// off serving until its first one unless `FORCE_START_WITHOUT_INITIAL_CONFIG`.
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The store could not decide.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A store call ran out of the caller's deadline, shorter than the store may take, while
    /// the store answered ([`StoreError::CallerDeadline`]): never the failure policy's to
    /// answer, since the caller chose it.
    #[error(transparent)]
    CallerDeadline(StoreError),
}

/// The decision engine shared by every protocol adapter.
#[derive(Debug)]
pub struct RateLimiter {
    active: ArcSwapOption<Active>,
    store: Arc<dyn CounterStore>,
    /// Where limits whose unit is the second go, when set (upstream's `REDIS_PERSECOND`).
    per_second: Option<Arc<dyn CounterStore>>,
    metrics: Option<Arc<Metrics>>,
    keys: KeyBuilder,
    clock: Arc<dyn Clock>,
    options: RlsOptions,
    over_limit_cache: Option<Arc<OverLimitCache>>,
    /// `DECISION_LOG=over_limit`: a line per descriptor judged over its limit.
    decision_log: Option<DecisionLog>,
    /// Requests answered OK because the store failed and the policy is fail-open.
    failed_open: AtomicU64,
    fail_open_log: LogThrottle,
    store_error_log: LogThrottle,
    refusal_log: LogThrottle,
}

/// The configuration in force and the metric handles of its limits, swapped together.
#[derive(Debug)]
struct Active {
    config: Arc<RateLimitConfig>,
    counters: ConfigCounters,
}

impl RateLimiter {
    /// A limiter counting in `store`, naming counters with `keys`, reading windows off `clock`.
    /// It answers [`RlsError::NoConfig`] until [`Self::set_config`] installs a configuration.
    pub fn new(
        store: Arc<dyn CounterStore>,
        keys: KeyBuilder,
        clock: Arc<dyn Clock>,
        options: RlsOptions,
    ) -> Self {
        let input = &options.input_limits;
        let keys = keys.with_long_parts(LongParts {
            domain: input.max_domain_bytes,
            key: input.max_key_bytes,
            value: input.max_value_bytes,
        });
        Self {
            active: ArcSwapOption::empty(),
            store,
            per_second: None,
            metrics: None,
            keys,
            clock,
            over_limit_cache: OverLimitCache::with_size(options.local_cache_bytes).map(Arc::new),
            options,
            decision_log: None,
            failed_open: AtomicU64::new(0),
            fail_open_log: LogThrottle::default(),
            store_error_log: LogThrottle::default(),
            refusal_log: LogThrottle::default(),
        }
    }

    /// Sends limits whose unit is the second to `store` (upstream's per-second Redis).
    pub fn with_per_second_store(mut self, store: Arc<dyn CounterStore>) -> Self {
        self.per_second = Some(store);
        self
    }

    /// Records per-rule and store metrics, and shows the local cache's figures.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        if let Some(cache) = &self.over_limit_cache {
            let cache = cache.clone();
            metrics.observe_local_cache(move || cache.figures());
        }
        if let Some(log) = &mut self.decision_log {
            let (written, dropped) = metrics.admin.decision_log_counters();
            log.count_in(written, dropped);
        }
        self.metrics = Some(metrics);
        self
    }

    /// Writes a line per descriptor judged over its limit (`DECISION_LOG=over_limit`), counted
    /// in the metrics when there are some.
    pub fn with_decision_log(mut self, options: DecisionLogOptions) -> Self {
        let mut log = DecisionLog::new(options);
        if let Some(metrics) = &self.metrics {
            let (written, dropped) = metrics.admin.decision_log_counters();
            log.count_in(written, dropped);
        }
        self.decision_log = Some(log);
        self
    }

    /// Installs a new configuration; requests already running finish with the old one.
    pub fn set_config(&self, config: Arc<RateLimitConfig>) {
        let counters = ConfigCounters::new(config.limit_count());
        self.active
            .store(Some(Arc::new(Active { config, counters })));
    }

    /// The configuration in force, if one was installed.
    pub fn config(&self) -> Option<Arc<RateLimitConfig>> {
        self.active.load().as_ref().map(|a| a.config.clone())
    }

    /// The store its counters live in (not the per-second one): the RLQS keeps the demand it
    /// reports beside them (`crate::rlqs`).
    pub fn store(&self) -> &Arc<dyn CounterStore> {
        &self.store
    }

    /// How it names counters.
    pub fn keys(&self) -> &KeyBuilder {
        &self.keys
    }

    /// The clock its windows are read off.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The store's kind (`memory`, `redis`), for the start-up log.
    pub fn store_kind(&self) -> &'static str {
        self.store.kind()
    }

    /// Decides `request` (Envoy's `ShouldRateLimit`). `deadline` is when its caller stops
    /// waiting (`grpc-timeout` less a margin), which bounds every store call; `None` leaves each
    /// store call to the store's own timeout. An answer decided locally in part
    /// (`FAILURE_POLICY=local_share`) is marked.
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %util::shown(&request.domain)))]
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
        deadline: Option<Deadline>,
    ) -> Result<RateLimitResponse, RlsError> {
        validate(request)?;
        let active = self.active.load();
        let Some(Active { config, counters }) = active.as_deref() else {
            return Err(RlsError::NoConfig);
        };
        self.count_long_parts(request);
        // A domain that is not UTF-8 names none: answered as an unknown domain.
        let Some((name, domain)) = config.domain_of_request(&request.domain) else {
            tracing::debug!("domain not found");
            return Ok(response::all_ok(request.descriptors.len()));
        };

        let plan = self.plan(name, domain, request);
        let marks = Marks::new();
        let asked = self.ask_store(marks.call(deadline), &plan).await;
        let mut outcomes = match asked {
            Ok(outcomes) => outcomes,
            Err(e @ StoreError::CallerDeadline(_)) => return Err(RlsError::CallerDeadline(e)),
            Err(e) if self.options.failure_policy == FailurePolicy::FailOpen => {
                return Ok(self.fail_open(request, &e));
            }
            Err(e) => {
                if let Some(held_back) = self.store_error_log.allow(self.clock.now_secs()) {
                    tracing::warn!(error = %e, held_back, "store failed; answering UNAVAILABLE");
                }
                return Err(e.into());
            }
        };
        self.settle_releases(&plan, &mut outcomes);
        let took_lease = took_lease(&plan, &outcomes, self.options.stop_increment_when_over);
        let answers = self.answer(request, counters, &plan, &outcomes);
        let mut reply = self.finish(request, answers);
        if took_lease {
            response::mark_lease(&mut reply);
        }
        if marks.degraded() {
            response::mark_degraded(&mut reply);
        }
        Ok(reply)
    }

    /// The fail-open answer: OK, and each descriptor OK with no limit (nothing was counted).
    fn fail_open(&self, request: &RateLimitRequest, error: &StoreError) -> RateLimitResponse {
        let total = self.failed_open.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(m) = &self.metrics {
            m.failed_open.inc();
        }
        if let Some(held_back) = self.fail_open_log.allow(self.clock.now_secs()) {
            tracing::warn!(%error, failed_open_total = total, held_back, "store failed; answering OK (FAILURE_POLICY=fail_open)");
        }
        response::all_ok(request.descriptors.len())
    }

    /// Counts the domain, keys and values over their input limits; they are judged under a
    /// digest of their text (see [`key`]).
    fn count_long_parts(&self, request: &RateLimitRequest) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let max = &self.options.input_limits;
        if request.domain.len() > max.max_domain_bytes {
            metrics.record_long_part("domain");
        }
        for entry in request.descriptors.iter().flat_map(|d| &d.entries) {
            if entry.key.len() > max.max_key_bytes {
                metrics.record_long_part("key");
            }
            if entry.value.len() > max.max_value_bytes {
                metrics.record_long_part("value");
            }
        }
    }
}

/// The only requests that get no decision at all: nothing names what to limit.
fn validate(request: &RateLimitRequest) -> Result<(), RlsError> {
    if request.domain.is_empty() {
        return Err(invalid("rate limit domain must not be empty".into()));
    }
    if request.descriptors.is_empty() {
        return Err(invalid(
            "rate limit descriptor list must not be empty".into(),
        ));
    }
    Ok(())
}

/// The store rule of `algorithm` for `limit` permits per `window` microseconds. A fixed window's
/// start is left at 0 for the caller to fill in. Shared by the RLS path and named limiters, and
/// valid for numbers that passed [`ConfigAlgorithm::check_numbers`].
pub fn rule_for(algorithm: ConfigAlgorithm, limit: u64, window: u64) -> Rule {
    match algorithm {
        ConfigAlgorithm::FixedWindow => Rule::FixedWindow {
            limit,
            window_secs: window / 1_000_000,
            window_start: 0,
        },
        ConfigAlgorithm::SlidingWindowLog => Rule::SlidingWindowLog { limit, window },
        ConfigAlgorithm::SlidingWindowCounter => Rule::SlidingWindowCounter { limit, window },
        ConfigAlgorithm::TokenBucket { burst }
        | ConfigAlgorithm::Gcra { burst }
        | ConfigAlgorithm::LeakyBucket { burst } => Rule::Gcra {
            interval: window.div_ceil(limit),
            burst: u64::from(burst),
        },
        ConfigAlgorithm::WarmUp {
            warmup,
            cold_factor,
        } => Rule::WarmUp {
            permits_per_window: limit,
            window,
            warmup: warmup.as_micros() as u64,
            cold_factor,
        },
        ConfigAlgorithm::Concurrency => Rule::Concurrency {
            limit,
            lease: window,
            release: false,
        },
    }
}

/// Whether the request took a concurrency lease (an acquisition admitted with hits), so that
/// Envoy's release at stream end, conditioned on the mark, gives back only what was taken. A
/// check of a `rate_limits` list took its lease only when the whole list admitted the request
/// (all or nothing: a refused list charges none of its limits that would admit), and under
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` only when nothing of the request was refused (the
/// admitting checks are then only looked at), unless it carries a release (charged in full).
fn took_lease(plan: &plan::RequestPlan<'_>, outcomes: &[(Outcome, bool)], stop: bool) -> bool {
    let checks = &plan.checks;
    let admitted = |i: usize| outcomes[i].0.admitted;
    let gives_back = checks
        .iter()
        .any(|c| matches!(c.rule, Rule::Concurrency { release: true, .. }));
    if stop && !gives_back && (0..checks.len()).any(|i| !admitted(i)) {
        return false;
    }
    let list_admitted = |group: Option<u32>| {
        group.is_none_or(|g| (0..checks.len()).all(|i| checks[i].group != Some(g) || admitted(i)))
    };
    checks.iter().enumerate().any(|(i, check)| {
        matches!(check.rule, Rule::Concurrency { release: false, .. })
            && check.hits > 0
            && admitted(i)
            && list_admitted(check.group)
    })
}

fn invalid(message: String) -> RlsError {
    RlsError::InvalidRequest(message)
}

#[cfg(test)]
mod tests;
