//! Sluice's own Prometheus metrics of the stores (errors, breakers, the memory store's tables,
//! `local_share`'s degraded decisions and replica count), registered in one place, apart from
//! `mod.rs` so that file stays one of upstream's stats and the record.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter, counter_vec, gauge, gauge_vec};

/// Sluice's own Prometheus metrics of the stores: errors, breakers and the memory store's
/// tables ([`super::Metrics::with_stats`] registers them).
pub(super) struct StoreMetrics {
    pub(super) script_errors: IntCounterVec,
    pub(super) store_errors: IntCounterVec,
    pub(super) failed_open: IntCounter,
    pub(super) degraded_decisions: IntCounterVec,
    pub(super) degraded_replicas: IntGauge,
    pub(super) serving_degraded: IntGauge,
    pub(super) breaker_open: IntGaugeVec,
    pub(super) memory_entries: IntGauge,
    pub(super) memory_evictions: IntCounter,
    pub(super) memory_limiter_states: IntGauge,
    pub(super) limiter_clients_refused: IntCounter,
    pub(super) limiter_releases: IntCounterVec,
}

impl StoreMetrics {
    pub(super) fn register(r: &Registry) -> Self {
        Self {
            script_errors: counter_vec(
                r,
                "sluice_script_errors_total",
                "Store operations answered with an error reply by the script (a bug or an input it \
                 cannot represent; never counted toward a circuit breaker), by store and operation",
                &["store", "operation"],
            ),
            store_errors: counter_vec(
                r,
                "sluice_store_errors_total",
                "Store operations that failed, by store, operation and error kind",
                &["store", "operation", "error"],
            ),
            failed_open: counter(
                r,
                "sluice_failed_open_total",
                "Requests answered OK because the store failed (FAILURE_POLICY=fail_open)",
            ),
            degraded_decisions: counter_vec(
                r,
                "sluice_degraded_decisions_total",
                "Store calls decided in process with this replica's share of each limit because \
                 the store was down or late (FAILURE_POLICY=local_share), by store",
                &["store"],
            ),
            degraded_replicas: gauge(
                r,
                "sluice_degraded_replicas",
                "The replica count FAILURE_POLICY=local_share divides each limit by while the \
                 store is down (DEGRADED_REPLICAS, or learnt from Redis)",
            ),
            serving_degraded: gauge(
                r,
                "sluice_serving_degraded",
                "1 while this replica stays ready (SERVING) but decides with its share of each \
                 limit because a circuit breaker of the RLS path's Redis is open \
                 (FAILURE_POLICY=local_share)",
            ),
            breaker_open: gauge_vec(
                r,
                "sluice_circuit_breaker_open",
                "1 while the store's circuit breaker is open",
                &["store"],
            ),
            memory_entries: gauge(
                r,
                "sluice_memory_store_entries",
                "Entries held by the memory store",
            ),
            memory_evictions: counter(
                r,
                "sluice_memory_store_evictions_total",
                "Live entries evicted because the memory store was full",
            ),
            memory_limiter_states: gauge(
                r,
                "sluice_memory_limiter_states",
                "Client states of named limiters held by the memory store (a table of their own, \
                 at most MEMORY_MAX_LIMITER_STATES)",
            ),
            limiter_clients_refused: counter(
                r,
                "sluice_limiter_clients_refused_total",
                "New clients of named limiters refused because a limiter (LIMITER_MAX_CLIENTS) \
                 or, on the memory store, the table (MEMORY_MAX_LIMITER_STATES) was full",
            ),
            limiter_releases: counter_vec(
                r,
                "sluice_limiter_releases_total",
                "Native API releases of concurrency leases: returned, or nothing_held when the \
                 lease's step held fewer leases than it named (expired, released already, or \
                 never this limiter's)",
                &["result"],
            ),
        }
    }
}
