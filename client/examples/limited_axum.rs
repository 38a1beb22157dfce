//! An axum service limited by Sluice, with limits shared by every replica that asks the same
//! Sluice (domain `example` in `examples/config`):
//!
//! - `GET /` is public and charged to the caller's address (`remote_address`, 100 per minute;
//!   an IPv6 caller's whole /64 is one address);
//! - `GET /me` needs an API key (`x-api-key: demo-key`) and is charged to the user the key
//!   belongs to (`user`, 10 000 per day). Authentication runs first, so a made-up key is
//!   refused with 401 before Sluice is asked, and one user's keys share one budget.
//!
//! Run Sluice (`cargo run -- serve --config-dir examples/config`), then
//! `cargo run -p sluice-client --example limited_axum -- http://127.0.0.1:8081`, and call it:
//! `curl -i http://127.0.0.1:3000/` (the 101st call within a minute gets 429 with `RateLimit`,
//! `RateLimit-Policy` and `Retry-After`), `curl -i -H 'x-api-key: demo-key'
//! http://127.0.0.1:3000/me`. With Sluice stopped, the service keeps answering (fail-open);
//! pass `closed` as a second argument to answer 503 instead.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Extension, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{Router, routing::get};
use sluice_client::{Client, FailurePolicy, SluiceLayer, key};

/// Who the caller is, as [`authenticate`] proved it: what `/me` is limited by.
#[derive(Debug, Clone)]
struct User(String);

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks `x-api-key` (against one demo key here; a real service asks its own store) and
/// stores the [`User`] it belongs to in the request's extensions.
async fn authenticate(mut request: Request, next: Next) -> Result<Response, StatusCode> {
    let api_key = request.headers().get("x-api-key");
    let user = match api_key.map(|v| v.as_bytes()) {
        Some(b"demo-key") => User("demo".into()),
        _ => return Err(StatusCode::UNAUTHORIZED),
    };
    request.extensions_mut().insert(user);
    Ok(next.run(request).await)
}

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

    let by_address = SluiceLayer::builder(client.clone(), "example")
        .key("remote_address", key::peer_ip())
        .build();
    let public = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(by_address);
    // `Router::layer` wraps what is there: the layer added last runs first. So authentication
    // refuses unknown keys first, and the rate limit then keys on the user it stored, never
    // on the raw header (a made-up key per request would be a fresh budget per request).
    let by_user = SluiceLayer::builder(client, "example")
        .key("user", key::extension::<User>())
        .build();
    let private = Router::new()
        .route(
            "/me",
            get(|Extension(user): Extension<User>| async move { format!("hello, {user}\n") }),
        )
        .layer(by_user)
        .layer(middleware::from_fn(authenticate));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // Connect info puts the peer's address where `key::peer_ip` reads it; served without it,
    // `/` would answer every request 500 (the key cannot be found), never pass it unlimited.
    axum::serve(
        listener,
        public
            .merge(private)
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
