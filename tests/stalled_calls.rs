//! Calls whose request never finishes must not hold Sluice's memory (issue #40, item 1).
//!
//! A gRPC call declares its message's length in the first 5 bytes of its body; tonic reserves
//! that much at once and keeps what arrives until the message is whole. Clients here declare
//! messages of almost 1 MiB and send all but their last byte, on 8 connections with 200 calls
//! each, honouring HTTP/2 flow control as any client library does (the `h2` crate). Before the
//! request-byte budgets, the server's RSS grew by 1.8 GB and none of the 1 600 calls ended.
//! Now the server must stay within 256 MiB of its start, end every such call within 20 s, and
//! answer a bystander calling every 250 ms within 1 s throughout, exactly.
//!
//! A binary of its own, not a module of `tests/it`: it asserts that a bystander is answered
//! within 1 s throughout while 1 600 stalled calls load the server, a bound on time that tests
//! running beside it in the same process would eat into (and its load would slow theirs).

use sluice_test_kit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes sent by the stalling clients, for the figures printed.
static SENT: AtomicU64 = AtomicU64::new(0);
/// What the stalling clients send as their messages.
static FILLER: [u8; 1 << 20] = [7; 1 << 20];
use std::time::{Duration, Instant};

use bytes::Bytes;
use kit::*;
use sluice::proto::Code;
use tokio::net::TcpStream;

const CONFIG: &str = "
domain: stall
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

const CONNECTIONS: usize = 8;
const CALLS_PER_CONNECTION: usize = 200;
/// Just under the 1 MiB message limit, so the service would buffer it whole.
const DECLARED: usize = (1 << 20) - 64;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// How one stalled call ended, seen from its client.
#[derive(Debug)]
enum Ended {
    /// The server answered (a gRPC status in the headers or trailers) after this long.
    Answered(Duration, String),
    /// The server reset the stream (or the connection) after this long.
    Reset(Duration, String),
    /// Nothing within the wait.
    Not,
}

/// One call on `client` that sends the gRPC header of a `DECLARED`-byte message and then all
/// of the message but its last byte, as the flow-control window allows, and waits for the
/// server to end it.
async fn stalled_call(mut client: h2::client::SendRequest<Bytes>, wait: Duration) -> Ended {
    let request = http::Request::builder()
        .method("POST")
        .uri("http://sluice/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let started = Instant::now();
    let (response, mut body) = match client.send_request(request, false) {
        Ok(sent) => sent,
        Err(e) => return Ended::Reset(started.elapsed(), e.to_string()),
    };
    let mut head = vec![0u8];
    head.extend(u32::try_from(DECLARED).unwrap().to_be_bytes());
    let mut left = 5 + DECLARED - 1;
    let sender = async move {
        let mut first = Some(Bytes::from(head));
        body.reserve_capacity(left);
        while left > 0 {
            let Some(Ok(room)) = std::future::poll_fn(|cx| body.poll_capacity(cx)).await else {
                // The stream was reset or closed: nothing more to send.
                return std::future::pending::<()>().await;
            };
            let chunk = match first.take() {
                Some(head) => head,
                None => Bytes::from_static(&FILLER[..room.min(left)]),
            };
            left -= chunk.len();
            SENT.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if body.send_data(chunk, false).is_err() {
                return std::future::pending::<()>().await;
            }
        }
        // All but the last byte is out: hold the stream open for ever.
        let _keep = body;
        std::future::pending::<()>().await
    };
    let answer = async {
        match response.await {
            Ok(response) => {
                let status = response
                    .headers()
                    .get("grpc-status")
                    .map(|v| v.to_str().unwrap_or("?").to_string());
                match status {
                    Some(status) => Ended::Answered(started.elapsed(), status),
                    None => {
                        // The status comes in the trailers.
                        let mut body = response.into_body();
                        let trailers = body.trailers().await;
                        let status = match trailers {
                            Ok(Some(t)) => t
                                .get("grpc-status")
                                .map_or("none".into(), |v| v.to_str().unwrap_or("?").to_string()),
                            Ok(None) => "no trailers".into(),
                            Err(e) => e.to_string(),
                        };
                        Ended::Answered(started.elapsed(), status)
                    }
                }
            }
            Err(e) => Ended::Reset(started.elapsed(), e.to_string()),
        }
    };
    tokio::select! {
        ended = answer => ended,
        () = sender => unreachable!(),
        () = tokio::time::sleep(wait) => Ended::Not,
    }
}

/// A connection whose calls all stall; returns how each ended.
async fn stalling_connection(
    addr: std::net::SocketAddr,
    calls: usize,
    wait: Duration,
) -> Vec<Ended> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut tasks = Vec::new();
    for _ in 0..calls {
        let client = client.clone().ready().await;
        let client = match client {
            Ok(client) => client,
            Err(_) => break,
        };
        tasks.push(tokio::spawn(stalled_call(client, wait)));
    }
    let mut ended = Vec::new();
    for task in tasks {
        ended.push(task.await.unwrap());
    }
    driver.abort();
    ended
}

/// What a flood of stalled calls did to a server, seen from outside.
struct Flood {
    /// How each stalled call ended.
    ended: Vec<Ended>,
    /// Resident memory before the flood, and its peak during it.
    before: u64,
    peak: u64,
    /// A bystander's calls during the flood (each admitted, checked as it goes) and the slowest.
    answered: u32,
    slowest: Duration,
}

impl Flood {
    /// Floods `sluice` with `CONNECTIONS` x `CALLS_PER_CONNECTION` stalled calls, each waited for
    /// up to `wait`, while a bystander on a connection of its own calls every 250 ms.
    async fn run(sluice: &Sluice, wait: Duration) -> Flood {
        let pid = sluice.pid();
        let mut bystander = sluice.client().await;
        // Warm the service up, then take its resting size.
        for _ in 0..20 {
            let warm = request("stall", vec![descriptor(&[("user", "warm")])]);
            assert_eq!(
                ask(&mut bystander, warm).await.overall_code,
                Code::Ok as i32
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = rss_bytes(pid);
        let peak = Arc::new(AtomicU64::new(before));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (peak, stop) = (peak.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        // The bystander's limit is 1 000, so every call is admitted and counted.
        let calls = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                let mut answered = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let call = ask(
                        &mut bystander,
                        request("stall", vec![descriptor(&[("user", "bystander")])]),
                    );
                    let answer = tokio::time::timeout(Duration::from_secs(5), call)
                        .await
                        .expect("the bystander is answered");
                    assert_eq!(answer.overall_code, Code::Ok as i32);
                    slowest = slowest.max(started.elapsed());
                    answered += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                (answered, slowest)
            })
        };
        let flood: Vec<_> = (0..CONNECTIONS)
            .map(|_| tokio::spawn(stalling_connection(sluice.grpc, CALLS_PER_CONNECTION, wait)))
            .collect();
        let mut ended = Vec::new();
        for connection in flood {
            ended.extend(connection.await.unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        watcher.await.unwrap();
        let (answered, slowest) = calls.await.unwrap();
        Flood {
            ended,
            before,
            peak: peak.load(Ordering::Relaxed),
            answered,
            slowest,
        }
    }

    fn grown(&self) -> u64 {
        self.peak.saturating_sub(self.before)
    }

    fn not_ended(&self) -> usize {
        self.ended
            .iter()
            .filter(|e| matches!(e, Ended::Not))
            .count()
    }

    /// When the last stalled call was ended, from its start.
    fn latest(&self) -> Duration {
        self.ended
            .iter()
            .filter_map(|e| match e {
                Ended::Answered(after, _) | Ended::Reset(after, _) => Some(*after),
                Ended::Not => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// Prints the figures (quoted in SECURITY.md) and checks what every flood must show: all
    /// calls made, each ended within 20 s, the bystander answered within `bystander` throughout.
    fn check(&self, what: &str, bystander: Duration) {
        let mut statuses = std::collections::BTreeMap::new();
        for e in &self.ended {
            let how = match e {
                Ended::Answered(_, status) => format!("grpc-status {status}"),
                Ended::Reset(_, why) => format!("reset: {why}"),
                Ended::Not => "not ended".into(),
            };
            *statuses.entry(how).or_insert(0) += 1;
        }
        println!(
            "{what}: {} stalled calls on {CONNECTIONS} connections, {} MiB sent: RSS {} MiB \
             before, peak +{} MiB; latest ended after {:?}, {} not ended; {statuses:?}; \
             bystander: {} calls, slowest {:?}",
            self.ended.len(),
            SENT.load(Ordering::Relaxed) >> 20,
            self.before >> 20,
            self.grown() >> 20,
            self.latest(),
            self.not_ended(),
            self.answered,
            self.slowest,
        );
        assert_eq!(self.ended.len(), CONNECTIONS * CALLS_PER_CONNECTION);
        assert_eq!(self.not_ended(), 0, "every stalled call is ended");
        assert!(
            self.latest() <= Duration::from_secs(20),
            "{:?}",
            self.latest()
        );
        assert!(self.slowest <= bystander, "bystander: {:?}", self.slowest);
        // The flood may be over within a second (shed at once): at least the first call.
        assert!(
            self.answered >= 1,
            "the bystander called: {}",
            self.answered
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_never_finish_their_request_hold_bounded_memory_and_end() {
    let dir = config_dir(CONFIG);
    // The defaults: HTTP_READ_HEADER_TIMEOUT 10 s, 4 MiB per connection, 32 per peer, 64 in all.
    let sluice = Sluice::start(dir.path(), None, &[]);
    let flood = Flood::run(&sluice, Duration::from_secs(30)).await;
    // Quiet, the bystander's slowest call takes about 0.1 s during the flood.
    flood.check("request budgets", Duration::from_secs(1));
    assert!(
        flood.grown() <= 256 << 20,
        "RSS grew by {} MiB",
        flood.grown() >> 20
    );
    let ended = |reason: &str| {
        sluice.metric(&format!(
            "sluice_requests_ended_total{{reason=\"{reason}\"}}"
        ))
    };
    assert!(ended("bytes_per_connection") + ended("bytes_per_peer") > 0.0);
    assert!(
        ended("request_timeout") > 0.0,
        "those within the budgets end at the deadline"
    );
    assert_eq!(
        sluice.metric("sluice_request_bytes_held"),
        0.0,
        "all given back"
    );
    assert_eq!(sluice.metric("sluice_requests_waiting"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_the_memory_ceiling_waiting_calls_are_shed() {
    let dir = config_dir(CONFIG);
    // No request budgets, a deadline past the wait: only the overload manager bounds the flood.
    let ceiling = 160u64 << 20;
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("HTTP_READ_HEADER_TIMEOUT", "0"),
            ("MAX_PENDING_REQUEST_BYTES", "0"),
            ("MAX_PENDING_REQUEST_BYTES_PER_PEER", "0"),
            ("MAX_PENDING_REQUEST_BYTES_PER_CONNECTION", "0"),
            ("OVERLOAD_MEMORY_LIMIT", &ceiling.to_string()),
        ],
    );
    let flood = Flood::run(&sluice, Duration::from_secs(20)).await;
    // Here the flood runs until memory reaches the line, which keeps both cores busy for a
    // moment: the bystander's slowest call took up to 0.9 s on a quiet machine.
    flood.check("overload manager", Duration::from_secs(10));
    let shed = "sluice_overload_actions_total{action=\"shed_waiting_requests\"}";
    assert!(sluice.metric(shed) >= 1.0, "the shedding went on");
    assert!(sluice.metric("sluice_requests_ended_total{reason=\"overload\"}") > 0.0);
    // Sampled every 100 ms: the flood may go past the line between two samples, by what it
    // sends in that time, and the allocator may keep some pages.
    assert!(
        flood.peak <= ceiling + (64 << 20),
        "peak {} MiB",
        flood.peak >> 20
    );
    assert_eq!(sluice.metric("sluice_memory_limit_bytes"), ceiling as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_memory_ceiling_grpc_connections_are_refused_and_probes_answered() {
    let dir = config_dir(CONFIG);
    // A ceiling below any process's size: both actions are on from the first sample.
    let sluice = Sluice::start(dir.path(), None, &[("OVERLOAD_MEMORY_LIMIT", "1Mi")]);
    let stop = "sluice_overload_action_active{action=\"stop_accepting_connections\"}";
    wait_until("the overload manager stops accepting", || {
        sluice.metric(stop) == 1.0
    });
    let rejected = "sluice_connections_rejected_total{listener=\"grpc\",reason=\"overload\"}";
    let tcp = std::net::TcpStream::connect(sluice.grpc).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Closed at accept: the client reads the end (or a reset), never a SETTINGS frame.
    let mut buf = [0u8; 1];
    let read = std::io::Read::read(&mut &tcp, &mut buf);
    assert!(matches!(read, Ok(0) | Err(_)), "closed at accept: {read:?}");
    wait_until("the refusal is counted", || sluice.metric(rejected) >= 1.0);
    // The probes' listener keeps answering.
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_call_may_wait_between_its_messages() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[("HTTP_READ_HEADER_TIMEOUT", "1s")]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", sluice.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let ask = || ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    tx.send(ask()).await.unwrap();
    let mut answers = client
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(answers.message().await.unwrap().is_some());
    // Three times the deadline between two messages: a stream is not a stalled request.
    tokio::time::sleep(Duration::from_secs(3)).await;
    tx.send(ask()).await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), answers.message()).await;
    assert!(second.expect("answered").unwrap().is_some());
    drop(tx);
    assert_eq!(
        sluice.metric("sluice_requests_ended_total{reason=\"request_timeout\"}"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_bodies_that_never_finish_are_held_within_the_budgets() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[("HTTP_READ_HEADER_TIMEOUT", "3s")]);
    // 40 bodies of 2 MB each, sent but for their last 450 KB: 60 MiB from one peer, whose budget
    // is 32 MiB.
    let mut held = Vec::new();
    for _ in 0..40 {
        let mut tcp = TcpStream::connect(sluice.http).await.unwrap();
        let head = "POST /json HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n\
                    content-length: 2000000\r\n\r\n";
        tcp.write_all(head.as_bytes()).await.unwrap();
        tcp.write_all(&FILLER).await.unwrap();
        tcp.write_all(&FILLER[..500_000]).await.unwrap();
        held.push(tcp);
    }
    let mut statuses = std::collections::BTreeMap::new();
    for mut tcp in held {
        let mut answer = vec![0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut answer)).await;
        let status = match read {
            Ok(Ok(n)) if n >= 12 => String::from_utf8_lossy(&answer[9..12]).to_string(),
            other => format!("{other:?}"),
        };
        *statuses.entry(status).or_insert(0) += 1;
    }
    println!("json bodies: {statuses:?}");
    // Those past the peer's budget are sent away at once; the rest at the body deadline.
    assert!(statuses.get("503").is_some_and(|n| *n >= 8), "{statuses:?}");
    assert_eq!(
        statuses.get("503").unwrap_or(&0) + statuses.get("408").unwrap_or(&0),
        40,
        "{statuses:?}"
    );
    let per_peer = "sluice_requests_ended_total{reason=\"bytes_per_peer\"}";
    assert!(sluice.metric(per_peer) >= 8.0);
    assert_eq!(sluice.metric("sluice_request_bytes_held"), 0.0);
}
