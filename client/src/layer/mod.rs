//! [`RateLimitLayer`]: a `tower` layer that asks Sluice about each request before the service
//! sees it, so limits are shared by every replica of the service.
//!
//! What it answers is documented on [`RateLimitLayer`], where users of the crate read it.

pub mod key;
mod refusal;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::client::Client;
use crate::rls::{Decision, Descriptor, RateLimitRequest};
use key::{Key, KeyExtractor, Missing};

/// Limits the service it wraps through Sluice.
///
/// Per request: the [`KeyExtractor`] reads a value from the request's head; the layer sends one
/// RLS call (the layer's domain, one descriptor: the fixed entries, then `descriptor_key=value`);
/// then the request goes on to the service, or is answered here:
///
/// | Sluice says | HTTP request | gRPC request (`content-type: application/grpc…`) |
/// |---|---|---|
/// | within the limit | the service's response | the service's response |
/// | over the limit | `429` with `RateLimit`, `RateLimit-Policy`, `Retry-After` | `200`, `grpc-status: 8` (`RESOURCE_EXHAUSTED`), same headers |
/// | nothing, [`FailurePolicy::Open`](crate::FailurePolicy::Open) | the service's response | the service's response |
/// | nothing, [`FailurePolicy::Closed`](crate::FailurePolicy::Closed) | `503` | `200`, `grpc-status: 14` (`UNAVAILABLE`) |
/// | an error about the request (`INVALID_ARGUMENT`) | `503` | `grpc-status: 14` |
///
/// Before any call, the key decides:
///
/// | the extractor answers | HTTP request | gRPC request |
/// |---|---|---|
/// | [`Key::Value`](key::Key::Value) | asks Sluice, as above | asks Sluice, as above |
/// | [`Key::Exempt`](key::Key::Exempt) | the service's response, no call | the service's response, no call |
/// | [`Missing::Request`](key::Missing::Request) (a header absent, say) | `400` | `grpc-status: 3` (`INVALID_ARGUMENT`), the reason as `grpc-message` |
/// | [`Missing::Wiring`](key::Missing::Wiring) (no peer address recorded, say) | `500`, logged at error level | `grpc-status: 13` (`INTERNAL`), the reason as `grpc-message` |
///
/// A request whose key cannot be found is never passed unlimited: a client could otherwise
/// drop the header it is limited by, and a server that records no peer address would switch
/// the limit off for everyone.
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
/// use sluice_client::{Client, RateLimitLayer, key};
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
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     // Added first, so it runs second: only authenticated requests reach it.
///     .layer(RateLimitLayer::new(client, "api", "user", key::extension::<User>()))
///     .layer(middleware::from_fn(authenticate));
/// # Ok(())
/// # }
/// ```
///
/// A refusal's body is the service's body type's `Default` (empty), which axum's, tonic's and
/// `http_body_util`'s `Full`/`Empty` bodies have. Each request waits for Sluice at most the
/// client's deadline.
#[derive(Clone)]
pub struct RateLimitLayer {
    limit: Arc<Limit>,
}

/// What the layer asks Sluice, shared by every clone of the service.
#[derive(Clone)]
struct Limit {
    client: Client,
    domain: String,
    fixed_entries: Vec<(String, String)>,
    descriptor_key: String,
    extractor: Arc<dyn KeyExtractor>,
    hits_addend: u32,
}

/// What to do with one request.
enum Verdict {
    Pass,
    Over(Decision),
    Unavailable,
}

impl Limit {
    async fn judge(&self, key: String) -> Verdict {
        let descriptor = self
            .fixed_entries
            .iter()
            .fold(Descriptor::new(), |d, (k, v)| d.entry(k, v))
            .entry(&self.descriptor_key, key);
        let request = RateLimitRequest::new(&self.domain)
            .descriptor(descriptor)
            .hits_addend(self.hits_addend);
        // The client applies the failure policy: an error here is one it did not cover.
        match self.client.should_rate_limit(request).await {
            Ok(decision) if decision.allowed => Verdict::Pass,
            Ok(decision) => Verdict::Over(decision),
            Err(_) => Verdict::Unavailable,
        }
    }
}

impl RateLimitLayer {
    /// Limits by `descriptor_key=<extracted value>` in `domain`, through `client` (whose
    /// deadline and failure policy the layer follows).
    pub fn new(
        client: Client,
        domain: impl Into<String>,
        descriptor_key: impl Into<String>,
        extractor: impl KeyExtractor,
    ) -> Self {
        Self {
            limit: Arc::new(Limit {
                client,
                domain: domain.into(),
                fixed_entries: Vec::new(),
                descriptor_key: descriptor_key.into(),
                extractor: Arc::new(extractor),
                hits_addend: 0,
            }),
        }
    }

    /// Puts the entry `key=value` before the extracted one in every descriptor (to reach a
    /// nested rule: `service=orders`, then `user=<key>`).
    pub fn with_entry(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.limit_mut()
            .fixed_entries
            .push((key.into(), value.into()));
        self
    }

    /// What each request costs (0 means 1, the default).
    pub fn hits_addend(mut self, hits: u32) -> Self {
        self.limit_mut().hits_addend = hits;
        self
    }

    fn limit_mut(&mut self) -> &mut Limit {
        // Copied only if a clone of the layer already shares it.
        Arc::make_mut(&mut self.limit)
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            limit: Arc::clone(&self.limit),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `S`.
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    limit: Arc<Limit>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
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
        let key = self.limit.extractor.key(&parts);
        let grpc = refusal::is_grpc(&parts.headers);
        let request = Request::from_parts(parts, body);
        // The service that was made ready goes with this request; the clone stays for the next
        // (tower's rule for services called from a future).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let limit = Arc::clone(&self.limit);
        Box::pin(async move {
            let key = match key {
                Key::Value(key) => key,
                Key::Exempt => return inner.call(request).await,
                Key::Missing(missing) => return Ok(refuse_without_key(grpc, &missing)),
            };
            match limit.judge(key).await {
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
