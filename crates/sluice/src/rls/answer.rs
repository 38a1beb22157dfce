//! Steps 3 and 4 of the request path: from the store's outcomes to the response. Each
//! descriptor's status in request order, with upstream's per-rule metrics, tallied as it is
//! built (`response::Tally`); then the overall code (quota and shadow modes) and the status the
//! headers describe, both read from the tally, and the dynamic metadata. Which of a
//! `rate_limits` list's limits decides a status is [`decider`]'s rule.

use super::plan::{Counted, Plan, RequestPlan};
use super::{RateLimiter, response};
use crate::config::Limit;
use crate::metrics::ConfigCounters;
use crate::proto::{
    Code, DescriptorStatus, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
};
use crate::store::Outcome;

/// What the answer step reads for a request: its plan, the store's outcomes (each
/// with whether the over-limit cache gave it) and the metric handles of the config in force.
struct StoreAnswer<'a, 'c> {
    counters: &'a ConfigCounters,
    plan: &'a RequestPlan<'c>,
    outcomes: &'a [(Outcome, bool)],
}

/// The statuses of one request, in request order, with what they add up to.
pub(super) struct Answers<'p> {
    statuses: Vec<DescriptorStatus>,
    /// Per status, the limit it was judged under when it is not over that limit (for the
    /// dynamic metadata; empty without it).
    passed: Vec<Option<&'p Limit>>,
    /// Per status, the length in seconds of the window of the limit it names (0: none), for
    /// the draft headers' `w=` (the protocol's unit does not carry `unit_multiplier`; empty
    /// without them).
    windows: Vec<u64>,
    tally: response::Tally,
}

impl RateLimiter {
    /// Step 3: each descriptor's status, in request order, with its per-rule metrics; what each
    /// status counts for (over the limit or not, quota or not) is tallied as it is built.
    pub(super) fn answer<'p>(
        &self,
        request: &RateLimitRequest,
        counters: &ConfigCounters,
        plan: &'p RequestPlan<'_>,
        outcomes: &[(Outcome, bool)],
    ) -> Answers<'p> {
        let store = StoreAnswer {
            counters,
            plan,
            outcomes,
        };
        // `passed` and `windows` are read only for dynamic metadata and the draft headers: left
        // empty (no allocation) otherwise.
        let n = plan.slots.len();
        let (metadata, draft) = (self.options.dynamic_metadata, self.options.draft_headers);
        let mut answers = Answers {
            statuses: Vec::with_capacity(n),
            passed: Vec::with_capacity(if metadata { n } else { 0 }),
            windows: Vec::with_capacity(if draft { n } else { 0 }),
            tally: response::Tally::default(),
        };
        for (index, (slot, descriptor)) in plan.slots.iter().zip(&request.descriptors).enumerate() {
            // The limit a counted status names, when there is one.
            let mut decided = None;
            let (status, judged) = match slot {
                // Upstream's `QUOTA_MODE` makes every descriptor that is not unlimited a quota
                // one, those without a limit (unmatched, replaced, empty) too: such a request
                // is never refused by its quota descriptors, since one of them cannot be over.
                Plan::NoLimit => (
                    response::no_limit(),
                    response::Judged {
                        quota: self.options.quota_mode,
                        ..response::Judged::NO_LIMIT
                    },
                ),
                // Refused descriptors are never quota ones: padding must not switch a limit off.
                Plan::Refused => (response::refused(), response::Judged::REFUSED),
                Plan::Unlimited => (response::unlimited(), response::Judged::NO_LIMIT),
                Plan::Counted(_) | Plan::Group(_) => {
                    let (status, judged, decider) = self.judge(&store, descriptor, slot.counted());
                    decided = decider;
                    (status, judged)
                }
            };
            answers.tally.add(index, judged);
            if metadata {
                answers.passed.push(match decided {
                    Some(c) if !judged.over => Some(&*c.limit),
                    _ => None,
                });
            }
            if draft {
                answers
                    .windows
                    .push(decided.map_or(0, |c| c.rate.window_secs));
            }
            answers.statuses.push(status);
        }
        answers
    }

    /// The status of a descriptor counted under `members` (one limit, or a `rate_limits` list),
    /// recording each limit's metrics, and the limit that decided it ([`decider`]), whose status
    /// it is.
    fn judge<'m, 'c>(
        &self,
        store: &StoreAnswer<'_, '_>,
        descriptor: &RateLimitDescriptor,
        members: &'m [Counted<'c>],
    ) -> (
        crate::proto::DescriptorStatus,
        response::Judged,
        Option<&'m Counted<'c>>,
    ) {
        let StoreAnswer {
            counters,
            plan,
            outcomes,
        } = store;
        if let Some(metrics) = &self.metrics {
            for member in members {
                let (outcome, from_cache) = &outcomes[member.check];
                let hits = plan.checks[member.check].hits;
                let (entries, limit) = (&descriptor.entries, &*member.limit);
                metrics.record(counters, plan.domain, entries, limit, hits, outcome);
                if *from_cache {
                    metrics.record_local_cache(counters, plan.domain, entries, limit, hits);
                }
            }
        }
        let Some(member) = members.get(decider(members, outcomes)) else {
            // Every limit of the list was replaced or unlimited: nothing was counted.
            return (response::no_limit(), response::Judged::NO_LIMIT, None);
        };
        let (limit, outcome) = (&*member.limit, &outcomes[member.check].0);
        if !outcome.admitted
            && let Some(log) = &self.decision_log
        {
            let decision = super::decision_log::OverLimit {
                domain: plan.domain,
                descriptor,
                limit,
                outcome,
                shadow_mode: limit.shadow_mode || self.options.shadow_mode,
            };
            log.over_limit(self.clock.now_secs(), &decision);
        }
        let judged = response::Judged {
            over: !outcome.admitted && !limit.shadow_mode,
            quota: limit.quota_mode || self.options.quota_mode,
            remaining: Some(response::remaining(outcome)),
            hidden: limit.hide_from_headers,
        };
        (
            response::counted(limit, member.rate, outcome),
            judged,
            Some(member),
        )
    }

    /// Overall code, global shadow mode, headers and metadata, from what [`Self::answer`]
    /// tallied.
    pub(super) fn finish(
        &self,
        request: &RateLimitRequest,
        answers: Answers<'_>,
    ) -> RateLimitResponse {
        let Answers {
            statuses,
            passed,
            windows,
            tally,
        } = answers;
        let over_limit = tally.over_limit();
        let overall = if over_limit && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            if over_limit {
                tracing::debug!("global shadow mode turned OVER_LIMIT into OK");
                if let Some(m) = &self.metrics {
                    m.global_shadow_mode.inc();
                }
            }
            Code::Ok
        };

        let mut reply = RateLimitResponse {
            overall_code: overall as i32,
            ..Default::default()
        };
        let headers = self.options.response_headers.is_some() || self.options.draft_headers;
        if headers && let Some(source) = tally.header_source() {
            let status = &statuses[source];
            if let Some(names) = &self.options.response_headers {
                reply.response_headers_to_add = names.headers(status);
            }
            if self.options.draft_headers {
                reply
                    .response_headers_to_add
                    .extend(response::draft_headers(status, windows[source]));
            }
        }
        if self.options.dynamic_metadata {
            let passed = passed.into_iter().flatten();
            reply.dynamic_metadata = Some(response::dynamic_metadata(request, passed));
        }
        reply.statuses = statuses;
        reply
    }
}

/// Which of a descriptor's limits decides its status: the one over its limit (of several, the
/// one that refuses longest, so `duration_until_reset` says when the request could pass), else
/// the one with the least remaining (the first of equals), as the response headers choose among
/// descriptors.
fn decider(members: &[Counted<'_>], outcomes: &[(Outcome, bool)]) -> usize {
    let outcome = |i: usize| &outcomes[members[i].check].0;
    let refused = (0..members.len())
        .filter(|&i| !outcome(i).admitted)
        .max_by_key(|&i| (outcome(i).reset_ms, std::cmp::Reverse(i)));
    refused.unwrap_or_else(|| {
        (0..members.len())
            .min_by_key(|&i| (outcome(i).remaining, i))
            .unwrap_or(0)
    })
}
