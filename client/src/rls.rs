//! Envoy's rate limit service (RLS v3) from Rust: a typed request ([`RateLimitRequest`],
//! [`Descriptor`]), the call ([`Client::should_rate_limit`]) and a typed answer ([`Decision`]).
//!
//! The request is the one Envoy sends: a domain, descriptors of `key=value` entries matched
//! against Sluice's config, and a cost (`hits_addend`, 0 meaning 1). The answer keeps what a
//! caller acts on (allowed or not, what is left, when it resets) and the headers Sluice asked for.
//!
//! Every count of hits is a `u64` here, as the native API's are. On the wire the request's cost
//! is a `uint32` and a descriptor's a `UInt64Value`, so a request cost above `u32::MAX` is sent
//! as the cost of each descriptor that has none of its own, which Sluice (as Envoy's RLS)
//! reads first; the counts Sluice answers with are `uint32` and widen without loss.

use std::time::Duration;

use crate::client::{AnsweredBy, Client, FailurePolicy};
use crate::error::Error;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::proto::envoy::service::ratelimit::v3 as wire;
use wire::rate_limit_response::rate_limit::Unit as WireUnit;
use wire::rate_limit_response::{Code, DescriptorStatus};

/// One descriptor: `key=value` entries in order, matched against the domain's config tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    entries: Vec<(String, String)>,
    hits_addend: Option<u64>,
}

impl Descriptor {
    /// An empty descriptor; add entries with [`Descriptor::entry`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the entry `key=value` (an empty value matches a key-only rule).
    pub fn entry(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.entries.push((key.into(), value.into()));
        self
    }

    /// The cost of this descriptor alone, overriding the request's (Envoy's per-descriptor
    /// `hits_addend`; 0 is a zero-cost look).
    pub fn hits_addend(mut self, hits: u64) -> Self {
        self.hits_addend = Some(hits);
        self
    }

    /// The descriptor on the wire, costing `request_hits` unless it has a cost of its own.
    fn into_wire(self, request_hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: self
                .entries
                .into_iter()
                .map(|(key, value)| Entry {
                    key: key.into_bytes(),
                    value: value.into_bytes(),
                })
                .collect(),
            hits_addend: self.hits_addend.or(request_hits),
            ..Default::default()
        }
    }
}

/// One `ShouldRateLimit` call: a domain, at least one descriptor, and a cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitRequest {
    domain: String,
    descriptors: Vec<Descriptor>,
    hits_addend: u64,
}

impl RateLimitRequest {
    /// A request in `domain` (the `domain:` of a Sluice config file).
    pub fn new(domain: impl Into<String>) -> Self {
        Self {
            domain: domain.into(),
            ..Self::default()
        }
    }

    /// Adds a descriptor; each is judged on its own and the request is over when any is.
    pub fn descriptor(mut self, descriptor: Descriptor) -> Self {
        self.descriptors.push(descriptor);
        self
    }

    /// The cost of the request, charged to every descriptor without its own (0 means 1, as in
    /// Envoy). Above `u32::MAX` (the wire's request-level field) it is sent as the cost of
    /// each of those descriptors, which Sluice judges the same way.
    pub fn hits_addend(mut self, hits: u64) -> Self {
        self.hits_addend = hits;
        self
    }

    /// The message, or what Sluice would refuse as `INVALID_ARGUMENT`, said here instead.
    fn into_wire(self) -> Result<wire::RateLimitRequest, Error> {
        if self.domain.is_empty() {
            return Err(Error::invalid_request("the domain is empty"));
        }
        if self.descriptors.is_empty() {
            return Err(Error::invalid_request("a request needs a descriptor"));
        }
        if let Some(i) = self.descriptors.iter().position(|d| d.entries.is_empty()) {
            return Err(Error::invalid_request(format!(
                "descriptor {i} has no entry"
            )));
        }
        // A cost the request-level field cannot carry goes on the descriptors instead; there 0
        // would be a zero-cost look, but such a cost is never 0.
        let (request_hits, descriptor_hits) = match u32::try_from(self.hits_addend) {
            Ok(hits) => (hits, None),
            Err(_) => (0, Some(self.hits_addend)),
        };
        Ok(wire::RateLimitRequest {
            domain: self.domain.into_bytes(),
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| d.into_wire(descriptor_hits))
                .collect(),
            hits_addend: request_hits,
        })
    }
}

/// The unit of a limit's rate, as Sluice reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[allow(missing_docs)] // Each variant is its name.
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Its length in seconds (a month is 30 days and a year 365, as in Sluice's config).
    pub fn seconds(self) -> u64 {
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

    fn from_wire(unit: i32) -> Option<Unit> {
        Some(match WireUnit::try_from(unit).ok()? {
            WireUnit::Unknown => return None,
            WireUnit::Second => Unit::Second,
            WireUnit::Minute => Unit::Minute,
            WireUnit::Hour => Unit::Hour,
            WireUnit::Day => Unit::Day,
            WireUnit::Week => Unit::Week,
            WireUnit::Month => Unit::Month,
            WireUnit::Year => Unit::Year,
        })
    }
}

/// The limit a descriptor was judged by: `requests_per_unit` per `unit`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limit {
    /// The rule's `name` in the config; empty when it has none.
    pub name: String,
    /// Hits allowed per `unit`.
    pub requests_per_unit: u64,
    /// `None` for a unit this crate does not know.
    pub unit: Option<Unit>,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DescriptorDecision {
    /// Refused (`OVER_LIMIT`).
    pub over: bool,
    /// The limit that judged it; `None` when no rule matched (never limited).
    pub limit: Option<Limit>,
    /// What is left after this request (0 when over).
    pub remaining: u64,
    /// Time until the limit's window or bucket resets, in whole seconds as Sluice reports it.
    pub reset: Option<Duration>,
}

impl DescriptorDecision {
    fn from_wire(status: DescriptorStatus) -> Self {
        Self {
            over: status.code == Code::OverLimit as i32,
            limit: status.current_limit.map(|l| Limit {
                name: l.name,
                requests_per_unit: u64::from(l.requests_per_unit),
                unit: Unit::from_wire(l.unit),
            }),
            remaining: u64::from(status.limit_remaining),
            reset: status
                .duration_until_reset
                .and_then(|d| Duration::try_from(d).ok()),
        }
    }
}

/// Sluice's answer to a [`RateLimitRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Admitted (`OK`), or refused (`OVER_LIMIT`).
    pub allowed: bool,
    /// One per descriptor, in request order; empty when the failure policy answered.
    pub descriptors: Vec<DescriptorDecision>,
    /// Headers Sluice asks the caller to add to its response (`RateLimit-*` when
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`, the IETF draft's `RateLimit`/`RateLimit-Policy` when
    /// its draft headers are on), as `(name, value)`.
    pub response_headers: Vec<(String, String)>,
    /// Sluice, or the failure policy when Sluice could not answer.
    pub answered_by: AnsweredBy,
}

impl Decision {
    fn from_wire(response: wire::RateLimitResponse) -> Self {
        Self {
            allowed: response.overall_code != Code::OverLimit as i32,
            descriptors: response
                .statuses
                .into_iter()
                .map(DescriptorDecision::from_wire)
                .collect(),
            response_headers: response
                .response_headers_to_add
                .into_iter()
                .map(|h| (h.key, h.value))
                .collect(),
            answered_by: AnsweredBy::Sluice,
        }
    }

    fn failed_open(error: &Error) -> Self {
        Self {
            allowed: true,
            descriptors: Vec::new(),
            response_headers: Vec::new(),
            answered_by: AnsweredBy::FailurePolicy(error.to_string()),
        }
    }

    /// The descriptor the answer is about, as Sluice chooses it for its headers: the last one
    /// over the limit if any, else the limited one with the least remaining.
    pub fn deciding(&self) -> Option<&DescriptorDecision> {
        let limited = self.descriptors.iter().filter(|d| d.limit.is_some());
        match self.descriptors.iter().rev().find(|d| d.over) {
            Some(over) => Some(over),
            None => limited.min_by_key(|d| d.remaining),
        }
    }

    /// What is left under the tightest limit; `None` when nothing was limited.
    pub fn remaining(&self) -> Option<u64> {
        self.deciding().map(|d| d.remaining)
    }

    /// When a refused request may succeed: the latest reset among the refused descriptors
    /// (each must have reset). `None` when allowed.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed {
            return None;
        }
        self.descriptors
            .iter()
            .filter(|d| d.over)
            .filter_map(|d| d.reset)
            .max()
    }
}

impl Client {
    /// Asks Sluice whether `request` is within its limits, charging its cost when it is judged.
    ///
    /// Fails with [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) before sending
    /// an empty domain, no descriptor or a descriptor without entries. When Sluice cannot
    /// answer ([`Error::is_unanswered`]), the [`FailurePolicy`] decides: `Open` returns an
    /// allowed [`Decision`] answered by the policy, `Closed` the error.
    pub async fn should_rate_limit(&self, request: RateLimitRequest) -> Result<Decision, Error> {
        let message = request.into_wire()?;
        let deadline = self.deadline();
        let mut rls = self.rls.clone();
        let call = rls.should_rate_limit(self.request(message, deadline));
        match Client::call(deadline, call).await {
            Ok(response) => Ok(Decision::from_wire(response)),
            Err(error) if error.is_unanswered() && self.policy == FailurePolicy::Open => {
                Ok(Decision::failed_open(&error))
            }
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(request: RateLimitRequest) -> (u32, Vec<Option<u64>>) {
        let wire = request.into_wire().unwrap();
        let descriptors = wire.descriptors.iter().map(|d| d.hits_addend).collect();
        (wire.hits_addend, descriptors)
    }

    #[test]
    fn a_cost_above_the_request_field_goes_on_the_descriptors_without_their_own() {
        let two = |hits| {
            RateLimitRequest::new("api")
                .descriptor(Descriptor::new().entry("a", "1"))
                .descriptor(Descriptor::new().entry("b", "2").hits_addend(0))
                .hits_addend(hits)
        };
        assert_eq!(costs(two(7)), (7, vec![None, Some(0)]));
        let max = u64::from(u32::MAX);
        assert_eq!(costs(two(max)), (u32::MAX, vec![None, Some(0)]));
        assert_eq!(costs(two(max + 1)), (0, vec![Some(max + 1), Some(0)]));
        assert_eq!(costs(two(u64::MAX)), (0, vec![Some(u64::MAX), Some(0)]));
    }
}
