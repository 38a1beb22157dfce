//! Building response parts: descriptor statuses, upstream's RateLimit-* headers and the dynamic
//! metadata struct.

use std::collections::BTreeMap;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use super::UNLIMITED_REMAINING;
use crate::config::{Limit, Unit};
use crate::proto::{
    Code, CurrentLimit, DescriptorStatus, HeaderValue, RateLimitRequest, RateLimitResponse,
};
use crate::store::Outcome;
use crate::util::shown;

/// Unknown domain: every descriptor OK with no limit.
pub(super) fn all_ok(descriptors: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![no_limit(); descriptors],
        ..Default::default()
    }
}

/// No limit matched (or it was replaced): `{code: OK}` and nothing else.
pub(super) fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

/// A descriptor refused without being judged (see [`super::Refusal`]): OVER_LIMIT, nothing left,
/// no limit named.
pub(super) fn refused() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::OverLimit as i32,
        ..Default::default()
    }
}

pub(super) fn unlimited() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        limit_remaining: UNLIMITED_REMAINING,
        ..Default::default()
    }
}

/// The rate of a counted limit, taken from its quota when the check was planned.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rate {
    pub(super) requests_per_unit: u32,
    pub(super) unit: Unit,
    /// `unit × unit_multiplier`, in seconds.
    pub(super) window_secs: u64,
}

/// A counted descriptor. Per-rule shadow mode turns OVER_LIMIT into OK but keeps remaining 0.
pub(super) fn counted(limit: &Limit, rate: Rate, outcome: &Outcome) -> DescriptorStatus {
    let Rate {
        requests_per_unit,
        unit,
        ..
    } = rate;
    let over = !outcome.admitted;
    let code = if over && !limit.shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(CurrentLimit {
            name: limit.name.clone(),
            requests_per_unit,
            unit: unit.to_response() as i32,
        }),
        limit_remaining: remaining(outcome),
        // Whole seconds, rounded up and never 0, as upstream reports them.
        duration_until_reset: Some(prost_types::Duration {
            seconds: outcome.reset_ms.div_ceil(1000).max(1) as i64,
            nanos: 0,
        }),
        quota: None,
    }
}

/// Names of the three headers added when `LIMIT_RESPONSE_HEADERS_ENABLED` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// `LIMIT_LIMIT_HEADER`: the limit's `requests_per_unit`.
    pub limit: String,
    /// `LIMIT_REMAINING_HEADER`: what it can still admit.
    pub remaining: String,
    /// `LIMIT_RESET_HEADER`: seconds until it resets.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The response header on every answer decided locally while the store was down
/// (`FAILURE_POLICY=local_share`), whatever `LIMIT_RESPONSE_HEADERS_ENABLED` says: whoever
/// reads the response can tell an approximate limit from an exact one.
pub const DEGRADED_HEADER: &str = "x-sluice-degraded";

/// The dynamic metadata field that says the same, with `RESPONSE_DYNAMIC_METADATA`.
pub const DEGRADED_METADATA: &str = "sluice_degraded";

/// The dynamic metadata field set (to "1") on an answer whose request took a concurrency lease.
/// Envoy keeps the answer's metadata under `envoy.filters.http.ratelimit`, and the release at
/// stream end reads it with a `metadata` action as its `sluice_release` entry: a request that
/// took no lease (refused, or let through while Sluice could not be asked) sends no release.
pub(super) const LEASE_METADATA: &str = "sluice_release";

/// Adds [`LEASE_METADATA`] to `reply`'s dynamic metadata (made when there is none).
pub(super) fn mark_lease(reply: &mut RateLimitResponse) {
    let one = Value {
        kind: Some(Kind::StringValue("1".into())),
    };
    reply
        .dynamic_metadata
        .get_or_insert_with(Default::default)
        .fields
        .insert(LEASE_METADATA.into(), one);
}

/// Marks `reply` as decided locally: [`DEGRADED_HEADER`], and [`DEGRADED_METADATA`] when the
/// reply carries dynamic metadata.
pub(super) fn mark_degraded(reply: &mut RateLimitResponse) {
    reply.response_headers_to_add.push(HeaderValue {
        key: DEGRADED_HEADER.into(),
        value: "true".into(),
        raw_value: Vec::new(),
    });
    if let Some(metadata) = &mut reply.dynamic_metadata {
        let yes = Value {
            kind: Some(Kind::BoolValue(true)),
        };
        metadata.fields.insert(DEGRADED_METADATA.into(), yes);
    }
}

impl HeaderNames {
    /// The three headers for `status` (0 for what it does not say).
    pub(super) fn headers(&self, status: &DescriptorStatus) -> Vec<HeaderValue> {
        let header = |key: &str, value: u64| HeaderValue {
            key: key.to_string(),
            value: value.to_string(),
            raw_value: Vec::new(),
        };
        let limit = status
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit);
        let reset = status
            .duration_until_reset
            .as_ref()
            .map_or(0, |d| d.seconds.max(0) as u64);
        vec![
            header(&self.limit, u64::from(limit)),
            header(&self.remaining, u64::from(status.limit_remaining)),
            header(&self.reset, reset),
        ]
    }
}

/// The IETF draft's structured fields (draft-ietf-httpapi-ratelimit-headers):
/// `RateLimit-Policy: "<name>";q=<quota>;w=<window seconds>` and
/// `RateLimit: "<name>";r=<remaining>;t=<seconds to reset>`, for the same status the
/// `RateLimit-*` headers describe, whose window is `window` seconds long (the status's unit
/// times `unit_multiplier`). An unnamed limit is called `default`.
pub(super) fn draft_headers(status: &DescriptorStatus, window: u64) -> Vec<HeaderValue> {
    let Some(limit) = &status.current_limit else {
        return Vec::new();
    };
    let name = if limit.name.is_empty() {
        "default"
    } else {
        &limit.name
    };
    // An sf-string: backslash-escape `"` and `\`, drop what it cannot carry.
    let name: String = name
        .chars()
        .filter(|c| (' '..='~').contains(c))
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds.max(0));
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_string(),
        value,
        raw_value: Vec::new(),
    };
    vec![
        header(
            "RateLimit-Policy",
            format!("\"{name}\";q={};w={window}", limit.requests_per_unit),
        ),
        header(
            "RateLimit",
            format!("\"{name}\";r={};t={reset}", status.limit_remaining),
        ),
    ]
}

/// What one descriptor's status counts for in the response, noted as the status is built.
#[derive(Debug, Clone, Copy)]
pub(super) struct Judged {
    /// Its status is OVER_LIMIT.
    pub(super) over: bool,
    /// It counts among the request's quota descriptors.
    pub(super) quota: bool,
    /// `limit_remaining` of a status that names a limit; `None` when it names none.
    pub(super) remaining: Option<u32>,
    /// Its limit says `hide_from_headers`: the headers never describe it.
    pub(super) hidden: bool,
}

impl Judged {
    /// No limit, replaced, or unlimited: OK and naming no limit.
    pub(super) const NO_LIMIT: Judged = Judged {
        over: false,
        quota: false,
        remaining: None,
        hidden: false,
    };
    /// Refused without being judged (see [`super::Refusal`]).
    pub(super) const REFUSED: Judged = Judged {
        over: true,
        quota: false,
        remaining: None,
        hidden: false,
    };
}

/// What a request's statuses add up to, counted as they are built: the overall code (upstream's
/// quota mode) and the status the headers describe, chosen among the statuses whose limit is
/// not hidden from them (`hide_from_headers`) as upstream chooses among all.
#[derive(Debug, Default)]
pub(super) struct Tally {
    non_quota_over: bool,
    quota: usize,
    quota_over: usize,
    /// The last non-quota OVER_LIMIT status.
    last_over: Option<usize>,
    /// The status naming a limit with the least remaining (the first of equals) and that
    /// remaining.
    least_remaining: Option<(usize, u32)>,
}

impl Tally {
    /// Counts status `index` (statuses are added in request order).
    pub(super) fn add(&mut self, index: usize, judged: Judged) {
        if judged.quota {
            self.quota += 1;
            self.quota_over += usize::from(judged.over);
        } else if judged.over {
            self.non_quota_over = true;
            if !judged.hidden {
                self.last_over = Some(index);
            }
        }
        if judged.hidden {
            return;
        }
        if let Some(remaining) = judged.remaining
            && self
                .least_remaining
                .is_none_or(|(_, least)| remaining < least)
        {
            self.least_remaining = Some((index, remaining));
        }
    }

    /// Upstream's overall rule: any non-quota descriptor over, or every quota descriptor over
    /// (when there is one).
    pub(super) fn over_limit(&self) -> bool {
        self.non_quota_over || (self.quota > 0 && self.quota_over == self.quota)
    }

    /// The status the headers describe: the last non-quota OVER_LIMIT one if any, else the one
    /// naming a limit with the least remaining; hidden ones left out of both.
    pub(super) fn header_source(&self) -> Option<usize> {
        self.last_over
            .or(self.least_remaining.map(|(index, _)| index))
    }
}

/// `limit_remaining` of a counted status.
pub(super) fn remaining(outcome: &Outcome) -> u32 {
    u32::try_from(outcome.remaining).unwrap_or(u32::MAX)
}

/// Upstream's dynamic metadata: the domain, each request descriptor (entries as `key=value`,
/// its override and cost when present), the request's cost when non-zero, and the deep merge of
/// the config `metadata` of every descriptor that is not over the limit (`passed`, in request
/// order; first value wins).
pub(super) fn dynamic_metadata<'l>(
    request: &RateLimitRequest,
    passed: impl Iterator<Item = &'l Limit>,
) -> Struct {
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(format!("{}={}", shown(&e.key), shown(&e.value))))
                .collect();
            fields.insert("entries".into(), list(entries));
            if let Some(o) = &d.limit {
                let unit = crate::proto::OverrideUnit::try_from(o.unit)
                    .map_or_else(|_| o.unit.to_string(), |u| u.as_str_name().to_string());
                fields.insert(
                    "limit".into(),
                    string(format!(
                        "requests_per_unit:{} unit:{unit}",
                        o.requests_per_unit
                    )),
                );
            }
            if let Some(h) = d.hits_addend {
                fields.insert("hitsAddend".into(), number(h as f64));
            }
            object(fields)
        })
        .collect();

    let mut merged = BTreeMap::new();
    for meta in passed.filter_map(|l| l.metadata.as_ref()) {
        merge(&mut merged, &meta.fields);
    }

    let mut fields = BTreeMap::new();
    fields.insert("domain".into(), string(shown(&request.domain).into_owned()));
    fields.insert("descriptors".into(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(f64::from(request.hits_addend)));
    }
    if !merged.is_empty() {
        fields.insert("metadata".into(), object(merged));
    }
    Struct { fields }
}

/// Deep merge where the value already present wins.
fn merge(into: &mut BTreeMap<String, Value>, from: &BTreeMap<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(key), &value.kind) {
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
            (
                Some(Value {
                    kind: Some(Kind::StructValue(existing)),
                }),
                Some(Kind::StructValue(incoming)),
            ) => merge(&mut existing.fields, &incoming.fields),
            (Some(_), _) => {}
        }
    }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn object(fields: BTreeMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}
