//! Time as the service sees it: the system clock in production, a hand-driven clock in tests.
//!
//! The limiter uses it to pick the fixed window a key names; the memory store uses the same clock
//! for expiry and reset, so the two agree. The Redis store's scripts use Redis's own clock
//! (`TIME`); its plain fixed-window commands (Redis 7) judge on this clock, as upstream does.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the limiter and the memory store read the time: one clock shared by both, so that the
/// window a key names and the window the store counts in agree.
pub trait Clock: Send + Sync + Debug {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;

    /// Whole seconds since the Unix epoch (fixed windows start on these).
    fn now_secs(&self) -> u64 {
        self.now_micros() / 1_000_000
    }

    /// Whole milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64 {
        self.now_micros() / 1_000
    }
}

/// The operating system's wall clock: what the server runs on. A clock set before 1970 reads
/// as the epoch.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `micros` since the epoch until moved.
    pub fn new(micros: u64) -> Self {
        Self(AtomicU64::new(micros))
    }

    /// Sets the time, backwards too (to test what a store does when time goes back).
    pub fn set_micros(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }

    /// Moves the time forward by `by` microseconds.
    pub fn advance_micros(&self, by: u64) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
