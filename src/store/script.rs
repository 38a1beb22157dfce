//! The decision script: its source (assembled from the files in `lua/`), its SHA1, and the layout
//! of its arguments. The one place that knows how a [`Check`] is spelled for Lua.

use std::sync::LazyLock;

use super::{Check, Rule};

/// Helpers and algorithm files first, the entry point last: one chunk, so the entry point can
/// call them.
const PARTS: &[&str] = &[
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window_log.lua"),
    include_str!("../../lua/sliding_window_counter.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/warm_up.lua"),
    include_str!("../../lua/decide.lua"),
];

/// Integers in the reply per check.
pub const REPLY_PER_CHECK: usize = 4;

pub struct DecisionScript {
    pub source: String,
    pub sha1: String,
}

pub static DECISION: LazyLock<DecisionScript> = LazyLock::new(|| {
    let source = PARTS.join("\n");
    let sha1 = sha1_smol::Sha1::from(&source).digest().to_string();
    DecisionScript { source, sha1 }
});

/// Appends the KEYS count, KEYS and ARGV of one script call deciding `checks` to `cmd`.
///
/// `pinned_now_micros` replaces Redis's clock (tests only); `ttl_jitter_ms` is added to the expiry
/// of each new counter, one value per check.
pub fn encode(
    cmd: &mut redis::Cmd,
    checks: &[Check],
    pinned_now_micros: Option<u64>,
    mut ttl_jitter_ms: impl FnMut() -> u64,
) {
    cmd.arg(checks.len());
    for check in checks {
        cmd.arg(check.key.as_str());
    }
    match pinned_now_micros {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    for check in checks {
        cmd.arg(rule_name(&check.rule)).arg(check.hits);
        // Integers travel as decimal strings; the script hands `hits` to INCRBY as is.
        match check.rule {
            Rule::FixedWindow {
                limit,
                window_secs,
                window_start,
            } => {
                let window_ms = window_secs * 1000;
                cmd.arg(limit)
                    .arg(window_ms)
                    .arg((window_start + window_secs) * 1000)
                    .arg(window_ms + ttl_jitter_ms());
            }
            Rule::SlidingWindowLog { limit, window }
            | Rule::SlidingWindowCounter { limit, window } => {
                cmd.arg(limit).arg(window).arg("").arg("");
            }
            Rule::Gcra { interval, burst } => {
                cmd.arg(interval).arg(burst).arg("").arg("");
            }
            Rule::WarmUp {
                permits_per_window,
                window,
                warmup,
                cold_factor,
            } => {
                // `{}` prints the shortest text that reads back as the same f64, in Lua too.
                cmd.arg(permits_per_window)
                    .arg(window)
                    .arg(warmup)
                    .arg(cold_factor.to_string());
            }
        }
    }
}

fn rule_name(rule: &Rule) -> &'static str {
    match rule {
        Rule::FixedWindow { .. } => "fixed_window",
        Rule::SlidingWindowLog { .. } => "sliding_window_log",
        Rule::SlidingWindowCounter { .. } => "sliding_window_counter",
        Rule::Gcra { .. } => "gcra",
        Rule::WarmUp { .. } => "warm_up",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments per check after ARGV[1], as `lua/decide.lua` reads them.
    const ARGS_PER_CHECK: usize = 6;

    #[test]
    fn entry_point_stride_matches() {
        assert!(
            DECISION
                .source
                .contains(&format!("local ARGS_PER_CHECK = {ARGS_PER_CHECK}"))
        );
        assert_eq!(DECISION.sha1.len(), 40);
    }

    #[test]
    fn encodes_one_check_per_stride() {
        let check = Check {
            key: "d_k_v_60".into(),
            hits: 3,
            rule: Rule::FixedWindow {
                limit: 10,
                window_secs: 60,
                window_start: 60,
            },
        };
        let mut cmd = redis::cmd("EVALSHA");
        encode(&mut cmd, &[check.clone(), check], None, || 7);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<non-simple>".into(),
            })
            .collect();
        assert_eq!(args.len(), 1 + 1 + 2 + 1 + 2 * ARGS_PER_CHECK);
        assert_eq!(&args[1..5], ["2", "d_k_v_60", "d_k_v_60", ""]);
        assert_eq!(
            &args[5..11],
            ["fixed_window", "3", "10", "60000", "120000", "60007"]
        );
    }
}
