//! How a limit is written for people: one line per limit for `check-config` and `/rlconfig`
//! (`Display` of [`Limit`]), and upstream's own dump line (`/rlconfig` on the debug port).

use std::fmt;

use super::{Limit, Quota};

/// One line per limit, for `check-config` and `/rlconfig`:
/// `<path>: <rate> <algorithm> [flags] (<file>:<line>)`.
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path)?;
        match self.quota {
            Quota::Unlimited => f.write_str("unlimited")?,
            Quota::PerUnit {
                requests_per_unit,
                unit,
                unit_multiplier: 1,
                algorithm,
            } => write!(f, "{requests_per_unit}/{} {algorithm}", unit.name())?,
            Quota::PerUnit {
                requests_per_unit,
                unit,
                unit_multiplier,
                algorithm,
            } => write!(
                f,
                "{requests_per_unit}/{unit_multiplier} {}s {algorithm}",
                unit.name()
            )?,
        }
        if !self.name.is_empty() {
            write!(f, " name={}", self.name)?;
        }
        if !self.replaces.is_empty() {
            write!(f, " replaces={}", self.replaces.join(","))?;
        }
        if self.shadow_mode {
            f.write_str(" shadow_mode")?;
        }
        if self.quota_mode {
            f.write_str(" quota_mode")?;
        }
        if self.record_refused_hits {
            f.write_str(" record_refused_hits")?;
        }
        if self.hide_from_headers {
            f.write_str(" hide_from_headers")?;
        }
        if let Some(calendar) = &self.calendar {
            write!(f, " {calendar}")?;
        }
        for (_, pattern) in &self.shared_values {
            write!(f, " shared={pattern}")?;
        }
        if let Some(member) = &self.member {
            write!(f, " limit {} of {}", member.position, member.of)?;
            // The label, when it is not the name already shown: what metrics call it.
            if member.label != self.name {
                write!(f, " ({})", member.label)?;
            }
        }
        if let Some(origin) = &self.origin {
            write!(f, " ({origin})")?;
        }
        Ok(())
    }
}

/// The limit as a line of upstream's debug dump (`/rlconfig` on the debug port):
/// `<domain>.<path>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>`; an unlimited
/// limit has unit `UNKNOWN` and 0 requests, as upstream stores it. A `unit_multiplier` other
/// than 1 (upstream has none) is added after the unit as `unit_multiplier=<n>`.
pub struct UpstreamDumpLine<'a>(pub &'a Limit);

impl fmt::Display for UpstreamDumpLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = self.0;
        let (unit, requests) = match limit.quota {
            Quota::Unlimited => ("UNKNOWN".to_string(), 0),
            Quota::PerUnit {
                requests_per_unit,
                unit,
                unit_multiplier,
                ..
            } if unit_multiplier > 1 => (
                format!(
                    "{} unit_multiplier={unit_multiplier}",
                    unit.name().to_ascii_uppercase()
                ),
                requests_per_unit,
            ),
            Quota::PerUnit {
                requests_per_unit,
                unit,
                ..
            } => (unit.name().to_ascii_uppercase(), requests_per_unit),
        };
        write!(
            f,
            "{}: unit={unit} requests_per_unit={requests}, shadow_mode: {}",
            limit.path, limit.shadow_mode
        )?;
        // Upstream has one limit per descriptor; each of a `rate_limits` list gets a line.
        match &self.0.member {
            Some(m) => write!(f, ", limit: {} of {} ({})", m.position, m.of, m.label),
            None => Ok(()),
        }
    }
}
