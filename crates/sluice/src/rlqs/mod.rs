//! The Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): Sluice as the quota
//! server of Envoy's `rate_limit_quota` filter. Envoy decides each request locally from an
//! assignment (allow all, deny all, a token bucket) and reports its usage every reporting
//! interval; this module turns the reports into assignments.
//!
//! A report's usage is folded into the same counters as RLS: each bucket is one descriptor
//! (`bucket.rs`), its allowed requests are charged through [`RateLimiter::should_rate_limit`]
//! (so RLS and RLQS callers of one limit share it, on either store, with every algorithm, the
//! per-second store and the failure policy), and its demand (allowed + denied) is counted in
//! windows of its own beside it, across replicas when the store is Redis. Each Envoy gets the
//! fraction of the limit its demand is of everyone's (`share.rs`); a window whose budget is
//! spent is answered `DENY_ALL` until it ends. Per stream, the state is the domain and the
//! buckets the Envoy reported (`stream.rs`). The server crate only carries messages
//! (`server/rlqs.rs`). docs/decisions/0039-rlqs.md says why it is so.

mod bucket;
mod decide;
mod share;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use stream::QuotaStream;

use crate::metrics::Metrics;
use crate::rls::RateLimiter;

/// Bounds and windows of the quota service.
#[derive(Debug, Clone)]
pub struct RlqsOptions {
    /// Streams open at once in the process; one more is refused (`RESOURCE_EXHAUSTED`).
    pub max_streams: usize,
    /// Buckets one stream may hold; reports of more are left unanswered (Envoy keeps its
    /// `no_assignment_behavior` for them) and counted.
    pub max_buckets_per_stream: usize,
    /// The length of a demand window in seconds: the shares follow the demand of the last
    /// complete one and the current one. At least twice the time between an Envoy's reports
    /// (Envoy 1.40 reports every 5 s, whatever `reporting_interval` says).
    pub demand_window_secs: u64,
    /// A bucket not reported for this long is dropped from its stream and abandoned.
    pub idle_bucket: Duration,
}

impl Default for RlqsOptions {
    fn default() -> Self {
        Self {
            max_streams: 1024,
            max_buckets_per_stream: 1000,
            demand_window_secs: 10,
            idle_bucket: Duration::from_secs(300),
        }
    }
}

/// Why a stream was not served.
#[derive(Debug, thiserror::Error)]
pub enum RlqsError {
    /// [`RlqsOptions::max_streams`] streams are open.
    #[error("{0} quota streams are open, the most this server serves")]
    TooManyStreams(usize),
}

/// The quota service shared by every stream.
#[derive(Debug)]
pub struct QuotaServer {
    limiter: Arc<RateLimiter>,
    options: RlqsOptions,
    metrics: Option<Arc<Metrics>>,
    streams: AtomicUsize,
}

impl QuotaServer {
    /// A quota server that counts through `limiter` (its configuration, store and keys).
    pub fn new(limiter: Arc<RateLimiter>, options: RlqsOptions) -> Self {
        Self {
            limiter,
            options,
            metrics: None,
            streams: AtomicUsize::new(0),
        }
    }

    /// Records reports, assignments and streams in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// A new stream's state, or a refusal past [`RlqsOptions::max_streams`].
    pub fn open_stream(self: &Arc<Self>) -> Result<QuotaStream, RlqsError> {
        let max = self.options.max_streams;
        let taken = self
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            if let Some(m) = &self.metrics {
                m.rlqs.refused("streams");
            }
            return Err(RlqsError::TooManyStreams(max));
        }
        if let Some(m) = &self.metrics {
            m.rlqs.streams.inc();
        }
        Ok(QuotaStream::new(self.clone()))
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Acquire)
    }

    fn stream_closed(&self) {
        self.streams.fetch_sub(1, Ordering::AcqRel);
        if let Some(m) = &self.metrics {
            m.rlqs.streams.dec();
        }
    }
}

#[cfg(test)]
mod tests;
