//! Connections to Redis: the `bb8` pool of multiplexed connections (standalone, or through
//! Sentinel), the [`Manager`] that marks a connection broken when a call fails on it (bb8-redis
//! never does) and reads `REDIS_AUTH_FILE` for each new connection, `SCRIPT LOAD`, and how a
//! redis-rs error becomes a [`StoreError`] (an error reply to a script is
//! [`StoreError::Script`], never an outage). Also counts the connections a store opens and
//! closes, for upstream's pool stats ([`ConnectionCounts`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bb8_redis::RedisConnectionManager;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind,
    TlsCertificates,
};

use super::options::{RedisAuth, RedisOptions, TlsFiles, redact_url};
use super::script::LuaScript;
use crate::clock::{Clock, SystemClock};
use crate::store::StoreError;
use crate::util::LogThrottle;

/// A pooled connection and the flag that retires it from the pool.
#[derive(Clone)]
pub(super) struct Connection {
    pub(super) redis: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    /// Counts the connection as closed when its last clone is dropped.
    _open: Arc<Open>,
}

/// The connections one store has opened and closed, over all its pools (every cluster node's),
/// what upstream's pool stats report (`ratelimit.redis_pool.cx_total`, `cx_local_close`, and
/// their difference `cx_active`). A connection counts once it is set up (connected, and
/// authenticated), and as closed when the pool drops it: broken, or the store gone.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    opened: AtomicU64,
    closed: AtomicU64,
}

impl ConnectionCounts {
    /// Connections opened so far.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Connections closed so far.
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        // Read closed first: a connection closed between the two reads is then still open.
        let closed = self.closed();
        self.opened().saturating_sub(closed)
    }

    fn opening(self: &Arc<Self>) -> Arc<Open> {
        self.opened.fetch_add(1, Ordering::Relaxed);
        Arc::new(Open(self.clone()))
    }
}

/// One open connection of [`ConnectionCounts`]; dropping it counts the close.
struct Open(Arc<ConnectionCounts>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// bb8-redis's manager, plus broken-connection tracking and credentials read from a file.
pub(super) struct Manager {
    source: Source,
    /// `REDIS_AUTH_FILE`: read for every new connection, so a rotated secret is picked up.
    auth_file: Option<PathBuf>,
    /// bb8 reports a failed connect to its waiters as a timeout, so a file that cannot be used
    /// is logged here, at most once a second.
    auth_file_log: LogThrottle,
    counts: Arc<ConnectionCounts>,
}

/// Where new connections go.
enum Source {
    /// A fixed address, through bb8-redis; `info` is its settings, for connections that take
    /// their credentials from the auth file.
    Direct {
        manager: RedisConnectionManager,
        info: ConnectionInfo,
    },
    /// Whichever server the sentinels name as master right now, so a new connection after a
    /// failover reaches the new master.
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        sentinels: Vec<ConnectionInfo>,
        master: String,
    },
}

impl Manager {
    /// The credentials in the auth file, when there is one.
    fn file_auth(&self) -> Result<Option<RedisAuth>, RedisError> {
        let Some(path) = &self.auth_file else {
            return Ok(None);
        };
        RedisAuth::read(path).map(Some).map_err(|e| {
            if let Some(held_back) = self.auth_file_log.allow(SystemClock.now_secs()) {
                tracing::warn!(error = %e, held_back, "no credentials for a new redis connection");
            }
            RedisError::from((ErrorKind::AuthenticationFailed, "REDIS_AUTH_FILE", e))
        })
    }
}

impl bb8::ManageConnection for Manager {
    type Connection = Connection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Connection, RedisError> {
        let redis = match (&self.source, self.file_auth()?) {
            (Source::Direct { manager, .. }, None) => manager.connect().await?,
            (Source::Direct { info, .. }, Some(auth)) => {
                redis::Client::open(with_auth(info.clone(), &auth))?
                    .get_multiplexed_async_connection()
                    .await?
            }
            (Source::Sentinel { client, .. }, None) => {
                client.lock().await.get_async_connection().await?
            }
            (
                Source::Sentinel {
                    sentinels, master, ..
                },
                Some(auth),
            ) => {
                sentinel_client(sentinels.clone(), master, Some(&auth))?
                    .get_async_connection()
                    .await?
            }
        };
        Ok(Connection {
            redis,
            broken: Arc::new(AtomicBool::new(false)),
            _open: self.counts.opening(),
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

pub(super) fn connection_info(
    url: &str,
    options: &RedisOptions,
) -> Result<ConnectionInfo, StoreError> {
    let info = url
        .into_connection_info()
        .map_err(|e| StoreError::Setup(format!("invalid redis url ({:?})", e.kind())))?;
    Ok(match &options.auth {
        Some(auth) => with_auth(info, auth),
        None => info,
    })
}

/// `info` authenticating with `auth`.
fn with_auth(info: ConnectionInfo, auth: &RedisAuth) -> ConnectionInfo {
    let mut settings = info.redis_settings().clone().set_password(&auth.password);
    if let Some(user) = &auth.username {
        settings = settings.set_username(user);
    }
    info.set_redis_settings(settings)
}

/// What every pool of one store shares: its size, how long a connect may take, where the
/// credentials come from, and where its connections are counted.
#[derive(Clone)]
pub(super) struct PoolSettings {
    pub(super) size: u32,
    pub(super) connect_timeout: Duration,
    /// `REDIS_AUTH_FILE`, read for every new connection.
    pub(super) auth_file: Option<PathBuf>,
    pub(super) counts: Arc<ConnectionCounts>,
}

/// A bb8 pool of connections to one server (or one cluster node), as `settings` say.
pub(super) fn new_pool(
    info: ConnectionInfo,
    settings: &PoolSettings,
) -> Result<bb8::Pool<Manager>, StoreError> {
    let manager = Manager {
        source: Source::Direct {
            manager: RedisConnectionManager::new(info.clone()).map_err(redis_error)?,
            info,
        },
        auth_file: settings.auth_file.clone(),
        auth_file_log: LogThrottle::new(),
        counts: settings.counts.clone(),
    };
    Ok(pool_of(manager, settings.size, settings.connect_timeout))
}

/// A pool of connections to the master the sentinels name (`Target::Sentinel`), as `settings`
/// say.
pub(super) fn sentinel_pool(
    master: &str,
    sentinels: &[String],
    options: &RedisOptions,
    settings: &PoolSettings,
) -> Result<bb8::Pool<Manager>, StoreError> {
    let sentinel_infos = sentinels
        .iter()
        .map(|s| {
            let info = s.as_str().into_connection_info().map_err(|e| {
                StoreError::Setup(format!("invalid sentinel address ({:?})", e.kind()))
            })?;
            Ok(match &options.sentinel_auth {
                Some(auth) => with_auth(info, auth),
                None => info,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let client = sentinel_client(sentinel_infos.clone(), master, options.auth.as_ref())
        .map_err(|e| StoreError::Setup(format!("invalid sentinel settings: {}", describe(&e))))?;
    let manager = Manager {
        source: Source::Sentinel {
            client: tokio::sync::Mutex::new(client),
            sentinels: sentinel_infos,
            master: master.to_string(),
        },
        auth_file: settings.auth_file.clone(),
        auth_file_log: LogThrottle::new(),
        counts: settings.counts.clone(),
    };
    Ok(pool_of(manager, settings.size, settings.connect_timeout))
}

/// A client of `sentinels` for the master named `master`, authenticating to it with `auth`.
fn sentinel_client(
    sentinels: Vec<ConnectionInfo>,
    master: &str,
    auth: Option<&RedisAuth>,
) -> Result<SentinelClient, RedisError> {
    let mut node = redis::RedisConnectionInfo::default();
    if let Some(auth) = auth {
        node = node.set_password(&auth.password);
        if let Some(user) = &auth.username {
            node = node.set_username(user);
        }
    }
    SentinelClient::build(
        sentinels,
        master,
        Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(node)),
        SentinelServerType::Master,
    )
}

pub(super) fn pool_of(
    manager: Manager,
    pool_size: u32,
    connect_timeout: Duration,
) -> bb8::Pool<Manager> {
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
pub(super) fn host_port(url: &str) -> Result<String, StoreError> {
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
pub(super) fn with_tls_files(
    info: ConnectionInfo,
    files: &TlsFiles,
) -> Result<ConnectionInfo, StoreError> {
    let client = redis::Client::build_with_tls(info, tls_certificates(files)?)
        .map_err(|e| StoreError::Setup(format!("invalid TLS files: {}", describe(&e))))?;
    Ok(client.get_connection_info().clone())
}

pub(super) fn tls_certificates(files: &TlsFiles) -> Result<TlsCertificates, StoreError> {
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
pub(super) fn is_script_error(e: &RedisError) -> bool {
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
