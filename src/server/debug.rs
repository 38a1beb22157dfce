//! Upstream's debug listener (`DEBUG_HOST:DEBUG_PORT`, `0.0.0.0:6070` by default): `/` lists the
//! endpoints, `/rlconfig` dumps the loaded limits in upstream's line format (what
//! `egctl x config ratelimit` reads), `/stats` lists upstream's stats as `name: value` lines.
//! Upstream's `/debug/pprof/` (Go profiling) has no counterpart. With `ADMIN_API_TOKEN` set, the
//! admin API's `/counters/{domain}` is served here too (`admin/http.rs`).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::ServeError;
use super::admin::{self, Admin};
use super::connections::LimitedListener;
use super::serving::{Closed, Http1Options};
use sluice::config::UpstreamDumpLine;
use sluice::metrics::Metrics;
use sluice::rls::RateLimiter;

/// The endpoints and their help lines, as `/` lists them (sorted by path).
const ENDPOINTS: &[(&str, &str)] = &[
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out stats"),
];

/// The admin API's line in `/` when it is on.
const ADMIN_ENDPOINT: (&str, &str) = (
    "/counters/{domain}?descriptor=k=v,...",
    "GET reads, DELETE resets a descriptor's counters (bearer token: ADMIN_API_TOKEN)",
);

#[derive(Clone)]
struct DebugState {
    limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    admin: bool,
}

/// Serves the debug endpoints on `listener` until `stopped`.
pub(crate) fn serve(
    listener: LimitedListener,
    options: Http1Options,
    closed: Closed,
    limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    admin: Option<Admin>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = Result<(), ServeError>> {
    let mut app = Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .route("/stats", get(stats))
        .with_state(DebugState {
            limiter,
            metrics,
            admin: admin.is_some(),
        });
    if let Some(admin) = admin {
        app = app.merge(admin::http_routes(admin));
    }
    super::http::run(listener, options, closed, app, stopped)
}

fn text(body: String) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

async fn index(State(state): State<DebugState>) -> Response {
    let admin = state.admin.then_some(&ADMIN_ENDPOINT);
    text(
        admin
            .into_iter()
            .chain(ENDPOINTS)
            .map(|(path, help)| format!("{path}: {help}\n"))
            .collect(),
    )
}

async fn rlconfig(State(state): State<DebugState>) -> Response {
    let mut body = String::new();
    if let Some(config) = state.limiter.config() {
        for limit in config.limits() {
            body.push_str(&UpstreamDumpLine(limit).to_string());
            body.push('\n');
        }
    }
    text(body)
}

async fn stats(State(state): State<DebugState>) -> Response {
    text(state.metrics.stats.render_text())
}
