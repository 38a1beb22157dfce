//! Sluice's limits as a library: what the Sluice server decides with, for a Rust service that
//! wants the same limits in-process.
//!
//! Most services need only the façade at the crate root: [`Limits`] (limit files in
//! envoyproxy/ratelimit's YAML format, with Sluice's algorithms), a [`Limiter`] on the memory
//! store or on Redis, and [`Limiter::check`], which answers a [`Decision`]:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = sluice::Limits::from_yaml(
//!     "
//! domain: api
//! descriptors:
//!   - key: api_key
//!     rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window_log}
//! ",
//! )?;
//! let limiter = sluice::Limiter::memory(limits);
//! let decision = limiter.check("api", &[("api_key", "k-42")], 1).await?;
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, Some(99));
//! # Ok(())
//! # }
//! ```
//!
//! `examples/axum_api_keys.rs` is a whole service, and docs/library.md the guide.
//!
//! Underneath, the modules the server is built on stay public for what the façade does not
//! cover. A request travels down them: [`rls`], the Envoy decision path, matches descriptors
//! against the [`config`], builds counter keys and asks a [`store`] (in-process memory, or Redis
//! with the `redis` feature, on by default) for one atomic decision per request; [`named`] holds
//! the named limiters of Sluice's own API; [`metrics`] counts what was decided, under upstream's
//! names. [`proto`] re-exports the protocol types the decision paths speak. Modules import each
//! other in one direction (ARCHITECTURE.md).

// An unwrap outside tests is a panic a request or a config could reach, so each must say why it
// cannot fail (`expect`).
#![warn(unreachable_pub, clippy::unwrap_used)]
// Every public item says what it is for: the crate's rustdoc is read by people who have not
// read the server.
#![deny(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub use sluice_proto as proto;

mod embed;

pub use embed::{AppliedLimit, Decision, Error, Limiter, LimiterBuilder, Limits};

pub mod clock;
pub mod config;
pub mod metrics;
pub mod named;
pub mod rlqs;
pub mod rls;
pub mod store;
pub mod util;

// The Rust blocks of docs/library.md run as this crate's doc tests, so the guide's code keeps
// compiling as the library changes.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryGuide;
