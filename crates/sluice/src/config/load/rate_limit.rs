//! Validation of a `rate_limit` (and of each entry of `rate_limits`): its unit, quota and
//! `replaces`, and Sluice's algorithms with their parameters, read on the same `FileChecker` as
//! the rest of a document. Apart from `validate.rs` because this is where Sluice's extensions
//! live and where new algorithms add their checks.

use std::collections::HashMap;

use super::scalars::{Number, describe, yaml11_number};
use super::validate::{EXTENSION_KEYS, FileChecker, LimitSpec};
use crate::config::yaml::{Node, Value};
use crate::config::{
    Algorithm, AlgorithmField, MAX_WINDOW_SECS, Member, Quota, Unit, WarmUpProblem,
};

impl FileChecker<'_> {
    /// Reads one `rate_limit` map: its fields, then its quota, then `replaces`, then whether
    /// `record_refused_hits` fits the algorithm.
    pub(super) fn limit(&mut self, node: &Node) -> Option<LimitSpec> {
        const FIELDS: &[&str] = &[
            "unit",
            "requests_per_unit",
            "unlimited",
            "name",
            "replaces",
            "algorithm",
            "burst",
            "warmup_period",
            "cold_factor",
            "record_refused_hits",
            "unit_multiplier",
            "hide_from_headers",
            "calendar",
        ];
        let fields = self.mapping(node, "rate_limit", FIELDS)?;
        let record_refused_hits = fields
            .get("record_refused_hits")
            .and_then(|n| self.boolean(n, "record_refused_hits"))
            .unwrap_or(false);
        let hide_from_headers = fields
            .get("hide_from_headers")
            .and_then(|n| self.boolean(n, "hide_from_headers"))
            .unwrap_or(false);
        let unlimited = fields
            .get("unlimited")
            .and_then(|n| self.boolean(n, "unlimited"))
            .unwrap_or(false);
        let name = fields
            .get("name")
            .and_then(|n| self.string(n, "name"))
            .unwrap_or_default();
        let unit_text = fields
            .get("unit")
            .filter(|n| !n.is_null())
            .and_then(|n| self.string(n, "unit"));
        let requests_per_unit = fields
            .get("requests_per_unit")
            .and_then(|n| self.count(n, "requests_per_unit"))
            .unwrap_or(0);

        let quota = self.quota(node, &fields, unlimited, unit_text, requests_per_unit)?;

        let calendar = self.calendar(&fields, &quota)?;
        let replaces = self.replaces(&fields, &name)?;
        // The fixed window always records refused hits (upstream's INCRBY); saying so is a
        // mistake, not a no-op.
        if record_refused_hits
            && matches!(
                quota,
                Quota::PerUnit {
                    algorithm: Algorithm::FixedWindow,
                    ..
                }
            )
        {
            self.error(
                fields["record_refused_hits"].line,
                "record_refused_hits does not apply to algorithm fixed_window (it always counts \
                 refused hits)",
            );
            return None;
        }
        Some(LimitSpec {
            line: None,
            name,
            quota,
            replaces,
            record_refused_hits,
            hide_from_headers,
            calendar,
        })
    }

    /// The quota: `unlimited`, with no unit nor extension key beside it, or a valid unit with
    /// its multiplier and algorithm.
    fn quota(
        &mut self,
        node: &Node,
        fields: &HashMap<&str, &Node>,
        unlimited: bool,
        unit_text: Option<String>,
        requests_per_unit: u32,
    ) -> Option<Quota> {
        let quota = if unlimited {
            // Upstream refuses only a valid unit here; any other text (`unit: ""`) is ignored.
            match unit_text.as_deref() {
                Some(text) if Unit::parse(text).is_some() => self.error(
                    node.line,
                    "should not specify rate limit unit when unlimited",
                ),
                Some(text) if !text.is_empty() => self.warn(
                    fields.get("unit").map_or(node.line, |n| n.line),
                    format!("unit '{text}' is not a unit; ignored on an unlimited rate limit"),
                ),
                _ => {}
            }
            if let Some(key) = EXTENSION_KEYS.iter().find(|k| fields.contains_key(**k)) {
                self.error(
                    fields[*key].line,
                    format!("{key} has no meaning on an unlimited rate limit"),
                );
            }
            Quota::Unlimited
        } else {
            let text = unit_text.unwrap_or_default();
            match Unit::parse(&text) {
                Some(unit) => {
                    let unit_multiplier = match fields.get("unit_multiplier") {
                        Some(n) => self.unit_multiplier(n, unit)?,
                        None => 1,
                    };
                    let window_secs = unit.window_secs() * u64::from(unit_multiplier);
                    Quota::PerUnit {
                        requests_per_unit,
                        unit,
                        unit_multiplier,
                        algorithm: self.algorithm(
                            fields,
                            node.line,
                            requests_per_unit,
                            window_secs,
                        )?,
                    }
                }
                None => {
                    let line = fields.get("unit").map_or(node.line, |n| n.line);
                    self.error(line, format!("invalid rate limit unit '{text}'"));
                    return None;
                }
            }
        };
        Some(quota)
    }

    /// `replaces`: a list of `{name: ...}` maps, none empty nor naming this limit itself.
    fn replaces(&mut self, fields: &HashMap<&str, &Node>, name: &str) -> Option<Vec<String>> {
        let mut replaces = Vec::new();
        if let Some(list) = fields.get("replaces").filter(|n| !n.is_null()) {
            let Value::Sequence(items) = &list.value else {
                self.error(list.line, "replaces must be a list of {name: ...} maps");
                return None;
            };
            for item in items {
                let Some(entry) = self.mapping(item, "replaces entry", &["name"]) else {
                    continue;
                };
                let replaced = entry
                    .get("name")
                    .and_then(|n| self.string(n, "name"))
                    .unwrap_or_default();
                if replaced.is_empty() {
                    self.error(item.line, "should not have an empty replaces entry");
                } else if replaced == name {
                    self.error(
                        item.line,
                        "replaces should not contain name of same descriptor",
                    );
                } else {
                    replaces.push(replaced);
                }
            }
        }
        Some(replaces)
    }

    /// Reads `rate_limits` (a Sluice extension): a non-empty list of complete `rate_limit`s, all
    /// of which must admit a request. Each is counted apart, so two with the same algorithm and
    /// window would be the same counter (and its keys, `rls::key`, tell them apart by those):
    /// refused, as is `unlimited`, which would make the others pointless. Each limit's stats
    /// are named by its label (`Member::label_for`: its name, or `limit<position>`), so two
    /// with one label would count into the same stats and neither could be read apart: refused
    /// too.
    pub(super) fn limit_list(&mut self, node: &Node) -> Vec<LimitSpec> {
        let Value::Sequence(items) = &node.value else {
            self.error(
                node.line,
                format!(
                    "rate_limits must be a list of rate limits, found a {}",
                    node.kind()
                ),
            );
            return Vec::new();
        };
        if items.is_empty() {
            self.error(node.line, "rate_limits must list at least one rate limit");
            return Vec::new();
        }
        let mut limits: Vec<LimitSpec> = Vec::with_capacity(items.len());
        let mut seen: Vec<(&'static str, u64, usize)> = Vec::new();
        let mut labels: Vec<(String, usize)> = Vec::new();
        for item in items {
            let Some(mut limit) = self.limit(item) else {
                continue;
            };
            limit.line = self.lines.then_some(item.line);
            let Quota::PerUnit { algorithm, .. } = limit.quota else {
                self.error(
                    item.line,
                    "unlimited has no meaning in rate_limits (use rate_limit: {unlimited: true})",
                );
                continue;
            };
            let window = limit.quota.window_secs().unwrap_or(0);
            if let Some((_, _, first)) = seen
                .iter()
                .find(|(name, secs, _)| *name == algorithm.name() && *secs == window)
            {
                self.error(
                    item.line,
                    format!(
                        "two limits of one rate_limits list with algorithm {} and a window of \
                         {window}s (the first on line {first}); they would share one counter",
                        algorithm.name()
                    ),
                );
                continue;
            }
            let label = Member::label_for(limits.len() + 1, &limit.name);
            if let Some((_, first)) = labels.iter().find(|(l, _)| *l == label) {
                let reason = if label == limit.name {
                    format!(
                        "two limits of one rate_limits list named '{label}' (the first on line \
                         {first}); their stats would merge"
                    )
                } else {
                    format!(
                        "two limits of one rate_limits list whose stats are named '{label}' (the \
                         first on line {first}); give them different names"
                    )
                };
                self.error(item.line, reason);
                continue;
            }
            labels.push((label, item.line));
            seen.push((algorithm.name(), window, item.line));
            limits.push(limit);
        }
        limits
    }

    /// Reads and checks `algorithm` and its parameters.
    fn algorithm(
        &mut self,
        fields: &HashMap<&str, &Node>,
        line: usize,
        requests_per_unit: u32,
        window_secs: u64,
    ) -> Option<Algorithm> {
        let name = match fields.get("algorithm") {
            Some(n) => self.string(n, "algorithm")?,
            None => "fixed_window".to_string(),
        };
        let at = |key: &str| fields.get(key).map_or(line, |n| n.line);
        let burst_value = self.burst(fields, requests_per_unit)?;
        let algorithm = match name.as_str() {
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_window_log" => Algorithm::SlidingWindowLog,
            "sliding_window_counter" => Algorithm::SlidingWindowCounter,
            "token_bucket" => Algorithm::TokenBucket { burst: burst_value },
            "gcra" => Algorithm::Gcra { burst: burst_value },
            "leaky_bucket" => Algorithm::LeakyBucket { burst: burst_value },
            "warm_up" => self.warm_up(fields, line)?,
            "concurrency" => Algorithm::Concurrency,
            other => {
                self.error(
                    at("algorithm"),
                    format!(
                        "unknown algorithm '{other}' (expected one of: {})",
                        Algorithm::NAMES.join(", ")
                    ),
                );
                return None;
            }
        };

        self.parameters_belong(fields, line, algorithm)?;
        self.numbers_fit(fields, line, algorithm, requests_per_unit, window_secs)?;
        Some(algorithm)
    }

    /// `burst`, from 1 on; without it, the bucket holds one window's requests.
    fn burst(&mut self, fields: &HashMap<&str, &Node>, requests_per_unit: u32) -> Option<u32> {
        let burst_value = match fields.get("burst") {
            Some(n) => match self.count(n, "burst")? {
                0 => {
                    self.error(n.line, "burst must be at least 1");
                    return None;
                }
                b => b,
            },
            None => requests_per_unit,
        };
        Some(burst_value)
    }

    /// `warm_up`'s parameters: `warmup_period` (a Go duration, required) and `cold_factor`.
    fn warm_up(&mut self, fields: &HashMap<&str, &Node>, line: usize) -> Option<Algorithm> {
        let Some(node) = fields.get("warmup_period") else {
            self.error(line, "warm_up needs warmup_period (for example 10s)");
            return None;
        };
        let text = self.string(node, "warmup_period")?;
        let warmup = match crate::util::parse_go_duration(&text) {
            Ok(d) => d,
            Err(reason) => {
                self.error(node.line, format!("warmup_period: {reason}"));
                return None;
            }
        };
        let cold_factor = match fields.get("cold_factor") {
            None => None,
            Some(n) => match &n.value {
                Value::Scalar { text, plain: true } => match text.parse::<f64>() {
                    Ok(f) => Some((f, n.line, text.clone())),
                    Err(_) => {
                        self.error(n.line, "cold_factor must be a number");
                        return None;
                    }
                },
                _ => {
                    self.error(n.line, "cold_factor must be a number");
                    return None;
                }
            },
        };
        match Algorithm::warm_up(warmup, cold_factor.as_ref().map(|c| c.0)) {
            Ok(algorithm) => Some(algorithm),
            Err(problem @ WarmUpProblem::PeriodTooShort) => {
                self.error(node.line, problem.to_string());
                None
            }
            Err(problem @ WarmUpProblem::ColdFactor) => {
                let (line, text) = cold_factor.map_or((line, String::new()), |c| (c.1, c.2));
                self.error(line, format!("{problem}, found '{text}'"));
                None
            }
        }
    }

    /// Refuses a parameter of another algorithm (`burst` on a fixed window, …).
    fn parameters_belong(
        &mut self,
        fields: &HashMap<&str, &Node>,
        line: usize,
        algorithm: Algorithm,
    ) -> Option<()> {
        let at = |key: &str| fields.get(key).map_or(line, |n| n.line);
        // Parameters that belong to another algorithm are mistakes, not silent no-ops.
        let takes_burst = algorithm.burst().is_some();
        let takes_warmup = matches!(algorithm, Algorithm::WarmUp { .. });
        // A refused acquisition holds no lease: there is nothing to record.
        let records = algorithm != Algorithm::Concurrency;
        for (key, allowed) in [
            ("burst", takes_burst),
            ("warmup_period", takes_warmup),
            ("cold_factor", takes_warmup),
            ("record_refused_hits", records),
        ] {
            if !allowed && fields.contains_key(key) {
                self.error(
                    at(key),
                    format!("{key} does not apply to algorithm {}", algorithm.name()),
                );
                return None;
            }
        }
        Some(())
    }

    /// Refuses numbers the algorithm cannot represent (`Algorithm::check_numbers`), naming the
    /// field at fault.
    fn numbers_fit(
        &mut self,
        fields: &HashMap<&str, &Node>,
        line: usize,
        algorithm: Algorithm,
        requests_per_unit: u32,
        window_secs: u64,
    ) -> Option<()> {
        let at = |key: &str| fields.get(key).map_or(line, |n| n.line);
        if let Err(problem) =
            algorithm.check_numbers(u64::from(requests_per_unit), window_secs * 1_000_000)
        {
            let field = match problem.field {
                AlgorithmField::Rate => "requests_per_unit",
                AlgorithmField::Burst => "burst",
                AlgorithmField::WarmupPeriod => "warmup_period",
            };
            self.error(
                at(field),
                problem.reason.replace("the rate", "requests_per_unit"),
            );
            return None;
        }
        Some(())
    }

    /// Reads `unit_multiplier`: a whole number from 1 on, with the window it makes (`unit` times
    /// it) at most [`MAX_WINDOW_SECS`].
    fn unit_multiplier(&mut self, node: &Node, unit: Unit) -> Option<u32> {
        let most = MAX_WINDOW_SECS / unit.window_secs();
        let whole = match &node.value {
            Value::Scalar { text, plain: true } => match yaml11_number(text) {
                Some(Number::Int(n)) => Some(n),
                Some(Number::Float(f)) if f.fract() == 0.0 && f.abs() < 1e30 => Some(f as i128),
                _ => None,
            },
            _ => None,
        };
        match whole {
            Some(n) if n >= 1 && n <= i128::from(most) => u32::try_from(n).ok(),
            Some(n) if n >= 1 => {
                self.error(
                    node.line,
                    format!(
                        "unit_multiplier {n} makes a window longer than 100 years (at most \
                         {most} for unit {})",
                        unit.name()
                    ),
                );
                None
            }
            _ => {
                self.error(
                    node.line,
                    format!(
                        "unit_multiplier must be a whole number of at least 1, found: {}",
                        describe(node)
                    ),
                );
                None
            }
        }
    }
}
