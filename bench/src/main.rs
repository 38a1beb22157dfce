//! `sluice-bench`: a closed-loop gRPC load generator for Sluice's `ShouldRateLimit`.
//!
//! This file owns the command line and the dispatch to the three modes:
//!
//! - one run (no subcommand): against `--target ADDR`, or a server it starts with
//!   `--spawn memory|redis|null`;
//! - `matrix`: the fixed set of runs behind `docs/BENCHMARKS.md` (see `matrix.rs`);
//! - `null-server`: a do-nothing RLS server used as the baseline (see `null_server.rs`);
//! - `redis-cost`: what a decision costs Redis, driving the Redis store directly (see
//!   `redis_cost.rs`).
//!
//! The other modules: `load.rs` drives the requests and measures latency, `probe.rs` reads CPU
//! and Redis counters, `procs.rs` starts and stops the processes, `report.rs` turns one run's
//! measurements into figures, JSON and text.

#![warn(unreachable_pub)]

/// The same allocator as the `sluice` binary (src/main.rs), so the null server and the load
/// generator are measured like the service.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod load;
mod matrix;
mod null_server;
mod probe;
mod procs;
mod redis_cost;
mod report;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::procs::{Kind, SpawnOptions};

#[derive(Parser, Debug)]
#[command(
    name = "sluice-bench",
    version,
    about = "Closed-loop gRPC load generator for Sluice (envoy.service.ratelimit.v3 ShouldRateLimit)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the benchmark matrix (null, memory, redis; several concurrencies, descriptor counts and
    /// key cardinalities) and write JSON lines and a Markdown table under --out.
    Matrix(Box<matrix::MatrixArgs>),
    /// Measure what a decision costs Redis (script time per call, Redis CPU, batch depth) by
    /// driving the Redis store directly, for several workloads and concurrency levels.
    RedisCost(redis_cost::RedisCostArgs),
    /// Serve a null rate limit service that answers OK at once (the baseline of every ratio).
    NullServer(null_server::NullArgs),
}

/// The server under test.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpawnKind {
    /// `sluice serve` on the embedded memory store.
    Memory,
    /// `sluice serve` on a redis-server of its own (free port, no persistence).
    Redis,
    /// `sluice serve` on a Redis Cluster of its own: 3 masters, no replicas, on free ports.
    RedisCluster,
    /// `sluice-bench null-server`: answers OK without counting anything.
    Null,
}

impl From<SpawnKind> for Kind {
    fn from(kind: SpawnKind) -> Kind {
        match kind {
            SpawnKind::Memory => Kind::Memory,
            SpawnKind::Redis => Kind::Redis,
            SpawnKind::RedisCluster => Kind::RedisCluster,
            SpawnKind::Null => Kind::Null,
        }
    }
}

/// Options of one run.
#[derive(Args, Debug)]
struct RunArgs {
    /// gRPC address of an already running server (host:port or http://host:port); it must have a
    /// `bench` domain with key-only descriptors k0..k{D-1} (see --print-config).
    #[arg(long, value_name = "ADDR", conflicts_with = "spawn")]
    target: Option<String>,
    /// Start this server for the run and stop it afterwards.
    #[arg(long, value_enum, value_name = "STORE")]
    spawn: Option<SpawnKind>,
    /// With --target: PID of the server process, to measure its CPU time.
    #[arg(long, value_name = "PID", requires = "target")]
    server_pid: Option<u32>,
    /// With --target: the server's Redis (redis://host:port), to read INFO commandstats and cpu;
    /// repeat it for every master of a cluster (the figures are summed).
    #[arg(long, value_name = "URL", requires = "target")]
    redis_url: Vec<String>,
    /// Requests in flight (one closed-loop task each).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,
    /// Open loop instead: send this many requests per second on a fixed schedule, whatever the
    /// answers do (--concurrency is then unused). Latency runs from each request's scheduled
    /// time; sends more than 1 ms behind schedule are counted late.
    #[arg(long, value_name = "REQ_PER_S", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate: Option<u32>,
    /// Key cardinality: each descriptor value is drawn uniformly from this many values.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Descriptors per request (Sluice accepts at most 64 by default).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    descriptors: u32,
    /// Measured interval, in seconds.
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    duration: Duration,
    /// Load before the measured interval, in seconds (not measured).
    #[arg(long, default_value = "2", value_parser = parse_seconds_or_zero)]
    warmup: Duration,
    /// Print one JSON line instead of the text summary.
    #[arg(long)]
    json: bool,
    /// Also write one JSON line per second of the measured interval to this file (answered
    /// calls, errors and latency percentiles of that second), for soak runs.
    #[arg(long, value_name = "PATH")]
    per_second: Option<PathBuf>,
    /// Print the YAML config the bench generates (for --target servers) and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// Options shared by a single run and the matrix.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// HTTP/2 connections (tonic channels) the generator opens; never more than the concurrency.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
    /// Worker threads of the generator's async runtime.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,
    /// hits_addend of every request.
    #[arg(long, default_value_t = 1)]
    pub hits_addend: u32,
    /// requests_per_unit of every generated limit (unit: hour); high, so answers are OK.
    #[arg(long, default_value_t = 1_000_000_000)]
    pub limit: u32,
    /// Limits on each generated descriptor: more than 1 gives a `rate_limits` list (windows of
    /// 1, 2, … hours), decided together in one script call.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub limits_per_descriptor: u32,
    /// REDIS_POOL_SIZE of spawned Redis-backed servers.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub redis_pool_size: u32,
    /// REDIS_TIMEOUT of spawned Redis-backed servers (Go duration syntax).
    #[arg(long, default_value = "1s")]
    pub redis_timeout: String,
    /// Extra environment for spawned sluice servers, KEY=VALUE (repeatable).
    #[arg(long = "server-env", value_name = "KEY=VALUE", value_parser = parse_env_pair)]
    pub server_env: Vec<(String, String)>,
    /// The sluice binary [default: `sluice` next to this executable].
    #[arg(long, value_name = "PATH")]
    pub sluice_bin: Option<PathBuf>,
    /// The redis-server binary.
    #[arg(long, value_name = "PATH", default_value = "redis-server")]
    pub redis_server: PathBuf,
    /// Seed of the key generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl CommonArgs {
    /// Process options for `procs::start`, with the binaries resolved.
    pub fn spawn_options(&self, descriptors: u32) -> Result<SpawnOptions> {
        let bench_bin =
            std::env::current_exe().context("cannot find the sluice-bench executable")?;
        let sluice_bin = match &self.sluice_bin {
            Some(path) => path.clone(),
            None => bench_bin
                .parent()
                .map(|dir| dir.join("sluice"))
                .context("the sluice-bench executable has no directory")?,
        };
        Ok(SpawnOptions {
            sluice_bin,
            bench_bin,
            redis_server: self.redis_server.clone(),
            descriptors,
            limit: self.limit,
            limits_per_descriptor: self.limits_per_descriptor,
            redis_pool_size: self.redis_pool_size,
            redis_timeout: self.redis_timeout.clone(),
            server_env: self.server_env.clone(),
        })
    }
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    match parse_seconds_or_zero(text)? {
        d if d.is_zero() => Err("must be more than 0 seconds".into()),
        d => Ok(d),
    }
}

fn parse_seconds_or_zero(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("`{text}` is not between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_env_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

/// Parses `host:port` or `http://host:port` into a socket address (resolving host names).
fn parse_target(text: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let bare = text
        .strip_prefix("http://")
        .unwrap_or(text)
        .trim_end_matches('/');
    if bare.starts_with("https://") {
        bail!("--target {text}: TLS is not supported; use host:port or http://host:port");
    }
    bare.to_socket_addrs()
        .with_context(|| format!("--target {text}: expected host:port or http://host:port"))?
        .next()
        .with_context(|| format!("--target {text}: the name resolves to no address"))
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::NullServer(args)) => null_server::main(args),
        Some(Command::RedisCost(args)) => {
            runtime(2).and_then(|rt| rt.block_on(interruptible(redis_cost::main(args))))
        }
        Some(Command::Matrix(args)) => {
            let threads = args.common.threads;
            runtime(threads).and_then(|rt| rt.block_on(interruptible(matrix::main(args))))
        }
        None => {
            let threads = cli.run.common.threads;
            runtime(threads).and_then(|rt| rt.block_on(interruptible(run_main(cli.run))))
        }
    };
    if let Err(error) = result {
        eprintln!("sluice-bench: {error:#}");
        std::process::exit(1);
    }
}

fn runtime(threads: u32) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads as usize)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Runs `work` until it ends, Ctrl-C or SIGTERM; dropping it stops every process it started.
async fn interruptible(work: impl Future<Output = Result<()>>) -> Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install a SIGTERM handler")?;
    tokio::select! {
        result = work => result,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        _ = terminate.recv() => bail!("terminated"),
    }
}

async fn run_main(args: RunArgs) -> Result<()> {
    if args.print_config {
        print!(
            "{}",
            procs::config_yaml(
                args.descriptors,
                args.common.limit,
                args.common.limits_per_descriptor
            )
        );
        return Ok(());
    }
    let spec = load::LoadSpec {
        concurrency: args.concurrency,
        // The open loop has no fixed number of callers to cap the connections at.
        connections: match args.rate {
            Some(_) => args.common.connections,
            None => args.common.connections.min(args.concurrency),
        },
        keys: args.keys,
        descriptors: args.descriptors,
        hits_addend: args.common.hits_addend,
        warmup: args.warmup,
        duration: args.duration,
        seed: args.common.seed,
        per_second: args.per_second.is_some(),
        rate: args.rate,
    };
    let result = match (&args.target, args.spawn) {
        (Some(target), _) => {
            let endpoint = procs::Endpoint {
                grpc: parse_target(target)?,
                server_pid: args.server_pid,
                redis_urls: args.redis_url.clone(),
            };
            report::measure("target", &endpoint, &spec, &args.common).await?
        }
        (None, Some(kind)) => {
            let options = args.common.spawn_options(args.descriptors)?;
            let mut deployment = procs::start_async(kind.into(), options).await?;
            let result = report::measure(
                kind.into_label(),
                &deployment.endpoint(),
                &spec,
                &args.common,
            )
            .await;
            deployment.check_alive()?;
            result?
        }
        (None, None) => bail!("give --target ADDR or --spawn memory|redis|null (see --help)"),
    };
    if let Some(path) = &args.per_second {
        std::fs::write(path, result.per_second_json_lines())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", result.to_json());
    } else {
        print!("{}", result.to_text());
    }
    Ok(())
}

impl SpawnKind {
    fn into_label(self) -> &'static str {
        Kind::from(self).label()
    }
}
