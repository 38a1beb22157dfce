//! What an RLQS bucket is judged under: its id (a map of strings) read as one RLS descriptor,
//! the entries in key order, matched in the domain's tree like any descriptor (exact values,
//! then wildcards in file order, then the key-only default), and which of the matched limits the
//! assignment follows. The rule is written down in docs/decisions/0039-rlqs.md.

use crate::config::{Domain, Limit, Quota};
use crate::proto::DescriptorEntry;
use crate::proto::envoy::service::rate_limit_quota::v3::BucketId;

/// A bucket id's entries in key order: the descriptor it is counted under. The map is a
/// `BTreeMap` (`sluice-proto`'s `build.rs`), so its order is the keys' byte order.
pub(crate) fn entries(id: &BucketId) -> Vec<DescriptorEntry> {
    id.bucket
        .iter()
        .map(|(key, value)| DescriptorEntry {
            key: key.as_bytes().to_vec(),
            value: value.clone(),
        })
        .collect()
}

/// What the configuration says of one bucket.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Judged<'c> {
    /// No limit: an unknown domain, a descriptor that matches nothing or only a node without a
    /// `rate_limit`. Answered `ALLOW_ALL`.
    NoLimit,
    /// `unlimited: true` among its limits, as RLS answers it: `ALLOW_ALL`, nothing counted.
    Unlimited,
    /// Counted under its limits; the assignment follows `tightest`, the one with the smallest
    /// rate. `shadow` when every counted limit is in `shadow_mode`: counted, and answered
    /// `ALLOW_ALL`.
    Limited {
        /// The limit whose rate the share divides.
        tightest: &'c Limit,
        /// Its `requests_per_unit`.
        requests_per_unit: u64,
        /// Its window in seconds (`unit × unit_multiplier`).
        window_secs: u64,
        /// Every counted limit is in shadow mode.
        shadow: bool,
    },
}

/// Judges a bucket's `entries` in `domain` (`None`: the stream's domain is not configured).
pub(crate) fn judge<'c>(domain: Option<&'c Domain>, entries: &[DescriptorEntry]) -> Judged<'c> {
    let Some(domain) = domain else {
        return Judged::NoLimit;
    };
    let limits = domain.find_all(entries);
    if limits.iter().any(|l| l.quota == Quota::Unlimited) {
        return Judged::Unlimited;
    }
    let rate = |l: &'c Limit| match l.quota {
        Quota::PerUnit {
            requests_per_unit, ..
        } => {
            let window = l.quota.window_secs().unwrap_or(1).max(1);
            Some((f64::from(requests_per_unit) / window as f64, l, window))
        }
        Quota::Unlimited => None,
    };
    let counted: Vec<(f64, &Limit, u64)> = limits.iter().filter_map(rate).collect();
    let Some(&(_, tightest, window_secs)) = counted.iter().min_by(|a, b| a.0.total_cmp(&b.0))
    else {
        return Judged::NoLimit;
    };
    let Quota::PerUnit {
        requests_per_unit, ..
    } = tightest.quota
    else {
        return Judged::NoLimit;
    };
    Judged::Limited {
        tightest,
        requests_per_unit: u64::from(requests_per_unit),
        window_secs,
        shadow: counted.iter().all(|(_, l, _)| l.shadow_mode),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn entries_come_in_key_order() {
        let mut bucket = BTreeMap::new();
        bucket.insert("tenant".to_string(), b"a".to_vec());
        bucket.insert("api".to_string(), b"x".to_vec());
        let e = entries(&BucketId { bucket });
        let keys: Vec<&[u8]> = e.iter().map(|e| e.key.as_slice()).collect();
        assert_eq!(keys, [b"api".as_slice(), b"tenant".as_slice()]);
    }

    #[test]
    fn no_domain_is_no_limit() {
        assert_eq!(judge(None, &[]), Judged::NoLimit);
    }
}
