//! Calls whose caller's deadline is too short for the store (issue #40): the one answer both
//! gRPC services that ask a store (RLS `ShouldRateLimit`, the native API) give them, and its
//! count.
//!
//! A caller chooses its deadline (`grpc-timeout`). One already past, or below
//! `GRPC_MIN_TIMEOUT`, cannot be met by a store call, and a store call started anyway races its
//! timer: before this, the timer's end was a store failure, which `fail_open` answered OK and
//! `local_share` decided on counts of its own, so a caller could be admitted on a limit already
//! used up by sending `grpc-timeout: 1n`. Such a call is answered `DEADLINE_EXCEEDED` at once,
//! the store not asked ([`DeadlineFloor::check`]), on either store, so callers see the same
//! answer whichever store serves them. A store call that ran out of a caller's deadline shorter
//! than the store may take while the store answered (`StoreError::CallerDeadline`) gets the
//! same answer ([`DeadlineFloor::ran_out`]). Neither is a store error: no breaker, no failure
//! policy, no upstream error stat (upstream never answers for a caller's deadline); both are
//! counted in `sluice_calls_deadline_too_short_total`.

use std::time::Duration;

use prometheus::IntCounter;
use tonic::Status;

use crate::metrics::Metrics;
use crate::store::deadline;

/// The floor of one gRPC service, and its counts.
#[derive(Clone)]
pub(crate) struct DeadlineFloor {
    /// `GRPC_MIN_TIMEOUT`.
    floor: Duration,
    /// Refused before asking the store.
    before_store: IntCounter,
    /// Ran out during a store call while the store answered.
    in_store: IntCounter,
}

impl DeadlineFloor {
    /// The floor `floor` of the service `service` (the metric's `service` label).
    pub(crate) fn new(floor: Duration, service: &str, metrics: &Metrics) -> Self {
        let counter = |stage| {
            metrics
                .calls_deadline_too_short
                .with_label_values(&[service, stage])
        };
        Self {
            floor,
            before_store: counter("before_store"),
            in_store: counter("in_store"),
        }
    }

    /// `DEADLINE_EXCEEDED` when the call being served carries a deadline that leaves less than
    /// the floor (or has passed); to be asked before anything asks the store.
    pub(crate) fn check(&self) -> Result<(), Status> {
        if deadline::too_short(self.floor) {
            self.before_store.inc();
            return Err(Status::deadline_exceeded(format!(
                "the call's deadline leaves less than {:?} (GRPC_MIN_TIMEOUT), less than a \
                 store call needs: not decided",
                self.floor
            )));
        }
        Ok(())
    }

    /// The answer to a call whose store call ran out of its caller's deadline (`message`, the
    /// store's error) while the store was answering.
    pub(crate) fn ran_out(&self, message: String) -> Status {
        self.in_store.inc();
        Status::deadline_exceeded(message)
    }
}
