//! The quota service's Prometheus metrics (`crate::rlqs`): streams open, and per domain and
//! bucket the reports, the requests Envoy says it allowed and denied, and the assignments sent.
//! Registered in one place, apart from `mod.rs`.
//!
//! A bucket's label is the name of the limit it matched as the configuration writes it
//! (upstream's stats key, the pattern for a wildcard), never the bucket id Envoy built from a
//! request, and the domain's is a configured domain or empty: the series are bounded by the
//! configuration, and in any case by [`MAX_SERIES`] (domain, bucket) pairs, past which a pair
//! is counted under the bucket `_other`.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{IntCounterVec, IntGauge, Registry};

use super::{counter_vec, gauge};

/// The most (domain, bucket) label pairs the quota metrics keep.
pub(super) const MAX_SERIES: usize = 1000;

/// The quota service's metrics ([`super::Metrics::with_stats`] registers them).
#[derive(Debug)]
pub struct RlqsMetrics {
    /// `sluice_rlqs_streams`: quota streams open now.
    pub streams: IntGauge,
    reports: IntCounterVec,
    requests: IntCounterVec,
    assignments: IntCounterVec,
    refused: IntCounterVec,
    series: Mutex<HashSet<(String, String)>>,
}

impl RlqsMetrics {
    pub(super) fn register(r: &Registry) -> Self {
        let by_bucket = ["domain", "bucket"];
        Self {
            streams: gauge(r, "sluice_rlqs_streams", "RLQS streams open now"),
            reports: counter_vec(
                r,
                "sluice_rlqs_reports_total",
                "RLQS bucket usage reports received, by domain and bucket (the limit matched)",
                &by_bucket,
            ),
            requests: counter_vec(
                r,
                "sluice_rlqs_requests_total",
                "Requests Envoy reported over RLQS, by domain, bucket and decision (allowed, denied)",
                &["domain", "bucket", "decision"],
            ),
            assignments: counter_vec(
                r,
                "sluice_rlqs_assignments_total",
                "RLQS actions sent, by domain, bucket and action (token_bucket, allow_all, deny_all, abandon)",
                &["domain", "bucket", "action"],
            ),
            refused: counter_vec(
                r,
                "sluice_rlqs_refused_total",
                "RLQS streams refused and bucket reports left unanswered at their bounds, by what (streams, buckets)",
                &["what"],
            ),
            series: Mutex::new(HashSet::new()),
        }
    }

    /// The bucket label to count `labels` under: itself while the pairs are within the bound.
    fn bucket<'a>(&self, labels: &'a (String, String)) -> &'a str {
        let Ok(mut series) = self.series.lock() else {
            return "_other";
        };
        if series.contains(labels) {
            return &labels.1;
        }
        if series.len() >= MAX_SERIES {
            return "_other";
        }
        series.insert(labels.clone());
        &labels.1
    }

    /// A report of one bucket: `allowed` and `denied` requests.
    pub fn report(&self, labels: &(String, String), allowed: u64, denied: u64) {
        let bucket = self.bucket(labels);
        let domain = labels.0.as_str();
        self.reports.with_label_values(&[domain, bucket]).inc();
        let requests = |decision: &str, n: u64| {
            self.requests
                .with_label_values(&[domain, bucket, decision])
                .inc_by(n)
        };
        requests("allowed", allowed);
        requests("denied", denied);
    }

    /// An action sent for one bucket (`kind` is a fixed name).
    pub fn assigned(&self, labels: &(String, String), kind: &'static str) {
        let bucket = self.bucket(labels);
        self.assignments
            .with_label_values(&[labels.0.as_str(), bucket, kind])
            .inc();
    }

    /// A stream refused or a bucket left unanswered at its bound (`what` is a fixed name).
    pub fn refused(&self, what: &'static str) {
        self.refused.with_label_values(&[what]).inc();
    }
}
