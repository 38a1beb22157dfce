//! [`SluiceLeaseLayer`]: at most N requests in flight, shared by every replica of a service,
//! through a `CONCURRENCY` limiter of Sluice's native API. It builds the service
//! [`SluiceLease`], as [`crate::SluiceLayer`] builds [`crate::Sluice`]; the names are not
//! tower's `ConcurrencyLimitLayer`/`ConcurrencyLimit`, which count one process's requests.
//!
//! A request takes a lease before the service sees it and gives it back when its response body
//! ends, fails or is dropped, not when the response's head is returned: a streaming response
//! holds its lease for as long as it streams. The lease is held by a guard inside the response
//! body ([`LeaseBody`]); the guard's drop sends the release from a task, so nothing here blocks
//! and a release that cannot reach Sluice leaves the lease to expire after the limiter's
//! interval (which is how long a crashed replica's leases are held, too).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

use super::key::{Key, KeyExtractor, Missing};
use super::{refusal, refuse_without_key};
use crate::client::{Client, FailurePolicy};

/// Holds a lease of a Sluice `CONCURRENCY` limiter for each request's life; made with
/// [`SluiceLeaseLayer::builder`].
///
/// | Sluice says | HTTP request | gRPC request |
/// |---|---|---|
/// | a lease | the service's response; the lease is given back when its body ends or is dropped | the same |
/// | no lease free | `429` with `Retry-After` | `200`, `grpc-status: 8` (`RESOURCE_EXHAUSTED`) |
/// | nothing, [`FailurePolicy::Open`] | the service's response, no lease | the same |
/// | nothing, [`FailurePolicy::Closed`], or an error about the call (no such limiter, a per-client limiter without a client id) | `503` | `grpc-status: 14` (`UNAVAILABLE`) |
/// | the client id's key missing | `400` / `500` as [`crate::SluiceLayer`] | `grpc-status: 3` / `13` |
///
/// The limiter must exist ([`Client::set_rate`] with
/// [`Algorithm::Concurrency`](crate::limiter::Algorithm::Concurrency)): `rate` leases at once,
/// each expiring after `interval` if never given back. Make `interval` longer than the longest
/// response takes, or a lease runs out while its request still streams.
///
/// ```no_run
/// use std::time::Duration;
/// use sluice_client::{Client, SluiceLeaseLayer};
/// use sluice_client::limiter::{Algorithm, LimiterConfig, SetMode};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::builder().connect("http://127.0.0.1:8081").await?;
/// let five = LimiterConfig::new("generations", Algorithm::Concurrency, 5, Duration::from_secs(600));
/// client.set_rate(five, SetMode::TrySet).await?;
/// let layer = SluiceLeaseLayer::builder(client, "generations").build();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SluiceLeaseLayer {
    settings: Arc<LeaseSettings>,
}

struct LeaseSettings {
    client: Client,
    limiter: String,
    client_id: Option<Arc<dyn KeyExtractor>>,
    permits: u64,
}

impl SluiceLeaseLayer {
    /// Starts a layer taking leases of the limiter `limiter` through `client` (whose deadline
    /// and failure policy it follows, unless the builder sets a policy of its own).
    pub fn builder(client: Client, limiter: impl Into<String>) -> SluiceLeaseLayerBuilder {
        SluiceLeaseLayerBuilder {
            settings: LeaseSettings {
                client,
                limiter: limiter.into(),
                client_id: None,
                permits: 1,
            },
        }
    }
}

/// Sets up a [`SluiceLeaseLayer`]; made by [`SluiceLeaseLayer::builder`].
#[must_use = "a builder does nothing until `build` makes the layer"]
pub struct SluiceLeaseLayerBuilder {
    settings: LeaseSettings,
}

impl SluiceLeaseLayerBuilder {
    /// For a `PER_CLIENT` limiter: whose budget a request spends, read from its head by
    /// `extractor` (see [`crate::key`]); a request whose key cannot be found is refused.
    pub fn client_id(mut self, extractor: impl KeyExtractor) -> Self {
        self.settings.client_id = Some(Arc::new(extractor));
        self
    }

    /// Leases each request holds (1 unless set; 0 counts as 1).
    pub fn permits(mut self, permits: u64) -> Self {
        self.settings.permits = permits.max(1);
        self
    }

    /// What the layer does when Sluice cannot answer, instead of the client's policy.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings.client.policy = policy;
        self
    }

    /// The layer.
    pub fn build(self) -> SluiceLeaseLayer {
        SluiceLeaseLayer {
            settings: Arc::new(self.settings),
        }
    }
}

impl<S> Layer<S> for SluiceLeaseLayer {
    type Service = SluiceLease<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SluiceLease {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service [`SluiceLeaseLayer`] wraps around `S`: takes a lease, then calls `S` with the
/// lease held in the response body, or answers itself.
#[derive(Clone)]
pub struct SluiceLease<S> {
    inner: S,
    settings: Arc<LeaseSettings>,
}

/// What taking a lease gave.
enum Taken {
    /// Held until the guard drops; `None`: let through without one (the failure policy).
    /// Boxed: a guard carries a `Client`, hundreds of bytes, which the body carries too.
    Pass(Option<Box<LeaseGuard>>),
    NoLease(Duration),
    Unavailable,
}

impl LeaseSettings {
    /// The client id of `head`, `""` for an overall limiter.
    fn client_id(&self, head: &Parts) -> Result<Option<String>, Missing> {
        match &self.client_id {
            None => Ok(Some(String::new())),
            Some(extractor) => match extractor.key(head) {
                Key::Value(id) => Ok(Some(id)),
                Key::Exempt => Ok(None),
                Key::Missing(missing) => Err(missing),
            },
        }
    }

    async fn take(&self, client_id: String) -> Taken {
        let acquired = self
            .client
            .try_acquire(&self.limiter, &client_id, self.permits, Duration::ZERO)
            .await;
        match acquired {
            Ok(a) if a.acquired => Taken::Pass(a.lease_id.map(|lease_id| {
                Box::new(LeaseGuard {
                    client: self.client.clone(),
                    limiter: self.limiter.clone(),
                    client_id,
                    lease_id,
                })
            })),
            Ok(a) => Taken::NoLease(a.retry_after),
            Err(error) => {
                tracing::warn!(%error, limiter = %self.limiter, "no lease: Sluice did not grant one");
                Taken::Unavailable
            }
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SluiceLease<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let client_id = self.settings.client_id(&parts);
        let grpc = refusal::is_grpc(&parts.headers);
        let request = Request::from_parts(parts, body);
        // The service made ready goes with this request (tower's rule, as in `Sluice::call`).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            let bare = |response: Response<ResBody>| response.map(LeaseBody::bare);
            let taken = match client_id {
                Ok(Some(id)) => settings.take(id).await,
                Ok(None) => Taken::Pass(None),
                Err(missing) => return Ok(bare(refuse_without_key(grpc, &missing))),
            };
            let guard = match taken {
                Taken::Pass(guard) => guard,
                Taken::NoLease(retry) => return Ok(bare(refusal::no_lease(grpc, retry))),
                Taken::Unavailable => return Ok(bare(refusal::unavailable(grpc))),
            };
            // An error or a dropped future drops the guard here: the lease goes back at once.
            let response = inner.call(request).await?;
            Ok(response.map(|body| LeaseBody {
                inner: Box::pin(body),
                guard,
            }))
        })
    }
}

/// A response body that holds its request's lease until it ends, fails or is dropped.
pub struct LeaseBody<B> {
    // Boxed so that any body, `Unpin` or not, can be polled without unsafe pinning code.
    inner: Pin<Box<B>>,
    guard: Option<Box<LeaseGuard>>,
}

impl<B> LeaseBody<B> {
    fn bare(body: B) -> Self {
        Self {
            inner: Box::pin(body),
            guard: None,
        }
    }
}

impl<B: Default> Default for LeaseBody<B> {
    fn default() -> Self {
        Self::bare(B::default())
    }
}

impl<B: Body> Body for LeaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = this.inner.as_mut().poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // The body ended: give the lease back now, not when the connection drops it.
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseBody")
            .field("holds_lease", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

/// A lease held; dropping it sends the release.
struct LeaseGuard {
    client: Client,
    limiter: String,
    client_id: String,
    lease_id: String,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Outside a runtime nothing can be sent; the lease then expires on its own.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        let (limiter, client_id, lease_id) = (
            std::mem::take(&mut self.limiter),
            std::mem::take(&mut self.client_id),
            std::mem::take(&mut self.lease_id),
        );
        runtime.spawn(async move {
            if let Err(error) = client.release(&limiter, &client_id, &lease_id).await {
                tracing::debug!(%error, %limiter, "release failed: the lease expires on its own");
            }
        });
    }
}

impl fmt::Debug for SluiceLeaseLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl fmt::Debug for LeaseSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SluiceLeaseLayer")
            .field("limiter", &self.limiter)
            .field("per_client", &self.client_id.is_some())
            .field("permits", &self.permits)
            .field("failure_policy", &self.client.failure_policy())
            .finish()
    }
}

impl fmt::Debug for SluiceLeaseLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SluiceLeaseLayerBuilder")
            .field("layer", &self.settings)
            .finish()
    }
}

impl<S: fmt::Debug> fmt::Debug for SluiceLease<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SluiceLease")
            .field("layer", &self.settings)
            .field("inner", &self.inner)
            .finish()
    }
}
