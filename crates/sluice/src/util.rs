//! Small helpers every module may use: the leaf of the module graph, importing nothing from the
//! crate (see ARCHITECTURE.md for the rule that keeps the graph acyclic).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Lets a warning that repeats per request through at most once a second, with the number held
/// back since, so a store outage at tens of thousands of requests a second does not write as
/// many log lines (and slow the service down with them).
#[derive(Debug, Default)]
pub struct LogThrottle {
    last_second: AtomicU64,
    held_back: AtomicU64,
}

impl LogThrottle {
    /// A throttle that lets the first occurrence through; `const`, so it can be a `static`.
    pub const fn new() -> Self {
        Self {
            last_second: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last logged one)` when this occurrence should be logged.
    pub fn allow(&self, now_secs: u64) -> Option<u64> {
        let last = self.last_second.load(Ordering::Relaxed);
        if now_secs > last
            && self
                .last_second
                .compare_exchange(last, now_secs, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.held_back.swap(0, Ordering::Relaxed))
        } else {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Parses a Go duration (`300ms`, `1.5s`, `1h30m`, `10us`); a bare `0` is zero.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("expected a duration such as 500ms, 10s or 1m30s, found {text:?}");
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Client bytes shown as text in logs, stats and Envoy's dynamic metadata: valid UTF-8 as it
/// is (borrowed, so valid input costs nothing and reads exactly as before), each byte of an
/// invalid sequence as `\xNN`. Descriptor fields are bytes because Envoy forwards obs-text header
/// bytes unchanged (see `build.rs`); what is shown must still be text, and the escape keeps two
/// different invalid values apart where a lossy U+FFFD would merge them.
pub fn shown(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write;

    if let Ok(text) = std::str::from_utf8(bytes) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02X}");
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn shown_keeps_valid_text_and_escapes_invalid_bytes() {
        assert!(matches!(
            super::shown("userC é".as_bytes()),
            std::borrow::Cow::Borrowed("userC é")
        ));
        assert_eq!(super::shown(b"userC\xff"), "userC\\xFF");
        assert_eq!(super::shown(b"\xc3(\x80\n"), "\\xC3(\\x80\n");
    }

    #[test]
    fn lets_one_through_per_second_and_counts_the_rest() {
        let throttle = LogThrottle::new();
        assert_eq!(throttle.allow(100), Some(0));
        assert_eq!(throttle.allow(100), None);
        assert_eq!(throttle.allow(100), None);
        assert_eq!(throttle.allow(101), Some(2));
        assert_eq!(throttle.allow(101), None);
        assert_eq!(throttle.allow(105), Some(1));
    }

    #[test]
    fn go_durations() {
        let cases = [
            ("10s", Duration::from_secs(10)),
            ("500ms", Duration::from_millis(500)),
            ("1.5s", Duration::from_millis(1500)),
            ("1h30m", Duration::from_secs(5400)),
            ("250us", Duration::from_micros(250)),
            ("0", Duration::ZERO),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "10", "s", "1x", "-1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
