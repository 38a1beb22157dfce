//! One RLQS stream's state: its domain (named by the first report), the buckets its Envoy
//! reported (at most [`RlqsOptions::max_buckets_per_stream`](super::RlqsOptions)), and the
//! `DENY_ALL`s that end at a window's end, when the bucket's share is pushed again without
//! waiting for a report. The server crate drives it: each report in, one response out; and
//! at [`QuotaStream::next_push`], [`QuotaStream::pushes_due`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::QuotaServer;
use super::decide::{Action, BucketState};
use crate::proto::envoy::r#type::v3::RateLimitStrategy;
use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};

/// A stream's state; dropping it closes the stream's place in the count.
#[derive(Debug)]
pub struct QuotaStream {
    server: Arc<QuotaServer>,
    domain: Option<String>,
    buckets: HashMap<BTreeMap<String, Vec<u8>>, BucketState>,
}

impl QuotaStream {
    pub(super) fn new(server: Arc<QuotaServer>) -> Self {
        Self {
            server,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// The stream's domain: the first non-empty one reported (later ones are ignored, as the
    /// protocol says a stream keeps one domain).
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Buckets the stream holds.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// The answer to one report: an action for each bucket reported (those the store could
    /// decide), and abandons for buckets idle past [`super::RlqsOptions::idle_bucket`]. `None`
    /// when there is nothing to say.
    pub async fn report(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Option<RateLimitQuotaResponse> {
        if self.domain.is_none() && !reports.domain.is_empty() {
            self.domain = Some(reports.domain);
        }
        let domain = self.domain.clone().unwrap_or_default();
        let now = Instant::now();
        let mut actions = Vec::new();
        let server = self.server.clone();
        for usage in reports.bucket_quota_usages {
            let Some(id) = usage.bucket_id.filter(|id| !id.bucket.is_empty()) else {
                continue;
            };
            let Some(b) = self.bucket(id, now) else {
                continue;
            };
            let counts = (usage.num_requests_allowed, usage.num_requests_denied);
            let Some(action) = server.decide(&domain, b, counts).await else {
                continue;
            };
            let abandon = action == Action::Abandon;
            actions.push(server.to_proto(b, action, now));
            if abandon {
                let key = b.id.bucket.clone();
                self.buckets.remove(&key);
            }
        }
        self.abandon_idle(now, &mut actions);
        (!actions.is_empty()).then_some(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// The bucket `id`'s state, made on its first report; `None` past the stream's bound.
    fn bucket(&mut self, id: BucketId, now: Instant) -> Option<&mut BucketState> {
        let max = self.server.options.max_buckets_per_stream;
        let full = self.buckets.len() >= max;
        match self.buckets.entry(id.bucket.clone()) {
            std::collections::hash_map::Entry::Occupied(held) => {
                let b = held.into_mut();
                b.reported(now);
                Some(b)
            }
            std::collections::hash_map::Entry::Vacant(_) if full => {
                if let Some(m) = &self.server.metrics {
                    m.rlqs.refused("buckets");
                }
                None
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                Some(slot.insert(BucketState::new(id, now)))
            }
        }
    }

    fn abandon_idle(&mut self, now: Instant, actions: &mut Vec<BucketAction>) {
        let idle = self.server.options.idle_bucket;
        let server = &self.server;
        self.buckets.retain(|_, b| {
            if now.saturating_duration_since(b.last_report) <= idle {
                return true;
            }
            actions.push(server.to_proto(b, Action::Abandon, now));
            false
        });
    }

    /// When the next `DENY_ALL` ends, if one does.
    pub fn next_push(&self) -> Option<Instant> {
        self.buckets.values().filter_map(|b| b.push_at).min()
    }

    /// The held shares of the buckets whose `DENY_ALL` has ended by `now`.
    pub fn pushes_due(&mut self, now: Instant) -> Option<RateLimitQuotaResponse> {
        let mut actions = Vec::new();
        let server = &self.server;
        for b in self.buckets.values_mut() {
            if b.push_at.is_some_and(|at| at <= now) {
                b.push_at = None;
                if let Some(held) = b.held.clone() {
                    actions.push(server.to_proto(b, Action::Bucket(held), now));
                }
            }
        }
        (!actions.is_empty()).then_some(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }
}

impl Drop for QuotaStream {
    fn drop(&mut self) {
        self.server.stream_closed();
    }
}

impl QuotaServer {
    /// `action` for `b` as Envoy reads it, remembering what it holds and counting it.
    fn to_proto(&self, b: &mut BucketState, action: Action, now: Instant) -> BucketAction {
        let ttl = b.time_to_live();
        let (kind, strategy, ttl) = match action {
            Action::Abandon => {
                if let Some(m) = &self.metrics {
                    m.rlqs.assigned(&b.labels, "abandon");
                }
                return BucketAction {
                    bucket_id: Some(b.id.clone()),
                    bucket_action: Some(bucket_action::BucketAction::AbandonAction(
                        AbandonAction {},
                    )),
                };
            }
            Action::Allow => {
                b.held = None;
                (
                    "allow_all",
                    Strategy::BlanketRule(BlanketRule::AllowAll as i32),
                    ttl,
                )
            }
            Action::Deny { until, share } => {
                // Envoy holds no bucket now; the share is what it gets when the window ends.
                b.held = Some(share);
                b.push_at = Some(now + until);
                // Whole seconds, rounded up: the share is pushed again at the window's end.
                let secs = until.as_secs() + u64::from(until.subsec_nanos() > 0);
                let ttl = Duration::from_secs(secs.max(1));
                (
                    "deny_all",
                    Strategy::BlanketRule(BlanketRule::DenyAll as i32),
                    ttl,
                )
            }
            Action::Bucket(bucket) => {
                b.held = Some(bucket.clone());
                ("token_bucket", Strategy::TokenBucket(bucket), ttl)
            }
        };
        if let Some(m) = &self.metrics {
            m.rlqs.assigned(&b.labels, kind);
        }
        BucketAction {
            bucket_id: Some(b.id.clone()),
            bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
                QuotaAssignmentAction {
                    assignment_time_to_live: Some(prost_types::Duration {
                        seconds: ttl.as_secs() as i64,
                        nanos: 0,
                    }),
                    rate_limit_strategy: Some(RateLimitStrategy {
                        strategy: Some(strategy),
                    }),
                },
            )),
        }
    }
}
