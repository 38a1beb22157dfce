//! The answers [`crate::RateLimitLayer`] gives instead of calling the service: over the limit
//! (`429 Too Many Requests`, or gRPC `RESOURCE_EXHAUSTED`) and Sluice unreachable under
//! [`crate::FailurePolicy::Closed`] (`503 Service Unavailable`, or gRPC `UNAVAILABLE`).
//!
//! A gRPC refusal is a trailers-only response: HTTP 200 whose headers carry `grpc-status`, as a
//! gRPC server answers an error before any message. The body is the service's body type's
//! `Default` (empty), so the layer fits any service whose body has one (axum's, tonic's,
//! `http_body_util::Full`/`Empty`).

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::rls::Decision;

/// gRPC status codes this module answers with.
const RESOURCE_EXHAUSTED: &str = "8";
const UNAVAILABLE: &str = "14";

/// True for a gRPC request (`application/grpc`, `application/grpc+proto`, ...).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Over the limit: the limit's headers, `Retry-After`, and 429 or `RESOURCE_EXHAUSTED`.
pub(crate) fn over_limit<B: Default>(grpc: bool, decision: &Decision) -> Response<B> {
    let mut response = if grpc {
        grpc_status(RESOURCE_EXHAUSTED, "rate limit exceeded")
    } else {
        plain(StatusCode::TOO_MANY_REQUESTS)
    };
    let headers = response.headers_mut();
    for (name, value) in limit_headers(decision) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.append(name, value);
        }
    }
    // Whole seconds, rounded up, at least 1: a client retrying sooner would be refused again.
    let retry_after = decision
        .retry_after()
        .map_or(1, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after.max(1)));
    response
}

/// Sluice could not decide and the policy is to refuse.
pub(crate) fn unavailable<B: Default>(grpc: bool) -> Response<B> {
    if grpc {
        grpc_status(UNAVAILABLE, "rate limit service unavailable")
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE)
    }
}

fn plain<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

fn grpc_status<B: Default>(code: &'static str, message: &'static str) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(code));
    headers.insert("grpc-message", HeaderValue::from_static(message));
    response
}

/// The IETF draft's `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers,
/// the form Sluice emits with its draft headers on), after any headers Sluice asked the caller
/// to add (`response_headers_to_add`). When Sluice sent the draft's headers itself
/// (`LIMIT_RESPONSE_HEADERS_DRAFT=true`), those are kept as they are, since Sluice knows
/// the window (`unit_multiplier`) the response does not carry; otherwise they are built from the
/// deciding descriptor, with the window taken as one unit.
fn limit_headers(decision: &Decision) -> Vec<(String, String)> {
    let mut headers = decision.response_headers.clone();
    let has_draft = headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("RateLimit-Policy"));
    if !has_draft {
        headers.extend(draft_headers(decision));
    }
    headers
}

/// `RateLimit-Policy` and `RateLimit` for the deciding descriptor; none when nothing limited.
fn draft_headers(decision: &Decision) -> Vec<(String, String)> {
    let Some(deciding) = decision.deciding() else {
        return Vec::new();
    };
    let Some(limit) = &deciding.limit else {
        return Vec::new();
    };
    let name = sf_string(if limit.name.is_empty() {
        "default"
    } else {
        &limit.name
    });
    let window = limit.unit.map_or(0, |u| u.seconds());
    let reset = deciding.reset.map_or(0, |d| d.as_secs());
    vec![
        (
            "RateLimit-Policy".into(),
            format!("{name};q={};w={window}", limit.requests_per_unit),
        ),
        (
            "RateLimit".into(),
            format!("{name};r={};t={reset}", deciding.remaining),
        ),
    ]
}

/// `text` as a structured-field string (RFC 8941): quoted, `"` and `\` escaped, characters it
/// cannot carry (outside printable ASCII) left out.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_structured_field_strings() {
        assert_eq!(sf_string("per_user"), "\"per_user\"");
        assert_eq!(sf_string("a\"b\\c\u{e9}"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn grpc_is_told_by_content_type() {
        let mut headers = HeaderMap::new();
        assert!(!is_grpc(&headers));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&headers));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!is_grpc(&headers));
    }
}
