//! A minimal gRPC client: asks a running Sluice about one descriptor and prints the answer.
//!
//! Run with `cargo run --example client -- [ADDR] [DOMAIN] [KEY=VALUE]...`, e.g.
//! `cargo run --example client -- http://127.0.0.1:8081 example remote_address=10.0.0.1`.

use sluice::proto::{
    DescriptorEntry, RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let domain = args.next().unwrap_or_else(|| "example".into());
    let mut entries: Vec<DescriptorEntry> = args
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((&pair, ""));
            DescriptorEntry {
                key: key.into(),
                value: value.into(),
            }
        })
        .collect();
    if entries.is_empty() {
        entries.push(DescriptorEntry {
            key: "remote_address".into(),
            value: "10.0.0.1".into(),
        });
    }

    let mut client = RateLimitServiceClient::connect(addr).await?;
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into_bytes(),
            descriptors: vec![RateLimitDescriptor {
                entries,
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await?
        .into_inner();
    println!("{response:#?}");
    Ok(())
}
