//! Step 1 of the request path: what each descriptor of a request is counted under, and the
//! checks the store is asked. A descriptor is matched in the domain's tree (or takes Envoy's
//! override; one beyond the input limits is refused on its own, [`Refusal`]), limits named by
//! another's `replaces` are dropped across the request, and each counted limit becomes a
//! [`Check`] with its key (`rls/key.rs`) and rule ([`super::rule_for`]). The store call
//! (`store_call.rs`) and the answer step (`answer.rs`) read the plan this builds.

use std::borrow::Cow;

use super::{MAX_HITS, RateLimiter, response, rule_for};
use crate::config::{Algorithm as ConfigAlgorithm, Domain, Limit, Quota, Unit};
use crate::proto::{DescriptorEntry, RateLimitDescriptor, RateLimitRequest};
use crate::store::{Check, Rule};

/// What one request asks of the store: a slot per descriptor, in request order, and the checks
/// of the counted ones (with whether each goes to the per-second store).
pub(super) struct RequestPlan<'c> {
    /// The request's domain, as the config names it.
    pub(super) domain: &'c str,
    pub(super) slots: Vec<Plan<'c>>,
    pub(super) checks: Vec<Check>,
    pub(super) per_second: Vec<bool>,
}

/// What became of one request descriptor before the store call.
// Plans live in one short Vec per request; boxing the large variant would allocate per request.
#[allow(clippy::large_enum_variant)]
pub(super) enum Plan<'c> {
    NoLimit,
    /// Could not be judged: answered OVER_LIMIT without counting (see [`Refusal`]).
    Refused,
    Unlimited,
    /// Counted under one limit.
    Counted(Counted<'c>),
    /// Counted under every limit of a `rate_limits` list, all or nothing (see
    /// [`crate::store::charged_hits`]); its status is the deciding limit's (`answer::decider`).
    Group(Vec<Counted<'c>>),
}

impl<'c> Plan<'c> {
    /// The limits this slot is counted under: one, a list's, or none.
    pub(super) fn counted(&self) -> &[Counted<'c>] {
        match self {
            Plan::Counted(one) => std::slice::from_ref(one),
            Plan::Group(members) => members,
            _ => &[],
        }
    }
}

/// One limit a descriptor is counted under: the limit, its rate (so the answer needs no second
/// look at its quota) and the index of its check.
pub(super) struct Counted<'c> {
    pub(super) limit: Cow<'c, Limit>,
    pub(super) rate: response::Rate,
    pub(super) check: usize,
}

/// The limits one descriptor matched: none, one, or a `rate_limits` list (borrowed from the
/// config; owned for an override or after `replaces` dropped some of a list).
type Matched<'c> = Option<Cow<'c, [Limit]>>;

impl RateLimiter {
    /// Step 1: each descriptor's slot (matched, with `replaces` applied across the request; a
    /// descriptor that cannot be judged is refused on its own) and the checks for the store.
    pub(super) fn plan<'c>(
        &self,
        name: &'c str,
        domain: &'c Domain,
        request: &RateLimitRequest,
    ) -> RequestPlan<'c> {
        let mut matched: Vec<Result<Matched<'c>, Refusal>> = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(index, descriptor)| self.match_one(domain, index, descriptor))
            .collect();
        drop_replaced(&mut matched);

        let now_secs = self.clock.now_secs();
        let n = request.descriptors.len();
        let (mut checks, mut per_second) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut slots = Vec::with_capacity(n);
        for (index, (limits, descriptor)) in
            matched.into_iter().zip(&request.descriptors).enumerate()
        {
            let limits = match limits {
                Err(_) => {
                    slots.push(Plan::Refused);
                    continue;
                }
                Ok(None) => {
                    slots.push(Plan::NoLimit);
                    continue;
                }
                Ok(Some(limits)) => limits,
            };
            // One limit's check, in the per-second store or not; `None` for an unlimited one.
            let count = |limit: Cow<'c, Limit>, group: Option<u32>, second: bool| {
                let Quota::PerUnit {
                    requests_per_unit,
                    unit,
                    algorithm,
                    ..
                } = limit.quota
                else {
                    return None;
                };
                let window_secs = limit.quota.window_secs().unwrap_or(unit.window_secs());
                let (key, rule) = self.counter(
                    name,
                    descriptor,
                    &limit,
                    (requests_per_unit, window_secs, algorithm),
                    now_secs,
                );
                let window_secs = period_secs(&rule, window_secs);
                per_second.push(second);
                checks.push(Check {
                    key,
                    hits: hits(request, descriptor),
                    record_refused: records_refused(&limit, algorithm),
                    group: group.filter(|_| !is_release(&rule)),
                    rule,
                });
                let rate = response::Rate {
                    requests_per_unit,
                    unit,
                    window_secs,
                };
                Some(Counted {
                    limit,
                    rate,
                    check: checks.len() - 1,
                })
            };
            slots.push(counted_slot(limits, index, count));
        }
        RequestPlan {
            domain: name,
            slots,
            checks,
            per_second,
        }
    }

    /// The key and the counting rule of one descriptor under `limit`. A release (matched only
    /// to concurrency limits) counts on its descriptor without the `sluice_release` entry.
    fn counter(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        limit: &Limit,
        (requests_per_unit, window_secs, algorithm): (u32, u64, ConfigAlgorithm),
        now_secs: u64,
    ) -> (String, Rule) {
        let release = release_of(descriptor).filter(|_| is_concurrency(limit));
        let entries = release.unwrap_or(&descriptor.entries);
        let mut rule = rule_for(
            algorithm,
            u64::from(requests_per_unit),
            window_secs * 1_000_000,
        );
        if let Rule::Concurrency { release: r, .. } = &mut rule {
            *r = release.is_some();
        }
        if let (
            Rule::FixedWindow {
                window_start,
                window_secs,
                ..
            },
            Some(calendar),
            Quota::PerUnit { unit, .. },
        ) = (&mut rule, &limit.calendar, limit.quota)
        {
            // A calendar period, named in the key; its bounds are the zone's.
            let period = calendar.period(unit, now_secs);
            *window_start = period.start;
            *window_secs = period.end - period.start;
            let key = self
                .keys
                .fixed_window(domain, entries, limit, &*period.label);
            return (key, rule);
        }
        if let Rule::FixedWindow { window_start, .. } = &mut rule {
            // Upstream's keys name the window, picked on the service clock.
            *window_start = crate::store::window_start(now_secs, window_secs);
            let key = self
                .keys
                .fixed_window(domain, entries, limit, *window_start);
            return (key, rule);
        }
        let key = self.keys.state(domain, entries, limit, algorithm.name());
        (key, rule)
    }

    /// The limit of one descriptor: none, the matched or overriding one, or a [`Refusal`] when
    /// the descriptor is beyond the input limits. Those limits bound the work and the key size a
    /// request can cause; refusing only the offending descriptor (never the request) means no
    /// client can make Envoy fail open by sending one, and still judges all the others.
    fn match_one<'c>(
        &self,
        domain: &'c Domain,
        index: usize,
        descriptor: &RateLimitDescriptor,
    ) -> Result<Matched<'c>, Refusal> {
        let max = &self.options.input_limits;
        let refused = |refusal: Refusal| {
            if let Some(m) = &self.metrics {
                m.record_refused_descriptor(refusal.label());
            }
            if let Some(held_back) = self.refusal_log.allow(self.clock.now_secs()) {
                tracing::warn!(
                    descriptor = index,
                    reason = refusal.label(),
                    held_back,
                    "descriptor refused without being counted (answered OVER_LIMIT)"
                );
            }
            Err(refusal)
        };
        if index >= max.max_descriptors {
            return refused(Refusal::TooManyDescriptors);
        }
        if descriptor.entries.len() > max.max_entries {
            return refused(Refusal::TooManyEntries);
        }
        // Upstream answers a descriptor with no entries OK (no limit can match it).
        if descriptor.entries.is_empty() {
            return Ok(None);
        }
        match &descriptor.limit {
            Some(o) => match Unit::from_override(o.unit) {
                Some(unit) => Ok(Some(Cow::Owned(vec![Limit::from_override(
                    o.requests_per_unit,
                    unit,
                )]))),
                None => refused(Refusal::BadOverrideUnit),
            },
            None => {
                if let Some(rest) = release_of(descriptor) {
                    let limits = domain.find_all(rest);
                    if limits.iter().any(is_concurrency) {
                        return Ok(Some(concurrency_only(limits)));
                    }
                }
                let limits = domain.find_all(&descriptor.entries);
                Ok((!limits.is_empty()).then_some(Cow::Borrowed(limits)))
            }
        }
    }
}

/// Why a descriptor was refused without being judged. Each is answered OVER_LIMIT (the safe
/// side: padding a request must not switch a limit off), counted in
/// `sluice_descriptors_refused_total{reason}` and logged at most once a second. None of them can
/// come from a client behind Envoy: the number of descriptors and entries and the override unit
/// are set by Envoy's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Past `MAX_DESCRIPTORS_PER_REQUEST`.
    TooManyDescriptors,
    /// More than `MAX_ENTRIES_PER_DESCRIPTOR` entries.
    TooManyEntries,
    /// A `limit` override whose unit is not one of the protocol's.
    BadOverrideUnit,
}

impl Refusal {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::TooManyDescriptors => "too_many_descriptors",
            Refusal::TooManyEntries => "too_many_entries",
            Refusal::BadOverrideUnit => "bad_override_unit",
        }
    }
}

/// The last entry's key that makes a descriptor a concurrency release (issue #44).
pub(super) const RELEASE_KEY: &[u8] = b"sluice_release";

/// The entries a release gives leases back to: all but the last, when the last entry's key is
/// [`RELEASE_KEY`] (its value is any).
pub(super) fn release_of(descriptor: &RateLimitDescriptor) -> Option<&[DescriptorEntry]> {
    match descriptor.entries.split_last() {
        Some((last, rest)) if &last.key[..] == RELEASE_KEY && !rest.is_empty() => Some(rest),
        _ => None,
    }
}

fn is_concurrency(limit: &Limit) -> bool {
    matches!(
        limit.quota,
        Quota::PerUnit {
            algorithm: ConfigAlgorithm::Concurrency,
            ..
        }
    )
}

/// A release gives back to the concurrency limits of its descriptor and counts nothing on the
/// others of its `rate_limits` list.
fn concurrency_only(limits: &[Limit]) -> Cow<'_, [Limit]> {
    if limits.iter().all(is_concurrency) {
        Cow::Borrowed(limits)
    } else {
        Cow::Owned(
            limits
                .iter()
                .filter(|l| is_concurrency(l))
                .cloned()
                .collect(),
        )
    }
}

/// Whether a check gives leases back: never part of a list's all-or-nothing decision.
fn is_release(rule: &Rule) -> bool {
    matches!(rule, Rule::Concurrency { release: true, .. })
}

/// A window's length in seconds as the rule counts it: a calendar period's is its own (a
/// 23-hour day, a 31-day month), any other the configured `nominal`.
fn period_secs(rule: &Rule, nominal: u64) -> u64 {
    match rule {
        Rule::FixedWindow { window_secs, .. } => *window_secs,
        _ => nominal,
    }
}

/// Whether a limit counts the hits of a request it refuses: with `record_refused_hits`, and
/// always on a fixed window (upstream's rule), in a `rate_limits` list too. There a refused
/// request charges only the limits that refuse it and count refused hits, so a charge made when
/// a stream ends (Envoy's `apply_on_stream_done`) that does not fit is still counted where it
/// overflows, and the zero-cost checks after it are refused (issue #31).
fn records_refused(limit: &Limit, algorithm: ConfigAlgorithm) -> bool {
    limit.record_refused_hits || matches!(algorithm, ConfigAlgorithm::FixedWindow)
}

/// Upstream's precedence: a set per-descriptor `hits_addend` wins (0 = check only); otherwise
/// the request's, where 0 means 1.
fn hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> u64 {
    let hits = match descriptor.hits_addend {
        Some(h) => h,
        None => u64::from(request.hits_addend.max(1)),
    };
    hits.min(MAX_HITS)
}

/// Drops every matched limit whose name another matched limit `replaces`. The names come from
/// every matched limit, unlimited ones included; an unlimited limit is never dropped: upstream
/// sets unlimited descriptors aside before it applies `replaces`, so they keep their unlimited
/// status (remaining 4294967295).
///
/// Each limit of a `rate_limits` list is dropped on its own: the others still count, and a list
/// left empty is no limit.
fn drop_replaced<E>(matched: &mut [Result<Matched<'_>, E>]) {
    let replaced: Vec<String> = matched
        .iter()
        .flat_map(|m| m.iter().flatten())
        .flat_map(|list| list.iter())
        .flat_map(|l| l.replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    let dropped = |l: &Limit| {
        !l.name.is_empty() && !matches!(l.quota, Quota::Unlimited) && replaced.contains(&l.name)
    };
    for slot in matched.iter_mut() {
        if let Ok(found) = slot
            && let Some(list) = found
            && list.iter().any(dropped)
        {
            let kept: Vec<Limit> = list.iter().filter(|l| !dropped(l)).cloned().collect();
            *found = (!kept.is_empty()).then_some(Cow::Owned(kept));
        }
    }
}

/// The slot of a descriptor that matched `limits`: counted under its one limit, or under every
/// limit of a `rate_limits` list as a group (`index` names it), each counted by `count`.
fn counted_slot<'c>(
    limits: Cow<'c, [Limit]>,
    index: usize,
    mut count: impl FnMut(Cow<'c, Limit>, Option<u32>, bool) -> Option<Counted<'c>>,
) -> Plan<'c> {
    let per_second = |limit: &Limit| {
        matches!(
            limit.quota,
            Quota::PerUnit {
                unit: Unit::Second,
                ..
            }
        )
    };
    if limits.len() == 1 && limits[0].member.is_none() {
        let limit = match limits {
            Cow::Borrowed(list) => Cow::Borrowed(&list[0]),
            Cow::Owned(mut list) => Cow::Owned(list.swap_remove(0)),
        };
        let second = per_second(&limit);
        return count(limit, None, second).map_or(Plan::Unlimited, Plan::Counted);
    }
    // A group is decided in one store call: it goes to the per-second store only when all of
    // its limits would.
    let second = limits.iter().all(per_second);
    let group = u32::try_from(index).unwrap_or(u32::MAX);
    let members: Vec<Cow<'c, Limit>> = match limits {
        Cow::Borrowed(list) => list.iter().map(Cow::Borrowed).collect(),
        Cow::Owned(list) => list.into_iter().map(Cow::Owned).collect(),
    };
    Plan::Group(
        members
            .into_iter()
            .filter_map(|limit| count(limit, Some(group), second))
            .collect(),
    )
}
