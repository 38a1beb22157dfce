//! The quota service on the memory store with a hand-driven clock: what each kind of bucket is
//! told, a spent window, a reload that removes a limit, the bounds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::config::{LoadOptions, load_sources};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::rls::{KeyBuilder, RlsOptions};
use crate::store::{MemoryStore, MemoryStoreOptions};

const CONFIG: &str = r#"
domain: rlqs
descriptors:
  - key: tenant
    value: a
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: tenant
    value: m
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    value: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    value: u
    rate_limit: {unlimited: true}
"#;

fn load(yaml: &str) -> Arc<crate::config::RateLimitConfig> {
    let sources = vec![(PathBuf::from("test.yaml"), yaml.to_string())];
    Arc::new(load_sources(sources, &LoadOptions::default()).unwrap())
}

fn server(options: RlqsOptions) -> (Arc<QuotaServer>, Arc<RateLimiter>) {
    // 1 000 030 s: 10 s into the minute window that starts at 1 000 020.
    let clock = Arc::new(ManualClock::new(1_000_030_000_000));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    let limiter = Arc::new(RateLimiter::new(
        store,
        KeyBuilder::default(),
        clock,
        RlsOptions::default(),
    ));
    limiter.set_config(load(CONFIG));
    (
        Arc::new(QuotaServer::new(limiter.clone(), options)),
        limiter,
    )
}

fn report(tenant: &str, allowed: u64, denied: u64) -> RateLimitQuotaUsageReports {
    let mut bucket = BTreeMap::new();
    bucket.insert("tenant".to_string(), tenant.as_bytes().to_vec());
    RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }],
    }
}

/// The one action of a response: the strategy, or `None` for an abandon.
fn strategy(response: Option<RateLimitQuotaResponse>) -> Option<Strategy> {
    let response = response.expect("an answer");
    assert_eq!(response.bucket_action.len(), 1);
    match response.bucket_action[0].bucket_action.clone().unwrap() {
        Action::QuotaAssignmentAction(a) => a.rate_limit_strategy.unwrap().strategy,
        Action::AbandonAction(_) => None,
    }
}

fn blanket(rule: BlanketRule) -> Option<Strategy> {
    Some(Strategy::BlanketRule(rule as i32))
}

#[tokio::test]
async fn each_kind_of_bucket_gets_its_action() {
    let (server, _) = server(RlqsOptions::default());
    let mut stream = server.open_stream().unwrap();
    let limited = strategy(stream.report(report("a", 1, 0)).await);
    let Some(Strategy::TokenBucket(b)) = limited else {
        panic!("{limited:?}")
    };
    // Alone with all the demand: the whole 20/s, as 200 per 10 s.
    assert_eq!(b.tokens_per_fill, Some(200));
    for free in ["nobody", "u", "s"] {
        let got = strategy(stream.report(report(free, 1, 0)).await);
        assert_eq!(got, blanket(BlanketRule::AllowAll), "{free}");
    }
    assert_eq!(stream.domain(), Some("rlqs"));
    assert_eq!(stream.bucket_count(), 4);
}

#[tokio::test]
async fn a_spent_window_is_denied_until_it_ends() {
    let (server, _) = server(RlqsOptions::default());
    let mut stream = server.open_stream().unwrap();
    let first = strategy(stream.report(report("m", 1, 0)).await);
    assert!(matches!(first, Some(Strategy::TokenBucket(_))), "{first:?}");
    assert!(stream.next_push().is_none());
    // 11 of the minute's 10: spent, 50 s before the window ends.
    let spent = strategy(stream.report(report("m", 10, 0)).await);
    assert_eq!(spent, blanket(BlanketRule::DenyAll));
    let push = stream
        .next_push()
        .expect("the share comes back at the window's end");
    assert!(push > std::time::Instant::now() + std::time::Duration::from_secs(40));
    let again = stream.pushes_due(push);
    assert!(matches!(strategy(again), Some(Strategy::TokenBucket(_))));
}

#[tokio::test]
async fn a_limit_removed_by_a_reload_abandons_its_bucket() {
    let (server, limiter) = server(RlqsOptions::default());
    let mut stream = server.open_stream().unwrap();
    assert!(matches!(
        strategy(stream.report(report("a", 1, 0)).await),
        Some(Strategy::TokenBucket(_))
    ));
    limiter.set_config(load("domain: rlqs\ndescriptors: []\n"));
    assert_eq!(strategy(stream.report(report("a", 1, 0)).await), None);
    assert_eq!(stream.bucket_count(), 0);
    // Envoy starts it again: now it has no limit.
    let again = strategy(stream.report(report("a", 1, 0)).await);
    assert_eq!(again, blanket(BlanketRule::AllowAll));
}

#[tokio::test]
async fn streams_and_buckets_are_bounded() {
    let options = RlqsOptions {
        max_streams: 1,
        max_buckets_per_stream: 2,
        ..RlqsOptions::default()
    };
    let (server, _) = server(options);
    let mut stream = server.open_stream().unwrap();
    assert!(matches!(
        server.open_stream(),
        Err(RlqsError::TooManyStreams(1))
    ));
    assert!(stream.report(report("x", 1, 0)).await.is_some());
    assert!(stream.report(report("y", 1, 0)).await.is_some());
    assert!(stream.report(report("z", 1, 0)).await.is_none());
    assert_eq!(stream.bucket_count(), 2);
    drop(stream);
    assert_eq!(server.open_streams(), 0);
    assert!(server.open_stream().is_ok());
}
