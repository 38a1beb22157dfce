//! The gRPC adapter of the native API (`sluice.v1.Limiter`): messages in, `NamedLimiters` calls,
//! messages and statuses out.
//!
//! | cause | status |
//! |---|---|
//! | bad config, more permits than the limiter can ever grant (checked before any state is touched), missing client_id | `INVALID_ARGUMENT` |
//! | no such limiter | `NOT_FOUND` |
//! | `Acquire` would wait past the server's maximum | `DEADLINE_EXCEEDED` |
//! | store failure or timeout | `UNAVAILABLE` |

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::clock::{Clock, SystemClock};
use crate::limiters::{Acquired, LimiterError, NamedLimiters};
use crate::proto::sluice::v1::{
    AcquireRequest, AcquireResponse, AvailablePermitsRequest, AvailablePermitsResponse,
    DeleteRequest, DeleteResponse, GetConfigRequest, LimiterConfig, SetMode as ApiSetMode,
    SetRateRequest, SetRateResponse, TryAcquireRequest, limiter_server,
};
use crate::store::SetMode;
use crate::telemetry::LogThrottle;

pub struct LimiterApi {
    limiters: Arc<NamedLimiters>,
}

impl LimiterApi {
    pub fn new(limiters: Arc<NamedLimiters>) -> Self {
        Self { limiters }
    }
}

fn to_status(error: LimiterError) -> Status {
    let message = error.to_string();
    match error {
        LimiterError::Invalid(_)
        | LimiterError::TooManyPermits { .. }
        | LimiterError::NeedsClient(_) => Status::invalid_argument(message),
        LimiterError::NotFound(_) => Status::not_found(message),
        LimiterError::WaitTooLong(_) => Status::deadline_exceeded(message),
        LimiterError::Store(e) => {
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

fn response(a: Acquired) -> Response<AcquireResponse> {
    Response::new(AcquireResponse {
        acquired: a.acquired,
        waited: duration(a.waited),
        remaining: a.remaining,
        retry_after: duration(a.retry_after),
    })
}

#[tonic::async_trait]
impl limiter_server::Limiter for LimiterApi {
    async fn set_rate(
        &self,
        request: Request<SetRateRequest>,
    ) -> Result<Response<SetRateResponse>, Status> {
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
            .set_rate(config, mode)
            .await
            .map_err(to_status)?;
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
        let config = self
            .limiters
            .config(&request.get_ref().name)
            .await
            .map_err(to_status)?;
        Ok(Response::new(config))
    }

    async fn try_acquire(
        &self,
        request: Request<TryAcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let r = request.into_inner();
        let timeout = match r.timeout.map(Duration::try_from) {
            None => Duration::ZERO,
            Some(Ok(d)) => d,
            Some(Err(_)) => return Err(Status::invalid_argument("timeout must not be negative")),
        };
        let acquired = self
            .limiters
            .try_acquire(&r.name, &r.client_id, r.permits.max(1), timeout)
            .await
            .map_err(to_status)?;
        Ok(response(acquired))
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let r = request.into_inner();
        let acquired = self
            .limiters
            .acquire(&r.name, &r.client_id, r.permits.max(1))
            .await
            .map_err(to_status)?;
        Ok(response(acquired))
    }

    async fn available_permits(
        &self,
        request: Request<AvailablePermitsRequest>,
    ) -> Result<Response<AvailablePermitsResponse>, Status> {
        let r = request.get_ref();
        let permits = self
            .limiters
            .available(&r.name, &r.client_id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(AvailablePermitsResponse { permits }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let deleted = self
            .limiters
            .delete(&request.get_ref().name)
            .await
            .map_err(to_status)?;
        Ok(Response::new(DeleteResponse { deleted }))
    }
}
