//! Health as both protocols report it: gRPC `grpc.health.v1.Health` (service name `ratelimit`,
//! as upstream, and the overall "" service) and HTTP `/healthcheck`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

impl Health {
    /// Starts SERVING unless `config_ok` is false: by the time it exists the store answered.
    pub async fn new(reporter: HealthReporter, config_ok: bool) -> Self {
        let health = Self {
            reporter,
            store_usable: Arc::new(AtomicBool::new(true)),
            config_ok: Arc::new(AtomicBool::new(config_ok)),
            stopping: Arc::new(AtomicBool::new(false)),
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
