//! `GRPC_MAX_CONNECTION_AGE` and `_GRACE` through the real binary: at the age the server sends
//! HTTP/2 GOAWAY and answers the calls in flight; at age + grace it closes the connection,
//! whatever is still in flight.
//!
//! Most checks speak raw HTTP/2 over a plain socket (or rustls), because a gRPC client hides
//! exactly what matters here: whether a GOAWAY came, and when the socket closed. The frame
//! codec is the minimum a client needs (`kit::raw_h2`: a 9-byte header of 24-bit length,
//! type, flags and 31-bit stream id; headers as HPACK literals without Huffman coding).

use sluice_test_kit as kit;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kit::native::{self, LimiterSluice};
use kit::raw_h2::{
    ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM, SETTINGS, encode_frame,
    header_block,
};
use kit::*;
use prost::Message;
use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    AcquireRequest, AcquireResponse, Algorithm, LimiterConfig, SetMode,
};
use tonic::transport::Channel;

const PING: u8 = 0x6;

/// Longest a raw connection may stay open, and longest a read may wait; far beyond every
/// expected moment.
const PATIENCE: Duration = Duration::from_secs(60);

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
    /// Since the client started connecting.
    at: Duration,
}

impl Frame {
    /// A GOAWAY's last stream id and error code.
    fn goaway(&self) -> (u32, u32) {
        let word = |i: usize| u32::from_be_bytes(self.payload[i..i + 4].try_into().unwrap());
        (word(0) & 0x7fff_ffff, word(4))
    }
}

/// A client speaking raw HTTP/2 over `S` (a TCP or TLS stream).
struct H2<S> {
    io: S,
    started: Instant,
}

impl<S: Read + Write> H2<S> {
    /// Sends the connection preface and empty SETTINGS over `io`, connected at `started`.
    fn new(mut io: S, started: Instant) -> H2<S> {
        io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        io.write_all(&encode_frame(SETTINGS, 0, 0, &[])).unwrap();
        io.flush().unwrap();
        H2 { io, started }
    }

    /// Starts a gRPC call on `stream` to `path`; with a `message` the request is complete,
    /// without one it never is, so the call stays in flight.
    fn call(&mut self, stream: u32, path: &str, message: Option<&[u8]>) {
        let headers = header_block(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]);
        let mut bytes = encode_frame(HEADERS, END_HEADERS, stream, &headers);
        if let Some(message) = message {
            let mut body = vec![0];
            body.extend((message.len() as u32).to_be_bytes());
            body.extend(message);
            bytes.extend(encode_frame(DATA, END_STREAM, stream, &body));
        }
        self.io.write_all(&bytes).unwrap();
        self.io.flush().unwrap();
    }

    /// The next frame other than SETTINGS and PING, which are acknowledged here as a live
    /// client would (so the server's keep-alive never gives up on us); `None` once the server
    /// has closed the connection.
    fn next(&mut self) -> Option<Frame> {
        loop {
            // The server's keep-alive pings would otherwise keep a connection that is never
            // closed going forever.
            assert!(
                self.started.elapsed() < PATIENCE,
                "the connection is still open after {PATIENCE:?}"
            );
            let mut head = [0u8; 9];
            if let Err(e) = self.io.read_exact(&mut head) {
                return closed(e);
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0; len];
            if let Err(e) = self.io.read_exact(&mut payload) {
                return closed(e);
            }
            let frame = Frame {
                kind: head[3],
                flags: head[4],
                stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
                payload,
                at: self.started.elapsed(),
            };
            let answer = match frame.kind {
                SETTINGS if frame.flags & ACK == 0 => encode_frame(SETTINGS, ACK, 0, &[]),
                PING if frame.flags & ACK == 0 => encode_frame(PING, ACK, 0, &frame.payload),
                SETTINGS | PING => continue,
                _ => return Some(frame),
            };
            // The server may have closed already; the next read says so.
            let _ = self.io.write_all(&answer).and_then(|()| self.io.flush());
        }
    }
}

/// A read error that means the peer closed the connection (with a FIN, a reset, or without
/// TLS's close_notify); anything else (our read timeout) fails the test.
fn closed(e: io::Error) -> Option<Frame> {
    use io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => None,
        _ => panic!("no frame and no close within {PATIENCE:?}: {e}"),
    }
}

fn connect(addr: SocketAddr) -> (TcpStream, Instant) {
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    (tcp, started)
}

/// Everything the server sent until it closed the connection, and when it closed.
fn until_closed<S: Read + Write>(h2: &mut H2<S>) -> (Vec<Frame>, Duration) {
    let mut frames = Vec::new();
    while let Some(frame) = h2.next() {
        frames.push(frame);
    }
    (frames, h2.started.elapsed())
}

fn start(age: &str, grace: &str, extra: &[(&str, &str)]) -> LimiterSluice {
    let mut env = vec![
        ("GRPC_MAX_CONNECTION_AGE", age),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", grace),
        // The calls kept in flight here never finish their request; the request deadline
        // (`tests/stalled_calls.rs`) would end them before the grace does.
        ("HTTP_READ_HEADER_TIMEOUT", "60s"),
    ];
    env.extend_from_slice(extra);
    LimiterSluice::start(None, &env)
}

/// The checks shared by the plaintext and TLS listeners: a connection with a call that never
/// completes gets GOAWAY (NO_ERROR, the call not refused) at the age, and is closed at
/// age + grace, not before.
fn assert_goaway_then_hard_close<S: Read + Write>(mut h2: H2<S>, age: Duration, grace: Duration) {
    h2.call(1, "/sluice.v1.Limiter/Acquire", None);
    let (frames, closed_at) = until_closed(&mut h2);
    eprintln!(
        "frames (type, at): {:?}; closed at {closed_at:?}",
        frames.iter().map(|f| (f.kind, f.at)).collect::<Vec<_>>()
    );
    let goaways: Vec<&Frame> = frames.iter().filter(|f| f.kind == GOAWAY).collect();
    let Some(first) = goaways.first() else {
        panic!("the connection closed at {closed_at:?} without a GOAWAY");
    };
    assert!(
        first.at >= age && first.at < age + grace,
        "GOAWAY at {:?}, expected from {age:?} to {:?}",
        first.at,
        age + grace
    );
    for goaway in &goaways {
        let (last_stream, code) = goaway.goaway();
        assert_eq!(code, 0, "GOAWAY with an error code");
        assert!(last_stream >= 1, "GOAWAY refused the call in flight");
    }
    assert!(
        !frames
            .iter()
            .any(|f| f.kind == RST_STREAM && f.at < age + grace),
        "the call was reset before the grace ended"
    );
    assert!(
        closed_at >= age + grace && closed_at < age + grace + Duration::from_secs(30),
        "closed at {closed_at:?}, expected at {:?}",
        age + grace
    );
}

#[test]
fn goaway_at_the_age_and_close_after_the_grace_with_a_call_in_flight() {
    let (age, grace) = (Duration::from_secs(1), Duration::from_secs(10));
    let sluice = start("1s", "10s", &[]);
    let (tcp, started) = connect(sluice.sluice.grpc);
    assert_goaway_then_hard_close(H2::new(tcp, started), age, grace);
}

#[test]
fn goaway_and_hard_close_on_the_tls_listener_too() {
    let (age, grace) = (Duration::from_secs(1), Duration::from_secs(10));
    let pki = Pki::new("ca");
    pki.issue("server", &["localhost"]);
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let sluice = start(
        "1s",
        "10s",
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
        ],
    );

    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let session = rustls::ClientConnection::new(pki.h2_client_config("ca.pem"), name).unwrap();
    let (tcp, started) = connect(sluice.sluice.grpc);
    let tls = rustls::StreamOwned::new(session, tcp);
    assert_goaway_then_hard_close(H2::new(tls, started), age, grace);
}

#[test]
fn an_idle_connection_is_closed_soon_after_its_goaway() {
    let (age, grace) = (Duration::from_secs(1), Duration::from_secs(10));
    let sluice = start("1s", "10s", &[]);
    let (tcp, started) = connect(sluice.sluice.grpc);
    let mut h2 = H2::new(tcp, started);
    let (frames, closed_at) = until_closed(&mut h2);
    let goaway = frames.iter().find(|f| f.kind == GOAWAY);
    let Some(goaway) = goaway else {
        panic!("the connection closed at {closed_at:?} without a GOAWAY");
    };
    assert!(goaway.at >= age, "GOAWAY at {:?}", goaway.at);
    // Nothing is in flight, so the server need not wait for the grace.
    assert!(
        closed_at < age + grace,
        "closed at {closed_at:?}, after the grace"
    );
}

fn limiter(name: &str, rate: u64, interval: Duration) -> LimiterConfig {
    LimiterConfig {
        burst: 1,
        ..native::config(name, Algorithm::TokenBucket, rate, interval)
    }
}

/// Creates limiter `name` allowing one permit per `interval` and takes that permit, so the
/// next `Acquire` waits about `interval` on the server.
async fn drain(sluice: &LimiterSluice, name: &str, interval: Duration) -> LimiterClient<Channel> {
    let mut c = sluice.client().await;
    let applied = native::set(&mut c, limiter(name, 1, interval), SetMode::TrySet)
        .await
        .unwrap()
        .applied;
    assert!(applied);
    let taken = native::acquired(&mut c, name, "", 1).await;
    assert!(taken);
    c
}

fn acquire(name: &str) -> AcquireRequest {
    AcquireRequest {
        name: name.into(),
        permits: 1,
        client_id: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_in_flight_at_the_age_is_answered_after_the_goaway() {
    let age = Duration::from_secs(2);
    let grace = Duration::from_secs(30);
    // The call waits about 5 s on the server: it starts well before the age and ends well
    // after it, well within the grace.
    let wait = Duration::from_secs(5);
    let sluice = start("2s", "30s", &[]);
    drain(&sluice, "slow", wait).await;

    let addr = sluice.sluice.grpc;
    let request = acquire("slow").encode_to_vec();
    let (frames, closed_at, sent_at) = tokio::task::spawn_blocking(move || {
        let (tcp, started) = connect(addr);
        let mut h2 = H2::new(tcp, started);
        h2.call(1, "/sluice.v1.Limiter/Acquire", Some(&request));
        let sent_at = started.elapsed();
        let (frames, closed_at) = until_closed(&mut h2);
        (frames, closed_at, sent_at)
    })
    .await
    .unwrap();
    assert!(
        sent_at < age,
        "the call started at {sent_at:?}, after the age"
    );

    let Some(goaway) = frames.iter().find(|f| f.kind == GOAWAY) else {
        panic!("no GOAWAY before the close at {closed_at:?}");
    };
    assert!(goaway.at >= age, "GOAWAY at {:?}", goaway.at);
    assert!(goaway.goaway().0 >= 1, "GOAWAY refused the call in flight");
    let data: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.kind == DATA && f.stream == 1)
        .collect();
    assert!(!data.is_empty(), "the call got no answer");
    assert!(
        data.iter().all(|f| f.at > goaway.at),
        "the answer came before the GOAWAY, so the call did not span it"
    );
    let body: Vec<u8> = data.iter().flat_map(|f| f.payload.clone()).collect();
    let response = AcquireResponse::decode(&body[5..]).unwrap();
    assert!(response.acquired, "{response:?}");
    assert!(
        frames
            .iter()
            .any(|f| f.kind == HEADERS && f.stream == 1 && f.flags & END_STREAM != 0),
        "the call was not ended with trailers"
    );
    assert!(
        !frames.iter().any(|f| f.kind == RST_STREAM),
        "a stream was reset"
    );
    // Once the call is answered nothing holds the connection open.
    assert!(
        closed_at < age + grace,
        "closed at {closed_at:?}, not when the call ended"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grpc_client_sees_calls_within_the_grace_answered_and_longer_ones_cut() {
    // Within the grace: the waiting call spans the age and succeeds.
    let sluice = start("1s", "20s", &[]);
    let mut c = drain(&sluice, "slow", Duration::from_secs(4)).await;
    let started = Instant::now();
    let r = c.acquire(acquire("slow")).await.unwrap().into_inner();
    assert!(r.acquired);
    assert!(started.elapsed() > Duration::from_secs(1));
    // Not checked here: a call this client sends right after that answer can fail with
    // CANCELLED "connection closed", because tonic's channel keeps using the connection after
    // its GOAWAY until it sees it close, which the server does as soon as its last call ends.
    drop(sluice);

    // Longer than the grace: the call is cut when the grace ends, as the setting asks. This is
    // the expected price of a grace shorter than the longest call (here a 40 s wait, allowed by
    // LIMITER_MAX_WAIT=60s); the client gets an error, not an answer.
    let sluice = start("1s", "1s", &[("LIMITER_MAX_WAIT", "60s")]);
    let mut c = drain(&sluice, "slow", Duration::from_secs(40)).await;
    let started = Instant::now();
    let status = c.acquire(acquire("slow")).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(30),
        "cut after {took:?} ({status:?})"
    );
    eprintln!("the cut call: {status:?} after {took:?}");
}

/// What one connection of the load saw.
#[derive(Default, Debug)]
struct Seen {
    /// Closed by the server, as opposed to dropped by us when the run ended.
    closed: bool,
    goaway: bool,
    sent: u32,
    answered: u32,
}

/// Sends `request` to ShouldRateLimit on one connection, one call after another, until a GOAWAY
/// comes (then it only waits for the answer in flight and the close) or `until` passes.
fn one_connection(addr: SocketAddr, request: &[u8], until: Instant) -> Seen {
    let (tcp, started) = connect(addr);
    let mut h2 = H2::new(tcp, started);
    let mut seen = Seen::default();
    let mut next_id = 1;
    // The call in flight, and whether its response message came.
    let mut pending: Option<(u32, bool)> = None;
    loop {
        if pending.is_none() && !seen.goaway {
            if Instant::now() >= until {
                return seen;
            }
            let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
            h2.call(next_id, path, Some(request));
            pending = Some((next_id, false));
            next_id += 2;
            seen.sent += 1;
        }
        let Some(frame) = h2.next() else {
            seen.closed = true;
            return seen;
        };
        match (frame.kind, pending) {
            (GOAWAY, _) => seen.goaway = true,
            (DATA, Some((id, _))) if frame.stream == id => pending = Some((id, true)),
            (HEADERS, Some((id, data))) if frame.stream == id && frame.flags & END_STREAM != 0 => {
                seen.answered += u32::from(data);
                pending = None;
            }
            _ => {}
        }
    }
}

#[test]
fn under_load_every_connection_gets_a_goaway_before_it_closes_and_every_call_an_answer() {
    // A short age so that each client goes through many connections; a grace far above the
    // few milliseconds a call takes.
    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n",
    );
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("GRPC_MAX_CONNECTION_AGE", "300ms"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"),
        ],
    );
    let request = request("app", vec![descriptor(&[("user", "x")])]).encode_to_vec();
    let until = Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (addr, request) = (sluice.grpc, request.clone());
            std::thread::spawn(move || {
                let mut all = Vec::new();
                loop {
                    let seen = one_connection(addr, &request, until);
                    let last = !seen.closed;
                    all.push(seen);
                    if last {
                        return all;
                    }
                }
            })
        })
        .collect();
    let seen: Vec<Seen> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let closed = seen.iter().filter(|s| s.closed).count();
    let without_goaway = seen.iter().filter(|s| s.closed && !s.goaway).count();
    let sent: u32 = seen.iter().map(|s| s.sent).sum();
    let answered: u32 = seen.iter().map(|s| s.answered).sum();
    eprintln!(
        "{} connections, {closed} closed by the server, {without_goaway} of them without GOAWAY; {sent} calls sent, {answered} answered",
        seen.len()
    );
    assert!(closed >= 4, "{seen:?}");
    assert_eq!(without_goaway, 0, "{seen:?}");
    assert_eq!(answered, sent, "{seen:?}");
}
