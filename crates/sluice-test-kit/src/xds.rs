//! A test xDS server: an ADS (state of the world) server in the test process that serves
//! `RateLimitConfig` snapshots, behaving as go-control-plane's snapshot cache does under Envoy
//! Gateway: on every request whose `version_info` differs from the snapshot's it sends the
//! snapshot (so a NACK, which keeps the old version, gets the same snapshot again at once), and
//! otherwise it waits until the snapshot changes. It records every request it receives.
//!
//! It runs on a runtime of its own on a thread of its own, so [`AdsServer::stop`] can end every
//! connection at once (as a killed control plane would) and [`AdsServer::restart`] brings it
//! back on the same port. TLS, when asked for, is Envoy Gateway's: TLS 1.3 only, ALPN `h2`, a
//! client certificate required and verified against a CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use prost::Message;
use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use sluice::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sluice::proto::ratelimit::config::ratelimit::v3 as rl;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Files for the server side of TLS: its certificate and key, and the CA client certificates
/// must chain to.
#[derive(Clone)]
pub struct AdsTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// One snapshot: a version and its resources (as `Any`, so a test can send undecodable ones).
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub version: String,
    pub resources: Vec<prost_types::Any>,
}

impl Snapshot {
    pub fn new(version: &str, configs: &[rl::RateLimitConfig]) -> Snapshot {
        Snapshot {
            version: version.into(),
            resources: configs
                .iter()
                .map(|c| prost_types::Any {
                    type_url: TYPE_URL.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
        }
    }
}

/// What the server knows and saw; survives a restart.
struct State {
    snapshot: watch::Sender<Option<Snapshot>>,
    requests: Mutex<Vec<(Instant, DiscoveryRequest)>>,
    /// The gRPC metadata each stream opened with.
    stream_metadata: Mutex<Vec<tonic::metadata::MetadataMap>>,
    nonce: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
struct Service(Arc<State>);

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = ResponseStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let state = self.0.clone();
        state
            .stream_metadata
            .lock()
            .unwrap()
            .push(request.metadata().clone());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut snapshots = state.snapshot.subscribe();
            while let Ok(Some(request)) = incoming.message().await {
                let known = request.version_info.clone();
                state
                    .requests
                    .lock()
                    .unwrap()
                    .push((Instant::now(), request));
                // Answer when the snapshot differs from what the client says it has.
                let snapshot = loop {
                    let current = snapshots.borrow_and_update().clone();
                    match current {
                        Some(s) if s.version != known => break s,
                        _ => {
                            if snapshots.changed().await.is_err() {
                                return;
                            }
                        }
                    }
                };
                let nonce = state
                    .nonce
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1;
                let response = DiscoveryResponse {
                    version_info: snapshot.version,
                    resources: snapshot.resources,
                    canary: false,
                    type_url: TYPE_URL.into(),
                    nonce: nonce.to_string(),
                };
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub struct AdsServer {
    pub addr: SocketAddr,
    tls: Option<AdsTls>,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl AdsServer {
    /// Starts on a free loopback port with no snapshot yet.
    pub fn start(tls: Option<AdsTls>) -> AdsServer {
        let (snapshot, _) = watch::channel(None);
        let mut server = AdsServer {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls,
            state: Arc::new(State {
                snapshot,
                requests: Mutex::new(Vec::new()),
                stream_metadata: Mutex::new(Vec::new()),
                nonce: Default::default(),
            }),
            runtime: None,
        };
        server.run().unwrap();
        server
    }

    fn run(&mut self) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // Entered, not blocked on: the tests that use this run inside a runtime of their own.
        let _context = runtime.enter();
        let socket = tokio::net::TcpSocket::new_v4()?;
        // The port is reused by `restart` while old connections may be in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(self.addr)?;
        let listener = socket.listen(128)?;
        self.addr = listener.local_addr().unwrap();
        let service = AggregatedDiscoveryServiceServer::new(Service(self.state.clone()));
        match self.tls.clone() {
            None => {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                runtime.spawn(
                    tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming(incoming),
                );
            }
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls13_server(&tls)));
                let (conns, incoming) = mpsc::channel(16);
                runtime.spawn(async move {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            return;
                        };
                        let (acceptor, conns) = (acceptor.clone(), conns.clone());
                        tokio::spawn(async move {
                            // A refused handshake (no client certificate, TLS 1.2) just ends.
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                let _ = conns.send(Ok::<_, std::io::Error>(stream)).await;
                            }
                        });
                    }
                });
                runtime.spawn(
                    tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming(ReceiverStream::new(incoming)),
                );
            }
        }
        drop(_context);
        self.runtime = Some(runtime);
        Ok(())
    }

    /// Makes `snapshot` the one served; clients waiting for a change get it at once.
    pub fn set(&self, snapshot: Snapshot) {
        self.state.snapshot.send_replace(Some(snapshot));
    }

    /// Every request received so far, with when it arrived.
    pub fn requests(&self) -> Vec<(Instant, DiscoveryRequest)> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn stream_metadata(&self) -> Vec<tonic::metadata::MetadataMap> {
        self.state.stream_metadata.lock().unwrap().clone()
    }

    /// Waits (up to 30 s) for a request that satisfies `check`; returns it.
    pub fn wait_for_request(&self, check: impl Fn(&DiscoveryRequest) -> bool) -> DiscoveryRequest {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((_, r)) = self.requests().into_iter().find(|(_, r)| check(r)) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no such xDS request arrived; got: {:#?}",
                self.requests()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the server and every connection to it, as a killed control plane would.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Serves again on the same port, with the same snapshot and records.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        // The old runtime's listener closes in the background.
        while let Err(e) = self.run() {
            assert!(
                Instant::now() < deadline,
                "cannot listen on {} again: {e}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AdsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Envoy Gateway's xDS server TLS: TLS 1.3 only, `h2`, client certificates required.
fn tls13_server(tls: &AdsTls) -> rustls::ServerConfig {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&tls.client_ca).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let certs = CertificateDer::pem_file_iter(&tls.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&tls.key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// A resource descriptor (builders below add its limit and children).
pub fn node(key: &str, value: &str) -> rl::RateLimitDescriptor {
    rl::RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    }
}

pub fn limited(
    mut d: rl::RateLimitDescriptor,
    unit: rl::RateLimitUnit,
    requests_per_unit: u32,
) -> rl::RateLimitDescriptor {
    d.rate_limit = Some(rl::RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit,
        ..Default::default()
    });
    d
}

pub fn with_children(
    mut d: rl::RateLimitDescriptor,
    children: Vec<rl::RateLimitDescriptor>,
) -> rl::RateLimitDescriptor {
    d.descriptors = children;
    d
}

pub fn config(
    name: &str,
    domain: &str,
    descriptors: Vec<rl::RateLimitDescriptor>,
) -> rl::RateLimitConfig {
    rl::RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors,
    }
}

/// Certificates shaped as Envoy Gateway's: RSA 2048 keys written as PKCS#1 PEM, no extended key
/// usage, one CA. The keys come from the `openssl` command (rcgen on ring cannot generate RSA
/// keys); rcgen signs the certificates.
pub struct EgPki {
    pub dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl EgPki {
    pub fn new() -> EgPki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer};
        let dir = tempfile::tempdir().unwrap();
        let key = rsa_key(&dir, "ca");
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "envoy-gateway test CA");
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), cert.pem()).unwrap();
        EgPki {
            dir,
            issuer: Issuer::new(params, key),
        }
    }

    /// `<name>.crt` and `<name>.key` (PKCS#1) with common name `cn` and `sans`.
    pub fn issue(&self, name: &str, cn: &str, sans: &[&str]) {
        use rcgen::{CertificateParams, DnType};
        let key = rsa_key(&self.dir, name);
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.dir.path().join(format!("{name}.crt")), cert.pem()).unwrap();
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

/// A fresh RSA 2048 key: `<name>.key` as PKCS#1 PEM (what EG's secrets hold), returned for rcgen.
fn rsa_key(dir: &tempfile::TempDir, name: &str) -> rcgen::KeyPair {
    let pkcs8 = dir.path().join(format!("{name}.pkcs8"));
    let pkcs1 = dir.path().join(format!("{name}.key"));
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        pkcs8.to_str().unwrap(),
    ]);
    run(&[
        "rsa",
        "-in",
        pkcs8.to_str().unwrap(),
        "-traditional",
        "-out",
        pkcs1.to_str().unwrap(),
    ]);
    let pem = std::fs::read_to_string(&pkcs1).unwrap();
    assert!(
        pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
        "not PKCS#1: {pem}"
    );
    let key = std::fs::read_to_string(&pkcs8).unwrap();
    std::fs::remove_file(&pkcs8).unwrap();
    rcgen::KeyPair::from_pem_and_sign_algo(&key, &rcgen::PKCS_RSA_SHA256).unwrap()
}
