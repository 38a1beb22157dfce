//! One run's figures: [`measure`] runs the load against an endpoint and turns the counters into a
//! [`RunResult`], which prints as text or as one JSON line (the format `scripts/plot_bench.py`
//! and the matrix read).
//!
//! Per-request CPU figures divide the CPU time between the two snapshots by the requests
//! answered in that time (rps × snapshot interval).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use serde_json::{Value, json};

use crate::CommonArgs;
use crate::load::{self, LoadSpec};
use crate::probe::{self, Sampler};
use crate::procs::Endpoint;

/// Everything one run measured.
#[derive(Clone, Debug)]
pub(crate) struct RunResult {
    /// `null`, `memory`, `redis` or `target`.
    pub store: String,
    pub concurrency: u32,
    /// Open loop: the requests per second offered (`None`: closed loop).
    pub rate: Option<u32>,
    /// Open loop: sends scheduled in the interval, more than 1 ms late, skipped.
    pub scheduled: u64,
    pub late: u64,
    pub missed: u64,
    pub connections: u32,
    pub threads: u32,
    pub keys: u64,
    pub descriptors: u32,
    pub hits_addend: u32,
    pub limit: u32,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub ok: u64,
    pub over_limit: u64,
    pub unknown: u64,
    pub errors: u64,
    pub errors_by_code: BTreeMap<String, u64>,
    pub error_sample: Option<String>,
    /// Answered requests (any overall code) per second of the measured interval.
    pub rps: f64,
    pub latency: Latency,
    pub server_cpu_s: Option<f64>,
    pub server_cpu_us_per_req: Option<f64>,
    pub generator_cpu_us_per_req: Option<f64>,
    /// Busy CPUs of the whole machine during the interval (2.0 = both cores busy).
    pub machine_busy_cores: Option<f64>,
    /// Busy CPUs not accounted for by the server, its Redis, the generator, or interrupts.
    pub other_busy_cores: Option<f64>,
    pub redis: Option<RedisFigures>,
    pub loadavg_1m_before: Option<f64>,
    pub clk_tck: f64,
    pub unix_time: u64,
    /// Filled in by the matrix: rps / the null server's rps at the same concurrency.
    pub rps_vs_null: Option<f64>,
    /// Filled in by the matrix: server CPU per request / the null server's.
    pub cpu_vs_null: Option<f64>,
    /// Each second of the interval, when the spec asked for them.
    pub seconds: Vec<load::SecondFigures>,
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct RedisFigures {
    pub script_calls: u64,
    pub script_calls_per_req: Option<f64>,
    /// All commands but INFO, per request.
    pub commands_per_req: Option<f64>,
    pub cpu_s: f64,
    pub cpu_us_per_req: Option<f64>,
    /// Script calls per read Redis made from a client socket: how deep the pipelines that
    /// reached Redis were.
    pub script_calls_per_read: Option<f64>,
    /// Redis's own time per script call (commandstats `usec` ÷ `calls`), in µs.
    pub script_usec_per_call: Option<f64>,
}

/// Runs `spec` against `endpoint` and collects the figures.
pub(crate) async fn measure(
    store: &str,
    endpoint: &Endpoint,
    spec: &LoadSpec,
    common: &CommonArgs,
) -> Result<RunResult> {
    let loadavg = probe::loadavg_1m();
    let mut sampler = Sampler::new(endpoint.server_pid, &endpoint.redis_urls).await?;
    let outcome = load::run(endpoint.grpc, spec, &mut sampler).await?;

    let (a, b) = (&outcome.start, &outcome.end);
    let interval = (b.at - a.at).as_secs_f64().max(1e-9);
    let duration = spec.duration.as_secs_f64();
    let answered = outcome.answered();
    let rps = answered as f64 / duration;
    // Requests answered between the two snapshots (as near as the interval allows).
    let requests = rps * interval;
    let per_req = |seconds: f64| (requests > 0.0).then(|| seconds * 1e6 / requests);
    let delta = |x: Option<f64>, y: Option<f64>| Some(y? - x?);

    let server_cpu_s = delta(a.server_cpu, b.server_cpu);
    let generator_cpu_s = delta(a.generator_cpu, b.generator_cpu);
    let machine_busy_s = match (a.machine, b.machine) {
        (Some(x), Some(y)) => Some(y.busy - x.busy),
        _ => None,
    };
    let machine_irq_s = match (a.machine, b.machine) {
        (Some(x), Some(y)) => Some(y.irq - x.irq),
        _ => None,
    };
    let redis = match (a.redis, b.redis) {
        (Some(x), Some(y)) => {
            let script_calls = y.script_calls.saturating_sub(x.script_calls);
            let commands = y.commands.saturating_sub(x.commands);
            let cpu_s = y.cpu - x.cpu;
            let reads = y.reads.saturating_sub(x.reads);
            let script_usec = y.script_usec.saturating_sub(x.script_usec);
            Some(RedisFigures {
                script_calls_per_read: (reads > 0).then(|| script_calls as f64 / reads as f64),
                script_usec_per_call: (script_calls > 0)
                    .then(|| script_usec as f64 / script_calls as f64),
                script_calls,
                script_calls_per_req: (requests > 0.0).then(|| script_calls as f64 / requests),
                commands_per_req: (requests > 0.0).then(|| commands as f64 / requests),
                cpu_s,
                cpu_us_per_req: per_req(cpu_s),
            })
        }
        _ => None,
    };
    let accounted = server_cpu_s.unwrap_or(0.0)
        + generator_cpu_s.unwrap_or(0.0)
        + redis.map(|r| r.cpu_s).unwrap_or(0.0);
    let h = &outcome.latency;
    let latency = if h.is_empty() {
        Latency::default()
    } else {
        Latency {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    };
    Ok(RunResult {
        store: store.to_string(),
        concurrency: spec.concurrency,
        rate: spec.rate,
        scheduled: outcome.scheduled,
        late: outcome.late,
        missed: outcome.missed,
        connections: spec.connections,
        threads: common.threads,
        keys: spec.keys,
        descriptors: spec.descriptors,
        hits_addend: spec.hits_addend,
        limit: common.limit,
        duration_s: duration,
        warmup_s: spec.warmup.as_secs_f64(),
        ok: outcome.ok,
        over_limit: outcome.over_limit,
        unknown: outcome.unknown,
        errors: outcome.error_count(),
        errors_by_code: outcome.errors.clone(),
        error_sample: outcome.error_sample.clone(),
        rps,
        latency,
        server_cpu_s,
        server_cpu_us_per_req: server_cpu_s.and_then(per_req),
        generator_cpu_us_per_req: generator_cpu_s.and_then(per_req),
        machine_busy_cores: machine_busy_s.map(|s| s / interval),
        other_busy_cores: machine_busy_s
            .map(|s| ((s - machine_irq_s.unwrap_or(0.0) - accounted) / interval).max(0.0)),
        redis,
        loadavg_1m_before: loadavg,
        clk_tck: probe::clk_tck(),
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        rps_vs_null: None,
        cpu_vs_null: None,
        seconds: outcome.seconds,
    })
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

fn round_opt(x: Option<f64>, digits: i32) -> Option<f64> {
    x.map(|x| round(x, digits))
}

impl RunResult {
    /// One JSON line per measured second, stamped with the unix second it ended in.
    pub(crate) fn per_second_json_lines(&self) -> String {
        let started = self
            .unix_time
            .saturating_sub(self.duration_s.round() as u64);
        let mut out = String::new();
        for s in &self.seconds {
            let line = json!({
                "unix_time": started + s.second + 1,
                "second": s.second,
                "answered": s.answered,
                "errors": s.errors,
                "latency_us": {"p50": s.p50, "p99": s.p99, "p999": s.p999, "max": s.max},
            });
            let _ = writeln!(out, "{line}");
        }
        out
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "store": self.store,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "open_loop": self.rate.map(|_| json!({
                "scheduled": self.scheduled,
                "late": self.late,
                "missed": self.missed,
            })),
            "connections": self.connections,
            "threads": self.threads,
            "keys": self.keys,
            "descriptors": self.descriptors,
            "hits_addend": self.hits_addend,
            "limit": self.limit,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "rps": round(self.rps, 1),
            "ok": self.ok,
            "over_limit": self.over_limit,
            "unknown": self.unknown,
            "errors": self.errors,
            "errors_by_code": self.errors_by_code,
            "error_sample": self.error_sample,
            "latency_us": {
                "p50": self.latency.p50,
                "p90": self.latency.p90,
                "p99": self.latency.p99,
                "p99_9": self.latency.p999,
                "max": self.latency.max,
                "mean": round(self.latency.mean, 1),
            },
            "server_cpu_s": round_opt(self.server_cpu_s, 3),
            "server_cpu_us_per_req": round_opt(self.server_cpu_us_per_req, 2),
            "generator_cpu_us_per_req": round_opt(self.generator_cpu_us_per_req, 2),
            "machine_busy_cores": round_opt(self.machine_busy_cores, 3),
            "other_busy_cores": round_opt(self.other_busy_cores, 3),
            "redis": self.redis.map(|r| json!({
                "script_calls": r.script_calls,
                "script_calls_per_req": round_opt(r.script_calls_per_req, 4),
                "commands_per_req": round_opt(r.commands_per_req, 4),
                "cpu_s": round(r.cpu_s, 3),
                "cpu_us_per_req": round_opt(r.cpu_us_per_req, 2),
                "script_calls_per_read": round_opt(r.script_calls_per_read, 2),
                "script_usec_per_call": round_opt(r.script_usec_per_call, 2),
            })),
            "rps_vs_null": round_opt(self.rps_vs_null, 3),
            "cpu_vs_null": round_opt(self.cpu_vs_null, 3),
            "loadavg_1m_before": self.loadavg_1m_before,
            "clk_tck": self.clk_tck,
            "unix_time": self.unix_time,
        })
    }

    pub(crate) fn to_text(&self) -> String {
        let opt = |x: Option<f64>, digits: usize| match x {
            Some(x) => format!("{x:.digits$}"),
            None => "n/a".into(),
        };
        let mut s = String::new();
        let load = match self.rate {
            Some(rate) => format!("open loop at {rate} requests/s"),
            None => format!("concurrency {}", self.concurrency),
        };
        let _ = writeln!(
            s,
            "{} store: {load}, {} connection(s), {} generator thread(s), keys {}, \
             {} descriptor(s), hits_addend {}, {:.1} s (+{:.1} s warm-up)",
            self.store,
            self.connections,
            self.threads,
            self.keys,
            self.descriptors,
            self.hits_addend,
            self.duration_s,
            self.warmup_s
        );
        let _ = writeln!(
            s,
            "  throughput   {:.0} requests/s ({} OK, {} OVER_LIMIT, {} UNKNOWN, {} errors)",
            self.rps, self.ok, self.over_limit, self.unknown, self.errors
        );
        if self.rate.is_some() {
            let _ = writeln!(
                s,
                "  schedule     {} sends scheduled, {} more than 1 ms late, {} skipped (too many \
                 in flight)",
                self.scheduled, self.late, self.missed
            );
        }
        if let Some(sample) = &self.error_sample {
            let _ = writeln!(s, "  first error  {sample}");
        }
        let l = &self.latency;
        let _ = writeln!(
            s,
            "  latency µs   p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (mean {:.1})",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        );
        let _ = writeln!(
            s,
            "  CPU µs/req   server {}  generator {}",
            opt(self.server_cpu_us_per_req, 1),
            opt(self.generator_cpu_us_per_req, 1)
        );
        if let Some(r) = &self.redis {
            let _ = writeln!(
                s,
                "  redis        {} script calls/req, {} commands/req, {} CPU µs/req, {} µs/script \
                 call, {} script calls/read",
                opt(r.script_calls_per_req, 3),
                opt(r.commands_per_req, 3),
                opt(r.cpu_us_per_req, 1),
                opt(r.script_usec_per_call, 2),
                opt(r.script_calls_per_read, 1)
            );
        }
        let _ = writeln!(
            s,
            "  machine      {} busy cores, {} of them outside server/redis/generator \
             (load avg before: {})",
            opt(self.machine_busy_cores, 2),
            opt(self.other_busy_cores, 2),
            opt(self.loadavg_1m_before, 2)
        );
        s
    }
}
