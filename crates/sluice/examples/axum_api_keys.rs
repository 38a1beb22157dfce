//! An axum service that limits each API key to 3 requests a minute, in-process, with the
//! `sluice` library's façade: on the memory store, or on Redis when `REDIS_URL` is set (so that
//! every replica of the service shares one budget per key).
//!
//! ```sh norun: serves until stopped
//! cargo run -p sluice --example axum_api_keys                              # memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p sluice --example axum_api_keys
//! curl -i -H 'x-api-key: key-alice' http://127.0.0.1:3000/hello   # 3 times 200, then 429
//! ```
//!
//! `PORT` changes the port (3000). `crates/sluice/tests/axum_api_keys.rs` runs this router
//! against both stores.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice::store::RedisOptions;
use sluice::store::redis::Target;
use sluice::{Limiter, Limits};

/// The limits, in the format of the server's config files: one budget per API key, counted
/// over any trailing minute (a sliding log: no window boundary lets a key through twice).
pub const LIMITS: &str = "
domain: api
descriptors:
  - key: api_key
    rate_limit:
      name: per_api_key
      unit: minute
      requests_per_unit: 3
      algorithm: sliding_window_log
";

/// The keys this toy service knows. A real one would look them up (a database, a cache).
const KNOWN_KEYS: &[&str] = &["key-alice", "key-bob"];

/// The service: `GET /hello`, behind the authentication and the limit.
pub fn router(limiter: Limiter) -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route_layer(middleware::from_fn_with_state(limiter, limit_per_key))
}

/// Authenticates the request, then charges its key one request.
///
/// The order matters: the key is checked against the known keys before it is counted. Counting
/// whatever a client sends would give every made-up key a budget of its own (a client would
/// send a new one each request and never be limited), and would let anyone fill the store
/// with counters.
async fn limit_per_key(State(limiter): State<Limiter>, request: Request, next: Next) -> Response {
    let Some(key) = authenticated_key(request.headers()) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    match limiter.check("api", &[("api_key", key)], 1).await {
        Ok(decision) if decision.allowed => next.run(request).await,
        Ok(decision) => {
            let mut refused = StatusCode::TOO_MANY_REQUESTS.into_response();
            if let Some(wait) = decision.retry_after() {
                let seconds = HeaderValue::from(wait.as_secs().max(1));
                refused.headers_mut().insert(header::RETRY_AFTER, seconds);
            }
            refused
        }
        // The store could not decide (Redis down). This service refuses rather than serve
        // unlimited; one that would rather stay up admits here instead.
        Err(error) => {
            eprintln!("rate limit unavailable: {error}");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}

/// The request's API key when it is one of [`KNOWN_KEYS`] (the toy authentication).
fn authenticated_key(headers: &HeaderMap) -> Option<&'static str> {
    let sent = headers.get("x-api-key")?.to_str().ok()?;
    KNOWN_KEYS.iter().copied().find(|known| *known == sent)
}

/// The limiter on the Redis server at `redis_url` when there is one, else on the memory store.
pub async fn limiter(redis_url: Option<String>) -> Result<Limiter, Box<dyn std::error::Error>> {
    let limits = Limits::from_yaml(LIMITS)?;
    match redis_url {
        Some(url) => {
            let options = RedisOptions::new(Target::Single(url));
            Ok(Limiter::redis(limits, options).await?)
        }
        None => Ok(Limiter::memory(limits)),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = limiter(std::env::var("REDIS_URL").ok()).await?;
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |p| p.parse())?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(limiter))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
