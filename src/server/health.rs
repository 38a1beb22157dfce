//! Health as both protocols report it: gRPC `grpc.health.v1.Health` (service name `ratelimit`,
//! as upstream, and the overall "" service) and HTTP `/healthcheck`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The gRPC health service name upstream registers.
pub const SERVICE_NAME: &str = "ratelimit";

#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    serving: Arc<AtomicBool>,
}

impl Health {
    /// Starts SERVING: by the time it exists, the config is loaded and the store answered.
    pub async fn new(reporter: HealthReporter) -> Self {
        let health = Self {
            reporter,
            serving: Arc::new(AtomicBool::new(true)),
        };
        health.report(ServingStatus::Serving).await;
        health
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Called once on shutdown, so load balancers stop sending traffic while requests drain.
    pub async fn set_not_serving(&self) {
        self.serving.store(false, Ordering::Relaxed);
        self.report(ServingStatus::NotServing).await;
    }

    async fn report(&self, status: ServingStatus) {
        for name in [SERVICE_NAME, ""] {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
