//! The gRPC adapter of the native API (`sluice.v1.Limiter`): messages in, `NamedLimiters` calls,
//! messages and statuses out.
//!
//! | cause | status |
//! |---|---|
//! | a request that does not decode (a `name` or `client_id` that is not UTF-8, bytes that are not protobuf: `proto::codec`), bad config, more permits than the limiter can ever grant (checked before any state is touched), missing client_id, a malformed `lease_id`, a `Release` to a limiter that is not `CONCURRENCY` | `INVALID_ARGUMENT` |
//! | no such limiter | `NOT_FOUND` |
//! | `Acquire` would wait past the server's maximum | `DEADLINE_EXCEEDED` |
//! | creating a limiter while `LIMITER_MAX_COUNT` exist | `RESOURCE_EXHAUSTED` |
//! | a new client of a per-client limiter holding `LIMITER_MAX_CLIENTS` client states (memory store: or `MEMORY_MAX_LIMITER_STATES` over all limiters) | `RESOURCE_EXHAUSTED` |
//! | store failure or timeout | `UNAVAILABLE` |
//! | the caller's deadline below `GRPC_MIN_TIMEOUT`, or ran out while the store answered (`deadline_floor.rs`) | `DEADLINE_EXCEEDED` |
//! | `LIMITER_API_TOKEN` set and the call's bearer token missing or different | `UNAUTHENTICATED` |
//!
//! The API is off unless `LIMITER_API_ENABLED=true`. Its calls reach the store through a
//! circuit breaker of their own (see `app::serve`), so nothing done here can change an RLS
//! answer or RLS health.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec};
use tonic::server::NamedService;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::{deadline_floor, token};
use sluice::clock::{Clock, SystemClock};
use sluice::metrics::Metrics;
use sluice::named::{Acquired, NamedError, NamedLimiters};
use sluice::proto::sluice::v1::limiter_server::LimiterServer;
use sluice::proto::sluice::v1::{
    AcquireRequest, AcquireResponse, AvailablePermitsRequest, AvailablePermitsResponse,
    DeleteRequest, DeleteResponse, GetConfigRequest, LimiterConfig, ReleaseRequest,
    ReleaseResponse, SetMode as ApiSetMode, SetRateRequest, SetRateResponse, TryAcquireRequest,
    limiter_server,
};
use sluice::store::deadline::Deadline;
use sluice::store::{Marks, SetMode, StoreError};
use sluice::util::LogThrottle;

pub(crate) struct NamedApi {
    limiters: Arc<NamedLimiters>,
    /// `sluice_limiter_clients_refused_total`: new clients refused because a limiter or the
    /// store's table of client states was full, counted here so that it counts on every store.
    clients_refused: IntCounter,
    /// Calls whose store call ran out of the caller's deadline (`deadline_floor.rs`; calls whose
    /// deadline was too short from the start are refused before they get here, `routes.rs`).
    ran_out: IntCounter,
    /// `sluice_limiter_releases_total`, by result: whether a release found its leases.
    releases: IntCounterVec,
}

/// The native API as a gRPC service, behind its token check.
pub(crate) type NamedApiService = InterceptedService<LimiterServer<NamedApi>, BearerToken>;

/// The service for `limiters`; with `token`, every call must carry it as a bearer token.
/// Messages are capped like RLS requests (`super::MAX_REQUEST_BYTES`). Refused new clients
/// are counted in `metrics`.
pub(crate) fn service(
    limiters: Arc<NamedLimiters>,
    token: Option<&str>,
    metrics: &Metrics,
) -> NamedApiService {
    let server = LimiterServer::new(NamedApi {
        limiters,
        clients_refused: metrics.limiter_clients_refused.clone(),
        releases: metrics.limiter_releases.clone(),
        ran_out: deadline_floor::ran_out_counter(
            <LimiterServer<NamedApi> as NamedService>::NAME,
            metrics,
        ),
    })
    .max_decoding_message_size(super::MAX_REQUEST_BYTES);
    InterceptedService::new(server, BearerToken::new(token))
}

/// Checks `authorization: Bearer <token>` (`token.rs`, shared with the admin API).
#[derive(Clone)]
pub(crate) struct BearerToken {
    expected: token::Expected,
}

impl BearerToken {
    fn new(token: Option<&str>) -> Self {
        Self {
            expected: token::Expected::new(token),
        }
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if self.expected.admits(authorization) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "the Limiter API needs a valid bearer token (LIMITER_API_TOKEN)",
            ))
        }
    }
}

impl NamedApi {
    /// The status of `error`, counted where it is counted: a refused new client, a store call
    /// that ran out of the caller's deadline.
    fn status(&self, error: NamedError) -> Status {
        match error {
            NamedError::TooManyClients { .. } => self.clients_refused.inc(),
            NamedError::Store(e @ StoreError::CallerDeadline(_)) => {
                return deadline_floor::ran_out(&self.ran_out, e.to_string());
            }
            _ => {}
        }
        to_status(error)
    }
}

fn to_status(error: NamedError) -> Status {
    let message = error.to_string();
    match error {
        NamedError::Invalid(_) | NamedError::TooManyPermits { .. } | NamedError::NeedsClient(_) => {
            Status::invalid_argument(message)
        }
        NamedError::NotFound(_) => Status::not_found(message),
        NamedError::WaitTooLong(_) => Status::deadline_exceeded(message),
        NamedError::TooManyLimiters(_) | NamedError::TooManyClients { .. } => {
            Status::resource_exhausted(message)
        }
        NamedError::Store(e) => {
            static STORE_ERRORS: LogThrottle = LogThrottle::new();
            if let Some(held_back) = STORE_ERRORS.allow(SystemClock.now_secs()) {
                tracing::warn!(error = %e, held_back, "store failed");
            }
            Status::unavailable(message)
        }
    }
}

fn duration(d: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

/// The deadline the server took from the call's `grpc-timeout` (`serving.rs`), if it sent one.
fn deadline_of<T>(request: &Request<T>) -> Option<Deadline> {
    request.extensions().get::<Deadline>().copied()
}

/// The answer to an acquisition; `degraded`: a store call in it was decided locally
/// (`FAILURE_POLICY=local_share`).
fn response(a: Acquired, degraded: bool) -> Response<AcquireResponse> {
    Response::new(AcquireResponse {
        acquired: a.acquired,
        waited: duration(a.waited),
        remaining: a.remaining,
        retry_after: duration(a.retry_after),
        degraded,
        lease_id: a.lease.map(|l| l.to_string()).unwrap_or_default(),
    })
}

#[tonic::async_trait]
impl limiter_server::Limiter for NamedApi {
    async fn set_rate(
        &self,
        request: Request<SetRateRequest>,
    ) -> Result<Response<SetRateResponse>, Status> {
        let (marks, deadline) = (Marks::new(), deadline_of(&request));
        let request = request.into_inner();
        let mode = match ApiSetMode::try_from(request.set_mode) {
            Ok(ApiSetMode::TrySet) => SetMode::TrySet,
            Ok(ApiSetMode::UpdateKeepState) => SetMode::UpdateKeepState,
            Ok(ApiSetMode::UpdateResetState) => SetMode::UpdateResetState,
            Err(_) => return Err(Status::invalid_argument("unknown set_mode")),
        };
        let config = request
            .config
            .ok_or_else(|| Status::invalid_argument("config is required"))?;
        let set = self
            .limiters
            .set_rate(marks.call(deadline), config, mode)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(SetRateResponse {
            applied: set.applied,
            config: Some(set.config),
            state_reset: set.state_reset,
        }))
    }

    async fn get_config(
        &self,
        request: Request<GetConfigRequest>,
    ) -> Result<Response<LimiterConfig>, Status> {
        let marks = Marks::new();
        let config = self
            .limiters
            .config(marks.call(deadline_of(&request)), &request.get_ref().name)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(config))
    }

    async fn try_acquire(
        &self,
        request: Request<TryAcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let (marks, deadline) = (Marks::new(), deadline_of(&request));
        let r = request.into_inner();
        let timeout = match r.timeout.map(Duration::try_from) {
            None => Duration::ZERO,
            Some(Ok(d)) => d,
            Some(Err(_)) => return Err(Status::invalid_argument("timeout must not be negative")),
        };
        let call = marks.call(deadline);
        let acquired = self
            .limiters
            .try_acquire(call, &r.name, &r.client_id, r.permits.max(1), timeout)
            .await;
        Ok(response(
            acquired.map_err(|e| self.status(e))?,
            marks.degraded(),
        ))
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let (marks, deadline) = (Marks::new(), deadline_of(&request));
        let r = request.into_inner();
        let acquired = self
            .limiters
            .acquire(
                marks.call(deadline),
                &r.name,
                &r.client_id,
                r.permits.max(1),
            )
            .await;
        Ok(response(
            acquired.map_err(|e| self.status(e))?,
            marks.degraded(),
        ))
    }

    async fn available_permits(
        &self,
        request: Request<AvailablePermitsRequest>,
    ) -> Result<Response<AvailablePermitsResponse>, Status> {
        let marks = Marks::new();
        let call = marks.call(deadline_of(&request));
        let r = request.get_ref();
        let permits = self
            .limiters
            .available(call, &r.name, &r.client_id)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(AvailablePermitsResponse { permits }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let marks = Marks::new();
        let deleted = self
            .limiters
            .delete(marks.call(deadline_of(&request)), &request.get_ref().name)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(DeleteResponse { deleted }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let marks = Marks::new();
        let call = marks.call(deadline_of(&request));
        let r = request.get_ref();
        let released = self
            .limiters
            .release(call, &r.name, &r.client_id, &r.lease_id)
            .await
            .map_err(|e| self.status(e))?;
        let result = if released.given_back > 0 {
            "returned"
        } else {
            "nothing_held"
        };
        self.releases.with_label_values(&[result]).inc();
        Ok(Response::new(ReleaseResponse {
            released: released.given_back > 0,
            remaining: released.remaining,
        }))
    }
}
