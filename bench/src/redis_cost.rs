//! `sluice-bench redis-cost`: what one decision costs Redis, with no gRPC in the way.
//!
//! It starts a `redis-server` of its own and drives Sluice's real `RedisStore` (the library, in
//! this process) with closed-loop callers, one workload at a time: one fixed-window descriptor,
//! ten, and one descriptor of every other algorithm, each at every concurrency level. Before each
//! run Redis's statistics are reset (`CONFIG RESETSTAT`), so `INFO commandstats` gives the
//! decision script's own time per call (`usec_per_call` of `evalsha`) for that run alone. It also
//! reports Redis's CPU per decision (`used_cpu_sys + used_cpu_user`, which RESETSTAT leaves
//! alone, so as a difference), and the batch depth: store calls (a script call, or one
//! decision's plain commands on Redis 7) per pipelined write the
//! coalescer made (`RedisStore::pipeline_counts`), and per read and per write Redis made
//! (`total_reads_processed`, `total_writes_processed` of `INFO stats`), each a wake-up of Redis.
//!
//! Every limit is far above what a run can count, so every answer is an admission, as in the
//! matrix; keys are drawn uniformly from `--keys` values per descriptor.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;
use hdrhistogram::Histogram;
use sluice::store::redis::{PipelineCounts, StartupRetry, Target};
use sluice::store::{Call, Charging, Check, CounterStore, RedisOptions, RedisStore, Rule};

use crate::{parse_seconds, procs};

#[derive(Args, Debug)]
pub(crate) struct RedisCostArgs {
    /// Short runs (1 s each, levels 1 and 64); for a smoke test.
    #[arg(long)]
    quick: bool,
    /// Measured seconds per run [default: 4, or 1 with --quick].
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<Duration>,
    /// Concurrency levels (closed-loop callers), comma-separated [default: 1,16,64].
    #[arg(long = "levels", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    levels: Vec<u32>,
    /// Workloads, comma-separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Key cardinality: each descriptor's key is drawn uniformly from this many values.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// REDIS_POOL_SIZE of the store.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pool_size: u32,
    /// An already running Redis (redis://host:port) instead of a fresh redis-server. Its
    /// statistics are reset.
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// The redis-server binary.
    #[arg(long, value_name = "PATH", default_value = "redis-server")]
    redis_server: PathBuf,
    /// Also write one JSON line per run to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Label of this build in the output (say, "before" or a commit).
    #[arg(long, default_value = "")]
    label: String,
}

/// What one decision asks of the store.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Workload {
    /// One fixed-window descriptor (upstream's algorithm; the common case).
    Fixed1,
    /// The same under `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (`Charging::StopWhenOver`): one
    /// check on its own needs no trial pass and is decided as `Fixed1` is (before 89b7326 it
    /// took the full script's trial).
    Fixed1Stop,
    /// Ten fixed-window descriptors in one request.
    Fixed10,
    SlidingWindowLog,
    SlidingWindowCounter,
    Gcra,
    WarmUp,
}

const ALL: [Workload; 7] = [
    Workload::Fixed1,
    Workload::Fixed1Stop,
    Workload::Fixed10,
    Workload::SlidingWindowLog,
    Workload::SlidingWindowCounter,
    Workload::Gcra,
    Workload::WarmUp,
];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Fixed1 => "fixed_window D=1",
            Workload::Fixed1Stop => "fixed_window D=1, stop when over",
            Workload::Fixed10 => "fixed_window D=10",
            Workload::SlidingWindowLog => "sliding_window_log",
            Workload::SlidingWindowCounter => "sliding_window_counter",
            Workload::Gcra => "gcra",
            Workload::WarmUp => "warm_up",
        }
    }

    /// A short name for keys.
    fn tag(self) -> &'static str {
        match self {
            Workload::Fixed1 | Workload::Fixed10 => "fw",
            Workload::Fixed1Stop => "fws",
            Workload::SlidingWindowLog => "swl",
            Workload::SlidingWindowCounter => "swc",
            Workload::Gcra => "gcra",
            Workload::WarmUp => "wu",
        }
    }

    fn descriptors(self) -> u64 {
        if self == Workload::Fixed10 { 10 } else { 1 }
    }

    fn charging(self) -> Charging {
        if self == Workload::Fixed1Stop {
            Charging::StopWhenOver
        } else {
            Charging::Each
        }
    }

    /// The rule of every check; the fixed window's key names its window, as the service's do.
    fn rule(self, now_secs: u64) -> Rule {
        const HOUR: u64 = 3600;
        const SECOND_US: u64 = 1_000_000;
        const LIMIT: u64 = 1_000_000_000;
        match self {
            Workload::Fixed1 | Workload::Fixed1Stop | Workload::Fixed10 => Rule::FixedWindow {
                limit: LIMIT,
                window_secs: HOUR,
                window_start: sluice::store::window_start(now_secs, HOUR),
            },
            // One second: the log holds one member per hit in its window, and a longer window
            // would make its cost grow with the length of the run.
            Workload::SlidingWindowLog => Rule::SlidingWindowLog {
                limit: LIMIT,
                window: SECOND_US,
            },
            Workload::SlidingWindowCounter => Rule::SlidingWindowCounter {
                limit: LIMIT,
                window: HOUR * SECOND_US,
            },
            Workload::Gcra => Rule::Gcra {
                interval: 1,
                burst: LIMIT,
            },
            Workload::WarmUp => Rule::WarmUp {
                permits_per_window: LIMIT,
                window: SECOND_US,
                warmup: SECOND_US,
                cold_factor: 3.0,
            },
        }
    }
}

/// One run's figures.
struct Run {
    workload: Workload,
    concurrency: u32,
    decisions: u64,
    seconds: f64,
    evalsha_calls: u64,
    usec_per_call: f64,
    /// All commands Redis ran (the scripts' own included), per store call.
    commands_per_call: f64,
    redis_cpu_us_per_decision: f64,
    calls_per_pipeline: f64,
    calls_per_redis_read: f64,
    calls_per_redis_write: f64,
    p50_us: u64,
    p99_us: u64,
}

pub(crate) async fn main(args: RedisCostArgs) -> Result<()> {
    let duration = args.duration.unwrap_or(if args.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(4)
    });
    let levels = match (&args.levels[..], args.quick) {
        ([], false) => vec![1, 16, 64],
        ([], true) => vec![1, 64],
        (levels, _) => levels.to_vec(),
    };
    let workloads = if args.workloads.is_empty() {
        ALL.to_vec()
    } else {
        args.workloads.clone()
    };
    let _own_redis;
    let url = match &args.redis_url {
        Some(url) => url.clone(),
        None => {
            let redis = procs::start_redis(&args.redis_server)?;
            let url = redis.url();
            _own_redis = redis;
            url
        }
    };
    let store = Arc::new(
        RedisStore::new(RedisOptions {
            target: Target::Single(url.clone()),
            auth: None,
            auth_file: None,
            sentinel_auth: None,
            tls: Default::default(),
            pool_size: args.pool_size,
            timeout: Duration::from_secs(5),
            expiration_jitter_max: Duration::ZERO,
            pinned_clock: None,
        })
        .context("cannot set up the Redis store")?,
    );
    store
        .wait_until_ready(&StartupRetry::within(Some(Duration::from_secs(10))))
        .await
        .context("Redis is not ready")?;
    let mut admin = redis::Client::open(url.as_str())
        .context("invalid Redis URL")?
        .get_multiplexed_async_connection()
        .await
        .context("cannot connect to Redis")?;

    let mut runs = Vec::new();
    let mut json = String::new();
    for &workload in &workloads {
        for &concurrency in &levels {
            // A short unmeasured start, so new keys and connections are not what is measured.
            drive(
                &store,
                workload,
                concurrency,
                args.keys,
                Duration::from_millis(200),
            )
            .await?;
            let run = measure(
                &store,
                &mut admin,
                workload,
                concurrency,
                args.keys,
                duration,
            )
            .await?;
            eprintln!("{}", line(&args.label, &run));
            let _ = writeln!(json, "{}", to_json(&args.label, &run));
            runs.push(run);
        }
    }
    print!("{}", table(&args.label, &runs));
    if let Some(path) = &args.json {
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

async fn measure(
    store: &Arc<RedisStore>,
    admin: &mut redis::aio::MultiplexedConnection,
    workload: Workload,
    concurrency: u32,
    keys: u64,
    duration: Duration,
) -> Result<Run> {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .context("CONFIG RESETSTAT failed")?;
    let cpu_before = info(admin).await?.cpu;
    let pipes_before = store.pipeline_counts();
    let started = Instant::now();
    let (decisions, latency) = drive(store, workload, concurrency, keys, duration).await?;
    let seconds = started.elapsed().as_secs_f64();
    let pipes = delta(store.pipeline_counts(), pipes_before);
    let after = info(admin).await?;
    // The store's calls: a script call each, or one decision's plain commands (Redis 7).
    let calls = pipes.calls.max(1) as f64;
    Ok(Run {
        workload,
        concurrency,
        decisions,
        seconds,
        evalsha_calls: after.evalsha_calls,
        usec_per_call: after.evalsha_usec_per_call,
        commands_per_call: after.commands as f64 / calls,
        redis_cpu_us_per_decision: (after.cpu - cpu_before) * 1e6 / decisions.max(1) as f64,
        calls_per_pipeline: pipes.calls as f64 / pipes.pipelines.max(1) as f64,
        calls_per_redis_read: calls / after.reads.max(1) as f64,
        calls_per_redis_write: calls / after.writes.max(1) as f64,
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
    })
}

fn delta(after: PipelineCounts, before: PipelineCounts) -> PipelineCounts {
    PipelineCounts {
        calls: after.calls - before.calls,
        pipelines: after.pipelines - before.pipelines,
    }
}

/// Runs `concurrency` closed-loop callers for `duration`: decisions made, and their latency.
async fn drive(
    store: &Arc<RedisStore>,
    workload: Workload,
    concurrency: u32,
    keys: u64,
    duration: Duration,
) -> Result<(u64, Histogram<u64>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for caller in 0..concurrency {
        let store = store.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                .expect("constant histogram bounds are valid");
            let mut rng = u64::from(caller).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut decisions = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let now_secs = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let rule = workload.rule(now_secs);
                let window = match rule {
                    Rule::FixedWindow { window_start, .. } => format!("_{window_start}"),
                    _ => String::new(),
                };
                let checks: Vec<Check> = (0..workload.descriptors())
                    .map(|d| {
                        // xorshift: cheap, and the same sequence for every build compared.
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        Check {
                            // Each workload its own keys: their values have different types.
                            key: format!("bench_{}_k{d}_{}{window}", workload.tag(), rng % keys),
                            hits: 1,
                            rule: rule.clone(),
                            record_refused: false,
                            group: None,
                        }
                    })
                    .collect();
                let refs: Vec<&Check> = checks.iter().collect();
                let sent = Instant::now();
                store
                    .check_with(Call::detached(), &refs, workload.charging())
                    .await
                    .map_err(|e| anyhow::anyhow!("decision failed: {e}"))?;
                let _ = latency.record(sent.elapsed().as_micros().max(1) as u64);
                decisions += 1;
            }
            Ok::<_, anyhow::Error>((decisions, latency))
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut decisions = 0;
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .expect("constant histogram bounds are valid");
    for task in tasks {
        let (n, h) = task.await.context("a caller panicked")??;
        decisions += n;
        latency.add(h).context("histograms differ")?;
    }
    if decisions == 0 {
        bail!("no decision was made in {duration:?}");
    }
    Ok((decisions, latency))
}

/// What this benchmark reads of `INFO`.
struct Info {
    evalsha_calls: u64,
    evalsha_usec_per_call: f64,
    /// Calls of every command but INFO and CONFIG.
    commands: u64,
    reads: u64,
    writes: u64,
    cpu: f64,
}

async fn info(admin: &mut redis::aio::MultiplexedConnection) -> Result<Info> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("stats")
        .arg("cpu")
        .query_async(admin)
        .await
        .context("INFO failed")?;
    Ok(parse_info(&text))
}

fn parse_info(text: &str) -> Info {
    let mut info = Info {
        evalsha_calls: 0,
        evalsha_usec_per_call: 0.0,
        commands: 0,
        reads: 0,
        writes: 0,
        cpu: 0.0,
    };
    for line in text.lines().map(str::trim) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let field = |key: &str| {
            value
                .split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or("0")
        };
        match name {
            "cmdstat_evalsha" => {
                info.evalsha_calls = field("calls").parse().unwrap_or(0);
                info.evalsha_usec_per_call = field("usec_per_call").parse().unwrap_or(0.0);
                info.commands += info.evalsha_calls;
            }
            "cmdstat_info" | "cmdstat_config" => {}
            _ if name.starts_with("cmdstat_") => {
                info.commands += field("calls").parse::<u64>().unwrap_or(0);
            }
            "total_reads_processed" => info.reads = value.parse().unwrap_or(0),
            "total_writes_processed" => info.writes = value.parse().unwrap_or(0),
            "used_cpu_sys" | "used_cpu_user" => info.cpu += value.parse::<f64>().unwrap_or(0.0),
            _ => {}
        }
    }
    info
}

fn line(label: &str, r: &Run) -> String {
    format!(
        "{label} {} c={}: {:.0} decisions/s, evalsha {:.2} µs/call, Redis CPU {:.2} µs/decision, \
         {:.1} calls/pipeline, {:.1} calls/Redis read",
        r.workload.name(),
        r.concurrency,
        r.decisions as f64 / r.seconds,
        r.usec_per_call,
        r.redis_cpu_us_per_decision,
        r.calls_per_pipeline,
        r.calls_per_redis_read
    )
}

fn table(label: &str, runs: &[Run]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| build | workload | conc | decisions/s | evalsha µs/call | Redis cmds/call | Redis CPU \
         µs/decision | calls/pipeline | calls/Redis read | calls/Redis write | p50 µs | p99 µs |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in runs {
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {} |",
            r.workload.name(),
            r.concurrency,
            r.decisions as f64 / r.seconds,
            r.usec_per_call,
            r.commands_per_call,
            r.redis_cpu_us_per_decision,
            r.calls_per_pipeline,
            r.calls_per_redis_read,
            r.calls_per_redis_write,
            r.p50_us,
            r.p99_us,
        );
    }
    out
}

fn to_json(label: &str, r: &Run) -> serde_json::Value {
    serde_json::json!({
        "label": label,
        "workload": r.workload.name(),
        "concurrency": r.concurrency,
        "decisions": r.decisions,
        "seconds": r.seconds,
        "decisions_per_s": r.decisions as f64 / r.seconds,
        "evalsha_calls": r.evalsha_calls,
        "evalsha_usec_per_call": r.usec_per_call,
        "redis_commands_per_call": r.commands_per_call,
        "redis_cpu_us_per_decision": r.redis_cpu_us_per_decision,
        "calls_per_pipeline": r.calls_per_pipeline,
        "calls_per_redis_read": r.calls_per_redis_read,
        "calls_per_redis_write": r.calls_per_redis_write,
        "p50_us": r.p50_us,
        "p99_us": r.p99_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_it_needs() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,\
                    rejected_calls=0,failed_calls=0\r\ncmdstat_incrby:calls=10,usec=1\r\n\
                    cmdstat_info:calls=3,usec=1\r\n# Stats\r\ntotal_reads_processed:4\r\n\
                    total_writes_processed:5\r\n# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.25\r\n";
        let info = parse_info(text);
        assert_eq!(info.evalsha_calls, 10);
        assert!((info.evalsha_usec_per_call - 5.0).abs() < 1e-9);
        assert_eq!(info.commands, 20);
        assert_eq!((info.reads, info.writes), (4, 5));
        assert!((info.cpu - 3.75).abs() < 1e-9);
    }
}
