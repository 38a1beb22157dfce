//! Connections to Redis: the `bb8` pool of [`Wire`] connections (standalone, or to the master the
//! sentinels name), the [`Manager`] that opens them (TLS settings, credentials including
//! `REDIS_AUTH_FILE` read for each new connection) and marks a connection broken when a call
//! fails on it, `SCRIPT LOAD`, and how a redis-rs error becomes a [`StoreError`] (an error reply
//! to a script is [`StoreError::Script`], never an outage). Also counts the connections a store
//! opens and closes, for upstream's pool stats ([`ConnectionCounts`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    ServerErrorKind, TlsCertificates, TlsMode,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::options::{RedisAuth, RedisOptions, TlsFiles, redact_url};
use super::script::LuaScript;
use super::wire::{Heard, Wire};
use crate::clock::{Clock, SystemClock};
use crate::store::StoreError;
use crate::util::LogThrottle;

/// A pooled connection and the flag that retires it from the pool.
#[derive(Clone)]
pub(super) struct Connection {
    pub(super) redis: Wire,
    broken: Arc<AtomicBool>,
    /// Counts the connection as closed when its last clone is dropped.
    _open: Arc<Open>,
}

impl Connection {
    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed) || self.redis.is_failed()
    }
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

/// What every pool of one store shares: its size, how long a connect may take (TLS and the
/// handshake included), the TLS settings for `rediss://` addresses, where the credentials come
/// from, and where its connections are counted.
#[derive(Clone)]
pub(super) struct PoolSettings {
    pub(super) size: u32,
    pub(super) connect_timeout: Duration,
    pub(super) tls: Option<Arc<rustls::ClientConfig>>,
    /// `REDIS_AUTH_FILE`, read for every new connection.
    pub(super) auth_file: Option<PathBuf>,
    pub(super) counts: Arc<ConnectionCounts>,
    /// What the whole store has been told and has said (see `Watch`); each pool keeps its
    /// server's within it.
    pub(super) heard: Arc<Heard>,
}

/// Opens connections for bb8, and tells it which ones failed.
pub(super) struct Manager {
    source: Source,
    settings: PoolSettings,
    /// Where a failed connect is told to the calls waiting for a connection.
    refused: Arc<Refusals>,
    /// A credentials file that cannot be used is logged here, at most once a second: the calls
    /// that fail for it say so to their callers, but the file is the operator's to fix.
    auth_file_log: LogThrottle,
}

/// Where new connections go.
enum Source {
    /// A fixed address and its settings.
    Direct(ConnectionInfo),
    /// Whichever server the sentinels name as master right now, so a new connection after a
    /// failover reaches the new master.
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        /// How to make another client (boxed: one per pool, read once per connection).
        sentinels: Box<Sentinels>,
    },
}

/// How to ask the sentinels: their addresses, the master's name, the sentinels' own
/// credentials, and the certificates of TLS (to the sentinels and to the master alike, as
/// upstream's `REDIS_TLS`) when their addresses are `rediss://`.
struct Sentinels {
    addresses: Vec<ConnectionAddr>,
    master: String,
    auth: Option<RedisAuth>,
    tls: Option<TlsCertificates>,
}

impl Sentinels {
    /// A client of the sentinels that authenticates to the master they name with `auth`.
    fn client(&self, auth: Option<&RedisAuth>) -> Result<SentinelClient, RedisError> {
        let mut builder = SentinelClientBuilder::new(
            self.addresses.clone(),
            &self.master,
            SentinelServerType::Master,
        )?;
        if let Some(auth) = &self.auth {
            builder = builder.set_client_to_sentinel_password(&auth.password);
            if let Some(user) = &auth.username {
                builder = builder.set_client_to_sentinel_username(user);
            }
        }
        if let Some(auth) = auth {
            builder = builder.set_client_to_redis_password(&auth.password);
            if let Some(user) = &auth.username {
                builder = builder.set_client_to_redis_username(user);
            }
        }
        if let Some(certificates) = &self.tls {
            builder = builder
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certificates.clone());
        }
        builder.build()
    }
}

impl Manager {
    /// The credentials in the auth file, when there is one.
    fn file_auth(&self) -> Result<Option<RedisAuth>, RedisError> {
        let Some(path) = &self.settings.auth_file else {
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
        let connected = self.open().await;
        if let Err(e) = &connected {
            self.refused.tell(e);
        }
        connected
    }

    /// Called on checkout: cheap, because a failed call has already set the flag.
    async fn is_valid(&self, conn: &mut Connection) -> Result<(), RedisError> {
        if conn.is_broken() {
            Err(RedisError::from((
                ErrorKind::Io,
                "connection failed earlier",
            )))
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.is_broken()
    }
}

impl Manager {
    /// A new connection, to the address or to the master the sentinels name now.
    async fn open(&self) -> Result<Connection, RedisError> {
        let info = match (&self.source, self.file_auth()?) {
            (Source::Direct(info), None) => info.clone(),
            (Source::Direct(info), Some(auth)) => with_auth(info.clone(), &auth),
            // The sentinels name the master (and redis-rs checks its role) for every new
            // connection, so connections made after a failover reach the new master.
            (Source::Sentinel { client, .. }, None) => client
                .lock()
                .await
                .async_get_client()
                .await?
                .get_connection_info()
                .clone(),
            (Source::Sentinel { sentinels, .. }, Some(auth)) => sentinels
                .client(Some(&auth))?
                .async_get_client()
                .await?
                .get_connection_info()
                .clone(),
        };
        let settings = &self.settings;
        let redis = Wire::connect(
            &info,
            settings.tls.as_ref(),
            settings.connect_timeout,
            settings.heard.clone(),
        )
        .await?;
        Ok(Connection {
            redis,
            broken: Arc::new(AtomicBool::new(false)),
            _open: settings.counts.opening(),
        })
    }
}

/// A bb8 pool of connections to one server (or one cluster node), with what it needs to fail
/// fast when that server refuses connections.
pub(super) struct Pool {
    connections: bb8::Pool<Manager>,
    refused: Arc<Refusals>,
    /// What this server has been told and has said, over all the pool's connections.
    heard: Arc<Heard>,
}

impl Pool {
    /// What this server has been told and has said (see `Watch`).
    pub(super) fn heard(&self) -> &Arc<Heard> {
        &self.heard
    }
}

/// The connects of one pool that failed, told to the calls waiting for a connection.
///
/// bb8 tells a failed connect to none of its waiters: they wait out the pool's whole connection
/// timeout and are told only that it ran out. A Redis that refuses at once (killed, restarting)
/// would then cost every call its deadline, and a call that ran out within a second of the last
/// reply would count as late rather than down (`StoreError::Late`), keeping the circuit breaker
/// closed for that second.
#[derive(Default)]
struct Refusals {
    notify: tokio::sync::Notify,
    last: std::sync::Mutex<String>,
}

impl Refusals {
    fn tell(&self, e: &RedisError) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = describe(e);
        self.notify.notify_waiters();
    }

    fn last(&self) -> String {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
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

/// A bb8 pool of connections to one server (or one cluster node), as `settings` say.
pub(super) fn new_pool(info: ConnectionInfo, settings: &PoolSettings) -> Pool {
    pool_of(Source::Direct(info), settings)
}

/// A pool of connections to the master the sentinels name (`Target::Sentinel`), as `settings`
/// say; over TLS to the sentinels and the master when the sentinels' addresses are `rediss://`.
pub(super) fn sentinel_pool(
    master: &str,
    sentinels: &[String],
    options: &RedisOptions,
    settings: &PoolSettings,
) -> Result<Pool, StoreError> {
    let addresses = sentinels
        .iter()
        .map(|s| {
            s.as_str()
                .into_connection_info()
                .map(|info| info.addr().clone())
                .map_err(|e| {
                    StoreError::Setup(format!("invalid sentinel address ({:?})", e.kind()))
                })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let tls = addresses
        .iter()
        .any(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
    let sentinels = Sentinels {
        addresses,
        master: master.to_string(),
        auth: options.sentinel_auth.clone(),
        tls: if tls {
            Some(tls_certificates(&options.tls)?)
        } else {
            None
        },
    };
    let client = sentinels
        .client(options.auth.as_ref())
        .map_err(|e| StoreError::Setup(format!("invalid sentinel settings: {}", describe(&e))))?;
    Ok(pool_of(
        Source::Sentinel {
            client: tokio::sync::Mutex::new(client),
            sentinels: Box::new(sentinels),
        },
        settings,
    ))
}

/// The TLS files as redis-rs takes them for its connections to the sentinels (and the role
/// check of the master they name): the CA (the public roots without one) and the client
/// certificate. Read once, at start-up, as [`tls_config`] reads them.
fn tls_certificates(files: &TlsFiles) -> Result<TlsCertificates, StoreError> {
    let read = |path: &PathBuf| {
        std::fs::read(path)
            .map_err(|e| StoreError::Setup(format!("cannot read {}: {e}", path.display())))
    };
    let client_tls = match &files.client_cert_and_key {
        Some((cert, key)) => Some(ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        None => None,
    };
    let root_cert = files.ca_cert.as_ref().map(read).transpose()?;
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

fn pool_of(source: Source, settings: &PoolSettings) -> Pool {
    let refused = Arc::new(Refusals::default());
    let heard = Heard::within(&settings.heard);
    let manager = Manager {
        source,
        settings: PoolSettings {
            heard: heard.clone(),
            ..settings.clone()
        },
        refused: refused.clone(),
        auth_file_log: LogThrottle::new(),
    };
    let connections = bb8::Pool::builder()
        .max_size(settings.size.max(1))
        .test_on_check_out(true)
        // Fail fast and let the caller decide: start-up retries with backoff, requests answer
        // UNAVAILABLE at once instead of waiting out their deadline (see `Refusals`).
        .retry_connection(false)
        .connection_timeout(settings.connect_timeout)
        .build_unchecked(manager);
    Pool {
        connections,
        refused,
        heard,
    }
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

/// The TLS settings of connections to `rediss://` addresses: the CA file's certificates, or the
/// bundled public roots without one, and the client certificate when one is given. Files are
/// read once, at start-up.
pub(super) fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>, StoreError> {
    let unreadable = |path: &PathBuf, e: &dyn std::fmt::Display| {
        StoreError::Setup(format!("cannot read {}: {e}", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    match &files.ca_cert {
        Some(ca) => {
            for cert in CertificateDer::pem_file_iter(ca).map_err(|e| unreadable(ca, &e))? {
                roots
                    .add(cert.map_err(|e| unreadable(ca, &e))?)
                    .map_err(|e| StoreError::Setup(format!("invalid TLS files: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| StoreError::Setup(format!("TLS settings: {e}")))?
    .with_root_certificates(roots);
    let config = match &files.client_cert_and_key {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| unreadable(cert, &e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unreadable(cert, &e))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| unreadable(key, &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| StoreError::Setup(format!("invalid TLS files: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
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

/// A connection from `pool`, handed back at once: clones share the connection, and its calls
/// are pipelined on it.
///
/// Fails as soon as a connect the call waits for fails, with that connect's error.
pub(super) async fn checkout(pool: &Pool) -> Result<Connection, StoreError> {
    // Listening before asking: a connect that fails between the two is not missed.
    let refused = pool.refused.notify.notified();
    tokio::pin!(refused);
    refused.as_mut().enable();
    tokio::select! {
        biased;
        pooled = pool.connections.get() => match pooled {
            Ok(pooled) => Ok(Connection::clone(&pooled)),
            Err(bb8::RunError::User(e)) => Err(StoreError::Unavailable(describe(&e))),
            Err(bb8::RunError::TimedOut) => Err(StoreError::Unavailable(
                "timed out waiting for a connection".into(),
            )),
        },
        () = refused => Err(StoreError::Unavailable(pool.refused.last())),
    }
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
