//! Sluice's limits as a library: what the Sluice server decides with, for a Rust service that
//! wants the same limits in-process.
//!
//! A request travels down the modules: [`rls`], the Envoy decision path, matches descriptors
//! against the [`config`], builds counter keys and asks a [`store`] (in-process memory, or Redis
//! with the `redis` feature) for one atomic decision per request; [`named`] holds the named
//! limiters of Sluice's own API; [`metrics`] counts what was decided, under upstream's names.
//! [`proto`] re-exports the protocol types the decision paths speak. Modules import each other
//! in one direction (ARCHITECTURE.md).

// An unwrap outside tests is a panic a request or a config could reach, so each must say why it
// cannot fail (`expect`).
#![warn(unreachable_pub, clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub use sluice_proto as proto;

mod embed;

pub use embed::{AppliedLimit, Decision, Error, Limiter, LimiterBuilder, Limits};

pub mod clock;
pub mod config;
pub mod metrics;
pub mod named;
pub mod rls;
pub mod store;
pub mod util;
