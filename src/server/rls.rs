//! The gRPC adapter: Envoy's `RateLimitService`, its quota service (`rlqs.rs`), health and
//! reflection on the gRPC port, and
//! Sluice's own `sluice.v1.Limiter` (see `named.rs`) there or on a port of its own.
//!
//! Errors become gRPC statuses so that Envoy's `failure_mode_deny` can act on them (Envoy treats
//! any non-OK status as a failed call; a response with `overall_code: UNKNOWN` is not):
//!
//! | cause | status |
//! |---|---|
//! | empty domain or descriptor list (input limits are answered per descriptor) | `INVALID_ARGUMENT` |
//! | a message that does not decode (never from Envoy, which sends valid protobuf) | `INVALID_ARGUMENT` (`proto::codec`) |
//! | (not an error) a message over 1 MiB | OK, `overall_code: OVER_LIMIT` (`oversized.rs`) |
//! | no configuration loaded | `UNAVAILABLE` |
//! | store failure or timeout | `UNAVAILABLE` |
//! | the caller's deadline below `GRPC_MIN_TIMEOUT`, or ran out while the store answered (`deadline_floor.rs`) | `DEADLINE_EXCEEDED` |

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::admin::AdminGrpcService;
use super::connections::{self, ConnectionLimit};
use super::deadline_floor;
use super::named::NamedApiService;
use super::oversized::AnswerOversized;
use super::routes::GrpcRoutes;
use super::serving::{self, Closed, Http2Options, Preface};
use super::{GrpcListener, GrpcOptions, MAX_REQUEST_BYTES, ServeError, tls, trace_parent};
use sluice::metrics::{ApiMetrics, Metrics};
use sluice::proto::{self, RateLimitRequest, RateLimitResponse, RateLimitServiceServer};
use sluice::rlqs::QuotaServer;
use sluice::rls::{RateLimiter, RlsError};
use sluice::store::deadline::Deadline;

/// Concurrent requests on one HTTP/2 connection (Envoy multiplexes many on few connections).
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

pub(crate) struct RateLimitService {
    limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    api: ApiMetrics,
    /// Calls whose store call ran out of the caller's deadline (`deadline_floor.rs`).
    ran_out: prometheus::IntCounter,
}

#[tonic::async_trait]
impl proto::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.api.requests.inc();
        let _timer = self.api.response_time.start_timer();
        let span = tracing::debug_span!("ShouldRateLimit", otel.kind = "server");
        if !span.is_disabled() {
            // The caller's trace context (W3C, else B3), so our spans join its trace.
            let _ = span.set_parent(trace_parent::parent(request.metadata()));
        }
        // The deadline the server took from the call's `grpc-timeout` (`serving.rs`).
        let deadline = request.extensions().get::<Deadline>().copied();
        let result = self
            .limiter
            .should_rate_limit(request.get_ref(), deadline)
            .instrument(span)
            .await;
        match result {
            Ok(response) => Ok(Response::new(response)),
            Err(e @ RlsError::CallerDeadline(_)) => {
                Err(deadline_floor::ran_out(&self.ran_out, e.to_string()))
            }
            Err(e) => {
                if let Some(kind) = error_type(&e) {
                    self.metrics.errors.with_label_values(&[kind]).inc();
                }
                Err(to_status(e))
            }
        }
    }
}

/// Upstream's `err_type` label: store failures are `redis_error`, everything else
/// `service_error`; `None` for a caller's deadline, which upstream never answers for (its
/// store calls do not follow the caller's deadline) and so never counts.
pub(crate) fn error_type(error: &RlsError) -> Option<&'static str> {
    match error {
        RlsError::Store(_) => Some("redis_error"),
        RlsError::InvalidRequest(_) | RlsError::NoConfig => Some("service_error"),
        RlsError::CallerDeadline(_) => None,
    }
}

pub(crate) fn to_status(error: RlsError) -> Status {
    match &error {
        RlsError::InvalidRequest(message) => Status::invalid_argument(message.clone()),
        RlsError::NoConfig => Status::unavailable(error.to_string()),
        // Logged by the limiter, at most once a second.
        RlsError::Store(_) => Status::unavailable(error.to_string()),
        RlsError::CallerDeadline(_) => Status::deadline_exceeded(error.to_string()),
    }
}

/// The services served beside RLS on the gRPC port, each only when it is on.
pub(crate) struct Beside {
    /// The native API, unless it has a port of its own.
    pub(crate) limiter_api: Option<NamedApiService>,
    /// The admin API (`ADMIN_API_TOKEN`).
    pub(crate) admin: Option<AdminGrpcService>,
}

/// Serves RLS, health, reflection and, when they are on, the native API (when it shares the
/// port) and the admin API on `listener`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve<H>(
    listener: GrpcListener,
    options: &GrpcOptions,
    limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    beside: Beside,
    health: H,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = Result<(), ServeError>>, ServeError>
where
    H: tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    H::Future: Send + 'static,
{
    let limit =
        ConnectionLimit::new(options.caps, "grpc", &metrics).following(options.overload.clone());
    let closed = Closed::new("grpc", &metrics);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let limiter_for_quota = limiter.clone();
    let rls = AnswerOversized::new(
        RateLimitServiceServer::new(RateLimitService {
            limiter,
            api: metrics.api("ShouldRateLimit"),
            ran_out: deadline_floor::ran_out_counter(
                <RateLimitServiceServer<RateLimitService> as NamedService>::NAME,
                &metrics,
            ),
            metrics: metrics.clone(),
        })
        .max_decoding_message_size(MAX_REQUEST_BYTES),
        MAX_REQUEST_BYTES,
        metrics.clone(),
    );
    let quota =
        QuotaServer::new(limiter_for_quota, options.rlqs.clone()).with_metrics(metrics.clone());
    // Quota streams last as long as their Envoy: they end when the listener stops, so that a
    // shutdown does not wait out its grace period for them.
    let stopped = super::rlqs::Stop::new(stopped);
    let mut routes = tonic::service::Routes::new(health)
        .add_service(reflection)
        .add_service(super::rlqs::service(Arc::new(quota), stopped.clone()));
    let Beside { limiter_api, admin } = beside;
    let shares_the_port = limiter_api.is_some();
    if let Some(api) = limiter_api {
        routes = routes.add_service(api);
    }
    if let Some(admin) = admin {
        routes = routes.add_service(admin);
    }
    // Envoy's calls skip the router (`routes.rs`), so the router does not hold the RLS.
    let mut routes = GrpcRoutes::new(rls, routes)
        .with_floor::<RateLimitServiceServer<RateLimitService>>(options.min_timeout, &metrics);
    if shares_the_port {
        routes = routes.with_floor::<NamedApiService>(options.min_timeout, &metrics);
    }
    listen(routes, listener, limit, closed, options, stopped)
}

/// Serves only the native API on a listener of its own (`LIMITER_GRPC_PORT`), with the gRPC
/// port's TLS settings.
pub(crate) fn serve_named_api(
    listener: TcpListener,
    options: &GrpcOptions,
    service: NamedApiService,
    metrics: &Metrics,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = Result<(), ServeError>>, ServeError> {
    let limit = ConnectionLimit::new(options.caps, "limiter_api", metrics)
        .following(options.overload.clone());
    let closed = Closed::new("limiter_api", metrics);
    let routes = GrpcRoutes::routed(tonic::service::Routes::new(service))
        .with_floor::<NamedApiService>(options.min_timeout, metrics);
    listen(
        routes,
        GrpcListener::Tcp(listener),
        limit,
        closed,
        options,
        stopped,
    )
}

/// The HTTP/2 settings every gRPC listener shares.
///
/// Connection age: at the age the server sends GOAWAY (hyper's graceful shutdown) and lets the
/// calls in flight finish; at age + grace the listener closes the connection
/// (`connections::Expiring`, see [`lifetime`]). Zero turns either off, as upstream (grpc-go
/// reads 0 as "never"), and so does `GRPC_MAX_CONNECTION_IDLE`.
fn http2_options(options: &GrpcOptions) -> Http2Options {
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    Http2Options {
        // Bounds per connection, so one client cannot hold unbounded server state.
        max_streams: MAX_STREAMS_PER_CONNECTION,
        keepalive_interval: Duration::from_secs(30),
        keepalive_timeout: Duration::from_secs(10),
        max_age: nonzero(options.max_connection_age),
        max_idle: nonzero(options.max_connection_idle),
    }
}

/// How long a connection may live in all: age + grace, when both are set.
fn lifetime(options: &GrpcOptions) -> Option<Duration> {
    let age = options.max_connection_age;
    let grace = options.max_connection_age_grace;
    (!age.is_zero() && !grace.is_zero()).then(|| age.saturating_add(grace))
}

/// Wraps each accepted connection in a [`Preface`] whose deadline is `handshake` from now: the
/// accept has just happened when the server takes the connection from the stream.
fn with_preface<IO>(
    handshake: Option<Duration>,
    closed: Closed,
) -> impl FnMut(std::io::Result<IO>) -> std::io::Result<Preface<IO>> {
    move |io| {
        let deadline = handshake.map(|t| tokio::time::Instant::now() + t);
        io.map(|io| Preface::new(io, deadline, &closed))
    }
}

/// A gRPC listener at work, until it stops or fails.
type Serving = Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>>;

/// Accepts on `listener` (with TLS when configured) until `stopped`. Every connection must
/// send its HTTP/2 preface (after its TLS handshake) within `GRPC_HANDSHAKE_TIMEOUT` of the
/// accept ([`Preface`]).
fn listen(
    routes: GrpcRoutes,
    listener: GrpcListener,
    limit: ConnectionLimit,
    closed: Closed,
    options: &GrpcOptions,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<Serving, ServeError> {
    let lifetime = lifetime(options);
    let http2 = http2_options(options);
    let budget = options.budget.clone();
    let handshake = (!options.handshake_timeout.is_zero()).then_some(options.handshake_timeout);
    let listener = match listener {
        GrpcListener::Tcp(listener) => listener,
        GrpcListener::Unix(_) if options.tls.is_some() => return Err(ServeError::TlsOnUnixSocket),
        GrpcListener::Unix(listener) => {
            let incoming = connections::incoming(listener, limit, lifetime)
                .map(with_preface(handshake, closed.clone()));
            return Ok(Box::pin(async move {
                serving::serve_http2(incoming, routes, http2, budget, closed, stopped).await;
                Ok(())
            }));
        }
    };
    match &options.tls {
        None => {
            let incoming = connections::incoming(listener, limit, lifetime)
                .map(with_preface(handshake, closed.clone()));
            Ok(Box::pin(async move {
                serving::serve_http2(incoming, routes, http2, budget, closed, stopped).await;
                Ok(())
            }))
        }
        Some(tls) => {
            let incoming = tls::incoming(
                listener,
                limit,
                tls::Handshake {
                    tls: tls.clone(),
                    reload_interval: options.reload_interval,
                    timeout: handshake,
                    closed: closed.clone(),
                },
                lifetime,
            )?;
            Ok(Box::pin(async move {
                serving::serve_http2(incoming, routes, http2, budget, closed, stopped).await;
                Ok(())
            }))
        }
    }
}
