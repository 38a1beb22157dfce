//! Every environment variable envoyproxy/ratelimit reads (its `src/settings/settings.go`), and
//! what Sluice does with it: the one table both `serve` and `check-config` consult, so that no
//! upstream variable is ever silently ignored. A variable that is set but not implemented is
//! reported as "not supported: NAME", with the reason.

/// What Sluice does with one of upstream's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Read by [`super::Settings::from_vars`], with upstream's meaning.
    Implemented,
    /// What upstream turns on with it (`true`) Sluice always does; any other value is reported.
    AlwaysOn(&'static str),
    /// Not implemented; reported when set, with the reason.
    NotSupported(&'static str),
}

use Support::{AlwaysOn, Implemented, NotSupported};

const MEMCACHE: Support = NotSupported("memcache is not supported; use BACKEND_TYPE=redis");
const PIPELINING: Support = NotSupported(
    "the decisions of concurrent requests always leave in one pipelined write, without a timer",
);
const POOL_EMPTY: Support =
    NotSupported("a call waits for a pooled connection until REDIS_TIMEOUT, as upstream's WAIT");
const CLUSTER_PARALLELISM: Support =
    NotSupported("the calls to the slots of a Redis Cluster always run concurrently");

/// Upstream's variables, in the order of its `settings.go`, then those of newer releases.
pub const UPSTREAM_VARIABLES: &[(&str, Support)] = &[
    ("HOST", Implemented),
    ("PORT", Implemented),
    ("DEBUG_HOST", Implemented),
    ("DEBUG_PORT", Implemented),
    ("GRPC_UDS", Implemented),
    ("GRPC_HOST", Implemented),
    ("GRPC_PORT", Implemented),
    ("GRPC_MAX_CONNECTION_AGE", Implemented),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Implemented),
    ("GRPC_SERVER_USE_TLS", Implemented),
    ("GRPC_SERVER_TLS_CERT", Implemented),
    ("GRPC_SERVER_TLS_KEY", Implemented),
    ("GRPC_CLIENT_TLS_CACERT", Implemented),
    ("GRPC_CLIENT_TLS_SAN", Implemented),
    ("LOG_LEVEL", Implemented),
    ("LOG_FORMAT", Implemented),
    ("CONFIG_TYPE", Implemented),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Implemented),
    ("CONFIG_GRPC_XDS_NODE_ID", Implemented),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Implemented),
    ("CONFIG_GRPC_XDS_SERVER_URL", Implemented),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Implemented),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Implemented),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Implemented),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Implemented),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Implemented),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Implemented),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Implemented),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Implemented),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Implemented),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Implemented),
    ("XDS_CLIENT_BACKOFF_JITTER", Implemented),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Implemented),
    ("USE_DOG_STATSD", Implemented),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        NotSupported("DogStatsD stats keep upstream's names, with EXTRA_TAGS as tags"),
    ),
    ("USE_STATSD", Implemented),
    ("STATSD_HOST", Implemented),
    ("STATSD_PORT", Implemented),
    ("EXTRA_TAGS", Implemented),
    ("STATS_FLUSH_INTERVAL", Implemented),
    ("DISABLE_STATS", Implemented),
    ("USE_PROMETHEUS", Implemented),
    ("PROMETHEUS_ADDR", Implemented),
    ("PROMETHEUS_PATH", Implemented),
    ("PROMETHEUS_MAPPER_YAML", Implemented),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Implemented),
    ("RUNTIME_ROOT", Implemented),
    ("RUNTIME_SUBDIRECTORY", Implemented),
    ("RUNTIME_APPDIRECTORY", Implemented),
    ("RUNTIME_IGNOREDOTFILES", Implemented),
    (
        "RUNTIME_WATCH_ROOT",
        NotSupported(
            "the config directory is polled, which sees both a swap of the root's symlink and \
             changes inside the directory (CONFIG_RELOAD_INTERVAL)",
        ),
    ),
    ("EXPIRATION_JITTER_MAX_SECONDS", Implemented),
    ("LOCAL_CACHE_SIZE_IN_BYTES", Implemented),
    ("NEAR_LIMIT_RATIO", Implemented),
    ("CACHE_KEY_PREFIX", Implemented),
    ("BACKEND_TYPE", Implemented),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Implemented),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Implemented),
    ("LIMIT_LIMIT_HEADER", Implemented),
    ("LIMIT_REMAINING_HEADER", Implemented),
    ("LIMIT_RESET_HEADER", Implemented),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Implemented),
    ("REDIS_SOCKET_TYPE", Implemented),
    ("REDIS_TYPE", Implemented),
    ("REDIS_URL", Implemented),
    ("REDIS_POOL_SIZE", Implemented),
    ("REDIS_AUTH", Implemented),
    ("REDIS_TLS", Implemented),
    ("REDIS_TLS_CLIENT_CERT", Implemented),
    ("REDIS_TLS_CLIENT_KEY", Implemented),
    ("REDIS_TLS_CACERT", Implemented),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Implemented),
    ("REDIS_PIPELINE_WINDOW", PIPELINING),
    ("REDIS_PIPELINE_LIMIT", PIPELINING),
    ("REDIS_USE_EXPLICIT_PIPELINE", PIPELINING),
    ("REDIS_PERSECOND", Implemented),
    ("REDIS_PERSECOND_SOCKET_TYPE", Implemented),
    ("REDIS_PERSECOND_TYPE", Implemented),
    ("REDIS_PERSECOND_URL", Implemented),
    ("REDIS_PERSECOND_POOL_SIZE", Implemented),
    ("REDIS_PERSECOND_AUTH", Implemented),
    ("REDIS_PERSECOND_TLS", Implemented),
    ("REDIS_SENTINEL_AUTH", Implemented),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Implemented),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", PIPELINING),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", PIPELINING),
    ("REDIS_PERSECOND_USE_EXPLICIT_PIPELINE", PIPELINING),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Implemented),
    ("REDIS_TIMEOUT", Implemented),
    ("REDIS_PERSECOND_TIMEOUT", Implemented),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", POOL_EMPTY),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", POOL_EMPTY),
    ("MEMCACHE_HOST_PORT", MEMCACHE),
    ("MEMCACHE_MAX_IDLE_CONNS", MEMCACHE),
    ("MEMCACHE_SRV", MEMCACHE),
    ("MEMCACHE_SRV_REFRESH", MEMCACHE),
    ("MEMCACHE_TLS", MEMCACHE),
    ("MEMCACHE_TLS_CLIENT_CERT", MEMCACHE),
    ("MEMCACHE_TLS_CLIENT_KEY", MEMCACHE),
    ("MEMCACHE_TLS_CACERT", MEMCACHE),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", MEMCACHE),
    ("SHADOW_MODE", Implemented),
    ("RESPONSE_DYNAMIC_METADATA", Implemented),
    ("MERGE_DOMAIN_CONFIG", Implemented),
    ("TRACING_ENABLED", Implemented),
    ("TRACING_SERVICE_NAME", Implemented),
    ("TRACING_SERVICE_NAMESPACE", Implemented),
    ("TRACING_SERVICE_INSTANCE_ID", Implemented),
    ("TRACING_EXPORTER_PROTOCOL", Implemented),
    ("TRACING_SAMPLING_RATE", Implemented),
    // Newer releases than the settings.go above.
    ("QUOTA_MODE", Implemented),
    ("REDIS_STARTUP_INITIAL_INTERVAL", Implemented),
    ("REDIS_STARTUP_MAX_INTERVAL", Implemented),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", Implemented),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", CLUSTER_PARALLELISM),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        CLUSTER_PARALLELISM,
    ),
    ("REDIS_AUTH_FILE", Implemented),
    ("REDIS_PERSECOND_AUTH_FILE", Implemented),
    (
        "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
        AlwaysOn("a connection that answers READONLY is always replaced"),
    ),
];

/// Sluice's own Redis variables: like upstream's `REDIS_*`, setting one means Redis.
const OWN_REDIS_VARIABLES: &[&str] = &["REDIS_STARTUP_DEGRADED"];

/// The first Redis variable that is set, in table order: with `BACKEND_TYPE` unset it selects
/// the Redis store (upstream's default), as in upstream's usual environment
/// (`REDIS_SOCKET_TYPE=tcp REDIS_URL=redis:6379`).
pub fn redis_variable_set(is_set: impl Fn(&str) -> bool) -> Option<&'static str> {
    UPSTREAM_VARIABLES
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| name.starts_with("REDIS_"))
        .chain(OWN_REDIS_VARIABLES.iter().copied())
        .find(|name| is_set(name))
}

/// What is worth telling about the upstream variables that are set: one line each, naming the
/// variable.
pub fn notices(value_of: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut notices = Vec::new();
    for (name, support) in UPSTREAM_VARIABLES {
        let Some(value) = value_of(name) else {
            continue;
        };
        let truthy = matches!(value.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True");
        match support {
            Implemented => {}
            AlwaysOn(_) if truthy => {}
            AlwaysOn(why) | NotSupported(why) => {
                notices.push(format!("not supported: {name} ({why})"));
            }
        }
    }
    notices
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::sync::Mutex;

    use super::*;
    use crate::settings::{Env, Settings};

    /// Every `envconfig:"…"` name in upstream's `src/settings/settings.go` (envoyproxy/ratelimit,
    /// 2026), and those newer releases read (`REDIS_STARTUP_*`, `QUOTA_MODE`, …). A name added
    /// upstream goes here and into the table.
    const UPSTREAM_SETTINGS_GO: &[&str] = &[
        "HOST",
        "PORT",
        "DEBUG_HOST",
        "DEBUG_PORT",
        "GRPC_UDS",
        "GRPC_HOST",
        "GRPC_PORT",
        "GRPC_MAX_CONNECTION_AGE",
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "GRPC_SERVER_USE_TLS",
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_CLIENT_TLS_CACERT",
        "GRPC_CLIENT_TLS_SAN",
        "LOG_LEVEL",
        "LOG_FORMAT",
        "CONFIG_TYPE",
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "CONFIG_GRPC_XDS_NODE_ID",
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "CONFIG_GRPC_XDS_SERVER_URL",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "XDS_CLIENT_BACKOFF_JITTER",
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "USE_DOG_STATSD",
        "USE_DOG_STATSD_MOGRIFIERS",
        "USE_STATSD",
        "STATSD_HOST",
        "STATSD_PORT",
        "EXTRA_TAGS",
        "STATS_FLUSH_INTERVAL",
        "DISABLE_STATS",
        "USE_PROMETHEUS",
        "PROMETHEUS_ADDR",
        "PROMETHEUS_PATH",
        "PROMETHEUS_MAPPER_YAML",
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
        "RUNTIME_IGNOREDOTFILES",
        "RUNTIME_WATCH_ROOT",
        "EXPIRATION_JITTER_MAX_SECONDS",
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "NEAR_LIMIT_RATIO",
        "CACHE_KEY_PREFIX",
        "BACKEND_TYPE",
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "LIMIT_LIMIT_HEADER",
        "LIMIT_REMAINING_HEADER",
        "LIMIT_RESET_HEADER",
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "REDIS_SOCKET_TYPE",
        "REDIS_TYPE",
        "REDIS_URL",
        "REDIS_POOL_SIZE",
        "REDIS_AUTH",
        "REDIS_TLS",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
        "REDIS_TLS_CACERT",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_PIPELINE_WINDOW",
        "REDIS_PIPELINE_LIMIT",
        "REDIS_USE_EXPLICIT_PIPELINE",
        "REDIS_PERSECOND",
        "REDIS_PERSECOND_SOCKET_TYPE",
        "REDIS_PERSECOND_TYPE",
        "REDIS_PERSECOND_URL",
        "REDIS_PERSECOND_POOL_SIZE",
        "REDIS_PERSECOND_AUTH",
        "REDIS_PERSECOND_TLS",
        "REDIS_SENTINEL_AUTH",
        "REDIS_PERSECOND_SENTINEL_AUTH",
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "REDIS_TIMEOUT",
        "REDIS_PERSECOND_TIMEOUT",
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "MEMCACHE_HOST_PORT",
        "MEMCACHE_MAX_IDLE_CONNS",
        "MEMCACHE_SRV",
        "MEMCACHE_SRV_REFRESH",
        "MEMCACHE_TLS",
        "MEMCACHE_TLS_CLIENT_CERT",
        "MEMCACHE_TLS_CLIENT_KEY",
        "MEMCACHE_TLS_CACERT",
        "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        "SHADOW_MODE",
        "RESPONSE_DYNAMIC_METADATA",
        "MERGE_DOMAIN_CONFIG",
        "TRACING_ENABLED",
        "TRACING_SERVICE_NAME",
        "TRACING_SERVICE_NAMESPACE",
        "TRACING_SERVICE_INSTANCE_ID",
        "TRACING_EXPORTER_PROTOCOL",
        "TRACING_SAMPLING_RATE",
        // Newer releases.
        "QUOTA_MODE",
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_AUTH_FILE",
        "REDIS_PERSECOND_AUTH_FILE",
        "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
    ];

    #[test]
    fn every_upstream_variable_is_in_the_table_once() {
        let table: Vec<&str> = UPSTREAM_VARIABLES.iter().map(|(n, _)| *n).collect();
        let unique: BTreeSet<&str> = table.iter().copied().collect();
        assert_eq!(unique.len(), table.len(), "a name appears twice");
        let missing: Vec<&&str> = UPSTREAM_SETTINGS_GO
            .iter()
            .filter(|n| !unique.contains(**n))
            .collect();
        assert!(missing.is_empty(), "not in the table: {missing:?}");
    }

    /// "Implemented" is true: `Settings::from_vars` asks for each such variable, given values
    /// that reach every branch.
    #[test]
    fn implemented_variables_are_read() {
        let values: HashMap<&str, &str> = [
            ("BACKEND_TYPE", "redis"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_TLS", "true"),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "h:1"),
            ("REDIS_PERSECOND_URL", "h:2"),
            ("USE_PROMETHEUS", "true"),
            // One stats sink at a time; statsd is read whatever its value.
            ("USE_STATSD", "false"),
            ("TRACING_ENABLED", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ]
        .into_iter()
        .collect();
        let asked = Mutex::new(BTreeSet::new());
        let env = Env(|name: &str| {
            asked.lock().unwrap().insert(name.to_string());
            values.get(name).map(|v| v.to_string())
        });
        Settings::from_vars(&env).unwrap();
        // TLS on the gRPC port is read on a branch of its own.
        let tls = Env(|name: &str| {
            asked.lock().unwrap().insert(name.to_string());
            match name {
                "GRPC_SERVER_USE_TLS" => Some("true".into()),
                "GRPC_SERVER_TLS_CERT" | "GRPC_SERVER_TLS_KEY" => Some("/x".into()),
                _ => None,
            }
        });
        Settings::from_vars(&tls).unwrap();
        let asked = asked.into_inner().unwrap();
        let unread: Vec<&str> = UPSTREAM_VARIABLES
            .iter()
            .filter(|(name, support)| *support == Implemented && !asked.contains(*name))
            .map(|(name, _)| *name)
            .collect();
        assert!(
            unread.is_empty(),
            "marked Implemented, never read: {unread:?}"
        );
    }

    #[test]
    fn set_variables_that_are_not_implemented_are_named() {
        let set: HashMap<&str, &str> = [
            ("REDIS_PIPELINE_WINDOW", "150us"),
            ("MEMCACHE_HOST_PORT", "memcached:11211"),
            ("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", "true"),
            ("SHADOW_MODE", "true"),
        ]
        .into_iter()
        .collect();
        let notices = notices(|n| set.get(n).map(|v| v.to_string()));
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(
            notices[0].starts_with("not supported: REDIS_PIPELINE_WINDOW ("),
            "{notices:?}"
        );
        assert!(
            notices[1].starts_with("not supported: MEMCACHE_HOST_PORT "),
            "{notices:?}"
        );
        let off = notices_of(&[("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", "false")]);
        assert!(off[0].starts_with("not supported: REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR"));
    }

    fn notices_of(vars: &[(&str, &str)]) -> Vec<String> {
        notices(|n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        })
    }
}
