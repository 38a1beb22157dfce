//! The arithmetic of an RLQS assignment: which fraction of a limit one Envoy gets from the demand
//! it reported against everyone's, and the token bucket that fraction becomes. Pure functions,
//! so the rules are stated (and tested) once; `stream.rs` feeds them what the store counted.
//!
//! Why these numbers (docs/decisions/0039-rlqs.md): Envoy 1.40 reads a token bucket's
//! `fill_interval` in whole seconds and refills the bucket to `max_tokens` whenever an
//! assignment changes it, so the fill interval is ten units of the limit (a tenth of a request
//! per unit of precision), the burst is small (a tenth of a second of the share, at least one
//! token) and an assignment within a tenth of the previous one is not changed at all.

use crate::proto::envoy::r#type::v3::TokenBucket;

/// How many units of the limit one fill interval spans: the share's precision is 1/this of a
/// request per unit.
const FILL_UNITS: u64 = 10;

/// The burst an assignment allows, in seconds of its rate (at least one token).
const BURST_SECS: f64 = 0.1;

/// A new share within this fraction of the one Envoy holds is not sent: each change refills
/// Envoy's bucket.
const HYSTERESIS: f64 = 0.1;

/// What one reporter sent and what all reporters of a bucket sent, in two demand windows: the
/// last complete one and the current one (this reporter's report already counted in both
/// totals where it belongs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Demand {
    /// This reporter's demand (allowed + denied) in the previous window.
    pub(crate) mine_before: u64,
    /// Everyone's in the previous window.
    pub(crate) all_before: u64,
    /// This reporter's in the current window so far.
    pub(crate) mine_now: u64,
    /// Everyone's in the current window so far.
    pub(crate) all_now: u64,
}

/// The fraction of the limit one reporter gets: its demand over everyone's in the last complete
/// window, where every reporter counts the same reports, so the fractions add up to exactly one.
/// A reporter that sent nothing then (it is new) gets its part of both windows so far. With no
/// demand anywhere, the whole limit.
pub(crate) fn fraction(d: Demand) -> f64 {
    if d.mine_before > 0 && d.all_before >= d.mine_before {
        return d.mine_before as f64 / d.all_before as f64;
    }
    let mine = d.mine_before.saturating_add(d.mine_now);
    let all = d.all_before.saturating_add(d.all_now).max(mine);
    if all == 0 {
        return 1.0;
    }
    mine as f64 / all as f64
}

/// The token bucket for `fraction` of a limit of `requests_per_unit` per `unit_secs`: fills
/// `fraction × requests_per_unit` per unit (at least a tenth of a request per unit), holds a
/// tenth of a second of that (at least one token).
pub(crate) fn token_bucket(requests_per_unit: u64, unit_secs: u64, fraction: f64) -> TokenBucket {
    let unit_secs = unit_secs.max(1);
    let per_unit = requests_per_unit as f64 * fraction.clamp(0.0, 1.0);
    let per_fill = (per_unit * FILL_UNITS as f64)
        .round()
        .clamp(1.0, f64::from(u32::MAX)) as u32;
    let per_sec = per_unit / unit_secs as f64;
    let burst = (per_sec * BURST_SECS)
        .ceil()
        .clamp(1.0, f64::from(u32::MAX)) as u32;
    TokenBucket {
        max_tokens: burst,
        tokens_per_fill: Some(per_fill),
        fill_interval: Some(prost_types::Duration {
            seconds: i64::try_from(unit_secs.saturating_mul(FILL_UNITS)).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        name: String::new(),
    }
}

/// Whether `new` is close enough to `held` (what Envoy was last sent) to leave Envoy's bucket as
/// it is: the same interval, the fill within [`HYSTERESIS`].
pub(crate) fn close_enough(held: &TokenBucket, new: &TokenBucket) -> bool {
    let (Some(a), Some(b)) = (held.tokens_per_fill, new.tokens_per_fill) else {
        return false;
    };
    held.fill_interval == new.fill_interval
        && (f64::from(a) - f64::from(b)).abs() <= HYSTERESIS * f64::from(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(mine_before: u64, all_before: u64, mine_now: u64, all_now: u64) -> Demand {
        Demand {
            mine_before,
            all_before,
            mine_now,
            all_now,
        }
    }

    #[test]
    fn the_last_window_decides_and_shares_add_up_to_one() {
        let a = fraction(demand(135, 180, 0, 0));
        let b = fraction(demand(45, 180, 0, 0));
        assert!((a - 0.75).abs() < 1e-9 && (b - 0.25).abs() < 1e-9);
        assert!((a + b - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_new_reporter_gets_its_part_of_both_windows() {
        assert!((fraction(demand(0, 16, 1, 4)) - 0.05).abs() < 1e-9);
        assert_eq!(fraction(demand(0, 0, 0, 0)), 1.0);
        assert_eq!(fraction(demand(0, 10, 0, 10)), 0.0);
    }

    #[test]
    fn a_share_becomes_a_bucket_envoy_reads_in_whole_seconds() {
        let b = token_bucket(20, 1, 0.75);
        assert_eq!(b.tokens_per_fill, Some(150));
        assert_eq!(b.fill_interval.unwrap().seconds, 10);
        assert_eq!(b.max_tokens, 2);
        // Never zero, whatever the fraction.
        let none = token_bucket(20, 1, 0.0);
        assert_eq!((none.tokens_per_fill, none.max_tokens), (Some(1), 1));
        let minute = token_bucket(600, 60, 1.0);
        assert_eq!(minute.fill_interval.unwrap().seconds, 600);
        assert_eq!(minute.tokens_per_fill, Some(6000));
    }

    #[test]
    fn small_changes_are_not_sent() {
        let held = token_bucket(20, 1, 0.75);
        assert!(close_enough(&held, &token_bucket(20, 1, 0.7)));
        assert!(!close_enough(&held, &token_bucket(20, 1, 0.6)));
        assert!(!close_enough(&held, &token_bucket(20, 60, 0.75)));
    }
}
