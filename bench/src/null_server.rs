//! The null rate limit service (`sluice-bench null-server`): the baseline of every ratio.
//!
//! It answers every `ShouldRateLimit` at once with `OK` and one status per descriptor shaped like
//! Sluice's (current limit, remaining, reset), without counting anything. It runs as a separate
//! process on the same kind of runtime as `sluice serve` (tokio's default multi-threaded runtime,
//! tonic, TCP_NODELAY), so the difference to Sluice is the decision path, not the transport.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Args;
use sluice::proto::{
    Code, CurrentLimit, DescriptorStatus, RateLimitRequest, RateLimitResponse, RateLimitService,
    RateLimitServiceServer, ResponseUnit,
};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

#[derive(Args, Debug)]
pub(crate) struct NullArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port to listen on (0 = a free one; the address is printed as a JSON line).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

/// The `requests_per_unit` the null server reports (it counts nothing).
const REPORTED_LIMIT: u32 = 1_000_000_000;

struct NullService;

#[tonic::async_trait]
impl RateLimitService for NullService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(CurrentLimit {
                    name: String::new(),
                    requests_per_unit: REPORTED_LIMIT,
                    unit: ResponseUnit::Hour as i32,
                }),
                limit_remaining: REPORTED_LIMIT - 1,
                duration_until_reset: Some(prost_types::Duration {
                    seconds: 1800,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..Default::default()
        }))
    }
}

pub(crate) fn main(args: NullArgs) -> Result<()> {
    // Same runtime as `sluice serve`: tokio's default, one worker per CPU.
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(serve(SocketAddr::new(args.host, args.port)))
}

async fn serve(addr: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("no local address")?;
    // The same line shape as Sluice's JSON log, so one parser finds both addresses.
    println!(
        "{}",
        serde_json::json!({
            "level": "info",
            "@message": "null-server is listening",
            "grpc": local.to_string(),
        })
    );
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(NullService))
        .serve_with_incoming_shutdown(incoming, shutdown())
        .await
        .context("null server failed")
}

async fn shutdown() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => return std::future::pending().await,
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
