//! TLS and mTLS on the gRPC port, and certificate rotation without a restart.

use sluice_test_kit as kit;

use std::time::{Duration, Instant};

use kit::*;
use sluice::proto::RateLimitServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A TLS client trusting `ca`, presenting `identity` (a name in `pki`) if given.
async fn client(
    sluice: &Sluice,
    trust: &Pki,
    ca: &str,
    identity: Option<(&Pki, &str)>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trust.read(ca)))
        .domain_name("localhost");
    if let Some((pki, name)) = identity {
        tls = tls.identity(Identity::from_pem(
            pki.read(&format!("{name}.pem")),
            pki.read(&format!("{name}.key")),
        ));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", sluice.grpc.port()))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

async fn works(sluice: &Sluice, trust: &Pki, ca: &str, identity: Option<(&Pki, &str)>) -> bool {
    let Ok(mut c) = client(sluice, trust, ca, identity).await else {
        return false;
    };
    c.should_rate_limit(request("app", vec![descriptor(&[("user", "x")])]))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_refuses_strangers_and_picks_up_rotated_certificates() {
    let pki = Pki::new("ca");
    pki.issue("server", &["localhost", "127.0.0.1"]);
    pki.issue("client", &["client.example"]);
    pki.issue("other", &["other.example"]);
    // A second authority, for the rotated server certificate.
    let next = Pki::new("next-ca");
    next.issue("server", &["localhost", "127.0.0.1"]);

    // The service reads copies, which the test then replaces.
    let live = tempfile::tempdir().unwrap();
    let (cert, key) = (live.path().join("tls.crt"), live.path().join("tls.key"));
    std::fs::write(&cert, pki.read("server.pem")).unwrap();
    std::fs::write(&key, pki.read("server.key")).unwrap();

    let dir = config_dir(
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
    );
    let ca = pki.path("ca.pem");
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", cert.to_str().unwrap()),
            ("GRPC_SERVER_TLS_KEY", key.to_str().unwrap()),
            ("GRPC_CLIENT_TLS_CACERT", &ca),
            ("GRPC_CLIENT_TLS_SAN", "client.example"),
            ("CONFIG_RELOAD_INTERVAL", "100ms"),
        ],
    );

    assert!(
        works(&sluice, &pki, "ca.pem", Some((&pki, "client"))).await,
        "a valid client is served"
    );
    assert!(
        !works(&sluice, &pki, "ca.pem", None).await,
        "no client certificate: refused"
    );
    assert!(
        !works(&sluice, &pki, "ca.pem", Some((&pki, "other"))).await,
        "wrong name: refused"
    );
    // Plain text on a TLS port fails too.
    let plain = RateLimitServiceClient::connect(format!("http://{}", sluice.grpc)).await;
    if let Ok(mut plain) = plain {
        assert!(
            plain
                .should_rate_limit(request("app", vec![descriptor(&[("user", "x")])]))
                .await
                .is_err()
        );
    }

    // Rotate the server certificate to one from the other authority.
    std::fs::write(&key, next.read("server.key")).unwrap();
    std::fs::write(&cert, next.read("server.pem")).unwrap();
    let rotated = Instant::now();
    while !works(&sluice, &next, "next-ca.pem", Some((&pki, "client"))).await {
        // The client certificate still comes from the first authority, which the server trusts.
        assert!(
            rotated.elapsed() < Duration::from_secs(5),
            "rotation never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !works(&sluice, &pki, "ca.pem", Some((&pki, "client"))).await,
        "the old certificate is gone"
    );
}
