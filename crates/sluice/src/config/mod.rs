//! The rate limit configuration: loading upstream's YAML files and matching descriptors to limits.
//!
//! `load` reads and validates the files (every error names file, line and reason) and compiles
//! them into the lookup structure defined here. A lookup walks one level per request entry with
//! borrowed `&str` keys into hash maps, so matching allocates nothing. The matching rules are
//! envoyproxy/ratelimit's: per level an exact value, else the wildcards in file order, else the
//! key-only default; no backtracking; the limit applies only when the last entry lands on a node
//! that has one.

pub mod calendar;
mod dump;
mod load;
mod wildcard;
mod xds;
pub mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use calendar::{Calendar, Period};
pub use dump::UpstreamDumpLine;
pub use load::{LoadOptions, load_dir, load_sources};
pub use wildcard::Wildcard;
pub use xds::load_resources;

use crate::proto::{DescriptorEntry, OverrideUnit, ResponseUnit};

/// The unit of a limit. Windows are aligned to the Unix epoch; a month is 30 days and a year 365,
/// as upstream defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days (a Sluice addition to upstream's units; Envoy's overrides cannot name it).
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds.
    pub fn window_secs(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The unit as config files spell it (`minute`), in lower case.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses a config unit name, case-insensitively as upstream does.
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }

    /// The unit of a limit override sent by Envoy (that enum has no WEEK).
    pub fn from_override(value: i32) -> Option<Unit> {
        match OverrideUnit::try_from(value).ok()? {
            OverrideUnit::Unknown => None,
            OverrideUnit::Second => Some(Unit::Second),
            OverrideUnit::Minute => Some(Unit::Minute),
            OverrideUnit::Hour => Some(Unit::Hour),
            OverrideUnit::Day => Some(Unit::Day),
            OverrideUnit::Month => Some(Unit::Month),
            OverrideUnit::Year => Some(Unit::Year),
        }
    }

    /// The unit as Envoy's response names it (`current_limit.unit`).
    pub fn to_response(self) -> ResponseUnit {
        match self {
            Unit::Second => ResponseUnit::Second,
            Unit::Minute => ResponseUnit::Minute,
            Unit::Hour => ResponseUnit::Hour,
            Unit::Day => ResponseUnit::Day,
            Unit::Week => ResponseUnit::Week,
            Unit::Month => ResponseUnit::Month,
            Unit::Year => ResponseUnit::Year,
        }
    }
}

/// How many requests a limit admits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quota {
    /// Never counted, never touches the store.
    Unlimited,
    /// Counted: `requests_per_unit` per window, by `algorithm`.
    PerUnit {
        /// How many hits one window admits (or the rate, for the bucket-shaped algorithms).
        requests_per_unit: u32,
        /// The unit the window is counted in.
        unit: Unit,
        /// `unit_multiplier` (a Sluice extension, 1 when absent): the window is this many units
        /// long, and `requests_per_unit` counts per window.
        unit_multiplier: u32,
        /// How the hits are counted.
        algorithm: Algorithm,
    },
}

/// The longest window `unit × unit_multiplier` may make: 100 years of 365 days. Far beyond any
/// use, and it keeps every window in microseconds exact in Lua's doubles (2^53 µs is 285
/// years).
pub const MAX_WINDOW_SECS: u64 = 100 * 31_536_000;

impl Quota {
    /// The length of a counted limit's window in seconds (`unit × unit_multiplier`); `None` when
    /// unlimited. The one place the multiplier is applied.
    pub fn window_secs(&self) -> Option<u64> {
        match *self {
            Quota::Unlimited => None,
            Quota::PerUnit {
                unit,
                unit_multiplier,
                ..
            } => Some(unit.window_secs() * u64::from(unit_multiplier.max(1))),
        }
    }
}

/// How a limit counts: `rate_limit.algorithm` and its parameters (a sluice extension; upstream
/// has only the fixed window).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Algorithm {
    /// Upstream's: a counter per epoch-aligned window; up to twice the limit across a boundary.
    #[default]
    FixedWindow,
    /// Exact: at most `requests_per_unit` in any trailing window; one log entry per admitted hit.
    SlidingWindowLog,
    /// Two counters; the previous window weighted by how much of it still overlaps.
    SlidingWindowCounter,
    /// Capacity `burst`, refilled at `requests_per_unit` per unit (Spring Cloud Gateway's).
    TokenBucket {
        /// Most tokens the bucket holds.
        burst: u32,
    },
    /// Generic cell rate algorithm with a burst tolerance of `burst` requests (redis-cell's).
    Gcra {
        /// Requests admitted at once beyond the steady spacing.
        burst: u32,
    },
    /// Leaky bucket as a meter: size `burst`, draining at `requests_per_unit` per unit.
    LeakyBucket {
        /// The bucket's size.
        burst: u32,
    },
    /// Guava's SmoothWarmingUp: spaced requests, slower while cold, reaching the stable rate
    /// after `warmup` of steady use.
    WarmUp {
        /// How long steady use takes to reach the stable rate (at least 1 ms).
        warmup: std::time::Duration,
        /// How many times slower than the stable rate a cold limiter spaces requests.
        cold_factor: f64,
    },
    /// At most `requests_per_unit` leases held at once (requests in flight); a lease lives one
    /// window unless given back earlier by a release (the descriptor with a last entry
    /// `sluice_release`).
    Concurrency,
}

impl Algorithm {
    /// Every algorithm's name as `algorithm:` takes it, for messages that list them.
    pub const NAMES: [&'static str; 8] = [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "gcra",
        "leaky_bucket",
        "warm_up",
        "concurrency",
    ];

    /// The algorithm's name as `algorithm:` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::WarmUp { .. } => "warm_up",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// The burst of the bucket-shaped algorithms.
    pub fn burst(&self) -> Option<u32> {
        match self {
            Algorithm::TokenBucket { burst }
            | Algorithm::Gcra { burst }
            | Algorithm::LeakyBucket { burst } => Some(*burst),
            _ => None,
        }
    }
}

/// The largest `sliding_window_log` limit: its memory is one entry per admitted request.
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// GCRA-family state is in microseconds, kept exact in Lua's doubles (2^53): a TAT in debt lies
/// up to two bucket spans ahead of the clock (`store::algorithms::gcra`), and now + 2 × 2^51 stays
/// below 2^53 until the clock passes 2^52 µs (the year 2112).
const MAX_BUCKET_SPAN_MICROS: f64 = 2_251_799_813_685_248.0; // 2^51

/// Most permits a cold warm-up limiter stores. Both stores keep them in millionths, which stay
/// exact in Lua's doubles (2^53) below 2^32 permits; a warm-up period of years at a high rate
/// would otherwise make Redis and the memory store round differently (or Redis fail).
const MAX_WARM_UP_STORED: f64 = 4_294_967_296.0; // 2^32

/// Which number an [`AlgorithmProblem`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmField {
    /// `requests_per_unit` (with the window).
    Rate,
    /// `burst`.
    Burst,
    /// `warmup_period`.
    WarmupPeriod,
}

/// Numbers an algorithm cannot work with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgorithmProblem {
    /// The number at fault, so each source can name it its own way (a YAML key, an API field).
    pub field: AlgorithmField,
    /// Why, for people.
    pub reason: String,
}

/// Why warm-up settings were refused; the message is the same from the YAML loader and the
/// native API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WarmUpProblem {
    /// Under 1 ms.
    #[error("warmup_period must be at least 1ms")]
    PeriodTooShort,
    /// Not above 1 and at most 1000 (or not a number).
    #[error("cold_factor must be a number above 1 and at most 1000")]
    ColdFactor,
}

impl Algorithm {
    /// The warm-up algorithm: `warmup` of at least 1 ms, `cold_factor` above 1 and at most 1000
    /// (`None`: 3, Guava's). The one statement of these rules, for the YAML loader and the
    /// native API.
    pub fn warm_up(
        warmup: std::time::Duration,
        cold_factor: Option<f64>,
    ) -> Result<Algorithm, WarmUpProblem> {
        if warmup < std::time::Duration::from_millis(1) {
            return Err(WarmUpProblem::PeriodTooShort);
        }
        let cold_factor = cold_factor.unwrap_or(3.0);
        if !(cold_factor > 1.0 && cold_factor <= 1000.0) {
            return Err(WarmUpProblem::ColdFactor);
        }
        Ok(Algorithm::WarmUp {
            warmup,
            cold_factor,
        })
    }

    /// Checks `limit` permits per `window` microseconds (and the burst) against what the
    /// algorithm can represent exactly. Shared by the config loader and the native API.
    pub fn check_numbers(&self, limit: u64, window: u64) -> Result<(), AlgorithmProblem> {
        let problem = |field, reason: String| Err(AlgorithmProblem { field, reason });
        if *self != Algorithm::FixedWindow && limit == 0 {
            return problem(
                AlgorithmField::Rate,
                format!(
                    "the rate must be at least 1 for {} (use fixed_window with 0 to refuse everything)",
                    self.name()
                ),
            );
        }
        let per_permit = window as f64 / limit.max(1) as f64;
        match self {
            Algorithm::Concurrency if window < 1_000 => problem(
                AlgorithmField::Rate,
                "concurrency's leases live one window, which must be at least 1 ms".to_string(),
            ),
            Algorithm::SlidingWindowLog if limit > MAX_LOG_LIMIT => problem(
                AlgorithmField::Rate,
                format!(
                    "sliding_window_log keeps one entry per admitted request, so it allows at \
                     most {MAX_LOG_LIMIT} per window; use sliding_window_counter above that"
                ),
            ),
            Algorithm::TokenBucket { .. }
            | Algorithm::Gcra { .. }
            | Algorithm::LeakyBucket { .. }
            | Algorithm::WarmUp { .. }
                if per_permit < 1.0 =>
            {
                problem(
                    AlgorithmField::Rate,
                    format!(
                        "{} counts in microseconds: at most 1000000 per second",
                        self.name()
                    ),
                )
            }
            Algorithm::WarmUp {
                warmup,
                cold_factor,
            } if warm_up_stored(per_permit, warmup.as_micros() as f64, *cold_factor)
                > MAX_WARM_UP_STORED =>
            {
                problem(
                    AlgorithmField::WarmupPeriod,
                    "warmup_period times the rate stores more than 2^32 permits when cold; \
                     shorten warmup_period or lower the rate"
                        .to_string(),
                )
            }
            Algorithm::TokenBucket { burst }
            | Algorithm::Gcra { burst }
            | Algorithm::LeakyBucket { burst }
                if per_permit.ceil() * f64::from(*burst) > MAX_BUCKET_SPAN_MICROS =>
            {
                problem(
                    AlgorithmField::Burst,
                    "burst times the time per request exceeds 2^51 microseconds (about 71 years)"
                        .to_string(),
                )
            }
            _ => Ok(()),
        }
    }
}

/// The permits a cold warm-up limiter stores (Guava's `maxPermits`), as both stores compute it
/// (`store::algorithms::WarmUpShape`, `lua/warm_up.lua`): `stable` and `warmup` in microseconds.
fn warm_up_stored(stable: f64, warmup: f64, cold_factor: f64) -> f64 {
    let cold = stable * cold_factor;
    0.5 * warmup / stable + 2.0 * warmup / (stable + cold)
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match self {
            Algorithm::WarmUp {
                warmup,
                cold_factor,
            } => write!(f, " warmup_period={warmup:?} cold_factor={cold_factor}"),
            _ => match self.burst() {
                Some(burst) => write!(f, " burst={burst}"),
                None => Ok(()),
            },
        }
    }
}

/// Where a limit was defined, for messages and the config dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file, or for an xDS resource its name.
    pub file: Arc<Path>,
    /// `None` for an xDS resource, which has no lines.
    pub line: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}", self.file.display()),
            None => write!(f, "{}", self.file.display()),
        }
    }
}

/// A limit as the decision path needs it, compiled from one descriptor's `rate_limit` or from
/// one entry of its `rate_limits`.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Its number among the limits of its configuration (`None` for an override): where the
    /// metrics keep its counters (`metrics::ConfigCounters`).
    pub id: Option<usize>,
    /// `rate_limit.name`, empty when unnamed; echoed in `current_limit.name`.
    pub name: String,
    /// How much it admits, and how.
    pub quota: Quota,
    /// Names of limits this one drops from the same request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted and reported, but the answer is OK.
    pub shadow_mode: bool,
    /// `quota_mode`: a request is refused for its quota limits only when all of them are over
    /// (any other limit over still refuses it).
    pub quota_mode: bool,
    /// `rate_limit.record_refused_hits` (a Sluice extension): refused hits are charged too,
    /// as upstream's fixed window always does; see `store::algorithms`.
    pub record_refused_hits: bool,
    /// `rate_limit.hide_from_headers` (a Sluice extension, the counterpart of Envoy's
    /// per-descriptor `x_ratelimit_option: OFF`, which never reaches the service): Sluice's own
    /// response headers (`LIMIT_RESPONSE_HEADERS_*`) never describe this limit; they describe
    /// the request's other limits as if it were not there. Its status is unchanged.
    pub hide_from_headers: bool,
    /// `metadata` of the descriptor, returned in dynamic metadata when enabled.
    pub metadata: Option<prost_types::Struct>,
    /// Entry positions whose counter key uses the wildcard pattern instead of the runtime value
    /// (`share_threshold`), with that pattern.
    pub shared_values: Vec<(usize, Box<str>)>,
    /// How its metrics are named (upstream's stats key rules).
    pub stats: Stats,
    /// `<domain>.<key_value>.<key>…`: upstream's composite path of the descriptor, for the dump.
    pub path: String,
    /// `None` for a limit override that came with a request.
    pub origin: Option<Origin>,
    /// Its place among the limits of a `rate_limits` list; `None` for a descriptor's only limit
    /// (`rate_limit`, or an override).
    pub member: Option<Member>,
    /// `calendar` (a Sluice extension, fixed windows of a day, week, month or year only): the
    /// window is the calendar period in that zone, named in the key.
    pub calendar: Option<Arc<Calendar>>,
}

/// A limit's place in its descriptor's `rate_limits` list (a Sluice extension): a request
/// matching the descriptor is admitted only when every limit of the list admits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its position in the list, from 1.
    pub position: usize,
    /// How many limits the list has.
    pub of: usize,
    /// What names it in metrics and dumps: its `name` when that is a plain word (letters,
    /// digits, `-`, `_`), else `limit<position>`.
    pub label: String,
}

impl Member {
    /// The label of the limit at `position` (from 1) named `name`.
    pub fn label_for(position: usize, name: &str) -> String {
        let plain = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if plain {
            name.to_string()
        } else {
            format!("limit{position}")
        }
    }
}

impl Limit {
    /// A limit chosen by Envoy in the request (`RateLimitDescriptor.limit`): unnamed, never
    /// shadow or quota, counted per runtime value.
    pub fn from_override(requests_per_unit: u32, unit: Unit) -> Limit {
        Limit {
            id: None,
            name: String::new(),
            quota: Quota::PerUnit {
                requests_per_unit,
                unit,
                // The protocol's override has no multiplier: always one unit.
                unit_multiplier: 1,
                algorithm: Algorithm::FixedWindow,
            },
            replaces: Vec::new(),
            shadow_mode: false,
            record_refused_hits: false,
            hide_from_headers: false,
            quota_mode: false,
            metadata: None,
            shared_values: Vec::new(),
            stats: Stats::default(),
            path: String::new(),
            origin: None,
            member: None,
            calendar: None,
        }
    }

    /// The pattern that replaces the runtime value of entry `index` in the counter key, if any.
    pub fn shared_value(&self, index: usize) -> Option<&str> {
        self.shared_values
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, p)| &**p)
    }
}

/// What a limit's metrics are called: upstream's stats key, `<key>_<value>` or `<key>` per level as
/// the config wrote it (the pattern for a wildcard), joined with dots.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    /// The segments joined: the key when no runtime value is asked for.
    pub key: String,
    /// `<key>_<value>` or `<key>` per level, as the config wrote them.
    pub segments: Vec<String>,
    /// `value_to_metric` levels: their segment becomes `<key>_<runtime value>`.
    pub value_levels: Vec<usize>,
    /// `detailed_metric`: every segment becomes `<key>_<runtime value>`.
    pub detailed: bool,
    /// Added to the last segment to name one limit of a `rate_limits` list (`_<label>`, see
    /// [`Member::label`]); empty for a descriptor's only limit. Already part of `key`.
    pub suffix: String,
}

/// A whole loaded configuration: every domain of every file.
#[derive(Debug, Default)]
pub struct RateLimitConfig {
    domains: HashMap<Box<str>, Domain>,
    /// How many limits the domains hold; their ids run from 0 to this.
    limit_count: usize,
    /// Non-fatal findings (keys upstream accepts but ignores where they stand).
    pub warnings: Vec<ConfigError>,
    /// The files it was loaded from, in load order (empty when not loaded from a directory).
    pub files: Vec<std::path::PathBuf>,
}

impl RateLimitConfig {
    /// The domain called `name`, if the configuration has one.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The domain a request names, with its name as the config spells it. The request's domain
    /// is the client's bytes (see `build.rs`); bytes that are not UTF-8 name no domain.
    pub fn domain_of_request(&self, name: &[u8]) -> Option<(&str, &Domain)> {
        let name = std::str::from_utf8(name).ok()?;
        self.domains.get_key_value(name).map(|(k, d)| (&**k, d))
    }

    /// How many limits there are: every [`Limit::id`] is below this.
    pub fn limit_count(&self) -> usize {
        self.limit_count
    }

    /// Every domain's name, in no particular order.
    pub fn domain_names(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(|d| &**d)
    }

    /// Every limit, sorted by domain and path (for `check-config` and the config dump).
    pub fn limits(&self) -> Vec<&Limit> {
        let mut all: Vec<&Limit> = self
            .domains
            .values()
            .flat_map(|d| d.nodes.iter().flat_map(|n| &n.limits))
            .collect();
        // Stable: the limits of one `rate_limits` list keep their order.
        all.sort_by(|a, b| a.path.cmp(&b.path));
        all
    }
}

/// One domain's descriptor tree. Nodes live in an arena; `root` is the first level.
#[derive(Debug, Default)]
pub struct Domain {
    root: Level,
    nodes: Vec<TreeNode>,
}

type NodeId = usize;

#[derive(Debug, Default)]
struct Level {
    by_key: HashMap<Box<str>, Children>,
}

/// The children of one level that share a descriptor key.
#[derive(Debug, Default)]
struct Children {
    exact: HashMap<Box<str>, NodeId>,
    /// In file order: the first match wins.
    wildcards: Vec<(Wildcard, NodeId)>,
    /// The key-only child (no value): the default for any value.
    any_value: Option<NodeId>,
}

#[derive(Debug, Default)]
struct TreeNode {
    /// Empty: no limit. One: `rate_limit`. Several: a `rate_limits` list, in its order.
    limits: Vec<Limit>,
    children: Level,
}

impl Domain {
    /// The limit for a descriptor's entries, or `None` (no limit: the descriptor is answered OK);
    /// for a `rate_limits` list, its first limit (see [`Domain::find_all`]).
    pub fn find(&self, entries: &[DescriptorEntry]) -> Option<&Limit> {
        self.find_all(entries).first()
    }

    /// Every limit of a descriptor's entries: none, its `rate_limit`, or its `rate_limits`.
    pub fn find_all(&self, entries: &[DescriptorEntry]) -> &[Limit] {
        self.find_node(entries).map_or(&[], |n| &n.limits)
    }

    fn find_node(&self, entries: &[DescriptorEntry]) -> Option<&TreeNode> {
        let mut level = &self.root;
        let mut node = None;
        for entry in entries {
            // Keys and values are the client's bytes (see `build.rs`). Config keys and exact
            // values are text, so bytes that are not UTF-8 can equal neither; such a value can
            // still match a wildcard (by bytes) or the key-only default.
            let key = std::str::from_utf8(&entry.key).ok()?;
            let children = level.by_key.get(key)?;
            let exact = std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|value| children.exact.get(value));
            let id = exact
                .copied()
                .or_else(|| {
                    children
                        .wildcards
                        .iter()
                        .find(|(w, _)| w.matches(&entry.value))
                        .map(|(_, id)| *id)
                })
                .or(children.any_value)?;
            let found = &self.nodes[id];
            level = &found.children;
            node = Some(found);
        }
        node
    }
}

/// One problem found while loading: the file, the line when known, and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, the directory, or for an xDS resource its name.
    pub file: PathBuf,
    /// 1-based; `None` for what has no line (a file that cannot be read, an xDS resource).
    pub line: Option<usize>,
    /// What is wrong, in upstream's words where upstream has them.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// Every error of a failed load, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
