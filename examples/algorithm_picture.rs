//! Draws how each algorithm admits the same bursty traffic: `docs/algorithms.svg`.
//!
//! Run with `cargo run --example algorithm_picture -- docs/algorithms.svg`. It drives the real
//! algorithms through the memory store with a simulated clock (no server, no Redis): a limit of
//! 10 requests per second, and traffic that idles, bursts, runs steadily above the limit and
//! bursts again across a window boundary.

use std::fmt::Write;
use std::sync::Arc;

use sluice::clock::{Clock, ManualClock};
use sluice::config::Algorithm;
use sluice::rls::rule_for;
use sluice::store::{Check, CounterStore, MemoryStore, MemoryStoreOptions, Rule};

const SECOND: u64 = 1_000_000;
const LIMIT: u64 = 10;
const DURATION: u64 = 8 * SECOND;
const BIN: u64 = 100_000;

/// Arrival times (µs): a burst of 25 at 0.95 s, steady 20/s from 2 s to 4 s, idle, a burst of
/// 15 just before the 6 s boundary and 15 just after it.
fn traffic() -> Vec<u64> {
    let mut t = Vec::new();
    t.extend((0..25).map(|i| 950_000 + i * 1_000));
    t.extend((0..40).map(|i| 2 * SECOND + i * 50_000));
    t.extend((0..15).map(|i| 5 * SECOND + 900_000 + i * 5_000));
    t.extend((0..15).map(|i| 6 * SECOND + i * 5_000));
    t.sort();
    t
}

fn algorithms() -> Vec<(&'static str, Algorithm)> {
    vec![
        ("fixed_window", Algorithm::FixedWindow),
        ("sliding_window_log", Algorithm::SlidingWindowLog),
        ("sliding_window_counter", Algorithm::SlidingWindowCounter),
        (
            "token_bucket / gcra / leaky_bucket (burst 10)",
            Algorithm::TokenBucket { burst: 10 },
        ),
        (
            "warm_up (warm-up 2 s, cold factor 3)",
            Algorithm::WarmUp {
                warmup: std::time::Duration::from_secs(2),
                cold_factor: 3.0,
            },
        ),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/algorithms.svg".into());
    let arrivals = traffic();
    let bins = (DURATION / BIN) as usize;
    let mut rows = Vec::new();
    for (name, algorithm) in algorithms() {
        // Start at an epoch-aligned second far from zero, like real time.
        let origin = 1_700_000_000 * SECOND;
        let clock = Arc::new(ManualClock::new(origin));
        let store = MemoryStore::new(MemoryStoreOptions::default(), clock.clone());
        let mut admitted = vec![0u32; bins];
        let mut offered = vec![0u32; bins];
        for &t in &arrivals {
            clock.set_micros(origin + t);
            let mut rule = rule_for(algorithm, LIMIT, SECOND);
            if let Rule::FixedWindow { window_start, .. } = &mut rule {
                *window_start = clock.now_secs();
            }
            let key = match rule {
                Rule::FixedWindow { window_start, .. } => format!("k_{window_start}"),
                _ => "k".to_string(),
            };
            let check = Check {
                key,
                hits: 1,
                rule,
                record_refused: false,
                group: None,
            };
            let outcome = store.check(&[&check]).await?[0];
            let bin = (t / BIN) as usize;
            offered[bin] += 1;
            if outcome.admitted {
                admitted[bin] += 1;
            }
        }
        rows.push((name, offered, admitted));
    }
    std::fs::write(&out, svg(&rows))?;
    println!("wrote {out}");
    Ok(())
}

fn svg(rows: &[(&str, Vec<u32>, Vec<u32>)]) -> String {
    let (left, width, row_height, bar_unit) = (20.0, 800.0, 110.0, 5.0);
    let bins = rows[0].1.len() as f64;
    let bar = width / bins;
    let height = 60.0 + row_height * rows.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">"#,
        width + 2.0 * left
    );
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="20" font-size="14">Same traffic, limit 10 per second: offered (grey) and admitted (blue) per 100 ms</text>"#
    );
    for (i, (name, offered, admitted)) in rows.iter().enumerate() {
        let base = 60.0 + row_height * (i as f64 + 1.0) - 20.0;
        let total: u32 = admitted.iter().sum();
        let _ = writeln!(
            s,
            r#"<text x="{left}" y="{}">{name}: {total} admitted of {}</text>"#,
            base - 72.0,
            offered.iter().sum::<u32>()
        );
        for (b, (&o, &a)) in offered.iter().zip(admitted).enumerate() {
            let x = left + b as f64 * bar;
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#ddd"/>"##,
                base - f64::from(o) * bar_unit,
                bar - 1.0,
                f64::from(o) * bar_unit
            );
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#2b6cb0"/>"##,
                base - f64::from(a) * bar_unit,
                bar - 1.0,
                f64::from(a) * bar_unit
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{base}" x2="{}" y2="{base}" stroke="#444"/>"##,
            left + width
        );
        for second in 0..=8 {
            let x = left + f64::from(second) * 10.0 * bar;
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{}" font-size="10">{second}s</text>"#,
                base + 12.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
