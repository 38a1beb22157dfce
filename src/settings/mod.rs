//! Service settings: upstream's environment variables, parsed and checked once at start-up.
//!
//! Names, defaults and value syntax (Go booleans and durations) follow envoyproxy/ratelimit so
//! its manifests carry over; where we chose a different default it says so here and in the
//! README. Command-line flags (see `cli`) override the environment.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::config::LoadOptions;
use crate::named::Bounds;
use crate::rls::{FailurePolicy, HeaderNames, InputLimits, RlsOptions};
use crate::server::tls::ServerTls;
use crate::store::breaker::BreakerOptions;
use crate::store::redis::{RedisAuth, StartupRetry, Target, redact_url};
use crate::store::{MemoryStoreOptions, RedisOptions, TlsFiles};
use crate::telemetry::{LogSettings, OtlpProtocol, TraceSettings};
use crate::util::parse_go_duration;
use crate::xds::{BackoffOptions, XdsOptions, XdsTls};

pub mod upstream;

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
}

/// Upstream's stats settings (`stats_settings`).
#[derive(Clone, Debug)]
pub struct StatsSettings {
    /// `DISABLE_STATS=true` turns every sink of upstream's stats off.
    pub enabled: bool,
    /// `USE_STATSD` (TCP) or `USE_DOG_STATSD` (UDP) to `STATSD_HOST:STATSD_PORT`.
    pub statsd: Option<StatsdSink>,
    pub flush_interval: Duration,
    /// `PROMETHEUS_MAPPER_YAML`: statsd_exporter mapping rules replacing upstream's default.
    pub mapper_file: Option<PathBuf>,
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: upstream's legacy response-time series,
    /// milliseconds under the `_seconds` name.
    pub response_time_in_ms: bool,
    /// `EXTRA_TAGS` (`k:v,k2:v2`), on every stat.
    pub extra_tags: Vec<(String, String)>,
    /// `DEBUG_HOST:DEBUG_PORT`: `/`, `/rlconfig`, `/stats`.
    pub debug_addr: SocketAddr,
    /// `MAX_DETAILED_METRIC_SERIES` (Sluice's): stat series named after request values
    /// (`detailed_metric`, `value_to_metric`, overrides) at most; 0: no cap.
    pub max_detailed_series: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsdSink {
    /// `host:port`.
    pub addr: String,
    /// DogStatsD (tags as `|#k:v`, over UDP) rather than plain statsd over TCP.
    pub dog: bool,
}

/// Where the rate limit configuration comes from, and what start-up and health make of it.
#[derive(Debug, Clone)]
pub struct ConfigSourceSettings {
    pub source: ConfigSource,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve at once, answering "no rate limit
    /// configuration loaded" until a configuration arrives (false: wait for it before serving).
    pub force_start: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: health also needs a configuration with at
    /// least one domain.
    pub healthy_needs_a_domain: bool,
}

/// `CONFIG_TYPE`.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// `FILE`: the directory of `RUNTIME_ROOT` etc., watched for changes.
    Files,
    /// `GRPC_XDS_SOTW`: pushed by an xDS server; files are not read.
    Xds(Box<XdsOptions>),
}

/// Where and for whom the native API is served. It is off by default: it lets any caller create
/// limiters and spend their permits, which an Envoy-only deployment never needs.
#[derive(Clone)]
pub struct LimiterApiSettings {
    /// `LIMITER_GRPC_PORT` (on `GRPC_HOST`): a listener of its own, so the API can be kept off
    /// the port Envoy reaches; `None` serves it on the gRPC port.
    pub addr: Option<SocketAddr>,
    /// `LIMITER_API_TOKEN`: callers must send `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// `LIMITER_MAX_COUNT`, `LIMITER_IDLE_EXPIRY` and `LIMITER_MAX_CLIENTS`.
    pub bounds: Bounds,
}

impl std::fmt::Debug for LimiterApiSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterApiSettings")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("bounds", &self.bounds)
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct PrometheusListener {
    pub addr: SocketAddr,
    pub path: String,
}

#[derive(Debug, Clone)]
pub enum Backend {
    Memory(MemoryStoreOptions),
    Redis {
        options: Box<RedisOptions>,
        /// `REDIS_PERSECOND=true`: limits whose unit is the second go to this Redis, configured
        /// by the `REDIS_PERSECOND_*` twins of the `REDIS_*` variables.
        per_second: Option<Box<RedisOptions>>,
        /// `REDIS_STARTUP_INITIAL_INTERVAL`, `REDIS_STARTUP_MAX_INTERVAL` and
        /// `REDIS_STARTUP_MAX_ELAPSED_TIME` (0: wait forever), upstream's start-up backoff.
        startup: StartupRetry,
        /// `REDIS_STARTUP_DEGRADED`: start anyway when Redis is not ready by then (health
        /// NOT_SERVING, requests follow the failure policy until it answers).
        start_degraded: bool,
        /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`: health follows Redis while serving (NOT_SERVING
        /// while a Redis store's circuit breaker is open). Off, as upstream: once Redis has
        /// answered, health no longer depends on it.
        health_follows_redis: bool,
    },
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis { .. } => "redis",
        }
    }
}

/// A variable with a value we cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {reason}")]
pub struct SettingsError {
    pub variable: String,
    /// Shown as given, except for secrets, which are never shown.
    pub value: String,
    pub reason: String,
}

/// Reads variables through `get` (the process environment in production, a map in tests).
pub struct Env<F: Fn(&str) -> Option<String>>(pub F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn raw(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.is_empty())
    }

    fn string(&self, name: &str, default: &str) -> String {
        self.raw(name).unwrap_or_else(|| default.to_string())
    }

    fn error(&self, name: &str, reason: impl Into<String>) -> SettingsError {
        let value = self.raw(name).unwrap_or_default();
        let value = if name.ends_with("_AUTH") || name.ends_with("_TOKEN") {
            "<redacted>".to_string()
        } else if name.ends_with("_URL") {
            redact_url(&value)
        } else {
            value
        };
        SettingsError {
            variable: name.to_string(),
            value,
            reason: reason.into(),
        }
    }

    /// Go's `strconv.ParseBool` spellings.
    fn bool(&self, name: &str, default: bool) -> Result<bool, SettingsError> {
        match self.raw(name).as_deref() {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(_) => Err(self.error(name, "expected true or false")),
        }
    }

    fn number<T: FromStr>(&self, name: &str, default: T) -> Result<T, SettingsError> {
        match self.raw(name) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| self.error(name, "expected a whole number")),
        }
    }

    fn duration(&self, name: &str, default: Duration) -> Result<Duration, SettingsError> {
        match self.raw(name) {
            None => Ok(default),
            Some(v) => parse_go_duration(&v).map_err(|reason| self.error(name, reason)),
        }
    }

    /// Go's listen address: `host:port`, or `:port` for every interface.
    fn listen_addr(&self, name: &str, default: &str) -> Result<SocketAddr, SettingsError> {
        let text = self.string(name, default);
        let (host, port) = text
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| self.error(name, "expected host:port or :port"))?;
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        listen_host(host, port).map_err(|reason| self.error(name, reason))
    }

    fn addr(&self, host_var: &str, port_var: &str, port: u16) -> Result<SocketAddr, SettingsError> {
        let host = self.string(host_var, "0.0.0.0");
        let port = self.number(port_var, port)?;
        listen_host(&host, port).map_err(|reason| self.error(host_var, reason))
    }
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Self::from_vars(&Env(|name| std::env::var(name).ok()))
    }

    pub fn from_vars<F: Fn(&str) -> Option<String>>(
        env: &Env<F>,
    ) -> Result<Settings, SettingsError> {
        let mut config_dir = PathBuf::from(env.string("RUNTIME_ROOT", "/srv/runtime_data/current"));
        if let Some(sub) = env.raw("RUNTIME_SUBDIRECTORY") {
            config_dir.push(sub);
        }
        config_dir.push(env.string("RUNTIME_APPDIRECTORY", "config"));

        let (backend_type, backend_reason) = backend_type(env);
        let backend = match backend_type.as_str() {
            "memory" => Backend::Memory(MemoryStoreOptions {
                max_counters: env.number("MEMORY_MAX_COUNTERS", 1_000_000usize)?,
                max_limiter_states: env.number(
                    "MEMORY_MAX_LIMITER_STATES",
                    MemoryStoreOptions::default().max_limiter_states,
                )?,
                ..MemoryStoreOptions::default()
            }),
            "redis" => redis_backend(env)?,
            "memcache" => {
                return Err(env.error(
                    "BACKEND_TYPE",
                    "memcache is not supported; use redis (or memory for one replica)",
                ));
            }
            _ => return Err(env.error("BACKEND_TYPE", "expected memory or redis")),
        };

        let response_headers =
            env.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)?
                .then(|| HeaderNames {
                    limit: env.string("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                    remaining: env.string("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                    reset: env.string("LIMIT_RESET_HEADER", "RateLimit-Reset"),
                });
        let defaults = InputLimits::default();
        let input_limits = InputLimits {
            max_descriptors: env.number("MAX_DESCRIPTORS_PER_REQUEST", defaults.max_descriptors)?,
            max_entries: env.number("MAX_ENTRIES_PER_DESCRIPTOR", defaults.max_entries)?,
            max_domain_bytes: env.number("MAX_DOMAIN_BYTES", defaults.max_domain_bytes)?,
            max_key_bytes: env.number("MAX_DESCRIPTOR_KEY_BYTES", defaults.max_key_bytes)?,
            max_value_bytes: env.number("MAX_DESCRIPTOR_VALUE_BYTES", defaults.max_value_bytes)?,
        };

        let log_format = env.string("LOG_FORMAT", "text").to_ascii_lowercase();
        if log_format != "text" && log_format != "json" {
            return Err(env.error("LOG_FORMAT", "expected text or json"));
        }

        let load = LoadOptions {
            merge_domains: env.bool("MERGE_DOMAIN_CONFIG", false)?,
            ignore_dotfiles: env.bool("RUNTIME_IGNOREDOTFILES", false)?,
        };
        Ok(Settings {
            grpc_addr: env.addr("GRPC_HOST", "GRPC_PORT", 8081)?,
            grpc_uds: grpc_uds(env)?,
            backend_reason,
            notices: upstream::notices(|name| env.raw(name)),
            http_addr: env.addr("HOST", "PORT", 8080)?,
            config_dir,
            config_source: config_source(env, &load)?,
            load,
            backend,
            cache_key_prefix: env.string("CACHE_KEY_PREFIX", ""),
            rls: RlsOptions {
                shadow_mode: env.bool("SHADOW_MODE", false)?,
                quota_mode: env.bool("QUOTA_MODE", false)?,
                response_headers,
                draft_headers: env.bool("LIMIT_RESPONSE_HEADERS_DRAFT", false)?,
                dynamic_metadata: env.bool("RESPONSE_DYNAMIC_METADATA", false)?,
                input_limits,
                failure_policy: match env.string("FAILURE_POLICY", "fail_closed").as_str() {
                    "fail_closed" => FailurePolicy::FailClosed,
                    "fail_open" => FailurePolicy::FailOpen,
                    _ => {
                        return Err(
                            env.error("FAILURE_POLICY", "expected fail_closed or fail_open")
                        );
                    }
                },
                local_cache_bytes: env.number("LOCAL_CACHE_SIZE_IN_BYTES", 0usize)?,
                stop_increment_when_over: env
                    .bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?,
            },
            log: LogSettings {
                // Upstream defaults to WARN; we log start-up and config events at INFO.
                level: env.string("LOG_LEVEL", "info").to_ascii_lowercase(),
                json: log_format == "json",
            },
            trace: trace_settings(env)?,
            grpc_tls: grpc_tls(env)?,
            grpc_max_connection_age: env
                .duration("GRPC_MAX_CONNECTION_AGE", Duration::from_secs(24 * 3600))?,
            grpc_max_connection_age_grace: env
                .duration("GRPC_MAX_CONNECTION_AGE_GRACE", Duration::from_secs(3600))?,
            shutdown_grace: env.duration("SHUTDOWN_GRACE_PERIOD", Duration::from_secs(10))?,
            // Envoy opens a few connections per worker thread; thousands from one client are
            // a leak or an attack. 10 000 is about 140 MiB of connection state.
            max_connections: env.number("MAX_CONNECTIONS", 10_000)?,
            // Half of MAX_CONNECTIONS: one peer can never take every slot, and where every
            // client shares one address (an Istio sidecar's 127.0.0.6) half is still far more
            // than Envoys need. An explicit value wins, 0 included.
            max_connections_per_peer: env.number(
                "MAX_CONNECTIONS_PER_PEER",
                env.number("MAX_CONNECTIONS", 10_000usize)?.div_ceil(2),
            )?,
            // Ten seconds is hundreds of round trips, even across regions; Envoy finishes its
            // handshake and preface in one or two.
            grpc_handshake_timeout: env
                .duration("GRPC_HANDSHAKE_TIMEOUT", Duration::from_secs(10))?,
            // Envoy keeps its connections to the RLS open while idle; a GOAWAY after ten quiet
            // minutes costs it one reconnect, and gives the slots of clients that went quiet back.
            grpc_max_connection_idle: env
                .duration("GRPC_MAX_CONNECTION_IDLE", Duration::from_secs(600))?,
            // Probes and scrapers send their whole request at once; a keep-alive scraper that
            // waits longer between scrapes reconnects.
            http_read_header_timeout: env
                .duration("HTTP_READ_HEADER_TIMEOUT", Duration::from_secs(10))?,
            limiter_max_wait: env.duration("LIMITER_MAX_WAIT", Duration::from_secs(30))?,
            limiter_api: limiter_api(env)?,
            reload_interval: env.duration("CONFIG_RELOAD_INTERVAL", Duration::from_secs(1))?,
            near_limit_ratio: match env.raw("NEAR_LIMIT_RATIO").map(|v| v.parse::<f64>()) {
                None => 0.8,
                Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
                Some(_) => {
                    return Err(env.error("NEAR_LIMIT_RATIO", "expected a number from 0 to 1"));
                }
            },
            breaker: BreakerOptions {
                failures_to_open: env.number("BREAKER_FAILURES", 5)?,
                cool_down: env.duration("BREAKER_COOL_DOWN", Duration::from_millis(250))?,
                ..BreakerOptions::default()
            },
            stats: stats_settings(env)?,
            prometheus: if env.bool("USE_PROMETHEUS", false)? {
                let path = env.string("PROMETHEUS_PATH", "/metrics");
                // Route syntax (`{name}`, `*`, `:`) would be read as a pattern, not a path.
                if !path.starts_with('/') || path.contains(['{', '}', '*', ':']) {
                    return Err(env.error(
                        "PROMETHEUS_PATH",
                        "expected a path starting with / and without { } * :",
                    ));
                }
                Some(PrometheusListener {
                    addr: env.listen_addr("PROMETHEUS_ADDR", ":9090")?,
                    path,
                })
            } else {
                None
            },
        })
    }
}

/// The address to listen on for `host`, an IP address or a host name, as Go's `net.Listen`
/// (upstream's) takes it: a name is resolved, and its first IPv4 address is used, else its
/// first address.
fn listen_host(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| format!("expected an IP address or a host name that resolves: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| "the host name resolves to no address".to_string())
}

/// The store `BACKEND_TYPE` names, and why. Unset, it is Redis when any Redis variable is set
/// (upstream's default store is Redis, and its usual environment sets only `REDIS_*`), and the
/// in-process store otherwise, so `sluice serve` runs with nothing else installed.
fn backend_type<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> (String, String) {
    if let Some(kind) = env.raw("BACKEND_TYPE") {
        return (kind.to_ascii_lowercase(), format!("BACKEND_TYPE={kind}"));
    }
    match upstream::redis_variable_set(|name| env.raw(name).is_some()) {
        Some(name) => (
            "redis".into(),
            format!("BACKEND_TYPE is unset and {name} is set (upstream's default store is Redis)"),
        ),
        None => (
            "memory".into(),
            "BACKEND_TYPE is unset and no REDIS_* variable is set".into(),
        ),
    }
}

/// `GRPC_UDS`: a Unix socket path for the gRPC listener, in place of `GRPC_HOST:GRPC_PORT`.
fn grpc_uds<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Option<PathBuf>, SettingsError> {
    let Some(path) = env.raw("GRPC_UDS") else {
        return Ok(None);
    };
    if env.bool("GRPC_SERVER_USE_TLS", false)? {
        return Err(env.error(
            "GRPC_UDS",
            "TLS on a Unix socket is not supported (unset GRPC_SERVER_USE_TLS or GRPC_UDS)",
        ));
    }
    Ok(Some(PathBuf::from(path)))
}

/// `CONFIG_TYPE`, the xDS client's `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables, and the
/// start-up and health switches that apply to either source.
fn config_source<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    load: &LoadOptions,
) -> Result<ConfigSourceSettings, SettingsError> {
    // Upstream compares the exact spelling.
    let source = match env.string("CONFIG_TYPE", "FILE").as_str() {
        "FILE" => ConfigSource::Files,
        "GRPC_XDS_SOTW" => ConfigSource::Xds(Box::new(xds_options(env, load)?)),
        _ => return Err(env.error("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
    };
    Ok(ConfigSourceSettings {
        source,
        force_start: env.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
        healthy_needs_a_domain: env.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
    })
}

fn xds_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    load: &LoadOptions,
) -> Result<XdsOptions, SettingsError> {
    // Upstream drops metadata parts without `=`.
    let node_metadata = env
        .string("CONFIG_GRPC_XDS_NODE_METADATA", "")
        .split(',')
        .filter_map(|part| part.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    // Upstream reads a Go map (`k:v,k2:v2`); a part without `:` is an error there as well.
    let headers_var = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    let headers = env
        .string(headers_var, "")
        .split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| match part.split_once(':') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            // The value may hold credentials: never shown.
            _ => Err(SettingsError {
                variable: headers_var.to_string(),
                value: "<redacted>".to_string(),
                reason: "expected name:value[,name:value…]".to_string(),
            }),
        })
        .collect::<Result<_, _>>()?;
    // Accepted for compatibility; upstream's value has no effect either.
    env.duration(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        Duration::from_secs(3),
    )?;
    let tls = if env.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        let cert = env.raw("CONFIG_GRPC_XDS_CLIENT_TLS_CERT");
        let key = env.raw("CONFIG_GRPC_XDS_CLIENT_TLS_KEY");
        let cert_and_key = match (cert, key) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(env.error(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                    "must be set with CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                ));
            }
            (None, Some(_)) => {
                return Err(env.error(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                    "must be set with CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                ));
            }
        };
        Some(XdsTls {
            ca: env
                .raw("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
                .map(PathBuf::from),
            cert_and_key,
            server_name: env.raw("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
        })
    } else {
        None
    };
    let defaults = BackoffOptions::default();
    let random_var = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR";
    let random_factor = match env.raw(random_var).map(|v| v.trim().parse::<f64>()) {
        None => defaults.random_factor,
        Some(Ok(f)) if (0.0..=1.0).contains(&f) => f,
        Some(_) => return Err(env.error(random_var, "expected a number from 0 to 1")),
    };
    let backoff = BackoffOptions {
        initial: env.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", defaults.initial)?,
        max: env.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", defaults.max)?,
        random_factor,
        jitter: env.bool("XDS_CLIENT_BACKOFF_JITTER", defaults.jitter)?,
    };
    if backoff.initial.is_zero() || backoff.max < backoff.initial {
        return Err(env.error(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            "the backoff needs 0 < XDS_CLIENT_BACKOFF_INITIAL_INTERVAL <= XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        ));
    }
    let max_message_bytes = match env.number("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0usize)? {
        0 => None,
        n => Some(n),
    };
    Ok(XdsOptions {
        server_url: env.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
        node_id: env.string("CONFIG_GRPC_XDS_NODE_ID", "default"),
        node_metadata,
        headers,
        tls,
        backoff,
        max_message_bytes,
        load: load.clone(),
    })
}

/// The options of one Redis deployment from the variables that start with `prefix` (`REDIS_`,
/// or `REDIS_PERSECOND_` for the per-second Redis).
fn redis_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    prefix: &str,
) -> Result<RedisOptions, SettingsError> {
    let var = |name: &str| format!("{prefix}{name}");
    let kind = env.string(&var("TYPE"), "single").to_ascii_lowercase();
    if !["single", "cluster", "sentinel"].contains(&kind.as_str()) {
        return Err(env.error(&var("TYPE"), "expected single, cluster or sentinel"));
    }
    let tls = env.bool(&var("TLS"), false)?;
    if env.bool(&var("TLS_SKIP_HOSTNAME_VERIFICATION"), false)? {
        return Err(env.error(
            &var("TLS_SKIP_HOSTNAME_VERIFICATION"),
            "not supported: use a certificate that names the host (REDIS_TLS_CACERT for a private CA)",
        ));
    }
    let url = env.string(&var("URL"), "/var/run/nutcracker/ratelimit.sock");
    let with_tls = |url: String| match url.strip_prefix("redis://") {
        Some(rest) if tls => format!("rediss://{rest}"),
        _ => url,
    };
    let target = if kind == "sentinel" {
        // Upstream's form: the master's name, then the sentinels' host:port.
        let mut items = url.split(',').map(str::trim).filter(|i| !i.is_empty());
        let master = items.next().unwrap_or_default().to_string();
        let sentinels = items
            .map(|n| redis_url(n, "tcp"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| env.error(&var("URL"), reason))?;
        if sentinels.is_empty() {
            return Err(env.error(&var("URL"), "expected master-name,host:port[,host:port…]"));
        }
        if tls {
            return Err(env.error(&var("TLS"), "TLS through sentinel is not supported"));
        }
        Target::Sentinel { master, sentinels }
    } else if kind == "cluster" || url.starts_with("redis+cluster://") {
        // Upstream's form is a comma-separated list of host:port.
        let list = url.strip_prefix("redis+cluster://").unwrap_or(&url);
        let nodes = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| redis_url(n, "tcp").map(with_tls))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| env.error(&var("URL"), reason))?;
        if nodes.is_empty() {
            return Err(env.error(&var("URL"), "a cluster needs at least one node address"));
        }
        Target::Cluster(nodes)
    } else {
        let url = redis_url(&url, &env.string(&var("SOCKET_TYPE"), "unix"))
            .map_err(|reason| env.error(&var("URL"), reason))?;
        Target::Single(with_tls(url))
    };
    let client_cert_and_key = match (
        env.raw(&var("TLS_CLIENT_CERT")),
        env.raw(&var("TLS_CLIENT_KEY")),
    ) {
        (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
        (None, None) => None,
        (Some(_), None) => {
            return Err(env.error(
                &var("TLS_CLIENT_KEY"),
                "must be set with REDIS_TLS_CLIENT_CERT",
            ));
        }
        (None, Some(_)) => {
            return Err(env.error(
                &var("TLS_CLIENT_CERT"),
                "must be set with REDIS_TLS_CLIENT_KEY",
            ));
        }
    };
    let tls_files = TlsFiles {
        ca_cert: env.raw(&var("TLS_CACERT")).map(PathBuf::from),
        client_cert_and_key,
    };
    let uses_tls = match &target {
        Target::Single(url) => url.starts_with("rediss://"),
        Target::Cluster(nodes) => nodes.iter().all(|n| n.starts_with("rediss://")),
        Target::Sentinel { .. } => false,
    };
    if tls_files != TlsFiles::default() && !uses_tls {
        return Err(env.error(
            &var("TLS"),
            "certificate files are set but TLS is off (set REDIS_TLS=true or use rediss://)",
        ));
    }
    let tls_files = shared_tls_files(env, prefix, uses_tls, tls_files)?;
    let jitter_secs: u64 = env.number("EXPIRATION_JITTER_MAX_SECONDS", 300)?;
    let auth = env.raw(&var("AUTH")).map(|a| RedisAuth::parse(&a));
    let auth_file = env.raw(&var("AUTH_FILE")).map(PathBuf::from);
    if auth.is_some() && auth_file.is_some() {
        return Err(env.error(
            &var("AUTH_FILE"),
            format!("{prefix}AUTH and {prefix}AUTH_FILE are mutually exclusive"),
        ));
    }
    Ok(RedisOptions {
        target,
        auth,
        auth_file,
        sentinel_auth: env.raw(&var("SENTINEL_AUTH")).map(|a| RedisAuth::parse(&a)),
        tls: tls_files,
        pool_size: env.number(&var("POOL_SIZE"), 10)?,
        // Envoy gives the whole rate limit call 20 ms by default; an answer after that is
        // thrown away, so the store's deadline sits below it (upstream: 10 s).
        timeout: env.duration(&var("TIMEOUT"), Duration::from_millis(15))?,
        expiration_jitter_max: Duration::from_secs(jitter_secs),
        pinned_clock: None,
    })
}

/// Upstream has one set of Redis TLS files (`REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`,
/// `REDIS_TLS_CLIENT_KEY`) for both of its Redis pools; the per-second Redis uses them too when
/// it speaks TLS and names no `REDIS_PERSECOND_TLS_*` files of its own.
fn shared_tls_files<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    prefix: &str,
    uses_tls: bool,
    own: TlsFiles,
) -> Result<TlsFiles, SettingsError> {
    if prefix == "REDIS_" || !uses_tls || own != TlsFiles::default() {
        return Ok(own);
    }
    Ok(redis_options(env, "REDIS_")?.tls)
}

fn redis_backend<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Backend, SettingsError> {
    let defaults = StartupRetry::UPSTREAM;
    let max_wait = env.duration("REDIS_STARTUP_MAX_ELAPSED_TIME", Duration::ZERO)?;
    let initial = env.duration("REDIS_STARTUP_INITIAL_INTERVAL", defaults.initial)?;
    let max_interval = env.duration("REDIS_STARTUP_MAX_INTERVAL", defaults.max_interval)?;
    if initial.is_zero() {
        return Err(env.error("REDIS_STARTUP_INITIAL_INTERVAL", "must be more than 0"));
    }
    let per_second = if env.bool("REDIS_PERSECOND", false)? {
        Some(Box::new(redis_options(env, "REDIS_PERSECOND_")?))
    } else {
        None
    };
    Ok(Backend::Redis {
        options: Box::new(redis_options(env, "REDIS_")?),
        per_second,
        startup: StartupRetry {
            initial,
            max_interval: max_interval.max(initial),
            max_elapsed: (!max_wait.is_zero()).then_some(max_wait),
        },
        start_degraded: env.bool("REDIS_STARTUP_DEGRADED", false)?,
        health_follows_redis: env.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false)?,
    })
}

fn limiter_api<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<LimiterApiSettings>, SettingsError> {
    let enabled = env.bool("LIMITER_API_ENABLED", false)?;
    let names = [
        "LIMITER_GRPC_PORT",
        "LIMITER_API_TOKEN",
        "LIMITER_MAX_COUNT",
        "LIMITER_IDLE_EXPIRY",
        "LIMITER_MAX_CLIENTS",
    ];
    if !enabled {
        if let Some(name) = names.into_iter().find(|n| env.raw(n).is_some()) {
            return Err(env.error(name, "has no effect unless LIMITER_API_ENABLED=true"));
        }
        return Ok(None);
    }
    let addr = match env.raw("LIMITER_GRPC_PORT") {
        None => None,
        Some(_) => Some(env.addr("GRPC_HOST", "LIMITER_GRPC_PORT", 0)?),
    };
    let token = env.raw("LIMITER_API_TOKEN");
    if token.as_ref().is_some_and(|t| t.len() < 16) {
        return Err(env.error("LIMITER_API_TOKEN", "must have at least 16 characters"));
    }
    let defaults = Bounds::default();
    let bounds = Bounds {
        max_count: env.number("LIMITER_MAX_COUNT", defaults.max_count)?,
        idle: env.duration("LIMITER_IDLE_EXPIRY", defaults.idle)?,
        max_clients: env.number("LIMITER_MAX_CLIENTS", defaults.max_clients)?,
    };
    Ok(Some(LimiterApiSettings {
        addr,
        token,
        bounds,
    }))
}

fn grpc_tls<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<ServerTls>, SettingsError> {
    if !env.bool("GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let file = |name: &str| {
        env.raw(name)
            .map(PathBuf::from)
            .ok_or_else(|| env.error(name, "required with GRPC_SERVER_USE_TLS=true"))
    };
    let client_ca = env.raw("GRPC_CLIENT_TLS_CACERT").map(PathBuf::from);
    let client_san = env.raw("GRPC_CLIENT_TLS_SAN");
    if client_san.is_some() && client_ca.is_none() {
        return Err(env.error("GRPC_CLIENT_TLS_SAN", "needs GRPC_CLIENT_TLS_CACERT"));
    }
    Ok(Some(ServerTls {
        cert: file("GRPC_SERVER_TLS_CERT")?,
        key: file("GRPC_SERVER_TLS_KEY")?,
        client_ca,
        client_san,
    }))
}

/// Tracing is on when upstream's `TRACING_ENABLED=true`, or when an OTLP endpoint is set
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). The endpoint follows the
/// OpenTelemetry rules upstream's exporters follow: the traces endpoint as given, else the
/// general one (with `/v1/traces` added for HTTP), else the collector's standard local port.
fn trace_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<TraceSettings>, SettingsError> {
    let traces_endpoint = env.raw("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let endpoint = env.raw("OTEL_EXPORTER_OTLP_ENDPOINT");
    if traces_endpoint.is_none() && endpoint.is_none() && !env.bool("TRACING_ENABLED", false)? {
        return Ok(None);
    }
    let protocol = match env.raw("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("") | Some("http") => OtlpProtocol::Http,
        Some("grpc") => OtlpProtocol::Grpc,
        Some(_) => return Err(env.error("TRACING_EXPORTER_PROTOCOL", "expected http or grpc")),
    };
    let endpoint = match (protocol, traces_endpoint, endpoint) {
        (_, Some(traces), _) => traces,
        (OtlpProtocol::Http, None, Some(base)) => {
            format!("{}/v1/traces", base.trim_end_matches('/'))
        }
        (OtlpProtocol::Grpc, None, Some(base)) => base,
        (OtlpProtocol::Http, None, None) => "http://localhost:4318/v1/traces".into(),
        (OtlpProtocol::Grpc, None, None) => "http://localhost:4317".into(),
    };
    if protocol == OtlpProtocol::Http && !endpoint.starts_with("http://") {
        let variable = if env.raw("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        } else {
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        };
        return Err(env.error(
            variable,
            "OTLP over HTTP needs an http:// URL (no TLS); for a TLS collector set \
             TRACING_EXPORTER_PROTOCOL=grpc",
        ));
    }
    let sampling_rate = match env.raw("TRACING_SAMPLING_RATE").map(|v| v.parse::<f64>()) {
        None => 1.0,
        Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
        Some(_) => return Err(env.error("TRACING_SAMPLING_RATE", "expected a number from 0 to 1")),
    };
    Ok(Some(TraceSettings {
        protocol,
        endpoint,
        // Upstream's variable first, then OpenTelemetry's, then upstream's default.
        service_name: env
            .raw("TRACING_SERVICE_NAME")
            .or_else(|| env.raw("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "RateLimit".into()),
        service_namespace: env.raw("TRACING_SERVICE_NAMESPACE").unwrap_or_default(),
        service_instance_id: env.raw("TRACING_SERVICE_INSTANCE_ID"),
        sampling_rate,
    }))
}

/// Turns upstream's `REDIS_URL` + `REDIS_SOCKET_TYPE` into a redis-rs URL. Full `redis://`,
/// `rediss://` and `unix://` URLs are taken as they are.
pub fn redis_url(url: &str, socket_type: &str) -> Result<String, String> {
    if ["redis://", "rediss://", "unix://", "redis+unix://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
    {
        return Ok(url.to_string());
    }
    match socket_type.to_ascii_lowercase().as_str() {
        "unix" => Ok(format!("unix://{url}")),
        "tcp" => Ok(format!("redis://{url}")),
        other => Err(format!(
            "REDIS_SOCKET_TYPE must be tcp or unix, not {other:?}"
        )),
    }
}

/// Upstream's stats variables. Sinks are exclusive as upstream's: `USE_STATSD` (true unless
/// set otherwise, as upstream), `USE_DOG_STATSD` and `USE_PROMETHEUS`; two at once is an error
/// naming both, unless `DISABLE_STATS` turns them all off.
fn stats_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<StatsSettings, SettingsError> {
    let enabled = !env.bool("DISABLE_STATS", false)?;
    let sinks = [
        ("USE_STATSD", env.bool("USE_STATSD", true)?),
        ("USE_DOG_STATSD", env.bool("USE_DOG_STATSD", false)?),
        ("USE_PROMETHEUS", env.bool("USE_PROMETHEUS", false)?),
    ];
    let on: Vec<&str> = sinks
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect();
    if enabled && on.len() > 1 {
        let first = on[0];
        let mut err = env.error(
            first,
            format!(
                "{} are set together: one stats sink at a time, as upstream (USE_STATSD is true \
                 unless set to false)",
                on.join(" and ")
            ),
        );
        if err.value.is_empty() {
            err.value = "true (default)".into();
        }
        return Err(err);
    }
    let host = env.string("STATSD_HOST", "localhost");
    let port: u16 = env.number("STATSD_PORT", 8125)?;
    let statsd =
        (enabled && (on.contains(&"USE_STATSD") || on.contains(&"USE_DOG_STATSD"))).then(|| {
            StatsdSink {
                addr: if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                },
                dog: on.contains(&"USE_DOG_STATSD"),
            }
        });
    let flush_interval = env.duration("STATS_FLUSH_INTERVAL", Duration::from_secs(10))?;
    if flush_interval.is_zero() {
        return Err(env.error("STATS_FLUSH_INTERVAL", "expected a duration above zero"));
    }
    let mut extra_tags = Vec::new();
    for pair in env
        .string("EXTRA_TAGS", "")
        .split(',')
        .filter(|p| !p.trim().is_empty())
    {
        match pair.split(':').collect::<Vec<_>>()[..] {
            [k, v] if !k.trim().is_empty() => {
                extra_tags.push((k.trim().to_string(), v.trim().to_string()));
            }
            _ => {
                return Err(env.error(
                    "EXTRA_TAGS",
                    format!("expected key:value pairs separated by commas, got {pair:?}"),
                ));
            }
        }
    }
    Ok(StatsSettings {
        enabled,
        statsd,
        flush_interval,
        mapper_file: env.raw("PROMETHEUS_MAPPER_YAML").map(PathBuf::from),
        response_time_in_ms: env.bool("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false)?,
        extra_tags,
        debug_addr: env.addr("DEBUG_HOST", "DEBUG_PORT", 6070)?,
        max_detailed_series: env.number("MAX_DETAILED_METRIC_SERIES", 10_000)?,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(&Env(move |name| map.get(name).cloned()))
    }

    #[test]
    fn connection_timeouts_and_the_per_peer_cap_have_safe_defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.max_connections_per_peer, 5_000);
        assert_eq!(s.grpc_handshake_timeout, Duration::from_secs(10));
        assert_eq!(s.grpc_max_connection_idle, Duration::from_secs(600));
        assert_eq!(s.http_read_header_timeout, Duration::from_secs(10));
        // The per-peer default follows MAX_CONNECTIONS; an explicit value wins, 0 included.
        let s = settings(&[("MAX_CONNECTIONS", "301")]).unwrap();
        assert_eq!(s.max_connections_per_peer, 151);
        let s = settings(&[
            ("MAX_CONNECTIONS", "301"),
            ("MAX_CONNECTIONS_PER_PEER", "0"),
        ]);
        assert_eq!(s.unwrap().max_connections_per_peer, 0);
        let s = settings(&[
            ("GRPC_MAX_CONNECTION_IDLE", "0"),
            ("HTTP_READ_HEADER_TIMEOUT", "2s"),
        ]);
        let s = s.unwrap();
        assert!(s.grpc_max_connection_idle.is_zero());
        assert_eq!(s.http_read_header_timeout, Duration::from_secs(2));
        assert!(settings(&[("GRPC_HANDSHAKE_TIMEOUT", "soon")]).is_err());
    }

    #[test]
    fn the_native_api_is_off_unless_enabled_and_its_token_is_never_shown() {
        assert!(settings(&[]).unwrap().limiter_api.is_none());
        let api = settings(&[
            ("LIMITER_API_ENABLED", "true"),
            ("LIMITER_GRPC_PORT", "8082"),
            ("LIMITER_API_TOKEN", "0123456789abcdef"),
            ("LIMITER_IDLE_EXPIRY", "168h"),
            ("LIMITER_MAX_COUNT", "5"),
        ])
        .unwrap()
        .limiter_api
        .unwrap();
        assert_eq!(api.addr, Some("0.0.0.0:8082".parse().unwrap()));
        assert_eq!(api.bounds.idle, Duration::from_secs(168 * 3600));
        assert_eq!(api.bounds.max_count, 5);
        assert!(!format!("{api:?}").contains("0123456789abcdef"));
        let err = settings(&[
            ("LIMITER_API_ENABLED", "true"),
            ("LIMITER_API_TOKEN", "short"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "LIMITER_API_TOKEN");
        assert!(!err.to_string().contains("short"), "{err}");
        let err = settings(&[("LIMITER_MAX_COUNT", "5")]).unwrap_err();
        assert_eq!(err.variable, "LIMITER_MAX_COUNT");
    }

    /// The Redis store's options and start-up schedule with `vars` and `BACKEND_TYPE=redis`.
    fn redis_backend(
        vars: &[(&str, &str)],
    ) -> Result<(Box<RedisOptions>, StartupRetry), SettingsError> {
        let mut all = vec![("BACKEND_TYPE", "redis")];
        all.extend_from_slice(vars);
        match settings(&all)?.backend {
            Backend::Redis {
                options, startup, ..
            } => Ok((options, startup)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn redis_start_up_retries_on_upstreams_backoff() {
        let startup = |vars: &[(&str, &str)]| redis_backend(vars).map(|(_, startup)| startup);
        assert_eq!(startup(&[]).unwrap(), StartupRetry::UPSTREAM);
        let set = startup(&[
            ("REDIS_STARTUP_INITIAL_INTERVAL", "250ms"),
            ("REDIS_STARTUP_MAX_INTERVAL", "2s"),
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1m"),
        ])
        .unwrap();
        assert_eq!(
            set,
            StartupRetry {
                initial: Duration::from_millis(250),
                max_interval: Duration::from_secs(2),
                max_elapsed: Some(Duration::from_secs(60)),
            }
        );
        // A maximum below the first interval does not shrink it.
        let inverted = startup(&[
            ("REDIS_STARTUP_INITIAL_INTERVAL", "5s"),
            ("REDIS_STARTUP_MAX_INTERVAL", "1s"),
        ])
        .unwrap();
        assert_eq!(inverted.max_interval, Duration::from_secs(5));
        let err = startup(&[("REDIS_STARTUP_INITIAL_INTERVAL", "0s")]).unwrap_err();
        assert_eq!(err.variable, "REDIS_STARTUP_INITIAL_INTERVAL");
    }

    #[test]
    fn redis_credentials_come_from_the_variable_or_a_file_not_both() {
        let redis = |vars: &[(&str, &str)]| redis_backend(vars).map(|(options, _)| options);
        let file = redis(&[("REDIS_AUTH_FILE", "/run/secrets/redis-auth")]).unwrap();
        assert_eq!(
            file.auth_file.as_deref(),
            Some(std::path::Path::new("/run/secrets/redis-auth"))
        );
        assert!(file.auth.is_none());
        let err = redis(&[
            ("REDIS_AUTH", "pw"),
            ("REDIS_AUTH_FILE", "/run/secrets/redis-auth"),
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "REDIS_AUTH_FILE=\"/run/secrets/redis-auth\": REDIS_AUTH and REDIS_AUTH_FILE are mutually exclusive"
        );
    }

    #[test]
    fn config_type_selects_the_source_and_refuses_anything_else() {
        let s = settings(&[]).unwrap();
        assert!(matches!(s.config_source.source, ConfigSource::Files));
        assert!(!s.config_source.force_start);
        assert!(!s.config_source.healthy_needs_a_domain);
        let err = settings(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CONFIG_TYPE=\"GRPC_XDS_DELTA\": expected FILE or GRPC_XDS_SOTW"
        );
        let s = settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,broken,b=two"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-team:rl,x-env:prod",
            ),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("MERGE_DOMAIN_CONFIG", "true"),
        ])
        .unwrap();
        assert!(s.config_source.force_start);
        assert!(s.config_source.healthy_needs_a_domain);
        let ConfigSource::Xds(xds) = s.config_source.source else {
            panic!("expected xDS");
        };
        assert_eq!(xds.server_url, "envoy-gateway:18001");
        assert_eq!(xds.node_id, "envoy-ratelimit");
        let pairs = |v: &[(String, String)]| {
            v.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(pairs(&xds.node_metadata), "a=1,b=two");
        assert_eq!(pairs(&xds.headers), "x-team=rl,x-env=prod");
        let tls = xds.tls.unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/certs/ca.crt")));
        assert!(tls.cert_and_key.is_some());
        assert_eq!(xds.backoff.initial, Duration::from_millis(100));
        assert_eq!(xds.backoff.max, Duration::from_secs(1));
        assert!(!xds.backoff.jitter);
        assert_eq!(xds.max_message_bytes, Some(1 << 20));
        assert!(xds.load.merge_domains);
        let err = settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS");
        let secret = settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "authorization:Bearer s3cret",
            ),
        ])
        .unwrap();
        assert!(!format!("{secret:?}").contains("s3cret"));
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
    fn redis_urls() {
        assert_eq!(
            redis_url("localhost:6379", "tcp").unwrap(),
            "redis://localhost:6379"
        );
        assert_eq!(
            redis_url("/tmp/r.sock", "unix").unwrap(),
            "unix:///tmp/r.sock"
        );
        assert_eq!(redis_url("rediss://h:1", "unix").unwrap(), "rediss://h:1");
        assert!(redis_url("h:1", "udp").is_err());
    }

    #[test]
    fn the_store_follows_upstreams_environment_when_backend_type_is_unset() {
        let memory = settings(&[]).unwrap();
        assert_eq!(memory.backend.name(), "memory");
        assert!(
            memory.backend_reason.contains("no REDIS_"),
            "{}",
            memory.backend_reason
        );
        // Upstream's usual environment (Envoy Gateway's too): no BACKEND_TYPE.
        let upstream =
            settings(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")]).unwrap();
        let Backend::Redis {
            options,
            health_follows_redis,
            ..
        } = &upstream.backend
        else {
            panic!("not redis: {}", upstream.backend_reason)
        };
        assert_eq!(options.target, Target::Single("redis://redis:6379".into()));
        assert!(!health_follows_redis);
        assert!(
            upstream.backend_reason.contains("REDIS_SOCKET_TYPE is set"),
            "{}",
            upstream.backend_reason
        );
        for name in [
            "REDIS_TYPE",
            "REDIS_PERSECOND",
            "REDIS_STARTUP_DEGRADED",
            "REDIS_AUTH",
        ] {
            let value = if name == "REDIS_TYPE" {
                "single"
            } else {
                "false"
            };
            let s = settings(&[(name, value)]).unwrap();
            assert_eq!(s.backend.name(), "redis", "{name}");
        }
        // Said explicitly, BACKEND_TYPE wins.
        let s = settings(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "redis:6379")]).unwrap();
        assert_eq!(s.backend.name(), "memory");
        let s = settings(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ])
        .unwrap();
        assert!(matches!(
            s.backend,
            Backend::Redis {
                health_follows_redis: true,
                ..
            }
        ));
    }

    #[test]
    fn the_per_second_redis_shares_upstreams_tls_files() {
        let per_second_ca = |per_second_tls: &str| {
            let s = settings(&[
                ("BACKEND_TYPE", "redis"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "main:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CACERT", "/ca.pem"),
                ("REDIS_PERSECOND", "true"),
                ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
                ("REDIS_PERSECOND_URL", "second:6379"),
                ("REDIS_PERSECOND_TLS", per_second_tls),
            ])
            .unwrap();
            let Backend::Redis { per_second, .. } = s.backend else {
                panic!("not redis")
            };
            per_second.unwrap().tls.ca_cert
        };
        assert_eq!(per_second_ca("true"), Some(PathBuf::from("/ca.pem")));
        // Without TLS of its own it takes none of them.
        assert_eq!(per_second_ca("false"), None);
    }

    #[test]
    fn listen_hosts_may_be_names_and_grpc_may_use_a_unix_socket() {
        let s = settings(&[("HOST", "localhost"), ("GRPC_HOST", "127.0.0.1")]).unwrap();
        assert!(s.http_addr.ip().is_loopback(), "{}", s.http_addr);
        assert_eq!(s.http_addr.port(), 8080);
        let s = settings(&[
            ("USE_PROMETHEUS", "true"),
            ("USE_STATSD", "false"),
            ("PROMETHEUS_ADDR", "localhost:9102"),
        ])
        .unwrap();
        assert!(s.prometheus.unwrap().addr.ip().is_loopback());
        let err = settings(&[("HOST", "no-such-host.invalid")]).unwrap_err();
        assert_eq!(err.variable, "HOST");

        assert_eq!(settings(&[]).unwrap().grpc_uds, None);
        let s = settings(&[("GRPC_UDS", "/tmp/rls.sock")]).unwrap();
        assert_eq!(s.grpc_uds, Some(PathBuf::from("/tmp/rls.sock")));
        let err = settings(&[
            ("GRPC_UDS", "/tmp/rls.sock"),
            ("GRPC_SERVER_USE_TLS", "true"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "GRPC_UDS");
    }

    #[test]
    fn prometheus_listener_takes_go_addresses() {
        assert!(settings(&[]).unwrap().prometheus.is_none());
        let on = settings(&[("USE_PROMETHEUS", "true"), ("USE_STATSD", "false")])
            .unwrap()
            .prometheus
            .unwrap();
        assert_eq!(on.addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(on.path, "/metrics");
        let set = settings(&[
            ("USE_PROMETHEUS", "true"),
            ("USE_STATSD", "false"),
            ("PROMETHEUS_ADDR", "127.0.0.1:9102"),
        ])
        .unwrap()
        .prometheus
        .unwrap();
        assert_eq!(set.addr, "127.0.0.1:9102".parse().unwrap());
        for (name, value) in [("PROMETHEUS_ADDR", "9090"), ("PROMETHEUS_PATH", "/{x}")] {
            let err = settings(&[
                ("USE_PROMETHEUS", "true"),
                ("USE_STATSD", "false"),
                (name, value),
            ])
            .unwrap_err();
            assert_eq!(err.variable, name);
        }
    }

    #[test]
    fn stats_sinks_are_exclusive_and_statsd_is_the_default() {
        let default = settings(&[]).unwrap().stats;
        assert!(default.enabled);
        assert_eq!(
            default.statsd,
            Some(StatsdSink {
                addr: "localhost:8125".into(),
                dog: false
            })
        );
        assert_eq!(default.debug_addr, "0.0.0.0:6070".parse().unwrap());
        let err = settings(&[("USE_PROMETHEUS", "true")]).unwrap_err();
        assert!(
            err.reason.contains("USE_STATSD and USE_PROMETHEUS"),
            "{err}"
        );
        let err = settings(&[
            ("USE_DOG_STATSD", "true"),
            ("USE_PROMETHEUS", "true"),
            ("USE_STATSD", "0"),
        ])
        .unwrap_err();
        assert!(
            err.reason.contains("USE_DOG_STATSD and USE_PROMETHEUS"),
            "{err}"
        );
        let off = settings(&[("DISABLE_STATS", "true"), ("USE_PROMETHEUS", "true")]).unwrap();
        assert!(!off.stats.enabled && off.stats.statsd.is_none());
        let tags = settings(&[("EXTRA_TAGS", "a:1, b:2")])
            .unwrap()
            .stats
            .extra_tags;
        assert_eq!(tags, [("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(
            settings(&[("EXTRA_TAGS", "a:1:2")]).unwrap_err().variable,
            "EXTRA_TAGS"
        );
    }

    #[test]
    fn traces_follow_upstreams_protocol_and_the_otlp_endpoint_rules() {
        assert!(settings(&[]).unwrap().trace.is_none(), "off by default");
        let trace = |vars: &[(&str, &str)]| settings(vars).unwrap().trace.unwrap();
        // Upstream's default: OTLP/HTTP to the local collector, service RateLimit.
        let t = trace(&[("TRACING_ENABLED", "true")]);
        assert_eq!(t.protocol, OtlpProtocol::Http);
        assert_eq!(t.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(t.service_name, "RateLimit");
        assert_eq!(
            (t.service_namespace.as_str(), t.service_instance_id),
            ("", None)
        );
        // The general endpoint gets the signal's path; the traces endpoint is used as given.
        let t = trace(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"),
        ]);
        assert_eq!(t.endpoint, "http://c:4318/v1/traces");
        let t = trace(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/spans"),
        ]);
        assert_eq!(t.endpoint, "http://t:9/spans");
        let t = trace(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ]);
        assert_eq!(
            (t.protocol, t.endpoint.as_str()),
            (OtlpProtocol::Grpc, "http://localhost:4317")
        );
        let t = trace(&[
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"),
            ("TRACING_SERVICE_NAME", "rl"),
            ("OTEL_SERVICE_NAME", "ignored"),
            ("TRACING_SERVICE_NAMESPACE", "ns"),
            ("TRACING_SERVICE_INSTANCE_ID", "i-1"),
        ]);
        assert_eq!(t.endpoint, "https://c:4317", "TLS is the gRPC exporter's");
        assert_eq!(t.service_name, "rl", "upstream's variable first");
        assert_eq!(
            (
                t.service_namespace.as_str(),
                t.service_instance_id.as_deref()
            ),
            ("ns", Some("i-1"))
        );
        // Refused, naming the variable: an unknown protocol, and TLS over OTLP/HTTP.
        let refused = |vars: &[(&str, &str)]| settings(vars).unwrap_err().variable;
        assert_eq!(
            refused(&[
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "udp")
            ]),
            "TRACING_EXPORTER_PROTOCOL"
        );
        assert_eq!(
            refused(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]),
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        );
    }
}
