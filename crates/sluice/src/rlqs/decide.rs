//! One bucket's assignment from one report: judge the bucket in the configuration in force (so a
//! reload reaches open streams at their next report), charge its allowed requests to the limit's
//! counters through the RLS path, count its demand beside them, and pick the action. A store
//! that cannot answer leaves the bucket without a new assignment: Envoy keeps the one it holds
//! until its time to live runs out, then applies its `expired_assignment_behavior`.

use std::time::{Duration, Instant};

use super::QuotaServer;
use super::bucket::{self, Judged};
use super::share::{self, Demand};
use crate::config::Limit;
use crate::proto::envoy::service::rate_limit_quota::v3::BucketId;
use crate::proto::envoy::r#type::v3::TokenBucket;
use crate::proto::{Code, DescriptorEntry, RateLimitDescriptor, RateLimitRequest};
use crate::rls::DEGRADED_HEADER;
use crate::store::{Call, Charging, Check, Rule, window_start};

/// What a bucket is told.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// `ALLOW_ALL`: no limit applies (or only shadow-mode ones).
    Allow,
    /// `DENY_ALL` until the window's end, `until` from now; then `share` is pushed.
    Deny { until: Duration, share: TokenBucket },
    /// A token bucket: the Envoy's share of the limit.
    Bucket(TokenBucket),
    /// Forget the bucket: its limit is gone from the configuration, or it went idle.
    Abandon,
}

/// What one stream keeps of one bucket.
#[derive(Debug)]
pub(super) struct BucketState {
    pub(super) id: BucketId,
    entries: Vec<DescriptorEntry>,
    pub(super) last_report: Instant,
    /// The time between this bucket's reports, as seen (`None` before the second).
    gap: Option<Duration>,
    /// This stream's demand: the current window's start, its count so far, the previous one's.
    window: (u64, u64, u64),
    /// It had a limit at its last report: losing it abandons the bucket.
    limited: bool,
    /// The token bucket Envoy holds from us, if any.
    pub(super) held: Option<TokenBucket>,
    /// When a `DENY_ALL` ends and the held token bucket is sent again.
    pub(super) push_at: Option<Instant>,
    /// The metric labels: the domain and the limit as the configuration names them.
    pub(super) labels: (String, String),
}

impl BucketState {
    pub(super) fn new(id: BucketId, now: Instant) -> Self {
        Self {
            entries: bucket::entries(&id),
            id,
            last_report: now,
            gap: None,
            window: (0, 0, 0),
            limited: false,
            held: None,
            push_at: None,
            labels: (String::new(), String::new()),
        }
    }

    /// A report of this bucket arrived `now` (not the first).
    pub(super) fn reported(&mut self, now: Instant) {
        let gap = now.saturating_duration_since(self.last_report);
        // The longer of this gap and three quarters of the one before: the report Envoy sends
        // at once for a new bucket comes early, and should not shorten the time to live.
        self.gap = Some(match self.gap {
            Some(before) => gap.max(before * 3 / 4),
            None => gap,
        });
        self.last_report = now;
    }

    /// How long an assignment lives: three reporting intervals (as seen), between 2 s and
    /// 10 min; 10 s before the interval is known. Envoy 1.40 reads whole seconds.
    pub(super) fn time_to_live(&self) -> Duration {
        let Some(gap) = self.gap else {
            return Duration::from_secs(10);
        };
        let secs = (gap.as_secs_f64() * 3.0).ceil() as u64;
        Duration::from_secs(secs.clamp(2, 600))
    }

    /// Adds `demand` to this stream's count of the window starting at `start` (`len` long), and
    /// returns (mine now, mine before).
    fn count_demand(&mut self, start: u64, len: u64, demand: u64) -> (u64, u64) {
        let (at, now, _) = self.window;
        self.window = if at == start {
            (start, now + demand, self.window.2)
        } else if at + len == start {
            (start, demand, now)
        } else {
            (start, demand, 0)
        };
        (self.window.1, self.window.2)
    }
}

/// A limit charged: whether its window's budget is spent, when the window ends, and whether
/// the store decided it locally (`FAILURE_POLICY=local_share`).
struct Charged {
    spent: bool,
    reset: Duration,
    degraded: bool,
}

impl QuotaServer {
    /// The action for `b` after a report of `allowed` and `denied` requests; `None` when the
    /// store could not answer (nothing is sent for it).
    pub(super) async fn decide(
        &self,
        domain: &str,
        b: &mut BucketState,
        (allowed, denied): (u64, u64),
    ) -> Option<Action> {
        let config = self.limiter.config()?;
        let found = config.domain_of_request(domain.as_bytes());
        let name = found.map_or("", |(name, _)| name);
        let judged = bucket::judge(found.map(|(_, d)| d), &b.entries);
        let label = match &judged {
            Judged::Limited { tightest, .. } => tightest.stats.key.as_str(),
            _ => "",
        };
        if b.labels.0 != name || b.labels.1 != label {
            b.labels = (name.to_string(), label.to_string());
        }
        if let Some(m) = &self.metrics {
            m.rlqs.report(&b.labels, allowed, denied);
        }
        let Judged::Limited {
            tightest,
            requests_per_unit,
            window_secs,
            shadow,
        } = judged
        else {
            if std::mem::take(&mut b.limited) {
                return Some(Action::Abandon);
            }
            return Some(Action::Allow);
        };
        b.limited = true;
        let charged = self.charge(domain, &b.entries, allowed).await?;
        let demand = self
            .demand(name, tightest, b, allowed.saturating_add(denied))
            .await?;
        if shadow {
            return Some(Action::Allow);
        }
        // A window no longer than two reports cannot be judged from them: each report brings a
        // reporting interval's usage at once. Such limits are held by the shares alone.
        let judged_by_window = b
            .gap
            .is_some_and(|gap| Duration::from_secs(window_secs) >= gap * 2);
        let fraction = share::fraction(demand) / self.replicas_if(charged.degraded);
        let new = share::token_bucket(requests_per_unit, window_secs, fraction);
        tracing::debug!(?demand, fraction, spent = charged.spent, "RLQS share");
        let share = match &b.held {
            Some(held) if share::close_enough(held, &new) => held.clone(),
            _ => new,
        };
        if charged.spent && judged_by_window {
            return Some(Action::Deny {
                until: charged.reset,
                share,
            });
        }
        Some(Action::Bucket(share))
    }

    /// Charges `allowed` requests to the bucket's limits as an RLS request of one descriptor
    /// whose cost is `allowed` (0 only looks). `None` when the limiter could not decide.
    async fn charge(
        &self,
        domain: &str,
        entries: &[DescriptorEntry],
        allowed: u64,
    ) -> Option<Charged> {
        let request = RateLimitRequest {
            domain: domain.as_bytes().to_vec(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries.to_vec(),
                hits_addend: Some(allowed),
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let response = match self.limiter.should_rate_limit(&request, None).await {
            Ok(response) => response,
            Err(e) => {
                tracing::debug!(error = %e, "RLQS usage not charged; no assignment sent");
                return None;
            }
        };
        let status = response.statuses.first()?;
        let spent = status.code == Code::OverLimit as i32
            || (status.current_limit.is_some() && status.limit_remaining == 0);
        let reset = status.duration_until_reset.map_or(Duration::ZERO, |d| {
            Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32)
        });
        let degraded = response
            .response_headers_to_add
            .iter()
            .any(|h| h.key == DEGRADED_HEADER);
        Some(Charged {
            spent,
            reset,
            degraded,
        })
    }

    /// What a share is divided by: 1, or while the store decides locally (`local_share`: Redis
    /// is away, and the demand seen is this replica's streams' only) the replica count the
    /// layer divides every limit by, as `sluice_degraded_replicas` shows it.
    fn replicas_if(&self, degraded: bool) -> f64 {
        let replicas = match &self.metrics {
            Some(m) if degraded => m.degraded_replicas.get(),
            _ => 1,
        };
        replicas.max(1) as f64
    }

    /// Counts `demand` in the current demand window and reads everyone's in it and the one
    /// before, beside the limit's counters. `None` when the store could not answer.
    async fn demand(
        &self,
        name: &str,
        limit: &Limit,
        b: &mut BucketState,
        demand: u64,
    ) -> Option<Demand> {
        let len = self.options.demand_window_secs.max(1);
        let start = window_start(self.limiter.clock().now_secs(), len);
        let keys = self.limiter.keys();
        // Each window's count lives two windows, so the next window can still read it.
        let check = |window_start: u64, hits: u64| Check {
            key: keys.rlqs_demand(name, &b.entries, limit, (len, window_start)),
            hits,
            rule: Rule::FixedWindow {
                limit: u64::from(u32::MAX),
                window_secs: 2 * len,
                window_start,
            },
            record_refused: true,
            group: None,
        };
        let now = check(start, demand);
        let before = check(start.saturating_sub(len), 0);
        let checks = [&now, &before];
        let store = self.limiter.store();
        let outcomes = match store
            .check_with(Call::detached(), &checks, Charging::Each)
            .await
        {
            Ok(outcomes) => outcomes,
            Err(e) => {
                tracing::debug!(error = %e, "RLQS demand not counted; no assignment sent");
                return None;
            }
        };
        let (mine_now, mine_before) = b.count_demand(start, len, demand);
        Some(Demand {
            mine_before,
            all_before: outcomes.get(1)?.used,
            mine_now,
            all_now: outcomes.first()?.used,
        })
    }
}
