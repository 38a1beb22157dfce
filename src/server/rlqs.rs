//! The gRPC adapter of the Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`), on
//! the gRPC port beside RLS (and so over its TLS and mTLS): each `StreamRateLimitQuotas` call
//! gets a task that owns the stream's state (`sluice::rlqs::QuotaStream`), answers each usage
//! report with the buckets' actions, and pushes a bucket's share again when its `DENY_ALL`
//! ends. Everything it decides is in the library (`sluice::rlqs`); this file only carries
//! messages.
//!
//! | cause | status |
//! |---|---|
//! | more streams open than the server serves | `RESOURCE_EXHAUSTED` |
//! | a message over 1 MiB, or one that does not decode | the stream ends with `OUT_OF_RANGE` / `INVALID_ARGUMENT` (tonic, `proto::codec`) |

use std::pin::Pin;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{Future, Stream};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::MAX_REQUEST_BYTES;
use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use sluice::proto::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use sluice::rlqs::{QuotaServer, QuotaStream};

/// Responses one stream may have waiting to be written before it stops reading reports.
const QUEUED_RESPONSES: usize = 4;

/// The quota service on a gRPC listener.
pub(crate) struct QuotaService {
    server: Arc<QuotaServer>,
    stop: Stop,
}

/// The listener's stop signal, which every stream waits on and the listener itself awaits.
#[derive(Clone)]
pub(crate) struct Stop(Shared<BoxFuture<'static, ()>>);

impl Stop {
    pub(crate) fn new(stopped: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(stopped.boxed().shared())
    }
}

impl Future for Stop {
    type Output = ();

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.0.poll_unpin(cx)
    }
}

/// The service, with the gRPC port's message size bound; its streams end at `stop`.
pub(crate) fn service(
    server: Arc<QuotaServer>,
    stop: Stop,
) -> RateLimitQuotaServiceServer<QuotaService> {
    RateLimitQuotaServiceServer::new(QuotaService { server, stop })
        .max_decoding_message_size(MAX_REQUEST_BYTES)
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let state = self
            .server
            .open_stream()
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let (tx, rx) = mpsc::channel(QUEUED_RESPONSES);
        tokio::spawn(run(state, request.into_inner(), tx, self.stop.clone()));
        let responses = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Serves one stream until Envoy ends it, it fails, nobody reads the responses, or the
/// listener stops (the stream then ends with OK, and Envoy opens a new one at its next report,
/// on another replica).
async fn run(
    mut state: QuotaStream,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    mut stop: Stop,
) {
    loop {
        let push_at = state.next_push().map(tokio::time::Instant::from_std);
        let response = tokio::select! {
            report = reports.message() => match report {
                Ok(Some(report)) => state.report(report).await,
                Ok(None) => return,
                Err(status) => {
                    tracing::debug!(%status, "RLQS stream ended by an error");
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            },
            () = sleep_until(push_at), if push_at.is_some() => {
                state.pushes_due(std::time::Instant::now())
            }
            () = tx.closed() => return,
            () = &mut stop => return,
        };
        if let Some(response) = response
            && tx.send(Ok(response)).await.is_err()
        {
            return;
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
