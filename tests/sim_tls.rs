//! The simulator under `--tls`: the generated PKI (predictable file names), a
//! client with its ISPB's certificate admitted, another ISPB's certificate
//! refused with 403, no certificate refused at the handshake, and the Central
//! Bank's TLS 1.2 suite ECDHE-RSA-AES128-GCM-SHA256 when the server key is RSA.

mod sim_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cabine::sim::{ServerKeyKind, TlsOptions};
use rustls::RootCertStore;
use rustls::client::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sim_support::{ISPB, OTHER, TestSim, start, start_path};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn tls_sim(dir: &Path, key: ServerKeyKind) -> TestSim {
    let dir = dir.to_owned();
    start(move |c| {
        c.ispbs = vec![ISPB.parse().unwrap(), OTHER.parse().unwrap()];
        c.tls = Some(TlsOptions { dir, server_key: key });
        c.hold = Duration::ZERO;
    })
    .await
}

fn roots(dir: &Path) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

fn client_config(dir: &Path, identity: Option<&str>, provider: rustls::crypto::CryptoProvider) -> ClientConfig {
    let builder = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots(dir));
    match identity {
        None => builder.with_no_client_auth(),
        Some(ispb) => {
            let certs: Vec<_> = CertificateDer::pem_file_iter(dir.join(format!("client-{ispb}.pem")))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("client-{ispb}-key.pem"))).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
    }
}

fn https_client(dir: &Path, identity: Option<&str>) -> reqwest::Client {
    let config = client_config(dir, identity, rustls::crypto::ring::default_provider());
    reqwest::Client::builder().tls_backend_preconfigured(config).timeout(Duration::from_secs(10)).build().unwrap()
}

#[tokio::test]
async fn mtls_admits_the_participants_certificate_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    let t = tls_sim(dir.path(), ServerKeyKind::Ecdsa).await;
    let files = t.sim.tls.as_ref().expect("TLS files");
    for name in ["ca.pem", "ca-key.pem", "server.pem", "server-key.pem"] {
        assert!(dir.path().join(name).is_file(), "{name}");
    }
    for ispb in [ISPB, OTHER] {
        for suffix in ["", "-key", "-identity"] {
            assert!(dir.path().join(format!("client-{ispb}{suffix}.pem")).is_file());
        }
        assert_eq!(files.client(ispb).unwrap().cert, dir.path().join(format!("client-{ispb}.pem")));
    }
    assert_eq!(files.server_key_algorithm, "ecdsa-p256");

    let url = |ispb: &str| format!("https://localhost:{}{}", t.sim.primary.port(), start_path(ispb));
    let own = https_client(dir.path(), Some(ISPB));
    let r = own.get(url(ISPB)).header("host", "localhost").send().await.unwrap();
    assert_eq!(r.status(), 204, "the right certificate is admitted");
    assert!(r.headers().contains_key("pi-pull-next"));

    let r = own.get(url(OTHER)).header("host", "localhost").send().await.unwrap();
    assert_eq!(r.status(), 403, "a certificate whose CN is another ISPB");
    assert!(r.text().await.unwrap().contains("/error/forbidden"));
    let other = https_client(dir.path(), Some(OTHER));
    assert_eq!(other.get(url(ISPB)).header("host", "localhost").send().await.unwrap().status(), 403);
    assert_eq!(other.get(url(OTHER)).header("host", "localhost").send().await.unwrap().status(), 204);

    let anonymous = https_client(dir.path(), None);
    assert!(anonymous.get(url(ISPB)).header("host", "localhost").send().await.is_err(), "no certificate, no session");
    let plain = reqwest::Client::new();
    assert!(plain.get(format!("http://127.0.0.1:{}{}", t.sim.primary.port(), start_path(ISPB))).send().await.is_err());

    let audit = t.audit_of(ISPB, "cpm").await;
    assert_eq!(audit["open_streams"], 1, "only the admitted request opened a stream");
    assert!(audit["max_tcp_connections"].as_u64().unwrap() >= 1);
}

/// True when the `openssl` command runs (the simulator makes its RSA server key with it).
fn openssl_available() -> bool {
    std::process::Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success())
}

#[tokio::test]
async fn the_central_banks_tls12_suite_is_served_with_an_rsa_key() {
    use rustls::crypto::ring::cipher_suite::{
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    };
    let dir = tempfile::tempdir().unwrap();
    let t = tls_sim(dir.path(), ServerKeyKind::Auto).await;
    let algorithm = t.sim.tls.as_ref().unwrap().server_key_algorithm;
    let suite = if openssl_available() {
        assert_eq!(algorithm, "rsa-2048", "openssl is installed: the server key must be RSA");
        TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
    } else {
        eprintln!(
            "SKIPPED the RSA-specific assertion: the `openssl` command is missing (ops/deps.sh installs it), so \
             the simulator fell back to an ECDSA server key; checking TLS 1.2 with \
             ECDHE-ECDSA-AES128-GCM-SHA256 instead of the Central Bank's ECDHE-RSA-AES128-GCM-SHA256"
        );
        assert_eq!(algorithm, "ecdsa-p256", "without openssl the automatic choice is ECDSA");
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    };
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![suite];
    let config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots(dir.path()))
        .with_client_auth_cert(
            CertificateDer::pem_file_iter(dir.path().join(format!("client-{ISPB}.pem")))
                .unwrap()
                .map(|c| c.unwrap())
                .collect(),
            PrivateKeyDer::from_pem_file(dir.path().join(format!("client-{ISPB}-key.pem"))).unwrap(),
        )
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(t.sim.primary).await.unwrap();
    let mut tls = connector.connect(ServerName::try_from("127.0.0.1").unwrap(), tcp).await.unwrap();
    let (_, session) = tls.get_ref();
    assert_eq!(session.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(session.negotiated_cipher_suite().unwrap().suite(), suite.suite());
    let request = format!("GET {} HTTP/1.1\r\nHost: icom\r\nConnection: close\r\n\r\n", start_path(ISPB));
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 204"), "{text}");
}
