//! An axum service limited by Sluice: every request is charged to its peer address
//! (`remote_address` in the domain `example`, 100 per minute in `examples/config`), shared by
//! every replica of the service that asks the same Sluice.
//!
//! Run Sluice (`cargo run -- serve --config-dir examples/config`), then
//! `cargo run -p sluice-client --example limited_axum -- http://127.0.0.1:8081`, and call it:
//! `curl -i http://127.0.0.1:3000/` (the 101st call within a minute gets 429 with `RateLimit`,
//! `RateLimit-Policy` and `Retry-After`). With Sluice stopped, the service keeps answering
//! (fail-open); pass `closed` as a second argument to answer 503 instead.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use sluice_client::{Client, FailurePolicy, RateLimitLayer, key};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sluice = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let policy = match args.next().as_deref() {
        Some("closed") => FailurePolicy::Closed,
        _ => FailurePolicy::Open,
    };

    // Lazy: the service starts even while Sluice is down, and the policy answers meanwhile.
    let client = Client::builder()
        .deadline(Duration::from_millis(100))
        .failure_policy(policy)
        .connect_lazy(sluice)?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(
            client,
            "example",
            "remote_address",
            key::peer_ip(),
        ));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // Connect info puts the peer's address where `key::peer_ip` reads it.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
