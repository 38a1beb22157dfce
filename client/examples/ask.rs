//! Both APIs through `sluice_client::Client`: one RLS decision, then a named limiter of the
//! native API created, spent and waited on.
//!
//! Run Sluice with the native API on
//! (`LIMITER_API_ENABLED=true cargo run -- serve --config-dir examples/config`), then
//! `cargo run -p sluice-client --example ask -- http://127.0.0.1:8081`.

use std::time::Duration;

use sluice_client::limiter::{Algorithm, SetMode};
use sluice_client::{Client, Descriptor, LimiterConfig, RateLimitRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sluice = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let client = Client::connect(sluice).await?;

    // Envoy's API: the request Envoy would send for a user header.
    let request =
        RateLimitRequest::new("example").descriptor(Descriptor::new().entry("user", "alice"));
    let decision = client.should_rate_limit(request).await?;
    println!(
        "RLS: allowed={} remaining={:?} (answered by {:?})",
        decision.allowed,
        decision.remaining(),
        decision.answered_by
    );

    // The native API: 5 per second, 2 at once, created unless it exists.
    let config = LimiterConfig::new(
        "example-export-job",
        Algorithm::TokenBucket,
        5,
        Duration::from_secs(1),
    )
    .burst(2);
    let set = client.set_rate(config, SetMode::TrySet).await?;
    println!("limiter created now: {}", set.applied);
    for i in 1..=4 {
        // Sluice waits up to 500 ms for a permit before saying no.
        let taken = client
            .try_acquire("example-export-job", "", 1, Duration::from_millis(500))
            .await?;
        println!(
            "try_acquire {i}: acquired={} waited={:?}",
            taken.acquired, taken.waited
        );
    }
    let taken = client
        .acquire("example-export-job", "", 1, Duration::from_secs(2))
        .await?;
    println!("acquire: waited {:?}", taken.waited);
    println!(
        "available now: {}",
        client.available_permits("example-export-job", "").await?
    );
    Ok(())
}
