//! Sluice: an Envoy-compatible rate limit service.
//!
//! The request path reads top to bottom through the modules: [`server`] adapts gRPC and HTTP to
//! [`rls`], the Envoy decision path, which matches descriptors against the [`config`], builds
//! counter keys and asks a [`store`] (in-process memory or Redis) for one atomic decision per
//! request; [`named`] holds the native API's named limiters; [`xds`] is the config source that follows an
//! xDS control plane instead of files. [`settings`] turns the environment
//! into typed options, [`app`] wires everything from them, and [`cli`] is the command line. Modules import each other in one direction (ARCHITECTURE.md,
//! `tests/module_graph.rs`).

// The public surface is what the binaries and tests use; an unwrap outside tests is a panic a
// request or a config could reach, so each must say why it cannot fail (`expect`).
#![warn(unreachable_pub, clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod metrics;
pub mod named;
pub mod proto;
pub mod rls;
pub mod server;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod util;
pub mod xds;
