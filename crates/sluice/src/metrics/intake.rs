//! Sluice's own Prometheus metrics of the listeners' connections and of what was refused or
//! lost on the way in; apart from `mod.rs` only for its length (the registration of each is long
//! help text), registered once by [`Metrics::with_stats`](super::Metrics::with_stats).

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Registry};

use super::{counter, counter_vec, gauge_vec};

/// Sluice's own Prometheus metrics of the listeners' connections ([`super::Metrics::with_stats`]
/// registers them).
pub(super) struct ConnectionMetrics {
    pub(super) connections_open: IntGaugeVec,
    pub(super) connections_rejected: IntCounterVec,
    pub(super) connections_closed: IntCounterVec,
}

impl ConnectionMetrics {
    pub(super) fn register(r: &Registry) -> Self {
        Self {
            connections_open: gauge_vec(
                r,
                "sluice_connections_open",
                "Connections open now, by listener (grpc, http, metrics, debug, limiter_api)",
                &["listener"],
            ),
            connections_rejected: counter_vec(
                r,
                "sluice_connections_rejected_total",
                "Connections closed at accept, by listener and reason: max_connections (the \
                 listener was full), max_connections_per_peer (the peer had its share) or \
                 overload (a gRPC listener, while the process is near its memory ceiling)",
                &["listener", "reason"],
            ),
            connections_closed: counter_vec(
                r,
                "sluice_connections_closed_total",
                "Connections closed by the server because the client was silent, by listener \
                 and reason: handshake_timeout (TLS handshake or HTTP/2 preface), \
                 header_timeout (HTTP/1 request headers) or idle (gRPC, after a GOAWAY)",
                &["listener", "reason"],
            ),
        }
    }
}

/// Sluice's own Prometheus metrics of what was refused or lost: descriptors and parts beyond
/// the input limits, calls whose deadline was too short for the store, stat series past their
/// cap, statsd lines ([`super::Metrics::with_stats`] registers them).
pub(super) struct InputMetrics {
    pub(super) descriptors_refused: IntCounterVec,
    pub(super) long_parts: IntCounterVec,
    pub(super) releases: IntCounterVec,
    pub(super) calls_deadline_too_short: IntCounterVec,
    pub(super) series_refused: IntCounter,
    pub(super) statsd_lines_dropped: IntCounter,
}

impl InputMetrics {
    pub(super) fn register(r: &Registry) -> Self {
        Self {
            descriptors_refused: counter_vec(
                r,
                "sluice_descriptors_refused_total",
                "Descriptors answered OVER_LIMIT without being counted, because they were beyond \
                 the input limits (too_many_descriptors, too_many_entries, bad_override_unit)",
                &["reason"],
            ),
            long_parts: counter_vec(
                r,
                "sluice_long_descriptor_parts_total",
                "Domains, keys and values longer than their input limit, judged under a digest \
                 of their text",
                &["part"],
            ),
            releases: counter_vec(
                r,
                "sluice_concurrency_releases_total",
                "Concurrency releases (always OK): returned, or nothing_held when fewer \
                 leases were held than given back",
                &["result"],
            ),
            calls_deadline_too_short: counter_vec(
                r,
                "sluice_calls_deadline_too_short_total",
                "gRPC calls answered DEADLINE_EXCEEDED because the caller's deadline was shorter \
                 than the store could meet, by service and stage: before_store (below \
                 GRPC_MIN_TIMEOUT or already past: the store was not asked) or in_store (ran out \
                 during a store call while the store was answering); never the failure policy's",
                &["service", "stage"],
            ),
            series_refused: counter(
                r,
                "sluice_stat_series_refused_total",
                "Stats not counted because their series, named after a request value \
                 (detailed_metric, value_to_metric), would have gone past \
                 MAX_DETAILED_METRIC_SERIES",
            ),
            statsd_lines_dropped: counter(
                r,
                "sluice_statsd_lines_dropped_total",
                "statsd lines lost: flushes the server could not take, DogStatsD lines that \
                 failed to send",
            ),
        }
    }
}
