//! Real services behind [`SluiceLayer`] on real sockets, and a plain HTTP/1.1 client for
//! them: an axum router (HTTP, the peer address recorded or not, optionally behind an
//! authentication middleware), a hyper service served by hyper itself, and a tonic server
//! running the gRPC health service (gRPC), each on a free port, served by a task of the
//! calling test's runtime.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::{Router, routing::get};
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use sluice_client::{SluiceLayer, key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::ServiceBuilder;

/// Serves `GET /` → `hello` behind `layer` on 127.0.0.1, recording each connection's peer
/// address.
pub async fn serve_http(layer: SluiceLayer) -> SocketAddr {
    serve_axum(layer, "127.0.0.1:0", true).await
}

/// Serves `GET /` → `hello` behind `layer` on `bind`, with axum's connect info (the peer's
/// address in each request) or without it, as `axum::serve(listener, app)` serves.
pub async fn serve_axum(layer: SluiceLayer, bind: &str, connect_info: bool) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    serve_router(app, bind, connect_info).await
}

/// Serves `app` on `bind` from a task of the calling test's runtime.
async fn serve_router(app: Router, bind: &str, connect_info: bool) -> SocketAddr {
    let listener = TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        if connect_info {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await.unwrap();
        } else {
            axum::serve(listener, app).await.unwrap();
        }
    });
    addr
}

/// The identity [`authenticate`] proved, which the layer can key on.
#[derive(Debug, Clone)]
pub struct User(pub String);

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The API keys [`authenticate`] knows: alice has two.
const API_KEYS: &[(&str, &str)] = &[
    ("key-alice-1", "alice"),
    ("key-alice-2", "alice"),
    ("key-bob", "bob"),
];

/// An authentication middleware: `x-api-key` must be one of [`API_KEYS`] (else 401), and the
/// request goes on with its [`User`] in its extensions.
async fn authenticate(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response, http::StatusCode> {
    let key = request.headers().get("x-api-key").map(|v| v.as_bytes());
    let user = API_KEYS
        .iter()
        .find(|(known, _)| key == Some(known.as_bytes()))
        .ok_or(http::StatusCode::UNAUTHORIZED)?
        .1;
    request.extensions_mut().insert(User(user.to_string()));
    Ok(next.run(request).await)
}

/// Serves `GET /` → `hello` on 127.0.0.1 with [`authenticate`] first and `layer` after it, as
/// the crate's docs wire them.
pub async fn serve_authenticated(layer: SluiceLayer) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        // Added first, so it runs second, on authenticated requests only.
        .layer(layer)
        .layer(axum::middleware::from_fn(authenticate));
    serve_router(app, "127.0.0.1:0", true).await
}

/// Serves `hello` to every request with hyper alone (no framework) behind `layer`: the layer
/// turned into hyper's service by `hyper_util`'s adapter, each connection's peer address put
/// where `key::peer_ip` reads it.
pub async fn serve_hyper(layer: SluiceLayer) -> SocketAddr {
    let hello = tower::service_fn(|_request: http::Request<Incoming>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hello"))))
    });
    let service = ServiceBuilder::new().layer(layer).service(hello);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let service = service.clone();
            let with_peer = ServiceBuilder::new()
                .map_request(move |mut request: http::Request<Incoming>| {
                    key::peer_addr_into_extensions(&mut request, peer);
                    request
                })
                .service(service);
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(with_peer));
            tokio::spawn(connection);
        }
    });
    addr
}

/// Serves the gRPC health service (`grpc.health.v1.Health/Check` answers SERVING) behind `layer`.
pub async fn serve_grpc(layer: SluiceLayer) -> SocketAddr {
    serve_grpc_recording(Some(layer)).await.0
}

/// The headers of every call a test server received, in arrival order.
pub type Received = Arc<Mutex<Vec<HeaderMap>>>;

/// Serves the gRPC health service behind `layer`, if any (other services' calls are
/// `UNIMPLEMENTED`), and records the headers each call arrives with, before the layer.
pub async fn serve_grpc_recording(layer: Option<SluiceLayer>) -> (SocketAddr, Received) {
    let received = Received::default();
    let record = Arc::clone(&received);
    let layers = ServiceBuilder::new()
        .map_request(move |request: http::Request<tonic::body::Body>| {
            record.lock().unwrap().push(request.headers().clone());
            request
        })
        .option_layer(layer);
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layers)
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (addr, received)
}

/// One `Health/Check` call carrying metadata `x-user: user` (when given).
pub async fn grpc_check(addr: SocketAddr, user: Option<&str>) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(user) = user {
        request
            .metadata_mut()
            .insert("x-user", user.parse().unwrap());
    }
    client.check(request).await.map(drop)
}

/// An HTTP response's status and headers (names lower-cased).
pub struct HttpResponse {
    pub status: u16,
    pub headers: HashMap<String, String>,
}

/// `GET /` over a new connection, with `headers` added.
pub async fn http_get(addr: SocketAddr, headers: &[(&str, &str)]) -> HttpResponse {
    let lines: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    http_get_with(addr, lines.as_bytes()).await
}

/// `GET /` with `header_lines` (each ending in CRLF) sent as they are, bytes that are not
/// UTF-8 included.
pub async fn http_get_with(addr: SocketAddr, header_lines: &[u8]) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n".to_vec();
    request.extend_from_slice(header_lines);
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    HttpResponse { status, headers }
}

/// The statuses of `n` requests in a row, each with `header_lines`.
pub async fn statuses_of(addr: SocketAddr, header_lines: &[u8], n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(http_get_with(addr, header_lines).await.status);
    }
    statuses
}
