//! What a Redis store is told at start-up: where Redis is (standalone, Sentinel, Cluster), how to
//! authenticate, TLS files, pool size and deadline, and how to retry a Redis not ready yet. `Debug` never shows credentials, and
//! [`redact_url`] strips them from URLs for logs.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

/// Credentials from `REDIS_AUTH` (`password` or `user:password`). `Debug` never shows them.
#[derive(Clone)]
pub struct RedisAuth {
    /// An ACL user; `None` authenticates as the default user.
    pub username: Option<String>,
    /// The password.
    pub password: String,
}

impl RedisAuth {
    /// Parses upstream's `REDIS_AUTH` form.
    pub fn parse(text: &str) -> Self {
        match text.split_once(':') {
            Some((user, password)) => Self {
                username: Some(user.to_string()),
                password: password.to_string(),
            },
            None => Self {
                username: None,
                password: text.to_string(),
            },
        }
    }
}

impl RedisAuth {
    /// The credentials in `path` (`REDIS_AUTH_FILE`), surrounding white space removed; an empty
    /// file is an error, as upstream.
    pub fn read(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        match text.trim() {
            "" => Err(format!("redis credential file {} is empty", path.display())),
            auth => Ok(Self::parse(auth)),
        }
    }
}

impl fmt::Debug for RedisAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// PEM files for TLS to Redis (`rediss://`). Without a CA file the bundled public roots are used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate, instead of the public roots.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate and key, for Redis servers that require mutual TLS.
    pub client_cert_and_key: Option<(PathBuf, PathBuf)>,
}

/// Which Redis deployment to talk to.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// One server (or a proxy): `redis://host:port`, `rediss://…` (TLS) or `unix:///path`.
    Single(String),
    /// A Redis Cluster, by the URLs of some of its nodes (the rest are discovered).
    Cluster(Vec<String>),
    /// A master watched by Redis Sentinel: its name and the sentinels' URLs. Sentinels at
    /// `rediss://` URLs are reached over TLS, and so is the master they name.
    Sentinel {
        /// The master's name, as the sentinels know it.
        master: String,
        /// URLs of some of the sentinels.
        sentinels: Vec<String>,
    },
}

impl Target {
    pub(super) fn tls(&self) -> bool {
        match self {
            Target::Single(url) => url.starts_with("rediss://"),
            Target::Cluster(nodes) => nodes.iter().any(|n| n.starts_with("rediss://")),
            // The sentinels and the master they name speak TLS alike (`REDIS_TLS`).
            Target::Sentinel { sentinels, .. } => {
                sentinels.iter().any(|n| n.starts_with("rediss://"))
            }
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Single(url) => write!(f, "Single({})", redact_url(url)),
            Target::Cluster(nodes) => {
                let nodes: Vec<String> = nodes.iter().map(|n| redact_url(n)).collect();
                write!(f, "Cluster({nodes:?})")
            }
            Target::Sentinel { master, sentinels } => {
                let sentinels: Vec<String> = sentinels.iter().map(|n| redact_url(n)).collect();
                write!(f, "Sentinel({master}, {sentinels:?})")
            }
        }
    }
}

/// What a [`RedisStore`](crate::store::RedisStore) is told at start-up
/// ([`RedisOptions::new`] for the defaults).
#[derive(Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: Target,
    /// `REDIS_AUTH`: credentials for Redis (a `redis://user:password@…` URL may carry them
    /// too).
    pub auth: Option<RedisAuth>,
    /// `REDIS_AUTH_FILE`: a file holding what `REDIS_AUTH` would (`password` or
    /// `user:password`), read again for every new connection so that a rotated secret is used
    /// without a restart, as upstream does. Never set together with `auth`.
    pub auth_file: Option<PathBuf>,
    /// `REDIS_SENTINEL_AUTH`: credentials for the sentinels themselves.
    pub sentinel_auth: Option<RedisAuth>,
    /// TLS files for a `rediss://` target.
    pub tls: TlsFiles,
    /// Connections per server (per master on a cluster); calls share them, pipelined.
    pub pool_size: u32,
    /// Deadline of one decision, connection checkout included.
    pub timeout: Duration,
    /// Upper bound (exclusive) of the random extra TTL given to new counters, so that counters
    /// created together do not all expire in the same instant.
    pub expiration_jitter_max: Duration,
    /// Replaces Redis's clock in the script. Only for tests that need pinned time.
    pub pinned_clock: Option<Arc<dyn Clock>>,
}

impl RedisOptions {
    /// Options for `target` with no credentials and no TLS files of its own (a `rediss://` URL
    /// trusts the public roots), a pool of 10 connections, and at most a second per decision:
    /// a request handler waiting on it has no other bound. (The server defaults `timeout` to
    /// upstream's 10 s instead: there the caller's `grpc-timeout` bounds each call.)
    pub fn new(target: Target) -> RedisOptions {
        RedisOptions {
            target,
            auth: None,
            auth_file: None,
            sentinel_auth: None,
            tls: TlsFiles::default(),
            pool_size: 10,
            timeout: Duration::from_secs(1),
            expiration_jitter_max: Duration::from_secs(300),
            pinned_clock: None,
        }
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &self.target)
            .field("auth", &self.auth)
            .field("auth_file", &self.auth_file)
            .field("sentinel_auth", &self.sentinel_auth)
            .field("tls", &self.tls)
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("expiration_jitter_max", &self.expiration_jitter_max)
            .field("pinned_clock", &self.pinned_clock.is_some())
            .finish()
    }
}

/// The URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}{user}:<redacted>@{host}")
        }
        None => url.to_string(),
    }
}

/// How start-up retries a Redis that is not ready: upstream's exponential backoff
/// (`REDIS_STARTUP_INITIAL_INTERVAL`, `REDIS_STARTUP_MAX_INTERVAL`,
/// `REDIS_STARTUP_MAX_ELAPSED_TIME`), each wait drawn within ±50% of the current interval, which
/// grows 1.5× per attempt, as its backoff library does by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupRetry {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max_interval: Duration,
    /// Give up after this long; `None` retries forever (upstream's 0).
    pub max_elapsed: Option<Duration>,
}

impl StartupRetry {
    /// Upstream's defaults: 1 s, growing to 30 s, forever.
    pub const UPSTREAM: StartupRetry = StartupRetry {
        initial: Duration::from_secs(1),
        max_interval: Duration::from_secs(30),
        max_elapsed: None,
    };

    /// The interval after `interval`: 1.5× longer, up to `max_interval`.
    pub(super) fn grown(&self, interval: Duration) -> Duration {
        interval.mul_f64(1.5).min(self.max_interval)
    }

    /// Upstream's schedule, giving up after `max_elapsed` (`None`: never).
    pub fn within(max_elapsed: Option<Duration>) -> Self {
        Self {
            max_elapsed,
            ..Self::UPSTREAM
        }
    }
}

/// `interval` moved by up to half of itself either way, so replicas that lost Redis together
/// do not retry in step.
pub(super) fn randomized(interval: Duration) -> Duration {
    use rand::Rng;
    interval.mul_f64(rand::rng().random_range(0.5..=1.5))
}
