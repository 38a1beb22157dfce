//! Counters read at the start and end of the measured interval: CPU time of the server and of
//! the generator (`/proc/PID/stat`), of the whole machine (`/proc/stat`), and Redis's own
//! `INFO commandstats` and `INFO cpu`.
//!
//! `/proc` times are in clock ticks; `CLK_TCK` comes from `getconf CLK_TCK`, read once (100, the
//! Linux default, when `getconf` is missing).

use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// One reading of every counter.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub at: Instant,
    /// utime + stime of the server process, in seconds.
    pub server_cpu: Option<f64>,
    /// utime + stime of this process, in seconds.
    pub generator_cpu: Option<f64>,
    /// Busy and total CPU time of the machine (all CPUs), in seconds.
    pub machine: Option<MachineCpu>,
    pub redis: Option<RedisStats>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct MachineCpu {
    /// Everything but idle and iowait.
    pub busy: f64,
    /// The part of `busy` spent in interrupts and softirqs (loopback networking lands here too,
    /// attributed to no process).
    pub irq: f64,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RedisStats {
    /// Calls of EVAL, EVALSHA, EVAL_RO and EVALSHA_RO.
    pub script_calls: u64,
    /// Calls of every command except INFO (which only the bench sends).
    pub commands: u64,
    /// used_cpu_sys + used_cpu_user, in seconds.
    pub cpu: f64,
    /// Time Redis spent in script calls (the `usec` of the script commands), in µs.
    pub script_usec: u64,
    /// `total_reads_processed`: reads from client sockets, one per wake-up of a connection.
    pub reads: u64,
}

/// Reads snapshots of one server (and its Redis: one server, or every master of a cluster).
pub(crate) struct Sampler {
    server_pid: Option<u32>,
    redis: Vec<redis::aio::MultiplexedConnection>,
}

impl Sampler {
    pub(crate) async fn new(server_pid: Option<u32>, redis_urls: &[String]) -> Result<Sampler> {
        let mut redis = Vec::new();
        for url in redis_urls {
            let client = redis::Client::open(url.as_str())
                .with_context(|| format!("invalid Redis URL {url}"))?;
            redis.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .with_context(|| format!("cannot connect to Redis at {url}"))?,
            );
        }
        if let Some(pid) = server_pid {
            process_cpu(pid).with_context(|| format!("cannot read the CPU time of PID {pid}"))?;
        }
        Ok(Sampler { server_pid, redis })
    }

    pub(crate) async fn snapshot(&mut self) -> Result<Snapshot> {
        let at = Instant::now();
        let server_cpu = self.server_pid.and_then(|pid| process_cpu(pid).ok());
        let generator_cpu = process_cpu(std::process::id()).ok();
        let machine = machine_cpu().ok();
        let mut redis: Option<RedisStats> = None;
        for con in &mut self.redis {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .arg("stats")
                .arg("cpu")
                .query_async(con)
                .await
                .context("Redis INFO failed")?;
            let node = parse_info(&info)?;
            let total = redis.get_or_insert_with(RedisStats::default);
            total.script_calls += node.script_calls;
            total.commands += node.commands;
            total.cpu += node.cpu;
            total.script_usec += node.script_usec;
            total.reads += node.reads;
        }
        Ok(Snapshot {
            at,
            server_cpu,
            generator_cpu,
            machine,
            redis,
        })
    }
}

/// Clock ticks per second of `/proc` times.
pub(crate) fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|tck| *tck > 0.0)
            .unwrap_or(100.0)
    })
}

/// utime + stime of a process (all its threads), in seconds.
pub(crate) fn process_cpu(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may contain spaces: skip past it.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let tick = |i: usize| -> Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc stat")?
            .parse::<u64>()
            .context("bad /proc stat")? as f64)
    };
    Ok((tick(11)? + tick(12)?) / clk_tck())
}

/// Busy CPUs of the whole machine, averaged over `window` (2.0 = two cores busy).
pub(crate) async fn machine_busy_cores(window: std::time::Duration) -> Option<f64> {
    let before = machine_cpu().ok()?;
    tokio::time::sleep(window).await;
    let after = machine_cpu().ok()?;
    Some((after.busy - before.busy) / window.as_secs_f64())
}

/// Busy CPU time of the whole machine (all CPUs), in seconds, from the `cpu` line of /proc/stat.
fn machine_cpu() -> Result<MachineCpu> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    let irq = ticks.get(5).copied().unwrap_or(0) + ticks.get(6).copied().unwrap_or(0);
    Ok(MachineCpu {
        busy: total.saturating_sub(idle) as f64 / clk_tck(),
        irq: irq as f64 / clk_tck(),
    })
}

/// Parses the `commandstats` and `cpu` sections of `INFO`.
fn parse_info(info: &str) -> Result<RedisStats> {
    let mut stats = RedisStats::default();
    let mut cpu_fields = 0;
    for line in info.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let Some((command, values)) = rest.split_once(':') else {
                continue;
            };
            let field = |name: &str| {
                values
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let calls = field("calls");
            if command == "info" {
                continue;
            }
            stats.commands += calls;
            if matches!(command, "eval" | "evalsha" | "eval_ro" | "evalsha_ro") {
                stats.script_calls += calls;
                stats.script_usec += field("usec");
            }
        } else if let Some(value) = line.strip_prefix("total_reads_processed:") {
            stats.reads = value.parse().unwrap_or(0);
        } else if let Some(value) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            stats.cpu += value.parse::<f64>().unwrap_or(0.0);
            cpu_fields += 1;
        }
    }
    if cpu_fields != 2 {
        bail!("Redis INFO has no used_cpu_sys/used_cpu_user");
    }
    Ok(stats)
}

/// The 1-minute load average, to flag runs on a busy machine.
pub(crate) fn loadavg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// "AMD EPYC, 2 CPUs" from /proc/cpuinfo.
pub(crate) fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{model}, {cpus} CPUs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,\
                    rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=3,usec=1\r\n\
                    cmdstat_ping:calls=2,usec=1\r\n\r\n# Stats\r\ntotal_reads_processed:7\r\n\
                    # CPU\r\nused_cpu_sys:1.5\r\n\
                    used_cpu_user:2.25\r\nused_cpu_sys_children:9\r\n";
        let stats = parse_info(info).unwrap();
        assert_eq!(stats.script_calls, 10);
        assert_eq!(stats.commands, 12);
        assert_eq!((stats.script_usec, stats.reads), (50, 7));
        assert!((stats.cpu - 3.75).abs() < 1e-9);
    }

    #[test]
    fn reads_own_cpu() {
        assert!(process_cpu(std::process::id()).unwrap() >= 0.0);
    }
}
