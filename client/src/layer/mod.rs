//! The tower layer: [`SluiceLayer`] asks Sluice about each request before the service sees it,
//! so limits are shared by every replica of the service. As in tower, `SluiceLayer` builds the
//! service [`Sluice`], which wraps yours.
//!
//! The names say who decides: not tower's in-process `RateLimitLayer`/`RateLimit` (one budget
//! per process), nor Envoy's `RateLimitService` (the server side of the protocol), but a Sluice
//! shared by the fleet. The layer is set up with [`SluiceLayerBuilder`] (`builder.rs`); what it
//! answers is documented on [`SluiceLayer`], where users of the crate read it; the answers that
//! are not the service's are `refusal.rs`'s, and what a request is limited by is [`key`]'s.
//! [`SluiceLeaseLayer`] (`lease.rs`) limits the requests in flight instead, holding a lease of a
//! native API `CONCURRENCY` limiter for each request's life.

mod builder;
pub mod key;
mod lease;
mod refusal;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

pub use builder::{HasEntry, NoEntry, SluiceLayerBuilder};
pub use lease::{LeaseBody, SluiceLease, SluiceLeaseLayer, SluiceLeaseLayerBuilder};

use crate::client::Client;
use crate::rls::{Decision, Descriptor, RateLimitRequest};
use key::{Key, KeyExtractor, Missing};

/// Limits the service it wraps through Sluice; made with [`SluiceLayer::builder`].
///
/// Per request: the layer reads the descriptor's entries from the request's head (fixed ones
/// as they are, the others by their [`KeyExtractor`]), and its cost; it sends one RLS call (the
/// layer's domain, that one descriptor); then the request goes on to the service, or is
/// answered here:
///
/// | Sluice says | HTTP request | gRPC request (`content-type: application/grpc…`) |
/// |---|---|---|
/// | within the limit | the service's response | the service's response |
/// | over the limit | `429` with `RateLimit`, `RateLimit-Policy`, `Retry-After` | `200`, `grpc-status: 8` (`RESOURCE_EXHAUSTED`), same headers |
/// | nothing, [`FailurePolicy::Open`](crate::FailurePolicy::Open) | the service's response | the service's response |
/// | nothing, [`FailurePolicy::Closed`](crate::FailurePolicy::Closed) | `503` | `200`, `grpc-status: 14` (`UNAVAILABLE`) |
/// | an error about the request (`INVALID_ARGUMENT`) | `503` | `grpc-status: 14` |
///
/// Before any call, the keys decide:
///
/// | the extractors answer | HTTP request | gRPC request |
/// |---|---|---|
/// | each a [`Key::Value`] | asks Sluice, as above | asks Sluice, as above |
/// | one [`Key::Exempt`] | the service's response, no call | the service's response, no call |
/// | one [`Missing::Request`] (a header absent, say), none exempt | `400` | `grpc-status: 3` (`INVALID_ARGUMENT`), the reason as `grpc-message` |
/// | one [`Missing::Wiring`] (no peer address recorded, say), none exempt | `500`, logged at error level | `grpc-status: 13` (`INTERNAL`), the reason as `grpc-message` |
///
/// A request whose key cannot be found is never passed unlimited: a client could otherwise
/// drop the header it is limited by, and a server that records no peer address would switch
/// the limit off for everyone. An exemption is a choice made in so many words
/// ([`key::exempt`]), so it wins over a key another extractor could not find (the first
/// missing key in the builder's order gives the refusal).
///
/// **Layer order.** A key the client chooses (a raw `x-api-key` header) is a fresh budget for
/// every value it makes up, so key on what authentication proved: put this layer *inside* the
/// authentication layer, so that authentication runs first and refuses unknown keys, and key
/// on the identity it stores ([`key::extension`]). With axum's `Router::layer` the layer added
/// last runs first; with `tower::ServiceBuilder` the layer listed first does:
///
/// ```no_run
/// use axum::{Router, extract::Request, http::StatusCode, middleware::{self, Next},
///     response::Response, routing::get};
/// use sluice_client::{Client, SluiceLayer, key};
///
/// /// Who the caller is, as authentication proved it.
/// #[derive(Clone)]
/// struct User(String);
///
/// impl std::fmt::Display for User {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str(&self.0)
///     }
/// }
///
/// async fn authenticate(mut request: Request, next: Next) -> Result<Response, StatusCode> {
///     let key = request.headers().get("x-api-key").and_then(|v| v.to_str().ok());
///     let user = match key {
///         Some("key-of-alice") => User("alice".into()),
///         _ => return Err(StatusCode::UNAUTHORIZED),
///     };
///     request.extensions_mut().insert(user);
///     Ok(next.run(request).await)
/// }
///
/// # fn run() -> Result<(), sluice_client::Error> {
/// let client = Client::builder().connect_lazy("http://127.0.0.1:8081")?;
/// let limit = SluiceLayer::builder(client, "api")
///     .key("user", key::extension::<User>())
///     .build();
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     // Added first, so it runs second: only authenticated requests reach it.
///     .layer(limit)
///     .layer(middleware::from_fn(authenticate));
/// # Ok(())
/// # }
/// ```
///
/// A refusal's body is the service's body type's `Default` (empty), which axum's, tonic's and
/// `http_body_util`'s `Full`/`Empty` bodies have. Each request waits for Sluice at most the
/// client's deadline.
#[derive(Clone)]
pub struct SluiceLayer {
    settings: Arc<Settings>,
}

/// What the layer asks Sluice, shared by every clone of the layer and of its services.
struct Settings {
    /// The client with the layer's failure policy.
    client: Client,
    domain: String,
    /// The descriptor's entries, in order.
    entries: Vec<Entry>,
    hits: Hits,
}

/// One entry of the descriptor.
enum Entry {
    /// `key=value` on every request.
    Fixed(String, String),
    /// `key=<what the extractor reads>`.
    Read(String, Arc<dyn KeyExtractor>),
}

/// What a request costs.
enum Hits {
    /// The same for every request (0 counts as 1, as in Envoy).
    Each(u64),
    /// Read from the request's head.
    Read(Arc<dyn Fn(&Parts) -> u64 + Send + Sync>),
}

/// What the layer found in a request's head.
enum Found {
    /// Ask Sluice this.
    Ask(RateLimitRequest),
    /// An extractor exempted the request.
    Exempt,
    /// A key could not be found; the first in the builder's order.
    Missing(Missing),
}

/// What to do with one request, once Sluice was asked.
enum Verdict {
    Pass,
    Over(Decision),
    Unavailable,
}

impl SluiceLayer {
    /// Starts a layer that asks `client` (whose deadline and failure policy it follows, unless
    /// the builder sets a policy of its own) about requests in `domain` (the `domain:` of a
    /// Sluice config). The builder needs at least one descriptor entry before it can
    /// [`build`](SluiceLayerBuilder::build).
    pub fn builder(client: Client, domain: impl Into<String>) -> SluiceLayerBuilder<NoEntry> {
        SluiceLayerBuilder::new(client, domain.into())
    }
}

impl Settings {
    /// The request to send for `head`: each entry read in order. An exemption ends the reading;
    /// a missing key is kept (the first one) in case a later extractor exempts the request.
    fn read(&self, head: &Parts) -> Found {
        let mut descriptor = Descriptor::new();
        let mut missing = None;
        for entry in &self.entries {
            match entry {
                Entry::Fixed(key, value) => descriptor = descriptor.entry(key, value),
                Entry::Read(key, extractor) => match extractor.key(head) {
                    Key::Value(value) => descriptor = descriptor.entry(key, value),
                    Key::Exempt => return Found::Exempt,
                    Key::Missing(why) => {
                        missing.get_or_insert(why);
                    }
                },
            }
        }
        if let Some(missing) = missing {
            return Found::Missing(missing);
        }
        let hits = match &self.hits {
            Hits::Each(hits) => *hits,
            Hits::Read(read) => read(head),
        };
        let request = RateLimitRequest::new(&self.domain)
            .descriptor(descriptor)
            .hits_addend(hits);
        Found::Ask(request)
    }

    async fn judge(&self, request: RateLimitRequest) -> Verdict {
        // The client applies the failure policy: an error here is one it did not cover.
        match self.client.should_rate_limit(request).await {
            Ok(decision) if decision.allowed => Verdict::Pass,
            Ok(decision) => Verdict::Over(decision),
            Err(_) => Verdict::Unavailable,
        }
    }
}

impl<S> Layer<S> for SluiceLayer {
    type Service = Sluice<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Sluice {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service [`SluiceLayer`] wraps around `S`: asks Sluice, then calls `S` or answers itself.
#[derive(Clone)]
pub struct Sluice<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Sluice<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let found = self.settings.read(&parts);
        let grpc = refusal::is_grpc(&parts.headers);
        let request = Request::from_parts(parts, body);
        // The service that was made ready goes with this request; the clone stays for the next
        // (tower's rule for services called from a future).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            let ask = match found {
                Found::Ask(ask) => ask,
                Found::Exempt => return inner.call(request).await,
                Found::Missing(missing) => return Ok(refuse_without_key(grpc, &missing)),
            };
            match settings.judge(ask).await {
                Verdict::Pass => inner.call(request).await,
                Verdict::Over(decision) => Ok(refusal::over_limit(grpc, &decision)),
                Verdict::Unavailable => Ok(refusal::unavailable(grpc)),
            }
        })
    }
}

/// The answer to a request whose key could not be found. A wiring mistake refuses every
/// request until it is fixed, so it is logged where operators look; a request that lacks its
/// key is the client's business, logged only for debugging.
fn refuse_without_key<B: Default>(grpc: bool, missing: &Missing) -> Response<B> {
    match missing {
        Missing::Wiring(reason) => {
            tracing::error!(%reason, "request refused: its rate limit key cannot be found");
        }
        Missing::Request(reason) => {
            tracing::debug!(%reason, "request refused: it lacks its rate limit key");
        }
    }
    refusal::missing_key(grpc, missing)
}

/// The domain and the entries' keys: the extractors and the cost closure have no `Debug`.
impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|entry| match entry {
                Entry::Fixed(key, value) => format!("{key}={value}"),
                Entry::Read(key, _) => format!("{key}=<read>"),
            })
            .collect();
        f.debug_struct("SluiceLayer")
            .field("domain", &self.domain)
            .field("entries", &entries)
            .field("failure_policy", &self.client.failure_policy())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for SluiceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl<S: fmt::Debug> fmt::Debug for Sluice<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sluice")
            .field("layer", &self.settings)
            .field("inner", &self.inner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(build: http::request::Builder) -> Parts {
        build.body(()).unwrap().into_parts().0
    }

    fn layer(entries: Vec<Entry>, hits: Hits) -> Settings {
        let client = Client::builder()
            .connect_lazy("http://127.0.0.1:1")
            .unwrap();
        Settings {
            client,
            domain: "api".into(),
            entries,
            hits,
        }
    }

    fn read(key: &str, extractor: impl KeyExtractor) -> Entry {
        Entry::Read(key.into(), Arc::new(extractor))
    }

    fn asked(found: Found) -> RateLimitRequest {
        match found {
            Found::Ask(request) => request,
            Found::Exempt => panic!("exempt"),
            Found::Missing(missing) => panic!("missing: {missing:?}"),
        }
    }

    #[tokio::test]
    async fn entries_are_read_in_order_with_the_cost_of_the_head() {
        let entries = vec![
            Entry::Fixed("service".into(), "orders".into()),
            read("user", key::header("x-user")),
            read("route", key::method_path()),
        ];
        let cost = |head: &Parts| {
            if head.method == http::Method::POST {
                5
            } else {
                1
            }
        };
        let settings = layer(entries, Hits::Read(Arc::new(cost)));
        let request = head(http::Request::post("/orders").header("x-user", "alice"));
        let expected = RateLimitRequest::new("api")
            .descriptor(
                Descriptor::new()
                    .entry("service", "orders")
                    .entry("user", "alice")
                    .entry("route", "POST /orders"),
            )
            .hits_addend(5);
        assert_eq!(asked(settings.read(&request)), expected);
    }

    #[tokio::test]
    async fn an_exemption_wins_over_a_missing_key_and_the_first_missing_key_refuses() {
        let health = |head: &Parts| match head.uri.path() {
            "/health" => Key::Exempt,
            path => Key::Value(path.to_string()),
        };
        let settings = layer(
            vec![
                read("user", key::header("x-user")),
                read("tenant", key::header("x-tenant")),
                read("path", health),
            ],
            Hits::Each(1),
        );
        assert!(matches!(
            settings.read(&head(http::Request::get("/health"))),
            Found::Exempt
        ));
        match settings.read(&head(http::Request::get("/orders"))) {
            Found::Missing(missing) => {
                assert_eq!(missing.reason(), "the request has no x-user header");
            }
            _ => panic!("a request without its keys must be refused"),
        }
    }
}
