//! Sluice's own Prometheus metrics of the operators' tools (issue #42): the admin API's calls and
//! resets, and the over-limit decision log's lines written and dropped. Registered in one place,
//! apart from `mod.rs`, as the store metrics are.

use prometheus::{IntCounter, IntCounterVec, Registry};

use super::counter_vec;

/// The admin API's and the decision log's metrics ([`super::Metrics::with_stats`] registers
/// them).
#[derive(Debug, Clone)]
pub struct AdminMetrics {
    /// `sluice_admin_calls_total{api, operation, outcome}`: admin API calls, by transport
    /// (`http`, `grpc`), operation (`get`, `reset`) and outcome (`ok`, `unauthenticated`,
    /// `bad_request`, `not_found`, `unavailable`).
    pub calls: IntCounterVec,
    /// `sluice_admin_counters_reset_total`: counters reset through the admin API (a reset of a
    /// descriptor counted under two limits counts two).
    pub counters_reset: IntCounter,
    decision_log_lines: IntCounterVec,
}

impl AdminMetrics {
    pub(super) fn register(r: &Registry) -> Self {
        let counters_reset = IntCounter::new(
            "sluice_admin_counters_reset_total",
            "Counters reset through the admin API",
        )
        .expect("valid metric");
        r.register(Box::new(counters_reset.clone()))
            .expect("each metric is registered once");
        Self {
            calls: counter_vec(
                r,
                "sluice_admin_calls_total",
                "Admin API calls (ADMIN_API_TOKEN), by api (http, grpc), operation (get, reset, refund) \
                 and outcome",
                &["api", "operation", "outcome"],
            ),
            counters_reset,
            decision_log_lines: counter_vec(
                r,
                "sluice_decision_log_lines_total",
                "Over-limit decision log lines (DECISION_LOG=over_limit), written or dropped \
                 past DECISION_LOG_MAX_PER_SECOND",
                &["outcome"],
            ),
        }
    }

    /// The decision log's counters: lines written, lines dropped.
    pub fn decision_log_counters(&self) -> (IntCounter, IntCounter) {
        (
            self.decision_log_lines.with_label_values(&["written"]),
            self.decision_log_lines.with_label_values(&["dropped"]),
        )
    }
}
