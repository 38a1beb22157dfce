//! What the memory store keeps for one key: an algorithm's state and its expiry ([`Entry`]),
//! alike for the RLS counters in the shards (`table.rs`) and the named limiters in their own
//! table (`named.rs`); the one place a rule's algorithm runs on such a state ([`run_rule`]); and
//! what a state holds against its limit ([`hits_held`]), by which eviction ranks counters. The
//! algorithms themselves are in `store/algorithms.rs`.

use crate::store::Rule;
use crate::store::algorithms::{self, State};
use crate::store::concurrency;

/// One key's state and when it ends.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) state: State,
    /// Microseconds on the store's clock.
    pub(super) expires_at: u64,
}

/// Runs `rule`'s algorithm on the state `found` (`None`: none, or expired). One place for the
/// counters and the named limiters.
pub(super) fn run_rule(
    rule: &Rule,
    found: Option<State>,
    hits: u64,
    record_refused: bool,
    take: bool,
    now: u64,
) -> algorithms::Step {
    match *rule {
        Rule::FixedWindow {
            limit,
            window_secs,
            window_start,
        } => algorithms::fixed_window(found, hits, take, limit, (window_secs, window_start), now),
        Rule::SlidingWindowLog { limit, window } => {
            algorithms::sliding_window_log(found, hits, record_refused, limit, window, now)
        }
        Rule::SlidingWindowCounter { limit, window } => {
            algorithms::sliding_window_counter(found, hits, record_refused, limit, window, now)
        }
        Rule::Gcra { interval, burst } => {
            algorithms::gcra(found, hits, record_refused, interval, burst, now)
        }
        Rule::WarmUp {
            permits_per_window,
            window,
            warmup,
            cold_factor,
        } => algorithms::warm_up(
            found,
            hits,
            record_refused,
            permits_per_window,
            window,
            warmup,
            cold_factor,
            now,
        ),
        Rule::Concurrency {
            limit,
            lease,
            release,
        } => {
            let found = match found {
                Some(State::Leases(leases)) => Some(leases),
                _ => None,
            };
            let (outcome, keep) =
                concurrency::concurrency(found, hits, limit, (lease, release), now);
            algorithms::Step {
                outcome,
                keep: keep.map(|(leases, ttl)| (State::Leases(leases), ttl)),
            }
        }
    }
}

/// What a state holds against its key's limit, in hits where the state says (0: the same as no
/// state, so dropping it changes no answer). The algorithms store no empty state and give every
/// state an expiry at the moment it would count nothing again, so 0 is a guard, not a case seen
/// in practice.
pub(super) fn hits_held(state: &State, now: u64) -> u64 {
    match state {
        State::Count(count) => *count,
        State::Log(log) => log.hits(),
        State::Windows {
            current, previous, ..
        } => u64::from(*current) + u64::from(*previous),
        // A theoretical arrival time not in the future: the bucket is full again. Otherwise
        // at least one hit is outstanding (how many would take the rule's interval).
        State::Tat(tat) => u64::from(*tat > now),
        // How far from cold it is depends on the rule's shape, which the state does not hold.
        State::WarmUp { .. } => 1,
        State::Leases(leases) => leases.held(),
    }
}
