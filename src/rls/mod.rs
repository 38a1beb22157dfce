//! The decision path: from a `RateLimitRequest` to a `RateLimitResponse`.
//!
//! In order: refuse a request that names no domain or no descriptor (the only requests that get
//! an error), find the domain, match each descriptor to a limit (or take Envoy's override;
//! a descriptor beyond the input limits is refused on its own, see [`Refusal`]), drop limits
//! named by another's `replaces`, answer
//! `unlimited` ones directly, turn the rest into [`Check`]s with their counter keys, ask the store
//! once for all of them, and build the statuses and the overall code with upstream's rules for
//! per-rule shadow mode, quota mode and global shadow mode. Response headers and dynamic metadata
//! are added when enabled. The protocol adapters in `server` only translate errors and transports.

pub mod key;
mod local_cache;
mod response;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use tracing::Instrument;

pub use key::{KeyBuilder, LongParts, PrefixError};
pub use response::HeaderNames;

use self::local_cache::OverLimitCache;
use crate::clock::Clock;
use crate::config::{Algorithm as ConfigAlgorithm, Domain, Limit, Quota, RateLimitConfig, Unit};
use crate::metrics::{ConfigCounters, Metrics};
use crate::proto::{
    Code, DescriptorStatus, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
};
use crate::store::{Charging, Check, CounterStore, Outcome, Rule, StoreError};
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
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_domain_bytes: usize,
    pub max_key_bytes: usize,
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
    pub input_limits: InputLimits,
    /// `FAILURE_POLICY`: what to answer when the store cannot decide.
    pub failure_policy: FailurePolicy,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: memory for remembering fixed windows already over their
    /// limit, so their later requests skip the store; 0 turns it off.
    pub local_cache_bytes: usize,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when any descriptor of a request would go over
    /// its limit, only those are counted (see [`Charging::StopWhenOver`]).
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
}

/// Why a request got no decision. Each maps to one gRPC status (see `server::rls`).
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    /// The request itself is wrong; retrying it cannot help.
    #[error("{0}")]
    InvalidRequest(String),
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The store could not decide.
    #[error(transparent)]
    Store(#[from] StoreError),
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
    /// Requests answered OK because the store failed and the policy is fail-open.
    failed_open: AtomicU64,
    fail_open_log: LogThrottle,
    store_error_log: LogThrottle,
    refusal_log: LogThrottle,
}

/// What one request asks of the store: a slot per descriptor, in request order, and the checks
/// of the counted ones (with whether each goes to the per-second store).
struct RequestPlan<'c> {
    /// The request's domain, as the config names it.
    domain: &'c str,
    slots: Vec<Plan<'c>>,
    checks: Vec<Check>,
    per_second: Vec<bool>,
}

/// What the answer step reads for a request: its plan, the store's outcomes (each
/// with whether the over-limit cache gave it) and the metric handles of the config in force.
struct StoreAnswer<'a, 'c> {
    counters: &'a ConfigCounters,
    plan: &'a RequestPlan<'c>,
    outcomes: &'a [(Outcome, bool)],
}

/// The statuses of one request, in request order, with what they add up to.
struct Answers<'p> {
    statuses: Vec<DescriptorStatus>,
    /// Per status, the limit it was judged under when it is not over that limit (for the
    /// dynamic metadata; empty without it).
    passed: Vec<Option<&'p Limit>>,
    /// Per status, the length in seconds of the window of the limit it names (0: none), for
    /// the draft headers' `w=` (the protocol's unit does not carry `unit_multiplier`; empty
    /// without them).
    windows: Vec<u64>,
    tally: response::Tally,
}

/// The configuration in force and the metric handles of its limits, swapped together.
#[derive(Debug)]
struct Active {
    config: Arc<RateLimitConfig>,
    counters: ConfigCounters,
}

/// What became of one request descriptor before the store call.
// Plans live in one short Vec per request; boxing the large variant would allocate per request.
#[allow(clippy::large_enum_variant)]
enum Plan<'c> {
    NoLimit,
    /// Could not be judged: answered OVER_LIMIT without counting (see [`Refusal`]).
    Refused,
    Unlimited,
    /// Counted under one limit.
    Counted(Counted<'c>),
    /// Counted under every limit of a `rate_limits` list, all or nothing (see
    /// [`crate::store::charged_hits`]); its status is the deciding limit's ([`decider`]).
    Group(Vec<Counted<'c>>),
}

impl<'c> Plan<'c> {
    /// The limits this slot is counted under: one, a list's, or none.
    fn counted(&self) -> &[Counted<'c>] {
        match self {
            Plan::Counted(one) => std::slice::from_ref(one),
            Plan::Group(members) => members,
            _ => &[],
        }
    }
}

/// One limit a descriptor is counted under: the limit, its rate (so the answer needs no second
/// look at its quota) and the index of its check.
struct Counted<'c> {
    limit: Cow<'c, Limit>,
    rate: response::Rate,
    check: usize,
}

/// The limits one descriptor matched: none, one, or a `rate_limits` list (borrowed from the
/// config; owned for an override or after `replaces` dropped some of a list).
type Matched<'c> = Option<Cow<'c, [Limit]>>;

impl RateLimiter {
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
        self.metrics = Some(metrics);
        self
    }

    /// Installs a new configuration; requests already running finish with the old one.
    pub fn set_config(&self, config: Arc<RateLimitConfig>) {
        let counters = ConfigCounters::new(config.limit_count());
        self.active
            .store(Some(Arc::new(Active { config, counters })));
    }

    pub fn config(&self) -> Option<Arc<RateLimitConfig>> {
        self.active.load().as_ref().map(|a| a.config.clone())
    }

    pub fn store_kind(&self) -> &'static str {
        self.store.kind()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(domain = %util::shown(&request.domain)))]
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
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
        let outcomes = match self.ask_store(&plan).await {
            Ok(outcomes) => outcomes,
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
        let answers = self.answer(request, counters, &plan, &outcomes);
        Ok(self.finish(request, answers))
    }

    /// Step 1: each descriptor's slot (matched, with `replaces` applied across the request; a
    /// descriptor that cannot be judged is refused on its own) and the checks for the store.
    fn plan<'c>(
        &self,
        name: &'c str,
        domain: &'c Domain,
        request: &RateLimitRequest,
    ) -> RequestPlan<'c> {
        let mut matched: Vec<Result<Matched<'c>, Refusal>> = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(index, descriptor)| self.match_one(domain, index, descriptor))
            .collect();
        drop_replaced(&mut matched);

        let now_secs = self.clock.now_secs();
        let n = request.descriptors.len();
        let (mut checks, mut per_second) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut slots = Vec::with_capacity(n);
        for (index, (limits, descriptor)) in
            matched.into_iter().zip(&request.descriptors).enumerate()
        {
            let limits = match limits {
                Err(_) => {
                    slots.push(Plan::Refused);
                    continue;
                }
                Ok(None) => {
                    slots.push(Plan::NoLimit);
                    continue;
                }
                Ok(Some(limits)) => limits,
            };
            // One limit's check, in the per-second store or not; `None` for an unlimited one.
            let count = |limit: Cow<'c, Limit>, group: Option<u32>, second: bool| {
                let Quota::PerUnit {
                    requests_per_unit,
                    unit,
                    algorithm,
                    ..
                } = limit.quota
                else {
                    return None;
                };
                let window_secs = limit.quota.window_secs().unwrap_or(unit.window_secs());
                let (key, rule) = self.counter(
                    name,
                    descriptor,
                    &limit,
                    (requests_per_unit, window_secs, algorithm),
                    now_secs,
                );
                per_second.push(second);
                checks.push(Check {
                    key,
                    hits: hits(request, descriptor),
                    rule,
                    record_refused: limit.record_refused_hits,
                    group,
                });
                let rate = response::Rate {
                    requests_per_unit,
                    unit,
                    window_secs,
                };
                Some(Counted {
                    limit,
                    rate,
                    check: checks.len() - 1,
                })
            };
            slots.push(counted_slot(limits, index, count));
        }
        RequestPlan {
            domain: name,
            slots,
            checks,
            per_second,
        }
    }

    /// Step 2: one store call (or two, with a per-second store) for every counted descriptor;
    /// none when nothing is counted.
    async fn ask_store(&self, plan: &RequestPlan<'_>) -> Result<Vec<(Outcome, bool)>, StoreError> {
        if plan.checks.is_empty() {
            return Ok(Vec::new());
        }
        let span = tracing::debug_span!(
            "store",
            kind = self.store.kind(),
            checks = plan.checks.len()
        );
        let checks: Vec<&Check> = plan.checks.iter().collect();
        self.decide_with_cache(&checks, &plan.per_second)
            .instrument(span)
            .await
    }

    /// Step 3: each descriptor's status, in request order, with its per-rule metrics; what each
    /// status counts for (over the limit or not, quota or not) is tallied as it is built.
    fn answer<'p>(
        &self,
        request: &RateLimitRequest,
        counters: &ConfigCounters,
        plan: &'p RequestPlan<'_>,
        outcomes: &[(Outcome, bool)],
    ) -> Answers<'p> {
        let store = StoreAnswer {
            counters,
            plan,
            outcomes,
        };
        // `passed` and `windows` are read only for dynamic metadata and the draft headers: left
        // empty (no allocation) otherwise.
        let n = plan.slots.len();
        let (metadata, draft) = (self.options.dynamic_metadata, self.options.draft_headers);
        let mut answers = Answers {
            statuses: Vec::with_capacity(n),
            passed: Vec::with_capacity(if metadata { n } else { 0 }),
            windows: Vec::with_capacity(if draft { n } else { 0 }),
            tally: response::Tally::default(),
        };
        for (index, (slot, descriptor)) in plan.slots.iter().zip(&request.descriptors).enumerate() {
            // The limit a counted status names, when there is one.
            let mut decided = None;
            let (status, judged) = match slot {
                // Upstream's `QUOTA_MODE` makes every descriptor that is not unlimited a quota
                // one, those without a limit (unmatched, replaced, empty) too: such a request
                // is never refused by its quota descriptors, since one of them cannot be over.
                Plan::NoLimit => (
                    response::no_limit(),
                    response::Judged {
                        quota: self.options.quota_mode,
                        ..response::Judged::NO_LIMIT
                    },
                ),
                // Refused descriptors are never quota ones: padding must not switch a limit off.
                Plan::Refused => (response::refused(), response::Judged::REFUSED),
                Plan::Unlimited => (response::unlimited(), response::Judged::NO_LIMIT),
                Plan::Counted(_) | Plan::Group(_) => {
                    let (status, judged, decider) = self.judge(&store, descriptor, slot.counted());
                    decided = decider;
                    (status, judged)
                }
            };
            answers.tally.add(index, judged);
            if metadata {
                answers.passed.push(match decided {
                    Some(c) if !judged.over => Some(&*c.limit),
                    _ => None,
                });
            }
            if draft {
                answers
                    .windows
                    .push(decided.map_or(0, |c| c.rate.window_secs));
            }
            answers.statuses.push(status);
        }
        answers
    }

    /// The status of a descriptor counted under `members` (one limit, or a `rate_limits` list),
    /// recording each limit's metrics, and the limit that decided it ([`decider`]), whose status
    /// it is.
    fn judge<'m, 'c>(
        &self,
        store: &StoreAnswer<'_, '_>,
        descriptor: &RateLimitDescriptor,
        members: &'m [Counted<'c>],
    ) -> (
        crate::proto::DescriptorStatus,
        response::Judged,
        Option<&'m Counted<'c>>,
    ) {
        let StoreAnswer {
            counters,
            plan,
            outcomes,
        } = store;
        if let Some(metrics) = &self.metrics {
            for member in members {
                let (outcome, from_cache) = &outcomes[member.check];
                let hits = plan.checks[member.check].hits;
                let (entries, limit) = (&descriptor.entries, &*member.limit);
                metrics.record(counters, plan.domain, entries, limit, hits, outcome);
                if *from_cache {
                    metrics.record_local_cache(counters, plan.domain, entries, limit, hits);
                }
            }
        }
        let Some(member) = members.get(decider(members, outcomes)) else {
            // Every limit of the list was replaced or unlimited: nothing was counted.
            return (response::no_limit(), response::Judged::NO_LIMIT, None);
        };
        let (limit, outcome) = (&*member.limit, &outcomes[member.check].0);
        let judged = response::Judged {
            over: !outcome.admitted && !limit.shadow_mode,
            quota: limit.quota_mode || self.options.quota_mode,
            remaining: Some(response::remaining(outcome)),
        };
        (
            response::counted(limit, member.rate, outcome),
            judged,
            Some(member),
        )
    }

    /// Answers the checks the over-limit cache knows are refused, asks the store(s) for the
    /// rest and remembers fixed windows the store refused. Each outcome says whether it came
    /// from the cache.
    ///
    /// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, the store charges only the checks that
    /// would go over when any would; and once the cache refused one check, the others are only
    /// looked at, as upstream does.
    async fn decide_with_cache(
        &self,
        checks: &[&Check],
        per_second: &[bool],
    ) -> Result<Vec<(Outcome, bool)>, StoreError> {
        let charging = if self.options.stop_increment_when_over {
            Charging::StopWhenOver
        } else {
            Charging::Each
        };
        let Some(cache) = &self.over_limit_cache else {
            let outcomes = self.decide(checks, per_second, charging).await?;
            return Ok(outcomes.into_iter().map(|o| (o, false)).collect());
        };
        let now_ms = self.clock.now_millis();
        let mut answers: Vec<Option<(Outcome, bool)>> = checks
            .iter()
            .map(|&check| {
                // A group is decided together, in the store; its refusals charge nothing, so
                // they say nothing about later requests either.
                let Rule::FixedWindow { limit, .. } = check.rule else {
                    return None;
                };
                if check.group.is_some() {
                    return None;
                }
                let reset_ms = cache.over_limit(&check.key, now_ms)?;
                let refused = Outcome {
                    admitted: false,
                    remaining: 0,
                    reset_ms,
                    // The store's count is at least this; upstream reports these hits as over.
                    used: limit + check.hits,
                };
                Some((refused, true))
            })
            .collect();
        let ask: Vec<usize> = (0..checks.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        if !ask.is_empty() {
            let asked = if ask.len() == checks.len() {
                self.decide(checks, per_second, charging).await?
            } else {
                let charging = match charging {
                    Charging::StopWhenOver => Charging::LookOnly,
                    other => other,
                };
                self.decide(&pick(checks, &ask), &pick(per_second, &ask), charging)
                    .await?
            };
            for (&i, outcome) in ask.iter().zip(asked) {
                let check = checks[i];
                // Refused with hits counted: the window's count is over its limit and only
                // grows until the window (named in the key) ends.
                if let Rule::FixedWindow {
                    window_secs,
                    window_start,
                    ..
                } = check.rule
                    && !outcome.admitted
                    && check.hits > 0
                    && check.group.is_none()
                {
                    cache.remember(&check.key, (window_start + window_secs) * 1_000, now_ms);
                }
                answers[i] = Some((outcome, false));
            }
        }
        Ok(all_answered(answers))
    }

    /// Asks the store(s): one call, or two concurrent ones when second-unit limits have their
    /// own store; outcomes come back in the order of `checks`. Each call applies `charging` to
    /// its own checks (the two stores cannot decide together).
    async fn decide(
        &self,
        checks: &[&Check],
        per_second: &[bool],
        charging: Charging,
    ) -> Result<Vec<Outcome>, StoreError> {
        let Some(second_store) = &self.per_second else {
            return self.store.check_with(checks, charging).await;
        };
        let (fast, slow): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| per_second[i]);
        if fast.is_empty() {
            return self.store.check_with(checks, charging).await;
        }
        let (fast_checks, slow_checks) = (pick(checks, &fast), pick(checks, &slow));
        let fast_call = second_store.check_with(&fast_checks, charging);
        let (fast_out, slow_out) = tokio::try_join!(fast_call, async {
            if slow_checks.is_empty() {
                Ok(Vec::new())
            } else {
                self.store.check_with(&slow_checks, charging).await
            }
        })?;
        let mut outcomes = vec![None; checks.len()];
        for (i, o) in fast
            .into_iter()
            .zip(fast_out)
            .chain(slow.into_iter().zip(slow_out))
        {
            outcomes[i] = Some(o);
        }
        Ok(all_answered(outcomes))
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

    /// Overall code, global shadow mode, headers and metadata, from what [`Self::answer`]
    /// tallied.
    fn finish(&self, request: &RateLimitRequest, answers: Answers<'_>) -> RateLimitResponse {
        let Answers {
            statuses,
            passed,
            windows,
            tally,
        } = answers;
        let over_limit = tally.over_limit();
        let overall = if over_limit && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            if over_limit {
                tracing::debug!("global shadow mode turned OVER_LIMIT into OK");
                if let Some(m) = &self.metrics {
                    m.global_shadow_mode.inc();
                }
            }
            Code::Ok
        };

        let mut reply = RateLimitResponse {
            overall_code: overall as i32,
            ..Default::default()
        };
        let headers = self.options.response_headers.is_some() || self.options.draft_headers;
        if headers && let Some(source) = tally.header_source() {
            let status = &statuses[source];
            if let Some(names) = &self.options.response_headers {
                reply.response_headers_to_add = names.headers(status);
            }
            if self.options.draft_headers {
                reply
                    .response_headers_to_add
                    .extend(response::draft_headers(status, windows[source]));
            }
        }
        if self.options.dynamic_metadata {
            let passed = passed.into_iter().flatten();
            reply.dynamic_metadata = Some(response::dynamic_metadata(request, passed));
        }
        reply.statuses = statuses;
        reply
    }

    /// The key and the counting rule of one descriptor under `limit`.
    fn counter(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        limit: &Limit,
        (requests_per_unit, window_secs, algorithm): (u32, u64, ConfigAlgorithm),
        now_secs: u64,
    ) -> (String, Rule) {
        let entries = &descriptor.entries;
        let mut rule = rule_for(
            algorithm,
            u64::from(requests_per_unit),
            window_secs * 1_000_000,
        );
        if let Rule::FixedWindow { window_start, .. } = &mut rule {
            // Upstream's keys name the window, picked on the service clock.
            *window_start = crate::store::window_start(now_secs, window_secs);
            let key = self
                .keys
                .fixed_window(domain, entries, limit, *window_start);
            return (key, rule);
        }
        let key = self.keys.state(domain, entries, limit, algorithm.name());
        (key, rule)
    }

    /// The limit of one descriptor: none, the matched or overriding one, or a [`Refusal`] when
    /// the descriptor is beyond the input limits. Those limits bound the work and the key size a
    /// request can cause; refusing only the offending descriptor (never the request) means no
    /// client can make Envoy fail open by sending one, and still judges all the others.
    fn match_one<'c>(
        &self,
        domain: &'c Domain,
        index: usize,
        descriptor: &RateLimitDescriptor,
    ) -> Result<Matched<'c>, Refusal> {
        let max = &self.options.input_limits;
        let refused = |refusal: Refusal| {
            if let Some(m) = &self.metrics {
                m.record_refused_descriptor(refusal.label());
            }
            if let Some(held_back) = self.refusal_log.allow(self.clock.now_secs()) {
                tracing::warn!(
                    descriptor = index,
                    reason = refusal.label(),
                    held_back,
                    "descriptor refused without being counted (answered OVER_LIMIT)"
                );
            }
            Err(refusal)
        };
        if index >= max.max_descriptors {
            return refused(Refusal::TooManyDescriptors);
        }
        if descriptor.entries.len() > max.max_entries {
            return refused(Refusal::TooManyEntries);
        }
        // Upstream answers a descriptor with no entries OK (no limit can match it).
        if descriptor.entries.is_empty() {
            return Ok(None);
        }
        match &descriptor.limit {
            Some(o) => match Unit::from_override(o.unit) {
                Some(unit) => Ok(Some(Cow::Owned(vec![Limit::from_override(
                    o.requests_per_unit,
                    unit,
                )]))),
                None => refused(Refusal::BadOverrideUnit),
            },
            None => {
                let limits = domain.find_all(&descriptor.entries);
                Ok((!limits.is_empty()).then_some(Cow::Borrowed(limits)))
            }
        }
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

/// Why a descriptor was refused without being judged. Each is answered OVER_LIMIT (the safe
/// side: padding a request must not switch a limit off), counted in
/// `sluice_descriptors_refused_total{reason}` and logged at most once a second. None of them can
/// come from a client behind Envoy: the number of descriptors and entries and the override unit
/// are set by Envoy's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Past `MAX_DESCRIPTORS_PER_REQUEST`.
    TooManyDescriptors,
    /// More than `MAX_ENTRIES_PER_DESCRIPTOR` entries.
    TooManyEntries,
    /// A `limit` override whose unit is not one of the protocol's.
    BadOverrideUnit,
}

impl Refusal {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::TooManyDescriptors => "too_many_descriptors",
            Refusal::TooManyEntries => "too_many_entries",
            Refusal::BadOverrideUnit => "bad_override_unit",
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
    }
}

fn invalid(message: String) -> RlsError {
    RlsError::InvalidRequest(message)
}

/// Upstream's precedence: a set per-descriptor `hits_addend` wins (0 = check only); otherwise
/// the request's, where 0 means 1.
fn hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> u64 {
    let hits = match descriptor.hits_addend {
        Some(h) => h,
        None => u64::from(request.hits_addend.max(1)),
    };
    hits.min(MAX_HITS)
}

/// Drops every matched limit whose name another matched limit `replaces`. The names come from
/// every matched limit, unlimited ones included; an unlimited limit is never dropped: upstream
/// sets unlimited descriptors aside before it applies `replaces`, so they keep their unlimited
/// status (remaining 4294967295).
///
/// Each limit of a `rate_limits` list is dropped on its own: the others still count, and a list
/// left empty is no limit.
fn drop_replaced<E>(matched: &mut [Result<Matched<'_>, E>]) {
    let replaced: Vec<String> = matched
        .iter()
        .flat_map(|m| m.iter().flatten())
        .flat_map(|list| list.iter())
        .flat_map(|l| l.replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    let dropped = |l: &Limit| {
        !l.name.is_empty() && !matches!(l.quota, Quota::Unlimited) && replaced.contains(&l.name)
    };
    for slot in matched.iter_mut() {
        if let Ok(found) = slot
            && let Some(list) = found
            && list.iter().any(dropped)
        {
            let kept: Vec<Limit> = list.iter().filter(|l| !dropped(l)).cloned().collect();
            *found = (!kept.is_empty()).then_some(Cow::Owned(kept));
        }
    }
}

/// Which of a descriptor's limits decides its status: the one over its limit (of several, the
/// one that refuses longest, so `duration_until_reset` says when the request could pass), else
/// the one with the least remaining (the first of equals), as the response headers choose among
/// descriptors.
fn decider(members: &[Counted<'_>], outcomes: &[(Outcome, bool)]) -> usize {
    let outcome = |i: usize| &outcomes[members[i].check].0;
    let refused = (0..members.len())
        .filter(|&i| !outcome(i).admitted)
        .max_by_key(|&i| (outcome(i).reset_ms, std::cmp::Reverse(i)));
    refused.unwrap_or_else(|| {
        (0..members.len())
            .min_by_key(|&i| (outcome(i).remaining, i))
            .unwrap_or(0)
    })
}

/// The slot of a descriptor that matched `limits`: counted under its one limit, or under every
/// limit of a `rate_limits` list as a group (`index` names it), each counted by `count`.
fn counted_slot<'c>(
    limits: Cow<'c, [Limit]>,
    index: usize,
    mut count: impl FnMut(Cow<'c, Limit>, Option<u32>, bool) -> Option<Counted<'c>>,
) -> Plan<'c> {
    let per_second = |limit: &Limit| {
        matches!(
            limit.quota,
            Quota::PerUnit {
                unit: Unit::Second,
                ..
            }
        )
    };
    if limits.len() == 1 && limits[0].member.is_none() {
        let limit = match limits {
            Cow::Borrowed(list) => Cow::Borrowed(&list[0]),
            Cow::Owned(mut list) => Cow::Owned(list.swap_remove(0)),
        };
        let second = per_second(&limit);
        return count(limit, None, second).map_or(Plan::Unlimited, Plan::Counted);
    }
    // A group is decided in one store call: it goes to the per-second store only when all of
    // its limits would.
    let second = limits.iter().all(per_second);
    let group = u32::try_from(index).unwrap_or(u32::MAX);
    let members: Vec<Cow<'c, Limit>> = match limits {
        Cow::Borrowed(list) => list.iter().map(Cow::Borrowed).collect(),
        Cow::Owned(list) => list.into_iter().map(Cow::Owned).collect(),
    };
    Plan::Group(
        members
            .into_iter()
            .filter_map(|limit| count(limit, Some(group), second))
            .collect(),
    )
}

/// The items at `indexes`, in that order: the part of a request one store call answers. The
/// items are references and flags, so a part copies pointers, never a check's key.
fn pick<T: Copy>(items: &[T], indexes: &[usize]) -> Vec<T> {
    indexes.iter().map(|&i| items[i]).collect()
}

/// Answers put back in request order, once every part has filled its places.
fn all_answered<T>(answers: Vec<Option<T>>) -> Vec<T> {
    answers
        .into_iter()
        .map(|a| a.expect("every check was answered"))
        .collect()
}

#[cfg(test)]
mod tests;
