//! What requests are limited by, through `SluiceLayer` in front of real services asking a
//! real Sluice: IPv6 callers keyed by their /64 (from the peer address and from the addresses
//! proxies forward), and keys that cannot be found refused instead of passed unlimited (a
//! missing header, a server that records no peer address). Keying on what authentication
//! proved gives a caller one budget however many keys it sends.

use crate::common;

use crate::services::{
    User, grpc_check, http_get, serve_authenticated, serve_axum, serve_grpc, serve_http,
    statuses_of,
};
use common::Sluice;
use sluice_client::key::{self, KeyExtractor};
use sluice_client::{FailurePolicy, SluiceLayer};
use tonic::Code;

/// `peer` allows 2 per day (common::CONFIG): two requests pass, the third is 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_addresses_in_one_64_share_one_budget() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = SluiceLayer::builder(client, "client_test")
        .key("peer", key::x_forwarded_for(1))
        .build();
    let addr = serve_http(layer).await;
    let status = |list: &'static str| async move {
        http_get(addr, &[("x-forwarded-for", list)]).await.status
    };

    // Two hosts of one /64 (behind a made-up leftmost entry each), then a third.
    assert_eq!(status("198.51.100.1, 2001:db8:1:2::1").await, 200);
    assert_eq!(
        status("203.0.113.50, 2001:db8:1:2:ffff:ffff:ffff:ffff").await,
        200
    );
    assert_eq!(status("2001:db8:1:2::99").await, 429);
    // The next /64 is another budget.
    assert_eq!(status("2001:db8:1:3::1").await, 200);

    // `Forwarded` through the same layer's domain: bracketed, with a port, the same rule.
    let layer = SluiceLayer::builder(sluice.client(FailurePolicy::Closed).await, "client_test")
        .key("peer", key::forwarded(1))
        .build();
    let addr = serve_http(layer).await;
    let forwarded =
        |value: &'static str| async move { http_get(addr, &[("forwarded", value)]).await.status };
    assert_eq!(forwarded("for=\"[2001:db8:1:3::2]:4711\"").await, 200);
    assert_eq!(
        forwarded("for=192.0.2.1, for=\"[2001:db8:1:3::3]\"").await,
        429
    );
}

/// The peer address itself: a request over IPv6 loopback is charged to `::/64`, whose rule in
/// common::CONFIG allows 1 (the full address `::1` would fall under `peer`'s 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_peer_is_charged_to_its_64() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = SluiceLayer::builder(client, "client_test")
        .key("peer", key::peer_ip())
        .build();
    let addr = serve_axum(layer, "[::1]:0", true).await;

    assert_eq!(statuses_of(addr, b"", 2).await, [200, 429]);
    let refused = http_get(addr, &[]).await;
    assert_eq!(
        refused.headers["ratelimit-policy"],
        "\"loopback_64\";q=1;w=86400"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_connect_info_refuses_instead_of_passing_unlimited() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = SluiceLayer::builder(client, "client_test")
        .key("peer", key::peer_ip())
        .build();
    // `axum::serve(listener, app)`: no peer address in any request.
    let addr = serve_axum(layer, "127.0.0.1:0", false).await;

    // Far past the limit of 2: every request is refused, none reaches the service.
    assert_eq!(statuses_of(addr, b"", 4).await, [500; 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_its_key_header_is_refused_not_unlimited() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = SluiceLayer::builder(client.clone(), "client_test")
        .key("user", key::header("x-user"))
        .build();
    let addr = serve_http(layer).await;
    assert_eq!(statuses_of(addr, b"", 4).await, [400; 4]);
    // With the header, the limit of 2 applies as before.
    assert_eq!(
        statuses_of(addr, b"x-user: erin\r\n", 3).await,
        [200, 200, 429]
    );

    // gRPC: the reason travels as the status message.
    let layer = SluiceLayer::builder(client.clone(), "client_test")
        .key("user", key::header("x-user"))
        .build();
    let grpc = serve_grpc(layer).await;
    let refused = grpc_check(grpc, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(refused.message(), "the request has no x-user header");

    // Passing such requests unlimited is a choice made in so many words.
    let lenient = key::header("x-user").or(key::exempt());
    let layer = SluiceLayer::builder(client, "client_test")
        .key("user", lenient)
        .build();
    let addr = serve_http(layer).await;
    assert_eq!(statuses_of(addr, b"", 4).await, [200; 4]);
}

/// Behind authentication, a caller's budget is its identity's: alice's two API keys share
/// one budget of 2, and made-up keys are refused before Sluice is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_on_the_authenticated_user_many_api_keys_are_one_budget() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let layer = SluiceLayer::builder(client, "client_test")
        .key("user", key::extension::<User>())
        .build();
    let addr = serve_authenticated(layer).await;
    let status = |api_key: &'static str| async move {
        http_get(addr, &[("x-api-key", api_key)]).await.status
    };

    assert_eq!(status("key-alice-1").await, 200);
    assert_eq!(status("key-alice-2").await, 200);
    assert_eq!(status("key-alice-1").await, 429);
    assert_eq!(status("key-alice-2").await, 429);
    for made_up in ["k1", "k2", "k3"] {
        assert_eq!(status(made_up).await, 401);
    }
    assert_eq!(status("key-bob").await, 200);
}
