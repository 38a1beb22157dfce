//! Calls whose caller's deadline is too short for the store (issue #40): the one answer both
//! gRPC services that ask a store (RLS `ShouldRateLimit`, the native API) give them, and its
//! count.
//!
//! A caller chooses its deadline (`grpc-timeout`). One already past, or below
//! `GRPC_MIN_TIMEOUT`, cannot be met by a store call, and a store call started anyway races its
//! timer: before this, the timer's end was a store failure, which `fail_open` answered OK and
//! `local_share` decided on counts of its own, so a caller could be admitted on a limit already
//! used up by sending `grpc-timeout: 1n`. Such a call is answered `DEADLINE_EXCEEDED` before its
//! handler runs ([`DeadlineFloor::refuse`], asked by `routes.rs` for the services that ask a
//! store), on either store, so callers see the same answer whichever store serves them. Before
//! the handler, not in it: the handler first reads the request's body, and the server's own
//! enforcement of the deadline (`serving.rs`) would cut it there with `CANCELLED`, after it may
//! have started. A store call that ran out of a caller's deadline shorter than the store may
//! take while the store answered (`StoreError::CallerDeadline`) gets the same answer
//! ([`ran_out`]). Neither is a store error: no breaker, no failure policy, no upstream error
//! stat (upstream never answers for a caller's deadline); both are counted in
//! `sluice_calls_deadline_too_short_total`.

use std::time::Duration;

use prometheus::IntCounter;
use tokio::time::Instant;
use tonic::Status;

use sluice::metrics::Metrics;
use sluice::store::deadline;

/// The floor of one gRPC service, and the count of the calls it refused.
#[derive(Clone)]
pub(crate) struct DeadlineFloor {
    /// `GRPC_MIN_TIMEOUT`.
    floor: Duration,
    refused: IntCounter,
}

impl DeadlineFloor {
    /// The floor `floor` of the service `service` (the metric's `service` label).
    pub(crate) fn new(floor: Duration, service: &str, metrics: &Metrics) -> Self {
        Self {
            floor,
            refused: metrics
                .calls_deadline_too_short
                .with_label_values(&[service, "before_store"]),
        }
    }

    /// `DEADLINE_EXCEEDED` for a call that arrived at `arrived` with `timeout` when that leaves
    /// less than the floor, or has passed; counted.
    pub(crate) fn refuse(&self, arrived: Instant, timeout: Duration) -> Option<Status> {
        if !deadline::too_short(arrived, timeout, self.floor) {
            return None;
        }
        self.refused.inc();
        Some(Status::deadline_exceeded(format!(
            "the call's deadline ({timeout:?}) leaves less than {:?} (GRPC_MIN_TIMEOUT), less \
             than a store call needs: not decided",
            self.floor
        )))
    }
}

/// The count of one service's calls whose store call ran out of the caller's deadline while
/// the store answered.
pub(crate) fn ran_out_counter(service: &str, metrics: &Metrics) -> IntCounter {
    metrics
        .calls_deadline_too_short
        .with_label_values(&[service, "in_store"])
}

/// The answer to a call whose store call ran out of its caller's deadline (`message`, the
/// store's error) while the store was answering; counted in `counter`
/// ([`ran_out_counter`]).
pub(crate) fn ran_out(counter: &IntCounter, message: String) -> Status {
    counter.inc();
    Status::deadline_exceeded(message)
}
