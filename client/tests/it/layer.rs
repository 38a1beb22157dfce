//! `SluiceLayer` in front of real services (axum over HTTP/1.1, tonic over HTTP/2) asking a
//! real Sluice: admitted requests reach the service, refused ones get 429 with the IETF draft's
//! headers and `Retry-After`, or `RESOURCE_EXHAUSTED`, and each key has its own budget; a
//! descriptor of several entries reaches a nested rule, and a request costs what the layer says.

use crate::common;

use crate::services::{grpc_check, http_get, serve_grpc, serve_http, serve_hyper, statuses_of};
use common::Sluice;
use sluice_client::key::{self, KeyExtractor};
use sluice_client::{Descriptor, FailurePolicy, RateLimitRequest, SluiceLayer};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_over_the_limit_is_429_with_the_limit_headers() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = SluiceLayer::builder(client, "client_test")
        .key("user", key::header("x-user"))
        .build();
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
    let layer = SluiceLayer::builder(client, "client_test")
        .key("peer", key)
        .build();
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
    let layer = SluiceLayer::builder(client, "client_test")
        .key("peer", key::peer_ip())
        .build();
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
    let layer = SluiceLayer::builder(client, "client_test")
        .key("user", key::header("x-user"))
        .build();
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
    let layer = SluiceLayer::builder(client, "client_test")
        .key("user", key::method_path())
        .build();
    let addr = serve_grpc(layer).await;

    // Every caller of /grpc.health.v1.Health/Check shares one budget of 2.
    grpc_check(addr, Some("erin")).await.unwrap();
    grpc_check(addr, None).await.unwrap();
    let refused = grpc_check(addr, Some("frank")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
}

/// `service=orders`, then the user: the nested rule `orders_per_user` (3 per day), each request
/// charged what its `x-cost` header says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_in_order_reach_a_nested_rule_and_requests_cost_what_the_layer_reads() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let cost = |head: &http::request::Parts| {
        let header = head.headers.get("x-cost").and_then(|v| v.to_str().ok());
        header.and_then(|v| v.parse().ok()).unwrap_or(1)
    };
    let layer = SluiceLayer::builder(client, "client_test")
        .entry("service", "orders")
        .key("user", key::header("x-user"))
        .hits_from(cost)
        .build();
    let addr = serve_http(layer).await;

    let get = |cost: &'static str| async move {
        http_get(addr, &[("x-user", "gina"), ("x-cost", cost)]).await
    };
    assert_eq!(get("2").await.status, 200);
    assert_eq!(get("1").await.status, 200);
    let refused = get("1").await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.headers["ratelimit-policy"],
        "\"orders_per_user\";q=3;w=86400"
    );
    // Another user's budget is whole, but not large enough for 4 at once.
    let headers = [("x-user", "hal"), ("x-cost", "4")];
    assert_eq!(http_get(addr, &headers).await.status, 429);
}

/// A cost beyond the request-level field of RLS (`uint32`) is judged whole: 2^32 hits against
/// `user`'s 2 is over, where a cut to 32 bits (0, which counts as 1) would pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_beyond_32_bits_is_judged_whole() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let beyond = u64::from(u32::MAX) + 1;
    let request = RateLimitRequest::new("client_test")
        .descriptor(Descriptor::new().entry("user", "ivan"))
        .hits_addend(beyond);
    let decision = client.should_rate_limit(request).await.unwrap();
    assert!(!decision.allowed, "{decision:?}");

    let layer = SluiceLayer::builder(client, "client_test")
        .key("user", key::header("x-user"))
        .hits(beyond)
        .build();
    let addr = serve_http(layer).await;
    assert_eq!(http_get(addr, &[("x-user", "judy")]).await.status, 429);
}
