//! The bytes of unfinished gRPC requests a caller can make Sluice hold, and for how long
//! (issue #40, item 1).
//!
//! A gRPC message's first five bytes declare its length; tonic reserves that much at once and
//! keeps what arrives until the message is whole. HTTP/2 flow control does not bound that: each
//! byte read into tonic's buffer gives its window back. A client that declared messages of
//! almost 1 MiB and never sent their last byte held that memory for as long as it liked: 1 600
//! such calls on 8 connections grew the process by 1.8 GB (`tests/stalled_calls.rs`).
//!
//! Every gRPC call's request body is wrapped in a [`RequestBody`], so that:
//! - a unary call's request must be whole (END_STREAM) within `HTTP_READ_HEADER_TIMEOUT` of its
//!   HEADERS, and each message of a streaming call within that time of its first byte; past it
//!   the call is ended (`DEADLINE_EXCEEDED`);
//! - a call that has to wait for more of its request becomes a *waiting call*, and what it holds
//!   (its headers, and each message it declared, in full, up to the message limit) is charged to
//!   its connection, its peer (its IP address, IPv6 by /64) and the process;
//! - a charge that takes one of those over its budget ends the waiting calls holding the most
//!   bytes there (`RESOURCE_EXHAUSTED`) until it fits again, the charging call itself when it is
//!   the largest. A flood of stalled calls is shed; a small call is let through.
//! - while the overload manager sheds (`overload.rs`, the process near its memory ceiling), every
//!   call that has waited [`SHED_GRACE`] is ended, and no call may wait longer.
//!
//! The HTTP/1 listeners read their bodies (`/json`, up to 2 MiB) under the same budgets, as
//! [`BodyKind::Plain`]: what a request holds is what arrived; its deadline is the listener's own.
//!
//! A call whose request is whole in the first read (every Envoy call, every honest unary call)
//! never waits: it takes no lock, starts no timer and charges nothing, so the request path pays
//! only the wrapper's reading of the frame header.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::Status;

use sluice::metrics::PressureMetrics;

/// While the overload manager sheds, how long a call may wait for the rest of its request. An
/// honest call's request follows its HEADERS at once, but on a busy server the call's handler can
/// poll the body before the connection's task has read the DATA frame already sent: that call
/// waits for a moment, a stalled one for ever. Ending only the calls that waited this long keeps
/// the first kind out of the shedding (tests/stalled_calls.rs saw a bystander's call ended, with
/// both cores busy, when every waiting call was).
const SHED_GRACE: Duration = Duration::from_millis(250);

/// What each call may hold and for how long. A zero budget is no budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestLimits {
    /// `HTTP_READ_HEADER_TIMEOUT`: a unary call's request whole this long after its HEADERS, a
    /// streaming call's message this long after its first byte; `None`: no deadline.
    pub(crate) timeout: Option<Duration>,
    /// `MAX_PENDING_REQUEST_BYTES_PER_CONNECTION`.
    pub(crate) per_connection: usize,
    /// `MAX_PENDING_REQUEST_BYTES_PER_PEER`.
    pub(crate) per_peer: usize,
    /// `MAX_PENDING_REQUEST_BYTES`: over the whole process.
    pub(crate) total: usize,
}

/// Why the server ended a call before its request was whole; each is a label of
/// `sluice_requests_ended_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Timeout = 1,
    Connection,
    Peer,
    Total,
    Overload,
}

impl Ended {
    const ALL: [Ended; 5] = [
        Ended::Timeout,
        Ended::Connection,
        Ended::Peer,
        Ended::Total,
        Ended::Overload,
    ];

    fn label(self) -> &'static str {
        match self {
            Ended::Timeout => "request_timeout",
            Ended::Connection => "bytes_per_connection",
            Ended::Peer => "bytes_per_peer",
            Ended::Total => "bytes_total",
            Ended::Overload => "overload",
        }
    }

    fn from_u8(n: u8) -> Option<Ended> {
        Ended::ALL.into_iter().find(|e| *e as u8 == n)
    }

    /// What the caller is answered.
    fn status(self) -> Status {
        match self {
            Ended::Timeout => Status::deadline_exceeded(
                "the request was not whole within HTTP_READ_HEADER_TIMEOUT of its start",
            ),
            Ended::Overload => Status::resource_exhausted(
                "the server is near its memory ceiling and ends calls still sending their request",
            ),
            _ => Status::resource_exhausted(
                "the server holds its budget of unfinished requests, and this call held the most",
            ),
        }
    }
}

/// What a body is, which decides what it holds and when its deadline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// A unary gRPC call's request: one message, whole (END_STREAM) within the deadline of the
    /// call's HEADERS; the handler keeps what arrived until it ends.
    Unary,
    /// A streaming gRPC call's requests: each message whole within the deadline of its first
    /// byte, and handed on when whole; between messages the call may wait.
    Streaming,
    /// An HTTP/1 request body: the bytes that arrived; no deadline here (`http.rs` has its own).
    Plain,
}

/// The budgets of the whole process: one per process, shared by every listener.
pub(crate) struct RequestBudget {
    limits: RequestLimits,
    total: AtomicUsize,
    /// The bytes held by each peer with a connection open.
    peers: Mutex<HashMap<IpAddr, Weak<AtomicUsize>>>,
    waiting: Mutex<HashMap<u64, Arc<WaitingCall>>>,
    next_call: AtomicU64,
    /// Set by the overload manager: no call may wait.
    shedding: AtomicBool,
    metrics: PressureMetrics,
}

impl std::fmt::Debug for RequestBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBudget")
            .field("limits", &self.limits)
            .field("held", &self.total.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A budget of zero is none.
fn cap(bytes: usize) -> usize {
    if bytes == 0 { usize::MAX } else { bytes }
}

impl RequestBudget {
    pub(crate) fn new(limits: RequestLimits, metrics: PressureMetrics) -> Arc<RequestBudget> {
        Arc::new(RequestBudget {
            limits: RequestLimits {
                per_connection: cap(limits.per_connection),
                per_peer: cap(limits.per_peer),
                total: cap(limits.total),
                ..limits
            },
            total: AtomicUsize::new(0),
            peers: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(0),
            shedding: AtomicBool::new(false),
            metrics,
        })
    }

    /// The accounts of a new connection from `peer` (`None`: a Unix socket, no peer budget).
    pub(crate) fn connection(self: &Arc<Self>, peer: Option<IpAddr>) -> Arc<ConnectionBudget> {
        let peer = peer.map(|ip| {
            let key = super::connections::peer_key(ip);
            let mut peers = lock(&self.peers);
            let held = peers.get(&key).and_then(Weak::upgrade).unwrap_or_else(|| {
                let held = Arc::new(AtomicUsize::new(0));
                peers.insert(key, Arc::downgrade(&held));
                held
            });
            (key, held)
        });
        Arc::new(ConnectionBudget {
            budget: self.clone(),
            held: AtomicUsize::new(0),
            peer,
        })
    }

    /// Switches shedding on or off (the overload manager); on, it ends every call that has
    /// waited [`SHED_GRACE`] now, and wakes the others to take the shedding's deadline.
    pub(crate) fn shed(&self, on: bool) {
        self.shedding.store(on, Ordering::Release);
        if on {
            let waiting = lock(&self.waiting);
            for call in waiting.values() {
                if call.since.elapsed() >= SHED_GRACE {
                    self.end(call, Ended::Overload);
                } else {
                    call.waker.wake();
                }
            }
        }
    }

    /// Ends `call` for `why`, unless it was ended already: gives back what it held and wakes it.
    fn end(&self, call: &WaitingCall, why: Ended) {
        if call
            .ended
            .compare_exchange(0, why as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.metrics
                .requests_ended
                .with_label_values(&[why.label()])
                .inc();
            call.give_back(call.held.swap(0, Ordering::AcqRel));
            call.waker.wake();
        }
    }

    fn show(&self) {
        let held = self.total.load(Ordering::Relaxed);
        self.metrics
            .request_bytes_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The accounts of one connection: its own, its peer's, and through them the process's.
pub(crate) struct ConnectionBudget {
    budget: Arc<RequestBudget>,
    held: AtomicUsize,
    /// The peer's key (IPv6 by /64) and its account; `None` on a Unix socket.
    peer: Option<(IpAddr, Arc<AtomicUsize>)>,
}

impl Drop for ConnectionBudget {
    fn drop(&mut self) {
        // The peer's entry goes with its last connection; checked under the lock that hands
        // the account to new connections, so none can take it meanwhile.
        if let Some((key, held)) = &self.peer {
            let mut peers = lock(&self.budget.peers);
            if Arc::strong_count(held) == 1 {
                peers.remove(key);
            }
        }
    }
}

impl ConnectionBudget {
    /// The body of a call that arrived at `arrived` with headers of `header_bytes`.
    pub(crate) fn body<B>(
        self: &Arc<Self>,
        inner: B,
        arrived: Instant,
        header_bytes: usize,
        kind: BodyKind,
    ) -> RequestBody<B> {
        RequestBody {
            inner,
            connection: self.clone(),
            arrived,
            header_bytes,
            kind,
            framing: Framing::default(),
            received: 0,
            timer: None,
            waiting: None,
            charged: 0,
            ended: None,
        }
    }

    /// Adds `bytes` to the three accounts; the first scope that is then over its budget, if any.
    fn charge(&self, bytes: usize) -> Option<Ended> {
        let limits = &self.budget.limits;
        let connection = self.held.fetch_add(bytes, Ordering::AcqRel) + bytes;
        let peer = self.peer.as_ref().map_or(0, |(_, held)| {
            held.fetch_add(bytes, Ordering::AcqRel) + bytes
        });
        let total = self.budget.total.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if connection > limits.per_connection {
            Some(Ended::Connection)
        } else if peer > limits.per_peer {
            Some(Ended::Peer)
        } else if total > limits.total {
            Some(Ended::Total)
        } else {
            None
        }
    }

    fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        if let Some((_, held)) = &self.peer {
            held.fetch_sub(bytes, Ordering::AcqRel);
        }
        self.budget.total.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes held now in `scope`, which holds this connection, and its budget.
    fn scope(&self, scope: Ended) -> (usize, usize) {
        let limits = &self.budget.limits;
        match scope {
            Ended::Connection => (self.held.load(Ordering::Acquire), limits.per_connection),
            Ended::Peer => (
                self.peer
                    .as_ref()
                    .map_or(0, |(_, held)| held.load(Ordering::Acquire)),
                limits.per_peer,
            ),
            _ => (self.budget.total.load(Ordering::Acquire), limits.total),
        }
    }

    /// Whether `other` is in `scope` of this connection.
    fn shares(&self, other: &ConnectionBudget, scope: Ended) -> bool {
        match scope {
            Ended::Connection => std::ptr::eq(self, other),
            Ended::Peer => match (&self.peer, &other.peer) {
                (Some((_, a)), Some((_, b))) => Arc::ptr_eq(a, b),
                _ => false,
            },
            _ => true,
        }
    }
}

/// A call that waited for more of its request: what it holds, and whether the server ended it.
struct WaitingCall {
    connection: Arc<ConnectionBudget>,
    /// When it started waiting.
    since: Instant,
    /// Bytes charged to its accounts (zeroed when it is ended by another call).
    held: AtomicUsize,
    /// 0, or the [`Ended`] the server ended it for.
    ended: AtomicU8,
    waker: AtomicWaker,
}

impl WaitingCall {
    fn give_back(&self, bytes: usize) {
        self.connection.give_back(bytes);
    }

    fn ended(&self) -> Option<Ended> {
        Ended::from_u8(self.ended.load(Ordering::Acquire))
    }
}

/// Where a request stands in its gRPC messages (each a 5-byte header, then its length).
#[derive(Debug, Default)]
struct Framing {
    /// Header bytes of the message being read (0 to 5; 5: its body is arriving).
    header: [u8; 5],
    header_read: u8,
    /// Bytes of the current message's body still to come.
    remaining: usize,
    /// What the current message counts for: its header and its declared length, when within the
    /// message limit (beyond it nothing is buffered: tonic refuses it, or `oversized.rs` drops it).
    current: usize,
    /// What the finished messages count for (a unary call's handler holds them until it ends).
    finished: usize,
}

impl Framing {
    /// Reads `data`; true when a message was finished in it.
    fn read(&mut self, mut data: &[u8]) -> bool {
        let mut finished_one = false;
        while !data.is_empty() {
            if self.header_read < 5 {
                let take = data.len().min(5 - usize::from(self.header_read));
                let at = usize::from(self.header_read);
                self.header[at..at + take].copy_from_slice(&data[..take]);
                self.header_read += take as u8;
                data = &data[take..];
                if self.header_read < 5 {
                    break;
                }
                let declared = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                self.remaining = declared;
                self.current = if declared <= super::MAX_REQUEST_BYTES {
                    5 + declared
                } else {
                    0
                };
            } else {
                let take = data.len().min(self.remaining);
                self.remaining -= take;
                data = &data[take..];
            }
            if self.header_read == 5 && self.remaining == 0 {
                self.finished += self.current;
                self.current = 0;
                self.header_read = 0;
                finished_one = true;
            }
        }
        finished_one
    }

    /// Whether a message is partly read.
    fn in_message(&self) -> bool {
        self.header_read > 0
    }

    /// What a call holds in messages: all of them for a unary call, the current one for a
    /// stream (tonic hands each finished message on).
    fn held(&self, streaming: bool) -> usize {
        let partial_header = if self.header_read < 5 {
            usize::from(self.header_read)
        } else {
            0
        };
        let current = self.current + partial_header;
        if streaming {
            current
        } else {
            self.finished + current
        }
    }
}

/// A gRPC call's request body (hyper's `Incoming`) under its deadline and budgets (the module
/// doc).
pub(crate) struct RequestBody<B> {
    inner: B,
    connection: Arc<ConnectionBudget>,
    /// When the HEADERS arrived; a streaming call's current message's first byte, once read.
    arrived: Instant,
    header_bytes: usize,
    kind: BodyKind,
    /// Where a gRPC request stands in its messages.
    framing: Framing,
    /// Bytes of a plain body that arrived.
    received: usize,
    /// The deadline's timer, started when the call first waits.
    timer: Option<Pin<Box<Sleep>>>,
    /// Set once the call has waited: its id in the registry, and its entry.
    waiting: Option<(u64, Arc<WaitingCall>)>,
    /// What this call has charged to its accounts.
    charged: usize,
    /// Set once the server ended the call: every later read fails the same way.
    ended: Option<Ended>,
}

impl<B> RequestBody<B> {
    fn budget(&self) -> &RequestBudget {
        &self.connection.budget
    }

    /// What the call holds now.
    fn holding(&self) -> usize {
        self.header_bytes
            + match self.kind {
                BodyKind::Unary => self.framing.held(false),
                BodyKind::Streaming => self.framing.held(true),
                BodyKind::Plain => self.received,
            }
    }

    /// The call's deadline, when one runs now, and what passing it ends the call for: its own
    /// (a unary call's always, a stream's only inside a message, a plain body's never), or,
    /// while the overload manager sheds, [`SHED_GRACE`] after it started waiting, if earlier.
    fn deadline(&self) -> Option<(Instant, Ended)> {
        let runs = match self.kind {
            BodyKind::Unary => true,
            BodyKind::Streaming => self.framing.in_message(),
            BodyKind::Plain => false,
        };
        let own = (self.budget().limits.timeout)
            .filter(|_| runs)
            .map(|timeout| (self.arrived + timeout, Ended::Timeout));
        let shedding = self.budget().shedding.load(Ordering::Acquire);
        let shed = (self.waiting.as_ref())
            .filter(|_| shedding)
            .map(|(_, call)| (call.since + SHED_GRACE, Ended::Overload));
        match (own, shed) {
            (Some(own), Some(shed)) => Some(if shed.0 < own.0 { shed } else { own }),
            (own, shed) => own.or(shed),
        }
    }

    /// Registers the call as waiting and charges what it holds; `Err` when it must end.
    fn start_waiting(&mut self) -> Result<(), Ended> {
        let budget = self.connection.budget.clone();
        let call = Arc::new(WaitingCall {
            connection: self.connection.clone(),
            since: Instant::now(),
            held: AtomicUsize::new(0),
            ended: AtomicU8::new(0),
            waker: AtomicWaker::new(),
        });
        let id = budget.next_call.fetch_add(1, Ordering::Relaxed);
        {
            let mut waiting = lock(&budget.waiting);
            waiting.insert(id, call.clone());
            budget
                .metrics
                .requests_waiting
                .set(i64::try_from(waiting.len()).unwrap_or(i64::MAX));
        }
        self.waiting = Some((id, call));
        self.recharge()
    }

    /// Brings the charge of a waiting call to what it holds now; when that takes a scope over
    /// its budget, ends the largest holders there, this call if it is the largest.
    fn recharge(&mut self) -> Result<(), Ended> {
        let Some((_, call)) = &self.waiting else {
            return Ok(());
        };
        let call = call.clone();
        let now = self.holding();
        let over = if now > self.charged {
            let more = now - self.charged;
            call.held.fetch_add(more, Ordering::AcqRel);
            self.connection.charge(more)
        } else {
            // Only ever smaller for a stream between messages: give the difference back, as much
            // of it as is still charged (another call may have ended this one meanwhile).
            let less = self.charged - now;
            let taken = call
                .held
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                    Some(h.saturating_sub(less))
                })
                .map_or(0, |h| h.min(less));
            self.connection.give_back(taken);
            None
        };
        self.charged = now;
        let result = match over {
            Some(scope) => self.make_room(&call, scope),
            None => Ok(()),
        };
        self.budget().show();
        result
    }

    /// Ends the largest waiting calls in `scope` until it is within its budget; `Err` when this
    /// call is the largest left.
    fn make_room(&self, me: &Arc<WaitingCall>, scope: Ended) -> Result<(), Ended> {
        let budget = self.budget();
        let waiting = lock(&budget.waiting);
        loop {
            let (held, limit) = self.connection.scope(scope);
            if held <= limit {
                return Ok(());
            }
            let mine = me.held.load(Ordering::Acquire);
            let largest = waiting
                .values()
                .filter(|c| !Arc::ptr_eq(c, me) && c.ended.load(Ordering::Acquire) == 0)
                .filter(|c| self.connection.shares(&c.connection, scope))
                .max_by_key(|c| c.held.load(Ordering::Acquire));
            match largest {
                Some(call) if call.held.load(Ordering::Acquire) > mine => budget.end(call, scope),
                _ => return Err(scope),
            }
        }
    }

    /// Ends this call for `why`: gives back what it holds, and fails this and every later read.
    fn end(&mut self, why: Ended) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match &self.waiting {
            Some((_, call)) => self.connection.budget.end(call, why),
            None => self.connection.budget.end_metric(why),
        }
        self.ended = Some(why);
        Poll::Ready(Some(Err(why.status())))
    }

    /// Leaves the registry, giving back what is still charged.
    fn stop_waiting(&mut self) {
        if let Some((id, call)) = self.waiting.take() {
            call.give_back(call.held.swap(0, Ordering::AcqRel));
            let budget = &self.connection.budget;
            let mut waiting = lock(&budget.waiting);
            waiting.remove(&id);
            budget
                .metrics
                .requests_waiting
                .set(i64::try_from(waiting.len()).unwrap_or(i64::MAX));
            drop(waiting);
            budget.show();
        }
    }

    /// Polls the deadline (starting its timer on first use); what the call ends for when it
    /// has passed.
    fn past_deadline(&mut self, cx: &mut Context<'_>) -> Option<Ended> {
        let Some((deadline, why)) = self.deadline() else {
            self.timer = None;
            return None;
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready().then_some(why)
    }
}

impl RequestBudget {
    /// Counts a call ended before it waited (nothing to give back).
    fn end_metric(&self, why: Ended) {
        self.metrics
            .requests_ended
            .with_label_values(&[why.label()])
            .inc();
    }
}

impl<B> RequestBody<B> {
    /// Takes in `data`, as the body's kind reads it.
    fn read(&mut self, data: &[u8]) {
        match self.kind {
            BodyKind::Plain => self.received = self.received.saturating_add(data.len()),
            BodyKind::Unary => {
                self.framing.read(data);
            }
            BodyKind::Streaming => {
                let was_in_message = self.framing.in_message();
                let finished = self.framing.read(data);
                if self.framing.in_message() && (finished || !was_in_message) {
                    // A stream's message has its deadline from its own first byte.
                    self.arrived = Instant::now();
                }
            }
        }
    }
}

impl<B> Drop for RequestBody<B> {
    fn drop(&mut self) {
        self.stop_waiting();
    }
}

impl<B> HttpBody for RequestBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(why) = this.ended {
            return Poll::Ready(Some(Err(why.status())));
        }
        if let Some(why) = this.waiting.as_ref().and_then(|(_, call)| call.ended()) {
            return this.end(why);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.read(data);
                }
                if let Err(why) = this.recharge() {
                    return this.end(why);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.stop_waiting();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Status::from_error(e.into())))),
            Poll::Pending => {
                if this.waiting.is_none()
                    && let Err(why) = this.start_waiting()
                {
                    return this.end(why);
                }
                if let Some((_, call)) = &this.waiting {
                    call.waker.register(cx.waker());
                    // Ended between the check above and the registration.
                    if let Some(why) = call.ended() {
                        return this.end(why);
                    }
                }
                if let Some(why) = this.past_deadline(cx) {
                    return this.end(why);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::Ipv4Addr;

    use futures::FutureExt;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;
    use sluice::metrics::Metrics;

    type Chunks = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

    const HEADERS: usize = 300;

    fn budget(per_connection: usize, per_peer: usize, total: usize) -> Arc<RequestBudget> {
        let limits = RequestLimits {
            timeout: Some(Duration::from_millis(500)),
            per_connection,
            per_peer,
            total,
        };
        RequestBudget::new(limits, Metrics::new(0.8).pressure.clone())
    }

    fn peer(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
    }

    /// A call on `connection` and the sender of its body's chunks.
    fn call(
        connection: &Arc<ConnectionBudget>,
        streaming: bool,
    ) -> (
        mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
        RequestBody<Chunks>,
    ) {
        let kind = if streaming {
            BodyKind::Streaming
        } else {
            BodyKind::Unary
        };
        body_of(connection, kind)
    }

    /// A body of `kind` on `connection` and the sender of its chunks.
    fn body_of(
        connection: &Arc<ConnectionBudget>,
        kind: BodyKind,
    ) -> (
        mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
        RequestBody<Chunks>,
    ) {
        let (tx, rx) = mpsc::channel(16);
        let body = StreamBody::new(ReceiverStream::new(rx));
        (tx, connection.body(body, Instant::now(), HEADERS, kind))
    }

    /// The first `sent` bytes of a gRPC message declaring `declared` bytes.
    fn message(declared: usize, sent: usize) -> Frame<Bytes> {
        let mut bytes = vec![0u8];
        bytes.extend(u32::try_from(declared).unwrap().to_be_bytes());
        bytes.resize(sent.min(5 + declared), 7);
        Frame::data(Bytes::from(bytes))
    }

    /// Reads what is there without waiting: `None` when the body would wait.
    fn read_now(body: &mut RequestBody<Chunks>) -> Option<Option<Result<Frame<Bytes>, Status>>> {
        body.frame().now_or_never()
    }

    fn code(read: Option<Option<Result<Frame<Bytes>, Status>>>) -> tonic::Code {
        read.expect("answered")
            .expect("a frame")
            .expect_err("an error")
            .code()
    }

    #[test]
    fn framing_counts_declared_messages_up_to_the_limit() {
        let mut framing = Framing::default();
        assert!(!framing.read(&[0, 0, 0]), "half a header");
        assert!(framing.in_message());
        assert_eq!(framing.held(false), 3);
        assert!(!framing.read(&[1, 0]), "a message of 256 bytes declared");
        assert_eq!(framing.held(false), 5 + 256);
        assert!(framing.read(&[0; 256]));
        assert!(!framing.in_message());
        assert_eq!(framing.held(false), 261, "a unary call's handler keeps it");
        assert_eq!(framing.held(true), 0, "a stream hands it on");
        // Over the message limit nothing is buffered: it is refused or dropped.
        let over = u32::try_from(super::super::MAX_REQUEST_BYTES + 1).unwrap();
        let mut framing = Framing::default();
        let mut head = vec![0u8];
        head.extend(over.to_be_bytes());
        framing.read(&head);
        assert_eq!(framing.held(false), 0);
        // Two messages and the start of a third in one chunk.
        let mut framing = Framing::default();
        assert!(framing.read(&[0, 0, 0, 0, 1, 9, 0, 0, 0, 0, 0, 0]));
        assert_eq!(framing.held(false), 6 + 5 + 1);
        assert_eq!(framing.held(true), 1);
    }

    #[tokio::test]
    async fn a_request_whole_at_once_charges_nothing_and_a_waiting_one_gives_back_what_it_held() {
        let budget = budget(4 << 20, 0, 0);
        let connection = budget.connection(peer(1));
        let (tx, mut body) = call(&connection, false);
        tx.send(Ok(message(100, 105))).await.unwrap();
        drop(tx);
        assert!(read_now(&mut body).unwrap().unwrap().is_ok());
        assert!(read_now(&mut body).unwrap().is_none());
        assert_eq!(budget.total.load(Ordering::Relaxed), 0);
        assert!(lock(&budget.waiting).is_empty());

        let (tx, mut body) = call(&connection, false);
        tx.send(Ok(message(1000, 40))).await.unwrap();
        assert!(read_now(&mut body).unwrap().unwrap().is_ok());
        assert!(read_now(&mut body).is_none(), "waits for the rest");
        assert_eq!(connection.held.load(Ordering::Relaxed), HEADERS + 1005);
        assert_eq!(budget.total.load(Ordering::Relaxed), HEADERS + 1005);
        assert_eq!(lock(&budget.waiting).len(), 1);
        tx.send(Ok(Frame::data(Bytes::from(vec![0u8; 965]))))
            .await
            .unwrap();
        drop(tx);
        assert!(read_now(&mut body).unwrap().unwrap().is_ok());
        assert!(read_now(&mut body).unwrap().is_none());
        assert_eq!(budget.total.load(Ordering::Relaxed), 0);
        assert!(lock(&budget.waiting).is_empty());
    }

    #[tokio::test]
    async fn over_a_budget_the_largest_waiting_call_is_ended() {
        let budget = budget(0, 0, 2 << 20);
        let a = budget.connection(peer(1));
        let b = budget.connection(peer(2));
        let limit = super::super::MAX_REQUEST_BYTES;
        // A stalled call holding a whole message of the limit, declared, and a small one.
        let (_big_tx, mut big) = call(&a, false);
        _big_tx.send(Ok(message(limit, 5))).await.unwrap();
        assert!(read_now(&mut big).unwrap().unwrap().is_ok());
        assert!(read_now(&mut big).is_none());
        let (_small_tx, mut small) = call(&b, false);
        _small_tx.send(Ok(message(1000, 5))).await.unwrap();
        assert!(read_now(&mut small).unwrap().unwrap().is_ok());
        assert!(read_now(&mut small).is_none());
        // A third, a little smaller than the first, takes the process over 2 MiB: the largest
        // holder goes.
        let (_tx, mut third) = call(&b, false);
        _tx.send(Ok(message(limit - 10, 5))).await.unwrap();
        assert!(read_now(&mut third).unwrap().unwrap().is_ok());
        assert!(read_now(&mut third).is_none());
        assert_eq!(code(read_now(&mut big)), tonic::Code::ResourceExhausted);
        assert_eq!(
            code(read_now(&mut big)),
            tonic::Code::ResourceExhausted,
            "and stays so"
        );
        assert!(read_now(&mut small).is_none(), "the small one waits on");
        assert_eq!(
            budget.total.load(Ordering::Relaxed),
            2 * HEADERS + 1005 + limit - 10 + 5
        );
        // A call larger than every other is the one ended.
        let (_tx, mut huge) = call(&a, false);
        _tx.send(Ok(message(limit, 5))).await.unwrap();
        assert!(read_now(&mut huge).unwrap().unwrap().is_ok());
        assert_eq!(code(read_now(&mut huge)), tonic::Code::ResourceExhausted);
        assert!(read_now(&mut third).is_none());
        let ended = budget
            .metrics
            .requests_ended
            .with_label_values(&["bytes_total"]);
        assert_eq!(ended.get(), 2);
    }

    #[tokio::test]
    async fn connection_and_peer_budgets_end_calls_in_their_own_scope_only() {
        let budget = budget(1 << 20, 2 << 20, 0);
        let one = budget.connection(peer(1));
        let same_peer = budget.connection(peer(1));
        let other_peer = budget.connection(peer(2));
        let mut held = Vec::new();
        for connection in [&one, &same_peer, &other_peer] {
            let (tx, mut body) = call(connection, false);
            tx.send(Ok(message(900 << 10, 5))).await.unwrap();
            assert!(read_now(&mut body).unwrap().unwrap().is_ok());
            assert!(read_now(&mut body).is_none());
            held.push((tx, body));
        }
        // Two on one connection pass its 1 MiB: the second, larger by its bytes, is refused.
        let (_tx, mut second) = call(&one, false);
        _tx.send(Ok(message(950 << 10, 5))).await.unwrap();
        assert!(read_now(&mut second).unwrap().unwrap().is_ok());
        assert_eq!(code(read_now(&mut second)), tonic::Code::ResourceExhausted);
        for (_, body) in &mut held {
            assert!(read_now(body).is_none(), "the others wait on");
        }
        // The peer holds 1.8 MiB on two connections; a third connection of it with more takes
        // it over 2 MiB, and the largest of that peer goes, never the other peer's.
        let third = budget.connection(peer(1));
        let (_tx, mut more) = call(&third, false);
        _tx.send(Ok(message(800 << 10, 5))).await.unwrap();
        assert!(read_now(&mut more).unwrap().unwrap().is_ok());
        assert!(read_now(&mut more).is_none());
        let ended: Vec<bool> = held
            .iter_mut()
            .map(|(_, body)| read_now(body).is_some())
            .collect();
        assert_eq!(ended.iter().filter(|e| **e).count(), 1, "{ended:?}");
        assert!(!ended[2], "the other peer's call is not in that scope");
        let peer_ended = budget
            .metrics
            .requests_ended
            .with_label_values(&["bytes_per_peer"]);
        assert_eq!(peer_ended.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_unary_request_must_be_whole_in_time_a_stream_only_each_message() {
        let budget = budget(0, 0, 0);
        let connection = budget.connection(None);
        let (_tx, mut unary) = call(&connection, false);
        let read = tokio::time::timeout(Duration::from_secs(5), unary.frame()).await;
        let status = read.expect("ended").unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        let timeouts = budget
            .metrics
            .requests_ended
            .with_label_values(&["request_timeout"]);
        assert_eq!(timeouts.get(), 1);

        let (tx, mut stream) = call(&connection, true);
        // Between messages a stream may wait as long as it likes.
        assert!(
            tokio::time::timeout(Duration::from_secs(60), stream.frame())
                .await
                .is_err()
        );
        tx.send(Ok(message(10, 15))).await.unwrap();
        assert!(stream.frame().await.unwrap().is_ok());
        assert!(
            tokio::time::timeout(Duration::from_secs(60), stream.frame())
                .await
                .is_err()
        );
        // Half a message must be finished within the deadline of its first byte.
        tx.send(Ok(message(10, 8))).await.unwrap();
        assert!(stream.frame().await.unwrap().is_ok());
        let read = tokio::time::timeout(Duration::from_secs(5), stream.frame()).await;
        let status = read.expect("ended").unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    }

    #[tokio::test(start_paused = true)]
    async fn shedding_ends_every_call_that_waited_its_grace_and_lets_none_wait_longer() {
        let budget = budget(0, 0, 0);
        let connection = budget.connection(peer(1));
        let (_tx, mut waiting) = call(&connection, false);
        assert!(read_now(&mut waiting).is_none());
        tokio::time::advance(SHED_GRACE).await;
        budget.shed(true);
        assert_eq!(code(read_now(&mut waiting)), tonic::Code::ResourceExhausted);
        assert_eq!(budget.total.load(Ordering::Relaxed), 0);
        // A request whole at once is still read.
        let (tx, mut whole) = call(&connection, false);
        tx.send(Ok(message(10, 15))).await.unwrap();
        drop(tx);
        assert!(read_now(&mut whole).unwrap().unwrap().is_ok());
        assert!(read_now(&mut whole).unwrap().is_none());
        // One whose DATA comes a moment after its HEADERS is read too.
        let (tx, mut late) = call(&connection, false);
        assert!(read_now(&mut late).is_none());
        tokio::time::advance(SHED_GRACE / 5).await;
        tx.send(Ok(message(10, 15))).await.unwrap();
        assert!(read_now(&mut late).unwrap().unwrap().is_ok());
        // One that goes on waiting is ended at its grace, before its own deadline (500 ms).
        let (_tx, mut slow) = call(&connection, false);
        assert!(read_now(&mut slow).is_none());
        let read = tokio::time::timeout(SHED_GRACE * 2, slow.frame()).await;
        let status = read.expect("ended at its grace").unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        budget.shed(false);
        let (_tx, mut later) = call(&connection, false);
        assert!(read_now(&mut later).is_none(), "may wait again");
        let shed = budget
            .metrics
            .requests_ended
            .with_label_values(&["overload"]);
        assert_eq!(shed.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_body_holds_what_arrived_and_has_no_deadline_here() {
        let budget = budget(0, 0, 2 << 20);
        let connection = budget.connection(peer(1));
        let (tx, mut body) = body_of(&connection, BodyKind::Plain);
        tx.send(Ok(Frame::data(Bytes::from(vec![1u8; 1000]))))
            .await
            .unwrap();
        assert!(read_now(&mut body).unwrap().unwrap().is_ok());
        assert!(
            tokio::time::timeout(Duration::from_secs(60), body.frame())
                .await
                .is_err(),
            "waits past the gRPC deadline"
        );
        assert_eq!(budget.total.load(Ordering::Relaxed), HEADERS + 1000);
        // Waiting already, it is charged as the bytes arrive: past the budget it is ended.
        tx.send(Ok(Frame::data(Bytes::from(vec![1u8; 2 << 20]))))
            .await
            .unwrap();
        assert_eq!(code(read_now(&mut body)), tonic::Code::ResourceExhausted);
        assert_eq!(budget.total.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_peer_entry_goes_with_its_last_connection() {
        let budget = budget(0, 0, 0);
        let a = budget.connection(peer(1));
        let b = budget.connection(peer(1));
        assert_eq!(lock(&budget.peers).len(), 1);
        drop(a);
        assert_eq!(lock(&budget.peers).len(), 1);
        drop(b);
        assert!(lock(&budget.peers).is_empty());
    }
}
