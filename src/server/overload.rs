//! The process's memory ceiling, and what Sluice does as it nears it (issue #40, item 1).
//!
//! In the spirit of Envoy's overload manager: a task samples the process's resident memory
//! every [`SAMPLE_EVERY`] and switches actions on at fixed fractions of a ceiling, off again a
//! little below (so one sample either side of a line does not flap):
//! - at [`SHED_AT`] of the ceiling, `shed_waiting_requests`: every gRPC call that has waited a
//!   short grace for the rest of its request is ended and no call may wait longer (`budget.rs`);
//!   calls whose request arrives whole, every Envoy call, are still answered;
//! - at [`STOP_ACCEPTING_AT`], `stop_accepting_connections`: the gRPC listeners close new
//!   connections at accept (`sluice_connections_rejected_total{reason="overload"}`). The HTTP,
//!   debug and metrics listeners keep accepting, so probes and scrapes still see the service.
//!
//! The request budgets are the first bound and hold by construction; this one catches what they
//! do not count (h2's own buffers, a store's growth), before the kernel's OOM killer would end
//! the process, which Envoy (failing open) turns into no limits at all.
//!
//! The ceiling: `OVERLOAD_MEMORY_LIMIT` when set (0 turns the manager off), else the cgroup's
//! memory limit (`memory.max`, or cgroup v1's `memory.limit_in_bytes`) when there is one, else
//! the machine's memory (`MemTotal`). Resident memory is `VmRSS` of `/proc/self/status`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice::metrics::PressureMetrics;

/// How often resident memory is sampled: a read of a small `/proc` file, a few microseconds.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The fraction of the ceiling at which waiting calls are shed.
pub const SHED_AT: f64 = 0.90;
/// The fraction of the ceiling at which the gRPC listeners stop accepting connections.
pub const STOP_ACCEPTING_AT: f64 = 0.95;
/// An action goes off again this far (a fraction of the ceiling) below where it went on.
const HYSTERESIS: f64 = 0.05;

/// `OVERLOAD_MEMORY_LIMIT`, as set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryCeiling {
    /// Unset: the cgroup's limit, else the machine's memory ([`MemoryCeiling::resolve`]).
    Detect,
    /// `0`: no overload manager.
    Off,
    Bytes(u64),
}

impl MemoryCeiling {
    /// The ceiling in bytes, `None` when off or when nothing could be read.
    pub fn resolve(self) -> Option<u64> {
        match self {
            MemoryCeiling::Off => None,
            MemoryCeiling::Bytes(bytes) => Some(bytes),
            MemoryCeiling::Detect => cgroup_limit().or_else(machine_memory),
        }
    }
}

/// What the overload manager has switched on, read where it acts.
#[derive(Debug, Default)]
pub(crate) struct Overload {
    stop_accepting: AtomicBool,
}

impl Overload {
    /// Whether listeners that follow the manager may accept a connection now.
    pub(crate) fn accepting(&self) -> bool {
        !self.stop_accepting.load(Ordering::Relaxed)
    }
}

/// One action: where it goes on, and whether it is on.
struct Action {
    name: &'static str,
    at: f64,
    on: bool,
}

impl Action {
    /// Follows `ratio` (memory over the ceiling); `Some(on)` when the action changed.
    fn follow(&mut self, ratio: f64) -> Option<bool> {
        let on = if self.on {
            ratio >= self.at - HYSTERESIS
        } else {
            ratio >= self.at
        };
        (on != self.on).then(|| {
            self.on = on;
            on
        })
    }
}

/// Samples memory against `ceiling` and switches the actions, until dropped (the caller holds the
/// task's guard). `shed_waiting` switches the shedding of waiting calls (`RequestBudget::shed`).
pub(crate) async fn run(
    ceiling: u64,
    overload: Arc<Overload>,
    shed_waiting: impl Fn(bool) + Send + 'static,
    metrics: PressureMetrics,
) {
    metrics
        .memory_limit
        .set(i64::try_from(ceiling).unwrap_or(i64::MAX));
    let mut shed = Action {
        name: "shed_waiting_requests",
        at: SHED_AT,
        on: false,
    };
    let mut stop = Action {
        name: "stop_accepting_connections",
        at: STOP_ACCEPTING_AT,
        on: false,
    };
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(resident) = resident_memory() else {
            continue;
        };
        metrics
            .memory_resident
            .set(i64::try_from(resident).unwrap_or(i64::MAX));
        let ratio = resident as f64 / ceiling as f64;
        if let Some(on) = shed.follow(ratio) {
            switched(&shed, on, resident, ceiling, &metrics);
            shed_waiting(on);
        }
        if let Some(on) = stop.follow(ratio) {
            switched(&stop, on, resident, ceiling, &metrics);
            overload.stop_accepting.store(on, Ordering::Relaxed);
        }
    }
}

/// Logs and counts an action switched on or off.
fn switched(action: &Action, on: bool, resident: u64, ceiling: u64, metrics: &PressureMetrics) {
    metrics
        .overload_active
        .with_label_values(&[action.name])
        .set(i64::from(on));
    if on {
        metrics
            .overload_actions
            .with_label_values(&[action.name])
            .inc();
        tracing::warn!(
            action = action.name,
            resident,
            ceiling,
            "memory near its ceiling: overload action on"
        );
    } else {
        tracing::info!(
            action = action.name,
            resident,
            ceiling,
            "overload action off"
        );
    }
}

/// The process's resident memory (`VmRSS`), in bytes.
fn resident_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmRSS:")
}

/// A `Name:   N kB` line's value, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The machine's memory (`MemTotal` of `/proc/meminfo`).
fn machine_memory() -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal:")
}

/// The memory limit of the cgroup this process runs in, if it has one.
fn cgroup_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        match controllers {
            // cgroup v2: one hierarchy, no controller named.
            "" => read_limit(&format!("/sys/fs/cgroup/{path}/memory.max")),
            c if c.split(',').any(|c| c == "memory") => read_limit(&format!(
                "/sys/fs/cgroup/memory/{path}/memory.limit_in_bytes"
            ))
            // Inside a container the v1 hierarchy is often mounted at its own root.
            .or_else(|| read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes")),
            _ => None,
        }
    })
}

/// A cgroup limit file's value: `max` (v2) or a page-rounded 2^63 (v1) mean none.
fn read_limit(path: &str) -> Option<u64> {
    parse_limit(std::fs::read_to_string(path).ok()?.trim())
}

fn parse_limit(value: &str) -> Option<u64> {
    let bytes: u64 = value.parse().ok()?;
    (bytes > 0 && bytes < 1 << 60).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_go_on_at_their_line_and_off_below_it() {
        let mut shed = Action {
            name: "shed",
            at: SHED_AT,
            on: false,
        };
        assert_eq!(shed.follow(0.5), None);
        assert_eq!(shed.follow(0.9), Some(true));
        assert_eq!(shed.follow(0.87), None, "still on just below the line");
        assert_eq!(shed.follow(0.849), Some(false));
        assert_eq!(shed.follow(0.89), None);
    }

    #[test]
    fn cgroup_limits_and_proc_fields_are_read() {
        assert_eq!(parse_limit("max"), None);
        assert_eq!(parse_limit("536870912"), Some(512 << 20));
        assert_eq!(parse_limit("9223372036854771712"), None, "v1's 'no limit'");
        assert_eq!(parse_limit("0"), None);
        let status = "Name:\tsluice\nVmRSS:\t   43520 kB\nThreads:\t3\n";
        assert_eq!(kib_field(status, "VmRSS:"), Some(43_520 * 1024));
        assert_eq!(kib_field(status, "VmSwap:"), None);
        // This process has a resident size and the machine some memory.
        assert!(resident_memory().is_some_and(|b| b > 0));
        assert!(machine_memory().is_some_and(|b| b > 0));
        assert_eq!(MemoryCeiling::Off.resolve(), None);
        assert_eq!(MemoryCeiling::Bytes(7).resolve(), Some(7));
        assert!(MemoryCeiling::Detect.resolve().is_some());
    }
}
