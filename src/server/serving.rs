//! Serving admitted connections with hyper, so that a slot is held only by a client that
//! speaks (issue #27, item 4).
//!
//! tonic's and axum's own serve loops give a connection no deadline before its first request
//! and none while it sits idle: a client holding sockets with an unfinished request or half an
//! HTTP/2 preface kept every `MAX_CONNECTIONS` slot for as long as it liked. Here each listener
//! runs its own accept loop and serves each connection with hyper directly:
//!
//! - HTTP/1 listeners (HTTP, debug, metrics): hyper's header read timeout
//!   (`HTTP_READ_HEADER_TIMEOUT`). hyper starts it whenever it waits for a request's head, so it
//!   also bounds the idle time between two requests of a keep-alive connection.
//! - gRPC listeners (HTTP/2): the TLS handshake and the 24-byte preface must be done within
//!   `GRPC_HANDSHAKE_TIMEOUT` of the accept ([`Preface`]); a connection with no call in flight
//!   for `GRPC_MAX_CONNECTION_IDLE` gets a graceful GOAWAY (hyper's graceful shutdown, which
//!   lets a call racing with it finish), as at `GRPC_MAX_CONNECTION_AGE`. Envoy reconnects on
//!   its next call. The h2 keep-alive ping closes connections whose peer stopped answering.
//!
//! Every gRPC call's request body is read under the request budgets (`budget.rs`): whole within
//! `HTTP_READ_HEADER_TIMEOUT`, and what a call waiting for the rest holds counted per
//! connection, peer and process. The HTTP/2 windows are sized for what RLS and the native API
//! send ([`STREAM_WINDOW`], [`CONNECTION_WINDOW`]).
//!
//! A gRPC call's `grpc-timeout` is enforced as tonic's server loop did ([`grpc_timeout`]), and
//! handed to the handlers as a `Deadline` in the request's extensions, which they give to the
//! call's store calls (`store::Call`); those then answer first, with a margin, so the caller
//! gets an answer rather than `CANCELLED`. The routes answer one too short for a store at once
//! (`GRPC_MIN_TIMEOUT`).
//!
//! On shutdown every connection gets a graceful shutdown (GOAWAY, or `Connection: close` after
//! the request in progress) and the loop returns once all have closed; `app` bounds that wait
//! with `SHUTDOWN_GRACE_PERIOD`.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::budget::{BodyKind, ConnectionBudget, RequestBudget};
use super::connections::Peer;
use super::routes::{self, GrpcRoutes};
use sluice::metrics::Metrics;
use sluice::store::deadline::Deadline;

/// Length of the HTTP/2 client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_LEN: usize = 24;

/// What an HTTP/1 listener enforces.
#[derive(Debug, Clone)]
pub(crate) struct Http1Options {
    /// `HTTP_READ_HEADER_TIMEOUT`; `None`: none.
    pub header_timeout: Option<Duration>,
    /// The request budgets its bodies are read under (`/json`), shared with every listener.
    pub budget: Arc<RequestBudget>,
    /// Put the peer's address in each request's extensions ([`PeerIp`]): only the debug
    /// listener, whose admin API logs who reset a counter; elsewhere it would cost an
    /// allocation per request.
    pub peer_extension: bool,
}

/// The address of the peer a request came from (HTTP on the debug listener, gRPC calls to the
/// admin API), for the admin API's log of resets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerIp(pub Option<std::net::IpAddr>);

/// The path prefix of the admin API's gRPC calls, the only gRPC calls given a [`PeerIp`].
const ADMIN_PREFIX: &str = "/sluice.v1.Admin/";

/// What a gRPC (HTTP/2) listener enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http2Options {
    /// Concurrent calls on one connection.
    pub max_streams: u32,
    /// h2 PING every this long; no answer within `keepalive_timeout` closes the connection.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// `GRPC_MAX_CONNECTION_AGE`: GOAWAY after this; `None`: never.
    pub max_age: Option<Duration>,
    /// `GRPC_MAX_CONNECTION_IDLE`: GOAWAY after this long without a call in flight; `None`:
    /// never.
    pub max_idle: Option<Duration>,
}

/// The counters of connections a listener closed because their client was silent.
#[derive(Clone)]
pub(crate) struct Closed {
    handshake_timeout: IntCounter,
    header_timeout: IntCounter,
    idle: IntCounter,
}

impl Closed {
    pub(crate) fn new(listener: &str, metrics: &Metrics) -> Closed {
        let counter = |reason| {
            metrics
                .connections_closed
                .with_label_values(&[listener, reason])
        };
        Closed {
            handshake_timeout: counter("handshake_timeout"),
            header_timeout: counter("header_timeout"),
            idle: counter("idle"),
        }
    }

    pub(crate) fn handshake_timeout(&self) {
        self.handshake_timeout.inc();
    }
}

/// Tells every connection of a listener that it is shutting down, and lets the listener wait
/// until they have all closed.
struct Shutdown {
    tx: watch::Sender<()>,
    rx: watch::Receiver<()>,
}

impl Shutdown {
    fn new() -> Shutdown {
        let (tx, rx) = watch::channel(());
        Shutdown { tx, rx }
    }

    /// A receiver for one connection; it holds it until it closes.
    fn watcher(&self) -> watch::Receiver<()> {
        self.rx.clone()
    }

    /// Signals every connection and waits until they have all dropped their receivers.
    async fn drain(self) {
        let Shutdown { tx, rx } = self;
        let _ = tx.send(());
        drop(rx);
        tx.closed().await;
    }
}

/// Serves each connection `incoming` yields with `serve_one` until `stopped`, then shuts them
/// down gracefully and returns once they have closed. The listener (inside `incoming`) is
/// dropped first, so new clients are refused at once rather than left hanging.
async fn accept_loop<IO>(
    incoming: impl Stream<Item = io::Result<IO>>,
    stopped: impl Future<Output = ()>,
    mut serve_one: impl FnMut(IO, watch::Receiver<()>),
) {
    let shutdown = Shutdown::new();
    {
        let mut incoming = pin!(incoming);
        let mut stopped = pin!(stopped);
        loop {
            tokio::select! {
                () = &mut stopped => break,
                next = incoming.next() => match next {
                    Some(Ok(io)) => serve_one(io, shutdown.watcher()),
                    Some(Err(e)) => tracing::debug!(error = %e, "connection not accepted"),
                    None => break,
                },
            }
        }
    }
    shutdown.drain().await;
}

/// Serves `app` over HTTP/1 on every connection of `incoming` until `stopped`, reading request
/// bodies under the request budgets.
pub(crate) async fn serve_http1<IO>(
    incoming: impl Stream<Item = io::Result<IO>>,
    app: axum::Router,
    options: Http1Options,
    closed: Closed,
    stopped: impl Future<Output = ()>,
) where
    IO: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    accept_loop(incoming, stopped, |io, mut shutdown| {
        let app = app.clone();
        let builder = builder.clone();
        let closed = closed.clone();
        let peer = io.peer();
        let budget = options.budget.connection(peer);
        let peer_extension = options.peer_extension;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                let header_bytes = header_bytes(&request);
                let arrived = Instant::now();
                let mut request = request.map(|body| {
                    axum::body::Body::new(budget.body(body, arrived, header_bytes, BodyKind::Plain))
                });
                if peer_extension {
                    request.extensions_mut().insert(PeerIp(peer));
                }
                // axum's router is always ready, so it can be called without `poll_ready`.
                let mut app = app.clone();
                app.call(request)
            });
            let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
            let mut shutting_down = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            if e.is_timeout() {
                                closed.header_timeout.inc();
                            }
                            tracing::debug!(error = %e, "HTTP connection ended");
                        }
                        break;
                    }
                    _ = shutdown.changed(), if !shutting_down => {
                        shutting_down = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    })
    .await;
}

/// Calls a client may cancel before the server has taken them up, at once, before its
/// connection is sent away (GOAWAY `ENHANCE_YOUR_CALM`). This is the defence against rapid reset
/// (CVE-2023-44487: streams opened and reset in bulk, each costing the server a call it never
/// runs). h2's own default, stated here so that a change of hyper's or h2's default cannot drop
/// it; `tests/connections.rs` sends such bursts.
const MAX_CANCELLED_BEFORE_ACCEPT: usize = 20;

/// Calls the server may reset for a client's protocol errors (a malformed request, say) before
/// that client's connection is sent away (GOAWAY `ENHANCE_YOUR_CALM`): the defence against
/// MadeYouReset (CVE-2025-8671), rapid reset with the resets made the server's so that the limit
/// above does not count them. hyper's default, stated here for the same reason.
const MAX_RESETS_FOR_CLIENT_ERRORS: usize = 1024;

/// The flow-control window of one call's request: what a client may send of it before the
/// server has read any. RLS and native-API requests are a few hundred bytes; a larger one (up to
/// the 1 MiB message limit) takes a window update per 64 KiB, which the server sends as it
/// reads. HTTP/2's own default; hyper's is 1 MiB.
pub(crate) const STREAM_WINDOW: u32 = 64 * 1024;

/// The flow-control window of a connection: the most its client may have sent that the server
/// has not read yet, over all its calls. It bounds h2's receive buffers per connection; what is
/// read goes under the request budgets (`budget.rs`).
pub(crate) const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// Serves the gRPC `routes` over HTTP/2 on every connection of `incoming` until `stopped`,
/// reading every call's request under `budget`.
pub(crate) async fn serve_http2<IO>(
    incoming: impl Stream<Item = io::Result<IO>>,
    routes: GrpcRoutes,
    options: Http2Options,
    budget: Arc<RequestBudget>,
    closed: Closed,
    stopped: impl Future<Output = ()>,
) where
    IO: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(options.max_streams)
        .max_pending_accept_reset_streams(MAX_CANCELLED_BEFORE_ACCEPT)
        .max_local_error_reset_streams(MAX_RESETS_FOR_CLIENT_ERRORS)
        .keep_alive_interval(options.keepalive_interval)
        .keep_alive_timeout(options.keepalive_timeout);
    accept_loop(incoming, stopped, |io, shutdown| {
        let connection = Http2Connection {
            builder: builder.clone(),
            routes: routes.clone(),
            options,
            budget: budget.clone(),
            closed: closed.clone(),
        };
        tokio::spawn(connection.serve(io, shutdown));
    })
    .await;
}

struct Http2Connection {
    builder: hyper::server::conn::http2::Builder<TokioExecutor>,
    routes: GrpcRoutes,
    options: Http2Options,
    budget: Arc<RequestBudget>,
    closed: Closed,
}

impl Http2Connection {
    async fn serve<IO>(self, io: IO, mut shutdown: watch::Receiver<()>)
    where
        IO: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
    {
        let Http2Connection {
            builder,
            routes,
            options,
            budget,
            closed,
        } = self;
        let calls = Arc::new(Calls::new());
        let peer = io.peer();
        let budget = budget.connection(peer);
        let service = {
            let calls = calls.clone();
            hyper::service::service_fn(move |request: http::Request<Incoming>| {
                call(&calls, (&budget, peer), &routes, request)
            })
        };
        let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
        let mut age = pin!(sleep_or_never(options.max_age));
        let mut idle = pin!(calls.idle_for(options.max_idle));
        let mut shutting_down = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "gRPC connection ended");
                    }
                    break;
                }
                _ = shutdown.changed(), if !shutting_down => {
                    shutting_down = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = &mut age, if !shutting_down => {
                    shutting_down = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = &mut idle, if !shutting_down => {
                    shutting_down = true;
                    closed.idle.inc();
                    tracing::debug!("GOAWAY to a gRPC connection without calls for GRPC_MAX_CONNECTION_IDLE");
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// One gRPC call of a connection: its request read under the connection's `budget`, its
/// caller's deadline handed to the handler (in the request's extensions) and enforced, and its
/// end noted in `calls` for the idle timer.
fn call(
    calls: &Arc<Calls>,
    (budget, peer): (&Arc<ConnectionBudget>, Option<std::net::IpAddr>),
    routes: &GrpcRoutes,
    request: http::Request<Incoming>,
) -> impl Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send + use<> {
    let call = calls.start();
    let arrived = Instant::now();
    let deadline = grpc_timeout(request.headers());
    let header_bytes = header_bytes(&request);
    let kind = if routes::streams_requests(request.uri().path()) {
        BodyKind::Streaming
    } else {
        BodyKind::Unary
    };
    let mut request = request.map(|body| budget.body(body, arrived, header_bytes, kind));
    // The handlers hand the caller's deadline (less a margin for the answer to travel) to their
    // store calls, which then answer before it whatever REDIS_TIMEOUT says, so the enforcement
    // below only cuts a handler that is late for other reasons.
    if let Some(timeout) = deadline {
        request
            .extensions_mut()
            .insert(Deadline::of(arrived, timeout));
    }
    if request.uri().path().starts_with(ADMIN_PREFIX) {
        request.extensions_mut().insert(PeerIp(peer));
    }
    // The handler's future is boxed (`routes::ResponseFuture`), so this one stays small: hyper
    // moves it into the call's task, a copy per move (docs/BENCHMARKS.md, "Issue #30, part 4").
    let response = routes.call(request.map(tonic::body::Body::new), arrived, deadline);
    async move {
        let response: Result<_, Infallible> = match deadline {
            None => response.await,
            Some(deadline) => match tokio::time::timeout(deadline, response).await {
                Ok(response) => response,
                // The answer tonic's own server loop gave.
                Err(_) => Ok(tonic::Status::cancelled("Timeout expired").into_http()),
            },
        };
        drop(call);
        response
    }
}

/// The deadline a gRPC call carries in its `grpc-timeout` header (at most 8 digits and a unit:
/// `H`, `M`, `S`, `m`, `u`, `n`), enforced as tonic's own server loop did: a handler still
/// running when it passes is dropped (the client has given up on it). A malformed value is
/// ignored, as there.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match &value[digits.len()..] {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// What a call's headers hold, about as HPACK counts a header list: each field's name and
/// value, plus 32 bytes of overhead, and the path. Charged only if the call waits for its body.
fn header_bytes<B>(request: &http::Request<B>) -> usize {
    let fields: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    fields + request.uri().path().len()
}

/// Completes after `duration`; never when `None`.
async fn sleep_or_never(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

/// The calls of one connection: how many are in flight, and when the last one ended. Two atomic
/// operations and a clock read per call; the idle timer reads them only when it fires.
struct Calls {
    started: Instant,
    in_flight: AtomicUsize,
    /// When the last call ended, in milliseconds since `started` (0: none has).
    last_end_ms: AtomicU64,
}

impl Calls {
    fn new() -> Calls {
        Calls {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
        }
    }

    fn start(self: &Arc<Self>) -> Call {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Call(self.clone())
    }

    /// When the connection last became idle: its start or the end of its last call.
    fn quiet_since(&self) -> Instant {
        let ms = self.last_end_ms.load(Ordering::Acquire);
        self.started + Duration::from_millis(ms)
    }

    /// Completes once no call has been in flight for `max_idle`; never when `None`.
    async fn idle_for(&self, max_idle: Option<Duration>) {
        let Some(max_idle) = max_idle else {
            return std::future::pending().await;
        };
        let mut deadline = self.started + max_idle;
        loop {
            tokio::time::sleep_until(deadline).await;
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // A call that ends later restarts the count from its end.
                deadline = Instant::now() + max_idle;
                continue;
            }
            let due = self.quiet_since() + max_idle;
            if due <= Instant::now() {
                return;
            }
            deadline = due;
        }
    }
}

/// One call in flight; dropping it (the call answered or abandoned) ends it.
struct Call(Arc<Calls>);

impl Drop for Call {
    fn drop(&mut self) {
        let calls = &self.0;
        let ms = u64::try_from(calls.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Stamped before the count drops, so an idle check that sees no call in flight also
        // sees this end.
        calls.last_end_ms.fetch_max(ms, Ordering::AcqRel);
        calls.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A gRPC connection until its client has sent the HTTP/2 preface: reads fail once `deadline`
/// passes with fewer than 24 bytes read, so hyper drops the connection and its slot. After the
/// preface it is the connection itself (one branch per read).
///
/// The deadline is counted from the accept, so on a TLS listener the handshake and the preface
/// share one budget (`GRPC_HANDSHAKE_TIMEOUT`).
pub(crate) struct Preface<IO> {
    io: IO,
    /// Preface bytes still to come.
    missing: usize,
    /// `None`: no deadline, or the preface is in.
    deadline: Option<Pin<Box<Sleep>>>,
    closed: Option<Closed>,
}

impl<IO> Preface<IO> {
    /// `io`, which must deliver the preface by `deadline` (`None`: no deadline). `closed` counts
    /// it when it does not.
    pub(crate) fn new(io: IO, deadline: Option<Instant>, closed: &Closed) -> Preface<IO> {
        Preface {
            io,
            missing: PREFACE_LEN,
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
            closed: Some(closed.clone()),
        }
    }
}

/// Why a [`Preface`] connection was closed.
#[derive(Debug, thiserror::Error)]
#[error("no HTTP/2 preface within GRPC_HANDSHAKE_TIMEOUT")]
pub(crate) struct PrefaceTimeout;

impl<IO: Peer> Peer for Preface<IO> {
    fn peer(&self) -> Option<std::net::IpAddr> {
        self.io.peer()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Preface<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.deadline.is_none() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            let read = buf.filled().len() - before;
            this.missing = this.missing.saturating_sub(read);
            if this.missing == 0 || read == 0 {
                // The preface is in (or the client closed): no deadline any more.
                this.deadline = None;
            }
            return poll;
        }
        if poll.is_pending()
            && let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.deadline = None;
            if let Some(closed) = this.closed.take() {
                closed.handshake_timeout();
            }
            tracing::debug!("closing a gRPC connection: {PrefaceTimeout}");
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, PrefaceTimeout)));
        }
        poll
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Preface<IO> {
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn closed() -> Closed {
        Closed::new("test", &Metrics::new(0.8))
    }

    #[tokio::test]
    async fn half_a_preface_is_cut_at_the_deadline() {
        let (ours, mut peer) = tokio::io::duplex(64);
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut conn = Preface::new(ours, Some(deadline), &closed());
        peer.write_all(b"PRI * HTTP").await.unwrap();
        let mut buf = [0u8; 10];
        conn.read_exact(&mut buf).await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("the deadline ends the read")
            .unwrap_err();
        assert!(e.get_ref().is_some_and(|e| e.is::<PrefaceTimeout>()), "{e}");
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test]
    async fn after_the_preface_the_deadline_is_gone() {
        let (ours, mut peer) = tokio::io::duplex(64);
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut conn = Preface::new(ours, Some(deadline), &closed());
        peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 24];
        conn.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        peer.write_all(b"late").await.unwrap();
        let mut late = [0u8; 4];
        conn.read_exact(&mut late).await.unwrap();
        assert_eq!(&late, b"late");
    }

    #[test]
    fn grpc_timeout_is_read_as_grpc_specifies_it() {
        let parse = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().unwrap());
            grpc_timeout(&headers)
        };
        assert_eq!(parse("20m"), Some(Duration::from_millis(20)));
        assert_eq!(
            parse("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(parse("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "1x", "-1S", "1.5S", "ñS"] {
            let mut headers = http::HeaderMap::new();
            if let Ok(value) = bad.parse() {
                headers.insert("grpc-timeout", value);
            }
            assert_eq!(grpc_timeout(&headers), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn idle_counts_from_the_end_of_the_last_call() {
        let calls = Arc::new(Calls::new());
        let max_idle = Duration::from_millis(200);
        let call = calls.start();
        let idle = calls.idle_for(Some(max_idle));
        tokio::pin!(idle);
        // A call in flight for over twice the idle time: not idle meanwhile.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut idle)
                .await
                .is_err()
        );
        drop(call);
        let ended = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), idle)
            .await
            .expect("idle after the call");
        // The end is stamped in whole milliseconds.
        assert!(Instant::now() + Duration::from_millis(1) >= ended + max_idle);
    }
}
