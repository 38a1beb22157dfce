//! Validation of a `rate_limit`'s `calendar` block (a Sluice extension): its fields, the zone
//! known to the bundled tz database, and the limits it may stand on (a fixed window of one day,
//! week, month or year). Apart from `rate_limit.rs` because it is one concern with its own
//! refusals; what a calendar computes lives in `config/calendar.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use super::scalars::{Number, describe, yaml11_number};
use super::validate::FileChecker;
use crate::config::calendar::CalendarProblem;
use crate::config::yaml::Node;
use crate::config::{Algorithm, Calendar, Quota, Unit};

impl FileChecker<'_> {
    /// Reads `calendar` when present: `None` inside `Some` when absent, `None` after an error.
    pub(super) fn calendar(
        &mut self,
        fields: &HashMap<&str, &Node>,
        quota: &Quota,
    ) -> Option<Option<Arc<Calendar>>> {
        let Some(node) = fields.get("calendar") else {
            return Some(None);
        };
        self.calendar_fits(node.line, quota)?;
        const FIELDS: &[&str] = &["time_zone", "anchor_day", "week_start"];
        let block = self.mapping(node, "calendar", FIELDS)?;
        let Some(zone_node) = block.get("time_zone") else {
            self.error(
                node.line,
                "calendar needs time_zone (for example Europe/Berlin)",
            );
            return None;
        };
        let zone = self.string(zone_node, "time_zone")?;
        let anchor_day = match block.get("anchor_day") {
            None => 1,
            Some(n) => match &n.value {
                crate::config::yaml::Value::Scalar { text, plain: true } => {
                    match yaml11_number(text) {
                        Some(Number::Int(d)) => i64::try_from(d).unwrap_or(0),
                        _ => 0,
                    }
                }
                _ => 0,
            },
        };
        let week_start = match block.get("week_start") {
            None => "monday".to_string(),
            Some(n) => self.string(n, "week_start")?,
        };
        let unit_line = |key: &str| block.get(key).map_or(node.line, |n| n.line);
        let Quota::PerUnit { unit, .. } = quota else {
            return None;
        };
        if block.contains_key("anchor_day") && *unit != Unit::Month {
            self.error(
                unit_line("anchor_day"),
                "anchor_day applies to unit month only",
            );
            return None;
        }
        if block.contains_key("week_start") && *unit != Unit::Week {
            self.error(
                unit_line("week_start"),
                "week_start applies to unit week only",
            );
            return None;
        }
        match Calendar::new(&zone, anchor_day, &week_start) {
            Ok(calendar) => Some(Some(Arc::new(calendar))),
            Err(problem) => {
                let line = match problem {
                    CalendarProblem::UnknownZone(_) => zone_node.line,
                    CalendarProblem::WeekStart(_) => unit_line("week_start"),
                    CalendarProblem::AnchorDay => unit_line("anchor_day"),
                };
                let found = match problem {
                    CalendarProblem::AnchorDay => block
                        .get("anchor_day")
                        .map_or(String::new(), |n| format!(", found: {}", describe(n))),
                    _ => String::new(),
                };
                self.error(line, format!("{problem}{found}"));
                None
            }
        }
    }

    /// A calendar stands only on a fixed window of one day, week, month or year: the other
    /// algorithms measure trailing time or refill at a rate, which a period of the calendar
    /// does not describe, and a multiple of months is not a calendar period.
    fn calendar_fits(&mut self, line: usize, quota: &Quota) -> Option<()> {
        let Quota::PerUnit {
            unit,
            unit_multiplier,
            algorithm,
            ..
        } = quota
        else {
            return None;
        };
        if *algorithm != Algorithm::FixedWindow {
            self.error(
                line,
                format!(
                    "calendar applies to algorithm fixed_window only, not {} (its window is a \
                     trailing length or a refill rate, not a period of the calendar)",
                    algorithm.name()
                ),
            );
            return None;
        }
        if !matches!(unit, Unit::Day | Unit::Week | Unit::Month | Unit::Year) {
            self.error(
                line,
                format!(
                    "calendar applies to unit day, week, month or year, not {}",
                    unit.name()
                ),
            );
            return None;
        }
        if *unit_multiplier != 1 {
            self.error(line, "calendar does not combine with unit_multiplier");
            return None;
        }
        Some(())
    }
}
