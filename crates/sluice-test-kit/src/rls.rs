//! Envoy's rate limit API (RLS v3) from the tests' side: requests and descriptors built from
//! string pairs, one call, the fixed-window check the service builds, and a wait past a window's
//! edge for tests that must stay inside one window.

use std::time::Duration;

use sluice::proto::{
    DescriptorEntry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
    RateLimitServiceClient,
};
use tonic::transport::Channel;

/// A fixed-window check as the service builds it: the key names the window that `now_micros`
/// falls in, by the store's own window arithmetic (`store::window_start`).
pub fn fixed_window_check(
    key: &str,
    hits: u64,
    limit: u64,
    window_secs: u64,
    now_micros: u64,
) -> sluice::store::Check {
    let window_start = sluice::store::window_start(now_micros / 1_000_000, window_secs);
    sluice::store::Check {
        key: format!("{key}_{window_start}"),
        hits,
        rule: sluice::store::Rule::FixedWindow {
            limit,
            window_secs,
            window_start,
        },
        record_refused: false,
        group: None,
    }
}

pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| DescriptorEntry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// The call most tests make: one hit of user `alice` in domain `app`.
pub fn alice() -> RateLimitRequest {
    request("app", vec![descriptor(&[("user", "alice")])])
}

pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(req).await.unwrap().into_inner()
}

/// Sleeps past the next window boundary when fewer than `margin` seconds are left in the
/// current window, so a test that must stay inside one window does.
pub async fn avoid_window_edge(window_secs: u64, margin: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = window_secs - now % window_secs;
    if left < margin {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}
