//! Calendar windows (`calendar: {time_zone: ...}`, issue #44): a fixed window that is a day,
//! week, month or year in an IANA zone. Through a real `RateLimiter` on both stores with a
//! pinned clock (daylight saving days of 23 and 25 hours, the period named in the key), through
//! the service's `/json` on the system clock (a month in New York, a day in Kolkata), and the
//! loader's refusals with file and line.

use sluice_test_kit as kit;

use std::sync::Arc;

use kit::in_process::{load_error, pinned_limiter, pinned_store};
use kit::{RedisServer, Sluice, config_dir, descriptor, for_each_store, request};
use sluice::clock::ManualClock;
use sluice::proto::{Code, RateLimitResponse};
use sluice::rls::{RateLimiter, RlsOptions};

async fn ask(limiter: &RateLimiter) -> RateLimitResponse {
    limiter
        .should_rate_limit(&request("d", vec![descriptor(&[("k", "a")])]), None)
        .await
        .expect("a valid request is decided")
}

fn reset_secs(response: &RateLimitResponse) -> i64 {
    response.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("a counted status has a reset")
        .seconds
}

/// Microseconds since the epoch of an RFC 3339 instant.
fn at(text: &str) -> u64 {
    text.parse::<jiff::Timestamp>().unwrap().as_microsecond() as u64
}

/// A cost charged when a response ends (`apply_on_stream_done`, a descriptor's `hits_addend`)
/// counts in the calendar month like any fixed-window charge, on both stores.
#[tokio::test(flavor = "multi_thread")]
async fn costs_charged_at_stream_end_count_in_the_calendar_period() {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(at("2026-11-30T23:00:00Z")));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, \
            requests_per_unit: 1000, calendar: {time_zone: America/New_York}}\n";
        let limiter = pinned_limiter(store, &clock, yaml, RlsOptions::default());
        let charge = |hits: u64| {
            let mut d = descriptor(&[("k", "a")]);
            d.hits_addend = Some(hits);
            request("d", vec![d])
        };
        let spent = limiter.should_rate_limit(&charge(700), None).await.unwrap();
        assert_eq!(spent.statuses[0].limit_remaining, 300, "{kind:?}");
        // 18:00 in New York on 30 November: the month ends in six hours.
        assert_eq!(reset_secs(&spent), 6 * 3600);
        let over = limiter.should_rate_limit(&charge(400), None).await.unwrap();
        assert_eq!(over.overall_code, Code::OverLimit as i32);
        // December in New York (05:00Z): a new month, a new counter.
        clock.set_micros(at("2026-12-01T05:00:00Z"));
        let fresh = limiter.should_rate_limit(&charge(400), None).await.unwrap();
        assert_eq!(
            fresh.statuses[0].limit_remaining, 600,
            "{kind:?}: {fresh:?}"
        );
    })
    .await;
}

fn redis_keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server
        .cli(&["--raw", "KEYS", "*"])
        .unwrap_or_default()
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

const DAILY_NEW_YORK: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      \
    unit: day\n      requests_per_unit: 2\n      calendar: {time_zone: America/New_York}\n";

/// 2026-03-08 in New York has 23 hours (clocks go from 02:00 to 03:00), 2026-11-01 has 25: the
/// reset is the time to the zone's next midnight, the key names the local day, and the next day
/// is a counter of its own.
#[tokio::test(flavor = "multi_thread")]
async fn days_across_daylight_saving_changes_end_at_the_zones_midnight() {
    for_each_store(|kind, redis| async move {
        // Noon UTC on the spring day: 07:00 EST, 16 hours before midnight EDT (04:00Z).
        let clock = Arc::new(ManualClock::new(at("2026-03-08T12:00:00Z")));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let limiter = pinned_limiter(store, &clock, DAILY_NEW_YORK, RlsOptions::default());
        let first = ask(&limiter).await;
        assert_eq!(first.overall_code, Code::Ok as i32, "{first:?}");
        assert_eq!(reset_secs(&first), 16 * 3600, "{kind:?}: {first:?}");
        assert_eq!(ask(&limiter).await.overall_code, Code::Ok as i32);
        let over = ask(&limiter).await;
        assert_eq!(over.overall_code, Code::OverLimit as i32, "{over:?}");
        // One second before New York's midnight: still the same day, one second left.
        clock.set_micros(at("2026-03-09T03:59:59Z"));
        let last = ask(&limiter).await;
        assert_eq!(last.overall_code, Code::OverLimit as i32, "{last:?}");
        assert_eq!(reset_secs(&last), 1);
        // Midnight: a fresh day of 24 hours.
        clock.set_micros(at("2026-03-09T04:00:00Z"));
        let fresh = ask(&limiter).await;
        assert_eq!(fresh.overall_code, Code::Ok as i32, "{fresh:?}");
        assert_eq!(reset_secs(&fresh), 24 * 3600);
        // The autumn day: 25 hours from its midnight (04:00Z) to the next (05:00Z).
        clock.set_micros(at("2026-11-01T04:00:00Z"));
        let autumn = ask(&limiter).await;
        assert_eq!(reset_secs(&autumn), 25 * 3600, "{autumn:?}");
        if let Some(server) = &redis {
            assert_eq!(
                redis_keys(server),
                vec![
                    "d_k_a_2026-03-08@America/New_York",
                    "d_k_a_2026-03-09@America/New_York",
                    "d_k_a_2026-11-01@America/New_York",
                ]
            );
        }
    })
    .await;
}

/// A month from its anchor day in Berlin, and weeks starting on Sunday in Kolkata: the reset is
/// the time to the period's end there, on both stores.
#[tokio::test(flavor = "multi_thread")]
async fn months_from_an_anchor_day_and_weeks_from_their_first_day() {
    for_each_store(|kind, redis| async move {
        let clock = Arc::new(ManualClock::new(at("2026-10-20T10:00:00Z")));
        let store = pinned_store(kind, redis.as_ref(), &clock).await;
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      \
            - {unit: month, requests_per_unit: 5, calendar: {time_zone: Europe/Berlin, \
            anchor_day: 25}}\n      - {unit: week, requests_per_unit: 3, calendar: \
            {time_zone: Asia/Kolkata, week_start: sunday}}\n";
        let limiter = pinned_limiter(store, &clock, yaml, RlsOptions::default());
        let first = ask(&limiter).await;
        assert_eq!(first.overall_code, Code::Ok as i32, "{first:?}");
        // Both admit; the status is the tighter limit's: the week from Sunday in Kolkata, which
        // ends at 2026-10-25 00:00 IST (18:30Z), hours before Berlin's month from the 25th.
        assert_eq!(
            reset_secs(&first) as u64,
            (at("2026-10-24T18:30:00Z") - at("2026-10-20T10:00:00Z")) / 1_000_000,
            "{kind:?}: {first:?}"
        );
        // Two more fill the week (Sunday 2026-10-25 00:00 IST, 2026-10-24T18:30Z), which then
        // refuses and says when it ends.
        for _ in 0..2 {
            assert_eq!(ask(&limiter).await.overall_code, Code::Ok as i32);
        }
        let over = ask(&limiter).await;
        assert_eq!(over.overall_code, Code::OverLimit as i32, "{over:?}");
        assert_eq!(
            reset_secs(&over) as u64,
            (at("2026-10-24T18:30:00Z") - at("2026-10-20T10:00:00Z")) / 1_000_000,
            "{kind:?}: {over:?}"
        );
        // Sunday in Kolkata: a new week; the Berlin month (three taken) admits two more, then
        // refuses until its own end three hours later.
        clock.set_micros(at("2026-10-24T19:00:00Z"));
        for _ in 0..2 {
            let ok = ask(&limiter).await;
            assert_eq!(ok.overall_code, Code::Ok as i32, "{kind:?}: {ok:?}");
        }
        let month_over = ask(&limiter).await;
        assert_eq!(
            month_over.overall_code,
            Code::OverLimit as i32,
            "{month_over:?}"
        );
        assert_eq!(reset_secs(&month_over), 3 * 3600);
        if let Some(server) = &redis {
            let keys = redis_keys(server);
            assert!(
                keys.iter()
                    .any(|k| k.ends_with("_2026-09-25@Europe/Berlin"))
                    && keys
                        .iter()
                        .any(|k| k.ends_with("_week-2026-10-18@Asia/Kolkata")),
                "{keys:?}"
            );
        }
    })
    .await;
}

/// Seconds from now to the start of the next period of `unit` in `zone`, computed here with
/// jiff's own calendar arithmetic.
fn seconds_to_next(zone: &str, unit: &str) -> i64 {
    let now = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::get(zone).unwrap());
    let today = now.date();
    let next = match unit {
        "month" => today
            .first_of_month()
            .checked_add(jiff::Span::new().months(1)),
        _ => today.checked_add(jiff::Span::new().days(1)),
    }
    .unwrap();
    let end = next.to_zoned(now.time_zone().clone()).unwrap();
    end.timestamp().as_second() - now.timestamp().as_second()
}

/// The reset in seconds of `/json`'s answer (`"durationUntilReset": "1234s"`).
fn json_reset(body: &str) -> i64 {
    let at = body
        .find("durationUntilReset")
        .unwrap_or_else(|| panic!("no reset in {body}"));
    let rest = &body[at..];
    let start = rest.find(": \"").or_else(|| rest.find(":\"")).unwrap();
    let digits: String = rest[start..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap()
}

/// Through the service on the system clock: a monthly limit in New York resets at the start of
/// New York's next month, a daily one in Kolkata at Kolkata's next midnight (within 3 s), on
/// both stores.
#[test]
fn the_service_answers_resets_at_the_zones_period_ends() {
    let yaml = "domain: d\ndescriptors:\n  - key: month\n    rate_limit:\n      unit: month\n      \
        requests_per_unit: 1000000\n      calendar:\n        time_zone: America/New_York\n  \
        - key: day\n    rate_limit:\n      unit: day\n      requests_per_unit: 10000\n      \
        calendar:\n        time_zone: Asia/Kolkata\n";
    let config = config_dir(yaml);
    let redis = RedisServer::start();
    for server in [None, Some(&redis)] {
        let sluice = Sluice::start(config.path(), server, &[]);
        for (key, zone, unit) in [
            ("month", "America/New_York", "month"),
            ("day", "Asia/Kolkata", "day"),
        ] {
            let body = format!(
                r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"u"}}]}}]}}"#
            );
            let (status, answer) = sluice.http("POST", "/json", &body);
            assert_eq!(status, 200, "{answer}");
            let expected = seconds_to_next(zone, unit);
            let got = json_reset(&answer);
            assert!(
                (got - expected).abs() <= 3,
                "{key} in {zone}: reset {got}s, expected {expected}s ({answer})"
            );
        }
    }
    let keys = redis_keys(&redis);
    assert!(
        keys.iter().any(|k| k.ends_with("@America/New_York"))
            && keys.iter().any(|k| k.ends_with("@Asia/Kolkata")),
        "{keys:?}"
    );
}

#[test]
fn bad_calendars_are_refused_with_file_and_line() {
    let limit =
        |fields: &str| format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{fields}");
    for (fields, expected) in [
        (
            "      unit: day\n      requests_per_unit: 1\n      calendar:\n        time_zone: Europe/Berln\n",
            "bad.yaml:8: unknown time zone 'Europe/Berln'",
        ),
        (
            "      unit: day\n      requests_per_unit: 1\n      algorithm: sliding_window_log\n      calendar: {time_zone: UTC}\n",
            "bad.yaml:8: calendar applies to algorithm fixed_window only, not sliding_window_log",
        ),
        (
            "      unit: hour\n      requests_per_unit: 1\n      calendar: {time_zone: UTC}\n",
            "bad.yaml:7: calendar applies to unit day, week, month or year, not hour",
        ),
        (
            "      unit: month\n      requests_per_unit: 1\n      calendar:\n        time_zone: UTC\n        anchor_day: 31\n",
            "bad.yaml:9: anchor_day must be a whole number from 1 to 28",
        ),
        (
            "      unit: day\n      requests_per_unit: 1\n      calendar:\n        time_zone: UTC\n        anchor_day: 3\n",
            "bad.yaml:9: anchor_day applies to unit month only",
        ),
        (
            "      unit: week\n      requests_per_unit: 1\n      calendar:\n        time_zone: UTC\n        week_start: caturday\n",
            "bad.yaml:9: week_start must be a day of the week",
        ),
        (
            "      unit: day\n      requests_per_unit: 1\n      unit_multiplier: 2\n      calendar: {time_zone: UTC}\n",
            "bad.yaml:8: calendar does not combine with unit_multiplier",
        ),
    ] {
        let error = load_error(&limit(fields));
        assert!(error.contains(expected), "expected {expected:?} in {error}");
    }
}
