//! The cap on open connections per listener (`MAX_CONNECTIONS`).
//!
//! Each listener holds a semaphore with one permit per allowed connection. An accepted
//! connection takes a permit and carries it until it is closed; when none is left, the new
//! connection is closed at once and counted. Closing at once, rather than leaving it in the
//! listen backlog, gives the client an immediate error it can act on (Envoy's `failure_mode_deny`,
//! another replica) instead of a connect that hangs until its timeout, and keeps the file
//! descriptors and memory of a connection flood bounded (about 14 KiB each, SECURITY.md).
//!
//! `sluice_connections_open{listener}` and `sluice_connections_rejected_total{listener}` show the
//! cap at work.
//!
//! It also owns the hard end of a gRPC connection's life ([`Expiring`]): tonic sends GOAWAY at
//! `GRPC_MAX_CONNECTION_AGE` and lets the calls in flight finish, but it has no way to give up
//! on them after `GRPC_MAX_CONNECTION_AGE_GRACE` without skipping the GOAWAY, so the connection
//! itself stops working at age + grace.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use prometheus::{IntCounter, IntGauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::metrics::Metrics;

/// The cap of one listener.
#[derive(Clone)]
pub struct ConnectionLimit {
    /// `None`: no cap.
    permits: Option<Arc<Semaphore>>,
    open: IntGauge,
    rejected: IntCounter,
}

impl ConnectionLimit {
    /// `max == 0` means no cap (the connections are still counted).
    pub fn new(max: usize, listener: &str, metrics: &Metrics) -> ConnectionLimit {
        ConnectionLimit {
            permits: (max > 0).then(|| Arc::new(Semaphore::new(max))),
            open: metrics.connections_open.with_label_values(&[listener]),
            rejected: metrics.connections_rejected.with_label_values(&[listener]),
        }
    }

    /// Wraps `io` with a permit, or drops it (closing the connection) when the cap is reached.
    pub fn admit<IO>(&self, io: IO) -> Option<Admitted<IO>> {
        let permit = match &self.permits {
            None => None,
            Some(permits) => match permits.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.rejected.inc();
                    return None;
                }
            },
        };
        self.open.inc();
        Some(Admitted {
            io,
            _permit: permit,
            open: self.open.clone(),
        })
    }

    /// Accepts until a connection is admitted. Accept errors (out of file descriptors, say) are
    /// logged and retried after a pause rather than ending the listener.
    pub async fn accept(&self, listener: &TcpListener) -> (Admitted<TcpStream>, SocketAddr) {
        self.accept_from(|| async {
            let (stream, peer) = listener.accept().await?;
            // Rate limit answers are small and latency-bound.
            let _ = stream.set_nodelay(true);
            Ok((stream, peer))
        })
        .await
    }

    /// [`Self::accept`] for any kind of listener, given as its accept call.
    async fn accept_from<IO, Peer, Accepted>(
        &self,
        mut accept: impl FnMut() -> Accepted,
    ) -> (Admitted<IO>, Peer)
    where
        Accepted: Future<Output = io::Result<(IO, Peer)>>,
    {
        loop {
            match accept().await {
                Ok((io, peer)) => {
                    if let Some(admitted) = self.admit(io) {
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

/// A listener the gRPC server accepts from: TCP, or a Unix socket (`GRPC_UDS`).
pub(crate) trait Acceptor: Send + Sync + 'static {
    type Io: Send + 'static;

    fn accept_io(&self) -> impl Future<Output = io::Result<(Self::Io, ())>> + Send;
}

impl Acceptor for TcpListener {
    type Io = TcpStream;

    async fn accept_io(&self) -> io::Result<(TcpStream, ())> {
        let (stream, _) = self.accept().await?;
        // Rate limit answers are small and latency-bound.
        let _ = stream.set_nodelay(true);
        Ok((stream, ()))
    }
}

impl Acceptor for UnixListener {
    type Io = UnixStream;

    async fn accept_io(&self) -> io::Result<(UnixStream, ())> {
        Ok((self.accept().await?.0, ()))
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
        let (admitted, ()) = limit.accept_from(|| listener.accept_io()).await;
        Some((Ok(Expiring::new(admitted, lifetime)), (listener, limit)))
    })
}

/// A listener for axum that admits connections under `limit`.
pub(crate) struct LimitedListener {
    pub listener: TcpListener,
    pub limit: ConnectionLimit,
}

impl axum::serve::Listener for LimitedListener {
    type Io = Admitted<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.limit.accept(&self.listener).await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A connection holding its permit: closing (dropping) it gives the permit back.
pub struct Admitted<IO> {
    io: IO,
    _permit: Option<OwnedSemaphorePermit>,
    open: IntGauge,
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
pub struct Expiring<IO> {
    io: IO,
    /// `None`: no deadline.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Whether the timer has been polled once: before that it cannot fire.
    armed: bool,
    expired: bool,
}

impl<IO> Expiring<IO> {
    /// `io`, closed `lifetime` from now (`None`: never).
    pub fn new(io: IO, lifetime: Option<Duration>) -> Expiring<IO> {
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
