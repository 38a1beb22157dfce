//! Sluice: an Envoy-compatible rate limit service.
//!
//! The request path reads top to bottom through the modules: [`server`] adapts gRPC and HTTP to
//! the [`limiter`], which matches descriptors against the [`config`], builds counter keys and asks
//! a [`store`] (in-process memory or Redis) for one atomic decision per request. [`settings`]
//! turns the environment into typed options; [`cli`] is the command line.

pub mod cli;
pub mod clock;
pub mod config;
pub mod limiter;
pub mod limiters;
pub mod metrics;
pub mod proto;
pub mod server;
pub mod settings;
pub mod store;
pub mod telemetry;
