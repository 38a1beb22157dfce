//! `sluice-bench matrix`: the fixed set of runs behind `docs/BENCHMARKS.md`, their ratios to the
//! null server, and the Markdown report with the targets.
//!
//! Runs, each against a freshly started server (and a fresh Redis):
//!
//! 1. sweep: every store × every concurrency (default 1, 4, 16, 64), K = 10 000, D = 1;
//! 2. descriptors: every store at the highest concurrency with D = 10;
//! 3. key cardinality: memory and redis at the highest concurrency with K = 1 (one hot key) and
//!    K = 1 000 000.
//!
//! Stores are null, memory, redis (standalone) and redis-cluster (3 masters on this machine).
//!
//! The whole list runs `--repeat` times (rounds interleaved, so drift of a shared machine touches
//! every configuration alike); each configuration reports its median round by req/s, and every
//! ratio compares medians: "× null" divides by the null server's median at the same concurrency
//! and descriptor count. Before each run the matrix waits for a quiet machine, and repeats a run
//! that other work disturbed (`--quiet-wait`, `--retries`).
//!
//! Results go to `OUT/NAME.jsonl` (every round, one line each, `selected` marking the medians)
//! and `OUT/NAME.md` (the medians and the targets); NAME is `latest`, or `quick` with `--quick`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::load::LoadSpec;
use crate::probe;
use crate::procs::{self, Kind};
use crate::report::{self, RunResult};
use crate::{CommonArgs, SpawnKind, parse_seconds, parse_seconds_or_zero};

#[derive(Args, Debug)]
pub(crate) struct MatrixArgs {
    /// Smoke test: 2 s per run after 1 s of warm-up; writes quick.jsonl and quick.md.
    #[arg(long)]
    quick: bool,
    /// Measured seconds per run [default: 10, or 2 with --quick].
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<Duration>,
    /// Warm-up seconds per run [default: 2, or 1 with --quick].
    #[arg(long, value_parser = parse_seconds_or_zero)]
    warmup: Option<Duration>,
    /// Stores to run, comma-separated (the ratios need null).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "null,memory,redis,redis-cluster"
    )]
    stores: Vec<SpawnKind>,
    /// Concurrency levels of the sweep, comma-separated; the highest is used for the descriptor
    /// and key-cardinality runs.
    #[arg(long = "levels", value_delimiter = ',', default_value = "1,4,16,64",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    levels: Vec<u32>,
    /// Directory of the result files.
    #[arg(long, default_value = "docs/bench")]
    out: PathBuf,
    /// Base name of the result files [default: latest, or quick with --quick].
    #[arg(long)]
    name: Option<String>,
    /// Rounds of the whole matrix; each configuration reports its median round by req/s
    /// [default: 3, or 1 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: Option<u32>,
    /// Revision shown in the report [default: `git rev-parse --short HEAD`, plus
    /// "+uncommitted changes" when tracked files differ].
    #[arg(long)]
    revision: Option<String>,
    /// Before each run, wait up to this many seconds for the machine to go quiet (at most
    /// --quiet-cores busy), so other work (say, a compiler) does not skew the figures; 0: don't.
    #[arg(long, default_value = "60", value_parser = parse_seconds_or_zero)]
    quiet_wait: Duration,
    /// Busy CPUs that still count as quiet.
    #[arg(long, default_value_t = 0.25)]
    quiet_cores: f64,
    /// Repeat a run disturbed by other work (see the ⚠ mark) up to this many times, keeping the
    /// least disturbed attempt.
    #[arg(long, default_value_t = 2)]
    retries: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One planned run.
#[derive(Clone, Debug)]
struct Plan {
    group: &'static str,
    kind: SpawnKind,
    concurrency: u32,
    keys: u64,
    descriptors: u32,
}

impl Plan {
    fn same_config(&self, other: &Plan) -> bool {
        self.kind == other.kind
            && self.concurrency == other.concurrency
            && self.keys == other.keys
            && self.descriptors == other.descriptors
    }
}

const BASE_KEYS: u64 = 10_000;
const MANY_KEYS: u64 = 1_000_000;
const MANY_DESCRIPTORS: u32 = 10;
/// Busy CPUs outside the measured processes above which a run is flagged.
const DISTURBED_CORES: f64 = 0.25;

fn plan(all_stores: &[SpawnKind], levels: &[u32]) -> Vec<Plan> {
    // Null first, so the others find their reference already measured.
    let mut stores: Vec<SpawnKind> = Vec::new();
    for kind in [
        SpawnKind::Null,
        SpawnKind::Memory,
        SpawnKind::Redis,
        SpawnKind::RedisCluster,
    ] {
        if all_stores.contains(&kind) {
            stores.push(kind);
        }
    }
    let top = levels.iter().copied().max().unwrap_or(64);
    let mut runs = Vec::new();
    for &concurrency in levels {
        for &kind in &stores {
            runs.push(Plan {
                group: "sweep",
                kind,
                concurrency,
                keys: BASE_KEYS,
                descriptors: 1,
            });
        }
    }
    for &kind in &stores {
        runs.push(Plan {
            group: "descriptors",
            kind,
            concurrency: top,
            keys: BASE_KEYS,
            descriptors: MANY_DESCRIPTORS,
        });
    }
    let cardinality_stores = [SpawnKind::Memory, SpawnKind::Redis];
    for &kind in stores.iter().filter(|k| cardinality_stores.contains(k)) {
        for keys in [1, MANY_KEYS] {
            runs.push(Plan {
                group: "keys",
                kind,
                concurrency: top,
                keys,
                descriptors: 1,
            });
        }
    }
    runs
}

pub(crate) async fn main(args: Box<MatrixArgs>) -> Result<()> {
    run_matrix(*args).await
}

async fn run_matrix(mut args: MatrixArgs) -> Result<()> {
    if args.stores.is_empty() || args.levels.is_empty() {
        bail!("--stores and --levels need at least one value each");
    }
    args.levels.sort_unstable();
    args.levels.dedup();
    // Read before the result files are opened: they are tracked, and would mark the tree dirty.
    if args.revision.is_none() {
        args.revision = Some(git_revision());
    }
    let duration = args
        .duration
        .unwrap_or(Duration::from_secs(if args.quick { 2 } else { 10 }));
    let warmup = args
        .warmup
        .unwrap_or(Duration::from_secs(if args.quick { 1 } else { 2 }));
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| if args.quick { "quick" } else { "latest" }.to_string());
    if name.is_empty() || name.contains('/') {
        bail!("--name must be a plain file name");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let jsonl_path = args.out.join(format!("{name}.jsonl"));
    let md_path = args.out.join(format!("{name}.md"));
    let mut jsonl = std::fs::File::create(&jsonl_path)
        .with_context(|| format!("cannot write {}", jsonl_path.display()))?;

    let runs = plan(&args.stores, &args.levels);
    let rounds = args.repeat.unwrap_or(if args.quick { 1 } else { 3 });
    let started = std::time::SystemTime::now();
    eprintln!(
        "sluice-bench matrix: {} runs × {rounds} round(s) of {:.0} s (+{:.0} s warm-up) → {}",
        runs.len(),
        duration.as_secs_f64(),
        warmup.as_secs_f64(),
        jsonl_path.display()
    );
    // Rounds are interleaved (every run once, then again), so slow drift of the machine
    // touches every configuration alike; each configuration then reports its median round.
    let mut measured: Vec<Vec<Measured>> = vec![Vec::new(); runs.len()];
    let mut failures: Vec<(Plan, String)> = Vec::new();
    for round in 1..=rounds {
        for (i, run) in runs.iter().enumerate() {
            if failures.iter().any(|(p, _)| p.same_config(run)) {
                continue;
            }
            eprint!(
                "[round {round}/{rounds}, {}/{}] {} c={} D={} K={} … ",
                i + 1,
                runs.len(),
                Kind::from(run.kind).label(),
                run.concurrency,
                run.descriptors,
                run.keys
            );
            match best_of(run, duration, warmup, &args).await {
                Ok((result, attempts)) => {
                    eprintln!(
                        "{:.0} req/s, p99 {} µs, {} errors",
                        result.rps, result.latency.p99, result.errors
                    );
                    measured[i].push(Measured {
                        result,
                        round,
                        attempts,
                    });
                }
                Err(error) => {
                    eprintln!("FAILED: {error:#}");
                    failures.push((run.clone(), format!("{error:#}")));
                }
            }
        }
    }

    // The median round of each configuration (by req/s), then the ratios between medians.
    let mut results: Vec<(Plan, RunResult)> = Vec::new();
    let mut spreads: Vec<(f64, f64)> = Vec::new();
    for (run, rounds) in runs.iter().zip(&measured) {
        if let Some(median) = median_by_rps(rounds) {
            let lo = rounds
                .iter()
                .map(|m| m.result.rps)
                .fold(f64::INFINITY, f64::min);
            let hi = rounds.iter().map(|m| m.result.rps).fold(0.0, f64::max);
            results.push((run.clone(), rounds[median].result.clone()));
            spreads.push((lo, hi));
        }
    }
    let nulls = results.clone();
    let ratios = |run: &Plan, result: &mut RunResult| {
        if let Some(null) = null_reference(&nulls, run) {
            result.rps_vs_null = (null.rps > 0.0).then(|| result.rps / null.rps);
            result.cpu_vs_null = match (result.server_cpu_us_per_req, null.server_cpu_us_per_req) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
        }
    };
    for (run, result) in &mut results {
        ratios(run, result);
    }
    for (run, rounds) in runs.iter().zip(&measured) {
        let median = median_by_rps(rounds);
        for (k, m) in rounds.iter().enumerate() {
            let mut result = m.result.clone();
            ratios(run, &mut result);
            let mut line = result.to_json();
            line["group"] = run.group.into();
            line["round"] = m.round.into();
            line["attempts"] = m.attempts.into();
            line["selected"] = (Some(k) == median).into();
            writeln!(jsonl, "{line}")
                .with_context(|| format!("cannot write {}", jsonl_path.display()))?;
        }
    }

    let markdown = markdown(
        &results, &spreads, &failures, &args, rounds, duration, warmup, started,
    );
    std::fs::write(&md_path, &markdown)
        .with_context(|| format!("cannot write {}", md_path.display()))?;
    println!("{markdown}");
    eprintln!("wrote {} and {}", jsonl_path.display(), md_path.display());
    if !failures.is_empty() {
        bail!("{} of {} configurations failed", failures.len(), runs.len());
    }
    Ok(())
}

/// One round of one configuration.
#[derive(Clone)]
struct Measured {
    result: RunResult,
    round: u32,
    attempts: u32,
}

/// Index of the median round by req/s (the lower middle one of an even count).
fn median_by_rps(rounds: &[Measured]) -> Option<usize> {
    let mut order: Vec<usize> = (0..rounds.len()).collect();
    order.sort_by(|&a, &b| rounds[a].result.rps.total_cmp(&rounds[b].result.rps));
    order.get(rounds.len().saturating_sub(1) / 2).copied()
}

/// Runs `run` after waiting for a quiet machine; a run disturbed by other work (more than
/// [`DISTURBED_CORES`] busy outside the measured processes) is repeated up to `--retries` times,
/// and the least disturbed attempt is kept. Returns it with the number of attempts.
async fn best_of(
    run: &Plan,
    duration: Duration,
    warmup: Duration,
    args: &MatrixArgs,
) -> Result<(RunResult, u32)> {
    let mut best: Option<RunResult> = None;
    let mut attempts = 0;
    while attempts <= args.retries {
        attempts += 1;
        wait_quiet(args.quiet_wait, args.quiet_cores).await;
        let result = one_run(run, duration, warmup, &args.common).await?;
        let other = result.other_busy_cores.unwrap_or(0.0);
        if best
            .as_ref()
            .is_none_or(|b| other < b.other_busy_cores.unwrap_or(0.0))
        {
            best = Some(result);
        }
        if other <= DISTURBED_CORES {
            break;
        }
        if attempts <= args.retries {
            eprint!("(disturbed: {other:.2} other busy cores; again) ");
        }
    }
    best.map(|b| (b, attempts)).context("no attempt was made")
}

/// Waits up to `limit` until at most `cores` CPUs have been busy for 3 s in a row.
async fn wait_quiet(limit: Duration, cores: f64) {
    if limit.is_zero() {
        return;
    }
    let deadline = tokio::time::Instant::now() + limit;
    let mut announced = false;
    let mut quiet_seconds = 0;
    while let Some(busy) = probe::machine_busy_cores(Duration::from_secs(1)).await {
        if busy <= cores {
            quiet_seconds += 1;
            if quiet_seconds >= 3 {
                return;
            }
            continue;
        }
        quiet_seconds = 0;
        if tokio::time::Instant::now() >= deadline {
            eprint!("(still {busy:.1} busy cores, running anyway) ");
            return;
        }
        if !announced {
            eprint!("(waiting for the machine to go quiet: {busy:.1} busy cores) ");
            announced = true;
        }
    }
}

async fn one_run(
    run: &Plan,
    duration: Duration,
    warmup: Duration,
    common: &CommonArgs,
) -> Result<RunResult> {
    let options = common.spawn_options(run.descriptors)?;
    let kind = Kind::from(run.kind);
    let mut deployment = procs::start_async(kind, options).await?;
    let spec = LoadSpec {
        concurrency: run.concurrency,
        connections: common.connections.min(run.concurrency),
        keys: run.keys,
        descriptors: run.descriptors,
        hits_addend: common.hits_addend,
        warmup,
        duration,
        seed: common.seed,
        per_second: false,
        rate: None,
    };
    let result = report::measure(kind.label(), &deployment.endpoint(), &spec, common).await;
    deployment.check_alive()?;
    let result = result?;
    drop(deployment);
    // Let the stopped processes' sockets and memory go before the next run starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(result)
}

/// The null run at the same concurrency and descriptor count, else at the same concurrency.
fn null_reference<'a>(results: &'a [(Plan, RunResult)], run: &Plan) -> Option<&'a RunResult> {
    let nulls = || {
        results
            .iter()
            .filter(|(p, _)| p.kind == SpawnKind::Null && p.concurrency == run.concurrency)
    };
    nulls()
        .find(|(p, _)| p.descriptors == run.descriptors)
        .or_else(|| nulls().find(|(p, _)| p.descriptors == 1))
        .map(|(_, r)| r)
}

fn find(
    results: &[(Plan, RunResult)],
    kind: SpawnKind,
    concurrency: u32,
    keys: u64,
    descriptors: u32,
) -> Option<&RunResult> {
    results
        .iter()
        .find(|(p, _)| {
            p.kind == kind
                && p.concurrency == concurrency
                && p.keys == keys
                && p.descriptors == descriptors
        })
        .map(|(_, r)| r)
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    results: &[(Plan, RunResult)],
    spreads: &[(f64, f64)],
    failures: &[(Plan, String)],
    args: &MatrixArgs,
    rounds: u32,
    duration: Duration,
    warmup: Duration,
    started: std::time::SystemTime,
) -> String {
    let mut md = String::new();
    let stamp = started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| utc_timestamp(d.as_secs()))
        .unwrap_or_default();
    let _ = writeln!(md, "# Sluice benchmark results\n");
    let _ = writeln!(
        md,
        "Generated by `sluice-bench matrix{}` at {stamp}, revision {}, on {}. Each run: {:.0} s \
         measured after {:.0} s warm-up against a freshly started server (and Redis), {} HTTP/2 \
         connection(s) (at most one per in-flight request), {} generator thread(s), hits_addend \
         {}, limits of {} per hour (so answers are OK). The whole matrix ran {rounds} time(s), \
         interleaved; each row is the median round by req/s, and \"range\" spans all rounds. A \
         round disturbed by other work on the machine was repeated up to {} times. Latency in \
         µs. CPU per request is the CPU time over the measured interval divided by the requests \
         answered in it.\n",
        if args.quick { " --quick" } else { "" },
        args.revision.clone().unwrap_or_else(git_revision),
        crate::probe::machine_description(),
        duration.as_secs_f64(),
        warmup.as_secs_f64(),
        args.common.connections,
        args.common.threads,
        args.common.hits_addend,
        args.common.limit,
        args.retries,
    );
    let _ = writeln!(md, "## Runs\n");
    let _ = writeln!(
        md,
        "| store | conc | D | K | req/s | range | × null | p50 | p90 | p99 | p99.9 | max | errors | \
         OVER_LIMIT | server CPU µs/req | × null CPU | Redis scripts/req | Redis CPU µs/req | \
         Redis µs/script call | scripts/Redis read | generator CPU µs/req | other busy cores |"
    );
    let _ = writeln!(
        md,
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    let f = |x: Option<f64>, digits: usize| match x {
        Some(x) => format!("{x:.digits$}"),
        None => "–".to_string(),
    };
    let mut disturbed = false;
    for ((plan, r), (lo, hi)) in results.iter().zip(spreads) {
        let l = &r.latency;
        let busy = r.other_busy_cores.is_some_and(|c| c > DISTURBED_CORES);
        disturbed |= busy;
        let _ = writeln!(
            md,
            "| {}{} | {} | {} | {} | {:.0} | {:.0}–{:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} \
             | {} | {} | {} | {} | {} |",
            r.store,
            if busy { " ⚠" } else { "" },
            plan.concurrency,
            plan.descriptors,
            plan.keys,
            r.rps,
            lo,
            hi,
            f(r.rps_vs_null, 2),
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            r.errors,
            r.over_limit,
            f(r.server_cpu_us_per_req, 1),
            f(r.cpu_vs_null, 2),
            f(r.redis.and_then(|x| x.script_calls_per_req), 3),
            f(r.redis.and_then(|x| x.cpu_us_per_req), 1),
            f(r.redis.and_then(|x| x.script_usec_per_call), 2),
            f(r.redis.and_then(|x| x.script_calls_per_read), 1),
            f(r.generator_cpu_us_per_req, 1),
            f(r.other_busy_cores, 2),
        );
    }
    for (plan, error) in failures {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | FAILED: {} |",
            Kind::from(plan.kind).label(),
            plan.concurrency,
            plan.descriptors,
            plan.keys,
            error.lines().next().unwrap_or("").replace('|', "/")
        );
    }
    md.push('\n');
    if disturbed {
        let _ = writeln!(
            md,
            "⚠: more than {DISTURBED_CORES} CPU was busy outside the server, its Redis and the \
             generator during this run (other work on the machine); its figures are suspect.\n"
        );
    }
    let _ = writeln!(
        md,
        "\"Redis scripts/req\" counts EVAL/EVALSHA calls in Redis's INFO commandstats per \
         answered request; the JSON lines also have `commands_per_req`, which includes the \
         commands a script runs inside Redis.\n"
    );
    md.push_str(&targets(results, &args.levels));
    md
}

/// The targets of `docs/BENCHMARKS.md`, measured against this matrix (reported, not asserted).
fn targets(results: &[(Plan, RunResult)], levels: &[u32]) -> String {
    use SpawnKind::{Memory, Null, Redis, RedisCluster};
    let top = levels.iter().copied().max().unwrap_or(64);
    let mid = if levels.contains(&16) { 16 } else { top };
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut row = |what: String, measured: String, goal: &str, verdict: String| {
        rows.push([what, measured, goal.to_string(), verdict]);
    };
    let missing = || ("not measured".to_string(), "–".to_string());

    for (kind, goal) in [(Memory, 0.90), (Redis, 0.75)] {
        let name = if kind == Memory {
            "memory store"
        } else {
            "redis (standalone)"
        };
        let (m, v) = match find(results, kind, top, BASE_KEYS, 1).and_then(|r| r.rps_vs_null) {
            Some(x) => (format!("{x:.2}× null"), at_least(x, goal)),
            None => missing(),
        };
        row(
            format!("{name}, K=10 000, {top} concurrent: req/s vs null"),
            m,
            &format!("≥ {goal:.2}×"),
            v,
        );
    }
    for kind in [Memory, Redis] {
        let (m, v) = match find(results, kind, top, BASE_KEYS, 1) {
            Some(r) => match (r.cpu_vs_null, r.server_cpu_us_per_req) {
                (Some(x), Some(us)) => {
                    let null_us = find(results, Null, top, BASE_KEYS, 1)
                        .and_then(|n| n.server_cpu_us_per_req)
                        .unwrap_or(f64::NAN);
                    (
                        format!("{x:.2}× ({us:.1} vs {null_us:.1} µs)"),
                        at_most(x, 1.5),
                    )
                }
                _ => missing(),
            },
            None => missing(),
        };
        row(
            format!(
                "server CPU per decision vs null's per request ({}, {top} concurrent; Sluice \
                 process only)",
                Kind::from(kind).label()
            ),
            m,
            "≤ 1.50×",
            v,
        );
    }
    // One store call per request: on Redis 7 a decision of D fixed-window descriptors is 2 × D
    // plain commands (INCRBY, PEXPIRE NX) and no script; before Redis 7 one script call.
    for descriptors in [1, MANY_DESCRIPTORS] {
        let runs: Vec<(f64, f64)> = results
            .iter()
            .filter(|(p, _)| p.kind == Redis && p.descriptors == descriptors)
            .filter_map(|(_, r)| {
                let redis = r.redis?;
                Some((redis.script_calls_per_req?, redis.commands_per_req?))
            })
            .collect();
        let (m, v) = if runs.is_empty() {
            missing()
        } else {
            let plain = 2.0 * f64::from(descriptors);
            let fits = |&(scripts, commands): &(f64, f64)| {
                (scripts - 1.0).abs() <= 0.01
                    || (scripts == 0.0 && (commands - plain).abs() <= 0.01 * plain)
            };
            let (scripts, commands) = runs[0];
            (
                format!(
                    "{scripts:.3} script calls, {commands:.3} commands (first of {} runs)",
                    runs.len()
                ),
                if runs.iter().all(fits) {
                    "met (within the ±1% the snapshot timing allows)".to_string()
                } else {
                    format!(
                        "missed in {} of {} runs",
                        runs.iter().filter(|r| !fits(r)).count(),
                        runs.len()
                    )
                },
            )
        };
        row(
            format!("Redis work per {descriptors}-descriptor request"),
            m,
            "1 script call, or 2 commands per descriptor on Redis 7",
            v,
        );
    }
    for (kind, goal_ms) in [(Memory, 1.0), (Redis, 1.5)] {
        let (m, v) = match find(results, kind, mid, BASE_KEYS, 1) {
            Some(r) => {
                let ms = r.latency.p99 as f64 / 1000.0;
                (format!("{ms:.3} ms"), at_most(ms, goal_ms))
            }
            None => missing(),
        };
        row(
            format!("p99 at {mid} concurrent, {}", Kind::from(kind).label()),
            m,
            &format!("≤ {goal_ms:.1} ms"),
            v,
        );
    }
    for kind in [Memory, Redis] {
        let (m, v) = rps_ratio(
            find(results, kind, top, BASE_KEYS, MANY_DESCRIPTORS),
            find(results, kind, top, BASE_KEYS, 1),
            0.5,
        );
        row(
            format!(
                "{MANY_DESCRIPTORS} descriptors vs 1, {}, {top} concurrent: req/s",
                Kind::from(kind).label()
            ),
            m,
            "≥ 0.50×",
            v,
        );
    }
    for kind in [Memory, Redis] {
        let (m, v) = match (
            find(results, kind, top, 1, 1),
            find(results, kind, top, MANY_KEYS, 1),
        ) {
            (Some(hot), Some(many)) if hot.rps > 0.0 && many.rps > 0.0 => {
                let gap = 1.0 - hot.rps.min(many.rps) / hot.rps.max(many.rps);
                let verdict = if gap <= 0.15 {
                    "met".to_string()
                } else {
                    format!("missed: {:.0}% apart", gap * 100.0)
                };
                (
                    format!(
                        "{:.0} vs {:.0} req/s ({:.1}% apart)",
                        hot.rps,
                        many.rps,
                        gap * 100.0
                    ),
                    verdict,
                )
            }
            _ => missing(),
        };
        row(
            format!(
                "hot key (K=1) vs K=1 000 000, {}, {top} concurrent",
                Kind::from(kind).label()
            ),
            m,
            "within 15%",
            v,
        );
    }
    for descriptors in [1, MANY_DESCRIPTORS] {
        let (m, v) = rps_ratio(
            find(results, RedisCluster, top, BASE_KEYS, descriptors),
            find(results, Redis, top, BASE_KEYS, descriptors),
            0.8,
        );
        row(
            format!(
                "Redis Cluster (3 masters) vs standalone, D={descriptors}, {top} concurrent: req/s"
            ),
            m,
            "≥ 0.80×",
            v,
        );
    }

    let mut md = String::from(
        "## Targets\n\nReported, not asserted. \"× null\" compares with the null server at the \
         same concurrency and descriptor count, measured in the same invocation.\n\n| target | measured | goal | result \
         |\n|---|---|---|---|\n",
    );
    for [what, measured, goal, verdict] in rows {
        let _ = writeln!(md, "| {what} | {measured} | {goal} | {verdict} |");
    }
    md
}

/// "measured" and "result" cells for a goal of `a`'s req/s being at least `goal` × `b`'s.
fn rps_ratio(a: Option<&RunResult>, b: Option<&RunResult>, goal: f64) -> (String, String) {
    match (a, b) {
        (Some(a), Some(b)) if b.rps > 0.0 => {
            let x = a.rps / b.rps;
            (
                format!("{x:.2}× ({:.0} vs {:.0} req/s)", a.rps, b.rps),
                at_least(x, goal),
            )
        }
        _ => ("not measured".to_string(), "–".to_string()),
    }
}

fn at_least(measured: f64, goal: f64) -> String {
    if measured >= goal {
        "met".into()
    } else {
        format!("missed: {:.0}% below", (1.0 - measured / goal) * 100.0)
    }
}

fn at_most(measured: f64, goal: f64) -> String {
    if measured <= goal {
        "met".into()
    } else {
        format!("missed: {:.0}% above", (measured / goal - 1.0) * 100.0)
    }
}

/// `abc1234`, or `abc1234+uncommitted changes` when tracked files differ from it.
fn git_revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) if !head.trim().is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.trim().is_empty());
            format!(
                "{}{}",
                head.trim(),
                if dirty { "+uncommitted changes" } else { "" }
            )
        }
        _ => "unknown".into(),
    }
}

/// `2024-05-01 12:34 UTC` from Unix seconds (proleptic Gregorian calendar).
fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days: shift the epoch to 0000-03-01 so leap days fall at the end of a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_timestamp(1_700_000_000), "2023-11-14 22:13 UTC");
    }

    #[test]
    fn plan_puts_null_first_and_covers_the_matrix() {
        let runs = plan(
            &[
                SpawnKind::Memory,
                SpawnKind::Redis,
                SpawnKind::Null,
                SpawnKind::RedisCluster,
            ],
            &[1, 4, 16, 64],
        );
        // Sweep 4 × 4, descriptors 4, cardinality 2 × 2 (memory and standalone redis).
        assert_eq!(runs.len(), 16 + 4 + 4);
        assert_eq!(runs[0].kind, SpawnKind::Null);
        assert!(
            runs.iter()
                .any(|r| r.keys == 1 && r.kind == SpawnKind::Redis)
        );
    }
}
