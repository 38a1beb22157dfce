//! Sluice: an Envoy-compatible rate limit service.
//!
//! The request path reads top to bottom through the modules: [`server`] adapts gRPC and HTTP to
//! [`rls`], the Envoy decision path, which matches descriptors against the [`config`], builds
//! counter keys and asks
//! a [`store`] (in-process memory or Redis) for one atomic decision per request; [`named`] holds
//! the native API's named limiters. [`settings`]
//! turns the environment into typed options, [`app`] wires everything from them, and [`cli`] is
//! the command line. Modules import each other in one direction (ARCHITECTURE.md,
//! `tests/module_graph.rs`).

/// glibc's malloc took about a seventh of the server's CPU on the Redis path (arena locks,
/// consolidation); with mimalloc the server used 14% less CPU per decision in the same run
/// (docs/BENCHMARKS.md). Set here so the service, the benchmark's null server and the examples
/// measure with the same allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
