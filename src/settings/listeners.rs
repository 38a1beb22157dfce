//! Listener settings: where Sluice listens (`GRPC_HOST:GRPC_PORT` or the Unix socket `GRPC_UDS`,
//! `HOST:PORT`), the gRPC listener's TLS, and what each listener grants a connection: the caps per
//! listener and per peer, the handshake, header and idle deadlines, the connection age, the
//! grace of in-flight requests at shutdown, the shortest deadline a gRPC call may carry to be
//! decided, the bytes of unfinished gRPC requests held, and the memory ceiling of the overload
//! manager. Read in one step, [`Listeners::from_vars`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::server::overload::MemoryCeiling;
use crate::server::tls::ServerTls;
use sluice::store::deadline;

use super::{Env, SettingsError};

/// The listener fields of [`Settings`](super::Settings), documented there, which takes them over
/// one by one.
pub(super) struct Listeners {
    pub(super) grpc_addr: SocketAddr,
    pub(super) grpc_uds: Option<PathBuf>,
    pub(super) http_addr: SocketAddr,
    pub(super) grpc_tls: Option<ServerTls>,
    pub(super) grpc_max_connection_age: Duration,
    pub(super) grpc_max_connection_age_grace: Duration,
    pub(super) shutdown_grace: Duration,
    pub(super) max_connections: usize,
    pub(super) max_connections_per_peer: usize,
    pub(super) grpc_handshake_timeout: Duration,
    pub(super) grpc_max_connection_idle: Duration,
    pub(super) http_read_header_timeout: Duration,
    pub(super) pending_request_bytes: PendingRequestBytes,
    pub(super) overload_memory_limit: MemoryCeiling,
    pub(super) grpc_min_timeout: Duration,
}

/// What gRPC calls still receiving their request may hold (`server::budget`); 0: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRequestBytes {
    /// `MAX_PENDING_REQUEST_BYTES_PER_CONNECTION`.
    pub per_connection: usize,
    /// `MAX_PENDING_REQUEST_BYTES_PER_PEER`.
    pub per_peer: usize,
    /// `MAX_PENDING_REQUEST_BYTES`: in the whole process.
    pub total: usize,
}

impl PendingRequestBytes {
    fn from_vars<F: Fn(&str) -> Option<String>>(
        env: &Env<F>,
    ) -> Result<PendingRequestBytes, SettingsError> {
        // 64 MiB in all: 64 messages of the 1 MiB limit at once, thousands of times what Envoys
        // have in flight (their requests are whole in one read and are never counted).
        let total = env.bytes("MAX_PENDING_REQUEST_BYTES", 64 << 20)?;
        let bytes = PendingRequestBytes {
            // Half of the whole, as for connections: one peer leaves room for the others.
            per_peer: env.bytes("MAX_PENDING_REQUEST_BYTES_PER_PEER", total.div_ceil(2))?,
            // Four messages of the largest size at once on one connection.
            per_connection: env.bytes("MAX_PENDING_REQUEST_BYTES_PER_CONNECTION", 4 << 20)?,
            total,
        };
        // A budget below one message of the limit would refuse a whole message of that size.
        let least = crate::server::MAX_REQUEST_BYTES + 64 * 1024;
        for (name, value) in [
            ("MAX_PENDING_REQUEST_BYTES", bytes.total),
            ("MAX_PENDING_REQUEST_BYTES_PER_PEER", bytes.per_peer),
            (
                "MAX_PENDING_REQUEST_BYTES_PER_CONNECTION",
                bytes.per_connection,
            ),
        ] {
            if value != 0 && value < least {
                return Err(env.error(
                    name,
                    format!("at least {least} bytes (a 1 MiB message and its headers), or 0"),
                ));
            }
        }
        Ok(bytes)
    }
}

/// `OVERLOAD_MEMORY_LIMIT`: bytes (`512Mi`, `2Gi` as Kubernetes writes them, or a plain
/// number); `0` turns the overload manager off; unset, the cgroup's limit or the machine's memory.
fn overload_memory_limit<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<MemoryCeiling, SettingsError> {
    if env.raw("OVERLOAD_MEMORY_LIMIT").is_none() {
        return Ok(MemoryCeiling::Detect);
    }
    Ok(match env.bytes("OVERLOAD_MEMORY_LIMIT", 0)? {
        0 => MemoryCeiling::Off,
        bytes => MemoryCeiling::Bytes(bytes as u64),
    })
}

impl Listeners {
    pub(super) fn from_vars<F: Fn(&str) -> Option<String>>(
        env: &Env<F>,
    ) -> Result<Listeners, SettingsError> {
        Ok(Listeners {
            grpc_addr: env.addr("GRPC_HOST", "GRPC_PORT", 8081)?,
            grpc_uds: grpc_uds(env)?,
            http_addr: env.addr("HOST", "PORT", 8080)?,
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
            pending_request_bytes: PendingRequestBytes::from_vars(env)?,
            overload_memory_limit: overload_memory_limit(env)?,
            // What a store call needs at the least (`store::deadline::DEFAULT_FLOOR`).
            grpc_min_timeout: env.duration("GRPC_MIN_TIMEOUT", deadline::DEFAULT_FLOOR)?,
        })
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use crate::settings::tests::settings;

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
    fn pending_request_bytes_and_the_memory_ceiling_are_read_as_sizes() {
        use super::{MemoryCeiling, PendingRequestBytes};
        let s = settings(&[]).unwrap();
        assert_eq!(
            s.pending_request_bytes,
            PendingRequestBytes {
                per_connection: 4 << 20,
                per_peer: 32 << 20,
                total: 64 << 20,
            }
        );
        assert_eq!(s.overload_memory_limit, MemoryCeiling::Detect);
        let s = settings(&[
            ("MAX_PENDING_REQUEST_BYTES", "256Mi"),
            ("MAX_PENDING_REQUEST_BYTES_PER_CONNECTION", "0"),
            ("OVERLOAD_MEMORY_LIMIT", "2Gi"),
        ])
        .unwrap();
        assert_eq!(s.pending_request_bytes.total, 256 << 20);
        assert_eq!(
            s.pending_request_bytes.per_peer,
            128 << 20,
            "half the whole"
        );
        assert_eq!(s.pending_request_bytes.per_connection, 0, "no bound");
        assert_eq!(s.overload_memory_limit, MemoryCeiling::Bytes(2 << 30));
        let off = settings(&[("OVERLOAD_MEMORY_LIMIT", "0")]).unwrap();
        assert_eq!(off.overload_memory_limit, MemoryCeiling::Off);
        for bad in [
            ("MAX_PENDING_REQUEST_BYTES", "lots"),
            ("OVERLOAD_MEMORY_LIMIT", "1Ti"),
        ] {
            assert!(settings(&[bad]).is_err(), "{bad:?}");
        }
        // Below one message of the limit, a whole message would be refused.
        let small = settings(&[("MAX_PENDING_REQUEST_BYTES_PER_CONNECTION", "1Mi")]);
        assert!(small.unwrap_err().reason.contains("at least"));
    }

    #[test]
    fn the_shortest_deadline_a_call_may_carry_defaults_to_100_microseconds() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.grpc_min_timeout, Duration::from_micros(100));
        let s = settings(&[("GRPC_MIN_TIMEOUT", "250us")]).unwrap();
        assert_eq!(s.grpc_min_timeout, Duration::from_micros(250));
        let s = settings(&[("GRPC_MIN_TIMEOUT", "0")]).unwrap();
        assert!(
            s.grpc_min_timeout.is_zero(),
            "0: only a past deadline is refused"
        );
        assert!(settings(&[("GRPC_MIN_TIMEOUT", "short")]).is_err());
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
}
