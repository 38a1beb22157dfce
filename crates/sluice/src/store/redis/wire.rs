//! Sluice's own connection to one Redis server: callers write their packed commands straight to
//! the socket, one reader task parses the replies and hands them out in order.
//!
//! redis-rs's multiplexed connection routes every command through a task of its own (a channel
//! hop out, another back) and parses with a general-purpose parser combinator; measured with
//! callgrind that was about a tenth of the instructions of a lone decision (docs/BENCHMARKS.md,
//! issue #19 part 2). Here a caller takes the write lock, queues its reply slot, writes its whole
//! pipeline and waits; the reader parses RESP2 and answers the queue front to back. Redis answers
//! in the order it reads, so the queue's order is the socket's.
//!
//! Rules that keep replies matched to their callers:
//! - a slot is queued under the same lock as its bytes are written, so the queue's order is the
//!   order on the wire;
//! - a caller that gives up (its deadline) leaves its slot queued: its replies are read and
//!   dropped, and the next caller gets its own;
//! - a write cut short (an error, or the caller dropped in the middle) leaves the stream
//!   unusable, so the connection fails;
//! - a failed connection (write or read error, end of stream, a reply nobody waits for) fails
//!   every waiting call with an I/O error, which the layers above take as "may have run": such a
//!   call is never sent again. Later calls fail at once, and the pool replaces the connection;
//! - a connection that owes replies and has read none for [`STALLED_AFTER`] counts as failed
//!   when next checked out (a peer gone without a reset would otherwise hold every call that
//!   picks it until its deadline, for as long as TCP takes to notice).
//!
//! A call that runs out of time asks whether the server it went to is still answering
//! ([`Watch`], [`Heard`]), judged over every connection to that server (the pool's; a cluster
//! node's), not the one connection the call was written to: Redis is down only when it has owed
//! replies for [`STALLED_AFTER`] and read none on any of them. Otherwise it is slow (a busy CPU, a
//! long script, a short pause), or had no chance to be heard (nothing was asked of it before this
//! call), and the circuit breaker must not open for it (`StoreError::Late`, or
//! `StoreError::CallerDeadline` when the caller's own deadline was the shorter).
//!
//! It implements redis-rs's `ConnectionLike`, so commands are still packed by redis-rs and
//! replies are redis-rs `Value`s; error replies go through redis-rs's own parser so that
//! `NOSCRIPT`, `MOVED`, `ASK`, `TRYAGAIN`, `READONLY` keep their kinds.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    Value,
};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

/// Bytes asked of the socket per read, at least.
const READ_CHUNK: usize = 16 * 1024;
/// Nesting of arrays accepted in a reply; Sluice's replies nest two deep.
const MAX_DEPTH: usize = 32;
/// No reply for this long while replies are owed: the connection is taken for dead. Redis
/// answers a decision in microseconds; only a stopped server, a lost peer or a long
/// `CLIENT PAUSE` come near this.
const STALLED_AFTER: Duration = Duration::from_secs(1);

/// A connection; clones share it.
#[derive(Clone)]
pub(super) struct Wire {
    shared: Arc<Shared>,
    db: i64,
}

struct Shared {
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    owed: Arc<Owed>,
    reader: AbortHandle,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The calls waiting for replies, and where the server's pool hears what this connection asks
/// and reads.
struct Owed(Mutex<Waiting>, Arc<Heard>);

struct Waiting {
    /// Oldest first; `None` once the connection has failed.
    queue: Option<VecDeque<Slot>>,
    /// When a reply was last read, or the queue last went from empty to owing.
    progress: Instant,
}

/// One written pipeline's claim on the replies.
struct Slot {
    /// Replies to read before this slot is complete.
    expect: usize,
    /// Leading replies the caller does not want (redis-rs's `offset`).
    skip: usize,
    got: Vec<Value>,
    /// Dropped receiver: the caller gave up; the replies are still read.
    reply: oneshot::Sender<RedisResult<Vec<Value>>>,
}

impl Owed {
    fn new(heard: Arc<Heard>) -> Self {
        Self(
            Mutex::new(Waiting {
                queue: Some(VecDeque::new()),
                progress: Instant::now(),
            }),
            heard,
        )
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Fails the connection: every waiting call gets `why`, and so does every later one.
    fn fail(&self, why: &str) {
        let waiting = self.lock().queue.take();
        for slot in waiting.into_iter().flatten() {
            let _ = slot.reply.send(Err(lost(why)));
        }
    }

    /// Failed, or failed now because it owes replies and has read none for `stalled_after`.
    fn is_failed(&self, stalled_after: Duration) -> bool {
        let stalled = {
            let waiting = self.lock();
            match &waiting.queue {
                None => return true,
                Some(queue) => !queue.is_empty() && waiting.progress.elapsed() > stalled_after,
            }
        };
        if stalled {
            self.fail("redis stopped answering");
        }
        stalled
    }

    /// Queues `slot` for the replies of a pipeline about to be written.
    fn owe(&self, slot: Slot) -> RedisResult<()> {
        let mut waiting = self.lock();
        let Waiting { queue, progress } = &mut *waiting;
        let Some(queue) = queue else {
            return Err(lost("the redis connection has failed"));
        };
        if queue.is_empty() {
            *progress = Instant::now();
        }
        queue.push_back(slot);
        self.1.asked();
        Ok(())
    }

    /// Hands `values` (in order) to the waiting calls. An error means a reply nobody asked for;
    /// the calls completed before it still get their replies.
    fn deliver(&self, values: Vec<Value>) -> Result<(), ()> {
        let mut done = Vec::new();
        let mut unasked = false;
        {
            self.1.replied();
            let mut waiting = self.lock();
            waiting.progress = Instant::now();
            let Some(queue) = waiting.queue.as_mut() else {
                return Ok(());
            };
            for value in values {
                let Some(front) = queue.front_mut() else {
                    unasked = true;
                    break;
                };
                front.got.push(value);
                if front.got.len() == front.expect
                    && let Some(slot) = queue.pop_front()
                {
                    done.push(slot);
                }
            }
        }
        for mut slot in done {
            let wanted = slot.got.split_off(slot.skip.min(slot.got.len()));
            let _ = slot.reply.send(Ok(wanted));
        }
        if unasked { Err(()) } else { Ok(()) }
    }
}

/// What one server has been told and has said, over all the connections to it (a pool's:
/// the server, or one cluster node), and through `store` over the whole store's: whether it
/// answers, or has owed replies for a while and read none.
///
/// Per server rather than per connection: with several pooled connections and little traffic a
/// connection may have read nothing for seconds while its neighbours answer, and a short pause
/// of Redis (`CLIENT PAUSE`, a fork, a stopped host resumed) would look like an outage on it.
/// Nor is silence alone an outage: a server nobody asked anything has had no chance to answer.
/// What counts is silence while replies are owed.
#[derive(Debug, Default)]
pub(super) struct Heard {
    /// Since when replies (or a connect) have been owed with no reply read: set by the first
    /// write or connect attempt after the last reply read, cleared by every reply read.
    owing_since: Mutex<Option<Instant>>,
    /// The whole store's, told everything this one is (`None` for the store's own).
    store: Option<Arc<Heard>>,
}

impl Heard {
    /// A server's, within the store's `store`.
    pub(super) fn within(store: &Arc<Heard>) -> Arc<Heard> {
        Arc::new(Heard {
            owing_since: Mutex::default(),
            store: Some(store.clone()),
        })
    }

    fn owing(&self) -> MutexGuard<'_, Option<Instant>> {
        self.owing_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Something was written, or a connection is being opened: a reply is owed.
    pub(super) fn asked(&self) {
        self.owing().get_or_insert_with(Instant::now);
        if let Some(store) = &self.store {
            store.asked();
        }
    }

    /// A reply was read: the server answers.
    fn replied(&self) {
        *self.owing() = None;
        if let Some(store) = &self.store {
            store.replied();
        }
    }

    /// Whether the server is answering, or had no chance to be heard: it has not owed replies
    /// for `within` with none read.
    fn answering(&self, within: Duration) -> bool {
        self.owing().is_none_or(|since| since.elapsed() < within)
    }
}

tokio::task_local! {
    /// The [`Watch`] of the store call running in this task, if it keeps one.
    static WATCH: Watch;
}

/// The servers one store call waited on (for a connection, or for a reply), so that when its
/// deadline passes the call can tell a slow Redis from a dead one. The call's task carries it
/// ([`Watch::scope`]); the batcher, which writes for many calls from a task of its own, is
/// handed it with each call.
#[derive(Clone, Default)]
pub(super) struct Watch(Arc<Mutex<Vec<Arc<Heard>>>>);

impl Watch {
    /// Runs `call` with this watch as its task's.
    pub(super) async fn scope<F: std::future::Future>(&self, call: F) -> F::Output {
        WATCH.scope(self.clone(), call).await
    }

    /// The watch of the store call running in this task.
    pub(super) fn current() -> Option<Watch> {
        WATCH.try_with(Watch::clone).ok()
    }

    /// The call waits on the server `heard` is of (for a connection to it, or a reply).
    pub(super) fn waits_on(&self, heard: &Arc<Heard>) {
        let mut servers = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !servers.iter().any(|known| Arc::ptr_eq(known, heard)) {
            servers.push(heard.clone());
        }
    }

    /// The call was written to `wire`.
    pub(super) fn written_to(&self, wire: &Wire) {
        self.waits_on(&wire.shared.owed.1);
    }

    /// Redis is answering (or had no chance to be heard) on every server the call waited on:
    /// none of them has owed replies for [`STALLED_AFTER`] with none read, the time after which
    /// a connection owing replies is taken for dead anyway. A call that reached no server
    /// (queued behind a busy scheduler) goes by `store`, all its servers together. A dead Redis
    /// refuses or resets connections, which fails calls at once rather than late; one that
    /// answers nothing owes the calls written to it, and the connects tried, for ever longer.
    pub(super) fn redis_answering(&self, store: &Heard) -> bool {
        let servers = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if servers.is_empty() {
            store.answering(STALLED_AFTER)
        } else {
            servers.iter().all(|s| s.answering(STALLED_AFTER))
        }
    }
}

/// The error a call gets when the connection fails under it: an I/O error, so that it counts as
/// "may have run" and retires the connection.
fn lost(why: &str) -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::ConnectionReset,
        why.to_string(),
    ))
}

/// Fails the connection when dropped before [`WriteGuard::done`]: a write cut short leaves
/// half a command on the wire.
struct WriteGuard<'a> {
    owed: &'a Owed,
    finished: bool,
}

impl WriteGuard<'_> {
    fn done(mut self) {
        self.finished = true;
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.owed.fail("a write to redis was cut short");
        }
    }
}

impl Wire {
    /// Connects to `info`'s server (TLS with `tls` for a `rediss://` address), authenticates
    /// and selects its database, all within `timeout`. The attempt, and everything it writes
    /// and reads later, is told to `heard`: a connect that hangs is a reply owed.
    pub(super) async fn connect(
        info: &ConnectionInfo,
        tls: Option<&Arc<rustls::ClientConfig>>,
        timeout: Duration,
        heard: Arc<Heard>,
    ) -> RedisResult<Wire> {
        heard.asked();
        match tokio::time::timeout(timeout, Self::open(info, tls, heard)).await {
            Ok(wire) => wire,
            Err(_) => Err(RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                "timed out connecting to redis",
            ))),
        }
    }

    async fn open(
        info: &ConnectionInfo,
        tls: Option<&Arc<rustls::ClientConfig>>,
        heard: Arc<Heard>,
    ) -> RedisResult<Wire> {
        type Halves = (
            Box<dyn AsyncRead + Send + Unpin>,
            Box<dyn AsyncWrite + Send + Unpin>,
        );
        let (read, write): Halves = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let (read, write) = tcp(host, *port).await?.into_split();
                (Box::new(read), Box::new(write))
            }
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                let Some(config) = tls else {
                    return Err(config_error("TLS address without TLS settings"));
                };
                if *insecure {
                    return Err(config_error(
                        "TLS without certificate checks is not supported",
                    ));
                }
                let name = ServerName::try_from(host.clone())
                    .map_err(|_| config_error("invalid TLS server name"))?;
                let stream = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp(host, *port).await?)
                    .await?;
                let (read, write) = tokio::io::split(stream);
                (Box::new(read), Box::new(write))
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let (read, write) = tokio::net::UnixStream::connect(path).await?.into_split();
                (Box::new(read), Box::new(write))
            }
            #[allow(unreachable_patterns)]
            _ => return Err(config_error("unsupported redis address")),
        };
        let owed = Arc::new(Owed::new(heard));
        let reader = tokio::spawn(read_replies(read, owed.clone())).abort_handle();
        let mut wire = Wire {
            shared: Arc::new(Shared {
                writer: tokio::sync::Mutex::new(write),
                owed,
                reader,
            }),
            db: info.redis_settings().db(),
        };
        wire.handshake(info).await?;
        Ok(wire)
    }

    /// `AUTH` and `SELECT` when the settings ask for them, and the client's name for
    /// `CLIENT LIST` (refused by Redis before 7.2, which is fine).
    async fn handshake(&mut self, info: &ConnectionInfo) -> RedisResult<()> {
        let settings = info.redis_settings();
        let mut setup = Pipeline::new();
        if let Some(password) = settings.password() {
            let auth = setup.cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
        }
        if settings.db() != 0 {
            setup.cmd("SELECT").arg(settings.db());
        }
        let checked = setup.len();
        setup
            .cmd("CLIENT")
            .arg("SETINFO")
            .arg("LIB-NAME")
            .arg("sluice");
        setup
            .cmd("CLIENT")
            .arg("SETINFO")
            .arg("LIB-VER")
            .arg(env!("CARGO_PKG_VERSION"));
        let replies = self.req_packed_commands(&setup, 0, setup.len()).await?;
        for reply in replies.into_iter().take(checked) {
            reply.extract_error()?;
        }
        Ok(())
    }

    /// The connection has failed (or stalled, see [`STALLED_AFTER`]); every call on it fails.
    pub(super) fn is_failed(&self) -> bool {
        self.shared.owed.is_failed(STALLED_AFTER)
    }

    /// Writes `packed` (`expect` commands) and waits for the replies after the first `skip`.
    async fn exchange(&self, packed: &[u8], skip: usize, expect: usize) -> RedisResult<Vec<Value>> {
        let (reply, answer) = oneshot::channel();
        {
            let mut writer = self.shared.writer.lock().await;
            self.shared.owed.owe(Slot {
                expect,
                skip,
                got: Vec::with_capacity(expect),
                reply,
            })?;
            let guard = WriteGuard {
                owed: &self.shared.owed,
                finished: false,
            };
            // On an error the guard fails the connection, this call with it.
            if writer.write_all(packed).await.is_ok() && writer.flush().await.is_ok() {
                guard.done();
            }
        }
        answer
            .await
            .unwrap_or_else(|_| Err(lost("the redis connection has failed")))
    }
}

impl ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.exchange(&cmd.get_packed_command(), 0, 1).await?;
            replies.pop().ok_or_else(|| lost("no reply from redis"))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let packed = pipeline.get_packed_pipeline();
            self.exchange(&packed, offset, offset + count).await
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

async fn tcp(host: &str, port: u16) -> io::Result<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    // Commands are written whole; waiting to coalesce them only adds latency.
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn config_error(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what))
}

/// The reader task: parses replies as they arrive and answers the waiting calls, until the
/// stream ends or fails.
async fn read_replies(mut read: Box<dyn AsyncRead + Send + Unpin>, owed: Arc<Owed>) {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    loop {
        let mut start = 0;
        let mut values = Vec::new();
        loop {
            match parse(&buf[start..], 0) {
                Ok(Some((value, used))) => {
                    values.push(value);
                    start += used;
                }
                Ok(None) => break,
                Err(why) => {
                    owed.fail(why);
                    return;
                }
            }
        }
        buf.drain(..start);
        if !values.is_empty() && owed.deliver(values).is_err() {
            owed.fail("redis sent a reply nobody asked for");
            return;
        }
        buf.reserve(READ_CHUNK);
        match read.read_buf(&mut buf).await {
            Ok(0) => {
                owed.fail("redis closed the connection");
                return;
            }
            Ok(_) => {}
            Err(_) => {
                owed.fail("reading from redis failed");
                return;
            }
        }
    }
}

/// One RESP2 reply at the start of `buf` and its length; `None` when it is not all there yet.
fn parse(buf: &[u8], depth: usize) -> Result<Option<(Value, usize)>, &'static str> {
    const BAD: &str = "redis sent a malformed reply";
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let (Some(&kind), line) = (buf.first(), &buf[1.min(end)..end]) else {
        return Ok(None);
    };
    let after_line = end + 2;
    let number = || -> Result<i64, &'static str> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(BAD)
    };
    let value = match kind {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8(line.to_vec()).map_err(|_| BAD)?),
        // redis-rs classifies error replies (NOSCRIPT, MOVED, ASK, ...) itself.
        b'-' => redis::parse_redis_value(&buf[..after_line]).map_err(|_| BAD)?,
        b':' => Value::Int(number()?),
        b'$' => {
            let Ok(len) = usize::try_from(number()?) else {
                return Ok(Some((Value::Nil, after_line)));
            };
            let total = after_line
                .checked_add(len)
                .and_then(|n| n.checked_add(2))
                .ok_or(BAD)?;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[total - 2..total] != b"\r\n" {
                return Err(BAD);
            }
            return Ok(Some((
                Value::BulkString(buf[after_line..total - 2].to_vec()),
                total,
            )));
        }
        b'*' => {
            let Ok(count) = usize::try_from(number()?) else {
                return Ok(Some((Value::Nil, after_line)));
            };
            if depth >= MAX_DEPTH {
                return Err(BAD);
            }
            // Not trusting `count` for the allocation: the elements must be there first.
            let mut items = Vec::with_capacity(count.min(1024));
            let mut at = after_line;
            for _ in 0..count {
                match parse(&buf[at..], depth + 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(BAD),
    };
    Ok(Some((value, after_line)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Option<(Value, usize)> {
        parse(bytes, 0).unwrap()
    }

    #[test]
    fn a_server_is_down_only_after_owing_replies_and_reading_none_for_a_while() {
        let within = Duration::from_millis(30);
        let store = Arc::new(Heard::default());
        let (one, two) = (Heard::within(&store), Heard::within(&store));
        assert!(
            one.answering(within),
            "nothing asked: no chance to be heard"
        );
        std::thread::sleep(within * 2);
        assert!(one.answering(within), "a quiet server is not a silent one");
        one.asked();
        assert!(one.answering(within), "owing for less than `within`");
        std::thread::sleep(within * 2);
        assert!(!one.answering(within), "owed and silent for longer");
        assert!(
            !store.answering(within),
            "the store hears what its servers are asked"
        );
        assert!(
            two.answering(within),
            "another server of the store owes nothing"
        );
        two.replied();
        assert!(store.answering(within), "any reply of the store's");
        assert!(!one.answering(within), "is not this server's");
        one.asked();
        one.replied();
        assert!(one.answering(within), "a reply clears what was owed");
    }

    #[test]
    fn parses_each_resp2_type() {
        assert_eq!(one(b"+OK\r\n"), Some((Value::Okay, 5)));
        assert_eq!(
            one(b"+PONG\r\n"),
            Some((Value::SimpleString("PONG".into()), 7))
        );
        assert_eq!(one(b":-42\r\n"), Some((Value::Int(-42), 6)));
        assert_eq!(one(b"$-1\r\n"), Some((Value::Nil, 5)));
        assert_eq!(
            one(b"$3\r\na\r\n\r\n"),
            Some((Value::BulkString(b"a\r\n".to_vec()), 9))
        );
        assert_eq!(
            one(b"*2\r\n:1\r\n$1\r\nx\r\n+rest"),
            Some((
                Value::Array(vec![Value::Int(1), Value::BulkString(b"x".to_vec())]),
                15
            ))
        );
        assert_eq!(one(b"*-1\r\n"), Some((Value::Nil, 5)));
    }

    #[test]
    fn error_replies_keep_their_kinds() {
        let (value, used) = one(b"-NOSCRIPT No matching script\r\n").unwrap();
        assert_eq!(used, 30);
        let Value::ServerError(e) = value else {
            panic!("{value:?}")
        };
        assert_eq!(e.kind(), Some(redis::ServerErrorKind::NoScript));
        let (value, _) = one(b"-MOVED 3999 127.0.0.1:6381\r\n").unwrap();
        assert!(
            matches!(value, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::Moved))
        );
    }

    #[test]
    fn incomplete_replies_wait_for_more() {
        for partial in [
            &b""[..],
            b"+OK",
            b"+OK\r",
            b"$5\r\nab",
            b"$5\r\nabcde\r",
            b"*2\r\n:1\r\n",
            b"*2\r\n:1\r\n$1\r\n",
        ] {
            assert_eq!(parse(partial, 0), Ok(None), "{partial:?}");
        }
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for bad in [
            &b"?x\r\n"[..],
            b":abc\r\n",
            b"$2\r\nabcd\r\n",
            b"$99999999999999999999\r\n",
            b"\r\n",
        ] {
            assert!(parse(bad, 0).is_err(), "{bad:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes(), 0).is_err());
    }
}
