//! The answers [`crate::SluiceLayer`] gives instead of calling the service: over the limit
//! (`429 Too Many Requests`, or gRPC `RESOURCE_EXHAUSTED`), Sluice unreachable under
//! [`crate::FailurePolicy::Closed`] (`503 Service Unavailable`, or gRPC `UNAVAILABLE`), and no
//! key to ask about (`400`/`INVALID_ARGUMENT` when the request lacks it, `500`/`INTERNAL` when
//! the service is wired so that it cannot be found).
//!
//! A gRPC refusal is a trailers-only response: HTTP 200 whose headers carry `grpc-status`, as a
//! gRPC server answers an error before any message. The body is the service's body type's
//! `Default` (empty), so the layer fits any service whose body has one (axum's, tonic's,
//! `http_body_util::Full`/`Empty`).

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::key::Missing;
use crate::rls::Decision;

/// gRPC status codes this module answers with.
const INVALID_ARGUMENT: &str = "3";
const RESOURCE_EXHAUSTED: &str = "8";
const INTERNAL: &str = "13";
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
        grpc_status(
            RESOURCE_EXHAUSTED,
            HeaderValue::from_static("rate limit exceeded"),
        )
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

/// No lease free ([`crate::SluiceLeaseLayer`]): 429 or `RESOURCE_EXHAUSTED`, with
/// `Retry-After` in whole seconds rounded up, at least 1. A concurrency limit has no window, so
/// none of the draft's `RateLimit` headers.
pub(crate) fn no_lease<B: Default>(grpc: bool, retry_after: std::time::Duration) -> Response<B> {
    let mut response = if grpc {
        grpc_status(
            RESOURCE_EXHAUSTED,
            HeaderValue::from_static("concurrency limit reached"),
        )
    } else {
        plain(StatusCode::TOO_MANY_REQUESTS)
    };
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
    response
}

/// Sluice could not decide and the policy is to refuse.
pub(crate) fn unavailable<B: Default>(grpc: bool) -> Response<B> {
    if grpc {
        grpc_status(
            UNAVAILABLE,
            HeaderValue::from_static("rate limit service unavailable"),
        )
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE)
    }
}

/// No key to ask Sluice about: the request lacks it, or the service cannot find it.
pub(crate) fn missing_key<B: Default>(grpc: bool, missing: &Missing) -> Response<B> {
    let (status, code) = match missing {
        Missing::Request(_) => (StatusCode::BAD_REQUEST, INVALID_ARGUMENT),
        Missing::Wiring(_) => (StatusCode::INTERNAL_SERVER_ERROR, INTERNAL),
    };
    if grpc {
        grpc_status(code, grpc_message(missing.reason()))
    } else {
        plain(status)
    }
}

fn plain<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

fn grpc_status<B: Default>(code: &'static str, message: HeaderValue) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(code));
    headers.insert("grpc-message", message);
    response
}

/// `text` as a `grpc-message` value: percent-encoded outside printable ASCII and for `%`
/// itself, as the gRPC HTTP/2 protocol asks, so any reason makes a valid header.
fn grpc_message(text: &str) -> HeaderValue {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (b' '..=b'~').contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    // Only printable ASCII is left, which a header value always takes.
    HeaderValue::try_from(encoded).unwrap_or(HeaderValue::from_static("no rate limit key"))
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
    fn a_grpc_message_is_percent_encoded() {
        assert_eq!(grpc_message("no x-user header"), "no x-user header");
        assert_eq!(grpc_message("100% caf\u{e9}\n"), "100%25 caf%C3%A9%0A");
    }

    #[test]
    fn a_missing_key_is_400_or_500_by_whose_mistake_it_is() {
        let request = Missing::Request("the request has no x-user header".into());
        let wiring = Missing::Wiring("no peer address".into());
        assert_eq!(missing_key::<()>(false, &request).status(), 400);
        assert_eq!(missing_key::<()>(false, &wiring).status(), 500);
        let grpc = missing_key::<()>(true, &wiring);
        assert_eq!(grpc.status(), 200);
        assert_eq!(grpc.headers()["grpc-status"], "13");
        assert_eq!(grpc.headers()["grpc-message"], "no peer address");
        assert_eq!(
            missing_key::<()>(true, &request).headers()["grpc-status"],
            "3"
        );
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
