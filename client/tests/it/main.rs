//! The client crate's integration tests, one binary: each module starts the workspace's real
//! `sluice` (and Redis, where a test needs it) through the test kit (`crates/sluice-test-kit`)
//! and drives it with the client, the layer and real services behind it. One binary, as for the
//! server's tests (tests/it/main.rs): every test binary links the client and its dependencies
//! again. A new file of tests is `client/tests/it/<name>.rs` and one line `mod <name>;` below.

mod common;
mod exactness;
mod failures;
// These key requests on the peer address axum records.
#[cfg(feature = "axum")]
mod keys;
#[cfg(feature = "axum")]
mod layer;
#[cfg(feature = "axum")]
mod lease_layer;
// Some of its servers are for the modules above only.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
mod services;
