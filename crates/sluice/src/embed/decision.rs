//! [`Decision`]: the answer to one [`Limiter::check`](crate::Limiter::check), read from the
//! Envoy response the decision path built (`rls::RateLimiter::should_rate_limit`), so that a
//! caller of the façade never handles the protocol's types.

use std::time::Duration;

use crate::config::Unit;
use crate::proto::{Code, CurrentLimit, RateLimitResponse};

/// Whether a request may go ahead, and what the limit that judged it says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Admitted. `false` means refused: the hits were not admitted (a fixed window still counts
    /// them, as upstream's does; docs/algorithms.md says which limits do).
    pub allowed: bool,
    /// The limit that judged the request; `None` when no limit applies (no descriptor of the
    /// domain matched, or it is `unlimited`), or when the request was refused unjudged for
    /// exceeding the input bounds ([`rls::InputLimits`](crate::rls::InputLimits)).
    pub limit: Option<AppliedLimit>,
    /// What the limit can still admit after this request (0 when refused); `None` without a
    /// limit.
    pub remaining: Option<u64>,
    /// Refused: how long until the same request would be admitted. Admitted: how long until the
    /// limit is whole again (a fixed window: its end). In whole seconds, rounded up, as Envoy's
    /// protocol carries it; `None` without a limit.
    pub reset_after: Option<Duration>,
}

impl Decision {
    /// How long a refused caller should wait before trying again (for `Retry-After`); `None`
    /// when the request was admitted, or refused by no limit that resets.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed { None } else { self.reset_after }
    }

    /// The decision for the one descriptor of `response`.
    pub(super) fn from_response(response: &RateLimitResponse) -> Decision {
        let allowed = response.overall_code != Code::OverLimit as i32;
        let Some(status) = response.statuses.first() else {
            // A request with one descriptor gets one status; nothing to read otherwise.
            return Decision::without_limit(allowed);
        };
        let limit = status
            .current_limit
            .as_ref()
            .and_then(AppliedLimit::from_current);
        if limit.is_none() {
            return Decision::without_limit(allowed);
        }
        Decision {
            allowed,
            limit,
            remaining: Some(u64::from(status.limit_remaining)),
            reset_after: status
                .duration_until_reset
                .and_then(|d| Duration::try_from(d).ok()),
        }
    }

    fn without_limit(allowed: bool) -> Decision {
        Decision {
            allowed,
            limit: None,
            remaining: None,
            reset_after: None,
        }
    }
}

/// The limit that judged a request, as Envoy's protocol describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppliedLimit {
    /// The limit's `name` in the configuration; empty when it has none.
    pub name: String,
    /// `requests_per_unit` of the configuration.
    pub requests_per_unit: u32,
    /// The unit of the window (a `unit_multiplier` is not carried: the window may be several
    /// of these).
    pub unit: Unit,
}

impl AppliedLimit {
    /// Read from the response's `current_limit`; `None` for a unit no [`Unit`] answers to,
    /// which the decision path never writes (it writes [`Unit::to_response`]).
    fn from_current(current: &CurrentLimit) -> Option<AppliedLimit> {
        let unit = Unit::ALL
            .into_iter()
            .find(|u| u.to_response() as i32 == current.unit)?;
        Some(AppliedLimit {
            name: current.name.clone(),
            requests_per_unit: current.requests_per_unit,
            unit,
        })
    }
}
