//! The peer's address as the key ([`peer_ip`]): read from where the servers this crate knows
//! record it (a [`PeerAddr`] a hyper service inserts, tonic's `TcpConnectInfo`, and with the
//! crate's `axum` feature axum's `ConnectInfo`), keyed by its prefix (`ip.rs`).
//!
//! A server that records no address is a wiring mistake (axum served without
//! `into_make_service_with_connect_info`): every request would look alike, so the extractor
//! answers [`Missing::Wiring`] and the layer refuses, rather than letting everything through.
//! Reading axum's `ConnectInfo` is the crate's only use of axum, hence the feature: a tonic or
//! hyper service builds without axum. Without it an axum service can still be keyed by its
//! peer: a middleware that copies `ConnectInfo` into a [`PeerAddr`].

use std::net::SocketAddr;

use http::request::Parts;

use super::ip::Prefixes;
use super::{Key, KeyExtractor, Missing};

/// The key of the peer's IP address; made by [`peer_ip`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    prefixes: Prefixes,
}

/// The peer's IP address, from the connection information the server put in the request's
/// extensions: a [`PeerAddr`] the service inserted itself ([`peer_addr_into_extensions`]),
/// tonic's `TcpConnectInfo`, or axum's `ConnectInfo<SocketAddr>` (with the crate's `axum`
/// feature, on by default).
///
/// An IPv4 address is the key as it is; an IPv6 address is keyed by its /64 network
/// (`2001:db8:1:2::/64`), since one host usually holds a whole /64 and could change address
/// with every request. [`PeerIp::ipv6_prefix`] and [`PeerIp::ipv4_prefix`] change the lengths.
/// An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) counts as its IPv4 address.
///
/// Without a recorded address the request is refused ([`Missing::Wiring`], `500`), never
/// passed unlimited. With axum, serve the router with connect info:
///
/// ```no_run
/// use std::net::SocketAddr;
/// use axum::{Router, routing::get};
/// use sluice_client::{Client, SluiceLayer, key};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::builder().connect_lazy("http://127.0.0.1:8081")?;
/// let limit = SluiceLayer::builder(client, "api")
///     .key("remote_address", key::peer_ip())
///     .build();
/// let app = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(limit);
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
/// // Not `axum::serve(listener, app)`: that records no peer address.
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
/// # Ok(())
/// # }
/// ```
///
/// Behind a reverse proxy every peer is the proxy: use [`super::x_forwarded_for`] or
/// [`super::forwarded()`] there.
pub fn peer_ip() -> PeerIp {
    PeerIp {
        prefixes: Prefixes::default(),
    }
}

impl PeerIp {
    /// Keys IPv6 addresses by their first `len` bits (64 unless set; above 128 counts as 128).
    /// A longer prefix gives each party more budgets to rotate through, a shorter one puts
    /// more neighbours in one budget.
    pub fn ipv6_prefix(self, len: u8) -> Self {
        PeerIp {
            prefixes: self.prefixes.with_v6(len),
        }
    }

    /// Keys IPv4 addresses by their first `len` bits (32, the whole address, unless set; above
    /// 32 counts as 32): `ipv4_prefix(24)` gives each /24 one budget, shared by every host in it.
    pub fn ipv4_prefix(self, len: u8) -> Self {
        PeerIp {
            prefixes: self.prefixes.with_v4(len),
        }
    }
}

/// What to do when no peer address is found, said to whoever reads the refusal.
#[cfg(feature = "axum")]
const NO_PEER_ADDRESS: &str = "the server recorded no peer address (with axum, serve \
    `into_make_service_with_connect_info::<SocketAddr>()`)";
#[cfg(not(feature = "axum"))]
const NO_PEER_ADDRESS: &str = "the server recorded no peer address (insert a \
    sluice_client::key::PeerAddr; axum's `into_make_service_with_connect_info` is read only with \
    sluice-client's `axum` feature)";

impl KeyExtractor for PeerIp {
    fn key(&self, request: &Parts) -> Key {
        match peer_addr(request) {
            Some(addr) => Key::Value(self.prefixes.key(addr.ip())),
            None => Key::Missing(Missing::Wiring(NO_PEER_ADDRESS.into())),
        }
    }
}

/// A peer address a server stored for [`peer_ip`]: insert `PeerAddr::new(addr)` into each
/// request's extensions (a hyper service knows the address when it accepts the connection;
/// [`peer_addr_into_extensions`] does it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(SocketAddr);

impl PeerAddr {
    /// The peer at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        PeerAddr(addr)
    }

    /// The peer's address.
    pub fn addr(self) -> SocketAddr {
        self.0
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        PeerAddr(addr)
    }
}

/// Where the servers this crate knows keep the peer's address.
fn peer_addr(request: &Parts) -> Option<SocketAddr> {
    let extensions = &request.extensions;
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(*addr);
    }
    if let Some(info) = extensions.get::<tonic::transport::server::TcpConnectInfo>() {
        return info.remote_addr();
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    None
}

/// Stores `addr` as the request's [`PeerAddr`]; for hyper services that serve connections
/// themselves, and for axum services built without the crate's `axum` feature.
pub fn peer_addr_into_extensions<B>(request: &mut http::Request<B>, addr: SocketAddr) {
    request.extensions_mut().insert(PeerAddr(addr));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(addr: &str) -> Parts {
        let mut request = http::Request::new(());
        peer_addr_into_extensions(&mut request, addr.parse().unwrap());
        request.into_parts().0
    }

    #[test]
    fn the_peer_is_keyed_by_its_prefix() {
        let key = |extractor: PeerIp, addr| extractor.key(&from(addr));
        let value = |s: &str| Key::Value(s.into());
        assert_eq!(key(peer_ip(), "203.0.113.7:4711"), value("203.0.113.7"));
        assert_eq!(
            key(peer_ip(), "[2001:db8:1:2:3:4:5:6]:4711"),
            value("2001:db8:1:2::/64")
        );
        assert_eq!(
            key(peer_ip(), "[::ffff:203.0.113.7]:4711"),
            value("203.0.113.7")
        );
        assert_eq!(
            key(peer_ip().ipv6_prefix(48), "[2001:db8:1:2::1]:1"),
            value("2001:db8:1::/48")
        );
        assert_eq!(
            key(peer_ip().ipv4_prefix(16), "203.0.113.7:1"),
            value("203.0.0.0/16")
        );
    }

    #[cfg(feature = "axum")]
    #[test]
    fn the_address_is_read_where_axum_puts_it() {
        let mut request = http::Request::new(());
        let addr: SocketAddr = "[2001:db8::9]:80".parse().unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        let (parts, ()) = request.into_parts();
        assert_eq!(peer_ip().key(&parts), Key::Value("2001:db8::/64".into()));
    }

    /// Without the `axum` feature, axum's record is not read: the request is refused, and the
    /// reason names the feature.
    #[cfg(not(feature = "axum"))]
    #[test]
    fn without_the_axum_feature_axums_record_is_not_read() {
        let mut request = http::Request::new(());
        let addr: SocketAddr = "[2001:db8::9]:80".parse().unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        let (parts, ()) = request.into_parts();
        match peer_ip().key(&parts) {
            Key::Missing(Missing::Wiring(reason)) => {
                assert!(reason.contains("`axum` feature"), "{reason}");
            }
            other => panic!("expected a wiring error, got {other:?}"),
        }
    }

    #[test]
    fn the_address_is_read_where_tonic_puts_it() {
        use tonic::transport::server::Connected;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let info = runtime.block_on(async {
            tokio::net::TcpStream::from_std(accepted)
                .unwrap()
                .connect_info()
        });
        let mut request = http::Request::new(());
        request.extensions_mut().insert(info);
        let (parts, ()) = request.into_parts();
        assert_eq!(peer_ip().key(&parts), Key::Value(peer.ip().to_string()));
        drop(client);
    }

    #[test]
    fn no_recorded_address_is_a_wiring_error_not_a_pass() {
        let (parts, ()) = http::Request::new(()).into_parts();
        match peer_ip().key(&parts) {
            Key::Missing(Missing::Wiring(reason)) => {
                assert!(reason.contains("connect_info"), "{reason}");
            }
            other => panic!("expected a wiring error, got {other:?}"),
        }
    }
}
