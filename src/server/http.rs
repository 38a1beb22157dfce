//! The HTTP adapter: upstream's `/healthcheck` and `/json` endpoints.
//!
//! `/metrics` is the Prometheus exposition (see `metrics.rs`), `/rlconfig` lists the loaded
//! limits. `/json` takes a proto3-JSON `RateLimitRequest` and answers the proto3-JSON
//! `RateLimitResponse`: 200 for OK, 429 for OVER_LIMIT, 500 for UNKNOWN. A body that does not
//! parse, a request the limiter refuses or a request before any configuration has loaded is a
//! 400 with the reason (upstream's status for any service error); a store failure is a 500.
//! The JSON mapping comes from the same descriptors the gRPC side is generated from, in their
//! original form: the domain, keys and values are JSON strings, transcoded through the wire
//! format into the generated message, whose fields for them are bytes (see `build.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

use super::connections::LimitedListener;
use super::rls::error_type;
use super::serving::{self, Closed, Http1Options};
use super::{Health, ServeError};
use sluice::metrics::Metrics;
use sluice::proto::{self, Code, RateLimitRequest};
use sluice::rls::{RateLimiter, RlsError};
use sluice::store::MemoryStore;

#[derive(Clone)]
struct AppState {
    limiter: Arc<RateLimiter>,
    health: Health,
    json: Arc<JsonMapping>,
    observability: Observability,
    /// How long a `/json` body may take to arrive once its headers have: the header timeout
    /// (`HTTP_READ_HEADER_TIMEOUT`). Without it a client that sends headers and then trickles
    /// (or never sends) the body holds a connection slot for as long as it likes.
    body_timeout: Option<Duration>,
}

/// The largest `/json` body read (axum's default limit for a body extractor).
const JSON_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// What `/metrics` reads.
#[derive(Clone)]
pub(crate) struct Observability {
    pub metrics: Arc<Metrics>,
    /// Sampled at scrape time, when the memory store is in use.
    pub memory_store: Option<Arc<MemoryStore>>,
}

/// proto3-JSON for the two RLS messages.
struct JsonMapping {
    request: MessageDescriptor,
    response: MessageDescriptor,
}

impl JsonMapping {
    fn new() -> Self {
        let pool = DescriptorPool::decode(proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set compiled by build.rs decodes");
        let message = |name: &str| {
            pool.get_message_by_name(name)
                .unwrap_or_else(|| panic!("{name} is in proto/"))
        };
        Self {
            request: message("envoy.service.ratelimit.v3.RateLimitRequest"),
            response: message("envoy.service.ratelimit.v3.RateLimitResponse"),
        }
    }

    fn decode(&self, body: &[u8]) -> Result<RateLimitRequest, String> {
        let mut json = serde_json::Deserializer::from_slice(body);
        let message = DynamicMessage::deserialize(self.request.clone(), &mut json)
            .map_err(|e| format!("invalid JSON RateLimitRequest: {e}"))?;
        json.end()
            .map_err(|e| format!("invalid JSON RateLimitRequest: {e}"))?;
        message
            .transcode_to()
            .map_err(|e| format!("invalid RateLimitRequest: {e}"))
    }

    fn encode(&self, response: &proto::RateLimitResponse) -> Vec<u8> {
        let mut message = DynamicMessage::new(self.response.clone());
        message
            .transcode_from(response)
            .expect("a generated message transcodes to its own descriptor");
        serde_json::to_vec(&message).expect("serializing a message to JSON cannot fail")
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    listener: LimitedListener,
    options: Http1Options,
    closed: Closed,
    limiter: Arc<RateLimiter>,
    health: Health,
    observability: Observability,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = Result<(), ServeError>> {
    let state = AppState {
        limiter,
        health,
        json: Arc::new(JsonMapping::new()),
        observability,
        body_timeout: options.header_timeout,
    };
    let app = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .route("/json", post(json))
        .with_state(state);
    run(listener, options, closed, app, stopped)
}

/// Upstream's separate metrics listener (`USE_PROMETHEUS`): only `path`, the same text as
/// `/metrics` on the HTTP port.
pub(crate) fn serve_metrics(
    listener: LimitedListener,
    options: Http1Options,
    closed: Closed,
    path: &str,
    observability: Observability,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = Result<(), ServeError>> {
    let app = Router::new()
        .route(
            path,
            get(|State(o): State<Observability>| async move { render_metrics(&o) }),
        )
        .with_state(observability);
    run(listener, options, closed, app, stopped)
}

/// Serves `app` on `listener` until `stopped` (see `serving` for the timeouts).
pub(crate) async fn run(
    listener: LimitedListener,
    options: Http1Options,
    closed: Closed,
    app: Router,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serving::serve_http1(listener.incoming(), app, options, closed, stopped).await;
    Ok(())
}

async fn healthcheck(State(state): State<AppState>) -> Response {
    if state.health.is_serving() && state.health.is_degraded() {
        let body = format!("OK\n{}\n", super::health::DEGRADED_DETAIL);
        (StatusCode::OK, body).into_response()
    } else if state.health.is_serving() {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT SERVING").into_response()
    }
}

/// The loaded limits, one per line (upstream serves this on its debug port).
async fn rlconfig(State(state): State<AppState>) -> Response {
    let mut text = String::new();
    if let Some(config) = state.limiter.config() {
        for limit in config.limits() {
            text.push_str(&limit.to_string());
            text.push('\n');
        }
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    render_metrics(&state.observability)
}

fn render_metrics(o: &Observability) -> Response {
    if let Some(memory) = &o.memory_store {
        o.metrics.memory_entries.set(memory.len() as i64);
        // The store keeps the total; the counter catches up to it.
        let seen = o.metrics.memory_evictions.get();
        o.metrics
            .memory_evictions
            .inc_by(memory.evictions().saturating_sub(seen));
        o.metrics
            .memory_limiter_states
            .set(memory.limiter_states() as i64);
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        o.metrics.render(),
    )
        .into_response()
}

/// The whole `/json` body, within `timeout` (408 when it does not arrive in time, 413 over
/// [`JSON_BODY_LIMIT`], 400 when the connection fails mid-body).
async fn read_body(body: Body, timeout: Option<Duration>) -> Result<Bytes, Response> {
    let read = axum::body::to_bytes(body, JSON_BODY_LIMIT);
    let read = match timeout {
        Some(timeout) => match tokio::time::timeout(timeout, read).await {
            Ok(read) => read,
            Err(_) => {
                let message = format!("request body not received within {timeout:?}");
                return Err((StatusCode::REQUEST_TIMEOUT, message).into_response());
            }
        },
        None => read.await,
    };
    read.map_err(|error| {
        let source = std::error::Error::source(&error);
        if source.is_some_and(|e| e.is::<http_body_util::LengthLimitError>()) {
            let message = format!("request body over {JSON_BODY_LIMIT} bytes");
            (StatusCode::PAYLOAD_TOO_LARGE, message).into_response()
        } else if let Some(status) = budget_refusal(&error) {
            // Ended by the request budgets (`budget.rs`): the server is busy, not the client wrong.
            let message = status.message().to_string();
            (StatusCode::SERVICE_UNAVAILABLE, message).into_response()
        } else {
            (StatusCode::BAD_REQUEST, error.to_string()).into_response()
        }
    })
}

/// The request budgets' refusal (`budget.rs`) among the causes of a body's read `error`.
fn budget_refusal<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e tonic::Status> {
    let mut cause = error.source();
    while let Some(e) = cause {
        if let Some(status) = e.downcast_ref::<tonic::Status>() {
            return Some(status);
        }
        cause = e.source();
    }
    None
}

async fn json(State(state): State<AppState>, body: Body) -> Response {
    let metrics = &state.observability.metrics;
    metrics.total_requests.with_label_values(&["json"]).inc();
    let _timer = metrics
        .response_time
        .with_label_values(&["json"])
        .start_timer();
    let body = match read_body(body, state.body_timeout).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let request = match state.json.decode(&body) {
        Ok(request) => request,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    // No deadline on `/json`: each store call has the store's own timeout.
    match state.limiter.should_rate_limit(&request, None).await {
        Ok(response) => {
            let status = match Code::try_from(response.overall_code) {
                Ok(Code::Ok) => StatusCode::OK,
                Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                state.json.encode(&response),
            )
                .into_response()
        }
        // Upstream answers 400 for every error of the service; Sluice keeps 500 for a store
        // that could not decide, and answers "no configuration loaded" as upstream does (a
        // request refused by the service, not a failure of the server).
        Err(error @ (RlsError::InvalidRequest(_) | RlsError::NoConfig)) => {
            if let Some(kind) = error_type(&error) {
                metrics.errors.with_label_values(&[kind]).inc();
            }
            (StatusCode::BAD_REQUEST, error.to_string()).into_response()
        }
        Err(error) => {
            // `/json` carries no caller deadline, so a store error is all that comes here.
            if let Some(kind) = error_type(&error) {
                metrics.errors.with_label_values(&[kind]).inc();
            }
            // Store failures are logged by the limiter, at most once a second.
            if !matches!(error, RlsError::Store(_)) {
                tracing::warn!(%error, "json request failed");
            }
            (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
        }
    }
}
