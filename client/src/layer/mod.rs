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
use key::KeyExtractor;

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
/// A request whose key is `None` is not limited and costs no call. A refusal's body is the
/// service's body type's `Default` (empty), which axum's, tonic's and `http_body_util`'s
/// `Full`/`Empty` bodies have. Each request waits for Sluice at most the client's deadline.
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
            let Some(key) = key else {
                return inner.call(request).await;
            };
            match limit.judge(key).await {
                Verdict::Pass => inner.call(request).await,
                Verdict::Over(decision) => Ok(refusal::over_limit(grpc, &decision)),
                Verdict::Unavailable => Ok(refusal::unavailable(grpc)),
            }
        })
    }
}
