//! Service settings: upstream's environment variables, parsed and checked once at start-up.
//!
//! Names, defaults and value syntax (Go booleans and durations) follow envoyproxy/ratelimit so
//! its manifests carry over; where we chose a different default it says so here and in
//! docs/operators.md. Command-line flags (see `cli`) override the environment.
//!
//! The parsing is split by area, one file each, where a newcomer would look for a variable:
//! `listeners` (ports, TLS, connection caps and timeouts), `stores` (memory, Redis, the
//! per-second Redis, the breaker), `rls` (the decision path's options), `stats` (statsd,
//! DogStatsD, Prometheus, detailed metrics), `telemetry` (logs and traces), `native_api` (the
//! named limiters' API), `operators` (the admin API's token, the decision log), `rlqs` (the quota
//! service's bounds) and
//! `config_source` (files or xDS); `env` reads one variable, and
//! `upstream` is the table of every upstream variable. [`Settings::from_vars`] reads the areas
//! one after the other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::server::overload::MemoryCeiling;
use crate::server::tls::ServerTls;
use crate::telemetry::{LogSettings, TraceSettings};
use sluice::config::LoadOptions;
use sluice::rlqs::RlqsOptions;
use sluice::rls::RlsOptions;
use sluice::store::layers::breaker::BreakerOptions;

mod config_source;
mod env;
mod listeners;
mod native_api;
mod operators;
mod rlqs;
mod rls;
mod stats;
mod stores;
mod telemetry;
pub mod upstream;

pub use config_source::{ConfigSource, ConfigSourceSettings};
pub use env::{Env, SettingsError};
pub use listeners::PendingRequestBytes;
pub use native_api::LimiterApiSettings;
pub use operators::OperatorSettings;
pub use stats::{PrometheusListener, StatsSettings, StatsdSink};
pub use stores::{Backend, DegradedOptions, redis_url};

/// Everything `sluice serve` needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub grpc_addr: SocketAddr,
    /// `GRPC_UDS`: gRPC on this Unix socket instead of `grpc_addr`, as upstream.
    pub grpc_uds: Option<PathBuf>,
    pub http_addr: SocketAddr,
    pub config_dir: PathBuf,
    pub load: LoadOptions,
    /// `CONFIG_TYPE` and how start-up and health depend on the configuration.
    pub config_source: ConfigSourceSettings,
    pub backend: Backend,
    /// Why that store: `BACKEND_TYPE`, or the Redis variable that chose it (for the start-up log).
    pub backend_reason: String,
    /// Upstream variables that are set but not implemented, one line each
    /// ([`upstream::notices`]); `serve` logs them and `check-config` prints them.
    pub notices: Vec<String>,
    pub cache_key_prefix: String,
    pub rls: RlsOptions,
    pub log: LogSettings,
    /// `None`: traces are not exported.
    pub trace: Option<TraceSettings>,
    /// `GRPC_SERVER_USE_TLS` and its files.
    pub grpc_tls: Option<ServerTls>,
    /// `GRPC_MAX_CONNECTION_AGE` and `_GRACE`: clients reconnect after this, so load spreads
    /// over replicas that were added later.
    pub grpc_max_connection_age: Duration,
    pub grpc_max_connection_age_grace: Duration,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// `MAX_CONNECTIONS`: open connections allowed on each listener (gRPC, HTTP, metrics);
    /// 0 turns the cap off.
    pub max_connections: usize,
    /// `MAX_CONNECTIONS_PER_PEER`: open connections one peer address (an IPv6 /64) may hold on
    /// each listener, so that one peer's flood leaves room for the others; 0 turns it off.
    /// By default half of `MAX_CONNECTIONS`.
    pub max_connections_per_peer: usize,
    /// `GRPC_HANDSHAKE_TIMEOUT`: a gRPC connection's TLS handshake and HTTP/2 preface must be
    /// done this long after the accept; zero: no deadline.
    pub grpc_handshake_timeout: Duration,
    /// `GRPC_MAX_CONNECTION_IDLE`: GOAWAY to a gRPC connection after this long without a call
    /// in flight; zero: never.
    pub grpc_max_connection_idle: Duration,
    /// `HTTP_READ_HEADER_TIMEOUT`: on the HTTP/1 listeners (HTTP, debug, metrics), a request's
    /// headers must arrive within this of the server starting to wait for them, which also
    /// bounds the idle time of a keep-alive connection; zero: no deadline.
    pub http_read_header_timeout: Duration,
    /// `MAX_PENDING_REQUEST_BYTES*`: what gRPC calls still receiving their request may hold, per
    /// connection, per peer and in all (`server::budget`).
    pub pending_request_bytes: PendingRequestBytes,
    /// `OVERLOAD_MEMORY_LIMIT`: the memory ceiling of the overload manager.
    pub overload_memory_limit: MemoryCeiling,
    /// `GRPC_MIN_TIMEOUT`: a call to a service that asks the store (RLS, the native API) whose
    /// `grpc-timeout`, less the answer's margin, leaves less than this is answered
    /// `DEADLINE_EXCEEDED` without asking the store; zero: only a deadline already past is.
    pub grpc_min_timeout: Duration,
    /// Longest wait of the native API's `Acquire`/`TryAcquire`.
    pub limiter_max_wait: Duration,
    /// The native API (`sluice.v1.Limiter`); `None` unless `LIMITER_API_ENABLED=true`.
    pub limiter_api: Option<LimiterApiSettings>,
    /// The Redis store's circuit breaker.
    pub breaker: BreakerOptions,
    /// How often the config directory is checked for changes; zero turns live reload off.
    pub reload_interval: Duration,
    /// `NEAR_LIMIT_RATIO`: where the near_limit metric starts, as a share of the limit.
    pub near_limit_ratio: f64,
    /// `USE_PROMETHEUS=true`: metrics also on a listener of their own (`PROMETHEUS_ADDR`,
    /// `PROMETHEUS_PATH`), where upstream serves them; `/metrics` on the HTTP port stays.
    pub prometheus: Option<PrometheusListener>,
    /// Upstream's stats: sinks, mapping, tags, and the debug listener.
    pub stats: StatsSettings,
    /// The admin API's token and the over-limit decision log (`operators.rs`).
    pub operators: OperatorSettings,
    /// The quota service's bounds (`RLQS_*`, `rlqs.rs`).
    pub rlqs: RlqsOptions,
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Self::from_vars(&Env(|name| std::env::var(name).ok()))
    }

    /// Reads the variables area by area (each step is named after its file); the first unusable
    /// value is the error. The steps keep the order in which the variables were read before the
    /// split, as far as an area read in one step allows, so that of two bad values the same one
    /// is reported.
    pub fn from_vars<F: Fn(&str) -> Option<String>>(
        env: &Env<F>,
    ) -> Result<Settings, SettingsError> {
        let (backend, backend_reason) = stores::backend(env)?;
        let rls = rls::rls_options(env)?;
        let log = telemetry::log_settings(env)?;
        let load = config_source::load_options(env)?;
        let listeners = listeners::Listeners::from_vars(env)?;
        Ok(Settings {
            // The fields are read in the order written.
            config_source: config_source::config_source(env, &load)?,
            trace: telemetry::trace_settings(env)?,
            limiter_max_wait: native_api::limiter_max_wait(env)?,
            limiter_api: native_api::limiter_api(env)?,
            reload_interval: config_source::reload_interval(env)?,
            near_limit_ratio: stats::near_limit_ratio(env)?,
            breaker: stores::breaker(env)?,
            stats: stats::stats_settings(env)?,
            prometheus: stats::prometheus_listener(env)?,
            operators: operators::operator_settings(env)?,
            rlqs: rlqs::rlqs_options(env)?,
            // These cannot fail.
            config_dir: config_source::config_dir(env),
            notices: upstream::notices(|name| env.raw(name)),
            cache_key_prefix: stores::cache_key_prefix(env),
            load,
            backend,
            backend_reason,
            rls,
            log,
            grpc_addr: listeners.grpc_addr,
            grpc_uds: listeners.grpc_uds,
            http_addr: listeners.http_addr,
            grpc_tls: listeners.grpc_tls,
            grpc_max_connection_age: listeners.grpc_max_connection_age,
            grpc_max_connection_age_grace: listeners.grpc_max_connection_age_grace,
            shutdown_grace: listeners.shutdown_grace,
            max_connections: listeners.max_connections,
            max_connections_per_peer: listeners.max_connections_per_peer,
            grpc_handshake_timeout: listeners.grpc_handshake_timeout,
            grpc_max_connection_idle: listeners.grpc_max_connection_idle,
            http_read_header_timeout: listeners.http_read_header_timeout,
            pending_request_bytes: listeners.pending_request_bytes,
            overload_memory_limit: listeners.overload_memory_limit,
            grpc_min_timeout: listeners.grpc_min_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use sluice::store::redis::Target;

    pub(super) fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(&Env(move |name| map.get(name).cloned()))
    }

    #[test]
    fn defaults_match_upstream() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(
            s.config_dir,
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert_eq!(s.backend.name(), "memory");
        assert!(s.rls.response_headers.is_none());
    }

    #[test]
    fn upstream_variables_are_read() {
        let s = settings(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_PORT", "9000"),
            ("HOST", "127.0.0.1"),
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.local:6379"),
            ("REDIS_AUTH", "user:pw"),
            ("REDIS_TIMEOUT", "250ms"),
            ("REDIS_POOL_SIZE", "4"),
            ("SHADOW_MODE", "True"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("LOG_FORMAT", "json"),
        ])
        .unwrap();
        assert_eq!(s.config_dir, PathBuf::from("/data/ratelimit/config"));
        assert_eq!(s.grpc_addr.port(), 9000);
        assert_eq!(s.http_addr, "127.0.0.1:8080".parse().unwrap());
        let Backend::Redis { options, .. } = &s.backend else {
            panic!("not redis")
        };
        assert_eq!(
            options.target,
            Target::Single("redis://redis.local:6379".into())
        );
        assert_eq!(options.timeout, Duration::from_millis(250));
        assert_eq!(options.pool_size, 4);
        assert_eq!(
            options.auth.as_ref().unwrap().username.as_deref(),
            Some("user")
        );
        assert!(s.rls.shadow_mode);
        assert_eq!(s.rls.response_headers.as_ref().unwrap().reset, "X-Reset");
        assert!(s.log.json);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = settings(&[("SHADOW_MODE", "maybe")]).unwrap_err();
        assert_eq!(err.variable, "SHADOW_MODE");
        let err = settings(&[("GRPC_PORT", "http")]).unwrap_err();
        assert_eq!(err.variable, "GRPC_PORT");
        let err = settings(&[("BACKEND_TYPE", "memcache")]).unwrap_err();
        assert!(err.reason.contains("not supported"));
        let err = settings(&[("BACKEND_TYPE", "redis"), ("REDIS_TIMEOUT", "soon")]).unwrap_err();
        assert_eq!(err.variable, "REDIS_TIMEOUT");
        let err = settings(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "udp"),
            ("REDIS_URL", "redis://u:secret@h:1"),
        ]);
        // A full URL is taken as is, so this one loads; a bad socket type with a bare address
        // fails without echoing credentials.
        assert!(err.is_ok());
        let err = settings(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "udp"),
            ("REDIS_URL", "u:secret@h:1"),
        ])
        .unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn local_share_is_a_failure_policy_with_a_replica_count() {
        let s = settings(&[
            ("REDIS_URL", "redis.local:6379"),
            ("FAILURE_POLICY", "local_share"),
            ("DEGRADED_REPLICAS", "3"),
            ("MEMORY_MAX_COUNTERS", "5000"),
        ])
        .unwrap();
        assert_eq!(s.rls.failure_policy, sluice::rls::FailurePolicy::LocalShare);
        let Backend::Redis { degraded, .. } = &s.backend else {
            panic!("not redis")
        };
        assert_eq!(degraded.replicas, Some(3));
        assert_eq!(degraded.memory.max_counters, 5000);
        let learnt = settings(&[("REDIS_URL", "redis.local:6379")]).unwrap();
        let Backend::Redis { degraded, .. } = &learnt.backend else {
            panic!("not redis")
        };
        assert_eq!(degraded.replicas, None, "unset: learnt from Redis");
        assert_eq!(
            learnt.rls.failure_policy,
            sluice::rls::FailurePolicy::FailClosed,
            "not the default"
        );
        let err = settings(&[("FAILURE_POLICY", "degrade")]).unwrap_err();
        assert_eq!(err.variable, "FAILURE_POLICY");
        assert!(err.reason.contains("local_share"), "{err}");
        let err = settings(&[("REDIS_URL", "h:1"), ("DEGRADED_REPLICAS", "three")]).unwrap_err();
        assert_eq!(err.variable, "DEGRADED_REPLICAS");
    }
}
