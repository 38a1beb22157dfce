//! The load: closed loop by default, `concurrency` tasks, each sending one `ShouldRateLimit` and
//! waiting for its answer before sending the next; or open loop (`rate`), one request every
//! 1/rate s on a fixed schedule whatever the answers do (see [`open_loop`]). Either is spread
//! over `connections` HTTP/2 channels.
//!
//! A run is warm-up then the measured interval `[start, end)`. A call counts when it completes
//! inside the interval; its latency (send to answer, in microseconds) goes into the task's own
//! HDR histogram, merged at the end. Counters (`probe::Sampler`) are read at `start` and `end`.
//!
//! With `per_second`, each task also keeps a small histogram for the current second of the
//! interval and hands it to a collector when the second is over, so a long run (a soak) gets
//! latency second by second while holding one histogram per second, not one per task and second.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use sluice::proto::{
    Code, DescriptorEntry, RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient,
};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::probe::{Sampler, Snapshot};

/// The domain of the generated config.
pub(crate) const DOMAIN: &str = "bench";

/// Highest latency the histograms track (longer ones are recorded as this).
const MAX_LATENCY_US: u64 = 60_000_000;

/// The shape of the load.
#[derive(Clone, Debug)]
pub(crate) struct LoadSpec {
    pub concurrency: u32,
    pub connections: u32,
    pub keys: u64,
    pub descriptors: u32,
    pub hits_addend: u32,
    pub warmup: Duration,
    pub duration: Duration,
    pub seed: u64,
    /// Also measure every second of the interval on its own.
    pub per_second: bool,
    /// Open loop: this many requests per second on a fixed schedule (`concurrency` is then
    /// unused); `None` is the closed loop.
    pub rate: Option<u32>,
}

/// Open loop: a send more than this far behind its scheduled time counts as late.
pub(crate) const LATE_AFTER: Duration = Duration::from_millis(1);

/// Open loop: requests in flight beyond which a scheduled send is skipped (and counted missed),
/// so a stalled server cannot make the generator pile up requests without bound.
const MAX_IN_FLIGHT: u64 = 4096;

/// One second of the measured interval.
#[derive(Clone, Debug)]
pub(crate) struct SecondFigures {
    /// Seconds since the start of the measured interval (0 is the first second).
    pub second: u64,
    pub answered: u64,
    pub errors: u64,
    /// Latency of the answered calls, in microseconds (two significant digits).
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl SecondFigures {
    /// Second `second`'s figures from its latency histogram and error count.
    fn of(second: u64, latency: &Histogram<u64>, errors: u64) -> Self {
        Self {
            second,
            answered: latency.len(),
            errors,
            p50: latency.value_at_quantile(0.50),
            p99: latency.value_at_quantile(0.99),
            p999: latency.value_at_quantile(0.999),
            max: latency.max(),
        }
    }
}

/// What the tasks saw in the measured interval.
pub(crate) struct LoadOutcome {
    /// Answers with overall code OK.
    pub ok: u64,
    pub over_limit: u64,
    /// Answers with overall code UNKNOWN (or a code this bench does not know).
    pub unknown: u64,
    /// Calls that failed with a gRPC status, by code.
    pub errors: BTreeMap<String, u64>,
    /// The first error message seen.
    pub error_sample: Option<String>,
    /// Latency of the answered calls, in microseconds.
    pub latency: Histogram<u64>,
    pub start: Snapshot,
    pub end: Snapshot,
    /// Empty unless the spec asked for `per_second`.
    pub seconds: Vec<SecondFigures>,
    /// Open loop: sends scheduled in the measured interval, those that left more than
    /// [`LATE_AFTER`] behind schedule, and those skipped because [`MAX_IN_FLIGHT`] were
    /// outstanding (all 0 in a closed loop).
    pub scheduled: u64,
    pub late: u64,
    pub missed: u64,
}

impl LoadOutcome {
    pub(crate) fn answered(&self) -> u64 {
        self.ok + self.over_limit + self.unknown
    }

    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

struct TaskOutcome {
    ok: u64,
    over_limit: u64,
    unknown: u64,
    errors: BTreeMap<String, u64>,
    error_sample: Option<String>,
    latency: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

/// Per-second histograms are coarser (two significant digits, about 17 KiB each), so ten minutes
/// of seconds stay small.
fn second_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 2).expect("constant histogram bounds are valid")
}

/// One task's figures for one second, sent to the collector when the second is over.
struct SecondPart {
    second: u64,
    latency: Histogram<u64>,
    errors: u64,
}

/// Merges the tasks' parts into one histogram per second.
async fn collect_seconds(
    mut parts: tokio::sync::mpsc::UnboundedReceiver<SecondPart>,
) -> Vec<SecondFigures> {
    let mut seconds: BTreeMap<u64, (Histogram<u64>, u64)> = BTreeMap::new();
    while let Some(part) = parts.recv().await {
        let (latency, errors) = seconds
            .entry(part.second)
            .or_insert_with(|| (second_histogram(), 0));
        // Same bounds and precision on both sides, so adding cannot fail.
        let _ = latency.add(&part.latency);
        *errors += part.errors;
    }
    seconds
        .into_iter()
        .map(|(second, (h, errors))| SecondFigures::of(second, &h, errors))
        .collect()
}

/// Opens the channels, checks one request, runs the load and reads `sampler` at both ends of
/// the measured interval.
pub(crate) async fn run(
    addr: SocketAddr,
    spec: &LoadSpec,
    sampler: &mut Sampler,
) -> Result<LoadOutcome> {
    let uri = format!("http://{addr}");
    let endpoint = Endpoint::from_shared(uri.clone())
        .with_context(|| format!("invalid address {uri}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut clients = Vec::new();
    for _ in 0..spec.connections.max(1) {
        // Each connect() opens its own HTTP/2 connection.
        let channel: Channel = endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {uri}"))?;
        clients.push(RateLimitServiceClient::new(channel));
    }

    // One request first, so a wrong target fails with its reason instead of a run of errors.
    let mut keys = KeyGen::new(spec, u64::MAX);
    let mut client = clients[0].clone();
    if let Err(status) = client.should_rate_limit(keys.request()).await {
        bail!(
            "the server refused the first request: {:?}: {}",
            status.code(),
            status.message()
        );
    }

    if let Some(rate) = spec.rate {
        return open_loop(clients, keys, spec, rate, sampler).await;
    }
    let start = Instant::now() + spec.warmup;
    let end = start + spec.duration;
    let (parts_tx, parts_rx) = tokio::sync::mpsc::unbounded_channel();
    let collector = tokio::spawn(collect_seconds(parts_rx));
    let mut tasks = Vec::new();
    for task in 0..spec.concurrency {
        let client = clients[task as usize % clients.len()].clone();
        let keys = KeyGen::new(spec, task as u64);
        let seconds = spec.per_second.then(|| parts_tx.clone());
        tasks.push(tokio::spawn(closed_loop(client, keys, start, end, seconds)));
    }
    drop(parts_tx);

    tokio::time::sleep_until(start).await;
    let first = sampler.snapshot().await?;
    tokio::time::sleep_until(end).await;
    let last = sampler.snapshot().await?;

    let mut outcome = LoadOutcome {
        ok: 0,
        over_limit: 0,
        unknown: 0,
        errors: BTreeMap::new(),
        error_sample: None,
        latency: histogram(),
        start: first,
        end: last,
        seconds: Vec::new(),
        scheduled: 0,
        late: 0,
        missed: 0,
    };
    for task in tasks {
        let t = task.await.context("a load task failed")?;
        outcome.ok += t.ok;
        outcome.over_limit += t.over_limit;
        outcome.unknown += t.unknown;
        for (code, n) in t.errors {
            *outcome.errors.entry(code).or_default() += n;
        }
        if outcome.error_sample.is_none() {
            outcome.error_sample = t.error_sample;
        }
        outcome
            .latency
            .add(&t.latency)
            .context("cannot merge latency histograms")?;
    }
    // Every task has finished, so every sender is gone and the collector ends.
    outcome.seconds = collector.await.context("the per-second collector failed")?;
    Ok(outcome)
}

async fn closed_loop(
    mut client: RateLimitServiceClient<Channel>,
    mut keys: KeyGen,
    start: Instant,
    end: Instant,
    seconds: Option<tokio::sync::mpsc::UnboundedSender<SecondPart>>,
) -> TaskOutcome {
    let mut out = TaskOutcome::new();
    let mut this_second = SecondPart {
        second: 0,
        latency: second_histogram(),
        errors: 0,
    };
    loop {
        let request = keys.request();
        let sent = Instant::now();
        if sent >= end {
            if let Some(seconds) = &seconds {
                let _ = seconds.send(this_second);
            }
            return out;
        }
        let result = client.should_rate_limit(request).await;
        let done = Instant::now();
        if done < start || done >= end {
            continue;
        }
        if let Some(seconds) = &seconds {
            let second = (done - start).as_secs();
            if second != this_second.second {
                let next = SecondPart {
                    second,
                    latency: second_histogram(),
                    errors: 0,
                };
                let _ = seconds.send(std::mem::replace(&mut this_second, next));
            }
            match &result {
                Ok(_) => this_second.latency.saturating_record(micros(sent, done)),
                Err(_) => this_second.errors += 1,
            }
        }
        out.record(result, micros(sent, done));
    }
}

impl TaskOutcome {
    fn new() -> TaskOutcome {
        TaskOutcome {
            ok: 0,
            over_limit: 0,
            unknown: 0,
            errors: BTreeMap::new(),
            error_sample: None,
            latency: histogram(),
        }
    }

    /// Counts one answered call (its latency `us`) or failed one.
    fn record(
        &mut self,
        result: Result<tonic::Response<sluice::proto::RateLimitResponse>, tonic::Status>,
        us: u64,
    ) {
        match result {
            Ok(response) => {
                self.latency.saturating_record(us);
                match Code::try_from(response.get_ref().overall_code) {
                    Ok(Code::Ok) => self.ok += 1,
                    Ok(Code::OverLimit) => self.over_limit += 1,
                    _ => self.unknown += 1,
                }
            }
            Err(status) => {
                *self
                    .errors
                    .entry(format!("{:?}", status.code()))
                    .or_default() += 1;
                if self.error_sample.is_none() {
                    self.error_sample = Some(format!("{:?}: {}", status.code(), status.message()));
                }
            }
        }
    }
}

/// What the open loop's requests report, shared by them all (a few thousand a second take the
/// lock once each; a closed loop's tasks keep their own instead).
struct OpenShared {
    outcome: TaskOutcome,
    seconds: BTreeMap<u64, (Histogram<u64>, u64)>,
    in_flight: u64,
}

/// The open loop: a thread of its own sends request `i` at `first + i / rate` (sleeping between
/// sends, so they are spread evenly rather than in bursts on the runtime's millisecond timer),
/// each as a task that does not wait for the one before. A send that finds itself behind
/// schedule still goes (a burst catching up, as a real client's queue would), and counts late
/// when more than [`LATE_AFTER`] behind. Latency runs from the scheduled time, so a stall of
/// the generator or the server is charged to every request it delayed (no coordinated
/// omission). As in the closed loop, a call counts when it completes inside the interval.
async fn open_loop(
    clients: Vec<RateLimitServiceClient<Channel>>,
    mut keys: KeyGen,
    spec: &LoadSpec,
    rate: u32,
    sampler: &mut Sampler,
) -> Result<LoadOutcome> {
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let first = Instant::now();
    let start = first + spec.warmup;
    let end = start + spec.duration;
    let shared = std::sync::Arc::new(std::sync::Mutex::new(OpenShared {
        outcome: TaskOutcome::new(),
        seconds: BTreeMap::new(),
        in_flight: 0,
    }));
    let runtime = tokio::runtime::Handle::current();
    let sender = {
        let shared = shared.clone();
        let per_second = spec.per_second;
        let (first, start, end) = (first.into_std(), start.into_std(), end.into_std());
        std::thread::Builder::new()
            .name("open-loop".into())
            .spawn(move || {
                let (mut scheduled, mut late, mut missed) = (0u64, 0u64, 0u64);
                for i in 0u64.. {
                    let due = first + period.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
                    if due >= end {
                        break;
                    }
                    let now = std::time::Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let measured = due >= start;
                    scheduled += u64::from(measured);
                    if measured && std::time::Instant::now() - due > LATE_AFTER {
                        late += 1;
                    }
                    {
                        let mut shared = lock(&shared);
                        if shared.in_flight >= MAX_IN_FLIGHT {
                            missed += u64::from(measured);
                            continue;
                        }
                        shared.in_flight += 1;
                    }
                    let mut client = clients[i as usize % clients.len()].clone();
                    let request = keys.request();
                    let shared = shared.clone();
                    let due = Instant::from_std(due);
                    let (start, end) = (Instant::from_std(start), Instant::from_std(end));
                    runtime.spawn(async move {
                        let result = client.should_rate_limit(request).await;
                        let done = Instant::now();
                        let mut shared = lock(&shared);
                        shared.in_flight -= 1;
                        if done < start || done >= end {
                            return;
                        }
                        if per_second {
                            let (latency, errors) = shared
                                .seconds
                                .entry((done - start).as_secs())
                                .or_insert_with(|| (second_histogram(), 0));
                            match &result {
                                Ok(_) => latency.saturating_record(micros(due, done)),
                                Err(_) => *errors += 1,
                            }
                        }
                        shared.outcome.record(result, micros(due, done));
                    });
                }
                (scheduled, late, missed)
            })
            .context("cannot start the open-loop sender")?
    };

    tokio::time::sleep_until(start).await;
    let first_snapshot = sampler.snapshot().await?;
    tokio::time::sleep_until(end).await;
    let last_snapshot = sampler.snapshot().await?;
    let (scheduled, late, missed) = tokio::task::spawn_blocking(move || sender.join())
        .await
        .context("the open-loop sender failed")?
        .map_err(|_| anyhow::anyhow!("the open-loop sender panicked"))?;
    // Answers still outstanding complete after `end` and would not count; give them a moment
    // so they do not race the next run's server start.
    let drained = end + Duration::from_secs(2);
    while lock(&shared).in_flight > 0 && Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut shared = lock(&shared);
    let task = std::mem::replace(&mut shared.outcome, TaskOutcome::new());
    let seconds = std::mem::take(&mut shared.seconds)
        .into_iter()
        .map(|(second, (h, errors))| SecondFigures::of(second, &h, errors))
        .collect();
    Ok(LoadOutcome {
        ok: task.ok,
        over_limit: task.over_limit,
        unknown: task.unknown,
        errors: task.errors,
        error_sample: task.error_sample,
        latency: task.latency,
        start: first_snapshot,
        end: last_snapshot,
        seconds,
        scheduled,
        late,
        missed,
    })
}

/// The open loop's shared figures stay good if a request task panicked holding them.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn micros(sent: Instant, done: Instant) -> u64 {
    u64::try_from((done - sent).as_micros().max(1)).unwrap_or(u64::MAX)
}

/// Builds requests: descriptor `i` is `(k{i}, v)` with `v` uniform over `0..keys`.
struct KeyGen {
    state: u64,
    keys: u64,
    names: Vec<String>,
    hits_addend: u32,
}

impl KeyGen {
    fn new(spec: &LoadSpec, stream: u64) -> KeyGen {
        // A distinct, non-zero xorshift state per task.
        let state = splitmix64(spec.seed ^ splitmix64(stream)) | 1;
        KeyGen {
            state,
            keys: spec.keys.max(1),
            names: (0..spec.descriptors).map(|i| format!("k{i}")).collect(),
            hits_addend: spec.hits_addend,
        }
    }

    /// xorshift64*: plenty for picking keys, and cheap.
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn request(&mut self) -> RateLimitRequest {
        let descriptors = (0..self.names.len())
            .map(|i| {
                // Multiply-shift maps the 64-bit draw onto 0..keys without modulo bias.
                let value = ((self.next() as u128 * self.keys as u128) >> 64) as u64;
                RateLimitDescriptor {
                    entries: vec![DescriptorEntry {
                        key: self.names[i].clone().into_bytes(),
                        value: value.to_string().into_bytes(),
                    }],
                    ..Default::default()
                }
            })
            .collect();
        RateLimitRequest {
            domain: DOMAIN.as_bytes().to_vec(),
            descriptors,
            hits_addend: self.hits_addend,
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_in_range_and_cover_it() {
        let spec = LoadSpec {
            concurrency: 1,
            connections: 1,
            keys: 7,
            descriptors: 3,
            hits_addend: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
            seed: 1,
            per_second: false,
            rate: None,
        };
        let mut keys = KeyGen::new(&spec, 0);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let request = keys.request();
            assert_eq!(request.descriptors.len(), 3);
            for (i, d) in request.descriptors.iter().enumerate() {
                assert_eq!(d.entries[0].key, format!("k{i}").into_bytes());
                let v: usize = std::str::from_utf8(&d.entries[0].value)
                    .unwrap()
                    .parse()
                    .unwrap();
                seen[v] = true;
            }
        }
        assert!(seen.iter().all(|s| *s));
    }
}
