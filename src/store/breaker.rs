//! A circuit breaker in front of a store: while the store keeps failing, calls fail at once
//! instead of each waiting out its deadline, and one probe at a time checks for recovery.
//!
//! Closed: calls pass; `failures_to_open` failures in a row open it. Open: calls fail with
//! [`StoreError::Unavailable`] until `cool_down` has passed. Then one call is let through as a
//! probe (half-open): success closes the breaker, failure opens it again for twice as long (up to
//! `max_cool_down`). Every change is published on a watch channel, which the server turns into
//! its health status. Only outages count as failures (transport errors, deadlines, a server that
//! refuses every call); an error reply to one call's script is that call's problem, so no caller
//! can open the breaker for everyone by provoking one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{
    Acquisition, Charging, Check, CounterStore, LimiterKeys, LimiterRecord, LimiterSet,
    LimiterStore, RegistryOp, RegistryReply, SetMode, Store, StoreError, StoreFuture,
};

#[derive(Debug, Clone)]
pub struct BreakerOptions {
    pub failures_to_open: u32,
    pub cool_down: Duration,
    pub max_cool_down: Duration,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        Self {
            failures_to_open: 5,
            cool_down: Duration::from_millis(250),
            // Probing at least once a second puts answers back within a second of recovery.
            max_cool_down: Duration::from_secs(1),
        }
    }
}

#[derive(Debug)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        cool_down: Duration,
    },
    /// A probe is in flight; other calls fail at once.
    HalfOpen {
        cool_down: Duration,
    },
}

#[derive(Debug)]
pub struct Breaker<S> {
    store: S,
    options: BreakerOptions,
    state: Mutex<State>,
    usable: watch::Sender<bool>,
}

impl<S: Store> Breaker<S> {
    pub fn new(store: S, options: BreakerOptions) -> Self {
        Self {
            store,
            options,
            state: Mutex::new(State::Closed { failures: 0 }),
            usable: watch::Sender::new(true),
        }
    }

    /// `true` while the breaker is closed (the store answers).
    pub fn usable(&self) -> watch::Receiver<bool> {
        self.usable.subscribe()
    }

    /// Starts open, as after repeated failures (a store that was not ready at start-up).
    pub fn force_open(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Open {
            until: Instant::now() + self.options.cool_down,
            cool_down: self.options.cool_down,
        };
        self.usable.send_replace(false);
    }

    pub fn inner(&self) -> &S {
        &self.store
    }

    /// Whether a call may go to the store now.
    fn admit(&self) -> Result<(), StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match *state {
            State::Closed { .. } => Ok(()),
            State::Open { until, cool_down } if Instant::now() >= until => {
                *state = State::HalfOpen { cool_down };
                Ok(())
            }
            State::Open { .. } | State::HalfOpen { .. } => Err(StoreError::Unavailable(
                "circuit breaker open: the store failed repeatedly".into(),
            )),
        }
    }

    fn record<T>(&self, result: &Result<T, StoreError>) {
        // Any answer, an error reply included, shows the store is reachable; only outages
        // count as failures (see `StoreError::is_outage`).
        let answered = !result.as_ref().is_err_and(StoreError::is_outage);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let next = match (&*state, answered) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.options.failures_to_open => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            (State::Closed { .. }, false) => State::Open {
                until: Instant::now() + self.options.cool_down,
                cool_down: self.options.cool_down,
            },
            (State::HalfOpen { cool_down } | State::Open { cool_down, .. }, false) => {
                let cool_down = (*cool_down * 2).min(self.options.max_cool_down);
                State::Open {
                    until: Instant::now() + cool_down,
                    cool_down,
                }
            }
        };
        let usable = matches!(next, State::Closed { .. });
        if usable != *self.usable.borrow() {
            if usable {
                tracing::info!("store answers again; circuit breaker closed");
            } else {
                tracing::warn!("store keeps failing; circuit breaker open");
            }
            self.usable.send_replace(usable);
        }
        *state = next;
    }

    /// Runs `call` only if the breaker admits it: some stores do their work when the future is
    /// made, not when it is polled.
    fn guarded<'a, T: Send + 'a>(
        &'a self,
        call: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            self.admit()?;
            let result = call().await;
            self.record(&result);
            result
        })
    }
}

impl<S: Store> Store for Breaker<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }
}

impl<S: CounterStore> CounterStore for Breaker<S> {
    fn check_with<'a>(&'a self, checks: &'a [&'a Check], charging: Charging) -> StoreFuture<'a> {
        self.guarded(move || self.store.check_with(checks, charging))
    }
}

impl<S: LimiterStore> LimiterStore for Breaker<S> {
    fn set_limiter<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.guarded(move || self.store.set_limiter(keys, record, mode))
    }

    fn get_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.guarded(|| self.store.get_limiter(keys))
    }

    fn delete_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, bool> {
        self.guarded(|| self.store.delete_limiter(keys))
    }

    fn acquire<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        self.guarded(move || self.store.acquire(keys, permits, max_clients))
    }

    fn registry<'a>(&'a self, key: &'a str, op: RegistryOp<'a>) -> StoreFuture<'a, RegistryReply> {
        self.guarded(move || self.store.registry(key, op))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::store::Outcome;

    /// A store that fails while `down` is set and counts the calls that reach it.
    #[derive(Debug, Default)]
    struct Flaky {
        down: AtomicBool,
        calls: AtomicU32,
    }

    impl Store for Flaky {
        fn kind(&self) -> &'static str {
            "flaky"
        }
    }

    impl CounterStore for Flaky {
        fn check_with<'a>(&'a self, checks: &'a [&'a Check], _: Charging) -> StoreFuture<'a> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let result = if self.down.load(Ordering::SeqCst) {
                Err(StoreError::Unavailable("down".into()))
            } else {
                Ok(vec![
                    Outcome {
                        admitted: true,
                        remaining: 1,
                        reset_ms: 1,
                        used: 0
                    };
                    checks.len()
                ])
            };
            Box::pin(std::future::ready(result))
        }
    }

    #[tokio::test]
    async fn opens_after_repeated_failures_and_probes_for_recovery() {
        let breaker = Breaker::new(
            Flaky::default(),
            BreakerOptions {
                failures_to_open: 3,
                cool_down: Duration::from_millis(50),
                max_cool_down: Duration::from_millis(200),
            },
        );
        let usable = breaker.usable();
        breaker.inner().down.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            assert!(breaker.check(&[]).await.is_err());
        }
        assert!(!*usable.borrow(), "open after 3 failures");
        // Open: calls fail without reaching the store.
        for _ in 0..10 {
            assert!(breaker.check(&[]).await.is_err());
        }
        assert_eq!(breaker.inner().calls.load(Ordering::SeqCst), 3);
        // After the cool-down one probe goes through; it fails, so the breaker waits longer.
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(breaker.check(&[]).await.is_err());
        assert_eq!(breaker.inner().calls.load(Ordering::SeqCst), 4);
        // The store recovers; the next probe closes the breaker.
        breaker.inner().down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(110)).await;
        assert!(breaker.check(&[]).await.is_ok());
        assert!(*usable.borrow(), "closed again");
        assert!(breaker.check(&[]).await.is_ok());
    }
}
