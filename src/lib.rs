//! Sluice: an Envoy-compatible rate limit service.
//!
//! The request path reads top to bottom through the modules: [`server`] adapts gRPC and HTTP to
//! the [`limiter`], which matches descriptors against the [`config`], builds counter keys and asks
//! a [`store`] (in-process memory or Redis) for one atomic decision per request.

pub mod config;
pub mod proto;
