//! Each Redis store call's deadline, and what its running out says of Redis (issue #28's "late,
//! not down", issue #40's "a caller's own deadline decides nothing of the store").
//!
//! A call is bounded by its caller's deadline when it sent one (its `Call`), else by
//! `REDIS_TIMEOUT`, connection checkout included. When it runs out, three different things may
//! have happened, and only one of them is an outage ([`ran_out`]): Redis is silent (it has owed
//! replies for a second and read none, `wire.rs`), Redis is slow, or the caller granted less
//! than the store may take. Telling them apart is what keeps a caller from opening the circuit
//! breaker, or being answered by the failure policy, by the deadline it sends.

use std::future::Future;
use std::time::Duration;

use super::wire::{Heard, Watch};
use crate::store::deadline::Budget;
use crate::store::{Call, StoreError};

/// `work` within `call`'s deadline: its caller's (`grpc-timeout` less a margin) when it sent
/// one, else `own` (`REDIS_TIMEOUT`). A call whose caller's deadline has already passed is not
/// started. One that runs out of time is judged by [`ran_out`], `store` being what all the
/// store's servers have been told and have said.
pub(super) async fn within<T>(
    own: Duration,
    store: &Heard,
    call: Call<'_>,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let budget = call.budget(own);
    if budget.left.is_zero() && budget.callers {
        // A zero timer still polls the call once, which may write it: its reply would race the
        // timer, for nothing the caller could use.
        return Err(StoreError::CallerDeadline(budget.left));
    }
    // Learns which servers the call waited on, to tell slow from down.
    let watch = Watch::default();
    match tokio::time::timeout(budget.left, watch.scope(work)).await {
        Ok(result) => result,
        Err(_) => Err(ran_out(&watch, store, budget)),
    }
}

/// Why a call that waited on the servers in `watch` ran out of `budget`:
///
/// 1. A server it waited on has owed replies for a second and read none (`wire.rs`,
///    [`Watch::redis_answering`]; `store` when it reached none): [`StoreError::Timeout`], an
///    outage, whoever's deadline it was. A Redis that is black-holed while every caller grants
///    less than `REDIS_TIMEOUT` (Envoy's 20 ms) still opens the breaker: its calls keep being
///    written, or its connections tried, and none is answered.
/// 2. Otherwise Redis is answering, or had no chance to (nothing was owed before this call):
///    when the caller granted less than `REDIS_TIMEOUT`, its deadline was too short for this
///    call, [`StoreError::CallerDeadline`]; the caller chose it, so it must tell nothing of the
///    store (no breaker, no failure policy).
/// 3. Else the store's own time ran out on a slow Redis: [`StoreError::Late`].
fn ran_out(watch: &Watch, store: &Heard, budget: Budget) -> StoreError {
    match (watch.redis_answering(store), budget.callers) {
        (false, _) => StoreError::Timeout(budget.left),
        (true, true) => StoreError::CallerDeadline(budget.left),
        (true, false) => StoreError::Late(budget.left),
    }
}
