//! The listeners: gRPC (Envoy's RLS, health, reflection, and the native API there or on its
//! own port), HTTP (`/healthcheck`, `/json`, `/metrics`, `/rlconfig`), their TLS, connection caps,
//! timeouts and connection age, live config reload, and the health status. Each takes the options it
//! needs; `app` builds them from the settings, wires them to the limiters and runs them.

pub(crate) mod admin;
pub(crate) mod budget;
pub(crate) mod connections;
pub(crate) mod deadline_floor;
pub(crate) mod debug;
mod health;
pub(crate) mod http;
pub(crate) mod named;
pub mod overload;
mod oversized;
pub mod reload;
pub(crate) mod rlqs;
pub(crate) mod rls;
mod routes;
pub(crate) mod serving;
pub mod tls;
mod token;
mod trace_parent;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};

pub use connections::Caps;
pub use health::Health;

use sluice::config::ConfigErrors;
use sluice::rls::PrefixError;
use sluice::store::StoreError;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid configuration:\n{0}")]
    Config(#[from] ConfigErrors),
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    #[error("cannot use the {backend} store: {source}")]
    Store {
        backend: &'static str,
        source: StoreError,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("HTTP server failed: {0}")]
    Http(std::io::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on the Unix socket {path}: {source}")]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gRPC TLS (GRPC_SERVER_USE_TLS) is not supported on a Unix socket (GRPC_UDS)")]
    TlsOnUnixSocket,
    /// `PROMETHEUS_MAPPER_YAML` names a file that does not load.
    #[error("PROMETHEUS_MAPPER_YAML: {0}")]
    Mapper(#[from] sluice::metrics::MapperError),
    /// The configuration source (the xDS client) cannot start.
    #[error("config source: {0}")]
    ConfigSource(Box<dyn std::error::Error + Send + Sync>),
}

/// Where the gRPC port listens: TCP (`GRPC_HOST:GRPC_PORT`) or, as upstream with `GRPC_UDS`, a
/// Unix socket instead.
pub(crate) enum GrpcListener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// Listens on the Unix socket `path`. A socket file left there by a process that is gone (no
/// one accepts on it) is replaced; any other file there is an error, never removed.
pub(crate) fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
    let error = |source| ServeError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
        && std::os::unix::net::UnixStream::connect(path).is_err()
    {
        std::fs::remove_file(path).map_err(error)?;
    }
    UnixListener::bind(path).map_err(error)
}

/// What every gRPC listener needs to know (from `GRPC_*`, `MAX_CONNECTIONS*` and the reload
/// interval, which also paces certificate reloads).
#[derive(Debug, Clone)]
pub struct GrpcOptions {
    /// `GRPC_MAX_CONNECTION_AGE`: GOAWAY after this; zero never.
    pub max_connection_age: Duration,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE`: closed this long after the GOAWAY; zero never.
    pub max_connection_age_grace: Duration,
    /// `GRPC_MAX_CONNECTION_IDLE`: GOAWAY after this long without a call in flight; zero never.
    pub max_connection_idle: Duration,
    /// `GRPC_HANDSHAKE_TIMEOUT`: TLS handshake and HTTP/2 preface done this long after the
    /// accept, or the connection is closed; zero: no deadline.
    pub handshake_timeout: Duration,
    /// `MAX_CONNECTIONS` and `MAX_CONNECTIONS_PER_PEER`, per listener.
    pub caps: Caps,
    pub tls: Option<tls::ServerTls>,
    pub reload_interval: Duration,
    /// The request budgets every gRPC call is read under, shared by every gRPC listener.
    pub(crate) budget: std::sync::Arc<budget::RequestBudget>,
    /// The overload manager's switches: the gRPC listeners stop accepting when it says so.
    pub(crate) overload: std::sync::Arc<overload::Overload>,
    /// `GRPC_MIN_TIMEOUT`: a call of a service that asks the store whose deadline, less the
    /// answer's margin, leaves less than this is answered `DEADLINE_EXCEEDED` at once
    /// (`deadline_floor.rs`).
    pub min_timeout: Duration,
    /// The quota service's bounds (`RLQS_*`): streams, buckets a stream, idle buckets.
    pub rlqs: sluice::rlqs::RlqsOptions,
}

/// Completes on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler cannot fail on Unix");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// Accept-queue length asked of the kernel (it caps it at `net.core.somaxconn`). The default of
/// `TcpListener::bind` (128 here) overflows when hundreds of proxies reconnect at once, e.g. after
/// a deploy: the kernel then drops their SYNs and each waits a full second to retry.
const LISTEN_BACKLOG: u32 = 4096;

/// Largest encoded gRPC message decoded (tonic's default is 4 MiB), for both APIs: Envoy's
/// requests are a few hundred bytes. A larger `RateLimitRequest` is answered `OVER_LIMIT`
/// without being decoded (`oversized.rs`), since an error would let Envoy fail open. Here rather
/// than in `rls.rs` so that `named.rs` and `rls.rs` need not import each other.
pub(crate) const MAX_REQUEST_BYTES: usize = 1 << 20;

pub(crate) fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let listen = || {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // A restarted service can bind while old connections are in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| ServeError::Bind { addr, source })
}
