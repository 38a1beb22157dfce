//! `algorithm: concurrency` on in-process state: leases held at once, each living `lease`
//! microseconds unless given back. Its twin is `lua/concurrency.lua`; the two keep the same
//! shape and answer alike (tests/inflight_stores.rs).
//!
//! The state is a handful of counters by expiry, not one entry per lease: an acquisition's
//! leases expire at `now + lease` rounded up to a step of `lease / 64` (at least 1 ms), and
//! acquisitions that round to the same step share one counter. So a state holds at most 65
//! counters whatever the limit and whatever a request's `hits` (a client chooses them), a charge
//! costs the same at 1 lease and at 100 000, and a lease outlives its `lease` by less than a
//! step, never dies before it (docs/decisions/0038-concurrency-leases-as-counters-by-expiry.md
//! has the measurements against a sorted set of lease ids).
//!
//! A release gives back the leases that would expire soonest: a release names no lease (Envoy
//! cannot carry one from the request's start to its end), and the soonest are the oldest, the
//! ones most likely to belong to the request that ended.

use std::collections::VecDeque;

use super::Outcome;

/// Leases by expiry: (expiry in microseconds, leases), soonest first, expiries distinct.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Leases {
    by_expiry: VecDeque<(u64, u64)>,
}

impl Leases {
    /// The leases held.
    pub(crate) fn held(&self) -> u64 {
        self.by_expiry.iter().map(|&(_, n)| n).sum()
    }

    fn drop_expired(&mut self, now: u64) {
        while self.by_expiry.front().is_some_and(|&(at, _)| at <= now) {
            self.by_expiry.pop_front();
        }
    }

    fn add(&mut self, at: u64, n: u64) {
        let i = self.by_expiry.partition_point(|&(t, _)| t < at);
        match self.by_expiry.get_mut(i) {
            Some(entry) if entry.0 == at => entry.1 += n,
            _ => self.by_expiry.insert(i, (at, n)),
        }
    }

    /// Gives back up to `n` leases, soonest-expiring first; returns how many it gave back.
    fn give_back(&mut self, n: u64) -> u64 {
        let mut left = n;
        while left > 0 {
            let Some(front) = self.by_expiry.front_mut() else {
                break;
            };
            let taken = left.min(front.1);
            front.1 -= taken;
            left -= taken;
            if front.1 == 0 {
                self.by_expiry.pop_front();
            }
        }
        n - left
    }

    /// When enough leases will have expired for `needed` more to fit under `limit`.
    fn room_at(&self, needed: u64, limit: u64) -> Option<u64> {
        let mut over = (self.held() + needed).saturating_sub(limit);
        for &(at, n) in &self.by_expiry {
            if n >= over {
                return Some(at);
            }
            over -= n;
        }
        None
    }

    fn last_expiry(&self) -> Option<u64> {
        self.by_expiry.back().map(|&(at, _)| at)
    }

    /// Gives back up to `n` of the leases that expire at `at` (the step a native API lease id
    /// names), none when no live lease expires then; returns how many. Unlike a release by
    /// descriptor, it never takes from another step: a lease id names the one it was counted in.
    pub(crate) fn give_back_at(&mut self, at: u64, n: u64, now: u64) -> u64 {
        self.drop_expired(now);
        let Ok(i) = self.by_expiry.binary_search_by_key(&at, |&(t, _)| t) else {
            return 0;
        };
        let entry = &mut self.by_expiry[i];
        let taken = n.min(entry.1);
        entry.1 -= taken;
        if entry.1 == 0 {
            self.by_expiry.remove(i);
        }
        taken
    }
}

/// The step expiries are rounded up to: a 64th of the lease, at least 1 ms.
pub(crate) fn expiry_step(lease: u64) -> u64 {
    (lease / 64).max(1_000)
}

/// When leases taken at `now` expire: `now + lease` rounded up to the step.
pub(crate) fn expiry_of(now: u64, lease: u64) -> u64 {
    let step = expiry_step(lease);
    let at = now.saturating_add(lease);
    match at % step {
        0 => at,
        r => at.saturating_add(step - r),
    }
}

fn ms_until(at: u64, now: u64) -> u64 {
    at.saturating_sub(now).div_ceil(1000).max(1)
}

/// Takes (or with `release` gives back) `hits` leases of at most `limit` held at once, each
/// living `lease` microseconds. A zero-hit acquisition looks: admitted when one more lease
/// would fit, and takes nothing. Twin of `concurrency` in `lua/concurrency.lua`.
///
/// Returns the outcome and the leases to keep with how long (`None`: keep the state as it was,
/// or none when emptied); the memory store wraps them as its state (`memory/state.rs`), so this
/// module needs nothing of `algorithms.rs`, which names its state.
pub(crate) fn concurrency(
    state: Option<Box<Leases>>,
    hits: u64,
    limit: u64,
    (lease, release): (u64, bool),
    now: u64,
) -> (Outcome, Option<(Box<Leases>, u64)>) {
    let mut leases = state.unwrap_or_default();
    leases.drop_expired(now);
    let (admitted, changed) = if release {
        (leases.give_back(hits) == hits, hits > 0)
    } else {
        let probe = hits.max(1);
        let admitted = probe <= limit && leases.held() + probe <= limit;
        if admitted && hits > 0 {
            leases.add(expiry_of(now, lease), hits);
        }
        (admitted, admitted && hits > 0)
    };
    let held = leases.held();
    let reset_ms = match (admitted || release, leases.last_expiry()) {
        (_, None) => 1,
        (true, Some(last)) => ms_until(last, now),
        (false, Some(_)) if hits.max(1) > limit => lease.div_ceil(1000).max(1),
        (false, Some(_)) => leases
            .room_at(hits.max(1), limit)
            .map_or(1, |at| ms_until(at, now)),
    };
    let outcome = Outcome {
        admitted,
        remaining: limit.saturating_sub(held),
        reset_ms,
        used: held,
    };
    // Emptied by this call: an empty state is no state (the memory store removes it).
    let keep = leases.last_expiry().map(|last| (leases, last - now));
    (outcome, keep.filter(|_| changed || held > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 64_000_000;

    fn run(state: &mut Option<Box<Leases>>, hits: u64, release: bool, now: u64) -> Outcome {
        let (outcome, keep) = concurrency(state.take(), hits, 5, (LEASE, release), now);
        *state = keep.map(|(s, _)| s);
        outcome
    }

    #[test]
    fn five_leases_then_refused_until_one_is_given_back() {
        let mut state = None;
        for i in 0..5 {
            let o = run(&mut state, 1, false, 1_000 + i);
            assert!(o.admitted);
            assert_eq!(o.remaining, 4 - i);
        }
        let refused = run(&mut state, 1, false, 2_000);
        assert!(!refused.admitted);
        // The soonest lease expires a lease after it was taken, rounded up to its step (1 s).
        assert_eq!(refused.reset_ms, 64_998);
        assert!(run(&mut state, 1, true, 3_000).admitted);
        assert!(run(&mut state, 1, false, 4_000).admitted);
        assert!(!run(&mut state, 1, false, 5_000).admitted);
    }

    #[test]
    fn a_release_with_no_lease_held_gives_nothing_and_says_so() {
        let mut state = None;
        let o = run(&mut state, 1, true, 1_000);
        assert!(!o.admitted);
        assert!(state.is_none());
        run(&mut state, 2, false, 1_000);
        // Three asked back, two held: both given back, the shortfall reported.
        let o = run(&mut state, 3, true, 2_000);
        assert!(!o.admitted);
        assert_eq!(o.used, 0);
        assert!(state.is_none());
    }

    #[test]
    fn leases_expire_after_their_lease_and_no_sooner() {
        let mut state = None;
        run(&mut state, 5, false, 0);
        assert!(!run(&mut state, 1, false, LEASE - 1).admitted);
        assert!(run(&mut state, 1, false, LEASE).admitted);
    }

    #[test]
    fn a_state_never_holds_more_than_65_counters() {
        let mut state = None;
        for i in 0..10_000u64 {
            let now = i * (LEASE / 500);
            run(&mut state, 1, false, now);
            run(&mut state, 1, true, now + 1);
            run(&mut state, 1, false, now + 2);
        }
        let Some(leases) = &state else {
            panic!("a state is held");
        };
        assert!(leases.by_expiry.len() <= 65, "{}", leases.by_expiry.len());
    }

    #[test]
    fn a_release_at_one_expiry_takes_only_from_that_step() {
        let mut state = None;
        run(&mut state, 2, false, 0);
        run(&mut state, 2, false, 10_000_000);
        let mut leases = state.clone().unwrap();
        let first = expiry_of(0, LEASE);
        // Three asked back at the first step: only its two are there.
        assert_eq!(leases.give_back_at(first, 3, 20_000_000), 2);
        assert_eq!(leases.held(), 2);
        // A step nobody was counted in, and a step already expired, give nothing.
        assert_eq!(leases.give_back_at(first + 1, 1, 20_000_000), 0);
        let second = expiry_of(10_000_000, LEASE);
        assert_eq!(leases.give_back_at(second, 1, second), 0);
    }

    #[test]
    fn more_hits_than_the_limit_are_refused_without_touching_the_state() {
        let mut state = None;
        let o = run(&mut state, 6, false, 0);
        assert!(!o.admitted);
        assert!(state.is_none());
    }
}
