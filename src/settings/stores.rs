//! Store settings: which store serves the counters (`BACKEND_TYPE`, or upstream's choice when it is
//! unset), the in-process store's bounds, one Redis deployment's options from its `REDIS_*`
//! variables (the per-second Redis from their `REDIS_PERSECOND_*` twins), upstream's start-up
//! backoff, the Redis circuit breaker, and the prefix of every counter key.

use std::path::PathBuf;
use std::time::Duration;

use sluice::store::layers::breaker::BreakerOptions;
use sluice::store::redis::{RedisAuth, StartupRetry, Target};
use sluice::store::{MemoryStoreOptions, RedisOptions, TlsFiles};

use super::{Env, SettingsError, upstream};

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
        /// What `FAILURE_POLICY=local_share` decides with while Redis is down.
        degraded: DegradedOptions,
    },
}

/// The in-process decisions of `FAILURE_POLICY=local_share` (`store::layers::local_share`).
#[derive(Debug, Clone)]
pub struct DegradedOptions {
    /// `DEGRADED_REPLICAS`: the replica count each limit is divided by; unset (or 0), it is
    /// learnt from Redis while it answers.
    pub replicas: Option<u64>,
    /// The bounds of the in-process store the decisions run on: the memory store's
    /// (`MEMORY_MAX_COUNTERS`, `MEMORY_MAX_LIMITER_STATES`).
    pub memory: MemoryStoreOptions,
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis { .. } => "redis",
        }
    }
}

/// The store and why it was chosen (for the start-up log).
pub(super) fn backend<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<(Backend, String), SettingsError> {
    let (backend_type, backend_reason) = backend_type(env);
    let backend = match backend_type.as_str() {
        "memory" => Backend::Memory(memory_options(env)?),
        "redis" => redis_backend(env)?,
        "memcache" => {
            return Err(env.error(
                "BACKEND_TYPE",
                "memcache is not supported; use redis (or memory for one replica)",
            ));
        }
        _ => return Err(env.error("BACKEND_TYPE", "expected memory or redis")),
    };
    Ok((backend, backend_reason))
}

/// The memory store's bounds, for the memory backend and for `local_share`'s decisions.
fn memory_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<MemoryStoreOptions, SettingsError> {
    Ok(MemoryStoreOptions {
        max_counters: env.number("MEMORY_MAX_COUNTERS", 1_000_000usize)?,
        max_limiter_states: env.number(
            "MEMORY_MAX_LIMITER_STATES",
            MemoryStoreOptions::default().max_limiter_states,
        )?,
        ..MemoryStoreOptions::default()
    })
}

/// The Redis store's circuit breaker.
pub(super) fn breaker<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<BreakerOptions, SettingsError> {
    Ok(BreakerOptions {
        failures_to_open: env.number("BREAKER_FAILURES", 5)?,
        cool_down: env.duration("BREAKER_COOL_DOWN", Duration::from_millis(250))?,
        ..BreakerOptions::default()
    })
}

/// `CACHE_KEY_PREFIX`, before every counter key.
pub(super) fn cache_key_prefix<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> String {
    env.string("CACHE_KEY_PREFIX", "")
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
        degraded: DegradedOptions {
            replicas: match env.number("DEGRADED_REPLICAS", 0u64)? {
                0 => None,
                n => Some(n),
            },
            memory: memory_options(env)?,
        },
    })
}

/// The options of one Redis deployment from the variables that start with `prefix` (`REDIS_`,
/// or `REDIS_PERSECOND_` for the per-second Redis).
fn redis_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    prefix: &str,
) -> Result<RedisOptions, SettingsError> {
    let var = |name: &str| format!("{prefix}{name}");
    let target = redis_target(env, prefix)?;
    let tls_files = redis_tls_files(env, prefix, &target)?;
    let jitter_secs: u64 = env.number("EXPIRATION_JITTER_MAX_SECONDS", 300)?;
    let (auth, auth_file) = redis_auth(env, prefix)?;
    Ok(RedisOptions {
        target,
        auth,
        auth_file,
        sentinel_auth: env.raw(&var("SENTINEL_AUTH")).map(|a| RedisAuth::parse(&a)),
        tls: tls_files,
        pool_size: env.number(&var("POOL_SIZE"), 10)?,
        // Upstream's 10 s. It bounds only calls whose caller sent no deadline (`/json`, a
        // gRPC client without `grpc-timeout`): a call with one runs until that deadline less a
        // margin (`store::deadline`), so Envoy's filter timeout rules, as with upstream.
        timeout: env.duration(&var("TIMEOUT"), Duration::from_secs(10))?,
        expiration_jitter_max: Duration::from_secs(jitter_secs),
        pinned_clock: None,
    })
}

/// `TYPE` and `URL` (with `SOCKET_TYPE` and `TLS`): the one node, the cluster's nodes, or the
/// sentinels and the master's name.
fn redis_target<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    prefix: &str,
) -> Result<Target, SettingsError> {
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
        // As upstream (envoyproxy/ratelimit#1015): `TLS` covers the sentinels and the master
        // they name alike, with the same files.
        let sentinels = items
            .map(|n| redis_url(n, "tcp").map(with_tls))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| env.error(&var("URL"), reason))?;
        if sentinels.is_empty() {
            return Err(env.error(&var("URL"), "expected master-name,host:port[,host:port…]"));
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
    Ok(target)
}

/// The TLS files (`TLS_CACERT`, `TLS_CLIENT_CERT`, `TLS_CLIENT_KEY`), refused when the target
/// does not speak TLS.
fn redis_tls_files<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    prefix: &str,
    target: &Target,
) -> Result<TlsFiles, SettingsError> {
    let var = |name: &str| format!("{prefix}{name}");
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
    let uses_tls = match target {
        Target::Single(url) => url.starts_with("rediss://"),
        Target::Cluster(nodes) => nodes.iter().all(|n| n.starts_with("rediss://")),
        Target::Sentinel { sentinels, .. } => sentinels.iter().all(|n| n.starts_with("rediss://")),
    };
    if tls_files != TlsFiles::default() && !uses_tls {
        return Err(env.error(
            &var("TLS"),
            "certificate files are set but TLS is off (set REDIS_TLS=true or use rediss://)",
        ));
    }
    let tls_files = shared_tls_files(env, prefix, uses_tls, tls_files)?;
    Ok(tls_files)
}

/// `AUTH` or `AUTH_FILE`, not both.
fn redis_auth<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    prefix: &str,
) -> Result<(Option<RedisAuth>, Option<PathBuf>), SettingsError> {
    let var = |name: &str| format!("{prefix}{name}");
    let auth = env.raw(&var("AUTH")).map(|a| RedisAuth::parse(&a));
    let auth_file = env.raw(&var("AUTH_FILE")).map(PathBuf::from);
    if auth.is_some() && auth_file.is_some() {
        return Err(env.error(
            &var("AUTH_FILE"),
            format!("{prefix}AUTH and {prefix}AUTH_FILE are mutually exclusive"),
        ));
    }
    Ok((auth, auth_file))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::settings;

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

    /// Upstream's Sentinel over TLS (envoyproxy/ratelimit#1015): `REDIS_TLS` makes every
    /// sentinel `rediss://` (the master they name is reached the same way), with the TLS files
    /// and both passwords.
    #[test]
    fn sentinel_takes_tls_and_both_passwords() {
        let redis = |vars: &[(&str, &str)]| redis_backend(vars).map(|(options, _)| options);
        let tls = redis(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "app,s1:26379,s2:26379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/ca.pem"),
            ("REDIS_AUTH", "master-pw"),
            ("REDIS_SENTINEL_AUTH", "sentinel-user:sentinel-pw"),
        ])
        .unwrap();
        assert_eq!(
            tls.target,
            Target::Sentinel {
                master: "app".into(),
                sentinels: vec!["rediss://s1:26379".into(), "rediss://s2:26379".into()],
            }
        );
        assert_eq!(tls.tls.ca_cert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(tls.auth.as_ref().unwrap().password, "master-pw");
        let sentinel_auth = tls.sentinel_auth.as_ref().unwrap();
        assert_eq!(sentinel_auth.username.as_deref(), Some("sentinel-user"));
        assert_eq!(sentinel_auth.password, "sentinel-pw");
        // Without REDIS_TLS the TLS files are a mistake, as for the other modes.
        let err = redis(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "app,s1:26379"),
            ("REDIS_TLS_CACERT", "/ca.pem"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "REDIS_TLS");
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
}
