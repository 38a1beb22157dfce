//! The Sluice server: an Envoy-compatible rate limit service around the [`sluice`] library.
//!
//! The library holds the limits (config, matching, algorithms, stores, the Envoy decision path,
//! the named limiters); this crate serves them. [`server`] adapts gRPC and HTTP to the library's
//! decision paths; [`xds`] is the config source that follows an xDS control plane instead of
//! files; [`telemetry`] sets up logs and traces. [`settings`] turns the environment into typed
//! options, [`app`] wires everything from them, and [`cli`] is the command line (with
//! `admin_client`, the admin API's client behind `sluice counters`). Modules import
//! each other in one direction (ARCHITECTURE.md, `tests/it/module_graph.rs`).

// The public surface is what the binary and tests use; an unwrap outside tests is a panic a
// request or a config could reach, so each must say why it cannot fail (`expect`).
#![warn(unreachable_pub, clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod admin_client;
pub mod app;
pub mod cli;
pub mod server;
pub mod settings;
pub mod telemetry;
pub mod xds;
