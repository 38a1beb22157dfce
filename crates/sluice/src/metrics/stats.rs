//! Upstream's stats under upstream's statsd names (`ratelimit.service.rate_limit.<domain>.<stats
//! key>.total_hits`, `ratelimit_server.ShouldRateLimit.total_requests`, …): the one record every
//! sink reads. Prometheus maps each name through the [`Mapper`] (once, when the stat is
//! created), the statsd sink sends the names as they are, and the debug port's `/stats` lists
//! them. `EXTRA_TAGS` go on every one of them: as labels on `/metrics`, as tags in statsd.
//!
//! Most stats are counters counted here. A few are kept by the part of Sluice they describe (a
//! Redis pool's connections, the local cache's lookups) and only read here, when a sink shows or
//! sends them ([`StatStore::observe`]): those parts sit below `metrics` and cannot reach a
//! [`Counter`], and their gauges (`cx_active`, `entryCount`) are states, not counts.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::mapper::{Mapped, Mapper, StatKind, escape_metric_name};

/// A bound on the stat series a family may create (the series named after request values),
/// counted over the process's life: stats are never removed, so a series once made stays.
#[derive(Debug)]
pub(crate) struct SeriesCap {
    /// At most this many; 0: no bound.
    max: usize,
    made: AtomicUsize,
}

impl SeriesCap {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            made: AtomicUsize::new(0),
        }
    }

    /// Takes room for one more series; false when there is none.
    fn take(&self) -> bool {
        self.made
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |made| {
                (self.max == 0 || made < self.max).then_some(made + 1)
            })
            .is_ok()
    }
}

/// One counter, named as upstream's statsd stat.
#[derive(Debug)]
pub struct Stat {
    name: Box<str>,
    /// Its Prometheus series, decided once.
    mapped: Mapped,
    value: AtomicU64,
    /// The value the statsd sink last sent (counters go out as deltas).
    flushed: AtomicU64,
}

impl Stat {
    fn new(name: &str, mapped: Mapped) -> Self {
        Self {
            name: name.into(),
            mapped,
            value: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
        }
    }

    /// Counts one.
    pub fn inc(&self) {
        self.inc_by(1);
    }

    /// Counts `n`.
    pub fn inc_by(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// The count since the start.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }

    /// The statsd name (`ratelimit.service.rate_limit.<domain>.<key>.total_hits`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether [`Self::take_delta`] would give more than 0.
    pub(super) fn has_news(&self) -> bool {
        self.get() != self.flushed.load(Ordering::Relaxed)
    }

    /// The increase since the last call (for the statsd sink).
    pub(super) fn take_delta(&self) -> u64 {
        let now = self.get();
        now - self.flushed.swap(now, Ordering::Relaxed)
    }
}

/// A handle to one stat.
pub type Counter = Arc<Stat>;

/// Reads an observed stat's current value from the part of Sluice that keeps it.
type Reader = Box<dyn Fn() -> u64 + Send + Sync>;

/// What an observed stat is ([`StatStore::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observe {
    /// It only grows; statsd gets its increase.
    Counter,
    /// A state; statsd gets its value at every flush, as gostats sends gauges.
    Gauge,
}

/// A stat kept elsewhere and read when shown or sent ([`StatStore::observe`]).
pub(crate) struct Observed {
    name: Box<str>,
    mapped: Mapped,
    kind: Observe,
    read: Reader,
    /// The value the statsd sink last sent (a counter goes out as its increase).
    flushed: AtomicU64,
}

impl Observed {
    /// The statsd name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its value now, read from its owner.
    pub(crate) fn get(&self) -> u64 {
        (self.read)()
    }

    /// A counter or a gauge.
    pub(crate) fn kind(&self) -> Observe {
        self.kind
    }

    /// A counter's increase since the last call (for the statsd sink); a counter that went back
    /// (its owner was rebuilt) sends its new value.
    pub(super) fn take_delta(&self) -> u64 {
        let now = self.get();
        let before = self.flushed.swap(now, Ordering::Relaxed);
        now.checked_sub(before).unwrap_or(now)
    }
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Timer samples (stat name, milliseconds) waiting for the next statsd flush.
type TimerSamples = Vec<(Arc<str>, f64)>;

/// Timer samples kept between two statsd flushes at most; more are dropped (and counted).
const MAX_TIMER_SAMPLES: usize = 10_000;

/// Every stat by name, the mapping to Prometheus and the extra tags.
#[derive(Debug)]
pub struct StatStore {
    /// `DISABLE_STATS`: stats still count (nothing on the request path changes) but no sink,
    /// `/metrics` or `/stats` shows them.
    enabled: bool,
    mapper: Mapper,
    extra_tags: Vec<(String, String)>,
    counters: RwLock<HashMap<Box<str>, Counter>>,
    /// Stats kept elsewhere, by name.
    observed: RwLock<BTreeMap<Box<str>, Arc<Observed>>>,
    /// Timer samples in milliseconds, kept only while a statsd sink drains them.
    timers: Option<Mutex<TimerSamples>>,
    timers_dropped: AtomicU64,
}

impl StatStore {
    /// An empty store. `enabled` false (`DISABLE_STATS`) keeps counting but shows nothing;
    /// `mapper` names each stat's Prometheus series; `extra_tags` (`EXTRA_TAGS`) go on every
    /// series and statsd line; `keep_timers` keeps timer samples for a statsd sink to drain.
    pub fn new(
        enabled: bool,
        mapper: Mapper,
        extra_tags: Vec<(String, String)>,
        keep_timers: bool,
    ) -> Self {
        Self {
            enabled,
            mapper,
            extra_tags,
            counters: RwLock::default(),
            observed: RwLock::default(),
            timers: keep_timers.then(Mutex::default),
            timers_dropped: AtomicU64::new(0),
        }
    }

    pub(crate) fn extra_tags(&self) -> &[(String, String)] {
        &self.extra_tags
    }

    /// The counter named `name`, created on first use.
    pub fn counter(&self, name: &str) -> Counter {
        if let Some(c) = read(&self.counters).get(name) {
            return c.clone();
        }
        let mapped = self.mapper.map(name, StatKind::Counter);
        write(&self.counters)
            .entry(name.into())
            .or_insert_with(|| Arc::new(Stat::new(name, mapped)))
            .clone()
    }

    /// The counter named `name` when it exists, or when `cap` has room for one more series
    /// (taken under the same lock as the insertion, so concurrent callers cannot overshoot it).
    /// `None`: the cap is reached and the series would be new.
    pub(crate) fn counter_within(&self, name: &str, cap: &SeriesCap) -> Option<Counter> {
        if let Some(c) = read(&self.counters).get(name) {
            return Some(c.clone());
        }
        let mapped = self.mapper.map(name, StatKind::Counter);
        let mut counters = write(&self.counters);
        if let Some(c) = counters.get(name) {
            return Some(c.clone());
        }
        if !cap.take() {
            return None;
        }
        let stat = Arc::new(Stat::new(name, mapped));
        counters.insert(name.into(), stat.clone());
        Some(stat)
    }

    /// Shows the stat `name`, kept elsewhere, by reading it with `read` whenever a sink shows or
    /// sends it (a counter's `read` must never go down). A second stat of the same name replaces
    /// the first (its owner was rebuilt).
    pub(crate) fn observe(
        &self,
        name: &str,
        kind: Observe,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) {
        let mapped = self.mapper.map(
            name,
            match kind {
                Observe::Counter => StatKind::Counter,
                Observe::Gauge => StatKind::Gauge,
            },
        );
        let stat = Observed {
            name: name.into(),
            mapped,
            kind,
            read: Box::new(read),
            flushed: AtomicU64::new(0),
        };
        write(&self.observed).insert(name.into(), Arc::new(stat));
    }

    /// Every observed stat, sorted by name.
    pub(crate) fn observed(&self) -> Vec<Arc<Observed>> {
        read(&self.observed).values().cloned().collect()
    }

    /// One timer sample, for the statsd sink (Prometheus has its own histogram).
    pub fn time(&self, name: &Arc<str>, millis: f64) {
        let Some(timers) = &self.timers else {
            return;
        };
        let mut samples = lock(timers);
        if samples.len() < MAX_TIMER_SAMPLES {
            samples.push((name.clone(), millis));
        } else {
            self.timers_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every counter, sorted by name.
    pub fn counters(&self) -> Vec<Counter> {
        let mut all: Vec<Counter> = read(&self.counters).values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Whether a counter grew or a timer sample came since the last flush (the statsd sink's
    /// [`Stat::take_delta`] and [`Self::take_timers`]), or there are observed stats, whose
    /// gauges go out at every flush.
    pub(super) fn has_news(&self) -> bool {
        let timed = self.timers.as_ref().is_some_and(|t| {
            !lock(t).is_empty() || self.timers_dropped.load(Ordering::Relaxed) > 0
        });
        timed
            || !read(&self.observed).is_empty()
            || read(&self.counters).values().any(|c| c.has_news())
    }

    /// The timer samples since the last call, and how many were dropped.
    pub(super) fn take_timers(&self) -> (TimerSamples, u64) {
        let samples = self
            .timers
            .as_ref()
            .map(|t| std::mem::take(&mut *lock(t)))
            .unwrap_or_default();
        (samples, self.timers_dropped.swap(0, Ordering::Relaxed))
    }

    /// A series' labels in the text format: the mapping's, then `EXTRA_TAGS` (a tag whose name
    /// the mapping already uses is left out).
    fn label_text(&self, labels: &[(String, String)]) -> String {
        let mut text = String::new();
        let mut seen: Vec<String> = Vec::new();
        let extra = self
            .extra_tags
            .iter()
            .map(|(k, v)| (escape_metric_name(k), v.as_str()));
        for (k, v) in labels
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str()))
            .chain(extra)
        {
            if seen.contains(&k) {
                continue;
            }
            let sep = if text.is_empty() { "" } else { "," };
            let _ = write!(text, "{sep}{k}=\"{}\"", escape_label_value(v));
            seen.push(k);
        }
        text
    }

    /// `/stats` on the debug port: `name: value` per line.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        if self.enabled {
            let mut lines: Vec<(String, u64)> = self
                .counters()
                .iter()
                .map(|c| (c.name.to_string(), c.get()))
                .chain(
                    self.observed()
                        .iter()
                        .map(|o| (o.name.to_string(), o.get())),
                )
                .collect();
            lines.sort();
            for (name, value) in lines {
                let _ = writeln!(out, "{name}: {value}");
            }
        }
        out
    }

    /// The mapped stats in the Prometheus text format, with `EXTRA_TAGS` as labels.
    pub(crate) fn render_prometheus(&self, out: &mut Vec<u8>) {
        if !self.enabled {
            return;
        }
        // Stats that map to the same series add up, as statsd_exporter adds their events
        // (an unanchored regex rule can take in a longer name, e.g. `over_limit_with_local_cache`
        // under the default `over_limit` rule). A family is a gauge when its first stat is.
        let mut families: BTreeMap<&str, (&str, BTreeMap<String, u64>)> = BTreeMap::new();
        let counters = self.counters();
        let observed = self.observed();
        let all = counters
            .iter()
            .map(|c| (&c.mapped, Observe::Counter, c.get()))
            .chain(observed.iter().map(|o| (&o.mapped, o.kind, o.get())));
        for (mapped, kind, value) in all {
            let Mapped::Series { name, labels } = mapped else {
                continue;
            };
            let labels = self.label_text(labels);
            let kind = match kind {
                Observe::Counter => "counter",
                Observe::Gauge => "gauge",
            };
            let (_, series) = families.entry(name).or_insert((kind, BTreeMap::new()));
            *series.entry(labels).or_default() += value;
        }
        let mut text = String::new();
        for (name, (kind, series)) in families {
            let _ = writeln!(text, "# TYPE {name} {kind}");
            for (labels, value) in series {
                if labels.is_empty() {
                    let _ = writeln!(text, "{name} {value}");
                } else {
                    let _ = writeln!(text, "{name}{{{labels}}} {value}");
                }
            }
        }
        out.extend_from_slice(text.as_bytes());
    }
}

fn escape_label_value(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// Upstream's `SanitizeStatName`: `:` and `|` (statsd's separators) become `_`, and so do the
/// dots of anything shaped like an IPv4 address. Control characters become `_` too (Sluice's
/// addition): a newline in a `detailed_metric` value would otherwise end the statsd line and
/// start one of the client's making (issue #27), and no sink wants the others.
pub(super) fn sanitize(name: &str) -> String {
    let replaced = name.replace(|c: char| c == ':' || c == '|' || c.is_control(), "_");
    let bytes = replaced.as_bytes();
    let mut out = replaced.clone().into_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if let Some(end) = ipv4_at(bytes, i) {
            for b in &mut out[i..end] {
                if *b == b'.' {
                    *b = b'_';
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or(replaced)
}

/// The end of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` starting at `start`, leftmost-first and
/// greedy as Go's regexp finds it.
fn ipv4_at(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    for part in 0..4 {
        if part > 0 {
            if bytes.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let digits = bytes[i.min(bytes.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        i += digits;
    }
    Some(i)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizing_as_upstream() {
        assert_eq!(
            sanitize("d.remote_address_10.0.0.1"),
            "d.remote_address_10_0_0_1"
        );
        assert_eq!(sanitize("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(sanitize("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitize("d.v_1234.1.1.1"), "d.v_1234_1_1_1");
    }

    #[test]
    fn extra_tags_are_labels_and_dropped_stats_are_gone() {
        let mapper = Mapper::parse(
            "mappings:\n  - {match: aa.*, name: m_a, labels: {xx: \"$1\"}}\n  - {match: bb.*, name: y, action: drop}\n",
        )
        .unwrap();
        let stats = StatStore::new(true, mapper, vec![("env".into(), "prod".into())], false);
        stats.counter("aa.one").inc_by(3);
        stats.counter("bb.two").inc();
        stats.counter("cc.three").inc();
        let mut out = Vec::new();
        stats.render_prometheus(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("m_a{xx=\"one\",env=\"prod\"} 3\n"), "{text}");
        assert!(text.contains("cc_three{env=\"prod\"} 1\n"), "{text}");
        assert!(!text.contains("two"), "{text}");
        assert_eq!(stats.render_text(), "aa.one: 3\nbb.two: 1\ncc.three: 1\n");
    }

    #[test]
    fn stats_mapped_to_one_series_add_up() {
        // Upstream's default over_limit regex is not anchored, so it also takes in the local
        // cache's stat of a three-level key; statsd_exporter adds both into one series.
        let stats = StatStore::new(
            true,
            Mapper::upstream_default(),
            vec![("my-tag".into(), "x".into())],
            false,
        );
        let name = "ratelimit.service.rate_limit.app.a.b.c";
        stats.counter(&format!("{name}.over_limit")).inc_by(2);
        stats
            .counter(&format!("{name}.over_limit_with_local_cache"))
            .inc();
        let mut out = Vec::new();
        stats.render_prometheus(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("ratelimit_service_rate_limit_over_limit{domain=\"app\",key1=\"a\",key2=\"b\",my_tag=\"x\"} 3\n"),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE").count(), 1, "{text}");
    }
}
