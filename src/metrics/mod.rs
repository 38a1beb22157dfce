//! Prometheus metrics, served on the HTTP port at `/metrics`.
//!
//! Names and labels follow envoyproxy/ratelimit's default Prometheus mapping
//! (`ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode,
//! over_limit_with_local_cache}`
//! with `domain` and `key` labels, where `key` is upstream's stats key), so existing dashboards
//! and alerts keep working; Sluice's own metrics are prefixed `sluice_`. We use the `prometheus`
//! crate: plain atomic counters with the text exposition format, and nothing else to run (the
//! OpenTelemetry SDK would add a pipeline and an exporter for the same output).
//!
//! Label values come from the config (domains, config paths), never from request values, unless
//! the config asks for it with `detailed_metric` or `value_to_metric`: that keeps the number of
//! series bounded by the config (upstream's memory-growth complaint).

mod instrumented;

pub use instrumented::Instrumented;

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::{Algorithm, Limit, Quota};
use crate::proto::DescriptorEntry;
use crate::store::Outcome;

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    near_limit_ratio: f64,
    total_hits: IntCounterVec,
    over_limit: IntCounterVec,
    near_limit: IntCounterVec,
    within_limit: IntCounterVec,
    shadow_mode: IntCounterVec,
    over_limit_with_local_cache: IntCounterVec,
    pub global_shadow_mode: IntCounter,
    pub config_load_success: IntCounter,
    pub config_load_error: IntCounter,
    pub errors: IntCounterVec,
    pub total_requests: IntCounterVec,
    pub response_time: HistogramVec,
    pub store_call: HistogramVec,
    pub store_errors: IntCounterVec,
    /// Error replies to a script: a bug or an input the script cannot represent, never an
    /// outage (they do not count toward a circuit breaker).
    pub script_errors: IntCounterVec,
    pub failed_open: IntCounter,
    pub breaker_open: IntGaugeVec,
    pub memory_entries: IntGauge,
    pub memory_evictions: IntCounter,
    pub connections_open: IntGaugeVec,
    pub connections_rejected: IntCounterVec,
    descriptors_refused: IntCounterVec,
    long_parts: IntCounterVec,
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

impl Metrics {
    /// `near_limit_ratio` is upstream's `NEAR_LIMIT_RATIO`.
    pub fn new(near_limit_ratio: f64) -> Self {
        let r = Registry::new();
        let per_rule = ["domain", "key"];
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
        Self {
            near_limit_ratio,
            total_hits: counter_vec(
                &r,
                "ratelimit_service_rate_limit_total_hits",
                "Hits counted",
                &per_rule,
            ),
            over_limit: counter_vec(
                &r,
                "ratelimit_service_rate_limit_over_limit",
                "Hits over the limit",
                &per_rule,
            ),
            near_limit: counter_vec(
                &r,
                "ratelimit_service_rate_limit_near_limit",
                "Hits between NEAR_LIMIT_RATIO of the limit and the limit",
                &per_rule,
            ),
            within_limit: counter_vec(
                &r,
                "ratelimit_service_rate_limit_within_limit",
                "Hits within the limit",
                &per_rule,
            ),
            over_limit_with_local_cache: counter_vec(
                &r,
                "ratelimit_service_rate_limit_over_limit_with_local_cache",
                "Hits refused from the local over-limit cache, without a store call",
                &per_rule,
            ),
            shadow_mode: counter_vec(
                &r,
                "ratelimit_service_rate_limit_shadow_mode",
                "Over-limit hits answered OK by shadow mode",
                &per_rule,
            ),
            global_shadow_mode: counter(
                &r,
                "ratelimit_service_global_shadow_mode",
                "Requests answered OK by SHADOW_MODE",
            ),
            config_load_success: counter(
                &r,
                "ratelimit_service_config_load_success",
                "Configurations loaded",
            ),
            config_load_error: counter(
                &r,
                "ratelimit_service_config_load_error",
                "Configurations refused",
            ),
            errors: counter_vec(
                &r,
                "ratelimit_service_should_rate_limit_error",
                "Requests that got an error",
                &["err_type"],
            ),
            total_requests: counter_vec(
                &r,
                "ratelimit_service_total_requests",
                "Rate limit requests",
                &["grpc_method"],
            ),
            response_time,
            store_call,
            script_errors: counter_vec(
                &r,
                "sluice_script_errors_total",
                "Store operations answered with an error reply by the script (a bug or an input it \
                 cannot represent; never counted toward a circuit breaker), by store and operation",
                &["store", "operation"],
            ),
            store_errors: counter_vec(
                &r,
                "sluice_store_errors_total",
                "Store operations that failed, by store, operation and error kind",
                &["store", "operation", "error"],
            ),
            failed_open: counter(
                &r,
                "sluice_failed_open_total",
                "Requests answered OK because the store failed (FAILURE_POLICY=fail_open)",
            ),
            breaker_open: gauge_vec(
                &r,
                "sluice_circuit_breaker_open",
                "1 while the store's circuit breaker is open",
                &["store"],
            ),
            memory_entries: gauge(
                &r,
                "sluice_memory_store_entries",
                "Entries held by the memory store",
            ),
            memory_evictions: counter(
                &r,
                "sluice_memory_store_evictions_total",
                "Live entries evicted because the memory store was full",
            ),
            connections_open: gauge_vec(
                &r,
                "sluice_connections_open",
                "Connections open now, by listener (grpc, http, metrics)",
                &["listener"],
            ),
            connections_rejected: counter_vec(
                &r,
                "sluice_connections_rejected_total",
                "Connections closed at accept because MAX_CONNECTIONS were open, by listener",
                &["listener"],
            ),
            descriptors_refused: counter_vec(
                &r,
                "sluice_descriptors_refused_total",
                "Descriptors answered OVER_LIMIT without being counted, because they were beyond \
                 the input limits (too_many_descriptors, too_many_entries, bad_override_unit)",
                &["reason"],
            ),
            long_parts: counter_vec(
                &r,
                "sluice_long_descriptor_parts_total",
                "Domains, keys and values longer than their input limit, judged under a digest \
                 of their text",
                &["part"],
            ),
            registry: r,
        }
    }

    /// A descriptor refused without being judged (`reason` is a fixed label, never request text).
    pub fn record_refused_descriptor(&self, reason: &'static str) {
        self.descriptors_refused.with_label_values(&[reason]).inc();
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
        let per_request = RuleCounters::default();
        let counters =
            counters_of(counters, limit, matches!(key, Cow::Borrowed(_))).unwrap_or(&per_request);
        let labels = [domain, key.as_ref()];
        let count = |which: RuleMetric, n: u64| counters.get(self, which, &labels).inc_by(n);
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
            if limit.shadow_mode {
                count(RuleMetric::ShadowMode, hits);
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
        let labels = [domain, key.as_ref()];
        counters_of(counters, limit, matches!(key, Cow::Borrowed(_)))
            .unwrap_or(&RuleCounters::default())
            .get(self, RuleMetric::OverLimitWithLocalCache, &labels)
            .inc_by(hits);
    }

    /// The request counter and latency histogram of one API (`grpc_method` label).
    pub fn api(&self, method: &str) -> ApiMetrics {
        ApiMetrics {
            requests: self.total_requests.with_label_values(&[method]),
            response_time: self.response_time.with_label_values(&[method]),
        }
    }

    fn rule_vec(&self, which: RuleMetric) -> &IntCounterVec {
        match which {
            RuleMetric::TotalHits => &self.total_hits,
            RuleMetric::WithinLimit => &self.within_limit,
            RuleMetric::NearLimit => &self.near_limit,
            RuleMetric::OverLimit => &self.over_limit,
            RuleMetric::ShadowMode => &self.shadow_mode,
            RuleMetric::OverLimitWithLocalCache => &self.over_limit_with_local_cache,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding metrics to memory cannot fail");
        out
    }
}

/// The handles of one API's request metrics, resolved once by its server.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    pub requests: IntCounter,
    pub response_time: Histogram,
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

/// A limit's per-rule counters (labels: domain and stats key), each resolved on first use.
///
/// Looking a counter up by its labels hashes both strings and takes the vector's lock, and a
/// request did that two to four times per descriptor. A limit whose stats key does not depend on
/// the request keeps its handles in the [`ConfigCounters`] of its configuration, so the lookups
/// happen once per limit and configuration. A counter is only created when first counted, as with the
/// lookups, so `/metrics` shows the same series either way.
#[derive(Default)]
pub struct RuleCounters {
    cells: [OnceLock<IntCounter>; 6],
}

impl RuleCounters {
    fn get(&self, metrics: &Metrics, which: RuleMetric, labels: &[&str; 2]) -> &IntCounter {
        self.cells[which as usize].get_or_init(|| metrics.rule_vec(which).with_label_values(labels))
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

/// Upstream's stats key (without the domain): the config path, `<key>_<runtime value>` at
/// `value_to_metric` levels or everywhere with `detailed_metric`, runtime values for an override.
pub fn stats_key<'l>(limit: &'l Limit, entries: &[DescriptorEntry]) -> Cow<'l, str> {
    let runtime = |i: usize, e: &DescriptorEntry| match limit.shared_value(i) {
        Some(pattern) => format!("{}_{pattern}", e.key),
        None if e.value.is_empty() => e.key.clone(),
        None => format!("{}_{}", e.key, e.value),
    };
    let stats = &limit.stats;
    if limit.origin.is_none() || stats.detailed {
        let parts: Vec<String> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| runtime(i, e))
            .collect();
        return Cow::Owned(parts.join("."));
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
    Cow::Owned(parts.join("."))
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn upstream_worked_examples() {
        // Limit 20, ratio 0.8 (threshold 16).
        assert_eq!(split(7, 22, 20, 0.8), (0, 4, 2), "before 15, 7 hits");
        assert_eq!(split(3, 19, 20, 0.8), (3, 3, 0), "before 16, 3 hits");
        assert_eq!(split(1, 10, 20, 0.8), (1, 0, 0));
        assert_eq!(split(1, 25, 20, 0.8), (0, 0, 1), "already over");
    }
}
