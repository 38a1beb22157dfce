//! A replica's share of a limit while the store is down: the rule's numbers divided by the
//! replica count, so that the replicas' local decisions together stay within the limit.
//!
//! Each count is divided rounding down, with a floor of 1 (see [`count`]); per algorithm the
//! share is:
//!
//! * fixed window, sliding log, sliding counter: `limit` per window of the same length;
//! * GCRA (token and leaky bucket): the same rate split n ways (the interval between permits
//!   times n) and `burst` divided;
//! * warm-up: `permits_per_window` divided, the warm-up period and cold factor kept (they are
//!   a shape, not an amount).

use crate::store::{LimiterRecord, Rule};

/// `total` split over `replicas`: rounded down, so the replicas' shares add up to at most
/// `total`, but never below 1. A limit smaller than the replica count cannot be split (two
/// permits over three replicas): each replica then admits 1, so the fleet admits at most
/// `replicas` where the limit says `total`; refusing everything instead would turn a store
/// outage into an outage of whatever the limit protects. So the bound while degraded is
/// `max(total, replicas)` (`replicas * max(1, total / replicas)`).
pub fn count(total: u64, replicas: u64) -> u64 {
    (total / replicas.max(1)).max(1)
}

/// The rule a replica applies on its own while the store is down.
pub fn rule(rule: &Rule, replicas: u64) -> Rule {
    let n = replicas.max(1);
    match rule {
        Rule::FixedWindow {
            limit,
            window_secs,
            window_start,
        } => Rule::FixedWindow {
            limit: count(*limit, n),
            window_secs: *window_secs,
            window_start: *window_start,
        },
        Rule::SlidingWindowLog { limit, window } => Rule::SlidingWindowLog {
            limit: count(*limit, n),
            window: *window,
        },
        Rule::SlidingWindowCounter { limit, window } => Rule::SlidingWindowCounter {
            limit: count(*limit, n),
            window: *window,
        },
        Rule::Gcra { interval, burst } => Rule::Gcra {
            interval: interval.saturating_mul(n),
            burst: count(*burst, n),
        },
        Rule::WarmUp {
            permits_per_window,
            window,
            warmup,
            cold_factor,
        } => Rule::WarmUp {
            permits_per_window: count(*permits_per_window, n),
            window: *window,
            warmup: *warmup,
            cold_factor: *cold_factor,
        },
        // Each replica may hold its share of the leases; a release gives back what it took.
        Rule::Concurrency {
            limit,
            lease,
            release,
        } => Rule::Concurrency {
            limit: count(*limit, n),
            lease: *lease,
            release: *release,
        },
    }
}

/// A named limiter's record as a replica applies it on its own: its rule's share, and no call
/// may take more than that share at once.
pub fn record(record: &LimiterRecord, replicas: u64) -> LimiterRecord {
    LimiterRecord {
        rule: rule(&record.rule, replicas),
        capacity: count(record.capacity, replicas),
        per_client: record.per_client,
        description: record.description.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_at_most_the_limit_but_never_to_nothing() {
        assert_eq!(count(100, 3), 33);
        assert_eq!(count(2, 3), 1, "a limit below the replica count: 1 each");
        assert_eq!(count(0, 3), 1);
        assert_eq!(count(7, 0), 7, "no replica count known: the whole limit");
        for total in 0..200u64 {
            for n in 1..12u64 {
                assert!(n * count(total, n) <= total.max(n), "{total} over {n}");
            }
        }
    }

    #[test]
    fn every_algorithm_is_scaled() {
        let fixed = Rule::FixedWindow {
            limit: 30,
            window_secs: 60,
            window_start: 120,
        };
        assert_eq!(
            rule(&fixed, 3),
            Rule::FixedWindow {
                limit: 10,
                window_secs: 60,
                window_start: 120
            }
        );
        let gcra = Rule::Gcra {
            interval: 1_000,
            burst: 9,
        };
        assert_eq!(
            rule(&gcra, 3),
            Rule::Gcra {
                interval: 3_000,
                burst: 3
            }
        );
        let warm = Rule::WarmUp {
            permits_per_window: 10,
            window: 1_000_000,
            warmup: 5_000_000,
            cold_factor: 3.0,
        };
        let Rule::WarmUp {
            permits_per_window, ..
        } = rule(&warm, 4)
        else {
            panic!("not a warm-up");
        };
        assert_eq!(permits_per_window, 2);
    }
}
