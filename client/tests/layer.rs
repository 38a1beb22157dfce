//! `RateLimitLayer` in front of real services (axum over HTTP/1.1, tonic over HTTP/2) asking a
//! real Sluice: admitted requests reach the service, refused ones get 429 with the IETF draft's
//! headers and `Retry-After`, or `RESOURCE_EXHAUSTED`, and each key has its own budget.

mod common;

use common::Sluice;
use common::services::{grpc_check, http_get, serve_grpc, serve_http, serve_hyper, statuses_of};
use sluice_client::key::{self, KeyExtractor};
use sluice_client::{FailurePolicy, RateLimitLayer};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_over_the_limit_is_429_with_the_limit_headers() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = RateLimitLayer::new(client, "client_test", "user", key::header("x-user"));
    let addr = serve_http(layer).await;

    // `user` allows 2 per day (common::CONFIG).
    for _ in 0..2 {
        assert_eq!(http_get(addr, &[("x-user", "alice")]).await.status, 200);
    }
    let refused = http_get(addr, &[("x-user", "alice")]).await;
    assert_eq!(refused.status, 429);
    let header = |name: &str| refused.headers.get(name).cloned().unwrap_or_default();
    assert_eq!(header("ratelimit-policy"), "\"per_user\";q=2;w=86400");
    let limit = header("ratelimit");
    assert!(limit.starts_with("\"per_user\";r=0;t="), "{limit}");
    let reset: u64 = limit.rsplit('=').next().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&reset), "{limit}");
    let retry_after: u64 = header("retry-after").parse().unwrap();
    assert_eq!(
        retry_after, reset,
        "Retry-After is the refused limit's reset"
    );

    // Another key has its own budget (a request without the header: tests/keys.rs).
    assert_eq!(http_get(addr, &[("x-user", "bob")]).await.status, 200);
    // A value that is not UTF-8 is a key like any other, not a way around the limit.
    let statuses = statuses_of(addr, b"x-user: caf\xe9\r\n", 3).await;
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_address_can_be_the_key() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    // Fall back to the peer when the header is missing; `peer` allows 2 per day.
    let key = key::header("x-peer").or(key::peer_ip());
    let layer = RateLimitLayer::new(client, "client_test", "peer", key);
    let addr = serve_http(layer).await;

    let statuses = statuses_of(addr, b"", 3).await;
    assert_eq!(statuses, [200, 200, 429]);
    // An explicit header value is another key.
    assert_eq!(http_get(addr, &[("x-peer", "elsewhere")]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_hyper_service_is_limited_too() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = RateLimitLayer::new(client, "client_test", "peer", key::peer_ip());
    let addr = serve_hyper(layer).await;

    assert_eq!(statuses_of(addr, b"", 3).await, [200, 200, 429]);
    let refused = http_get(addr, &[]).await;
    assert_eq!(
        refused.headers["ratelimit-policy"],
        "\"default\";q=2;w=86400"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_the_limit_is_resource_exhausted() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    // gRPC metadata is an HTTP/2 header.
    let layer = RateLimitLayer::new(client, "client_test", "user", key::header("x-user"));
    let addr = serve_grpc(layer).await;

    for _ in 0..2 {
        grpc_check(addr, Some("carol")).await.unwrap();
    }
    let refused = grpc_check(addr, Some("carol")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let policy = refused.metadata().get("ratelimit-policy").unwrap();
    assert_eq!(policy, "\"per_user\";q=2;w=86400");
    assert!(refused.metadata().get("retry-after").is_some());
    grpc_check(addr, Some("dave")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_method_can_be_the_key() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = RateLimitLayer::new(client, "client_test", "user", key::method_path());
    let addr = serve_grpc(layer).await;

    // Every caller of /grpc.health.v1.Health/Check shares one budget of 2.
    grpc_check(addr, Some("erin")).await.unwrap();
    grpc_check(addr, None).await.unwrap();
    let refused = grpc_check(addr, Some("frank")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
}
