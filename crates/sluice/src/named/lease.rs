//! Leases of the native API's `CONCURRENCY` limiters: the lease id an acquisition answers, and
//! `Release`, which gives the leases back.
//!
//! A concurrency limiter's state is counters by expiry, not one entry per lease
//! (docs/decisions/0038-concurrency-leases-as-counters-by-expiry.md), so a lease id names the
//! counter its leases were added to, the expiry step, and how many it took: `L1.<step>.<permits>`.
//! A release gives back at most those permits from that one step, and nothing once the step
//! has expired. Nothing in the id is secret or signed; what a forged or repeated id can do is
//! bounded by what it names (docs/native-api-and-client.md, "Leases", and SECURITY.md): only
//! the named limiter's leases (a per-client limiter's: only the named client's), only those of
//! one step, at most the permits written in it, and only while that step is live, which a
//! limiter's own holders share. Every caller of the API already holds the token that can delete
//! or reset the limiter, so a signature would guard nothing the token does not.

use std::fmt;

use super::{Acquisition, MAX_PERMITS, NamedError, NamedLimiters, check_name};
use crate::store::{Call, Lease, Release};

/// The version tag of the lease id's text: another format would take another tag.
const TAG: &str = "L1";

/// Longest lease id accepted, in bytes: the tag and two `u64`s with their dots.
pub const MAX_LEASE_ID_BYTES: usize = 64;

/// What one acquisition of a concurrency limiter took: the expiry step its leases were counted
/// in and how many. Its text (`Display`, [`LeaseId::parse`]) is the API's `lease_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseId {
    /// When the leases expire if never given back (microseconds on the store's clock).
    pub expiry: u64,
    /// How many leases the acquisition took.
    pub permits: u64,
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TAG}.{}.{}", self.expiry, self.permits)
    }
}

impl LeaseId {
    /// Reads a lease id as [`Display`](fmt::Display) writes it; anything else is
    /// [`NamedError::Invalid`], never a lease.
    pub fn parse(text: &str) -> Result<Self, NamedError> {
        let invalid = || {
            NamedError::Invalid(format!(
                "lease_id must be an id an acquisition answered ({TAG}.<expiry>.<permits>)"
            ))
        };
        if text.len() > MAX_LEASE_ID_BYTES {
            return Err(invalid());
        }
        let mut parts = text.split('.');
        let (Some(TAG), Some(expiry), Some(permits), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        // Digits only: `u64::from_str` would also take a leading '+'.
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        match (number(expiry), number(permits)) {
            (Some(expiry), Some(permits)) if (1..=MAX_PERMITS).contains(&permits) => {
                Ok(Self { expiry, permits })
            }
            _ => Err(invalid()),
        }
    }

    /// The lease of an acquisition's answer, when it granted a concurrency limiter's permits.
    pub(super) fn of(acquisition: &Acquisition, permits: u64) -> Option<Self> {
        match acquisition {
            Acquisition::Decided {
                lease: Some(expiry),
                ..
            } => Some(Self {
                expiry: *expiry,
                permits,
            }),
            _ => None,
        }
    }
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Leases given back: 0 when the lease had expired, was released already, or named a step
    /// holding none.
    pub given_back: u64,
    /// Leases that could be taken now.
    pub remaining: u64,
}

impl NamedLimiters {
    /// Gives back the leases `lease_id` names to the concurrency limiter `name` (for a
    /// per-client limiter, `client`'s budget): see the module doc for what an id can give back.
    pub async fn release(
        &self,
        call: Call<'_>,
        name: &str,
        client: &str,
        lease_id: &str,
    ) -> Result<Released, NamedError> {
        check_name(name)?;
        let lease = LeaseId::parse(lease_id)?;
        let client = (!client.is_empty()).then_some(client);
        let keys = self.keys.limiter(name, client);
        let lease = Lease {
            expiry: lease.expiry,
            permits: lease.permits,
        };
        match self.store.release(call, &keys, lease).await? {
            Release::NoSuchLimiter => Err(NamedError::NotFound(name.to_string())),
            Release::NeedsClient => Err(NamedError::NeedsClient(name.to_string())),
            Release::NotLeases => Err(NamedError::Invalid(format!(
                "limiter {name:?} is not a concurrency limiter: it holds no leases to release"
            ))),
            Release::Released {
                given_back,
                remaining,
            } => Ok(Released {
                given_back,
                remaining,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_id_reads_back_and_nothing_else_reads() {
        let id = LeaseId {
            expiry: 1_764_000_000_123_456,
            permits: 3,
        };
        assert_eq!(LeaseId::parse(&id.to_string()).unwrap(), id);
        for bad in [
            "",
            "L1",
            "L1.1",
            "L1.1.0",
            "L1.1.2.3",
            "L2.1.1",
            "L1.+1.1",
            "L1.1.+1",
            "L1.-1.1",
            "L1.18446744073709551616.1",
            "L1.1.4294967296",
            "L1. 1.1",
        ] {
            assert!(LeaseId::parse(bad).is_err(), "{bad:?} was read");
        }
        assert!(LeaseId::parse(&format!("L1.{}.1", "1".repeat(70))).is_err());
    }
}
