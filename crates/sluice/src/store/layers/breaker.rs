//! The circuit breaker, a store layer (`layers/`): while the store keeps failing, calls fail at
//! once instead of each waiting out its deadline, and one probe at a time checks for recovery.
//!
//! Closed: calls pass; `failures_to_open` failures in a row open it. Open: calls fail with
//! [`StoreError::Unavailable`] until `cool_down` has passed. Then one call is let through as a
//! probe (half-open): success closes the breaker, failure opens it again for twice as long (up to
//! `max_cool_down`). Every change is published on a watch channel, which the server turns into
//! its health status.
//!
//! Only outages count as failures ([`StoreError::is_outage`]): transport errors, deadlines with
//! nothing heard from Redis, a server that refuses every call. An error reply to one call's
//! script is that call's problem, so no caller can open the breaker for everyone by provoking
//! one; a call that ran late while Redis kept answering ([`StoreError::Late`]: a busy CPU, a
//! slow script) shows Redis is up, so it counts as an answer: opening the breaker for slowness
//! would turn a slow store into no store. A call that ran out of its caller's deadline, shorter
//! than the store may take, while Redis answered ([`StoreError::CallerDeadline`]) says nothing
//! of the store either way: it neither counts nor closes the breaker (a probe that ends so
//! leaves the breaker open, to probe again at once), so no caller can open the breaker, or
//! hold it closed, by the deadline it sends.
//!
//! A breaker that waited for calls to probe would stay open on a service that gets none: a pod
//! whose readiness follows the breaker (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, or a degraded
//! start) is taken out of its Service, so no call comes, so it never becomes ready again.
//! [`Layered::probe_while_open`] probes on its own after each cool-down (issue #29).
//!
//! While open or half-open only the probe's result counts: calls that were already in flight
//! when the breaker opened fail late (they wait out their deadline), and counting them would
//! push the reopening out and double the cool-down for failures it already knows about
//! (issue #28: the breaker stayed shut about a second after Redis answered again).

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Layer, Layered, Op};
use crate::store::{Call, Store, StoreError, StoreFuture};

/// When the breaker opens and how long it stays open (the server's `BREAKER_*` settings).
#[derive(Debug, Clone)]
pub struct BreakerOptions {
    /// Outages in a row that open it (`BREAKER_FAILURES`).
    pub failures_to_open: u32,
    /// How long it stays open the first time (`BREAKER_COOL_DOWN`); doubled after each
    /// failed probe.
    pub cool_down: Duration,
    /// The longest the doubling makes it.
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

/// How a call got through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// While closed: its failure counts toward opening.
    Regular,
    /// The one call let through after a cool-down: its result closes or reopens the breaker.
    Probe,
}

/// The breaker's state; in front of a store as a [`Layered`].
#[derive(Debug)]
pub struct Breaker {
    options: BreakerOptions,
    state: Mutex<State>,
    usable: watch::Sender<bool>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(options: BreakerOptions) -> Self {
        Self {
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

    /// How long until the breaker would let a probe through: `None` while closed; while a probe
    /// is in flight (half-open), its cool-down, to look again after it.
    fn until_probe(&self) -> Option<Duration> {
        match *self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Closed { .. } => None,
            State::Open { until, .. } => Some(until.saturating_duration_since(Instant::now())),
            State::HalfOpen { cool_down } => Some(cool_down),
        }
    }

    /// Whether a call may go to the store now, and as what.
    fn admit(&self) -> Result<Pass, StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match *state {
            State::Closed { .. } => Ok(Pass::Regular),
            State::Open { until, cool_down } if Instant::now() >= until => {
                *state = State::HalfOpen { cool_down };
                Ok(Pass::Probe)
            }
            State::Open { .. } | State::HalfOpen { .. } => Err(StoreError::Unavailable(
                "circuit breaker open: the store failed repeatedly".into(),
            )),
        }
    }

    fn record<T>(&self, pass: Pass, result: &Result<T, StoreError>) {
        if let Err(StoreError::CallerDeadline(_)) = result {
            // The caller's deadline ended it, not the store: nothing learnt, except that a
            // probe must be sent again.
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let (State::HalfOpen { cool_down }, Pass::Probe) = (&*state, pass) {
                *state = State::Open {
                    until: Instant::now(),
                    cool_down: *cool_down,
                };
            }
            return;
        }
        // Any answer, an error reply or a late one from a Redis that answers included, shows
        // the store is reachable; only outages count as failures (see `StoreError::is_outage`).
        let answered = !result.as_ref().is_err_and(StoreError::is_outage);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let next = match (&*state, pass, answered) {
            (_, _, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, _, false)
                if failures + 1 < self.options.failures_to_open =>
            {
                State::Closed {
                    failures: failures + 1,
                }
            }
            (State::Closed { .. }, _, false) => State::Open {
                until: Instant::now() + self.options.cool_down,
                cool_down: self.options.cool_down,
            },
            (State::HalfOpen { cool_down }, Pass::Probe, false) => {
                let cool_down = (*cool_down * 2).min(self.options.max_cool_down);
                State::Open {
                    until: Instant::now() + cool_down,
                    cool_down,
                }
            }
            // A call admitted before the breaker opened, failing now: the breaker already
            // knows, and only the probe says anything new.
            (State::Open { .. } | State::HalfOpen { .. }, _, false) => return,
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
            let pass = self.admit()?;
            let result = call().await;
            self.record(pass, &result);
            result
        })
    }
}

impl Layer for Breaker {
    /// Every operation alike: let through, or failed at once while open.
    fn around<'a, T: Send + 'a>(
        &'a self,
        _: Op,
        call: Call<'a>,
        run: impl FnOnce(Call<'a>) -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        self.guarded(move || run(call))
    }
}

impl<S: Store> Layered<Breaker, S> {
    /// Runs for as long as `breaker` lives: whenever it is open, sends `probe` as the breaker's
    /// probe after each cool-down (unless a call got there first), so that it closes once the
    /// store answers even when no call comes. `probe` is a cheap call that shows the store
    /// answers (for Redis: loading the scripts, which also restores them after a restart).
    pub async fn probe_while_open<F>(breaker: Weak<Self>, probe: F)
    where
        S: Send + Sync,
        F: for<'a> Fn(&'a S) -> StoreFuture<'a, ()> + Send + Sync,
    {
        let Some(mut usable) = breaker.upgrade().map(|b| b.layer().usable()) else {
            return;
        };
        loop {
            while *usable.borrow_and_update() {
                if usable.changed().await.is_err() {
                    return;
                }
            }
            loop {
                let Some(b) = breaker.upgrade() else {
                    return;
                };
                let Some(wait) = b.layer().until_probe() else {
                    break;
                };
                drop(b);
                // Not before the cool-down has passed: `guarded` refuses an early probe anyway.
                tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
                let Some(b) = breaker.upgrade() else {
                    return;
                };
                let _ = b.layer().guarded(|| probe(b.store())).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

    use super::*;
    use crate::store::{Charging, Check, CounterStore, Outcome};

    /// `store` behind a breaker with `options`.
    fn guarded<S: Store>(store: S, options: BreakerOptions) -> Layered<Breaker, S> {
        Layered::new(Breaker::new(options), store)
    }

    /// A store that fails while `down` is set (with `failure`, an outage unless told
    /// otherwise), answers after `delay_ms`, and counts the calls that reach it.
    #[derive(Debug, Default)]
    struct Flaky {
        down: AtomicBool,
        /// Down means a late reply from a Redis that answers ([`StoreError::Late`]).
        late: AtomicBool,
        /// Down means the caller's deadline ran out ([`StoreError::CallerDeadline`]).
        callers: AtomicBool,
        delay_ms: AtomicU64,
        calls: AtomicU32,
    }

    impl Store for Flaky {
        fn kind(&self) -> &'static str {
            "flaky"
        }
    }

    impl CounterStore for Flaky {
        fn check_with<'a>(
            &'a self,
            _: Call<'a>,
            checks: &'a [&'a Check],
            _: Charging,
        ) -> StoreFuture<'a> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let delay = Duration::from_millis(self.delay_ms.load(Ordering::SeqCst));
            Box::pin(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if !self.down.load(Ordering::SeqCst) {
                    let ok = Outcome {
                        admitted: true,
                        remaining: 1,
                        reset_ms: 1,
                        used: 0,
                    };
                    Ok(vec![ok; checks.len()])
                } else if self.late.load(Ordering::SeqCst) {
                    Err(StoreError::Late(Duration::from_millis(15)))
                } else if self.callers.load(Ordering::SeqCst) {
                    Err(StoreError::CallerDeadline(Duration::ZERO))
                } else {
                    Err(StoreError::Unavailable("down".into()))
                }
            })
        }
    }

    #[tokio::test]
    async fn late_replies_from_a_redis_that_answers_never_open_it() {
        let breaker = guarded(Flaky::default(), BreakerOptions::default());
        let usable = breaker.layer().usable();
        breaker.store().down.store(true, Ordering::SeqCst);
        breaker.store().late.store(true, Ordering::SeqCst);
        for _ in 0..100 {
            assert!(matches!(breaker.check(&[]).await, Err(StoreError::Late(_))));
        }
        assert!(*usable.borrow(), "late replies opened the breaker");
        assert_eq!(breaker.store().calls.load(Ordering::SeqCst), 100);
        // The same store down instead: open after the usual five.
        breaker.store().late.store(false, Ordering::SeqCst);
        for _ in 0..5 {
            assert!(breaker.check(&[]).await.is_err());
        }
        assert!(!*usable.borrow(), "an outage opens it");
    }

    #[tokio::test]
    async fn a_callers_short_deadline_neither_opens_it_nor_closes_it() {
        let breaker = guarded(
            Flaky::default(),
            BreakerOptions {
                failures_to_open: 3,
                cool_down: Duration::from_millis(20),
                max_cool_down: Duration::from_millis(20),
            },
        );
        let usable = breaker.layer().usable();
        let flaky = breaker.store();
        flaky.down.store(true, Ordering::SeqCst);
        flaky.callers.store(true, Ordering::SeqCst);
        for _ in 0..100 {
            assert!(matches!(
                breaker.check(&[]).await,
                Err(StoreError::CallerDeadline(_))
            ));
        }
        assert!(*usable.borrow(), "callers' deadlines opened the breaker");
        // Two outages, a caller's deadline between them, a third outage: open. Taken for an
        // answer, the caller's deadline would have reset the count.
        for callers in [false, false, true, false] {
            flaky.callers.store(callers, Ordering::SeqCst);
            assert!(breaker.check(&[]).await.is_err());
        }
        assert!(!*usable.borrow(), "three outages in a row open it");
        // A probe that runs out of its caller's deadline closes nothing; the next one decides.
        tokio::time::sleep(Duration::from_millis(30)).await;
        flaky.callers.store(true, Ordering::SeqCst);
        assert!(matches!(
            breaker.check(&[]).await,
            Err(StoreError::CallerDeadline(_))
        ));
        assert!(!*usable.borrow(), "a caller's deadline closed it");
        flaky.down.store(false, Ordering::SeqCst);
        assert!(breaker.check(&[]).await.is_ok(), "probed again at once");
        assert!(*usable.borrow(), "closed by an answer");
    }

    #[tokio::test]
    async fn calls_in_flight_when_it_opens_do_not_extend_the_cool_down() {
        // Cool-down 50 ms; counted, the 18 late failures below would double it up to 10 s.
        let breaker = guarded(
            Flaky::default(),
            BreakerOptions {
                failures_to_open: 2,
                cool_down: Duration::from_millis(50),
                max_cool_down: Duration::from_secs(10),
            },
        );
        let usable = breaker.layer().usable();
        breaker.store().down.store(true, Ordering::SeqCst);
        breaker.store().delay_ms.store(100, Ordering::SeqCst);
        // 20 calls admitted together while closed; all fail at about the same time.
        let calls: Vec<_> = (0..20).map(|_| breaker.check(&[])).collect();
        for result in futures::future::join_all(calls).await {
            assert!(result.is_err());
        }
        assert!(!*usable.borrow(), "open after the failures");
        // Redis answers again; the probe after one cool-down (plus a margin) closes it.
        breaker.store().down.store(false, Ordering::SeqCst);
        breaker.store().delay_ms.store(0, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            breaker.check(&[]).await.is_ok(),
            "the in-flight failures pushed the reopening out"
        );
        assert!(*usable.borrow(), "closed again");
    }

    #[tokio::test]
    async fn opens_after_repeated_failures_and_probes_for_recovery() {
        let breaker = guarded(
            Flaky::default(),
            BreakerOptions {
                failures_to_open: 3,
                cool_down: Duration::from_millis(50),
                max_cool_down: Duration::from_millis(200),
            },
        );
        let usable = breaker.layer().usable();
        breaker.store().down.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            assert!(breaker.check(&[]).await.is_err());
        }
        assert!(!*usable.borrow(), "open after 3 failures");
        // Open: calls fail without reaching the store.
        for _ in 0..10 {
            assert!(breaker.check(&[]).await.is_err());
        }
        assert_eq!(breaker.store().calls.load(Ordering::SeqCst), 3);
        // After the cool-down one probe goes through; it fails, so the breaker waits longer.
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(breaker.check(&[]).await.is_err());
        assert_eq!(breaker.store().calls.load(Ordering::SeqCst), 4);
        // The store recovers; the next probe closes the breaker.
        breaker.store().down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(110)).await;
        assert!(breaker.check(&[]).await.is_ok());
        assert!(*usable.borrow(), "closed again");
        assert!(breaker.check(&[]).await.is_ok());
    }
}
