//! The caller's deadline, carried from the gRPC server to the store's per-call timeout
//! (issue #28, "the caller's deadline rules").
//!
//! A gRPC call's `grpc-timeout` says how long its caller will wait (Envoy sends its filter
//! timeout). A store call must not give up while the caller would still wait, nor answer after
//! the caller has gone; without a caller deadline, `REDIS_TIMEOUT` bounds it ([`budget`]).
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

tokio::task_local! {
    /// When the current call's store calls must have answered (the caller's deadline less
    /// [`margin`]); `None` when its caller sent no deadline.
    static CALLER_DEADLINE: Option<Instant>;
}

/// The most a caller's deadline is shortened by, for the answer to travel back.
pub const MAX_MARGIN: Duration = Duration::from_millis(20);

/// What is kept of a caller's `timeout` for the answer to travel back (encoding, the h2 write,
/// the network, and a scheduler that runs the answer late on a busy machine): 10 % of it, at
/// most [`MAX_MARGIN`]. Proportional, so that short deadlines (Envoy's default 20 ms: 2 ms kept)
/// still leave the store most of the time; capped, so that a long deadline (seconds) does not
/// lose more than a busy loopback ever needs.
pub fn margin(timeout: Duration) -> Duration {
    (timeout / 10).min(MAX_MARGIN)
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
    let deadline = timeout.map(|timeout| arrived + timeout.saturating_sub(margin(timeout)));
    CALLER_DEADLINE.scope(deadline, handler)
}

/// The store's deadline of the call being served, if its caller sent one.
pub fn current() -> Option<Instant> {
    CALLER_DEADLINE
        .try_with(|deadline| *deadline)
        .ok()
        .flatten()
}

/// `call` run with the store's deadline brought forward by what `reserve` keeps of the time
/// left, when the caller sent a deadline: a layer that answers on its own after the store gave
/// up (`degraded/`) needs that time. Without a caller deadline, `call` runs as it is.
pub async fn sooner<F: Future>(reserve: impl FnOnce(Duration) -> Duration, call: F) -> F::Output {
    match current() {
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            let sooner = deadline.checked_sub(reserve(left)).unwrap_or(deadline);
            CALLER_DEADLINE.scope(Some(sooner), call).await
        }
        None => call.await,
    }
}

/// How long a store call starting now may take: until the caller's deadline when there is one
/// (whatever `default` says: the caller's wait rules), else `default` (`REDIS_TIMEOUT`).
pub fn budget(default: Duration) -> Duration {
    match current() {
        Some(deadline) => deadline.saturating_duration_since(Instant::now()),
        None => default,
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
        assert_eq!(budget(default), default);
        let arrived = Instant::now();
        let long = scope(arrived, Some(Duration::from_secs(1)), async {
            budget(default)
        })
        .await;
        // 1 s less the 20 ms margin, less what the test took to get here.
        assert!(
            long > Duration::from_millis(500) && long <= Duration::from_millis(980),
            "{long:?}"
        );
        let short = scope(arrived, Some(Duration::from_millis(5)), async {
            budget(Duration::from_secs(10))
        })
        .await;
        assert!(short < Duration::from_millis(5), "{short:?}");
        assert_eq!(scope(arrived, None, async { current() }).await, None);
        assert_eq!(budget(default), default);
    }

    #[tokio::test]
    async fn sooner_keeps_time_back_only_under_a_caller_deadline() {
        let default = Duration::from_millis(15);
        let kept = sooner(|_| Duration::from_secs(1), async { budget(default) }).await;
        assert_eq!(
            kept, default,
            "no caller deadline: nothing to bring forward"
        );
        let left = scope(Instant::now(), Some(Duration::from_secs(2)), async {
            sooner(|left| left / 2, async { budget(default) }).await
        })
        .await;
        // 2 s less the 20 ms margin, halved.
        assert!(
            left > Duration::from_millis(500) && left <= Duration::from_millis(990),
            "{left:?}"
        );
    }
}
