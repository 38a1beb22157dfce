//! TLS for the gRPC port (upstream's `GRPC_SERVER_USE_TLS`), optionally requiring client
//! certificates (`GRPC_CLIENT_TLS_CACERT`) with a given name (`GRPC_CLIENT_TLS_SAN`).
//!
//! The certificate, key and client CA files are read again whenever they change (checked every
//! `reload_interval`), so rotated certificates apply to new connections without a restart; a set
//! of files that does not load keeps the previous one. Handshakes run in their own tasks with a
//! deadline (`GRPC_HANDSHAKE_TIMEOUT`, shared with the HTTP/2 preface that follows), so a slow
//! or silent client can neither hold up the accept loop nor keep its connection slot.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::server::connections::{Admitted, ConnectionLimit, Expiring};
use crate::server::serving::{Closed, Preface};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA.
    pub client_ca: Option<PathBuf>,
    /// Require this DNS name (or IP) among the client certificate's subject alternative names.
    pub client_san: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("gRPC TLS: {0}")]
pub struct TlsError(String);

impl ServerTls {
    fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.cert.as_path(), self.key.as_path()];
        files.extend(self.client_ca.as_deref());
        files
    }

    fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let err = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
            TlsError(format!("{what} {}: {e}", path.display()))
        };
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| err("cannot read certificates from", &self.cert, &e))?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| err("cannot read the key from", &self.key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca)
                    .map_err(|e| err("cannot read the client CA from", ca, &e))?
                {
                    let cert = cert.map_err(|e| err("cannot read the client CA from", ca, &e))?;
                    roots
                        .add(cert)
                        .map_err(|e| err("bad client CA certificate in", ca, &e))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| err("certificate and key do not match in", &self.cert, &e))?;
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// Modification times of the files, to notice a rotation.
    fn stamp(&self) -> Vec<Option<SystemTime>> {
        self.files()
            .iter()
            .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
            .collect()
    }

    /// Whether a client's certificate carries the required name.
    fn client_allowed<IO>(&self, stream: &TlsStream<IO>) -> bool {
        let Some(san) = &self.client_san else {
            return true;
        };
        let Some(cert) = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
        else {
            return false;
        };
        let (Ok(cert), Ok(name)) = (
            webpki::EndEntityCert::try_from(cert),
            ServerName::try_from(san.as_str()),
        ) else {
            return false;
        };
        cert.verify_is_valid_for_subject_name(&name).is_ok()
    }
}

/// A TLS connection as the gRPC server serves it.
pub(crate) type Connection = Expiring<Preface<TlsStream<Admitted<TcpStream>>>>;

impl<IO: super::connections::Peer> super::connections::Peer for TlsStream<IO> {
    fn peer(&self) -> Option<std::net::IpAddr> {
        self.get_ref().0.peer()
    }
}

/// How a listener's TLS handshakes are done.
pub(crate) struct Handshake {
    pub tls: ServerTls,
    /// How often the files are looked at for a rotation; zero: never.
    pub reload_interval: Duration,
    /// `GRPC_HANDSHAKE_TIMEOUT`: the handshake and then the HTTP/2 preface must be done this
    /// long after the accept; `None`: no deadline.
    pub timeout: Option<Duration>,
    /// Counts the connections closed at that deadline.
    pub closed: Closed,
}

/// Accepts TCP connections on `listener` and yields the ones whose TLS handshake succeeds.
/// Connections count against `limit` from the TCP accept on, so handshakes in progress are
/// capped too. Each is closed `lifetime` after its handshake (`None`: never); the wrapper sits
/// outside TLS so that the server sees the failure directly.
pub(crate) fn incoming(
    listener: TcpListener,
    limit: ConnectionLimit,
    handshake: Handshake,
    lifetime: Option<Duration>,
) -> Result<tokio_stream::wrappers::ReceiverStream<std::io::Result<Connection>>, TlsError> {
    let Handshake {
        tls,
        reload_interval,
        timeout,
        closed,
    } = handshake;
    let config = Arc::new(ArcSwap::new(tls.load()?));
    let tls = Arc::new(tls);
    if !reload_interval.is_zero() {
        tokio::spawn(watch(tls.clone(), config.clone(), reload_interval));
    }
    let (tx, rx) = mpsc::channel(128);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = limit.accept(&listener).await;
            let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
            let acceptor = TlsAcceptor::from(config.load_full());
            if tx.is_closed() {
                return;
            }
            let (tx, tls, closed) = (tx.clone(), tls.clone(), closed.clone());
            tokio::spawn(async move {
                let handshake = acceptor.accept(tcp);
                let done = match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline, handshake).await,
                    None => Ok(handshake.await),
                };
                match done {
                    Ok(Ok(stream)) if tls.client_allowed(&stream) => {
                        let stream = Preface::new(stream, deadline, &closed);
                        let _ = tx.send(Ok(Expiring::new(stream, lifetime))).await;
                    }
                    Ok(Ok(_)) => {
                        tracing::debug!(%peer, "client certificate lacks the required name")
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => {
                        closed.handshake_timeout();
                        tracing::debug!(%peer, "TLS handshake timed out (GRPC_HANDSHAKE_TIMEOUT)")
                    }
                }
            });
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn watch(tls: Arc<ServerTls>, config: Arc<ArcSwap<ServerConfig>>, every: Duration) {
    let mut seen = tls.stamp();
    let mut ticker = tokio::time::interval(every);
    loop {
        ticker.tick().await;
        let now = tls.stamp();
        if now == seen {
            continue;
        }
        seen = now;
        match tls.load() {
            Ok(new) => {
                config.store(new);
                tracing::info!("gRPC TLS certificates reloaded");
            }
            Err(e) => tracing::error!(error = %e, "new TLS files refused; the previous ones stay"),
        }
    }
}
