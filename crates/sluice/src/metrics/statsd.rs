//! The statsd sinks, as upstream's: plain statsd over TCP (`USE_STATSD`, upstream's default,
//! lyft/gostats' TCP sink) and DogStatsD over UDP (`USE_DOG_STATSD`, datadog-go's default).
//! Every `STATS_FLUSH_INTERVAL` the counters that grew go out as their increase (`name:n|c`),
//! the gauges as their value (`name:v|g`) and the timer samples as `name:ms|ms`; the lines are formatted by the `cadence` crate.
//!
//! Tags (`EXTRA_TAGS`) travel as gostats puts them in a plain statsd name (`name.__key=value`,
//! sorted by key, `.`, `:` and `|` in values replaced by `_`) and as DogStatsD tags
//! (`|#key:value`) on the DogStatsD sink.
//!
//! A sink that cannot reach its server logs (at most once a minute) and drops that flush; it
//! never touches a decision. Over TCP a restarted server loses nothing: before each flush the
//! sink looks whether the server closed the connection and, if so, connects again (written
//! into a closed connection, a flush is taken by the kernel and lost, and the next one fails
//! too). On DogStatsD each line is a datagram of its own, and one that fails (too long for a
//! datagram, a full buffer) is skipped, not the rest of the flush (issue #27: one 70 KB line
//! lost every line after it). Lost lines are counted in `sluice_statsd_lines_dropped_total`.
//! It connects before it formats: a flush holds a line per timer sample, one per request, and
//! formatting them cost more instructions per request than the memory store's decision
//! (docs/BENCHMARKS.md), for lines that would be lost anyway.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cadence::prelude::*;
use cadence::{MetricSink, StatsdClient};
use prometheus::IntCounter;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use super::stats::{Observe, StatStore};

/// Which statsd server and dialect (built by `app` from upstream's variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdOptions {
    /// `STATSD_HOST:STATSD_PORT`.
    pub addr: String,
    /// `USE_DOG_STATSD`: DogStatsD tags, over UDP.
    pub dog: bool,
    /// `STATS_FLUSH_INTERVAL`.
    pub flush_interval: Duration,
}

/// Collects the lines cadence formats.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl MetricSink for Lines {
    fn emit(&self, metric: &str) -> io::Result<usize> {
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lines.push(metric.to_string());
        Ok(metric.len())
    }
}

/// Takes what [`flush_lines`] would send, without formatting it, when the server cannot be
/// reached: the counters' increase and the timer samples are lost, as they are when a send
/// fails. Returns how many lines that was.
fn drop_flush(stats: &StatStore) -> usize {
    let grew = stats
        .counters()
        .iter()
        .filter(|counter| counter.take_delta() > 0)
        .count();
    let observed = stats
        .observed()
        .iter()
        .filter(|stat| stat.kind() == Observe::Gauge || stat.take_delta() > 0)
        .count();
    grew + observed + take_samples(stats).len()
}

/// The timer samples since the last flush; says when some had to be dropped.
fn take_samples(stats: &StatStore) -> Vec<(Arc<str>, f64)> {
    let (samples, dropped) = stats.take_timers();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "statsd: timer samples dropped (more than the sink keeps between flushes)"
        );
    }
    samples
}

/// The lines of one flush: what grew since the last one.
pub(super) fn flush_lines(stats: &StatStore, dog: bool) -> Vec<String> {
    let lines = Lines::default();
    let client = StatsdClient::from_sink("", lines.clone());
    let tags = stats.extra_tags();
    let plain_suffix = if dog { String::new() } else { tag_suffix(tags) };
    for counter in stats.counters() {
        let delta = counter.take_delta();
        if delta == 0 {
            continue;
        }
        let name = format!("{}{plain_suffix}", counter.name());
        send_tagged(client.count_with_tags(&name, delta), dog, tags);
    }
    // Gauges go out at every flush with their value, as gostats sends them; counters kept
    // elsewhere as their increase, like the others.
    for stat in stats.observed() {
        let name = format!("{}{plain_suffix}", stat.name());
        if stat.kind() == Observe::Gauge {
            send_tagged(client.gauge_with_tags(&name, stat.get()), dog, tags);
        } else {
            let delta = stat.take_delta();
            if delta == 0 {
                continue;
            }
            send_tagged(client.count_with_tags(&name, delta), dog, tags);
        }
    }
    for (name, millis) in take_samples(stats) {
        let name = format!("{name}{plain_suffix}");
        send_tagged(
            client.time_with_tags(&name, millis.round() as u64),
            dog,
            tags,
        );
    }
    let mut out = lines.0.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::take(&mut *out)
}

/// Sends one line, with `tags` as DogStatsD tags on the DogStatsD sink (the plain sink has them
/// in the name already).
fn send_tagged<'m, T>(
    metric: cadence::MetricBuilder<'m, '_, T>,
    dog: bool,
    tags: &'m [(String, String)],
) where
    T: cadence::Metric + From<String>,
{
    let mut metric = metric;
    if dog {
        for (k, v) in tags {
            metric = metric.with_tag(k, v);
        }
    }
    metric.send();
}

/// gostats' form of tags inside a plain statsd name.
fn tag_suffix(tags: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = tags
        .iter()
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .collect();
    sorted.sort();
    sorted
        .iter()
        .map(|(k, v)| format!(".__{k}={}", v.replace(['.', ':', '|'], "_")))
        .collect()
}

/// Flushes `stats` to the statsd server until `stopped`, then once more.
pub async fn run(
    stats: Arc<StatStore>,
    options: StatsdOptions,
    dropped: IntCounter,
    stopped: impl std::future::Future<Output = ()>,
) {
    let mut sender = Sender::new(options.clone(), dropped);
    let mut tick = tokio::time::interval(options.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stopped => {
                sender.flush(&stats).await;
                return;
            }
        }
        sender.flush(&stats).await;
    }
}

/// How often a failing sink logs.
const LOG_EVERY: Duration = Duration::from_secs(60);

struct Sender {
    options: StatsdOptions,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    /// When the sink last logged a failure, and the failures since.
    logged: Option<std::time::Instant>,
    held_back: u64,
    /// Lines lost (`sluice_statsd_lines_dropped_total`).
    dropped: IntCounter,
}

impl Sender {
    fn new(options: StatsdOptions, dropped: IntCounter) -> Self {
        Self {
            options,
            tcp: None,
            udp: None,
            logged: None,
            held_back: 0,
            dropped,
        }
    }

    /// Sends what grew since the last flush, when anything did.
    async fn flush(&mut self, stats: &StatStore) {
        if !stats.has_news() {
            return;
        }
        if let Err(error) = self.connect().await {
            let lost = drop_flush(stats);
            self.failed(&error, lost);
            return;
        }
        let lines = flush_lines(stats, self.options.dog);
        if lines.is_empty() {
            return;
        }
        let result = if self.options.dog {
            self.send_udp(&lines).await
        } else {
            self.send_tcp(&lines).await.map_err(|e| (e, lines.len()))
        };
        if let Err((error, lost)) = result {
            self.failed(&error, lost);
        }
    }

    /// Counts `lost` lines and logs the failure, at most once a minute.
    fn failed(&mut self, error: &io::Error, lost: usize) {
        self.dropped.inc_by(lost as u64);
        if self.logged.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            self.held_back += 1;
            return;
        }
        let first = self.logged.is_none();
        self.logged = Some(std::time::Instant::now());
        tracing::warn!(
            addr = %self.options.addr,
            %error,
            held_back = std::mem::take(&mut self.held_back),
            lost_lines = lost,
            "statsd sink could not send; these stats are lost, decisions are not affected{}",
            if first { " (USE_STATSD=false turns the sink off)" } else { "" }
        );
    }

    /// The TCP connection or the UDP socket, opened when there is none or, over TCP, when the
    /// server has closed the one there is.
    async fn connect(&mut self) -> io::Result<()> {
        if self.options.dog {
            if self.udp.is_none() {
                let socket = UdpSocket::bind(("0.0.0.0", 0)).await?;
                socket.connect(&self.options.addr).await?;
                self.udp = Some(socket);
            }
        } else {
            if self.tcp.as_ref().is_some_and(closed_by_server) {
                // Written to, this connection would take the flush into the kernel's buffer and
                // lose it: a server that restarted has closed it.
                self.tcp = None;
            }
            if self.tcp.is_some() {
                return Ok(());
            }
            let connect = TcpStream::connect(&self.options.addr);
            let stream = tokio::time::timeout(Duration::from_secs(5), connect)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
            self.tcp = Some(stream);
        }
        Ok(())
    }

    async fn send_tcp(&mut self, lines: &[String]) -> io::Result<()> {
        let mut text = lines.join("\n");
        text.push('\n');
        let Some(stream) = &mut self.tcp else {
            return Ok(());
        };
        let written =
            tokio::time::timeout(Duration::from_secs(5), stream.write_all(text.as_bytes()))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "write timed out"))
                .and_then(|r| r);
        if written.is_err() {
            // Reconnect on the next flush.
            self.tcp = None;
        }
        written
    }

    /// Sends each line as a datagram; a line that fails is skipped and the others still go.
    /// The error is the first failure's, with how many lines failed.
    async fn send_udp(&mut self, lines: &[String]) -> Result<(), (io::Error, usize)> {
        let Some(socket) = &self.udp else {
            return Ok(());
        };
        let mut first_error = None;
        let mut failed = 0;
        for line in lines {
            if let Err(error) = socket.send(line.as_bytes()).await {
                failed += 1;
                first_error.get_or_insert(error);
            }
        }
        match first_error {
            None => Ok(()),
            Some(error) => Err((error, failed)),
        }
    }
}

/// Whether the statsd server has closed `stream` (or reset it). A statsd server never sends,
/// so a readable connection is one at its end. Costs no system call until the runtime has seen
/// the connection become readable.
fn closed_by_server(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::mapper::Mapper;

    #[test]
    fn lines_carry_deltas_and_tags() {
        let tags = vec![("env".to_string(), "a.b".to_string())];
        let stats = StatStore::new(true, Mapper::upstream_default(), tags, true);
        stats.counter("x.hits").inc_by(2);
        assert_eq!(flush_lines(&stats, false), ["x.hits.__env=a_b:2|c"]);
        assert!(flush_lines(&stats, false).is_empty(), "nothing grew");
        stats.counter("x.hits").inc();
        stats.time(&"x.time".into(), 3.4);
        assert_eq!(
            flush_lines(&stats, true),
            ["x.hits:1|c|#env:a.b", "x.time:3|ms|#env:a.b"]
        );
    }

    #[test]
    fn observed_gauges_go_out_every_flush_and_counters_as_their_increase() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let stats = StatStore::new(true, Mapper::upstream_default(), Vec::new(), true);
        let open = Arc::new(AtomicU64::new(3));
        let opened = Arc::new(AtomicU64::new(5));
        let (o, t) = (open.clone(), opened.clone());
        stats.observe("p.cx_active", Observe::Gauge, move || {
            o.load(Ordering::Relaxed)
        });
        stats.observe("p.cx_total", Observe::Counter, move || {
            t.load(Ordering::Relaxed)
        });
        assert_eq!(
            flush_lines(&stats, false),
            ["p.cx_active:3|g", "p.cx_total:5|c"]
        );
        assert_eq!(
            flush_lines(&stats, false),
            ["p.cx_active:3|g"],
            "the gauge, again"
        );
        open.store(1, Ordering::Relaxed);
        opened.store(7, Ordering::Relaxed);
        assert_eq!(
            flush_lines(&stats, false),
            ["p.cx_active:1|g", "p.cx_total:2|c"]
        );
        let mut text = Vec::new();
        stats.render_prometheus(&mut text);
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("# TYPE p_cx_active gauge\np_cx_active 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE p_cx_total counter\np_cx_total 7\n"),
            "{text}"
        );
        assert_eq!(stats.render_text(), "p.cx_active: 1\np.cx_total: 7\n");
    }

    /// A line too long for a datagram is skipped and counted; the lines after it still reach a
    /// real UDP server (issue #27: a send error ended the flush there).
    #[tokio::test]
    async fn a_failed_datagram_skips_its_line_not_the_flush() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let dropped = IntCounter::new("dropped", "test").unwrap();
        let mut sender = Sender::new(
            StatsdOptions {
                addr: server.local_addr().unwrap().to_string(),
                dog: true,
                flush_interval: Duration::from_secs(1),
            },
            dropped.clone(),
        );
        sender.connect().await.unwrap();
        let stats = StatStore::new(true, Mapper::upstream_default(), Vec::new(), true);
        stats.counter("a.before").inc();
        stats.counter(&format!("b.{}", "x".repeat(70_000))).inc();
        stats.counter("c.after").inc();
        sender.flush(&stats).await;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while got.len() < 2 {
            let n = server.recv(&mut buf).unwrap();
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        got.sort();
        assert_eq!(got, ["a.before:1|c", "c.after:1|c"]);
        assert_eq!(dropped.get(), 1);
    }
}
