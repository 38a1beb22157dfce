//! Many idle and stalled connections must not stop the service from answering others.
//!
//! Opens 10 000 TCP connections to the gRPC port that never speak (or stop half-way through the
//! HTTP/2 preface) and 1 000 idle ones to the HTTP port, then checks a normal gRPC client and an
//! HTTP client are still answered correctly, and prints the server's RSS with and without them
//! (quoted in SECURITY.md). Then checks `MAX_CONNECTIONS`: connections beyond it are closed at
//! once and counted, and room comes back when others close. Then the HTTP/2 abuses: idle
//! connections get a GOAWAY, and a client cancelling calls in bulk (rapid reset) or sending a
//! header block that never ends (CONTINUATION flood) is sent away.
//!
//! A binary of its own, not a module of `tests/it`: it holds 10 000 sockets of this test process
//! (checked against its own open-file limit, `/proc/self/limits`), which tests running beside it
//! in the same process would share and could run out of, and the RSS it prints is quoted in
//! SECURITY.md, a figure taken with nothing else running.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::raw_h2::{
    CONTINUATION, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, GOAWAY, HEADERS, RST_STREAM,
    encode_frame, header_block, should_rate_limit_headers,
};
use kit::*;
use sluice::proto::{Code, RateLimitRequest, RateLimitServiceClient};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tonic::transport::Channel;

const CONFIG: &str = "
domain: conn
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50}
";

/// The soft limit on open files of this process, from `/proc/self/limits`.
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

async fn code(client: &mut RateLimitServiceClient<Channel>, req: &RateLimitRequest) -> Code {
    Code::try_from(ask(client, req.clone()).await.overall_code).unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Waits up to 20 s until the server's count of open files satisfies `done`.
async fn wait_for_fds(pid: u32, done: impl Fn(usize) -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done(open_fds(pid)) {
        assert!(
            std::time::Instant::now() < deadline,
            "server not done {what}: {} files open",
            open_fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

async fn open(addr: std::net::SocketAddr, count: usize, preface_bytes: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    // In batches, so the listen backlog is never the thing being measured.
    for batch in (0..count).collect::<Vec<_>>().chunks(250) {
        let connects = batch.iter().map(|_| async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            if preface_bytes > 0 {
                stream
                    .write_all(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..preface_bytes])
                    .await
                    .unwrap();
            }
            stream
        });
        held.extend(futures::future::join_all(connects).await);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_stalled_connections_do_not_block_other_clients() {
    let dir = config_dir(CONFIG);
    // Above the 10 000 this test holds: here the point is that they cost nothing but memory.
    // The handshake and header timeouts and the per-peer cap are off: here the point is what
    // held connections cost, not how they are let go (see the tests below for that).
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("MAX_CONNECTIONS", "20000"),
            ("MAX_CONNECTIONS_PER_PEER", "0"),
            ("GRPC_HANDSHAKE_TIMEOUT", "0"),
            ("HTTP_READ_HEADER_TIMEOUT", "0"),
        ],
    );
    let mut client = sluice.client().await;
    let req = request("conn", vec![descriptor(&[("user", "a")])]);
    assert_eq!(code(&mut client, &req).await, Code::Ok);
    let rss_before = rss_kib(sluice.pid());
    let fds_before = open_fds(sluice.pid());

    // The server process has the same limit as this one (it inherits it).
    let room = open_files_limit().saturating_sub(512);
    let (idle, stalled, http_idle) = (
        9_000.min(room * 9 / 11),
        1_000.min(room / 11),
        1_000.min(room / 11),
    );
    if idle < 9_000 {
        eprintln!(
            "open-files limit {}: {idle} idle connections instead of 9000",
            open_files_limit()
        );
    }
    let mut held = open(sluice.grpc, idle, 0).await;
    // Half a preface: the server waits for the rest.
    held.extend(open(sluice.grpc, stalled, 10).await);
    held.extend(open(sluice.http, http_idle, 0).await);
    // Wait until the server has accepted every one of them.
    let opened = idle + stalled + http_idle;
    let pid = sluice.pid();
    wait_for_fds(
        pid,
        |n| n >= fds_before + opened,
        "accepting every connection",
    )
    .await;
    let rss_held = rss_kib(sluice.pid());

    // A fresh client on a new connection is answered, and counting is still exact.
    let mut fresh = sluice.client().await;
    for i in 2..=50 {
        let answer = ask(&mut fresh, req.clone()).await;
        assert_eq!(answer.overall_code, Code::Ok as i32, "request {i}");
        assert_eq!(answer.statuses[0].limit_remaining, 50 - i);
    }
    assert_eq!(code(&mut fresh, &req).await, Code::OverLimit);
    // The connection opened before them still works, and so does HTTP.
    assert_eq!(code(&mut client, &req).await, Code::OverLimit);
    let (status, _) = sluice.http("GET", "/healthcheck", "");
    assert_eq!(status, 200);

    // Closed by the clients, they are released by the server (no leaked sockets or tasks).
    drop(held);
    wait_for_fds(
        pid,
        |n| n <= fds_before + 10,
        "releasing the closed sockets",
    )
    .await;
    let rss_after = rss_kib(sluice.pid());
    assert_eq!(code(&mut client, &req).await, Code::OverLimit);
    eprintln!(
        "RSS: {rss_before} KiB before, {rss_held} KiB holding {idle} idle + {stalled} stalled gRPC \
         and {http_idle} idle HTTP connections, {rss_after} KiB after they closed (the allocator keeps \
         the pages)"
    );
    assert!(sluice.terminate().success());
}

/// `sluice_connections_*` series of one listener: (open, rejected at `MAX_CONNECTIONS`).
fn connection_metrics(sluice: &Sluice, listener: &str) -> (u64, u64) {
    (
        sluice.metric(&format!(
            "sluice_connections_open{{listener=\"{listener}\"}}"
        )) as u64,
        labelled(
            sluice,
            "sluice_connections_rejected_total",
            listener,
            "max_connections",
        ),
    )
}

/// One `{listener, reason}` series of `name`.
fn labelled(sluice: &Sluice, name: &str, listener: &str, reason: &str) -> u64 {
    sluice.metric(&format!(
        "{name}{{listener=\"{listener}\",reason=\"{reason}\"}}"
    )) as u64
}

/// Whether the server closes `stream` within 2 s without it sending anything.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        // The server spoke first (its HTTP/2 SETTINGS): admitted.
        Ok(Ok(_)) => false,
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_max_connections_are_closed_at_once_and_counted() {
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[("MAX_CONNECTIONS", "20"), ("MAX_CONNECTIONS_PER_PEER", "0")],
    );
    let mut held = open(sluice.grpc, 20, 0).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while connection_metrics(&sluice, "grpc").0 < 20 {
        assert!(std::time::Instant::now() < deadline, "not all 20 admitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The 21st gets its connection closed, and a gRPC client on it an error, not a hang.
    let mut extra = TcpStream::connect(sluice.grpc).await.unwrap();
    assert!(
        closed_by_server(&mut extra).await,
        "the 21st connection was admitted"
    );
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        RateLimitServiceClient::connect(format!("http://{}", sluice.grpc)),
    )
    .await
    .expect("a client over the cap is answered at once");
    let refused = match refused {
        Err(_) => true,
        Ok(mut client) => client
            .should_rate_limit(request("conn", vec![descriptor(&[("user", "x")])]))
            .await
            .is_err(),
    };
    assert!(refused, "a client over the cap was served");
    let (open_now, rejected) = connection_metrics(&sluice, "grpc");
    assert_eq!(open_now, 20);
    assert!(rejected >= 2, "{rejected} rejections counted");
    // The HTTP listener has a cap of its own and is still answering (that is how we read the
    // metrics above).

    // Room comes back when connections close.
    held.truncate(10);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while connection_metrics(&sluice, "grpc").0 > 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "closed connections not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut client = sluice.client().await;
    let req = request("conn", vec![descriptor(&[("user", "a")])]);
    assert_eq!(code(&mut client, &req).await, Code::Ok);
    drop(held);
}

// --- Issue #27 item 4: slots are for clients that speak. -----------------------------------

/// The flooding peer's address; the victim connects from 127.0.0.1. Both are loopback, so
/// the test needs no network, but the server sees two peers.
const FLOODER: [u8; 4] = [127, 0, 0, 2];
const VICTIM: [u8; 4] = [127, 0, 0, 1];

/// An HTTP/1 request whose headers never end.
const UNFINISHED_REQUEST: &[u8] = b"GET /healthcheck HTTP/1.1\r\nHost: test\r\nX-Slow: ";
/// The first 10 bytes of the 24-byte HTTP/2 preface.
const HALF_PREFACE: &[u8] = b"PRI * HTTP";

/// A TCP connection to `addr` from the local address `source`.
async fn connect_from(source: [u8; 4], addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((std::net::Ipv4Addr::from(source), 0).into())?;
    socket.connect(addr).await
}

/// `count` connections from `source` to `addr`, each having sent `bytes` and nothing more.
async fn flood(
    source: [u8; 4],
    addr: std::net::SocketAddr,
    count: usize,
    bytes: &[u8],
) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for batch in (0..count).collect::<Vec<_>>().chunks(50) {
        let connects = batch.iter().map(|_| async {
            let mut stream = connect_from(source, addr).await.unwrap();
            // A connection the server already closed may refuse the bytes: that is fine.
            let _ = stream.write_all(bytes).await;
            stream
        });
        held.extend(futures::future::join_all(connects).await);
    }
    held
}

/// Whether the server has closed `stream` (EOF or reset), waiting at most `wait`. Anything
/// the server sent before closing (an error page, a GOAWAY) is read past.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// How many of `held` the server closes within `wait` (all waited for together).
async fn count_closed(held: &mut [TcpStream], wait: Duration) -> usize {
    let checks = held.iter_mut().map(|s| closed_within(s, wait));
    futures::future::join_all(checks)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count()
}

/// `GET /healthcheck` from `source`: the status, or `None` when the connection is refused,
/// closed or not answered within 5 s.
async fn healthcheck_from(source: [u8; 4], addr: std::net::SocketAddr) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let attempt = async {
        let mut stream = connect_from(source, addr).await.ok()?;
        stream
            .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        std::str::from_utf8(raw.get(9..12)?).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
}

/// One `ShouldRateLimit` from a new gRPC client on a new connection from `source`: whether it
/// was answered (within 5 s).
async fn grpc_served_from(source: [u8; 4], addr: std::net::SocketAddr) -> bool {
    let attempt = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .local_address(Some(std::net::Ipv4Addr::from(source).into()))
            .connect()
            .await
            .ok()?;
        let mut client = RateLimitServiceClient::new(channel);
        let req = request("conn", vec![descriptor(&[("user", "victim")])]);
        client.should_rate_limit(req).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}

/// The attack of issue #27 (item 4): one client fills every slot of the HTTP and gRPC
/// listeners with connections that never finish their request headers or their HTTP/2
/// preface. The handshake and header timeouts (1 s here) must give every slot back, after
/// which `/healthcheck` and a new gRPC client are answered. Without them the slots were held
/// for as long as the client kept the sockets open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_finish_their_headers_or_preface_are_closed() {
    let dir = config_dir(CONFIG);
    const SLOTS: usize = 150;
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("MAX_CONNECTIONS", "150"),
            // Only the timeouts are at work here: the flood comes from the victim's address.
            ("MAX_CONNECTIONS_PER_PEER", "0"),
            ("GRPC_HANDSHAKE_TIMEOUT", "1s"),
            ("HTTP_READ_HEADER_TIMEOUT", "1s"),
            // The native API's own port and the debug listener are held to the same timeouts.
            ("LIMITER_GRPC_PORT", "0"),
        ],
    );
    let started = std::time::Instant::now();
    let mut grpc_flood = flood(VICTIM, sluice.grpc, SLOTS, HALF_PREFACE).await;
    let mut http_flood = flood(VICTIM, sluice.http, SLOTS, UNFINISHED_REQUEST).await;
    const OTHERS: usize = 20;
    let api_port = sluice.limiter_api.expect("the native API's own port");
    let mut api_flood = flood(VICTIM, api_port, OTHERS, HALF_PREFACE).await;
    let mut debug_flood = flood(VICTIM, sluice.debug, OTHERS, UNFINISHED_REQUEST).await;

    // 30 s: thirty times the timeouts, and far more than a busy machine needs.
    let patience = Duration::from_secs(30);
    let (grpc_closed, http_closed, api_closed, debug_closed) = tokio::join!(
        count_closed(&mut grpc_flood, patience),
        count_closed(&mut http_flood, patience),
        count_closed(&mut api_flood, patience),
        count_closed(&mut debug_flood, patience),
    );
    eprintln!(
        "after {:?}: {grpc_closed} of {SLOTS} stalled gRPC and {http_closed} of {SLOTS} stalled \
         HTTP connections closed by the server; {api_closed} and {debug_closed} of {OTHERS} on \
         the native API's port and the debug listener",
        started.elapsed()
    );
    assert_eq!(
        (grpc_closed, http_closed, api_closed, debug_closed),
        (SLOTS, SLOTS, OTHERS, OTHERS),
        "stalled connections still hold their slots"
    );

    // The slots are back: probes and a new Envoy get in.
    assert_eq!(healthcheck_from(VICTIM, sluice.http).await, Some(200));
    assert!(grpc_served_from(VICTIM, sluice.grpc).await);
    let handshakes = labelled(
        &sluice,
        "sluice_connections_closed_total",
        "grpc",
        "handshake_timeout",
    );
    let headers = labelled(
        &sluice,
        "sluice_connections_closed_total",
        "http",
        "header_timeout",
    );
    assert_eq!((handshakes, headers), (SLOTS as u64, SLOTS as u64));
    drop((grpc_flood, http_flood, api_flood, debug_flood));
}

/// A `/json` request whose headers arrive but whose body never finishes (issue #27's slow
/// client, one step later than the header timeout catches) is answered 408 once the header
/// timeout has passed again, and its connection is closed, so the slot comes back; a body over
/// the limit is answered 413, and an honest request is still decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_that_never_arrives_is_answered_408_and_its_connection_closed() {
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[("HTTP_READ_HEADER_TIMEOUT", "1s")]);
    let mut slow = TcpStream::connect(sluice.http).await.unwrap();
    slow.write_all(
        b"POST /json HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"domain\":",
    )
    .await
    .unwrap();
    // 30 s: thirty times the timeout.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncReadExt;
        slow.read_to_end(&mut answer).await
    })
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        read.is_ok_and(|r| r.is_ok()),
        "the connection of a body that never finishes was not closed"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    let huge = format!("{{\"domain\":\"{}\"}}", "x".repeat(3 * 1024 * 1024));
    let (status, _) = http_request(sluice.http, "POST", "/json", &huge);
    assert_eq!(status, 413);
    let honest = r#"{"domain":"conn","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;
    assert_eq!(http_request(sluice.http, "POST", "/json", honest).0, 200);
}

/// One peer opening every slot of a listener (from 127.0.0.2) must leave room for another peer
/// (127.0.0.1): the health probe and a new gRPC client. The timeouts are off here, so only the
/// per-peer cap (by default half of `MAX_CONNECTIONS`) is at work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_take_every_slot() {
    let dir = config_dir(CONFIG);
    const SLOTS: usize = 200;
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("MAX_CONNECTIONS", "200"),
            ("GRPC_HANDSHAKE_TIMEOUT", "0"),
            ("HTTP_READ_HEADER_TIMEOUT", "0"),
        ],
    );
    let mut grpc_flood = flood(FLOODER, sluice.grpc, SLOTS, b"").await;
    let mut http_flood = flood(FLOODER, sluice.http, SLOTS, UNFINISHED_REQUEST).await;
    // The server closes those over the peer's share at once (milliseconds on a quiet
    // machine); the others it keeps, so this waits the whole 10 s for them.
    let wait = Duration::from_secs(10);
    let (grpc_refused, http_refused) = tokio::join!(
        count_closed(&mut grpc_flood, wait),
        count_closed(&mut http_flood, wait),
    );
    eprintln!(
        "flooding peer: {grpc_refused} of {SLOTS} gRPC and {http_refused} of {SLOTS} HTTP \
         connections refused"
    );

    let health = healthcheck_from(VICTIM, sluice.http).await;
    let served = grpc_served_from(VICTIM, sluice.grpc).await;
    eprintln!("the other peer: /healthcheck {health:?}, gRPC served: {served}");
    assert_eq!(health, Some(200), "the health probe was kept out");
    assert!(served, "a new gRPC client was kept out");
    assert_eq!((grpc_refused, http_refused), (SLOTS / 2, SLOTS / 2));
    for listener in ["grpc", "http"] {
        let per_peer = labelled(
            &sluice,
            "sluice_connections_rejected_total",
            listener,
            "max_connections_per_peer",
        );
        assert_eq!(per_peer, (SLOTS / 2) as u64, "{listener}");
    }
    drop((grpc_flood, http_flood));
}

/// The type of the next frame on a raw HTTP/2 connection; `None` when the server closed the
/// connection. SETTINGS and PING are acknowledged as a live client would (a graceful GOAWAY
/// waits for a PING's answer).
async fn next_frame_kind(stream: &mut TcpStream) -> Option<u8> {
    next_frame(stream).await.map(|(kind, _)| kind)
}

/// The next frame's type and payload, acknowledging SETTINGS and PING as [`next_frame_kind`].
async fn next_frame(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.ok()?;
    let (kind, flags) = (head[3], head[4]);
    if (kind == 0x4 || kind == 0x6) && flags & 0x1 == 0 {
        // A SETTINGS acknowledgement is empty; a PING's carries the PING's 8 bytes.
        let body = if kind == 0x6 {
            payload.clone()
        } else {
            Vec::new()
        };
        // The server may have closed already; the next read says so.
        let _ = stream.write_all(&encode_frame(kind, 0x1, 0, &body)).await;
    }
    Some((kind, payload))
}

/// A raw HTTP/2 client (preface and empty SETTINGS sent) on the gRPC port.
async fn h2_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    stream.write_all(&hello).await.unwrap();
    stream
}

/// `GRPC_MAX_CONNECTION_IDLE`: a gRPC connection with no call in flight for that long gets a
/// GOAWAY and is closed; a connection with a call in flight is not; a gRPC client whose
/// connection went away that way is served again on its next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_grpc_connection_gets_a_goaway_and_its_client_carries_on() {
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[("GRPC_MAX_CONNECTION_IDLE", "1s")]);
    let started = std::time::Instant::now();
    let mut idle = h2_connection(sluice.grpc).await;
    let mut busy = h2_connection(sluice.grpc).await;
    // A call whose request never ends (HEADERS with END_HEADERS, no END_STREAM): in flight for
    // as long as the connection lives.
    busy.write_all(&encode_frame(
        HEADERS,
        END_HEADERS,
        1,
        &should_rate_limit_headers("localhost"),
    ))
    .await
    .unwrap();

    // 30 s: thirty times the idle timeout.
    let goaway = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match next_frame_kind(&mut idle).await {
                Some(GOAWAY) => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await;
    let after = started.elapsed();
    assert_eq!(
        goaway,
        Ok(true),
        "no GOAWAY on an idle connection ({after:?})"
    );
    assert!(after >= Duration::from_secs(1), "GOAWAY after {after:?}");
    // Closed once the GOAWAY's PING is answered (the graceful shutdown's second step).
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        while next_frame_kind(&mut idle).await.is_some() {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "the idle connection is still open after its GOAWAY"
    );

    // The connection with a call in flight is still open after four idle periods.
    let cut = tokio::time::timeout(Duration::from_secs(4), async {
        loop {
            match next_frame_kind(&mut busy).await {
                Some(GOAWAY) | None => return,
                Some(_) => continue,
            }
        }
    })
    .await;
    assert!(
        cut.is_err(),
        "a connection with a call in flight was closed"
    );
    drop(busy);

    // A gRPC client that sat idle past the timeout is served on its next call.
    let mut client = sluice.client().await;
    let req = request("conn", vec![descriptor(&[("user", "idle")])]);
    assert_eq!(code(&mut client, &req).await, Code::Ok);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(code(&mut client, &req).await, Code::Ok);
    assert!(labelled(&sluice, "sluice_connections_closed_total", "grpc", "idle") >= 2);
}

/// Rapid reset (CVE-2023-44487): a client that opens calls and cancels each at once, thousands
/// in one write, makes a server set up work for calls that never run. Sluice's HTTP/2 (h2,
/// through hyper) counts the calls cancelled before the server took them up and, past 20 at
/// once, answers GOAWAY with ENHANCE_YOUR_CALM and closes the connection. Checked: each of
/// several attacking connections, one after another, is sent away so long before the end of its
/// burst, while a gRPC client on a connection of its own gets every answer right, its counter
/// counting its own calls and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancelling_its_calls_at_once_is_sent_away_and_others_are_served() {
    const CALLS_PER_BURST: u32 = 5_000;
    const ATTACKS: usize = 20;
    const CANCEL: u32 = 0x8;
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[]);
    // The honest client's calls take about a second; 30 s of margin keeps them in one hour.
    avoid_window_edge(3600, 30).await;
    let headers = should_rate_limit_headers("localhost");
    let mut burst = Vec::new();
    for i in 0..CALLS_PER_BURST {
        let stream = 2 * i + 1;
        burst.extend(encode_frame(HEADERS, END_HEADERS, stream, &headers));
        burst.extend(encode_frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
    }
    let addr = sluice.grpc;
    let attacks = tokio::spawn(async move {
        let mut goaways = Vec::new();
        for _ in 0..ATTACKS {
            let mut conn = h2_connection(addr).await;
            // The server may close before the whole burst is written.
            let _ = conn.write_all(&burst).await;
            goaways.push(until_goaway(&mut conn).await.goaway);
        }
        goaways
    });

    // The honest client: 50 an hour, so its first 50 calls are admitted and the rest refused.
    let mut client = sluice.client().await;
    let req = request("conn", vec![descriptor(&[("user", "honest")])]);
    let mut calls = 0;
    while !attacks.is_finished() || calls < 60 {
        let expected = if calls < 50 {
            Code::Ok
        } else {
            Code::OverLimit
        };
        assert_eq!(
            code(&mut client, &req).await,
            expected,
            "honest call {calls}"
        );
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let goaways = attacks.await.unwrap();
    println!("{calls} honest calls answered during {ATTACKS} bursts");
    for (i, goaway) in goaways.into_iter().enumerate() {
        let (last_stream, reason) = goaway.unwrap_or_else(|| panic!("burst {i}: no GOAWAY"));
        println!("burst {i}: GOAWAY reason {reason:#x}, last stream {last_stream}");
        assert_eq!(reason, ENHANCE_YOUR_CALM, "burst {i}");
        // Sent away within the first tenth of the burst.
        assert!(
            last_stream < CALLS_PER_BURST / 5,
            "burst {i}: served up to stream {last_stream} of {}",
            2 * CALLS_PER_BURST - 1
        );
    }
}

/// MadeYouReset (CVE-2025-8671): a client that makes the server reset its calls, here by a
/// malformed request on each (a `connection` header, which HTTP/2 forbids: a stream error), is
/// not counted by the rapid-reset limit, since the resets are the server's. Sluice's HTTP/2
/// counts the calls it reset for a client's error and, past 1 024 of them, answers GOAWAY with
/// ENHANCE_YOUR_CALM. Checked: a burst of 5 000 such calls is sent away before its end, while a
/// gRPC client on its own connection is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_making_the_server_reset_its_calls_is_sent_away() {
    const CALLS: u32 = 5_000;
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[]);
    let mut headers = should_rate_limit_headers("localhost");
    headers.extend(header_block(&[("connection", "close")]));
    let mut burst = Vec::new();
    for i in 0..CALLS {
        // A whole (malformed) request.
        burst.extend(encode_frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            2 * i + 1,
            &headers,
        ));
    }
    let sent = abuse_beside_a_client(&sluice, burst, "beside-the-resets").await;
    let resets = sent
        .before
        .iter()
        .filter(|&&kind| kind == RST_STREAM)
        .count();
    println!("{resets} RST_STREAM, then GOAWAY {:?}", sent.goaway);
    let (last_stream, reason) = sent.goaway.expect("no GOAWAY in 30 s");
    assert_eq!(reason, ENHANCE_YOUR_CALM, "after {resets} resets");
    assert!(
        last_stream < 2 * CALLS - 1,
        "every call of the burst was taken up (last stream {last_stream})"
    );
}

/// CONTINUATION flood (the 2024 HTTP/2 "CONTINUATION" advisories): a call's headers that never
/// end, one CONTINUATION frame after another, each buffered by a server that waits for the
/// end of the header block. Sluice's HTTP/2 (h2) takes at most 5 CONTINUATION frames (what a
/// full 16 KiB header list needs plus a quarter, at least 5) and then answers GOAWAY with
/// ENHANCE_YOUR_CALM. Checked: a client sending 16 MB of CONTINUATION frames (1 000 of 16 000
/// bytes) is sent away so, having had no answer to its call, and a gRPC client on its own
/// connection is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_block_that_never_ends_is_sent_away() {
    const FRAMES: usize = 1_000;
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[]);
    // One header field per frame, `x-junk: <15 990 bytes>`.
    let field = header_block(&[("x-junk", &"a".repeat(15_990))]);
    // HEADERS without END_HEADERS, then CONTINUATION frames without it either.
    let mut flood = encode_frame(HEADERS, 0, 1, &should_rate_limit_headers("localhost"));
    for _ in 0..FRAMES {
        flood.extend(encode_frame(CONTINUATION, 0, 1, &field));
    }
    let sent = abuse_beside_a_client(&sluice, flood, "beside-the-flood").await;
    println!("GOAWAY {:?} after frames {:?}", sent.goaway, sent.before);
    let (_, reason) = sent.goaway.expect("no GOAWAY in 30 s");
    assert_eq!(reason, ENHANCE_YOUR_CALM);
    // No HEADERS (an answer to the call) came before it.
    assert!(
        !sent.before.contains(&HEADERS),
        "frames before the GOAWAY: {:?}",
        sent.before
    );
}

/// What the server sent an abusive client: the types of the frames before its GOAWAY, and the
/// GOAWAY's last stream id and error code (`None` when the connection closed without one or
/// was still open after 30 s).
struct SentAway {
    before: Vec<u8>,
    goaway: Option<(u32, u32)>,
}

/// Writes `abuse` on a new raw HTTP/2 connection to the gRPC port while a gRPC client on a
/// connection of its own asks about `user` (admitted, under `CONFIG`'s limit), then reads what
/// the server sent the abusive connection, up to its GOAWAY; the other client is asked again
/// after.
async fn abuse_beside_a_client(sluice: &Sluice, abuse: Vec<u8>, user: &str) -> SentAway {
    let mut conn = h2_connection(sluice.grpc).await;
    let writing = tokio::spawn(async move {
        // The server may close before the whole of it is written: the rest fails to send.
        let _ = conn.write_all(&abuse).await;
        conn
    });
    let mut client = sluice.client().await;
    let req = request("conn", vec![descriptor(&[("user", user)])]);
    assert_eq!(code(&mut client, &req).await, Code::Ok, "the other client");
    let mut conn = writing.await.unwrap();
    let sent = until_goaway(&mut conn).await;
    assert_eq!(
        code(&mut client, &req).await,
        Code::Ok,
        "the other client, after"
    );
    sent
}

/// Reads what the server sends on `conn` up to its GOAWAY, for at most 30 s (it comes within
/// milliseconds on a quiet machine).
async fn until_goaway(conn: &mut TcpStream) -> SentAway {
    let mut before = Vec::new();
    let goaway = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some((kind, payload)) = next_frame(conn).await {
            if kind == GOAWAY {
                return Some(payload);
            }
            before.push(kind);
        }
        None
    })
    .await
    .ok()
    .flatten();
    let word = |p: &[u8], at: usize| u32::from_be_bytes(p[at..at + 4].try_into().unwrap());
    SentAway {
        before,
        goaway: goaway.map(|p| (word(&p, 0) & 0x7fff_ffff, word(&p, 4))),
    }
}

/// `GRPC_HANDSHAKE_TIMEOUT` on the TLS listener: one budget from the accept for the TLS
/// handshake and the HTTP/2 preface after it. Connections that never start the handshake, and
/// connections that finish it but never send the preface, are closed. Before, the second kind
/// was held for as long as the client liked (only the handshake had a deadline, 10 s fixed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_stalled_in_the_handshake_or_before_the_preface_are_closed() {
    let pki = Pki::new("ca");
    pki.issue("server", &["localhost"]);
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_HANDSHAKE_TIMEOUT", "1s"),
        ],
    );
    const EACH: usize = 20;
    let mut silent = flood(VICTIM, sluice.grpc, EACH, b"").await;

    let connector = tokio_rustls::TlsConnector::from(pki.h2_client_config("ca.pem"));
    let mut after_tls = Vec::new();
    for _ in 0..EACH {
        let tcp = TcpStream::connect(sluice.grpc).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        after_tls.push(connector.connect(name, tcp).await.expect("TLS handshake"));
    }

    let patience = Duration::from_secs(30);
    let silent_closed = count_closed(&mut silent, patience).await;
    let checks = after_tls.iter_mut().map(|s| closed_within(s, patience));
    let tls_closed = futures::future::join_all(checks)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count();
    eprintln!(
        "closed by the server: {silent_closed} of {EACH} without a handshake, {tls_closed} of \
         {EACH} without a preface after it"
    );
    assert_eq!((silent_closed, tls_closed), (EACH, EACH));
    let counted = labelled(
        &sluice,
        "sluice_connections_closed_total",
        "grpc",
        "handshake_timeout",
    );
    assert_eq!(counted, 2 * EACH as u64);
}
