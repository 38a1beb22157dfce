//! Step 2 of the request path: one store call for every check of a request. The over-limit
//! cache answers the fixed windows it knows are refused (`local_cache.rs`), per-second limits go
//! to their own store when there is one (`REDIS_PERSECOND`), and
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` picks how the store charges. Each part of a split
//! request is a list of references to the plan's checks, never a copy of a key.

use tracing::Instrument;

use super::RateLimiter;
use super::plan::RequestPlan;
use crate::store::{Call, Charging, Check, Outcome, Rule, StoreError};

impl RateLimiter {
    /// Step 2: one store call (or two, with a per-second store) for every counted descriptor;
    /// none when nothing is counted.
    pub(super) async fn ask_store(
        &self,
        call: Call<'_>,
        plan: &RequestPlan<'_>,
    ) -> Result<Vec<(Outcome, bool)>, StoreError> {
        if plan.checks.is_empty() {
            return Ok(Vec::new());
        }
        let span = tracing::debug_span!(
            "store",
            kind = self.store.kind(),
            checks = plan.checks.len()
        );
        let checks: Vec<&Check> = plan.checks.iter().collect();
        self.decide_with_cache(call, &checks, &plan.per_second)
            .instrument(span)
            .await
    }

    /// A concurrency release is always answered OK: it counts whether it found the leases it
    /// gave back (`sluice_concurrency_releases_total`), then reads as admitted.
    pub(super) fn settle_releases(&self, plan: &RequestPlan<'_>, outcomes: &mut [(Outcome, bool)]) {
        for (check, (outcome, _)) in plan.checks.iter().zip(outcomes.iter_mut()) {
            if let Rule::Concurrency { release: true, .. } = check.rule {
                if let Some(m) = &self.metrics {
                    m.record_release(outcome.admitted);
                }
                outcome.admitted = true;
            }
        }
    }

    /// Answers the checks the over-limit cache knows are refused, asks the store(s) for the
    /// rest and remembers fixed windows the store refused. Each outcome says whether it came
    /// from the cache.
    ///
    /// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, the store charges only the checks that
    /// would go over when any would; and once the cache refused one check, the others are only
    /// looked at, as upstream does.
    async fn decide_with_cache(
        &self,
        call: Call<'_>,
        checks: &[&Check],
        per_second: &[bool],
    ) -> Result<Vec<(Outcome, bool)>, StoreError> {
        // A release is charged whatever the request's other checks do: under StopWhenOver it
        // could otherwise be only looked at, and the lease never given back.
        let gives_back = checks
            .iter()
            .any(|c| matches!(c.rule, Rule::Concurrency { release: true, .. }));
        let charging = if self.options.stop_increment_when_over && !gives_back {
            Charging::StopWhenOver
        } else {
            Charging::Each
        };
        let Some(cache) = &self.over_limit_cache else {
            let outcomes = self.decide(call, checks, per_second, charging).await?;
            return Ok(outcomes.into_iter().map(|o| (o, false)).collect());
        };
        let now_ms = self.clock.now_millis();
        let mut answers: Vec<Option<(Outcome, bool)>> = checks
            .iter()
            .map(|&check| {
                // A group is decided together, in the store; its refusals charge nothing, so
                // they say nothing about later requests either.
                let Rule::FixedWindow { limit, .. } = check.rule else {
                    return None;
                };
                if check.group.is_some() {
                    return None;
                }
                let reset_ms = cache.over_limit(&check.key, now_ms)?;
                let refused = Outcome {
                    admitted: false,
                    remaining: 0,
                    reset_ms,
                    // The store's count is at least this; upstream reports these hits as over.
                    used: limit + check.hits,
                };
                Some((refused, true))
            })
            .collect();
        let ask: Vec<usize> = (0..checks.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        if !ask.is_empty() {
            let asked = if ask.len() == checks.len() {
                self.decide(call, checks, per_second, charging).await?
            } else {
                let charging = match charging {
                    Charging::StopWhenOver => Charging::LookOnly,
                    other => other,
                };
                self.decide(call, &pick(checks, &ask), &pick(per_second, &ask), charging)
                    .await?
            };
            for (&i, outcome) in ask.iter().zip(asked) {
                let check = checks[i];
                // Refused with hits counted: the window's count is over its limit and only
                // grows until the window (named in the key) ends.
                if let Rule::FixedWindow {
                    window_secs,
                    window_start,
                    ..
                } = check.rule
                    && !outcome.admitted
                    && check.hits > 0
                    && check.group.is_none()
                {
                    cache.remember(&check.key, (window_start + window_secs) * 1_000, now_ms);
                }
                answers[i] = Some((outcome, false));
            }
        }
        Ok(all_answered(answers))
    }

    /// Asks the store(s): one call, or two concurrent ones when second-unit limits have their
    /// own store; outcomes come back in the order of `checks`. Each call applies `charging` to
    /// its own checks (the two stores cannot decide together).
    pub(super) async fn decide(
        &self,
        call: Call<'_>,
        checks: &[&Check],
        per_second: &[bool],
        charging: Charging,
    ) -> Result<Vec<Outcome>, StoreError> {
        let Some(second_store) = &self.per_second else {
            return self.store.check_with(call, checks, charging).await;
        };
        let (fast, slow): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| per_second[i]);
        if fast.is_empty() {
            return self.store.check_with(call, checks, charging).await;
        }
        let (fast_checks, slow_checks) = (pick(checks, &fast), pick(checks, &slow));
        let fast_call = second_store.check_with(call, &fast_checks, charging);
        let (fast_out, slow_out) = tokio::try_join!(fast_call, async {
            if slow_checks.is_empty() {
                Ok(Vec::new())
            } else {
                self.store.check_with(call, &slow_checks, charging).await
            }
        })?;
        let mut outcomes = vec![None; checks.len()];
        for (i, o) in fast
            .into_iter()
            .zip(fast_out)
            .chain(slow.into_iter().zip(slow_out))
        {
            outcomes[i] = Some(o);
        }
        Ok(all_answered(outcomes))
    }
}

/// The items at `indexes`, in that order: the part of a request one store call answers. The
/// items are references and flags, so a part copies pointers, never a check's key.
fn pick<T: Copy>(items: &[T], indexes: &[usize]) -> Vec<T> {
    indexes.iter().map(|&i| items[i]).collect()
}

/// Answers put back in request order, once every part has filled its places.
fn all_answered<T>(answers: Vec<Option<T>>) -> Vec<T> {
    answers
        .into_iter()
        .map(|a| a.expect("every check was answered"))
        .collect()
}
