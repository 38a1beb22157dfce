//! Sluice where Envoy Gateway puts envoyproxy/ratelimit, the binary started as EG starts the
//! image's `/bin/ratelimit`: the scenario (and what differs from EG's deployment) is in
//! `crates/sluice-test-kit/src/envoy_gateway.rs`; `tests/gateway/image.rs` runs it with the image.

use sluice_test_kit as kit;

use kit::Sluice;
use kit::envoy_gateway::run_scenario;

#[test]
fn envoy_gateway_deployment_end_to_end() {
    run_scenario(|launch| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(launch.environment(launch.pki.dir.path()));
        Sluice::spawn(cmd)
    });
}
