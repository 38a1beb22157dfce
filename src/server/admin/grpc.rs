//! The admin API over gRPC: `sluice.v1.Admin` on the gRPC port, the bearer token in the call's
//! `authorization` metadata.
//!
//! | cause | status |
//! |---|---|
//! | no or another bearer token | `UNAUTHENTICATED` |
//! | no entries, too many, or a key or value that is not UTF-8 | `INVALID_ARGUMENT` |
//! | a domain the configuration does not have | `NOT_FOUND` |
//! | no configuration yet, or the store failed | `UNAVAILABLE` |

use tonic::{Request, Response, Status};

use super::super::serving::PeerIp;
use super::{Admin, Caller, Operation, Refused};
use sluice::proto::sluice::v1::admin_server::{self, AdminServer};
use sluice::proto::sluice::v1::{Counter, CountersRequest, CountersResponse};
use sluice::rls::AdminError;

/// The admin API as a gRPC service.
pub(crate) type AdminGrpcService = AdminServer<AdminGrpc>;

/// The adapter: messages in, [`Admin`] calls, messages and statuses out.
pub(crate) struct AdminGrpc {
    admin: Admin,
}

/// The service for `admin`; messages are capped like RLS requests.
pub(crate) fn service(admin: Admin) -> AdminGrpcService {
    AdminServer::new(AdminGrpc { admin }).max_decoding_message_size(super::super::MAX_REQUEST_BYTES)
}

impl AdminGrpc {
    async fn run(
        &self,
        operation: Operation,
        request: Request<CountersRequest>,
    ) -> Result<Response<CountersResponse>, Status> {
        let peer = request.extensions().get::<PeerIp>().and_then(|p| p.0);
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let CountersRequest {
            domain,
            entries,
            hits: _,
        } = request.into_inner();
        let entries = entries
            .into_iter()
            .map(|e| (e.key.into_bytes(), e.value.into_bytes()))
            .collect();
        let caller = Caller {
            peer,
            authorization: authorization.as_deref(),
        };
        let reports = self
            .admin
            .run("grpc", operation, caller, &domain, Ok(entries))
            .await
            .map_err(status)?;
        let counters = reports
            .into_iter()
            .map(|r| Counter {
                name: r.name,
                algorithm: r.algorithm.to_string(),
                limit: r.limit,
                unit: r.unit.to_string(),
                window_seconds: r.window_secs,
                used: r.used,
                remaining: r.remaining,
                reset_ms: r.reset_ms,
                shadow_mode: r.shadow_mode,
            })
            .collect();
        Ok(Response::new(CountersResponse { domain, counters }))
    }
}

fn status(refused: Refused) -> Status {
    match refused {
        Refused::Unauthenticated => {
            Status::unauthenticated("the admin API needs a valid bearer token (ADMIN_API_TOKEN)")
        }
        Refused::BadRequest(m) => Status::invalid_argument(m),
        Refused::Admin(e @ (AdminError::BadDescriptor(_) | AdminError::NotRefundable(_))) => {
            Status::invalid_argument(e.to_string())
        }
        Refused::Admin(e @ AdminError::UnknownDomain(_)) => Status::not_found(e.to_string()),
        Refused::Admin(e) => Status::unavailable(e.to_string()),
    }
}

#[tonic::async_trait]
impl admin_server::Admin for AdminGrpc {
    async fn get_counters(
        &self,
        request: Request<CountersRequest>,
    ) -> Result<Response<CountersResponse>, Status> {
        self.run(Operation::Get, request).await
    }

    async fn reset_counters(
        &self,
        request: Request<CountersRequest>,
    ) -> Result<Response<CountersResponse>, Status> {
        self.run(Operation::Reset, request).await
    }

    async fn refund_counters(
        &self,
        request: Request<CountersRequest>,
    ) -> Result<Response<CountersResponse>, Status> {
        let hits = request.get_ref().hits;
        if hits == 0 {
            return Err(Status::invalid_argument(
                "RefundCounters needs hits, at least 1",
            ));
        }
        self.run(Operation::Refund(hits), request).await
    }
}
