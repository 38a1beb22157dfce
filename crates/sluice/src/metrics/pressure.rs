//! Sluice's own Prometheus metrics of what callers make the process hold: the bytes of gRPC
//! requests still arriving, the calls ended for holding too much or too long
//! (`server/budget.rs`), and the process's memory against its ceiling with the overload actions
//! taken near it (`server/overload.rs`). Registered in one place, apart from `mod.rs`.

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter_vec, gauge, gauge_vec};

/// The metrics of the request budget and the overload manager ([`super::Metrics::with_stats`]
/// registers them).
#[derive(Debug, Clone)]
pub struct PressureMetrics {
    /// Bytes of unfinished gRPC requests held now (waiting calls only).
    pub request_bytes_held: IntGauge,
    /// gRPC calls waiting for more of their request now.
    pub requests_waiting: IntGauge,
    /// Calls the server ended before their request was whole, by reason.
    pub requests_ended: IntCounterVec,
    /// The process's resident memory, as last sampled.
    pub memory_resident: IntGauge,
    /// The ceiling the overload actions are measured against (0: none).
    pub memory_limit: IntGauge,
    /// 1 while an overload action is on, by action.
    pub overload_active: IntGaugeVec,
    /// Times an overload action was switched on, by action.
    pub overload_actions: IntCounterVec,
}

impl PressureMetrics {
    pub(super) fn register(r: &Registry) -> Self {
        Self {
            request_bytes_held: gauge(
                r,
                "sluice_request_bytes_held",
                "Bytes of gRPC requests still arriving that the server holds (headers, what \
                 arrived, and the rest of each message declared), over calls waiting for more",
            ),
            requests_waiting: gauge(
                r,
                "sluice_requests_waiting",
                "gRPC calls whose request is not whole yet and that waited for more of it",
            ),
            requests_ended: counter_vec(
                r,
                "sluice_requests_ended_total",
                "gRPC calls ended by the server before their request was whole, by reason: \
                 request_timeout (not whole within HTTP_READ_HEADER_TIMEOUT), \
                 bytes_per_connection, bytes_per_peer, bytes_total (the largest holder under a \
                 full budget) or overload (the process near its memory ceiling)",
                &["reason"],
            ),
            memory_resident: gauge(
                r,
                "sluice_memory_resident_bytes",
                "The process's resident memory (RSS), sampled by the overload manager",
            ),
            memory_limit: gauge(
                r,
                "sluice_memory_limit_bytes",
                "The memory ceiling the overload actions are measured against \
                 (OVERLOAD_MEMORY_LIMIT, the cgroup's memory.max, or the machine's memory); 0: off",
            ),
            overload_active: gauge_vec(
                r,
                "sluice_overload_action_active",
                "1 while an overload action is on: shed_waiting_requests (at 90 % of the \
                 ceiling) or stop_accepting_connections (at 95 %)",
                &["action"],
            ),
            overload_actions: counter_vec(
                r,
                "sluice_overload_actions_total",
                "Times an overload action was switched on, by action",
                &["action"],
            ),
        }
    }
}
