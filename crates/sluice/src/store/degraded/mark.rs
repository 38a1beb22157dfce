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

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static DEGRADED: Cell<bool>;
}

/// Runs `call` and says whether any store call in it was decided locally. Costs no allocation:
/// the flag lives in the returned future and is read before its scope ends.
pub async fn noting<F: Future>(call: F) -> (F::Output, bool) {
    DEGRADED
        .scope(Cell::new(false), async {
            let output = call.await;
            (output, DEGRADED.with(Cell::get))
        })
        .await
}

/// Marks the call being served as decided locally (nothing outside [`noting`]).
pub(super) fn set() {
    let _ = DEGRADED.try_with(|flag| flag.set(true));
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
