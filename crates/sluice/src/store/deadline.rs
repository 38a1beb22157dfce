//! The caller's deadline, and what it grants a store call (issue #28, "the caller's deadline
//! rules"; issue #40, deadlines too short for the store).
//!
//! A gRPC call's `grpc-timeout` says how long its caller will wait (Envoy sends its filter
//! timeout). A store call must not give up while the caller would still wait, nor answer after
//! the caller has gone; without a caller deadline, `REDIS_TIMEOUT` bounds it ([`Budget`]). The
//! server turns `grpc-timeout` into a [`Deadline`] (less a [`margin`] for the answer to travel)
//! and hands it to the decision paths, which give it to each store call in its
//! [`Call`](super::Call).
//!
//! A caller chooses its deadline, so one too short for the store must tell nothing of the store
//! (issue #40): [`too_short`] says whether it leaves less than `GRPC_MIN_TIMEOUT` (the server
//! then answers `DEADLINE_EXCEEDED` without asking the store), and [`Budget::callers`] whether
//! a store call that runs out ran out of the caller's time rather than the store's own
//! (`StoreError::CallerDeadline`). Both are judged on the caller's own deadline, which the call
//! keeps beside the store's: a layer may bring the store's forward to keep time for itself
//! (`Call::sooner`), and that must not make the caller's deadline look shorter than it was.

use std::time::Duration;

use tokio::time::Instant;

/// The most a caller's deadline is shortened by, for the answer to travel back.
pub const MAX_MARGIN: Duration = Duration::from_millis(20);

/// The default of `GRPC_MIN_TIMEOUT`: a call whose deadline, less the margin, leaves less than
/// this is answered `DEADLINE_EXCEEDED` without asking the store. No Redis store call on
/// loopback was seen to answer faster, quiet or with both cores of the development machine busy
/// (docs/reliability.md, "Deadlines too short for the store"): such a deadline cannot be met,
/// and a store call started anyway only races its timer. Operators whose Redis is across a
/// network raise it to that network's round trip.
pub const DEFAULT_FLOOR: Duration = Duration::from_micros(100);

/// What is kept of a caller's `timeout` for the answer to travel back (encoding, the h2 write,
/// the network, and a scheduler that runs the answer late on a busy machine): 10 % of it, at
/// most [`MAX_MARGIN`]. Proportional, so that short deadlines (Envoy's default 20 ms: 2 ms kept)
/// still leave the store most of the time; capped, so that a long deadline (seconds) does not
/// lose more than a busy loopback ever needs.
pub fn margin(timeout: Duration) -> Duration {
    (timeout / 10).min(MAX_MARGIN)
}

/// What the caller of a call that arrived at `arrived` with `timeout` grants its store calls:
/// until `arrived + timeout - margin(timeout)`.
fn granted(arrived: Instant, timeout: Duration) -> Instant {
    let granted = timeout.saturating_sub(margin(timeout));
    // A timeout too long to represent (8 digits of hours) is no deadline worth keeping.
    arrived
        .checked_add(granted)
        .unwrap_or_else(|| arrived + Duration::from_secs(86_400 * 365))
}

/// What a caller grants its store calls: until this instant (its `grpc-timeout` less the
/// [`margin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub(super) Instant);

impl Deadline {
    /// The deadline of a call that arrived at `arrived` with `timeout` (`grpc-timeout`).
    pub fn of(arrived: Instant, timeout: Duration) -> Deadline {
        Deadline(granted(arrived, timeout))
    }

    /// The instant itself.
    pub fn at(self) -> Instant {
        self.0
    }
}

/// Whether a call that arrived at `arrived` with `timeout` leaves its store calls, from now,
/// less than `floor` (less than nothing included: already past). No store call can decide such
/// a call in time, so it is answered `DEADLINE_EXCEEDED` without asking one: never an error of
/// the store, never the failure policy's (`GRPC_MIN_TIMEOUT`, `server/deadline_floor.rs`).
pub fn too_short(arrived: Instant, timeout: Duration, floor: Duration) -> bool {
    let left = granted(arrived, timeout).saturating_duration_since(Instant::now());
    left.is_zero() || left < floor
}

/// How long a store call starting now may take, and whose deadline that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Until the store's deadline when the caller sent one (whatever `REDIS_TIMEOUT` says: the
    /// caller's wait rules), else `REDIS_TIMEOUT`.
    pub left: Duration,
    /// The caller granted less than `REDIS_TIMEOUT` from now: if the call runs out of time
    /// while the store answers, the caller's deadline was too short for it, and the store is
    /// not at fault (`StoreError::CallerDeadline`). Judged on the caller's own deadline, not on
    /// one a layer brought forward for itself.
    pub callers: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_tenth_capped() {
        assert_eq!(margin(Duration::from_millis(20)), Duration::from_millis(2));
        assert_eq!(
            margin(Duration::from_millis(100)),
            Duration::from_millis(10)
        );
        assert_eq!(margin(Duration::from_millis(250)), MAX_MARGIN);
        assert_eq!(margin(Duration::from_secs(10)), MAX_MARGIN);
    }

    #[test]
    fn a_deadline_below_the_floor_or_past_is_too_short() {
        let floor = Duration::from_millis(1);
        let arrived = Instant::now();
        for timeout in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(900),
        ] {
            assert!(too_short(arrived, timeout, floor), "{timeout:?}");
        }
        // 50 ms less the 5 ms margin: 45 ms left.
        assert!(!too_short(Instant::now(), Duration::from_millis(50), floor));
        assert!(!too_short(
            Instant::now(),
            Duration::from_millis(50),
            Duration::ZERO
        ));
        assert!(
            too_short(arrived, Duration::ZERO, Duration::ZERO),
            "already past"
        );
        // 1.1 ms less the 0.11 ms margin leaves less than a millisecond.
        assert!(too_short(
            Instant::now(),
            Duration::from_micros(1100),
            floor
        ));
        let far = Duration::from_secs(99_999_999 * 3600);
        assert!(!too_short(Instant::now(), far, floor), "8 digits of hours");
    }
}
