//! `SluiceLeaseLayer` in front of a real axum service whose response streams, asking a real
//! Sluice's `CONCURRENCY` limiter: a request's lease is held until its response body ends (not
//! when its head is sent), others get 429 meanwhile, and a client that drops the connection
//! mid-stream gives the lease back too.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::services::http_get;
use axum::body::Body;
use axum::extract::State;
use axum::{Router, routing::get};
use common::Sluice;
use sluice_client::limiter::{Algorithm, SetMode};
use sluice_client::{Client, FailurePolicy, LimiterConfig, SluiceLeaseLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_stream::wrappers::ReceiverStream;

/// `GET /` answers `first` at once, then `last` when the test adds a permit to `gate`.
async fn serve_streaming(layer: SluiceLeaseLayer, gate: Arc<Semaphore>) -> SocketAddr {
    async fn slow(State(gate): State<Arc<Semaphore>>) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<&'static str, Infallible>>(2);
        tokio::spawn(async move {
            let _ = tx.send(Ok("first\n")).await;
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
            let _ = tx.send(Ok("last\n")).await;
        });
        Body::from_stream(ReceiverStream::new(rx))
    }
    let app = Router::new()
        .route("/", get(slow))
        .with_state(gate)
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sends `GET /` and reads until the body's first chunk has arrived; the response is still
/// streaming when this returns.
async fn start_streaming(addr: SocketAddr) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("first") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the first chunk: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    (stream, String::from_utf8_lossy(&seen).into_owned())
}

/// Waits (at most 20 s, far above a quiet machine's few ms) until `name` has `want` permits.
async fn wait_for_available(client: &Client, name: &str, want: u64) {
    let started = Instant::now();
    loop {
        let available = client.available_permits(name, "").await.unwrap();
        if available == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name}: {available} available, never {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_response_holds_its_lease_until_its_body_ends() {
    let sluice = Sluice::start(None, &[]);
    let client = sluice.client(FailurePolicy::Closed).await;
    let one = LimiterConfig::new(
        "streams",
        Algorithm::Concurrency,
        1,
        Duration::from_secs(600),
    );
    client.set_rate(one, SetMode::TrySet).await.unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let layer = SluiceLeaseLayer::builder(client.clone(), "streams").build();
    let addr = serve_streaming(layer, gate.clone()).await;

    let (mut streaming, head) = start_streaming(addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The head and a chunk are out, the body is not over: the lease is still held. (The pause
    // gives a lease given back too early the time to show; it is no bound on anything.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(client.available_permits("streams", "").await.unwrap(), 0);
    // Bounded: a request let through would stream until the gate opens.
    let refused = tokio::time::timeout(Duration::from_secs(20), http_get(addr, &[]))
        .await
        .expect("a second request was let through while the lease was held");
    assert_eq!(refused.status, 429);
    assert!(refused.headers.contains_key("retry-after"));

    // The body ends: the lease comes back, and the next request streams in its turn.
    gate.add_permits(1);
    let mut rest = String::new();
    streaming.read_to_string(&mut rest).await.unwrap();
    assert!(rest.contains("last"), "{rest}");
    wait_for_available(&client, "streams", 1).await;

    // A client that goes away mid-stream drops the body: its lease comes back too.
    let (gone, _) = start_streaming(addr).await;
    assert_eq!(client.available_permits("streams", "").await.unwrap(), 0);
    drop(gone);
    wait_for_available(&client, "streams", 1).await;
    // Let the abandoned body's task finish.
    gate.add_permits(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_limiter_or_sluice_the_policy_answers() {
    let mut sluice = Sluice::start(None, &[]);
    let closed = sluice.client(FailurePolicy::Closed).await;
    let gate = Arc::new(Semaphore::new(8));
    // No such limiter: a wiring mistake, refused as unavailable rather than let through.
    let layer = SluiceLeaseLayer::builder(closed.clone(), "missing").build();
    let addr = serve_streaming(layer, gate.clone()).await;
    assert_eq!(http_get(addr, &[]).await.status, 503);

    let open = sluice.client(FailurePolicy::Open).await;
    let one = LimiterConfig::new("open", Algorithm::Concurrency, 1, Duration::from_secs(600));
    open.set_rate(one, SetMode::TrySet).await.unwrap();
    let layer = SluiceLeaseLayer::builder(open.clone(), "open").build();
    let open_addr = serve_streaming(layer, gate.clone()).await;
    let layer = SluiceLeaseLayer::builder(closed, "open").build();
    let closed_addr = serve_streaming(layer, gate).await;
    sluice.kill();
    assert_eq!(http_get(open_addr, &[]).await.status, 200);
    assert_eq!(http_get(closed_addr, &[]).await.status, 503);
}
