//! The server's integration tests, one binary: one module per concern (the file's opening doc
//! says what it owns), each test starting the real processes it needs through the test kit
//! (`crates/sluice-test-kit`). One binary instead of one per file because every test binary
//! links the whole service and its dependencies (tonic, redis, opentelemetry, axum): linking
//! them once is what made the test build short.
//!
//! Tests of different modules run in parallel threads of this one process (`--test-threads`,
//! the number of cores by default), where separate binaries ran one after the other: a test that
//! cannot share the machine stays a binary of its own under `tests/` with its reason at its
//! top (docs/development.md, "The integration tests", lists them).
//!
//! Run one module: `cargo test --test it -- limiter_api::`; one test: `cargo test --test it --
//! --exact limiter_api::set_get_acquire_and_delete_on_both_stores`. A new file of tests is
//! `tests/it/<name>.rs` and one line `mod <name>;` below.

mod admin_api;
mod admin_api_cluster;
mod authority;
mod bytes_not_strings;
mod calendar_windows;
mod chart;
mod chart_degraded;
mod check_then_charge;
mod code_size;
mod concurrency;
mod connection_age;
mod costly_calls;
mod deadline;
mod degraded_health;
mod deploy;
mod docs;
mod envoy;
mod envoy_filter;
mod envoy_hidden_limits;
mod failover;
mod faults;
mod fuzz_regressions;
mod grpc_tls;
mod inflight;
mod inflight_envoy;
mod key_isolation;
mod limiter_api;
mod limiter_api_hostile;
mod limiter_api_isolation;
mod limiter_api_waiting;
mod limiter_leases;
mod memory_bound;
mod metrics;
mod module_graph;
mod multi_limit;
mod partial_outage;
mod redis_cluster;
mod redis_connection;
mod redis_faults;
mod redis_sentinel;
mod redis_sentinel_tls;
mod redis_store;
mod reload;
mod response_costs;
mod rlqs;
mod rlqs_bounds;
mod service;
mod short_deadlines;
mod startup;
mod stats;
mod stop_increment;
mod store_conformance;
mod tracing;
mod tracing_b3;
mod upstream_env;
mod xds;
