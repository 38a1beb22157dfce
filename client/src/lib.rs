//! A Rust client for Sluice, the Envoy-compatible rate limit service: typed calls to both of
//! its APIs, and a [`tower`](https://docs.rs/tower) layer that limits any tonic, axum or hyper
//! service with limits shared by all of its replicas.
//!
//! - [`Client`]: one gRPC channel shared by every call and clone, a deadline on each call (sent
//!   as `grpc-timeout` and enforced here), and a [`FailurePolicy`] for when Sluice cannot answer.
//! - Envoy's API, [`Client::should_rate_limit`]: a [`RateLimitRequest`] of [`Descriptor`]s
//!   matched against Sluice's config, answered by a [`Decision`].
//! - Sluice's native API (named limiters, no config file; served with
//!   `LIMITER_API_ENABLED=true`): [`Client::set_rate`], [`Client::try_acquire`],
//!   [`Client::acquire`], [`Client::available_permits`], [`Client::release`] (a
//!   `CONCURRENCY` limiter's lease), failing with a [`LimiterError`].
//! - [`SluiceLayer`], a tower layer in tower's shape (`SluiceLayer` builds the service
//!   [`Sluice`]), set up with [`SluiceLayer::builder`]: one RLS call per request, its
//!   descriptor's entries read from the request ([`key::extension`] for the identity an
//!   authentication layer proved, [`key::peer_ip`], [`key::x_forwarded_for`] /
//!   [`key::forwarded`] behind proxies of your own, [`key::method_path`], [`key::header`], or
//!   any closure); refuses with `429` and `RateLimit`/`Retry-After` headers, or
//!   `RESOURCE_EXHAUSTED` for gRPC.
//! - [`SluiceLeaseLayer`] (builds [`SluiceLease`]): at most N requests in flight across the
//!   fleet, a lease of a native API `CONCURRENCY` limiter held until the response body ends.
//!
//! The layer fails closed on keys: a request whose key cannot be found (a header absent, no
//! peer address recorded) is refused, never passed unlimited ([`key::Key::Missing`]). IPv6
//! addresses are keyed by their /64, so one host cannot rotate through fresh budgets. See the
//! [`key`] module for which key to choose, and [`SluiceLayer`] for where to put the layer
//! (after authentication).
//!
//! Errors are the crate's own: an [`Error`] has an [`ErrorKind`], the [`GrpcCode`] Sluice
//! answered and its message; no tonic type is part of it. Every count of hits is a `u64`.
//!
//! # Quick start
//!
//! Ask about one descriptor (Sluice running on `127.0.0.1:8081` with a config for the domain
//! `api`):
//!
//! ```no_run
//! use std::time::Duration;
//! use sluice_client::{Client, Descriptor, FailurePolicy, RateLimitRequest};
//!
//! # async fn run() -> Result<(), sluice_client::Error> {
//! let client = Client::builder()
//!     .deadline(Duration::from_millis(200))
//!     .failure_policy(FailurePolicy::Closed)
//!     .connect("http://127.0.0.1:8081")
//!     .await?;
//! let decision = client
//!     .should_rate_limit(
//!         RateLimitRequest::new("api").descriptor(Descriptor::new().entry("user", "alice")),
//!     )
//!     .await?;
//! if !decision.allowed {
//!     println!("over the limit; retry in {:?}", decision.retry_after());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Limit an axum service by the caller's address (its /64 for IPv6), which the server records
//! only when served with connect info:
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use sluice_client::{Client, SluiceLayer, key};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder().connect_lazy("http://127.0.0.1:8081")?;
//! let limit = SluiceLayer::builder(client, "api")
//!     .key("remote_address", key::peer_ip())
//!     .build();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(limit);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! To limit each user, put the layer after authentication and key on the identity it proved
//! ([`SluiceLayer`] shows the layer order, `examples/limited_axum.rs` a whole service).
//!
//! The same layer goes on a tonic server (`Server::builder().layer(...)`), where
//! [`key::header`] reads gRPC metadata and [`key::method_path`] the method.
//!
//! # Failures
//!
//! Every call ends by its deadline ([`ClientBuilder::deadline`], 500 ms unless set). When Sluice
//! cannot answer (down, `UNAVAILABLE`, deadline passed), [`FailurePolicy::Open`] (the default,
//! as Envoy's) admits and marks the answer [`AnsweredBy::FailurePolicy`];
//! [`FailurePolicy::Closed`] returns the [`Error`], and the layer answers 503 / `UNAVAILABLE`
//! (a layer can set a policy of its own: [`SluiceLayerBuilder::failure_policy`]).
//!
//! # Features
//!
//! - `axum` (on by default): [`key::peer_ip`] reads the peer address axum records
//!   (`ConnectInfo`). Off, the crate does not depend on axum; `peer_ip` still reads tonic's
//!   record and a [`key::PeerAddr`] the service inserts itself.

// Every public item is documented: the crate's users read it on docs.rs, not in the source.
#![deny(missing_docs)]

mod client;
mod error;
pub mod layer;
pub mod limiter;
pub mod rls;

/// The generated protocol types and client stubs (the `sluice-proto` crate, shared with the
/// service). Most users never need it: [`Client`] speaks in the crate's own types. It is
/// public for the rare field the typed API does not carry (`RateLimitRequest`'s descriptor
/// overrides, say). The RLS `domain` and descriptor entries are bytes there.
pub use sluice_proto as proto;

// The README's examples are compiled as doc tests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

pub use client::{AnsweredBy, Client, ClientBuilder, DEFAULT_DEADLINE, FailurePolicy};
pub use error::{Error, ErrorKind, GrpcCode};
pub use layer::key;
pub use layer::{
    LeaseBody, Sluice, SluiceLayer, SluiceLayerBuilder, SluiceLease, SluiceLeaseLayer,
    SluiceLeaseLayerBuilder,
};
pub use limiter::{Acquired, LimiterConfig, LimiterError, RateSet, Released};
pub use rls::{Decision, Descriptor, DescriptorDecision, RateLimitRequest};
