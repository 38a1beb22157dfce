//! Closed-loop load for fault tests, with every call recorded.
//!
//! Each caller loops on its own connection; every call is kept with when it was sent, when it was
//! answered and what came back, and admissions are counted per counter. That is what a fault test
//! needs to say, for one fault: how many calls failed, how many answers came after the deadline,
//! how many admissions went over the limit (over-admission, summed over counters) and how long
//! after the fault ended the failures stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::proto::{Code, RateLimitRequest};

use crate::Sluice;

/// What one call got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Admitted,
    Refused,
    Failed(tonic::Code),
}

#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// Since the load started.
    pub sent: Duration,
    pub answered: Duration,
    /// Which counter the request spends from (as the request maker said).
    pub counter: usize,
    pub outcome: Outcome,
}

impl Call {
    pub fn latency(&self) -> Duration {
        self.answered - self.sent
    }
}

/// Makes call number `n` of a caller: which counter it spends from, and the request.
pub type MakeRequest = fn(n: u64) -> (usize, RateLimitRequest);

pub struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    callers: Vec<tokio::task::JoinHandle<Vec<Call>>>,
}

/// No call waits longer than this on the client side, so a wedged server shows up as failed
/// calls instead of a hung test. Not sent as `grpc-timeout`: a caller's deadline would rule the
/// store's calls instead of `REDIS_TIMEOUT` (`src/store/deadline.rs`), and the fault tests
/// measure answers against `REDIS_TIMEOUT`.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

impl Load {
    /// Starts `callers` callers, each on its own connection.
    pub async fn start(sluice: &Sluice, callers: usize, make: MakeRequest) -> Load {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for caller in 0..callers as u64 {
            let mut client = sluice.client().await;
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let mut calls = Vec::new();
                let mut n = caller;
                while !stop.load(Ordering::Relaxed) {
                    let (counter, request) = make(n);
                    let sent = started.elapsed();
                    let answer =
                        tokio::time::timeout(CLIENT_TIMEOUT, client.should_rate_limit(request));
                    let outcome = match answer.await {
                        Ok(Ok(r)) if r.get_ref().overall_code == Code::Ok as i32 => {
                            Outcome::Admitted
                        }
                        Ok(Ok(_)) => Outcome::Refused,
                        Ok(Err(status)) => Outcome::Failed(status.code()),
                        // What tonic's client answers when its own deadline passes.
                        Err(_) => Outcome::Failed(tonic::Code::Cancelled),
                    };
                    calls.push(Call {
                        sent,
                        answered: started.elapsed(),
                        counter,
                        outcome,
                    });
                    n += callers as u64;
                    // A caller whose connection is gone (after SIGTERM) would otherwise spin.
                    if matches!(outcome, Outcome::Failed(_)) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                calls
            }));
        }
        Load {
            started,
            stop,
            callers: tasks,
        }
    }

    /// Time since the load started, on the clock the calls are stamped with.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub async fn finish(self) -> Calls {
        self.stop.store(true, Ordering::Relaxed);
        let mut calls = Vec::new();
        for caller in self.callers {
            calls.extend(caller.await.unwrap());
        }
        calls.sort_by_key(|c| c.answered);
        Calls(calls)
    }
}

pub struct Calls(pub Vec<Call>);

impl Calls {
    pub fn total(&self) -> usize {
        self.0.len()
    }

    pub fn failed(&self) -> impl Iterator<Item = &Call> {
        self.0
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    pub fn admitted(&self) -> usize {
        self.0
            .iter()
            .filter(|c| c.outcome == Outcome::Admitted)
            .count()
    }

    /// Admissions beyond `limit`, summed over counters: 0 means no counter admitted more than
    /// its limit. Every counter must be in one window for the whole run.
    pub fn over_admission(&self, limit: usize) -> usize {
        let mut per_counter = std::collections::HashMap::<usize, usize>::new();
        for call in self.0.iter().filter(|c| c.outcome == Outcome::Admitted) {
            *per_counter.entry(call.counter).or_default() += 1;
        }
        per_counter.values().map(|&n| n.saturating_sub(limit)).sum()
    }

    pub fn late(&self, deadline: Duration) -> usize {
        self.0.iter().filter(|c| c.latency() > deadline).count()
    }

    pub fn slowest(&self) -> Duration {
        self.0.iter().map(Call::latency).max().unwrap_or_default()
    }

    /// How long after `fault_ended` the last failed answer came (zero if none came after it).
    pub fn recovery(&self, fault_ended: Duration) -> Duration {
        self.failed()
            .map(|c| c.answered)
            .max()
            .unwrap_or_default()
            .saturating_sub(fault_ended)
    }

    /// One line with the figures of a fault run, for the test log and docs/reliability.md.
    pub fn report(&self, fault: &str, limit: usize, deadline: Duration, fault_ended: Duration) {
        let mut codes: Vec<String> = self
            .failed()
            .map(|c| format!("{:?}", c.outcome))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if codes.is_empty() {
            codes.push("-".into());
        }
        println!(
            "FAULT {fault}: {} calls, {} admitted, {} failed ({}), {} later than {deadline:?} \
             (slowest {:?}), over-admission {}, recovery {:?}",
            self.total(),
            self.admitted(),
            self.failed().count(),
            codes.join(" "),
            self.late(deadline),
            self.slowest(),
            self.over_admission(limit),
            self.recovery(fault_ended),
        );
    }
}
