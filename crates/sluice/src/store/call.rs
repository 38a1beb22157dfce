//! What one store call carries besides its arguments: its caller's deadline, and the marks the
//! store's layers leave for the caller (issue #41: a context in the signatures, where three
//! task-locals carried it before).
//!
//! Whoever serves a request makes a [`Marks`] for it and hands each of its store calls a
//! [`Call`]: the decision paths (`rls`, `named`) with the [`Deadline`] the server took from the
//! caller's `grpc-timeout`, `/json`, background tasks and tests with none ([`Call::detached`]).
//! The call passes by value down every layer (`store::layers`) to the store. A layer may bring
//! the store's deadline forward to keep time for itself ([`Call::sooner`]), and the
//! `local_share` layer marks a call it decided locally ([`Call::mark_degraded`]), which the
//! caller reads on its [`Marks`] once its calls are done. One request may make several store
//! calls (the per-second store, a Cluster's slots), which share its marks: any one decided
//! locally marks the request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::deadline::{Budget, Deadline};

/// What a request's store calls tell it back.
#[derive(Debug, Default)]
pub struct Marks {
    degraded: AtomicBool,
}

impl Marks {
    /// The marks of a request about to make its store calls: none yet.
    pub fn new() -> Marks {
        Marks::default()
    }

    /// A call of this request, whose caller waits until `deadline` (`None`: it sent none, and
    /// the store's own timeout bounds each call).
    pub fn call(&self, deadline: Option<Deadline>) -> Call<'_> {
        let deadline = deadline.map(Deadline::at);
        Call {
            caller: deadline,
            store: deadline,
            marks: self,
        }
    }

    /// Whether any call of this request was decided locally (`FAILURE_POLICY=local_share`).
    pub fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }
}

/// The marks of calls nobody reads them from.
static DETACHED: Marks = Marks {
    degraded: AtomicBool::new(false),
};

/// The context of one store call: its deadlines and its request's marks.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// What the caller granted: when it stops waiting (less the answer's margin).
    caller: Option<Instant>,
    /// When the store must have answered: `caller`, or earlier where a layer keeps time back
    /// for itself ([`Call::sooner`]).
    store: Option<Instant>,
    marks: &'a Marks,
}

impl Call<'static> {
    /// A call with no deadline whose marks nobody reads: background work (probes, the replica
    /// count, sweeps), and tests.
    pub fn detached() -> Call<'static> {
        DETACHED.call(None)
    }
}

impl<'a> Call<'a> {
    /// When the store must have answered, if the caller sent a deadline.
    pub fn deadline(self) -> Option<Instant> {
        self.store
    }

    /// The call with the store's deadline brought forward by what `reserve` keeps of the time
    /// left, when the caller sent a deadline: a layer that answers on its own after the store
    /// gave up (`local_share`) needs that time. The caller's deadline is kept as it was.
    pub fn sooner(self, reserve: impl FnOnce(Duration) -> Duration) -> Call<'a> {
        let Some(store) = self.store else {
            return self;
        };
        let left = store.saturating_duration_since(Instant::now());
        Call {
            store: Some(store.checked_sub(reserve(left)).unwrap_or(store)),
            ..self
        }
    }

    /// How long a store call starting now may take, its own timeout being `own`
    /// (`REDIS_TIMEOUT`), and whose deadline that is.
    pub fn budget(self, own: Duration) -> Budget {
        match (self.caller, self.store) {
            (Some(caller), Some(store)) => {
                let now = Instant::now();
                Budget {
                    left: store.saturating_duration_since(now),
                    callers: caller.saturating_duration_since(now) < own,
                }
            }
            _ => Budget {
                left: own,
                callers: false,
            },
        }
    }

    /// Marks the request as decided locally, in part at least.
    pub fn mark_degraded(self) {
        self.marks.degraded.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_deadline_rules_when_it_sent_one() {
        let own = Duration::from_millis(15);
        let marks = Marks::new();
        let none = marks.call(None).budget(own);
        assert_eq!(
            none,
            Budget {
                left: own,
                callers: false
            }
        );
        let arrived = Instant::now();
        let long = marks
            .call(Some(Deadline::of(arrived, Duration::from_secs(1))))
            .budget(own);
        assert!(!long.callers, "the caller grants more than the store's own");
        // 1 s less the 20 ms margin, less what the test took to get here.
        let left = long.left;
        assert!(
            left > Duration::from_millis(500) && left <= Duration::from_millis(980),
            "{left:?}"
        );
        let short = marks
            .call(Some(Deadline::of(arrived, Duration::from_millis(5))))
            .budget(Duration::from_secs(10));
        assert!(short.callers, "the caller's deadline is the shorter");
        assert!(short.left < Duration::from_millis(5), "{short:?}");
    }

    #[test]
    fn sooner_keeps_time_back_only_under_a_callers_deadline() {
        let own = Duration::from_millis(15);
        let marks = Marks::new();
        let kept = marks
            .call(None)
            .sooner(|_| Duration::from_secs(1))
            .budget(own);
        assert_eq!(
            kept.left, own,
            "no caller deadline: nothing to bring forward"
        );
        let call = marks.call(Some(Deadline::of(Instant::now(), Duration::from_secs(2))));
        let sooner = call
            .sooner(|left| left / 2)
            .budget(Duration::from_millis(1500));
        // 2 s less the 20 ms margin, halved.
        assert!(
            sooner.left > Duration::from_millis(500) && sooner.left <= Duration::from_millis(990),
            "{sooner:?}"
        );
        assert!(
            !sooner.callers,
            "the caller granted 1.98 s, more than the store's own 1.5 s: time kept back by a \
             layer does not make the caller's deadline the shorter"
        );
    }

    #[test]
    fn a_mark_reaches_the_requests_marks_from_any_of_its_calls() {
        let marks = Marks::new();
        let call = marks.call(None);
        assert!(!marks.degraded());
        call.sooner(|left| left / 2).mark_degraded();
        assert!(marks.degraded());
        let other = Marks::new();
        Call::detached().mark_degraded();
        assert!(!other.degraded(), "a detached call marks nobody's request");
    }
}
