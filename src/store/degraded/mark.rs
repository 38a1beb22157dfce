//! The mark that a call's answer was decided locally, carried from the `local_share` layer up
//! to whoever builds the answer (the RLS path's response header, the native API's field).
//!
//! Why a task-local, as `deadline.rs` does for the caller's deadline: whether an answer was
//! degraded is a property of the call, set by the bottom layer and read at the top. Putting it
//! on every `Outcome` or `Acquisition` would change every store's answers, their constructors
//! and the conformance tests for a flag only two ends read, and one RLS request may be several
//! store calls (the per-second store, cluster slots), any of which may be degraded: a flag for
//! the whole call, set by any of them, is exactly what the mark means. A store call outside
//! [`noting`] (a background task) sets nothing.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

tokio::task_local! {
    static DEGRADED: Arc<AtomicBool>;
}

/// Runs `call` and says whether any store call in it was decided locally.
pub async fn noting<F: Future>(call: F) -> (F::Output, bool) {
    let flag = Arc::new(AtomicBool::new(false));
    let output = DEGRADED.scope(flag.clone(), call).await;
    (output, flag.load(Ordering::Relaxed))
}

/// Marks the call being served as decided locally (nothing outside [`noting`]).
pub(super) fn set() {
    let _ = DEGRADED.try_with(|flag| flag.store(true, Ordering::Relaxed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_marked_call_is_marked() {
        let ((), marked) = noting(async { set() }).await;
        assert!(marked);
        let ((), marked) = noting(async {}).await;
        assert!(!marked);
        set(); // outside: no effect, no panic
    }
}
