//! Many idle and stalled connections must not stop the service from answering others.
//!
//! Opens 10 000 TCP connections to the gRPC port that never speak (or stop half-way through the
//! HTTP/2 preface) and 1 000 idle ones to the HTTP port, then checks a normal gRPC client and an
//! HTTP client are still answered correctly, and prints the server's RSS with and without them
//! (quoted in SECURITY.md). Then checks `MAX_CONNECTIONS`: connections beyond it are closed at
//! once and counted, and room comes back when others close.

mod common;

use std::time::Duration;

use common::*;
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
    let sluice = Sluice::start(dir.path(), None, &[("MAX_CONNECTIONS", "20000")]);
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

/// `sluice_connections_*` series of one listener: (open, rejected).
fn connection_metrics(sluice: &Sluice, listener: &str) -> (u64, u64) {
    let value = |name: &str| sluice.metric(&format!("{name}{{listener=\"{listener}\"}}")) as u64;
    (
        value("sluice_connections_open"),
        value("sluice_connections_rejected_total"),
    )
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
    let sluice = Sluice::start(dir.path(), None, &[("MAX_CONNECTIONS", "20")]);
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
