//! The test kit of the Sluice workspace: what the server's integration tests (`tests/`) and the
//! client's (`client/tests/`) start and speak to, shared so that each exists once. Dev-only
//! (`publish = false`); no library or binary of the workspace depends on it.
//!
//! Everything is real: `redis-server` processes (single, Sentinel, Cluster), `sluice` processes,
//! Envoy, containers, each on free ports and stopped when its handle drops, so tests are
//! isolated from each other and from a Redis the machine already runs on 6379. What a module
//! owns is said at its top; the most used items are re-exported here, so a test starts with
//! `use sluice_test_kit::*;`.
//!
//! The environment the kit reads (scripts/test.sh sets what CI needs): `SLUICE_TEST_REDIS_SERVER`
//! and `SLUICE_TEST_REDIS_OLDER` ([`redis_servers`]), `SLUICE_BIN` ([`sluice_process`]), `SLUICE_TEST_ECHO`
//! (copies Sluice's log to the test output), `SLUICE_TEST_ENVOY` ([`envoy`]),
//! `SLUICE_TEST_IMAGE_BINARY` ([`container`]).

// `new` of a launcher starts processes or writes certificates: a `Default` doing that would
// hide it behind `..Default::default()`.
#![allow(clippy::new_without_default)]

// Named so that no module shadows a crate a test also uses (`redis`, `sluice`, `http`) when
// it glob-imports the kit.
pub mod admin;
pub mod bootstrap;
pub mod chart;
pub mod container;
pub mod envoy;
pub mod envoy_gateway;
pub mod in_process;
pub mod load;
pub mod native;
pub mod otlp;
pub mod pki;
pub mod plain_http;
pub mod process;
pub mod proxy;
pub mod raw_h2;
pub mod readiness;
pub mod redis_servers;
pub mod rls;
pub mod sentinel;
pub mod sluice_process;
pub mod source;
pub mod untimed;
pub mod xds;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use pki::Pki;
pub use plain_http::http_request;
pub use process::{CpuHog, stop_when_this_process_ends};
pub use redis_servers::{
    RedisCluster, RedisServer, older_redis_server_binary, redis_pki, redis_server_binary,
    string_args, tls_cli_args, tls_server_args,
};
pub use rls::{alice, ask, avoid_window_edge, descriptor, fixed_window_check, request};
pub use sluice_process::{
    Sluice, StoreKind, config_dir, for_each_store, refused_start, sluice_binary, sluice_command,
};

/// A loopback port free when asked (a process that binds it later may still lose a race, which
/// the launchers retry).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The workspace's root folder: the deploy files, docs and sources the tests read are found
/// from it.
pub fn workspace_root() -> PathBuf {
    // crates/sluice-test-kit, two folders down; taken apart rather than joined with `..`, so
    // that paths made from it compare with Cargo's own (`CARGO_MANIFEST_DIR`).
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Where the tests' tools live that are installed rather than built (the chart's virtualenv;
/// scripts/test.sh also keeps Envoy's and the Redis matrix's there): `SLUICE_TEST_TOOLS`, else
/// `~/.cache/sluice-test`. Outside the checkout, so a fresh clone does not install them again.
pub fn test_tools() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_TEST_TOOLS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").expect("HOME or SLUICE_TEST_TOOLS is set");
    Path::new(&home).join(".cache/sluice-test")
}

/// Polls `check` every 20 ms until it holds; panics naming `what` after 30 s.
pub fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not reached in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A scratch directory path that is kept for the test's duration.
pub fn temp_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// The name libtest gives test `name` of the module whose `module_path!()` is `module`: the path
/// without the crate's own name (`limiter_api::name` in the `it` binary). For a test that runs
/// its own binary again filtered to one test (`--exact`), which must name it in full.
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, inside)) => format!("{inside}::{name}"),
        None => name.to_string(),
    }
}
