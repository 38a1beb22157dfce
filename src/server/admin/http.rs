//! The admin API over HTTP, on the debug listener:
//!
//! | request | answer |
//! |---|---|
//! | `GET /counters/{domain}?descriptor=k=v,...` | 200, `{"domain": …, "counters": [{name, algorithm, limit, unit, window_seconds, used, remaining, reset_ms, shadow_mode}, …]}` |
//! | `DELETE /counters/{domain}?descriptor=...` | 200, the same, as the counters were just before the reset |
//! | `POST /counters/{domain}/refund?descriptor=...&hits=N` | 200, the same, as the counters are after up to N hits were given back to each; 400 for an algorithm that cannot (`sluice::store::refundable`) |
//! | no or another bearer token | 401 with `WWW-Authenticate: Bearer` |
//! | a descriptor that does not parse (`descriptor.rs`) | 400 |
//! | a domain the configuration does not have | 404 |
//! | no configuration yet, or the store failed | 503 |
//!
//! Every error body is `{"error": "<reason>"}`.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::super::serving::PeerIp;
use super::{Admin, Caller, Entries, Operation, Refused, descriptor};
use sluice::rls::{AdminError, CounterReport};

/// The admin routes, to be merged into the debug listener's router.
pub(crate) fn routes(admin: Admin) -> Router {
    Router::new()
        .route("/counters/{domain}", get(read).delete(reset))
        .route("/counters/{domain}/refund", post(refund))
        .with_state(admin)
}

async fn read(
    State(admin): State<Admin>,
    Path(domain): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    peer: Option<axum::Extension<PeerIp>>,
) -> Response {
    answer(&admin, Operation::Get, &domain, &uri, &headers, peer).await
}

async fn reset(
    State(admin): State<Admin>,
    Path(domain): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    peer: Option<axum::Extension<PeerIp>>,
) -> Response {
    answer(&admin, Operation::Reset, &domain, &uri, &headers, peer).await
}

async fn refund(
    State(admin): State<Admin>,
    Path(domain): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    peer: Option<axum::Extension<PeerIp>>,
) -> Response {
    let query = uri.query().unwrap_or("");
    let hits = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("hits="))
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 0);
    let Some(hits) = hits else {
        let message = "refund needs hits=N, a whole number of hits to give back, at least 1";
        return refusal(Refused::BadRequest(message.into()));
    };
    answer(
        &admin,
        Operation::Refund(hits),
        &domain,
        &uri,
        &headers,
        peer,
    )
    .await
}

async fn answer(
    admin: &Admin,
    operation: Operation,
    domain: &str,
    uri: &Uri,
    headers: &HeaderMap,
    peer: Option<axum::Extension<PeerIp>>,
) -> Response {
    let caller = Caller {
        peer: peer.and_then(|axum::Extension(PeerIp(ip))| ip),
        authorization: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    };
    let entries = descriptor_param(uri.query().unwrap_or(""));
    match admin.run("http", operation, caller, domain, entries).await {
        Ok(reports) => (StatusCode::OK, axum::Json(body(domain, &reports))).into_response(),
        Err(refused) => refusal(refused),
    }
}

/// The `descriptor` parameter of a query, percent-decoded and parsed.
fn descriptor_param(query: &str) -> Result<Entries, String> {
    let mut found = None;
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == "descriptor" {
            if found.is_some() {
                return Err("give the descriptor parameter once".into());
            }
            found = Some(
                descriptor::percent_decode(value)
                    .ok_or("the descriptor parameter is not valid percent-encoded UTF-8")?,
            );
        }
    }
    let text = found.ok_or("missing the descriptor parameter (descriptor=key=value,...)")?;
    descriptor::parse(&text).map_err(|e| e.to_string())
}

/// The JSON of a domain's counters (the HTTP API's body and what `sluice counters` prints).
pub(crate) fn body(domain: &str, reports: &[CounterReport]) -> Value {
    let counters: Vec<Value> = reports
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "algorithm": r.algorithm,
                "limit": r.limit,
                "unit": r.unit,
                "window_seconds": r.window_secs,
                "used": r.used,
                "remaining": r.remaining,
                "reset_ms": r.reset_ms,
                "shadow_mode": r.shadow_mode,
            })
        })
        .collect();
    json!({ "domain": domain, "counters": counters })
}

fn refusal(refused: Refused) -> Response {
    let (status, message) = match &refused {
        Refused::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            "the admin API needs a valid bearer token (ADMIN_API_TOKEN)".to_string(),
        ),
        Refused::BadRequest(m) => (StatusCode::BAD_REQUEST, m.clone()),
        Refused::Admin(e @ (AdminError::BadDescriptor(_) | AdminError::NotRefundable(_))) => {
            (StatusCode::BAD_REQUEST, e.to_string())
        }
        Refused::Admin(e @ AdminError::UnknownDomain(_)) => (StatusCode::NOT_FOUND, e.to_string()),
        Refused::Admin(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let body = axum::Json(json!({ "error": message }));
    if matches!(refused, Refused::Unauthenticated) {
        return (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
    }
    (status, body).into_response()
}
