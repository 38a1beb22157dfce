//! What a request is limited by: a [`KeyExtractor`] reads one value from the request's head
//! (method, URI, headers, extensions) and [`crate::SluiceLayer`] sends it to Sluice as a
//! descriptor entry ([`SluiceLayerBuilder::key`](crate::SluiceLayerBuilder::key)).
//!
//! The extractors fail closed. A request whose key cannot be found is refused
//! ([`Key::Missing`]), never let through unlimited: a client that could drop a header, or a
//! server that forgot to record the peer's address, would otherwise switch the limit off.
//! Passing a request unlimited is a separate, explicit outcome ([`Key::Exempt`], [`exempt`]).
//!
//! Which value to key on:
//!
//! - Who the caller is, once an authentication layer has proven it: [`extension`] reads the
//!   identity that layer stored. A key read from a header *before* authentication is chosen by
//!   the client, which gets a fresh budget with every value it makes up.
//! - Where the caller connects from: [`peer_ip`], or [`x_forwarded_for`] / [`forwarded()`] behind
//!   proxies of your own. IPv6 addresses are keyed by their /64 network (configurable), since
//!   one host usually holds a whole /64 and could rotate through 2^64 addresses.
//! - What is called: [`method_path`].
//!
//! gRPC metadata is carried as HTTP/2 headers, so [`header`] reads it too, and a gRPC method is
//! the request path (`/package.Service/Method`).
//!
//! Files: the IP prefix rule (`ip.rs`), the peer's address (`peer.rs`), the addresses proxies
//! forward (`forwarded.rs`).

mod forwarded;
mod ip;
mod peer;

use std::borrow::Cow;
use std::fmt::Display;

use http::request::Parts;

pub use forwarded::{ForwardedIp, forwarded, x_forwarded_for};
pub use peer::{PeerAddr, PeerIp, peer_addr_into_extensions, peer_ip};

/// What a [`KeyExtractor`] found in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Key {
    /// Limit the request by this value.
    Value(String),
    /// Pass the request on unlimited, without asking Sluice: a deliberate choice of the
    /// extractor (see [`exempt`]), never what a failed read means.
    Exempt,
    /// The value could not be found: the layer refuses the request ([`Missing`] says how).
    Missing(Missing),
}

/// Why a request has no key, which decides how the layer refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Missing {
    /// The request does not carry what the key is read from (a header; a forwarded list
    /// shorter than the trusted hops, or malformed there): `400 Bad Request`, gRPC
    /// `INVALID_ARGUMENT`.
    Request(Cow<'static, str>),
    /// The service is wired so that the key can never be found (no peer address recorded,
    /// no identity stored by an earlier layer): `500 Internal Server Error`, gRPC `INTERNAL`,
    /// and logged at error level, since every request is refused until the wiring is fixed.
    Wiring(Cow<'static, str>),
}

impl Missing {
    /// What is missing, in words (sent as the gRPC status message and logged).
    pub fn reason(&self) -> &str {
        match self {
            Missing::Request(reason) | Missing::Wiring(reason) => reason,
        }
    }
}

impl From<String> for Key {
    fn from(value: String) -> Self {
        Key::Value(value)
    }
}

/// `None` is a key the request lacks ([`Missing::Request`]), so a closure returning
/// `Option<String>` fails closed.
impl From<Option<String>> for Key {
    fn from(value: Option<String>) -> Self {
        value.map_or_else(
            || Key::Missing(Missing::Request("the request has no rate limit key".into())),
            Key::Value,
        )
    }
}

/// Reads the value a request is limited by.
///
/// Any `Fn(&http::request::Parts) -> K` where `K` is [`Key`], `String` or `Option<String>` is
/// an extractor (`None` is [`Missing::Request`]: refused, not unlimited).
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of `request`.
    fn key(&self, request: &Parts) -> Key;

    /// This extractor's value, or `fallback`'s when this one's is [`Key::Missing`]. An
    /// [`Key::Exempt`] answer is kept: it is a decision, not a failure to find a key.
    fn or<E: KeyExtractor>(self, fallback: E) -> Or<Self, E>
    where
        Self: Sized,
    {
        Or(self, fallback)
    }
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> K + Send + Sync + 'static,
    K: Into<Key>,
{
    fn key(&self, request: &Parts) -> Key {
        self(request).into()
    }
}

/// The first extractor's value, else the second's ([`KeyExtractor::or`]).
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn key(&self, request: &Parts) -> Key {
        match self.0.key(request) {
            Key::Missing(_) => self.1.key(request),
            found => found,
        }
    }
}

/// Every request [`Key::Exempt`]: as a fallback, `header("x-tenant").or(exempt())` passes
/// requests without the header unlimited. Only where that is wanted: a client that can drop
/// the header then escapes the limit.
pub fn exempt() -> impl KeyExtractor + Clone {
    |_: &Parts| Key::Exempt
}

/// The value of header (or gRPC metadata entry) `name`; [`Missing::Request`] when absent.
///
/// **Place it after authentication.** A header checked by nothing is whatever the client
/// sends: a made-up value per request is a fresh budget per request. Run the layer that
/// checks the header first (with axum's `Router::layer`, add the auth layer *after* the rate
/// limit layer, since the last one added runs first; with `tower::ServiceBuilder`, list it
/// before), or better, key on the identity it stores ([`extension`]).
///
/// A value that is not UTF-8 (HTTP allows obs-text bytes) is read with each invalid sequence as
/// U+FFFD rather than skipped: skipping would let a client escape its limit by sending one such
/// byte. Values differing only in invalid bytes then share a budget, which errs on the side of
/// limiting.
pub fn header(name: &'static str) -> impl KeyExtractor + Clone {
    move |request: &Parts| match request.headers.get(name) {
        Some(value) => Key::Value(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        None => Key::Missing(Missing::Request(
            format!("the request has no {name} header").into(),
        )),
    }
}

/// The `T` an earlier layer stored in the request's extensions, written with its `Display`:
/// the identity an authentication layer proved (a user or tenant id), which the client cannot
/// choose. [`Missing::Wiring`] when there is none: the layer that stores it must run before
/// this one and store it for every request it lets through (or add a fallback, e.g.
/// `extension::<User>().or(peer_ip())` for anonymous callers).
pub fn extension<T>() -> impl KeyExtractor + Clone
where
    T: Display + Send + Sync + 'static,
{
    |request: &Parts| match request.extensions.get::<T>() {
        Some(value) => Key::Value(value.to_string()),
        None => Key::Missing(Missing::Wiring(
            format!(
                "no {} in the request's extensions: the layer that stores it must run before \
                 the rate limit layer",
                std::any::type_name::<T>()
            )
            .into(),
        )),
    }
}

/// `METHOD /path`, e.g. `GET /orders`; for gRPC, `POST /package.Service/Method`.
pub fn method_path() -> impl KeyExtractor + Clone {
    |request: &Parts| format!("{} {}", request.method, request.uri.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(build: http::request::Builder) -> Parts {
        build.body(()).unwrap().into_parts().0
    }

    fn missing(key: Key) -> Missing {
        match key {
            Key::Missing(missing) => missing,
            other => panic!("expected a missing key, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_header_is_refused_unless_exempt_is_asked_for() {
        let without = parts(http::Request::builder());
        let found = missing(header("x-api-key").key(&without));
        assert!(matches!(found, Missing::Request(_)), "{found:?}");
        assert_eq!(found.reason(), "the request has no x-api-key header");
        assert_eq!(header("x-api-key").or(exempt()).key(&without), Key::Exempt);

        let with = parts(http::Request::builder().header("x-api-key", "k1"));
        assert_eq!(header("x-api-key").key(&with), Key::Value("k1".into()));
        assert_eq!(
            header("x-api-key").or(exempt()).key(&with),
            Key::Value("k1".into())
        );
    }

    #[test]
    fn or_falls_back_only_when_the_key_is_missing() {
        let request = parts(http::Request::builder().header("x-b", "b"));
        let first = header("x-a").or(header("x-b"));
        assert_eq!(first.key(&request), Key::Value("b".into()));
        // An exemption is a decision: no fallback is asked.
        assert_eq!(exempt().or(header("x-b")).key(&request), Key::Exempt);
        // Both missing: the fallback's reason.
        let neither = header("x-a").or(header("x-c"));
        assert_eq!(
            missing(neither.key(&request)).reason(),
            "the request has no x-c header"
        );
    }

    #[derive(Debug, Clone)]
    struct User(&'static str);

    impl Display for User {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    #[test]
    fn an_extension_is_read_with_its_display_and_its_absence_is_a_wiring_error() {
        let stored = parts(http::Request::builder().extension(User("alice")));
        assert_eq!(extension::<User>().key(&stored), Key::Value("alice".into()));
        let found = missing(extension::<User>().key(&parts(http::Request::builder())));
        assert!(matches!(found, Missing::Wiring(_)), "{found:?}");
        assert!(found.reason().contains("User"), "{}", found.reason());
    }

    #[test]
    fn closures_returning_none_fail_closed() {
        let none = |_: &Parts| None::<String>;
        let found = missing(none.key(&parts(http::Request::builder())));
        assert!(matches!(found, Missing::Request(_)), "{found:?}");
        let value = |_: &Parts| "fixed".to_string();
        assert_eq!(
            value.key(&parts(http::Request::builder())),
            Key::Value("fixed".into())
        );
    }
}
