//! What a request is limited by: a [`KeyExtractor`] reads one value from the request's head
//! (method, URI, headers, extensions) and [`crate::RateLimitLayer`] sends it to Sluice as a
//! descriptor entry.
//!
//! gRPC metadata is carried as HTTP/2 headers, so [`header`] reads it too, and a gRPC method is
//! the request path (`/package.Service/Method`).

use std::net::SocketAddr;

use http::request::Parts;

/// Reads the value a request is limited by. `None` means "no value": the request is not limited,
/// as Envoy sends no descriptor when an action finds nothing to put in it. Chain a fallback with
/// [`KeyExtractor::or`] where every request must be counted.
///
/// Any `Fn(&http::request::Parts) -> Option<String>` is an extractor.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The value for `request`, or `None` to let it pass unlimited.
    fn key(&self, request: &Parts) -> Option<String>;

    /// This extractor's value, or `fallback`'s when it finds none.
    fn or<E: KeyExtractor>(self, fallback: E) -> Or<Self, E>
    where
        Self: Sized,
    {
        Or(self, fallback)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn key(&self, request: &Parts) -> Option<String> {
        self(request)
    }
}

/// The first extractor's value, else the second's ([`KeyExtractor::or`]).
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn key(&self, request: &Parts) -> Option<String> {
        self.0.key(request).or_else(|| self.1.key(request))
    }
}

/// The value of header (or gRPC metadata entry) `name`; `None` when absent.
///
/// A value that is not UTF-8 (HTTP allows obs-text bytes) is read with each invalid sequence as
/// U+FFFD rather than skipped: skipping would let a client escape its limit by sending one such
/// byte. Values differing only in invalid bytes then share a budget, which errs on the side of
/// limiting.
pub fn header(name: &'static str) -> impl KeyExtractor {
    move |request: &Parts| {
        let value = request.headers.get(name)?;
        Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
    }
}

/// `METHOD /path`, e.g. `GET /orders`; for gRPC, `POST /package.Service/Method`.
pub fn method_path() -> impl KeyExtractor {
    |request: &Parts| Some(format!("{} {}", request.method, request.uri.path()))
}

/// The peer's IP address, from the connection information the server put in the request's
/// extensions: axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's `TcpConnectInfo`, or a
/// [`PeerAddr`] a hyper service inserted itself ([`peer_addr_into_extensions`]).
/// `None` when the server recorded none (a Unix socket, say).
pub fn peer_ip() -> impl KeyExtractor {
    |request: &Parts| Some(peer_addr(request)?.ip().to_string())
}

/// A peer address a server stored for [`peer_ip`]: insert `PeerAddr(addr)` into each request's
/// extensions (a hyper service knows the address when it accepts the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Where the servers this crate knows keep the peer's address.
fn peer_addr(request: &Parts) -> Option<SocketAddr> {
    let extensions = &request.extensions;
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(*addr);
    }
    if let Some(info) = extensions.get::<tonic::transport::server::TcpConnectInfo>() {
        return info.remote_addr();
    }
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    None
}

/// Stores `addr` as the request's [`PeerAddr`]; for hyper services that serve connections
/// themselves.
pub fn peer_addr_into_extensions<B>(request: &mut http::Request<B>, addr: SocketAddr) {
    request.extensions_mut().insert(PeerAddr(addr));
}
