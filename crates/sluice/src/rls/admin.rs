//! What the admin API (issue #42) asks of the decision path: the counters one descriptor is
//! counted under, read without charging, and reset. The descriptor goes through the same
//! matching, `replaces` and key naming as a request (`plan.rs`), so what is read or reset is
//! exactly the counters the next request with that descriptor is judged under, in the store
//! (the per-second one too) the request path would ask. Nothing here runs on the request path.

use super::plan::RequestPlan;
use super::{Active, RateLimiter};
use crate::config::{Domain, Quota};
use crate::proto::{DescriptorEntry, RateLimitDescriptor, RateLimitRequest};
use crate::store::{Charging, Check, Marks, Outcome, StoreError};

/// One limit a descriptor is counted under, as the store holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterReport {
    /// The limit's `name`, empty when unnamed.
    pub name: String,
    /// The algorithm as the config spells it (`fixed_window`, `token_bucket`, …).
    pub algorithm: &'static str,
    /// `requests_per_unit`.
    pub limit: u32,
    /// The unit (`second` … `year`).
    pub unit: &'static str,
    /// The window in seconds (`unit` × `unit_multiplier`).
    pub window_secs: u64,
    /// What the algorithm counts as used (windows: the count; buckets: burst minus remaining).
    pub used: u64,
    /// What could still be admitted now.
    pub remaining: u64,
    /// Milliseconds until the limit is fully replenished, or, when nothing remains, until one
    /// more hit would be admitted.
    pub reset_ms: u64,
    /// Whether the limit's refusals are answered OK (the limit's `shadow_mode`, or `SHADOW_MODE`).
    pub shadow_mode: bool,
}

/// Why the admin API could not answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No configuration was ever installed.
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The domain is not in the configuration in force.
    #[error("no domain {0:?} in the configuration")]
    UnknownDomain(String),
    /// The descriptor names nothing to look up (no entries, or more than a request may carry).
    #[error("{0}")]
    BadDescriptor(String),
    /// A refund of a limit whose algorithm cannot give hits back
    /// ([`crate::store::refundable`]); nothing was given back.
    #[error(
        "{0} cannot give hits back (only fixed_window, token_bucket, gcra and leaky_bucket can); nothing was refunded"
    )]
    NotRefundable(&'static str),
    /// The store could not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RateLimiter {
    /// The counters `entries` (one descriptor of `domain`) is counted under, read without
    /// charging anything ([`Charging::LookOnly`], every check with 0 hits). An unlimited or
    /// unmatched descriptor has none.
    pub async fn peek_counters(
        &self,
        domain: &str,
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<Vec<CounterReport>, AdminError> {
        let request = self.admin_request(domain, entries)?;
        let active = self.active.load();
        let (name, found) = admin_domain(active.as_deref(), domain)?;
        let plan = self.plan(name, found, &request);
        let outcomes = self.peek(&plan).await?;
        Ok(reports(self, &plan, &outcomes))
    }

    /// Resets the counters `entries` is counted under, returning them as they were just
    /// before. The over-limit cache forgets them too, so the next request asks the store.
    pub async fn reset_counters(
        &self,
        domain: &str,
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<Vec<CounterReport>, AdminError> {
        let request = self.admin_request(domain, entries)?;
        let active = self.active.load();
        let (name, found) = admin_domain(active.as_deref(), domain)?;
        let plan = self.plan(name, found, &request);
        let outcomes = self.peek(&plan).await?;
        let marks = Marks::new();
        let (mut main, mut second) = (Vec::new(), Vec::new());
        for (check, &per_second) in plan.checks.iter().zip(&plan.per_second) {
            match (&self.per_second, per_second) {
                (Some(_), true) => second.push(check.key.as_str()),
                _ => main.push(check.key.as_str()),
            }
            if let Some(cache) = &self.over_limit_cache {
                cache.forget(&check.key);
            }
        }
        if !main.is_empty() {
            self.store.reset(marks.call(None), &main).await?;
        }
        if let Some(store) = &self.per_second
            && !second.is_empty()
        {
            store.reset(marks.call(None), &second).await?;
        }
        Ok(reports(self, &plan, &outcomes))
    }

    /// Gives back up to `hits` hits to each counter `entries` is counted under (a request
    /// charged at its start for more than it turned out to use), never past an empty window or a
    /// full bucket, and answers the counters as they are after it. Refused as a whole, nothing
    /// given back, when one of them cannot ([`crate::store::refundable`]).
    pub async fn refund_counters(
        &self,
        domain: &str,
        entries: &[(Vec<u8>, Vec<u8>)],
        hits: u64,
    ) -> Result<Vec<CounterReport>, AdminError> {
        let request = self.admin_request(domain, entries)?;
        let active = self.active.load();
        let (name, found) = admin_domain(active.as_deref(), domain)?;
        let mut plan = self.plan(name, found, &request);
        if let Some(check) = plan
            .checks
            .iter()
            .find(|c| !crate::store::refundable(&c.rule))
        {
            let algorithm = plan.slots[0]
                .counted()
                .iter()
                .find(|c| plan.checks[c.check].key == check.key)
                .and_then(|c| match c.limit.quota {
                    Quota::PerUnit { algorithm, .. } => Some(algorithm.name()),
                    Quota::Unlimited => None,
                })
                .unwrap_or("this algorithm");
            return Err(AdminError::NotRefundable(algorithm));
        }
        for check in &mut plan.checks {
            check.hits = hits;
        }
        let marks = Marks::new();
        let (mut main, mut second) = (Vec::new(), Vec::new());
        for (check, &per_second) in plan.checks.iter().zip(&plan.per_second) {
            match (&self.per_second, per_second) {
                (Some(_), true) => second.push(check),
                _ => main.push(check),
            }
            if let Some(cache) = &self.over_limit_cache {
                cache.forget(&check.key);
            }
        }
        if !main.is_empty() {
            self.store.refund(marks.call(None), &main).await?;
        }
        if let Some(store) = &self.per_second
            && !second.is_empty()
        {
            store.refund(marks.call(None), &second).await?;
        }
        for check in &mut plan.checks {
            check.hits = 0;
        }
        let outcomes = self.peek(&plan).await?;
        Ok(reports(self, &plan, &outcomes))
    }

    /// `entries` as a one-descriptor request of `domain` that charges nothing.
    fn admin_request(
        &self,
        domain: &str,
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<RateLimitRequest, AdminError> {
        let max = self.options.input_limits.max_entries;
        if entries.is_empty() || entries.len() > max {
            return Err(AdminError::BadDescriptor(format!(
                "a descriptor has 1 to {max} entries (MAX_ENTRIES_PER_DESCRIPTOR), not {}",
                entries.len()
            )));
        }
        Ok(RateLimitRequest {
            domain: domain.as_bytes().to_vec(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| DescriptorEntry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                hits_addend: Some(0),
                ..Default::default()
            }],
            hits_addend: 0,
        })
    }

    /// Every check of `plan` decided with 0 hits, charging nothing, in the store the request
    /// path would ask (never the over-limit cache: the store is the truth).
    async fn peek(&self, plan: &RequestPlan<'_>) -> Result<Vec<Outcome>, StoreError> {
        if plan.checks.is_empty() {
            return Ok(Vec::new());
        }
        let checks: Vec<&Check> = plan.checks.iter().collect();
        let marks = Marks::new();
        self.decide(
            marks.call(None),
            &checks,
            &plan.per_second,
            Charging::LookOnly,
        )
        .await
    }
}

/// The domain named `domain` in the configuration in force.
fn admin_domain<'a>(
    active: Option<&'a Active>,
    domain: &str,
) -> Result<(&'a str, &'a Domain), AdminError> {
    let config = &active.ok_or(AdminError::NoConfig)?.config;
    config
        .domain_of_request(domain.as_bytes())
        .ok_or_else(|| AdminError::UnknownDomain(domain.to_string()))
}

/// The report of each limit the plan's one descriptor is counted under, in config order.
fn reports(
    limiter: &RateLimiter,
    plan: &RequestPlan<'_>,
    outcomes: &[Outcome],
) -> Vec<CounterReport> {
    let Some(slot) = plan.slots.first() else {
        return Vec::new();
    };
    slot.counted()
        .iter()
        .filter_map(|counted| {
            let limit = &*counted.limit;
            let Quota::PerUnit {
                requests_per_unit,
                unit,
                algorithm,
                ..
            } = limit.quota
            else {
                return None;
            };
            let outcome = outcomes.get(counted.check)?;
            Some(CounterReport {
                name: limit.name.clone(),
                algorithm: algorithm.name(),
                limit: requests_per_unit,
                unit: unit.name(),
                window_secs: counted.rate.window_secs,
                used: outcome.used,
                remaining: outcome.remaining,
                reset_ms: outcome.reset_ms,
                shadow_mode: limit.shadow_mode || limiter.options.shadow_mode,
            })
        })
        .collect()
}
