//! gRPC clients that send a call's `grpc-timeout` and keep no timer of their own.
//!
//! tonic's channel gives up on a call at its `grpc-timeout` itself (`CANCELLED`, "Timeout
//! expired"), so a call sent with `grpc-timeout: 1n` never shows what the server answered.
//! These clients run on hyper's own HTTP/2 client: the header goes to the server as set, and
//! the client waits for the server's answer, as a caller in another language may.

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice::proto::RateLimitServiceClient;
use sluice::proto::sluice::v1::limiter_client::LimiterClient;

/// The HTTP/2 client the gRPC clients below run on.
pub type Untimed = Client<HttpConnector, tonic::body::Body>;

fn channel(addr: SocketAddr) -> (Untimed, http::Uri) {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    (client, format!("http://{addr}").parse().unwrap())
}

/// Envoy's API on `addr`, without a client-side timer.
pub fn rls_client(addr: SocketAddr) -> RateLimitServiceClient<Untimed> {
    let (client, origin) = channel(addr);
    RateLimitServiceClient::with_origin(client, origin)
}

/// The native API on `addr`, without a client-side timer.
pub fn limiter_client(addr: SocketAddr) -> LimiterClient<Untimed> {
    let (client, origin) = channel(addr);
    LimiterClient::with_origin(client, origin)
}

/// `message` as a call that tells the server its caller waits `timeout` (`grpc-timeout`, in
/// the finest unit that fits its 8 digits, so short ones go as they are: `0n`, `1n`, `3000n`).
pub fn with_deadline<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    const MOST: u128 = 99_999_999;
    let value = if timeout.as_nanos() <= MOST {
        format!("{}n", timeout.as_nanos())
    } else if timeout.as_micros() <= MOST {
        format!("{}u", timeout.as_micros())
    } else {
        format!("{}m", timeout.as_millis())
    };
    let mut call = tonic::Request::new(message);
    call.metadata_mut()
        .insert("grpc-timeout", value.parse().unwrap());
    call
}
