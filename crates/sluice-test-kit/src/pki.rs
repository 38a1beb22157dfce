//! A throw-away certificate authority for the TLS tests (gRPC TLS and mTLS, Redis over TLS,
//! xDS over TLS, Envoy Gateway's certificates), and a TLS client of HTTP/2 that trusts it.

use std::sync::Arc;

/// A throw-away certificate authority writing PEM files into a temporary directory:
/// `<ca>.pem`, and `<name>.pem` / `<name>.key` for each certificate it issues.
pub struct Pki {
    dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    pub fn new(ca: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Subjects must differ from the issuer's, or OpenSSL takes a leaf for self-signed.
        params
            .distinguished_name
            .push(DnType::CommonName, format!("sluice test {ca}"));
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.path().join(format!("{ca}.pem")), cert.pem()).unwrap();
        Pki {
            dir,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `sans` (DNS names or IPs) signed by this CA.
    pub fn issue(&self, name: &str, sans: &[&str]) {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let key = KeyPair::generate().unwrap();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(
            self.dir.path().join(format!("{name}.key")),
            key.serialize_pem(),
        )
        .unwrap();
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap()
    }

    /// A TLS client's config offering HTTP/2 (ALPN `h2`) that trusts the CA `ca` (`<ca>.pem`)
    /// of this directory, for tests that speak raw HTTP/2 over TLS.
    pub fn h2_client_config(&self, ca: &str) -> Arc<rustls::ClientConfig> {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls_pki_types::CertificateDer::from_pem_file(self.path(ca)).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }
}
