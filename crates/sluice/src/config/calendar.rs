//! Calendar windows (`calendar: {time_zone: ...}` on a `rate_limit`): a fixed window that is a
//! day, week, month or year of the calendar in an IANA time zone, instead of a length counted
//! from the Unix epoch. Here because a period's bounds and its name are config arithmetic: the
//! decision path asks for the period `now` falls in and gets its start, its end and the text
//! that names it in the counter key.
//!
//! Why the key names the period (`2026-11@Europe/Berlin`) and not its start in Unix seconds:
//! replicas that share a Redis must agree on the counter without agreeing on anything but the
//! config, and a name that says which period it counts can be read by an operator. Why the
//! bounds come from jiff's bundled tz database: a day across a daylight saving change is 23 or
//! 25 hours long, and the zone's rules must be the same on every replica whatever its image
//! holds in `/usr/share/zoneinfo`.
//!
//! The period `now` falls in is kept (one `ArcSwap` load per decision) and recomputed only
//! when `now` leaves it, so a calendar limit costs the decision path no time zone arithmetic.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use jiff::civil::{Date, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use super::Unit;

/// A calendar in one time zone, and where its weeks and months start.
pub struct Calendar {
    name: Box<str>,
    zone: TimeZone,
    anchor_day: i8,
    week_start: Weekday,
    /// The last period handed out, reused while `now` is inside it.
    current: ArcSwapOption<Period>,
}

/// One calendar period: `[start, end)` in Unix seconds, and its name in counter keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// Its first second (Unix seconds).
    pub start: u64,
    /// The first second of the next period.
    pub end: u64,
    /// What names it in counter keys: `2026-11-28`, `week-2026-11-23`, `2026-11`, `2026-11-15`
    /// (a month from its anchor day), `2026`; followed by `@` and the zone.
    pub label: Box<str>,
    /// The unit the period is of (so that one cache serves one unit).
    unit: Unit,
}

/// Why a calendar cannot be built from a config's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarProblem {
    /// The zone is not in the tz database.
    #[error("unknown time zone '{0}' (an IANA name such as Europe/Berlin or America/New_York)")]
    UnknownZone(String),
    /// `week_start` is not a day's name.
    #[error("week_start must be a day of the week (monday … sunday), found '{0}'")]
    WeekStart(String),
    /// `anchor_day` is outside 1..=28.
    #[error("anchor_day must be a whole number from 1 to 28 (every month has that day)")]
    AnchorDay,
}

impl Calendar {
    /// The calendar of zone `name` (an IANA name), its months starting on `anchor_day` (1..=28)
    /// and its weeks on `week_start` (a day's English name, any case).
    pub fn new(name: &str, anchor_day: i64, week_start: &str) -> Result<Calendar, CalendarProblem> {
        let zone = TimeZone::get(name).map_err(|_| CalendarProblem::UnknownZone(name.into()))?;
        let anchor_day = match anchor_day {
            1..=28 => anchor_day as i8,
            _ => return Err(CalendarProblem::AnchorDay),
        };
        let week_start = parse_weekday(week_start)
            .ok_or_else(|| CalendarProblem::WeekStart(week_start.into()))?;
        Ok(Calendar {
            name: name.into(),
            zone,
            anchor_day,
            week_start,
            current: ArcSwapOption::empty(),
        })
    }

    /// The zone's IANA name, as configured.
    pub fn zone_name(&self) -> &str {
        &self.name
    }

    /// The period of `unit` (day, week, month or year) that `now_secs` falls in. Another unit
    /// is counted as a day: the loader refuses calendars on them.
    pub fn period(&self, unit: Unit, now_secs: u64) -> Arc<Period> {
        if let Some(p) = &*self.current.load()
            && p.unit == unit
            && p.start <= now_secs
            && now_secs < p.end
        {
            return p.clone();
        }
        let period = Arc::new(self.compute(unit, now_secs));
        self.current.store(Some(period.clone()));
        period
    }

    fn compute(&self, unit: Unit, now_secs: u64) -> Period {
        let now =
            Timestamp::from_second(now_secs.min(i64::MAX as u64) as i64).unwrap_or(Timestamp::MAX);
        let today = now.to_zoned(self.zone.clone()).date();
        let (start, end, label) = match unit {
            Unit::Week => {
                let back = (today.weekday().to_monday_zero_offset()
                    - self.week_start.to_monday_zero_offset())
                .rem_euclid(7);
                let start = today.saturating_sub(i64::from(back).days());
                (
                    start,
                    start.saturating_add(7.days()),
                    format!("week-{start}"),
                )
            }
            Unit::Month => {
                let this = today.with().day(self.anchor_day).build().unwrap_or(today);
                let start = if today.day() >= self.anchor_day {
                    this
                } else {
                    this.saturating_sub(1.month())
                };
                let label = if self.anchor_day == 1 {
                    format!("{}-{:02}", start.year(), start.month())
                } else {
                    start.to_string()
                };
                (start, start.saturating_add(1.month()), label)
            }
            Unit::Year => {
                let start = today.first_of_year();
                (
                    start,
                    start.saturating_add(1.year()),
                    start.year().to_string(),
                )
            }
            _ => (today, today.saturating_add(1.day()), today.to_string()),
        };
        Period {
            start: self.midnight(start),
            end: self.midnight(end),
            label: format!("{label}@{}", self.name).into(),
            unit,
        }
    }

    /// The first instant of `date` in the zone, in Unix seconds (where midnight falls in a
    /// daylight saving gap, the first instant after it).
    fn midnight(&self, date: Date) -> u64 {
        date.to_zoned(self.zone.clone())
            .map_or(0, |z| z.timestamp().as_second().max(0) as u64)
    }
}

fn parse_weekday(name: &str) -> Option<Weekday> {
    let days = [
        ("monday", Weekday::Monday),
        ("tuesday", Weekday::Tuesday),
        ("wednesday", Weekday::Wednesday),
        ("thursday", Weekday::Thursday),
        ("friday", Weekday::Friday),
        ("saturday", Weekday::Saturday),
        ("sunday", Weekday::Sunday),
    ];
    days.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, d)| *d)
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// `calendar Europe/Berlin` (with `anchor_day` and `week_start` when not the defaults), for
/// the config dump.
impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "calendar {}", self.name)?;
        if self.anchor_day != 1 {
            write!(f, " anchor_day={}", self.anchor_day)?;
        }
        if self.week_start != Weekday::Monday {
            write!(f, " week_start={:?}", self.week_start)?;
        }
        Ok(())
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.anchor_day == other.anchor_day
            && self.week_start == other.week_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> u64 {
        text.parse::<Timestamp>().unwrap().as_second() as u64
    }

    #[test]
    fn a_month_in_new_york_is_named_and_ends_at_its_midnight() {
        let c = Calendar::new("America/New_York", 1, "monday").unwrap();
        let p = c.period(Unit::Month, at("2026-11-28T04:00:00Z"));
        assert_eq!(&*p.label, "2026-11@America/New_York");
        assert_eq!(p.start, at("2026-11-01T04:00:00Z"));
        assert_eq!(p.end, at("2026-12-01T05:00:00Z"));
        // Before New York's midnight, it is still October there.
        let p = c.period(Unit::Month, at("2026-11-01T03:59:59Z"));
        assert_eq!(&*p.label, "2026-10@America/New_York");
    }

    #[test]
    fn days_across_daylight_saving_changes_are_23_and_25_hours() {
        let c = Calendar::new("Europe/Berlin", 1, "monday").unwrap();
        let spring = c.period(Unit::Day, at("2026-03-29T12:00:00Z"));
        assert_eq!(spring.end - spring.start, 23 * 3600);
        let autumn = c.period(Unit::Day, at("2026-10-25T12:00:00Z"));
        assert_eq!(autumn.end - autumn.start, 25 * 3600);
        assert_eq!(&*autumn.label, "2026-10-25@Europe/Berlin");
    }

    #[test]
    fn weeks_start_on_their_day_and_months_on_their_anchor() {
        let c = Calendar::new("Asia/Kolkata", 15, "sunday").unwrap();
        // 2026-11-28 is a Saturday: its week began on Sunday the 22nd.
        let w = c.period(Unit::Week, at("2026-11-28T10:00:00Z"));
        assert_eq!(&*w.label, "week-2026-11-22@Asia/Kolkata");
        assert_eq!(w.start, at("2026-11-21T18:30:00Z"));
        let m = c.period(Unit::Month, at("2026-11-10T10:00:00Z"));
        assert_eq!(&*m.label, "2026-10-15@Asia/Kolkata");
        assert_eq!(m.end, at("2026-11-14T18:30:00Z"));
        let y = c.period(Unit::Year, at("2026-11-10T10:00:00Z"));
        assert_eq!(&*y.label, "2026@Asia/Kolkata");
        assert_eq!(y.end, at("2026-12-31T18:30:00Z"));
    }

    #[test]
    fn bad_words_are_refused() {
        assert!(matches!(
            Calendar::new("Mars/Olympus", 1, "monday"),
            Err(CalendarProblem::UnknownZone(_))
        ));
        assert_eq!(
            Calendar::new("UTC", 29, "monday").err(),
            Some(CalendarProblem::AnchorDay)
        );
        assert!(Calendar::new("UTC", 1, "caturday").is_err());
    }
}
