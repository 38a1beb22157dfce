//! The admin API (issue #42): operators read and reset the counters one descriptor of a domain
//! is counted under. Off unless `ADMIN_API_TOKEN` is set; then every call must carry it as a
//! bearer token (`token.rs`, the check the native API uses). Served over HTTP on the debug
//! listener (`http.rs`) and over gRPC as `sluice.v1.Admin` on the gRPC port (`grpc.rs`); both
//! go through [`Admin`], so they answer, log and count alike. The reading and resetting itself is
//! the library's (`sluice::rls::RateLimiter::peek_counters`, `reset_counters`).
//!
//! Every reset and refund is logged at WARN with who asked (the peer's address and the token's
//! fingerprint, never the token) and counted (`sluice_admin_counters_reset_total`).

pub(crate) mod descriptor;
mod grpc;
mod http;

use std::net::IpAddr;
use std::sync::Arc;

pub(crate) use grpc::{AdminGrpcService, service as grpc_service};
pub(crate) use http::routes as http_routes;

use super::token;
use sluice::metrics::{AdminMetrics, Metrics};
use sluice::rls::{AdminError, CounterReport, RateLimiter, value_hash};

/// A descriptor's entries, `(key, value)` in order, as the transports read them.
pub(crate) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// What both transports share: the limiter, the expected token, the metrics.
#[derive(Clone)]
pub(crate) struct Admin {
    limiter: Arc<RateLimiter>,
    expected: token::Expected,
    metrics: AdminMetrics,
}

/// An admin operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Get,
    Reset,
    /// Give back up to this many hits.
    Refund(u64),
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Get => "get",
            Operation::Reset => "reset",
            Operation::Refund(_) => "refund",
        }
    }
}

/// Who made a call, for the reset log: the peer's address and the token's fingerprint.
pub(crate) struct Caller<'a> {
    pub(crate) peer: Option<IpAddr>,
    pub(crate) authorization: Option<&'a str>,
}

/// Why a call got no counters: refused before it ran, or the library's error.
#[derive(Debug)]
pub(crate) enum Refused {
    Unauthenticated,
    BadRequest(String),
    Admin(AdminError),
}

impl Refused {
    /// The `outcome` label of `sluice_admin_calls_total`.
    fn label(&self) -> &'static str {
        match self {
            Refused::Unauthenticated => "unauthenticated",
            Refused::BadRequest(_)
            | Refused::Admin(AdminError::BadDescriptor(_) | AdminError::NotRefundable(_)) => {
                "bad_request"
            }
            Refused::Admin(AdminError::UnknownDomain(_)) => "not_found",
            Refused::Admin(AdminError::NoConfig | AdminError::Store(_)) => "unavailable",
        }
    }
}

impl Admin {
    /// The admin API of `limiter`, expecting `token`.
    pub(crate) fn new(limiter: Arc<RateLimiter>, token: &str, metrics: &Metrics) -> Self {
        Self {
            limiter,
            expected: token::Expected::new(Some(token)),
            metrics: metrics.admin.clone(),
        }
    }

    /// Runs `operation` on the counters of `entries` in `domain` for `caller` over `api`
    /// (`http`, `grpc`): the token checked first, then the descriptor (`entries` is the
    /// transport's reading of it), counted by outcome.
    pub(crate) async fn run(
        &self,
        api: &'static str,
        operation: Operation,
        caller: Caller<'_>,
        domain: &str,
        entries: Result<Entries, String>,
    ) -> Result<Vec<CounterReport>, Refused> {
        let result = self.run_checked(operation, &caller, domain, entries).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(refused) => refused.label(),
        };
        self.metrics
            .calls
            .with_label_values(&[api, operation.name(), outcome])
            .inc();
        result
    }

    async fn run_checked(
        &self,
        operation: Operation,
        caller: &Caller<'_>,
        domain: &str,
        entries: Result<Entries, String>,
    ) -> Result<Vec<CounterReport>, Refused> {
        if !self.expected.admits(caller.authorization) {
            return Err(Refused::Unauthenticated);
        }
        let entries = entries.map_err(Refused::BadRequest)?;
        let reports = match operation {
            Operation::Get => self.limiter.peek_counters(domain, &entries).await,
            Operation::Reset => self.limiter.reset_counters(domain, &entries).await,
            Operation::Refund(hits) => self.limiter.refund_counters(domain, &entries, hits).await,
        }
        .map_err(Refused::Admin)?;
        if operation != Operation::Get {
            if operation == Operation::Reset {
                self.metrics.counters_reset.inc_by(reports.len() as u64);
            }
            let limits: Vec<&str> = reports.iter().map(|r| r.name.as_str()).collect();
            tracing::warn!(
                peer = %caller.peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
                token = %token::fingerprint(caller.authorization),
                domain,
                descriptor = %hashed(&entries),
                counters = reports.len(),
                limits = ?limits,
                operation = operation.name(),
                "admin API changed counters"
            );
        }
        Ok(reports)
    }
}

/// `key=sha256:…,…`: a descriptor in a log line, its values hashed as the decision log hashes
/// them by default.
fn hashed(entries: &[(Vec<u8>, Vec<u8>)]) -> String {
    entries
        .iter()
        .map(|(key, value)| format!("{}={}", String::from_utf8_lossy(key), value_hash(value)))
        .collect::<Vec<_>>()
        .join(",")
}
