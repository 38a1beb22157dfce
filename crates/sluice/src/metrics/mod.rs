//! Metrics: upstream's stats and Sluice's own, served on the HTTP port at `/metrics`.
//!
//! Upstream's stats (per rule, per API, config loads, errors) are counted under upstream's
//! statsd names in a [`StatStore`] (`stats.rs`), the one record every sink reads: `/metrics`
//! shows them through statsd_exporter's mapping (`mapper.rs`: upstream's default rules, or
//! `PROMETHEUS_MAPPER_YAML`), a statsd or DogStatsD sink sends them (`statsd.rs`), and the debug
//! port lists them. Sluice's own metrics (`sluice_*`, and the response-time histogram) are
//! `prometheus` crate metrics: plain atomic counters with the text exposition format.
//!
//! Stat names come from the config (domains, config paths), never from request values, unless
//! the config asks for it with `detailed_metric` or `value_to_metric`: that keeps the number of
//! series bounded by the config (upstream's memory-growth complaint). Where it asks, the series
//! named after request values are capped (`MAX_DETAILED_METRIC_SERIES`, a `SeriesCap`), their
//! long parts digested and control characters replaced, since a client chooses them.

mod admin_metrics;
mod intake;
mod mapper;
mod pressure;
mod rlqs;
mod stats;
mod statsd;
mod store_metrics;

use intake::{ConnectionMetrics, InputMetrics};

pub use mapper::{Mapper, MapperError};
pub use pressure::PressureMetrics;
pub use rlqs::RlqsMetrics;
pub use stats::{Counter, Stat, StatStore};
use stats::{Observe, SeriesCap};
pub use statsd::{StatsdOptions, run as run_statsd};

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use self::admin_metrics::AdminMetrics;
use self::store_metrics::StoreMetrics;
use crate::config::{Algorithm, Limit, Quota};
use crate::proto::DescriptorEntry;
#[cfg(feature = "redis")]
use crate::store::ConnectionCounts;
use crate::store::Outcome;
use crate::store::layers::measured::Measures;
use crate::util::shown;

/// Every metric of the process, registered once at start-up; the server hands the handles to
/// each part it builds.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    near_limit_ratio: f64,
    /// Upstream's stats, by their statsd names.
    pub stats: Arc<StatStore>,
    /// `ratelimit.service.global_shadow_mode`: requests `SHADOW_MODE` answered OK.
    pub global_shadow_mode: Counter,
    /// `ratelimit.service.config_load_success`.
    pub config_load_success: Counter,
    /// `ratelimit.service.config_load_error`.
    pub config_load_error: Counter,
    /// `ratelimit.service.call.should_rate_limit.<err_type>`.
    pub errors: StatFamily,
    /// `ratelimit_server.<method>.total_requests`.
    pub total_requests: StatFamily,
    /// `ratelimit_service_response_time_seconds`, by method.
    pub response_time: HistogramVec,
    /// What one second of response time adds to the histogram: 1, or 1 000 with
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` (upstream's legacy series).
    response_time_scale: f64,
    /// `sluice_store_call_seconds`: each store operation's latency.
    pub store_call: HistogramVec,
    /// `sluice_store_errors_total`, by store and [`StoreError::kind`](crate::store::StoreError::kind).
    pub store_errors: IntCounterVec,
    /// Error replies to a script: a bug or an input the script cannot represent, never an
    /// outage (they do not count toward a circuit breaker).
    pub script_errors: IntCounterVec,
    /// `sluice_failed_open_total`: requests `FAILURE_POLICY=fail_open` answered OK.
    pub failed_open: IntCounter,
    /// Store calls decided locally with this replica's share while the store was down or late
    /// (`FAILURE_POLICY=local_share`), by store.
    pub degraded_decisions: IntCounterVec,
    /// The replica count `local_share` divides each limit by (configured or learnt).
    pub degraded_replicas: IntGauge,
    /// `sluice_serving_degraded`: 1 while this replica is ready but decides with its share
    /// because an RLS store's breaker is open (`FAILURE_POLICY=local_share`).
    pub serving_degraded: IntGauge,
    /// `sluice_circuit_breaker_open`: 1 while a store's circuit breaker is open, by store.
    pub breaker_open: IntGaugeVec,
    /// `sluice_memory_store_entries`: live counters in the memory store.
    pub memory_entries: IntGauge,
    /// `sluice_memory_store_evictions_total`: counters dropped early at the store's bound.
    pub memory_evictions: IntCounter,
    /// The named limiters' client states on the memory store (their own table).
    pub memory_limiter_states: IntGauge,
    /// New clients of named limiters refused, on either store, because a limiter
    /// (`LIMITER_MAX_CLIENTS`) or the memory store's table (`MEMORY_MAX_LIMITER_STATES`) was
    /// full: the store refuses, the native API's adapter (`server/named.rs`) counts.
    pub limiter_clients_refused: IntCounter,
    /// `sluice_limiter_releases_total`: native API releases, by result (`returned`,
    /// `nothing_held`).
    pub limiter_releases: IntCounterVec,
    /// `sluice_connections_open`, by listener.
    pub connections_open: IntGaugeVec,
    /// `sluice_connections_rejected_total`: closed at accept, by listener and reason.
    pub connections_rejected: IntCounterVec,
    /// `sluice_connections_closed_total`: closed for a silent client, by listener and reason.
    pub connections_closed: IntCounterVec,
    /// What callers make the process hold, and the overload manager's actions.
    pub pressure: PressureMetrics,
    /// The quota service's (`crate::rlqs`).
    pub rlqs: RlqsMetrics,
    descriptors_refused: IntCounterVec,
    long_parts: IntCounterVec,
    releases: IntCounterVec,
    /// Calls answered `DEADLINE_EXCEEDED` because their caller's deadline was shorter than the
    /// store could meet, by gRPC service and stage (`GRPC_MIN_TIMEOUT`, `store::deadline`).
    pub calls_deadline_too_short: IntCounterVec,
    /// The bound on stat series named after request values (`MAX_DETAILED_METRIC_SERIES`).
    detailed_series: SeriesCap,
    /// Hits not counted in a stat because its series would have gone past that bound.
    series_refused: IntCounter,
    /// statsd lines lost: a flush the server did not take, or one DogStatsD line that failed.
    pub statsd_lines_dropped: IntCounter,
    /// The admin API's calls and resets, the decision log's lines.
    pub admin: AdminMetrics,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let vec = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(vec.clone()))
        .expect("each metric is registered once");
    vec
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let vec = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(vec.clone()))
        .expect("each metric is registered once");
    vec
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("each metric is registered once");
    g
}

/// Counters named `<prefix><label><suffix>`: upstream's stats with one varying part.
#[derive(Debug)]
pub struct StatFamily {
    stats: Arc<StatStore>,
    prefix: &'static str,
    suffix: &'static str,
}

impl StatFamily {
    /// The counter for `label` (the `prometheus` crate's name for this, so callers read alike).
    pub fn with_label_values(&self, label: &[&str]) -> Counter {
        let part = label.first().copied().unwrap_or_default();
        self.stats
            .counter(&format!("{}{part}{}", self.prefix, self.suffix))
    }
}

impl Metrics {
    /// `near_limit_ratio` is upstream's `NEAR_LIMIT_RATIO`; upstream's default mapping, no
    /// extra tags, no statsd sink.
    pub fn new(near_limit_ratio: f64) -> Self {
        Self::with_stats(
            near_limit_ratio,
            StatStore::new(true, Mapper::upstream_default(), Vec::new(), false),
        )
    }

    /// Response times on `/metrics` in milliseconds, still under the `_seconds` name, when
    /// `in_ms` (upstream's `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`, kept for dashboards made
    /// before upstream's series moved to seconds).
    pub fn with_response_time_in_ms(mut self, in_ms: bool) -> Self {
        self.response_time_scale = if in_ms { 1000.0 } else { 1.0 };
        self
    }

    /// At most `max` stat series named after request values (`detailed_metric`,
    /// `value_to_metric`, an override's runtime key; `MAX_DETAILED_METRIC_SERIES`, 0: no
    /// bound). Past it, a new value's hits go uncounted in upstream's stats and are counted in
    /// `sluice_stat_series_refused_total`; series already made keep counting.
    pub fn with_detailed_series_cap(mut self, max: usize) -> Self {
        self.detailed_series = SeriesCap::new(max);
        self
    }

    /// Metrics whose upstream stats go to `stats`.
    pub fn with_stats(near_limit_ratio: f64, stats: StatStore) -> Self {
        let stats = Arc::new(stats);
        let r = Registry::new();
        let (response_time, store_call) = latency_histograms(&r);
        let stores = StoreMetrics::register(&r);
        let connections = ConnectionMetrics::register(&r);
        let inputs = InputMetrics::register(&r);
        let pressure = PressureMetrics::register(&r);
        let rlqs = RlqsMetrics::register(&r);
        Self {
            near_limit_ratio,
            global_shadow_mode: stats.counter("ratelimit.service.global_shadow_mode"),
            config_load_success: stats.counter("ratelimit.service.config_load_success"),
            config_load_error: stats.counter("ratelimit.service.config_load_error"),
            errors: StatFamily {
                stats: stats.clone(),
                prefix: "ratelimit.service.call.should_rate_limit.",
                suffix: "",
            },
            total_requests: StatFamily {
                stats: stats.clone(),
                prefix: "ratelimit_server.",
                suffix: ".total_requests",
            },
            stats,
            response_time,
            response_time_scale: 1.0,
            store_call,
            script_errors: stores.script_errors,
            store_errors: stores.store_errors,
            failed_open: stores.failed_open,
            degraded_decisions: stores.degraded_decisions,
            degraded_replicas: stores.degraded_replicas,
            serving_degraded: stores.serving_degraded,
            breaker_open: stores.breaker_open,
            memory_entries: stores.memory_entries,
            memory_evictions: stores.memory_evictions,
            memory_limiter_states: stores.memory_limiter_states,
            limiter_clients_refused: stores.limiter_clients_refused,
            limiter_releases: stores.limiter_releases,
            connections_open: connections.connections_open,
            connections_rejected: connections.connections_rejected,
            connections_closed: connections.connections_closed,
            pressure,
            rlqs,
            descriptors_refused: inputs.descriptors_refused,
            long_parts: inputs.long_parts,
            releases: inputs.releases,
            calls_deadline_too_short: inputs.calls_deadline_too_short,
            detailed_series: SeriesCap::new(DEFAULT_DETAILED_SERIES),
            series_refused: inputs.series_refused,
            statsd_lines_dropped: inputs.statsd_lines_dropped,
            admin: AdminMetrics::register(&r),
            registry: r,
        }
    }

    /// A descriptor refused without being judged (`reason` is a fixed label, never request text).
    pub fn record_refused_descriptor(&self, reason: &'static str) {
        self.descriptors_refused.with_label_values(&[reason]).inc();
    }

    /// A concurrency release: it found every lease it gave back, or fewer (`nothing_held`).
    pub fn record_release(&self, found_all: bool) {
        let result = ["nothing_held", "returned"][usize::from(found_all)];
        self.releases.with_label_values(&[result]).inc();
    }

    /// A domain, key or value over its input limit (`part`).
    pub fn record_long_part(&self, part: &'static str) {
        self.long_parts.with_label_values(&[part]).inc();
    }

    /// Upstream's split of a descriptor's hits into within/near/over the limit.
    pub fn record(
        &self,
        counters: &ConfigCounters,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
        hits: u64,
        outcome: &Outcome,
    ) {
        let Quota::PerUnit {
            requests_per_unit,
            algorithm,
            ..
        } = limit.quota
        else {
            return;
        };
        let key = stats_key(limit, entries);
        let counters = counters_of(counters, limit, matches!(key, Cow::Borrowed(_)));
        let count = |which: RuleMetric, n: u64| self.count_rule(counters, which, domain, &key, n);
        count(RuleMetric::TotalHits, hits);
        // The windows count hits against requests_per_unit; the buckets against their burst.
        let capacity = u64::from(algorithm.burst().unwrap_or(requests_per_unit));
        let after = match algorithm {
            Algorithm::FixedWindow
            | Algorithm::SlidingWindowLog
            | Algorithm::SlidingWindowCounter => outcome.used.max(hits),
            _ if outcome.admitted => capacity - outcome.remaining.min(capacity),
            _ => capacity + hits,
        };
        let (within, near, over) = split(hits, after, capacity, self.near_limit_ratio);
        if within > 0 {
            count(RuleMetric::WithinLimit, within);
        }
        if near > 0 {
            count(RuleMetric::NearLimit, near);
        }
        if over > 0 {
            count(RuleMetric::OverLimit, over);
            // Upstream counts only the hits over the limit as shadow_mode hits.
            if limit.shadow_mode {
                count(RuleMetric::ShadowMode, over);
            }
        }
    }

    /// Hits the local over-limit cache refused (also counted by [`Metrics::record`]).
    pub fn record_local_cache(
        &self,
        counters: &ConfigCounters,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
        hits: u64,
    ) {
        let key = stats_key(limit, entries);
        let counters = counters_of(counters, limit, matches!(key, Cow::Borrowed(_)));
        self.count_rule(
            counters,
            RuleMetric::OverLimitWithLocalCache,
            domain,
            &key,
            hits,
        );
    }

    /// Adds `n` to one of upstream's per-rule stats: through the limit's resolved handles
    /// (`counters`) when its stats key is the config's, else looked up by name within the
    /// bound on series named after request values.
    fn count_rule(
        &self,
        counters: Option<&RuleCounters>,
        which: RuleMetric,
        domain: &str,
        key: &str,
        n: u64,
    ) {
        if let Some(counters) = counters {
            counters.get(self, which, domain, key).inc_by(n);
            return;
        }
        let name = self.rule_stat_name(which, domain, key);
        match self.stats.counter_within(&name, &self.detailed_series) {
            Some(counter) => counter.inc_by(n),
            None => self.series_refused.inc(),
        }
    }

    /// The families a store's measurements go into (`store::layers::measured`).
    pub fn store_measures(&self) -> Measures {
        Measures {
            call_seconds: self.store_call.clone(),
            errors: self.store_errors.clone(),
            script_errors: self.script_errors.clone(),
        }
    }

    /// Upstream's stats of one Redis pool (`pool`: `redis_pool`, or `redis_per_second_pool` for
    /// `REDIS_PERSECOND`): `ratelimit.<pool>.cx_active` (a gauge), `cx_total` and
    /// `cx_local_close`, read from the store's own counts whenever a sink shows them.
    #[cfg(feature = "redis")]
    pub fn observe_redis_pool(&self, pool: &str, connections: Arc<ConnectionCounts>) {
        let stat = |name: &str| format!("ratelimit.{pool}.{name}");
        let counts = connections.clone();
        self.stats
            .observe(&stat("cx_active"), Observe::Gauge, move || counts.open());
        let counts = connections.clone();
        self.stats
            .observe(&stat("cx_total"), Observe::Counter, move || counts.opened());
        self.stats
            .observe(&stat("cx_local_close"), Observe::Counter, move || {
                connections.closed()
            });
    }

    /// Upstream's stats of its local cache (`ratelimit.localcache.*`, gauges as upstream's
    /// freecache figures are), each read with `figures` whenever a sink shows them.
    /// `averageAccessTime` is not reported: the cache keeps no access times.
    pub fn observe_local_cache(&self, figures: impl Fn() -> CacheFigures + Send + Sync + 'static) {
        let figures = Arc::new(figures);
        type Field = fn(&CacheFigures) -> u64;
        let fields: [(&str, Field); 7] = [
            ("lookupCount", |f| f.lookups),
            ("hitCount", |f| f.hits),
            ("missCount", |f| f.misses),
            ("overwriteCount", |f| f.overwrites),
            ("evacuateCount", |f| f.evacuations),
            ("expiredCount", |f| f.expired),
            ("entryCount", |f| f.entries),
        ];
        for (name, field) in fields {
            let figures = figures.clone();
            self.stats.observe(
                &format!("ratelimit.localcache.{name}"),
                Observe::Gauge,
                move || field(&figures()),
            );
        }
    }

    /// The request counter and response time of one API (upstream's
    /// `ratelimit_server.<method>.*`).
    pub fn api(&self, method: &str) -> ApiMetrics {
        ApiMetrics {
            requests: self.total_requests.with_label_values(&[method]),
            response_time: ResponseTime {
                histogram: self.response_time.with_label_values(&[method]),
                scale: self.response_time_scale,
                stat: format!("ratelimit_server.{method}.response_time").into(),
                stats: self.stats.clone(),
            },
        }
    }

    /// The counter of one of upstream's per-rule stats of `domain` and stats `key`.
    fn rule_stat(&self, which: RuleMetric, domain: &str, key: &str) -> Counter {
        self.stats.counter(&self.rule_stat_name(which, domain, key))
    }

    /// The statsd name of one of upstream's per-rule stats of `domain` and stats `key`.
    fn rule_stat_name(&self, which: RuleMetric, domain: &str, key: &str) -> String {
        let suffix = match which {
            RuleMetric::TotalHits => "total_hits",
            RuleMetric::WithinLimit => "within_limit",
            RuleMetric::NearLimit => "near_limit",
            RuleMetric::OverLimit => "over_limit",
            RuleMetric::ShadowMode => "shadow_mode",
            RuleMetric::OverLimitWithLocalCache => "over_limit_with_local_cache",
        };
        let name = stats::sanitize(&format!("{domain}.{key}"));
        format!("ratelimit.service.rate_limit.{name}.{suffix}")
    }

    /// The text exposition of every metric: Sluice's own, then upstream's stats as mapped.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding metrics to memory cannot fail");
        self.stats.render_prometheus(&mut out);
        out
    }
}

/// What the local over-limit cache reports (upstream's freecache figures): all since the start
/// but `entries`, which is what it holds now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheFigures {
    /// Keys looked up.
    pub lookups: u64,
    /// Lookups that found the key over its limit.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// A key remembered again while still held.
    pub overwrites: u64,
    /// A key not remembered for lack of room.
    pub evacuations: u64,
    /// Entries dropped because their window had ended.
    pub expired: u64,
    /// Keys held now.
    pub entries: u64,
}

impl std::ops::AddAssign for CacheFigures {
    fn add_assign(&mut self, other: Self) {
        self.lookups += other.lookups;
        self.hits += other.hits;
        self.misses += other.misses;
        self.overwrites += other.overwrites;
        self.evacuations += other.evacuations;
        self.expired += other.expired;
        self.entries += other.entries;
    }
}

/// The handles of one API's request metrics, resolved once by its server.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    /// `ratelimit_server.<method>.total_requests`.
    pub requests: Counter,
    /// `ratelimit_server.<method>.response_time`.
    pub response_time: ResponseTime,
}

/// Upstream's response-time timer of one API: Sluice's histogram on `/metrics`, timer samples
/// for a statsd sink.
#[derive(Debug, Clone)]
pub struct ResponseTime {
    histogram: Histogram,
    /// [`Metrics::with_response_time_in_ms`].
    scale: f64,
    stat: Arc<str>,
    stats: Arc<StatStore>,
}

impl ResponseTime {
    /// Measures until the guard is dropped.
    pub fn start_timer(&self) -> ResponseTimer<'_> {
        ResponseTimer {
            of: self,
            start: Instant::now(),
        }
    }
}

/// Records the time since [`ResponseTime::start_timer`] when dropped.
pub struct ResponseTimer<'a> {
    of: &'a ResponseTime,
    start: Instant,
}

impl Drop for ResponseTimer<'_> {
    fn drop(&mut self) {
        let elapsed = self.start.elapsed();
        self.of
            .histogram
            .observe(elapsed.as_secs_f64() * self.of.scale);
        self.of
            .stats
            .time(&self.of.stat, elapsed.as_secs_f64() * 1000.0);
    }
}

/// The limit's counters in `table`, when its stats key is `fixed` (the same for every request:
/// `stats_key` borrowed it from the limit) and the limit came from the configuration (an
/// override has no id).
fn counters_of<'t>(
    table: &'t ConfigCounters,
    limit: &Limit,
    fixed: bool,
) -> Option<&'t RuleCounters> {
    table.0.get(limit.id.filter(|_| fixed)?)
}

/// The per-rule counters, in the order of [`RuleCounters`]'s cells.
#[derive(Clone, Copy)]
enum RuleMetric {
    TotalHits,
    WithinLimit,
    NearLimit,
    OverLimit,
    ShadowMode,
    OverLimitWithLocalCache,
}

/// A limit's per-rule counters (upstream's stats of its domain and stats key), each resolved on
/// first use.
///
/// Looking a stat up builds its name, hashes it and takes the store's lock, and a request did
/// that two to four times per descriptor. A limit whose stats key does not depend on the request
/// keeps its handles in the [`ConfigCounters`] of its configuration, so the lookups happen once
/// per limit and configuration. A stat is only created when first counted, as with the lookups,
/// so `/metrics` shows the same series either way.
#[derive(Default)]
pub struct RuleCounters {
    cells: [OnceLock<Counter>; 6],
}

impl RuleCounters {
    fn get(&self, metrics: &Metrics, which: RuleMetric, domain: &str, key: &str) -> &Counter {
        self.cells[which as usize].get_or_init(|| metrics.rule_stat(which, domain, key))
    }
}

/// The [`RuleCounters`] of every limit of one configuration, by [`Limit::id`]. Built beside the
/// configuration and replaced with it (see `rls::RateLimiter::set_config`), so the config
/// itself holds no metric handles.
pub struct ConfigCounters(Box<[RuleCounters]>);

impl ConfigCounters {
    /// Empty cells for `limits` limits; each is resolved on first use.
    pub fn new(limits: usize) -> Self {
        Self((0..limits).map(|_| RuleCounters::default()).collect())
    }
}

impl fmt::Debug for ConfigCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigCounters({} limits)", self.0.len())
    }
}

/// The latency histograms: a request's answer (upstream's name) and one store operation.
fn latency_histograms(r: &Registry) -> (HistogramVec, HistogramVec) {
    let response_time = HistogramVec::new(
        HistogramOpts::new(
            "ratelimit_service_response_time_seconds",
            "Time to answer a rate limit request",
        )
        .buckets(latency_buckets()),
        &["grpc_method"],
    )
    .expect("valid metric");
    r.register(Box::new(response_time.clone()))
        .expect("each metric is registered once");
    let store_call = HistogramVec::new(
        HistogramOpts::new(
            "sluice_store_call_seconds",
            "Time of one store operation (check: all descriptors of a request)",
        )
        .buckets(latency_buckets()),
        &["store", "operation"],
    )
    .expect("valid metric");
    r.register(Box::new(store_call.clone()))
        .expect("each metric is registered once");
    (response_time, store_call)
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
    ]
}

/// (within, near, over) for `hits` that took the count to `after` out of `limit`: hits beyond
/// the limit are over; hits between `floor(limit × ratio)` and the limit are near; when the
/// request stayed within the limit, all its hits are within.
pub fn split(hits: u64, after: u64, limit: u64, ratio: f64) -> (u64, u64, u64) {
    let before = after.saturating_sub(hits);
    let threshold = (limit as f64 * ratio).floor() as u64;
    if after > limit {
        let over = after - before.max(limit);
        let near = limit.saturating_sub(before.max(threshold));
        (0, near, over)
    } else {
        let near = after.saturating_sub(before.max(threshold));
        (hits, near, 0)
    }
}

/// The default of `MAX_DETAILED_METRIC_SERIES`: about 1.5 KiB each (the stat, its name twice,
/// its Prometheus series), so some 15 MiB at most, and a `/metrics` page of a few MB.
pub const DEFAULT_DETAILED_SERIES: usize = 10_000;

/// From how many bytes on a request's key or value is written into a stat name as its digest.
/// A stat name is a line of every statsd flush and a series of `/metrics`: a 70 KB value made
/// a DogStatsD line too long for a datagram (issue #27). Shorter than the counter keys' bound
/// (`MAX_DESCRIPTOR_VALUE_BYTES`, 4 096) for that reason.
pub const STAT_PART_MAX_BYTES: usize = 256;

/// A key or value as it goes into a stat name: as it is, or, past [`STAT_PART_MAX_BYTES`], as
/// `%%` and the 64 hex digits of its SHA-256, the form `rls::key` gives long parts of counter
/// keys (so one value has the same digest in both).
fn stat_part(text: &str) -> Cow<'_, str> {
    if text.len() <= STAT_PART_MAX_BYTES {
        return Cow::Borrowed(text);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut out = String::with_capacity(66);
    out.push_str("%%");
    for byte in digest.as_ref() {
        let _ = write!(out, "{byte:02x}");
    }
    Cow::Owned(out)
}

/// Upstream's stats key (without the domain): the config path, `<key>_<runtime value>` at
/// `value_to_metric` levels or everywhere with `detailed_metric`, runtime values for an override;
/// a limit of a `rate_limits` list adds `_<label>` to the last segment (`Stats::suffix`).
pub fn stats_key<'l>(limit: &'l Limit, entries: &[DescriptorEntry]) -> Cow<'l, str> {
    // Keys and values are the client's bytes: shown as text, invalid UTF-8 escaped
    // (`util::shown`), then bounded for a stat name (`stat_part`).
    let runtime = |i: usize, e: &DescriptorEntry| {
        let key = shown(&e.key);
        let key = stat_part(&key);
        match limit.shared_value(i) {
            Some(pattern) => format!("{key}_{pattern}"),
            None if e.value.is_empty() => key.into_owned(),
            None => format!("{key}_{}", stat_part(&shown(&e.value))),
        }
    };
    let stats = &limit.stats;
    if limit.origin.is_none() || stats.detailed {
        let parts: Vec<String> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| runtime(i, e))
            .collect();
        return Cow::Owned(parts.join(".") + &stats.suffix);
    }
    if stats.value_levels.is_empty() {
        return Cow::Borrowed(&stats.key);
    }
    let parts: Vec<String> = stats
        .segments
        .iter()
        .enumerate()
        .map(|(i, segment)| match entries.get(i) {
            Some(e) if stats.value_levels.contains(&i) => runtime(i, e),
            _ => segment.clone(),
        })
        .collect();
    Cow::Owned(parts.join(".") + &stats.suffix)
}

#[cfg(test)]
mod tests {
    use super::{Metrics, split};

    /// Values that are not UTF-8 show in stat names with the invalid bytes as `\xNN`; valid
    /// ones exactly as before.
    #[test]
    fn stats_keys_show_bytes_that_are_not_utf8_escaped() {
        use crate::config::{Limit, Unit};
        use crate::proto::DescriptorEntry;
        let limit = Limit::from_override(5, Unit::Hour);
        let entry = |value: &[u8]| DescriptorEntry {
            key: b"user".to_vec(),
            value: value.to_vec(),
        };
        assert_eq!(
            super::stats_key(&limit, &[entry(b"userC\xff")]),
            "user_userC\\xFF"
        );
        assert_eq!(
            super::stats_key(&limit, &[entry("caf\u{e9}".as_bytes())]),
            "user_caf\u{e9}"
        );
    }

    #[test]
    fn response_times_in_milliseconds_when_asked_as_upstreams_legacy_series() {
        // 20 ms of waiting: at least 20 in milliseconds, well under 1 in seconds.
        let sum = |in_ms: bool| {
            let metrics = Metrics::new(0.8).with_response_time_in_ms(in_ms);
            let api = metrics.api("ShouldRateLimit");
            {
                let _timer = api.response_time.start_timer();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            api.response_time.histogram.get_sample_sum()
        };
        assert!(sum(true) >= 20.0, "{}", sum(true));
        let seconds = sum(false);
        assert!((0.02..1.0).contains(&seconds), "{seconds}");
    }

    #[test]
    fn upstream_worked_examples() {
        // Limit 20, ratio 0.8 (threshold 16).
        assert_eq!(split(7, 22, 20, 0.8), (0, 4, 2), "before 15, 7 hits");
        assert_eq!(split(3, 19, 20, 0.8), (3, 3, 0), "before 16, 3 hits");
        assert_eq!(split(1, 10, 20, 0.8), (1, 0, 0));
        assert_eq!(split(1, 25, 20, 0.8), (0, 0, 1), "already over");
    }
}
