//! The caller's deadline, carried from the gRPC server to the store's per-call timeout
//! (issue #28, "the caller's deadline rules").
//!
//! A gRPC call's `grpc-timeout` says how long its caller will wait (Envoy sends its filter
//! timeout). A store call must not give up while the caller would still wait, nor answer after
//! the caller has gone; without a caller deadline, `REDIS_TIMEOUT` bounds it ([`budget`]).
//!
//! A caller chooses its deadline, so one too short for the store must tell nothing of the store
//! (issue #40): [`too_short`] says whether it leaves less than `GRPC_MIN_TIMEOUT` (the server
//! then answers `DEADLINE_EXCEEDED` without asking the store), and [`Budget::callers`] whether
//! a store call that runs out ran out of the caller's time rather than the store's own
//! (`StoreError::CallerDeadline`). Both are judged on the caller's own deadline, which is kept
//! beside the store's: a layer may bring the store's forward to keep time for itself
//! ([`sooner`]), and that must not make the caller's deadline look shorter than it was.
//!
//! Why a task-local: the deadline is a property of the call, like a tracing span, not of what
//! the request path computes. Passing it as an argument would change every signature between
//! the listener and the store (`rls/`, `named/`, the store traits and their instrumented
//! wrappers) for a value only the two ends read. `server/serving.rs` sets it around each gRPC
//! call's handler future ([`scope`]); the Redis store reads it when its call starts
//! ([`current`]). The store does not import `server` (ARCHITECTURE.md's module graph), so the
//! value lives here, below both. A task spawned inside the handler would not see it: the
//! store's calls run in the handler's own future, which `tests/deadline.rs` checks.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The deadlines of the call being served.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    /// The caller's deadline less [`margin`]: what the caller granted.
    caller: Instant,
    /// When the store's calls must have answered: `caller`, or earlier where a layer keeps
    /// time back for itself ([`sooner`]).
    store: Instant,
}

tokio::task_local! {
    /// The current call's deadlines; `None` when its caller sent no deadline.
    static CALLER_DEADLINE: Option<Deadlines>;
}

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

/// `handler` run with the store's deadline set to `arrived + timeout - margin(timeout)`; `None`
/// (no `grpc-timeout`) runs it as it is, and the store uses `REDIS_TIMEOUT`.
pub fn scope<F: Future>(
    arrived: Instant,
    timeout: Option<Duration>,
    handler: F,
) -> impl Future<Output = F::Output> {
    // Set even when `None`, so that this is one future of the handler's size: every gRPC call's
    // future holds it, and the server moves that future into the call's task.
    let deadlines = timeout.map(|timeout| {
        let caller = granted(arrived, timeout);
        Deadlines {
            caller,
            store: caller,
        }
    });
    CALLER_DEADLINE.scope(deadlines, handler)
}

fn deadlines() -> Option<Deadlines> {
    CALLER_DEADLINE.try_with(|d| *d).ok().flatten()
}

/// The store's deadline of the call being served, if its caller sent one.
pub fn current() -> Option<Instant> {
    deadlines().map(|d| d.store)
}

/// Whether a call that arrived at `arrived` with `timeout` leaves its store calls, from now,
/// less than `floor` (less than nothing included: already past). No store call can decide such
/// a call in time, so it is answered `DEADLINE_EXCEEDED` without asking one: never an error of
/// the store, never the failure policy's (`GRPC_MIN_TIMEOUT`, `server/deadline_floor.rs`).
pub fn too_short(arrived: Instant, timeout: Duration, floor: Duration) -> bool {
    let left = granted(arrived, timeout).saturating_duration_since(Instant::now());
    left.is_zero() || left < floor
}

/// `call` run with the store's deadline brought forward by what `reserve` keeps of the time
/// left, when the caller sent a deadline: a layer that answers on its own after the store gave
/// up (`degraded/`) needs that time. Without a caller deadline, `call` runs as it is.
pub async fn sooner<F: Future>(reserve: impl FnOnce(Duration) -> Duration, call: F) -> F::Output {
    match deadlines() {
        Some(deadlines) => {
            let left = deadlines.store.saturating_duration_since(Instant::now());
            let store = deadlines
                .store
                .checked_sub(reserve(left))
                .unwrap_or(deadlines.store);
            let sooner = Deadlines { store, ..deadlines };
            CALLER_DEADLINE.scope(Some(sooner), call).await
        }
        None => call.await,
    }
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

/// The [`Budget`] of a store call starting now whose own timeout is `default`
/// (`REDIS_TIMEOUT`).
pub fn budget(default: Duration) -> Budget {
    match deadlines() {
        Some(d) => {
            let now = Instant::now();
            Budget {
                left: d.store.saturating_duration_since(now),
                callers: d.caller.saturating_duration_since(now) < default,
            }
        }
        None => Budget {
            left: default,
            callers: false,
        },
    }
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

    #[tokio::test]
    async fn the_caller_deadline_rules_inside_the_scope_only() {
        let default = Duration::from_millis(15);
        assert_eq!(
            budget(default),
            Budget {
                left: default,
                callers: false
            }
        );
        let arrived = Instant::now();
        let long = scope(arrived, Some(Duration::from_secs(1)), async {
            budget(default)
        })
        .await;
        assert!(!long.callers, "the caller grants more than the default");
        let long = long.left;
        // 1 s less the 20 ms margin, less what the test took to get here.
        assert!(
            long > Duration::from_millis(500) && long <= Duration::from_millis(980),
            "{long:?}"
        );
        let short = scope(arrived, Some(Duration::from_millis(5)), async {
            budget(Duration::from_secs(10))
        })
        .await;
        assert!(short.callers, "the caller's deadline is the shorter");
        assert!(short.left < Duration::from_millis(5), "{short:?}");
        assert_eq!(scope(arrived, None, async { current() }).await, None);
        assert_eq!(budget(default).left, default);
    }

    #[tokio::test]
    async fn sooner_keeps_time_back_only_under_a_caller_deadline() {
        let default = Duration::from_millis(15);
        let kept = sooner(|_| Duration::from_secs(1), async { budget(default) }).await;
        assert_eq!(
            kept.left, default,
            "no caller deadline: nothing to bring forward"
        );
        let sooner_budget = scope(Instant::now(), Some(Duration::from_secs(2)), async {
            sooner(|left| left / 2, async {
                budget(Duration::from_millis(1500))
            })
            .await
        })
        .await;
        // 2 s less the 20 ms margin, halved.
        let left = sooner_budget.left;
        assert!(
            left > Duration::from_millis(500) && left <= Duration::from_millis(990),
            "{left:?}"
        );
        assert!(
            !sooner_budget.callers,
            "the caller granted 1.98 s, more than the store's own 1.5 s: time kept back by a \
             layer does not make the caller's deadline the shorter"
        );
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
