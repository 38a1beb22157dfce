//! Measures memory per key: in Redis for each algorithm (`INFO memory` delta over N keys), and
//! in the memory store for fixed-window counters (RSS delta over N counters).
//!
//! Run with `scripts/measure_memory.sh`, which starts a scratch redis-server for it. The Redis
//! part FLUSHes the database it is given, so never point it at a Redis that matters.
//! Arguments: REDIS_URL [N, default 200000].

/// The service's allocator (src/main.rs), so bytes per counter are the service's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::Duration;

use sluice::clock::{Clock, SystemClock};
use sluice::config::Algorithm;
use sluice::rls::rule_for;
use sluice::store::redis::Target;
use sluice::store::{
    Check, CounterStore, MemoryStore, MemoryStoreOptions, RedisOptions, RedisStore, Rule,
};

const SECOND: u64 = 1_000_000;

fn used_memory(conn: &mut redis::Connection) -> anyhow::Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no used_memory in INFO"))
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A realistic key: prefix-free, one descriptor entry with an IPv4-like value.
fn key_for(algorithm: &str, i: u64, window_start: u64) -> String {
    let value = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    if algorithm == "fixed_window" {
        format!("edge_remote_address_{value}_{window_start}")
    } else {
        format!("{{edge_remote_address_{value}}}:{algorithm}")
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: memory_per_key REDIS_URL [N]"))?;
    let n: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200_000);

    let store = RedisStore::new(RedisOptions {
        target: Target::Single(url.clone()),
        auth: None,
        auth_file: None,
        sentinel_auth: None,
        tls: Default::default(),
        pool_size: 4,
        timeout: Duration::from_secs(10),
        expiration_jitter_max: Duration::ZERO,
        pinned_clock: None,
    })?;
    store
        .wait_until_ready(&sluice::store::redis::StartupRetry::within(Some(
            Duration::from_secs(5),
        )))
        .await?;
    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;

    println!("| algorithm | Redis bytes per key |");
    println!("|---|---|");
    // (label, algorithm, limit, hits per key)
    let cases: Vec<(&str, Algorithm, u64, u64)> = vec![
        ("fixed_window", Algorithm::FixedWindow, 100, 1),
        (
            "sliding_window_log (1 entry)",
            Algorithm::SlidingWindowLog,
            100,
            1,
        ),
        (
            "sliding_window_log (100 entries)",
            Algorithm::SlidingWindowLog,
            100,
            100,
        ),
        (
            "sliding_window_counter",
            Algorithm::SlidingWindowCounter,
            100,
            1,
        ),
        (
            "token_bucket / gcra / leaky_bucket",
            Algorithm::Gcra { burst: 100 },
            100,
            1,
        ),
        (
            "warm_up",
            Algorithm::WarmUp {
                warmup: Duration::from_secs(10),
                cold_factor: 3.0,
            },
            100,
            1,
        ),
    ];
    for (label, algorithm, limit, hits) in cases {
        // Fewer keys when each holds many entries, to keep the run short.
        let n = n / hits;
        redis::cmd("FLUSHDB").query::<()>(&mut conn)?;
        let before = used_memory(&mut conn)?;
        let now = SystemClock.now_secs();
        let mut i = 0;
        while i < n {
            let batch: Vec<Check> = (i..(i + 500).min(n))
                .map(|j| {
                    let mut rule = rule_for(algorithm, limit, 3600 * SECOND);
                    if let Rule::FixedWindow { window_start, .. } = &mut rule {
                        *window_start = now / 3600 * 3600;
                    }
                    let window_start = match rule {
                        Rule::FixedWindow { window_start, .. } => window_start,
                        _ => 0,
                    };
                    Check {
                        key: key_for(algorithm.name(), j, window_start),
                        hits,
                        rule,
                        record_refused: false,
                        group: None,
                    }
                })
                .collect();
            let batch: Vec<&Check> = batch.iter().collect();
            store.check(&batch).await?;
            i += 500;
        }
        let after = used_memory(&mut conn)?;
        println!(
            "| {label} | {:.0} ({n} keys) |",
            (after - before) as f64 / n as f64
        );
    }
    redis::cmd("FLUSHDB").query::<()>(&mut conn)?;

    // The memory store: RSS growth over N fixed-window counters.
    let clock = Arc::new(SystemClock);
    let memory = MemoryStore::new(
        MemoryStoreOptions {
            max_counters: n as usize * 2,
            ..Default::default()
        },
        clock.clone(),
    );
    let before = rss_bytes();
    let window_start = clock.now_secs() / 3600 * 3600;
    for j in 0..n {
        let check = Check {
            key: key_for("fixed_window", j, window_start),
            hits: 1,
            rule: Rule::FixedWindow {
                limit: 100,
                window_secs: 3600,
                window_start,
            },
            record_refused: false,
            group: None,
        };
        memory.check(&[&check]).await?;
    }
    let after = rss_bytes();
    println!();
    println!(
        "memory store: {:.0} bytes per fixed-window counter (RSS delta over {n} counters, {} held)",
        (after - before) as f64 / n as f64,
        memory.len()
    );
    Ok(())
}
