//! Health as both protocols report it: gRPC `grpc.health.v1.Health` (service name `ratelimit`,
//! as upstream, and the overall "" service) and HTTP `/healthcheck`.
//!
//! Beside SERVING or not, health knows one more state: degraded, a replica that is ready because
//! it still decides every call (`FAILURE_POLICY=local_share`, with its share of each limit) while
//! its Redis is down. Readiness must follow the ability to answer: a degraded replica taken out
//! of its Service would leave Envoy with no answer at all, which is what `local_share` exists to
//! avoid. gRPC health has no field for it (SERVING is all it says); `/healthcheck` says it in its
//! body, and the change is logged, at most once a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice::util::LogThrottle;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The gRPC health service name upstream registers.
pub(super) const SERVICE_NAME: &str = "ratelimit";

/// SERVING while the store answers, the configuration is as required and the service is not
/// shutting down (upstream's health is likewise the AND of its components).
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    store_usable: Arc<AtomicBool>,
    /// False only under `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` while the configuration in
    /// force has no domain (or none has arrived).
    config_ok: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    /// True while the replica decides with its share because its Redis is down; never changes
    /// the status, only what `/healthcheck` and the log say.
    degraded: Arc<AtomicBool>,
    /// Keeps the log of degraded-state changes to one line a second (a flapping Redis).
    degraded_log: Arc<LogThrottle>,
}

/// What `/healthcheck` answers while degraded, after `OK`.
pub(super) const DEGRADED_DETAIL: &str = "DEGRADED: redis is unreachable; deciding with this \
     replica's share of each limit (FAILURE_POLICY=local_share)";

impl Health {
    /// Starts SERVING unless `config_ok` is false: by the time it exists the store answered.
    pub async fn new(reporter: HealthReporter, config_ok: bool) -> Self {
        let health = Self {
            reporter,
            store_usable: Arc::new(AtomicBool::new(true)),
            config_ok: Arc::new(AtomicBool::new(config_ok)),
            stopping: Arc::new(AtomicBool::new(false)),
            degraded: Arc::new(AtomicBool::new(false)),
            degraded_log: Arc::new(LogThrottle::new()),
        };
        health.publish().await;
        health
    }

    pub fn is_serving(&self) -> bool {
        self.store_usable.load(Ordering::Relaxed)
            && self.config_ok.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
    }

    /// Follows the configuration in force (see `config_ok`).
    pub async fn set_config_ok(&self, ok: bool) {
        self.config_ok.store(ok, Ordering::Relaxed);
        self.publish().await;
    }

    /// Follows the store's circuit breaker.
    pub async fn set_store_usable(&self, usable: bool) {
        self.store_usable.store(usable, Ordering::Relaxed);
        self.publish().await;
    }

    /// Whether the replica is ready but decides with its share (see the module's doc).
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Follows whether the replica decides with its share; logs each change, at most one line a
    /// second (a held-back change is counted in the next line; the gauge and `/healthcheck`
    /// always tell the state of now).
    pub fn set_degraded(&self, degraded: bool) {
        if self.degraded.swap(degraded, Ordering::Relaxed) == degraded {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let Some(held_back) = self.degraded_log.allow(now) else {
            return;
        };
        if degraded {
            tracing::warn!(
                changes_held_back = held_back,
                "redis is unreachable: staying ready (SERVING), deciding with this replica's \
                 share of each limit (FAILURE_POLICY=local_share)"
            );
        } else {
            tracing::info!(
                changes_held_back = held_back,
                "redis answers again: deciding on redis, no longer degraded"
            );
        }
    }

    /// Called once on shutdown, so load balancers stop sending traffic while requests drain.
    pub async fn set_not_serving(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.publish().await;
    }

    async fn publish(&self) {
        let status = if self.is_serving() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.report(status).await;
    }

    async fn report(&self, status: ServingStatus) {
        for name in [SERVICE_NAME, ""] {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
