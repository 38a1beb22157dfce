//! The caps on open connections per listener: `MAX_CONNECTIONS` in all, and
//! `MAX_CONNECTIONS_PER_PEER` from one peer address.
//!
//! Each listener holds a semaphore with one permit per allowed connection. An accepted
//! connection takes a permit and carries it until it is closed; when none is left, the new
//! connection is closed at once and counted. Closing at once, rather than leaving it in the
//! listen backlog, gives the client an immediate error it can act on (Envoy's `failure_mode_deny`,
//! another replica) instead of a connect that hangs until its timeout, and keeps the file
//! descriptors and memory of a connection flood bounded (about 14 KiB each, SECURITY.md).
//!
//! The per-peer cap is there so that one peer cannot take every permit: a flood from one
//! address (issue #27: 10 000 sockets each holding an unfinished request) leaves the rest of
//! the listener to the health probes and the other Envoys. Peers are told apart by IP address,
//! IPv6 ones by their /64 (one host usually holds a whole /64, so counting its addresses one by
//! one would give it millions of shares).
//!
//! The gRPC listeners also follow the overload manager (`overload.rs`): while the process is
//! near its memory ceiling they close new connections at accept.
//!
//! `sluice_connections_open{listener}` and `sluice_connections_rejected_total{listener,reason}`
//! show the caps at work.
//!
//! It also owns the hard end of a gRPC connection's life ([`Expiring`]): the server sends GOAWAY
//! at `GRPC_MAX_CONNECTION_AGE` and lets the calls in flight finish, and the connection itself
//! stops working at age + `GRPC_MAX_CONNECTION_AGE_GRACE`, whatever it still carries.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use prometheus::{IntCounter, IntGauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use super::overload::Overload;
use sluice::metrics::Metrics;

/// The caps of one listener.
#[derive(Clone)]
pub(crate) struct ConnectionLimit {
    /// `None`: no cap.
    permits: Option<Arc<Semaphore>>,
    /// `None`: no per-peer cap.
    peers: Option<Arc<PeerCounts>>,
    /// Set on the gRPC listeners: no connection is admitted while it says so.
    overload: Option<Arc<Overload>>,
    open: IntGauge,
    rejected_full: IntCounter,
    rejected_peer: IntCounter,
    rejected_overload: IntCounter,
}

/// The caps each listener enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// `MAX_CONNECTIONS`; zero: no cap.
    pub max: usize,
    /// `MAX_CONNECTIONS_PER_PEER`; zero: no cap.
    pub per_peer: usize,
}

impl ConnectionLimit {
    /// A zero cap means no cap (the connections are still counted).
    pub(crate) fn new(caps: Caps, listener: &str, metrics: &Metrics) -> ConnectionLimit {
        let rejected = |reason| {
            metrics
                .connections_rejected
                .with_label_values(&[listener, reason])
        };
        ConnectionLimit {
            permits: (caps.max > 0).then(|| Arc::new(Semaphore::new(caps.max))),
            peers: (caps.per_peer > 0).then(|| {
                Arc::new(PeerCounts {
                    max: caps.per_peer,
                    held: Mutex::new(HashMap::new()),
                })
            }),
            overload: None,
            open: metrics.connections_open.with_label_values(&[listener]),
            rejected_full: rejected("max_connections"),
            rejected_peer: rejected("max_connections_per_peer"),
            rejected_overload: rejected("overload"),
        }
    }

    /// This limit, also closing new connections while `overload` stops accepting.
    pub(crate) fn following(mut self, overload: Arc<Overload>) -> ConnectionLimit {
        self.overload = Some(overload);
        self
    }

    /// Wraps `io` with its permits, or drops it (closing the connection) when a cap is reached.
    /// `peer` is the client's address (`None` on a Unix socket: no per-peer cap there).
    pub(crate) fn admit<IO>(&self, io: IO, peer: Option<IpAddr>) -> Option<Admitted<IO>> {
        if self.overload.as_ref().is_some_and(|o| !o.accepting()) {
            self.rejected_overload.inc();
            return None;
        }
        let peer_slot = match (&self.peers, peer) {
            (Some(peers), Some(peer)) => match peers.take(peer) {
                Some(slot) => Some(slot),
                None => {
                    self.rejected_peer.inc();
                    return None;
                }
            },
            _ => None,
        };
        let permit = match &self.permits {
            None => None,
            Some(permits) => match permits.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.rejected_full.inc();
                    return None;
                }
            },
        };
        self.open.inc();
        Some(Admitted {
            io,
            peer,
            _permit: permit,
            _peer: peer_slot,
            open: self.open.clone(),
        })
    }

    /// Accepts until a connection is admitted. Accept errors (out of file descriptors, say) are
    /// logged and retried after a pause rather than ending the listener.
    pub(crate) async fn accept(&self, listener: &TcpListener) -> (Admitted<TcpStream>, SocketAddr) {
        self.accept_from(|| async {
            let (stream, peer) = listener.accept().await?;
            // Rate limit answers are small and latency-bound.
            let _ = stream.set_nodelay(true);
            Ok((stream, peer))
        })
        .await
    }

    /// [`Self::accept`] for any kind of listener, given as its accept call.
    async fn accept_from<IO, Peer: PeerAddr, Accepted>(
        &self,
        mut accept: impl FnMut() -> Accepted,
    ) -> (Admitted<IO>, Peer)
    where
        Accepted: Future<Output = io::Result<(IO, Peer)>>,
    {
        loop {
            match accept().await {
                Ok((io, peer)) => {
                    if let Some(admitted) = self.admit(io, peer.ip()) {
                        return (admitted, peer);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// A peer's address as the per-peer cap counts it.
trait PeerAddr {
    fn ip(&self) -> Option<IpAddr>;
}

impl PeerAddr for SocketAddr {
    fn ip(&self) -> Option<IpAddr> {
        Some(SocketAddr::ip(self))
    }
}

impl PeerAddr for Option<IpAddr> {
    fn ip(&self) -> Option<IpAddr> {
        *self
    }
}

/// Open connections per peer, for the per-peer cap. Only peers with a connection open are
/// held, so the map is bounded by the listener's `MAX_CONNECTIONS`.
struct PeerCounts {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PeerCounts {
    /// One more connection for `peer`, unless it holds its share already.
    fn take(self: &Arc<Self>, peer: IpAddr) -> Option<PeerSlot> {
        let peer = peer_key(peer);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(peer).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: self.clone(),
            peer,
        })
    }
}

/// The address a peer is counted under: IPv4 as it is (IPv4-mapped IPv6 included), IPv6 by
/// its /64.
pub(crate) fn peer_key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

/// One connection of a peer; dropping it gives the share back.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.counts.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// A listener the gRPC server accepts from: TCP, or a Unix socket (`GRPC_UDS`).
pub(crate) trait Acceptor: Send + Sync + 'static {
    type Io: Send + 'static;

    fn accept_io(&self) -> impl Future<Output = io::Result<(Self::Io, Option<IpAddr>)>> + Send;
}

impl Acceptor for TcpListener {
    type Io = TcpStream;

    async fn accept_io(&self) -> io::Result<(TcpStream, Option<IpAddr>)> {
        let (stream, peer) = self.accept().await?;
        // Rate limit answers are small and latency-bound.
        let _ = stream.set_nodelay(true);
        Ok((stream, Some(peer.ip())))
    }
}

impl Acceptor for UnixListener {
    type Io = UnixStream;

    /// A Unix socket's peers are local processes, with no address to tell them apart.
    async fn accept_io(&self) -> io::Result<(UnixStream, Option<IpAddr>)> {
        Ok((self.accept().await?.0, None))
    }
}

/// The admitted connections of `listener`, as the stream tonic serves from, each closed
/// `lifetime` after it is handed over (`None`: never).
pub(crate) fn incoming<L: Acceptor>(
    listener: L,
    limit: ConnectionLimit,
    lifetime: Option<Duration>,
) -> impl Stream<Item = io::Result<Expiring<Admitted<L::Io>>>> + Send + 'static {
    futures::stream::unfold((listener, limit), move |(listener, limit)| async move {
        let (admitted, _) = limit.accept_from(|| listener.accept_io()).await;
        Some((Ok(Expiring::new(admitted, lifetime)), (listener, limit)))
    })
}

/// A TCP listener that admits connections under `limit` (the HTTP/1 listeners).
pub(crate) struct LimitedListener {
    pub listener: TcpListener,
    pub limit: ConnectionLimit,
}

impl LimitedListener {
    /// The admitted connections, as the HTTP/1 server serves them.
    pub(crate) fn incoming(self) -> impl Stream<Item = io::Result<Admitted<TcpStream>>> + Send {
        futures::stream::unfold(self, |this| async move {
            let (admitted, _) = this.limit.accept(&this.listener).await;
            Some((Ok(admitted), this))
        })
    }
}

/// A connection holding its permit: closing (dropping) it gives the permit back.
pub(crate) struct Admitted<IO> {
    io: IO,
    peer: Option<IpAddr>,
    _permit: Option<OwnedSemaphorePermit>,
    _peer: Option<PeerSlot>,
    open: IntGauge,
}

/// A connection that knows its client's address, wherever it is wrapped (TLS, deadlines): the
/// request budgets (`budget.rs`) count per peer.
pub(crate) trait Peer {
    /// `None` on a Unix socket.
    fn peer(&self) -> Option<IpAddr>;
}

impl<IO> Peer for Admitted<IO> {
    fn peer(&self) -> Option<IpAddr> {
        self.peer
    }
}

impl<IO: Peer> Peer for Expiring<IO> {
    fn peer(&self) -> Option<IpAddr> {
        self.io.peer()
    }
}

impl<IO> Drop for Admitted<IO> {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Admitted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Why an [`Expiring`] connection stopped working.
#[derive(Debug, thiserror::Error)]
#[error("the connection reached GRPC_MAX_CONNECTION_AGE plus GRPC_MAX_CONNECTION_AGE_GRACE")]
pub(crate) struct Expired;

/// A connection that fails every read, write and flush once its lifetime has passed, so the
/// HTTP/2 server serving it gives up and drops it (closing the socket), whatever calls it still
/// carries. Until then it is the connection itself.
///
/// The deadline is a timer, polled by the first operation, which arms it. After that, every
/// read and write looks at whether it has fired, which is one atomic load; only an operation
/// that makes the task wait (it returned `Pending`) polls it again, so that it wakes the task at
/// the deadline: an idle connection waits in a read, so the deadline still ends it. Polling the
/// timer on every operation, as this did before, registered the task's waker with it about six
/// times per request.
pub(crate) struct Expiring<IO> {
    io: IO,
    /// `None`: no deadline.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Whether the timer has been polled once: before that it cannot fire.
    armed: bool,
    expired: bool,
}

impl<IO> Expiring<IO> {
    /// `io`, closed `lifetime` from now (`None`: never).
    pub(crate) fn new(io: IO, lifetime: Option<Duration>) -> Expiring<IO> {
        Expiring {
            io,
            // `sleep` saturates a deadline too far away to represent, so any lifetime is fine.
            deadline: lifetime.map(|lifetime| Box::pin(tokio::time::sleep(lifetime))),
            armed: false,
            expired: false,
        }
    }

    /// Whether the lifetime has passed (the timer has fired, or fires as it is armed).
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.expired {
            let Some(deadline) = &mut self.deadline else {
                return Ok(());
            };
            let passed = if self.armed {
                deadline.is_elapsed()
            } else {
                self.armed = true;
                deadline.as_mut().poll(cx).is_ready()
            };
            if !passed {
                return Ok(());
            }
            self.expire();
        }
        Err(expired())
    }

    /// `poll` as the connection answered it; when it makes the task wait, the deadline must be
    /// able to wake the task, so the timer is polled (and when it has passed, the operation
    /// fails instead).
    fn wait<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() || self.expired {
            return poll;
        }
        let Some(deadline) = &mut self.deadline else {
            return poll;
        };
        if deadline.as_mut().poll(cx).is_pending() {
            return poll;
        }
        self.expire();
        Poll::Ready(Err(expired()))
    }

    fn expire(&mut self) {
        self.expired = true;
        self.deadline = None;
        tracing::debug!("closing a gRPC connection: {Expired}");
    }
}

fn expired() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, Expired)
}

impl<IO: AsyncRead + Unpin> AsyncRead for Expiring<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        self.wait(cx, poll)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Expiring<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wait(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wait(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.wait(cx, poll)
    }

    // Shutting down stays possible after the deadline: it is how the socket gets closed.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Expiring<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn each_peer_gets_its_share_and_gets_it_back_on_close() {
        let metrics = Metrics::new(0.8);
        let caps = Caps {
            max: 5,
            per_peer: 2,
        };
        let limit = ConnectionLimit::new(caps, "test", &metrics);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limit.admit((), Some(a)).expect("a's first");
        let _second = limit.admit((), Some(a)).expect("a's second");
        assert!(limit.admit((), Some(a)).is_none(), "a over its share");
        // The same host over IPv4-mapped IPv6 is the same peer.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(limit.admit((), Some(mapped)).is_none());
        let _b = limit.admit((), Some(b)).expect("another peer");
        // A Unix socket's peers have no address: only the total cap applies.
        let _unix = limit.admit((), None).expect("no address");
        drop(first);
        let _again = limit.admit((), Some(a)).expect("a's share is back");
        let _b2 = limit.admit((), Some(b)).expect("b's second");
        // Five open: the total cap now.
        assert!(limit.admit((), None).is_none());
        let rejected = |reason| {
            metrics
                .connections_rejected
                .with_label_values(&["test", reason])
                .get()
        };
        assert_eq!(rejected("max_connections_per_peer"), 2);
        assert_eq!(rejected("max_connections"), 1);
    }

    #[test]
    fn an_ipv6_peer_is_counted_by_its_64() {
        let key = |s: &str| peer_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:bbbb::2"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
    }

    #[tokio::test]
    async fn an_expiring_connection_works_until_its_lifetime_and_then_fails_even_when_idle() {
        let lifetime = Duration::from_millis(200);
        let (ours, mut peer) = tokio::io::duplex(64);
        let started = Instant::now();
        let mut conn = Expiring::new(ours, Some(lifetime));
        peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).await.unwrap();
        conn.write_all(b"pong").await.unwrap();

        // Nothing more arrives: the read waiting for it is woken by the deadline.
        let e = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("the deadline ends the idle read")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.get_ref().is_some_and(|e| e.is::<Expired>()), "{e}");
        assert!(started.elapsed() >= lifetime);
        assert!(conn.write_all(b"late").await.is_err());
        assert!(conn.flush().await.is_err());
        // Shutting down still works: it is how the socket gets closed.
        conn.shutdown().await.unwrap();
    }

    /// A connection whose every operation completes at once never waits, so the timer is only
    /// armed by its first operation; the deadline must end it all the same.
    #[tokio::test]
    async fn a_connection_that_never_waits_still_expires() {
        let lifetime = Duration::from_millis(100);
        let (ours, _peer) = tokio::io::duplex(1 << 16);
        let mut conn = Expiring::new(ours, Some(lifetime));
        conn.write_all(b"first").await.unwrap();
        tokio::time::sleep(lifetime * 2).await;
        let e = conn.write_all(b"late").await.unwrap_err();
        assert!(e.get_ref().is_some_and(|e| e.is::<Expired>()), "{e}");
    }
}
