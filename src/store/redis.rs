//! The Redis store (standalone Redis): one `EVALSHA` of the decision script per request.
//!
//! Connections come from a `bb8` pool of `bb8-redis` multiplexed connections. Script calls go
//! through `coalesce.rs`, which sends the calls of concurrent requests as one pipeline on one
//! pooled connection (checked out, cloned and returned at once). bb8-redis never
//! reports a connection as broken, so [`Manager`] wraps it with a flag that a failed call sets;
//! the pool then replaces that connection on its next checkout, without a PING per request.
//!
//! The script is loaded with `SCRIPT LOAD` at start-up and called by SHA1. Redis forgets scripts
//! on restart, failover and `SCRIPT FLUSH`; a `NOSCRIPT` reply means the script did not run, so
//! the store loads it again and retries once (`coalesce::send_on`), and the caller sees no
//! error.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bb8_redis::RedisConnectionManager;
use rand::Rng;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind,
    TlsCertificates, Value,
};

use super::cluster::Cluster;
use super::coalesce::Coalescer;
use super::script::{self, DECISION, LIMITER, LuaScript, REGISTRY, REPLY_PER_CHECK};
use super::slot;
use super::{
    Acquisition, Check, LimiterKeys, LimiterRecord, LimiterSet, Outcome, RegistryOp, RegistryReply,
    SetMode, Store, StoreError, StoreFuture,
};
use crate::clock::Clock;

/// Credentials from `REDIS_AUTH` (`password` or `user:password`). `Debug` never shows them.
#[derive(Clone)]
pub struct RedisAuth {
    pub username: Option<String>,
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
    /// A master watched by Redis Sentinel: its name and the sentinels' URLs.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
}

impl Target {
    fn tls(&self) -> bool {
        match self {
            Target::Single(url) => url.starts_with("rediss://"),
            Target::Cluster(nodes) => nodes.iter().any(|n| n.starts_with("rediss://")),
            Target::Sentinel { .. } => false,
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

#[derive(Clone)]
pub struct RedisOptions {
    pub target: Target,
    pub auth: Option<RedisAuth>,
    /// `REDIS_SENTINEL_AUTH`: credentials for the sentinels themselves.
    pub sentinel_auth: Option<RedisAuth>,
    pub tls: TlsFiles,
    pub pool_size: u32,
    /// Deadline of one decision, connection checkout included.
    pub timeout: Duration,
    /// Upper bound (exclusive) of the random extra TTL given to new counters, so that counters
    /// created together do not all expire in the same instant.
    pub expiration_jitter_max: Duration,
    /// Replaces Redis's clock in the script. Only for tests that need pinned time.
    pub pinned_clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &self.target)
            .field("auth", &self.auth)
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

/// A pooled connection and the flag that retires it from the pool.
#[derive(Clone)]
pub struct Connection {
    pub(super) redis: MultiplexedConnection,
    broken: Arc<AtomicBool>,
}

/// bb8-redis's manager, plus broken-connection tracking.
pub(super) struct Manager {
    source: Source,
}

/// Where new connections go.
enum Source {
    /// A fixed address, through bb8-redis.
    Direct(RedisConnectionManager),
    /// Whichever server the sentinels name as master right now, so a new connection after a
    /// failover reaches the new master.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl bb8::ManageConnection for Manager {
    type Connection = Connection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Connection, RedisError> {
        let redis = match &self.source {
            Source::Direct(manager) => manager.connect().await?,
            Source::Sentinel(client) => client.lock().await.get_async_connection().await?,
        };
        Ok(Connection {
            redis,
            broken: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Called on checkout: cheap, because a failed call has already set the flag.
    async fn is_valid(&self, conn: &mut Connection) -> Result<(), RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            Err(RedisError::from((
                ErrorKind::Io,
                "connection failed earlier",
            )))
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

pub struct RedisStore {
    connector: Connector,
    options: RedisOptions,
}

/// How calls reach Redis.
enum Connector {
    /// bb8 pool of multiplexed connections to one server; concurrent calls are coalesced.
    Single(Coalescer<bb8::Pool<Manager>>),
    /// A bb8 pool per master, routed by slot (see `cluster.rs`).
    Cluster(Arc<Cluster>),
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .finish()
    }
}

impl RedisStore {
    /// Sets up the connections without connecting; call [`RedisStore::wait_until_ready`] next.
    pub fn new(options: RedisOptions) -> Result<Self, StoreError> {
        if options.target.tls() {
            // rustls needs one process-wide crypto provider; a second install is a no-op error.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let connector = match &options.target {
            Target::Single(url) => {
                let mut info = connection_info(url, &options)?;
                if url.starts_with("rediss://") && options.tls != TlsFiles::default() {
                    info = with_tls_files(info, &options.tls)?;
                }
                Connector::Single(Coalescer::new(new_pool(
                    info,
                    options.pool_size,
                    options.timeout,
                )?))
            }
            Target::Sentinel { master, sentinels } => {
                Connector::Single(Coalescer::new(sentinel_pool(master, sentinels, &options)?))
            }
            Target::Cluster(nodes) => {
                let mut template = connection_info(&nodes[0], &options)?;
                if options.target.tls() && options.tls != TlsFiles::default() {
                    template = with_tls_files(template, &options.tls)?;
                }
                let seeds = nodes
                    .iter()
                    .map(|n| host_port(n))
                    .collect::<Result<Vec<_>, _>>()?;
                // Connecting may take longer than a decision's deadline (TLS); requests are
                // bounded by their own deadline anyway.
                let connect = options.timeout.max(Duration::from_secs(1));
                Connector::Cluster(Arc::new(Cluster::new(
                    template,
                    seeds,
                    options.pool_size,
                    connect,
                )))
            }
        };
        Ok(Self { connector, options })
    }

    /// Pings Redis and loads the script, retrying with backoff until `max_wait` has passed
    /// (`None`: forever), as upstream's `REDIS_STARTUP_*` settings do.
    pub async fn wait_until_ready(&self, max_wait: Option<Duration>) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match self.load_script().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if max_wait.is_some_and(|max| started.elapsed() + delay > max) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, retry_in = ?delay, "redis is not ready");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Loads every script (on every master of a cluster); Redis must compute the SHA1s we call
    /// them by.
    async fn load_script(&self) -> Result<(), StoreError> {
        let connections = match &self.connector {
            Connector::Single(coalescer) => vec![checkout(coalescer.source()).await?],
            Connector::Cluster(cluster) => {
                cluster.refresh().await?;
                let mut connections = Vec::new();
                for node in cluster.masters() {
                    connections.push(cluster.connection(&node).await?);
                }
                connections
            }
        };
        for mut conn in connections {
            for script in script::all() {
                let sha = load(&mut conn.redis, script)
                    .await
                    .map_err(|e| fail(&conn, e))?;
                if sha != script.sha1 {
                    return Err(StoreError::Protocol(format!(
                        "redis computed script sha {sha}, expected {}",
                        script.sha1
                    )));
                }
            }
        }
        Ok(())
    }

    /// Runs `script` by SHA1 with the arguments `build` appends; every key is in `slot`.
    /// `capacity` is the (arguments, bytes) `build` will append, a hint that saves growing the
    /// command one argument at a time; (0, 0) when no one measured that it matters.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        slot: u16,
        script: &'static LuaScript,
        capacity: (usize, usize),
        build: impl FnOnce(&mut redis::Cmd, Option<u64>),
    ) -> Result<T, StoreError> {
        let (arguments, bytes) = capacity;
        // Plus the command name and the SHA1 (40 hex digits).
        let mut cmd = redis::Cmd::with_capacity(arguments + 2, bytes + "EVALSHA".len() + 40);
        cmd.arg("EVALSHA").arg(script.sha1.as_str());
        build(
            &mut cmd,
            self.options.pinned_clock.as_ref().map(|c| c.now_micros()),
        );
        match &self.connector {
            Connector::Single(coalescer) => match coalescer.call(cmd).await? {
                Value::ServerError(e) => Err(redis_error(RedisError::from(e))),
                value => parse(value),
            },
            Connector::Cluster(cluster) => parse(cluster.run(slot, &cmd).await?),
        }
    }

    /// Decides the checks: one script call for a single server; one per slot for a cluster
    /// (a script may only touch keys of one slot), sent concurrently and merged back in order.
    async fn run(&self, checks: &[Check]) -> Result<Vec<Outcome>, StoreError> {
        if matches!(self.connector, Connector::Single(_)) {
            return self.run_batch(0, checks).await;
        }
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (index, check) in checks.iter().enumerate() {
            by_slot
                .entry(slot::slot(check.key.as_bytes()))
                .or_default()
                .push(index);
        }
        if by_slot.len() == 1 {
            let slot = *by_slot.keys().next().expect("one group");
            return self.run_batch(slot, checks).await;
        }
        let groups: Vec<(u16, Vec<usize>)> = by_slot.into_iter().collect();
        let calls = groups.iter().map(|(slot, indexes)| async move {
            let group: Vec<Check> = indexes.iter().map(|&i| checks[i].clone()).collect();
            self.run_batch(*slot, &group).await
        });
        let replies = futures::future::try_join_all(calls).await?;
        let mut outcomes = vec![None; checks.len()];
        for ((_, indexes), reply) in groups.iter().zip(replies) {
            for (&i, outcome) in indexes.iter().zip(reply) {
                outcomes[i] = Some(outcome);
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every check belongs to one group"))
            .collect())
    }

    async fn run_batch(&self, slot: u16, checks: &[Check]) -> Result<Vec<Outcome>, StoreError> {
        let jitter_ms = self.options.expiration_jitter_max.as_millis() as u64;
        let reply: Vec<i64> = self
            .eval(slot, &DECISION, script::capacity(checks), |cmd, pinned| {
                let mut rng = rand::rng();
                script::encode(cmd, checks, pinned, || {
                    if jitter_ms == 0 {
                        0
                    } else {
                        rng.random_range(0..jitter_ms)
                    }
                });
            })
            .await?;
        decode(&reply, checks.len())
    }

    /// One operation of `lua/limiter.lua` on a limiter's keys: the config, the shared state and
    /// epoch, and the client's (the shared ones again when there is no client).
    async fn limiter_op<T: redis::FromRedisValue>(
        &self,
        keys: &LimiterKeys,
        op: &str,
        args: impl FnOnce(&mut redis::Cmd),
    ) -> Result<T, StoreError> {
        let client = keys.client.as_ref().unwrap_or(&keys.shared);
        let slot = slot::slot(keys.config.as_bytes());
        self.eval(slot, &LIMITER, (0, 0), |cmd, pinned| {
            cmd.arg(5)
                .arg(&keys.config)
                .arg(&keys.shared.state)
                .arg(&keys.shared.epoch)
                .arg(&client.state)
                .arg(&client.epoch)
                .arg(pinned.map_or(String::new(), |t| t.to_string()))
                .arg(op)
                .arg(u8::from(keys.client.is_some()));
            args(cmd);
        })
        .await
    }
}

/// A script's reply as the caller's type.
fn parse<T: redis::FromRedisValue>(value: Value) -> Result<T, StoreError> {
    T::from_redis_value(value).map_err(|e| StoreError::Protocol(e.to_string()))
}

/// `SCRIPT LOAD` on the node `conn` is connected to.
pub(super) async fn load<C: ConnectionLike>(
    conn: &mut C,
    script: &LuaScript,
) -> redis::RedisResult<String> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script.source.as_str())
        .query_async(conn)
        .await
}

/// The stored fields of a limiter (`rule`, `a`..`d`, `cap`, `pc`, `desc`), as HMGET returns
/// them.
type RecordFields = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
);

fn parse_record(fields: RecordFields) -> Result<Option<LimiterRecord>, StoreError> {
    let (Some(rule), Some(a), Some(b), c, d, Some(cap), per_client, desc) = fields else {
        return Ok(None);
    };
    let args = [a, b, c.unwrap_or_default(), d.unwrap_or_default()];
    Ok(Some(LimiterRecord {
        rule: script::parse_rule(&rule, &args)?,
        capacity: cap
            .parse()
            .map_err(|_| StoreError::Protocol(format!("stored capacity {cap:?}")))?,
        per_client: per_client.as_deref() == Some("1"),
        description: desc.unwrap_or_default(),
    }))
}

fn connection_info(url: &str, options: &RedisOptions) -> Result<ConnectionInfo, StoreError> {
    let mut info = url
        .into_connection_info()
        .map_err(|e| StoreError::Setup(format!("invalid redis url ({:?})", e.kind())))?;
    if let Some(auth) = &options.auth {
        let mut settings = info.redis_settings().clone().set_password(&auth.password);
        if let Some(user) = &auth.username {
            settings = settings.set_username(user);
        }
        info = info.set_redis_settings(settings);
    }
    Ok(info)
}

/// A bb8 pool of connections to one server (or one cluster node).
pub(super) fn new_pool(
    info: ConnectionInfo,
    pool_size: u32,
    connect_timeout: Duration,
) -> Result<bb8::Pool<Manager>, StoreError> {
    let manager = Manager {
        source: Source::Direct(RedisConnectionManager::new(info).map_err(redis_error)?),
    };
    Ok(pool_of(manager, pool_size, connect_timeout))
}

/// A pool of connections to the master the sentinels name (`Target::Sentinel`).
fn sentinel_pool(
    master: &str,
    sentinels: &[String],
    options: &RedisOptions,
) -> Result<bb8::Pool<Manager>, StoreError> {
    let sentinel_infos = sentinels
        .iter()
        .map(|s| {
            let mut info = s.as_str().into_connection_info().map_err(|e| {
                StoreError::Setup(format!("invalid sentinel address ({:?})", e.kind()))
            })?;
            if let Some(auth) = &options.sentinel_auth {
                let mut settings = info.redis_settings().clone().set_password(&auth.password);
                if let Some(user) = &auth.username {
                    settings = settings.set_username(user);
                }
                info = info.set_redis_settings(settings);
            }
            Ok(info)
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let mut node = redis::RedisConnectionInfo::default();
    if let Some(auth) = &options.auth {
        node = node.set_password(&auth.password);
        if let Some(user) = &auth.username {
            node = node.set_username(user);
        }
    }
    let client = SentinelClient::build(
        sentinel_infos,
        master,
        Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(node)),
        SentinelServerType::Master,
    )
    .map_err(|e| StoreError::Setup(format!("invalid sentinel settings: {}", describe(&e))))?;
    let manager = Manager {
        source: Source::Sentinel(tokio::sync::Mutex::new(client)),
    };
    Ok(pool_of(
        manager,
        options.pool_size,
        options.timeout.max(Duration::from_secs(1)),
    ))
}

fn pool_of(manager: Manager, pool_size: u32, connect_timeout: Duration) -> bb8::Pool<Manager> {
    bb8::Pool::builder()
        .max_size(pool_size.max(1))
        .test_on_check_out(true)
        // Fail fast and let the caller decide: start-up retries with backoff, requests answer
        // UNAVAILABLE at once instead of waiting out their deadline.
        .retry_connection(false)
        .connection_timeout(connect_timeout)
        .build_unchecked(manager)
}

/// `host:port` of a node URL.
fn host_port(url: &str) -> Result<String, StoreError> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let rest = rest.split('/').next().unwrap_or(rest);
    if rest.contains(':') {
        Ok(rest.to_string())
    } else {
        Err(StoreError::Setup(format!(
            "cluster node {} needs host:port",
            redact_url(url)
        )))
    }
}

/// Attaches CA and client certificates to the connection info (read once, at start-up).
fn with_tls_files(info: ConnectionInfo, files: &TlsFiles) -> Result<ConnectionInfo, StoreError> {
    let client = redis::Client::build_with_tls(info, tls_certificates(files)?)
        .map_err(|e| StoreError::Setup(format!("invalid TLS files: {}", describe(&e))))?;
    Ok(client.get_connection_info().clone())
}

fn tls_certificates(files: &TlsFiles) -> Result<TlsCertificates, StoreError> {
    let read = |path: &PathBuf| {
        std::fs::read(path)
            .map_err(|e| StoreError::Setup(format!("cannot read {}: {e}", path.display())))
    };
    Ok(TlsCertificates {
        root_cert: files.ca_cert.as_ref().map(read).transpose()?,
        client_tls: match &files.client_cert_and_key {
            Some((cert, key)) => Some(ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            None => None,
        },
    })
}

fn decode(reply: &[i64], checks: usize) -> Result<Vec<Outcome>, StoreError> {
    if reply.len() != checks * REPLY_PER_CHECK {
        return Err(StoreError::Protocol(format!(
            "expected {} integers, got {}",
            checks * REPLY_PER_CHECK,
            reply.len()
        )));
    }
    let as_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(reply
        .chunks_exact(REPLY_PER_CHECK)
        .map(|r| Outcome {
            admitted: r[0] == 1,
            remaining: as_u64(r[1]),
            reset_ms: as_u64(r[2]).max(1),
            used: as_u64(r[3]),
        })
        .collect())
}

/// Records a failed call: connection-level failures retire the connection.
pub(super) fn fail(conn: &Connection, e: RedisError) -> StoreError {
    retire_if_broken(conn, &e);
    redis_error(e)
}

/// Retires the connection when `e` says it cannot serve more calls.
pub(super) fn retire_if_broken(conn: &Connection, e: &RedisError) {
    // READONLY: the server was demoted to replica by a failover; a new connection (through the
    // sentinels) reaches the new master.
    let demoted = e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
    if demoted || e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
        conn.broken.store(true, Ordering::Relaxed);
    }
}

/// A connection from `pool`, handed back at once: the multiplexed handle is shared by clones.
pub(super) async fn checkout(pool: &bb8::Pool<Manager>) -> Result<Connection, StoreError> {
    let pooled = pool.get().await.map_err(|e| match e {
        bb8::RunError::User(e) => StoreError::Unavailable(describe(&e)),
        bb8::RunError::TimedOut => {
            StoreError::Unavailable("timed out waiting for a connection".into())
        }
    })?;
    Ok(Connection::clone(&pooled))
}

pub(super) fn redis_error(e: RedisError) -> StoreError {
    if is_script_error(&e) {
        StoreError::Script(describe(&e))
    } else {
        StoreError::Redis(describe(&e))
    }
}

/// An error reply about this call's work (`ERR` from a script or command, `WRONGTYPE`,
/// `CROSSSLOT`, `EXECABORT`), as opposed to one saying the server cannot serve now (`BUSY`,
/// `LOADING`, `READONLY`, `OOM`, cluster states, authentication) or a transport failure.
fn is_script_error(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("ERR" | "WRONGTYPE" | "CROSSSLOT" | "EXECABORT")
    )
}

/// Error text for logs and clients. redis-rs errors carry the server's message or an I/O error,
/// never the connection URL or credentials.
pub(super) fn describe(e: &RedisError) -> String {
    e.to_string()
}

impl RedisStore {
    /// Every store call gets the same deadline, connection checkout included.
    fn bounded<'a, T: Send + 'a>(
        &'a self,
        call: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        let timeout = self.options.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, call).await {
                Ok(result) => result,
                Err(_) => {
                    if let Connector::Cluster(cluster) = &self.connector {
                        // A node may have failed over without telling us: look again, in the
                        // background, so the next calls find the new master.
                        let cluster = cluster.clone();
                        tokio::spawn(async move { cluster.refresh().await });
                    }
                    Err(StoreError::Timeout(timeout))
                }
            }
        })
    }
}

impl Store for RedisStore {
    fn check<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a> {
        self.bounded(self.run(checks))
    }

    fn set_limiter<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.bounded(async move {
            let mode = match mode {
                SetMode::TrySet => "try",
                SetMode::UpdateKeepState => "keep",
                SetMode::UpdateResetState => "reset",
            };
            let (applied, state_reset, fields): (i64, i64, RecordFields) = self
                .limiter_op(keys, "set", |cmd| {
                    cmd.arg(mode)
                        .arg(script::rule_name(&record.rule))
                        .arg(&script::stored_args(&record.rule)[..])
                        .arg(record.capacity)
                        .arg(u8::from(record.per_client))
                        .arg(&record.description[..]);
                })
                .await?;
            let current = parse_record(fields)?
                .ok_or_else(|| StoreError::Protocol("limiter missing after set".into()))?;
            Ok(LimiterSet {
                applied: applied == 1,
                state_reset: state_reset == 1,
                current,
            })
        })
    }

    fn get_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.bounded(async move {
            let fields: RecordFields = self.limiter_op(keys, "get", |_| {}).await?;
            parse_record(fields)
        })
    }

    fn delete_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, bool> {
        self.bounded(async move {
            let existed: i64 = self.limiter_op(keys, "delete", |_| {}).await?;
            Ok(existed == 1)
        })
    }

    fn acquire<'a>(&'a self, keys: &'a LimiterKeys, permits: u64) -> StoreFuture<'a, Acquisition> {
        self.bounded(async move {
            let reply: Vec<i64> = self
                .limiter_op(keys, "acquire", |cmd| {
                    cmd.arg(permits);
                })
                .await?;
            match reply.as_slice() {
                [] => Ok(Acquisition::NoSuchLimiter),
                [-1] => Ok(Acquisition::NeedsClient),
                [-2, capacity] => Ok(Acquisition::TooManyPermits {
                    capacity: u64::try_from(*capacity).unwrap_or(0),
                }),
                [decision @ .., capacity] if decision.len() == REPLY_PER_CHECK => {
                    Ok(Acquisition::Decided {
                        outcome: decode(decision, 1)?[0],
                        capacity: u64::try_from(*capacity).unwrap_or(0),
                    })
                }
                other => Err(StoreError::Protocol(format!("acquire replied {other:?}"))),
            }
        })
    }

    fn registry<'a>(&'a self, key: &'a str, op: RegistryOp<'a>) -> StoreFuture<'a, RegistryReply> {
        self.bounded(async move {
            let slot = slot::slot(key.as_bytes());
            let args = |cmd: &mut redis::Cmd, pinned: Option<u64>| {
                cmd.arg(1)
                    .arg(key)
                    .arg(pinned.map_or(String::new(), |t| t.to_string()));
            };
            match op {
                RegistryOp::Touch { name, idle_ms, max } => {
                    let registered: i64 = self
                        .eval(slot, &REGISTRY, (0, 0), |cmd, pinned| {
                            args(cmd, pinned);
                            cmd.arg("touch").arg(name).arg(idle_ms).arg(max);
                        })
                        .await?;
                    Ok(RegistryReply::Touched(registered == 1))
                }
                RegistryOp::TakeExpired { at_most } => {
                    let names: Vec<String> = self
                        .eval(slot, &REGISTRY, (0, 0), |cmd, pinned| {
                            args(cmd, pinned);
                            cmd.arg("expired").arg(at_most);
                        })
                        .await?;
                    Ok(RegistryReply::Expired(names))
                }
                RegistryOp::Remove { name } => {
                    let _: i64 = self
                        .eval(slot, &REGISTRY, (0, 0), |cmd, pinned| {
                            args(cmd, pinned);
                            cmd.arg("remove").arg(name);
                        })
                        .await?;
                    Ok(RegistryReply::Removed)
                }
            }
        })
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let options = RedisOptions {
            target: Target::Single("redis://admin:hunter2@localhost:6379".into()),
            auth: Some(RedisAuth::parse("user:s3cret")),
            sentinel_auth: None,
            tls: TlsFiles::default(),
            pool_size: 1,
            timeout: Duration::from_millis(10),
            expiration_jitter_max: Duration::ZERO,
            pinned_clock: None,
        };
        let shown = format!("{options:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(shown.contains("admin:<redacted>@localhost:6379"), "{shown}");
    }

    #[test]
    fn auth_forms() {
        let plain = RedisAuth::parse("pw");
        assert_eq!((plain.username, plain.password.as_str()), (None, "pw"));
        let acl = RedisAuth::parse("user:pw:with:colons");
        assert_eq!(acl.username.as_deref(), Some("user"));
        assert_eq!(acl.password, "pw:with:colons");
    }
}
