//! A TCP proxy of our own between Sluice and a real `redis-server`, with faults switched on and
//! off while traffic flows: added latency and jitter per direction, bytes written in pieces (one
//! byte at a time, or random chunks), replies held back (a stall), connections reset after N
//! bytes of replies (mid-reply), and the reply direction half-closed (FIN toward Sluice).
//!
//! Sluice's Redis connection (`src/store/redis/wire.rs`) matches replies to callers by their
//! order on the socket; loopback never delays, splits or cuts a reply, so only a proxy in the
//! path shows what a real network does to that matching. Redis restarted behind the proxy needs
//! nothing here: the proxy's upstream sockets end, and it ends the matching client sockets.
//!
//! Each accepted connection gets two pumps (Sluice → Redis, Redis → Sluice). A pump reads,
//! stamps each read with the time it may leave (latency plus jitter, never before an earlier
//! read, so order is kept), and a writer task sends it when due, in the pieces asked for.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

/// How bytes are cut into writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Chunking {
    /// As they were read.
    #[default]
    Whole,
    /// One byte per write, so the reader meets every byte boundary.
    OneByte,
    /// Random pieces of 1 to this many bytes.
    Random(usize),
}

/// The faults of one direction.
#[derive(Clone, Copy, Debug, Default)]
pub struct Leg {
    pub latency: Duration,
    /// Up to this much more, drawn per read.
    pub jitter: Duration,
    pub chunking: Chunking,
}

/// Every fault; `Faults::default()` is a clean pass-through.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Sluice → Redis (commands).
    pub up: Leg,
    /// Redis → Sluice (replies).
    pub down: Leg,
    /// Replies are held back (not dropped) while set.
    pub stall: bool,
    /// Every connection is reset (both sides) after this many more reply bytes.
    pub reset_after: Option<usize>,
    /// Replies stop and the socket toward Sluice is shut down for writing (a FIN): Sluice sees
    /// the stream end while it still owes replies.
    pub half_close: bool,
}

struct Control {
    faults: Mutex<Faults>,
    /// Bumped on every change, so each connection re-arms `reset_after` from that moment.
    generation: AtomicU64,
    changed: Notify,
    /// Connections accepted so far.
    accepted: AtomicU64,
}

/// The proxy; dropping it stops accepting (live connections end with their peers).
pub struct FaultProxy {
    pub addr: SocketAddr,
    control: Arc<Control>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let control = Arc::new(Control {
            faults: Mutex::new(Faults::default()),
            generation: AtomicU64::new(0),
            changed: Notify::new(),
            accepted: AtomicU64::new(0),
        });
        let shared = control.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(client, upstream, shared.clone()));
            }
        });
        FaultProxy {
            addr,
            control,
            accept,
        }
    }

    /// `host:port` for `REDIS_URL`.
    pub fn url(&self) -> String {
        self.addr.to_string()
    }

    /// Replaces the faults; live connections follow at once.
    pub fn set(&self, faults: Faults) {
        *self.control.faults.lock().unwrap() = faults;
        self.control.generation.fetch_add(1, Ordering::SeqCst);
        self.control.changed.notify_waiters();
    }

    /// Connections accepted so far: shows that traffic went through the proxy.
    pub fn accepted(&self) -> u64 {
        self.control.accepted.load(Ordering::Relaxed)
    }

    pub fn clear(&self) {
        self.set(Faults::default());
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Up,
    Down,
}

async fn serve(client: TcpStream, upstream: SocketAddr, control: Arc<Control>) {
    // Redis down (restarting): the client's connect succeeded, so end it at once.
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    for socket in [&client, &server] {
        let _ = socket.set_nodelay(true);
        // A close is then a reset (RST): what `reset_after` needs. Ordinary ends go through
        // the write half's shutdown (a FIN) first, so they stay clean.
        let _ = socket.set_zero_linger();
    }
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Either pump ending (a peer gone, or a reset fault) ends the whole connection.
    let mut up = tokio::spawn(pump(client_read, server_write, Way::Up, control.clone()));
    let mut down = tokio::spawn(pump(server_read, client_write, Way::Down, control));
    tokio::select! {
        _ = &mut up => down.abort(),
        _ = &mut down => up.abort(),
    }
}

/// A small xorshift, so the jitter and chunk sizes need no dependency.
struct Dice(u64);

impl Dice {
    fn new() -> Self {
        static SEED: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
        Dice(SEED.fetch_add(0x6a09_e667_f3bc_c909, Ordering::Relaxed) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 { 0 } else { self.0 % n }
    }
}

/// Reads one direction and hands each read, stamped with when it may leave, to its writer.
async fn pump(mut from: OwnedReadHalf, to: OwnedWriteHalf, way: Way, control: Arc<Control>) {
    let (queue, due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(send(to, due, way, control.clone()));
    let mut dice = Dice::new();
    let mut last_due = Instant::now();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // The writer ended (a reset fault, or the peer gone): stop reading too.
            _ = queue.closed() => break,
        };
        let faults = *control.faults.lock().unwrap();
        let leg = if way == Way::Up {
            faults.up
        } else {
            faults.down
        };
        let jitter = dice.below(leg.jitter.as_micros() as u64);
        // Never before an earlier read: latency delays bytes, it does not reorder them.
        last_due = last_due.max(Instant::now() + leg.latency + Duration::from_micros(jitter));
        if queue.send((last_due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(queue);
    let _ = writer.await;
}

/// Writes what `pump` read once it is due, applying the stall, reset and half-close faults on
/// the reply direction.
async fn send(
    mut to: OwnedWriteHalf,
    mut due: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    way: Way,
    control: Arc<Control>,
) {
    let mut dice = Dice::new();
    // Reply bytes sent since the faults last changed, for `reset_after`.
    let mut generation = u64::MAX;
    let mut sent_since = 0usize;
    while let Some((when, bytes)) = due.recv().await {
        tokio::time::sleep_until(when).await;
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (faults, now_generation) = loop {
                // Registered before reading the faults, so a change between is not missed.
                let changed = control.changed.notified();
                let faults = *control.faults.lock().unwrap();
                let generation = control.generation.load(Ordering::SeqCst);
                if way == Way::Down && faults.stall && !faults.half_close {
                    changed.await;
                    continue;
                }
                break (faults, generation);
            };
            if now_generation != generation {
                generation = now_generation;
                sent_since = 0;
            }
            if way == Way::Down && faults.half_close {
                let _ = to.shutdown().await;
                // Replies are dropped from here; the socket's read side still takes Sluice's
                // commands until Sluice closes it, which ends the pump and this queue.
                while due.recv().await.is_some() {}
                return;
            }
            let leg = if way == Way::Up {
                faults.up
            } else {
                faults.down
            };
            let mut take = match leg.chunking {
                Chunking::Whole => rest.len(),
                Chunking::OneByte => 1,
                Chunking::Random(max) => 1 + dice.below(max.max(1) as u64) as usize,
            }
            .min(rest.len());
            let mut cut = false;
            if way == Way::Down
                && let Some(limit) = faults.reset_after
            {
                let left = limit.saturating_sub(sent_since);
                if take >= left {
                    take = left;
                    cut = true;
                }
            }
            if take > 0 && to.write_all(&rest[..take]).await.is_err() {
                return;
            }
            sent_since += take;
            rest = &rest[take..];
            if cut {
                // A reset, not a FIN: no shutdown on drop, and with SO_LINGER 0 the close that
                // follows (the pump drops the read half, `serve` ends the other direction)
                // sends RST both ways.
                to.forget();
                return;
            }
            if leg.chunking != Chunking::Whole {
                // Each piece leaves as its own segment (TCP_NODELAY); yielding between them
                // lets the reader wake up between pieces. A timer would be surer, but its 1 ms
                // granularity makes a 20-byte reply take 20 ms, and every call time out.
                tokio::task::yield_now().await;
            }
        }
    }
}
