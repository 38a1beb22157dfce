//! Uses the native `sluice.v1.Limiter` API: creates a limiter (if absent), takes permits, and
//! waits server-side for one when the bucket is empty.
//!
//! Run a server (`cargo run -- serve --config-dir examples/config`), then
//! `cargo run --example limiter_client -- http://127.0.0.1:8081`.

use std::time::Duration;

use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    Algorithm, AvailablePermitsRequest, LimiterConfig, SetMode, SetRateRequest, TryAcquireRequest,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let mut client = LimiterClient::connect(addr).await?;

    // 5 permits per second, at most 2 at once; TRY_SET leaves an existing limiter alone.
    let created = client
        .set_rate(SetRateRequest {
            config: Some(LimiterConfig {
                name: "example-export-job".into(),
                algorithm: Algorithm::TokenBucket as i32,
                rate: 5,
                interval: Some(Duration::from_secs(1).try_into()?),
                burst: 2,
                ..Default::default()
            }),
            set_mode: SetMode::TrySet as i32,
        })
        .await?
        .into_inner();
    println!(
        "limiter in force: {:?} (created now: {})",
        created.config, created.applied
    );

    for i in 1..=5 {
        let reply = client
            .try_acquire(TryAcquireRequest {
                name: "example-export-job".into(),
                permits: 1,
                // Wait up to half a second on the server for a permit.
                timeout: Some(Duration::from_millis(500).try_into()?),
                client_id: String::new(),
            })
            .await?
            .into_inner();
        println!(
            "call {i}: acquired={} waited={:?} remaining={}",
            reply.acquired, reply.waited, reply.remaining
        );
    }
    let available = client
        .available_permits(AvailablePermitsRequest {
            name: "example-export-job".into(),
            client_id: String::new(),
        })
        .await?
        .into_inner();
    println!("available now: {}", available.permits);
    Ok(())
}
