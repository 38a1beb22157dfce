//! The over-limit decision log (`DECISION_LOG=over_limit`, issue #42): one structured line per
//! descriptor judged over its limit, so "why was I limited?" has an answer an operator can
//! search. It lives here because only the answer step knows which limit refused a descriptor.
//!
//! Bounded: at most `max_per_second` lines in any one second of the service clock; the rest are
//! dropped and counted (`sluice_decision_log_lines_total{outcome="dropped"}`, and `dropped` on
//! the next line written), so a flood of refusals cannot turn into a flood of log writes. Off,
//! it costs the request path one branch on refused descriptors only (`answer.rs`); on, a
//! refused descriptor costs two atomic operations, and only a line written formats anything.
//!
//! Descriptor values are client data (user ids, IP addresses, API keys). Keys are written as
//! they are (the configuration names them); values as [`LogValues`] says.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::IntCounter;

use crate::config::Limit;
use crate::proto::RateLimitDescriptor;
use crate::store::Outcome;
use crate::util;

/// How descriptor values appear in the decision log (`DECISION_LOG_VALUES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogValues {
    /// `<redacted>`: only the keys are written.
    Redact,
    /// `sha256:` and the first 16 hex digits of the value's SHA-256: the same value always gives
    /// the same text, so an operator can find a customer's lines by hashing their value, while
    /// the log holds no value in clear. A pseudonym, not anonymity: a value from a small set
    /// (an IPv4 address) can be found by hashing every candidate.
    #[default]
    Hash,
    /// The value as sent (invalid UTF-8 as `\xNN`).
    Plain,
}

impl LogValues {
    /// Parses `redact`, `hash` or `plain`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "redact" => Some(LogValues::Redact),
            "hash" => Some(LogValues::Hash),
            "plain" => Some(LogValues::Plain),
            _ => None,
        }
    }
}

/// The decision log's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionLogOptions {
    /// How values are written.
    pub values: LogValues,
    /// The most lines written in one second (`DECISION_LOG_MAX_PER_SECOND`).
    pub max_per_second: u64,
}

/// The log's state: the second being counted, the lines written in it, the lines dropped since
/// the last one written.
#[derive(Debug)]
pub(super) struct DecisionLog {
    options: DecisionLogOptions,
    second: AtomicU64,
    written: AtomicU64,
    dropped: AtomicU64,
    /// `sluice_decision_log_lines_total{outcome}`: written, dropped.
    counted: Option<(IntCounter, IntCounter)>,
}

/// What one over-limit line says besides the descriptor.
pub(super) struct OverLimit<'a> {
    pub(super) domain: &'a str,
    pub(super) descriptor: &'a RateLimitDescriptor,
    pub(super) limit: &'a Limit,
    pub(super) outcome: &'a Outcome,
    pub(super) shadow_mode: bool,
}

impl DecisionLog {
    pub(super) fn new(options: DecisionLogOptions) -> Self {
        Self {
            options,
            second: AtomicU64::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            counted: None,
        }
    }

    /// Counts the lines written and dropped in these counters.
    pub(super) fn count_in(&mut self, written: IntCounter, dropped: IntCounter) {
        self.counted = Some((written, dropped));
    }

    /// Writes the line of `decision` if this second's budget has room, else counts it dropped.
    pub(super) fn over_limit(&self, now_secs: u64, decision: &OverLimit<'_>) {
        let second = self.second.load(Ordering::Relaxed);
        if second != now_secs
            && self
                .second
                .compare_exchange(second, now_secs, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.written.store(0, Ordering::Relaxed);
        }
        if self.written.fetch_add(1, Ordering::Relaxed) >= self.options.max_per_second {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            if let Some((_, dropped)) = &self.counted {
                dropped.inc();
            }
            return;
        }
        if let Some((written, _)) = &self.counted {
            written.inc();
        }
        let OverLimit {
            domain,
            descriptor,
            limit,
            outcome,
            shadow_mode,
        } = decision;
        let algorithm = match &limit.quota {
            crate::config::Quota::PerUnit { algorithm, .. } => algorithm.name(),
            crate::config::Quota::Unlimited => "unlimited",
        };
        tracing::info!(
            target: "sluice::decision_log",
            domain = %domain,
            descriptor = %self.descriptor_text(descriptor),
            limit = %limit.name,
            algorithm,
            remaining = outcome.remaining,
            reset_ms = outcome.reset_ms,
            shadow_mode,
            dropped = self.dropped.swap(0, Ordering::Relaxed),
            "over limit"
        );
    }

    /// `key=value,…` with each value as [`LogValues`] says.
    fn descriptor_text(&self, descriptor: &RateLimitDescriptor) -> String {
        let mut text = String::new();
        for (i, entry) in descriptor.entries.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            let _ = write!(text, "{}=", util::shown(&entry.key));
            match self.options.values {
                LogValues::Redact => text.push_str("<redacted>"),
                LogValues::Plain => text.push_str(&util::shown(&entry.value)),
                LogValues::Hash => text.push_str(&value_hash(&entry.value)),
            }
        }
        text
    }
}

/// `sha256:` and the first 16 hex digits of the SHA-256 of `value`
/// (`printf %s VALUE | sha256sum | cut -c1-16`).
pub fn value_hash(value: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, value);
    let mut text = String::from("sha256:");
    for byte in &digest.as_ref()[..8] {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_as_sha256sum_does() {
        // printf %s u1 | sha256sum
        assert_eq!(value_hash(b"u1"), "sha256:bb82030dbc2bcaba");
    }
}
