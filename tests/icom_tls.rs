//! mTLS between the ICOM client and a TLS server that requires a client
//! certificate: CA, server and client certificates made with rcgen in a temp
//! dir (the server's key is RSA, from a test-only fixture, because ring cannot
//! generate RSA keys). The right certificate connects; none, or one from
//! another CA, fails as `Transport`; a server offering only TLS 1.2 with the
//! Central Bank's `ECDHE-RSA-AES128-GCM-SHA256` negotiates exactly that.

// shared with icom_client.rs, which uses the rest (support/ allows dead code itself)
mod support;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{CipherSuite, ProtocolVersion, RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use cabine::config::{DEFAULT_TOML, Settings};
use cabine::icom::tls::{self, CENTRAL_BANK_SUITE, PemFiles};
use cabine::icom::{EndpointSettings, IcomChannels, IcomEndpoint, WireLimits};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{IcomConnector, PollOutcome};
use support::raw_http::{response, serve_connection};

const PULL: &str = "/api/v1/out/99999010/stream/s1";

/// A CA: where its files go and its certificate.
struct Pki {
    dir: PathBuf,
    ca_pem: String,
}

fn ca(dir: &Path, name: &str) -> (Pki, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).unwrap();
    let pki = Pki { dir: dir.to_owned(), ca_pem: cert.pem() };
    std::fs::write(dir.join(format!("{name}-ca.pem")), &pki.ca_pem).unwrap();
    (pki, Issuer::new(params, key))
}

/// Signs a leaf for `names` (SANs) or a client CN; writes `{file}.pem` / `{file}.key`.
fn leaf(pki: &Pki, issuer: &Issuer<'_, KeyPair>, file: &str, sans: &[&str], key: KeyPair) -> (PathBuf, PathBuf) {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "99999010");
    let cert = params.signed_by(&key, issuer).unwrap();
    let (cert_path, key_path) = (pki.dir.join(format!("{file}.pem")), pki.dir.join(format!("{file}.key")));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

fn rsa_fixture() -> KeyPair {
    let path = format!("{}/tests/data/tls/server-rsa2048.key.pem", env!("CARGO_MANIFEST_DIR"));
    KeyPair::from_pem(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What the server saw of one handshake.
#[derive(Debug)]
struct Seen {
    suite: Option<CipherSuite>,
    version: Option<ProtocolVersion>,
    client_cert: bool,
    error: Option<String>,
}

/// A one-connection TLS server requiring a client certificate from `ca_pem`.
async fn server(
    pki: &Pki,
    cert: &Path,
    key: &Path,
    tls12_central_bank_only: bool,
) -> (String, tokio::task::JoinHandle<Seen>) {
    let mut provider = rustls::crypto::ring::default_provider();
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12_central_bank_only {
        provider.cipher_suites.retain(|s| s.suite() == CENTRAL_BANK_SUITE);
        &[&rustls::version::TLS12]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let provider = Arc::new(provider);
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap()).unwrap();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().unwrap();
    let chain = CertificateDer::pem_file_iter(cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, PrivateKeyDer::from_pem_file(key).unwrap())
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        match acceptor.accept(tcp).await {
            Err(e) => Seen { suite: None, version: None, client_cert: false, error: Some(e.to_string()) },
            Ok(stream) => {
                let (_, conn) = stream.get_ref();
                let seen = Seen {
                    suite: conn.negotiated_cipher_suite().map(|s| s.suite()),
                    version: conn.protocol_version(),
                    client_cert: conn.peer_certificates().is_some_and(|c| !c.is_empty()),
                    error: None,
                };
                let mut script = VecDeque::from([response("204 No Content", &[("PI-Pull-Next", PULL)], b"")]);
                serve_connection(stream, &mut script, &mut Vec::new()).await;
                seen
            }
        }
    });
    (url, task)
}

fn endpoint(base_url: String, tls: rustls::ClientConfig) -> Arc<IcomEndpoint> {
    let settings = EndpointSettings {
        channel: ChannelId::Cpm,
        ispb: "99999010".parse().unwrap(),
        base_url,
        limits: WireLimits::ICOM,
        long_poll_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(5),
    };
    Arc::new(IcomEndpoint::new(settings, tls).unwrap())
}

struct Setup {
    _dir: tempfile::TempDir,
    pki: Pki,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    stranger: (PathBuf, PathBuf),
}

fn setup() -> Setup {
    cabine::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (pki, issuer) = ca(dir.path(), "bcb");
    let server = leaf(&pki, &issuer, "server", &["127.0.0.1", "localhost"], rsa_fixture());
    let client = leaf(&pki, &issuer, "client", &[], KeyPair::generate().unwrap());
    let (other, other_issuer) = ca(dir.path(), "other");
    let stranger = leaf(&other, &other_issuer, "stranger", &[], KeyPair::generate().unwrap());
    Setup { _dir: dir, pki, server, client, stranger }
}

fn files<'a>(ca: &'a Path, identity: &'a (PathBuf, PathBuf)) -> PemFiles<'a> {
    PemFiles { ca, cert: &identity.0, key: &identity.1 }
}

fn ca_file(s: &Setup) -> PathBuf {
    s.pki.dir.join("bcb-ca.pem")
}

#[tokio::test]
async fn the_right_certificate_negotiates_the_central_bank_suite_on_tls12() {
    let s = setup();
    let (url, seen) = server(&s.pki, &s.server.0, &s.server.1, true).await;
    let ca = ca_file(&s);
    let tls = tls::mtls_config(files(&ca, &s.client)).unwrap();
    let outcome = endpoint(url, tls).connect().unwrap().start().await;
    assert_eq!(outcome, PollOutcome::Empty { pull_next: PULL.into() });
    let seen = seen.await.unwrap();
    assert_eq!(seen.suite, Some(CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256), "{seen:?}");
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_2));
    assert!(seen.client_cert);
}

#[tokio::test]
async fn configured_channels_connect_over_mtls_through_the_connector_port() {
    let s = setup();
    let (url, seen) = server(&s.pki, &s.server.0, &s.server.1, false).await;
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let env: HashMap<String, String> = [
        ("CABINE__ICOM__CHANNELS__CPM__BASE_URL", url),
        ("CABINE__ICOM__CHANNELS__CPM__CA_FILE", path(&ca_file(&s))),
        ("CABINE__ICOM__CHANNELS__CPM__CERT_FILE", path(&s.client.0)),
        ("CABINE__ICOM__CHANNELS__CPM__KEY_FILE", path(&s.client.1)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let settings = Settings::from_sources(DEFAULT_TOML, None, &env).unwrap();
    let channels = IcomChannels::from_settings(&settings).unwrap();
    let mut stream = channels.stream(ChannelId::Cpm);
    assert_eq!(stream.start().await, PollOutcome::Empty { pull_next: PULL.into() });
    let seen = seen.await.unwrap();
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_3), "TLS 1.3 when the server offers it");
    let mut disabled = channels.stream(ChannelId::Csm);
    assert!(matches!(disabled.start().await, PollOutcome::Transport(t) if t.contains("not configured")));
}

async fn refused(tls12_only: bool, tls: rustls::ClientConfig, s: &Setup) {
    let (url, seen) = server(&s.pki, &s.server.0, &s.server.1, tls12_only).await;
    let outcome = endpoint(url, tls).connect().unwrap().start().await;
    assert!(matches!(outcome, PollOutcome::Transport(_)), "{outcome:?}");
    let seen = seen.await.unwrap();
    assert!(seen.error.is_some(), "the server refused the handshake: {seen:?}");
}

#[tokio::test]
async fn no_client_certificate_is_a_transport_failure() {
    let s = setup();
    for tls12_only in [true, false] {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(ca_file(&s)).unwrap()).unwrap();
        let tls = tls::builder().unwrap().with_root_certificates(roots).with_no_client_auth();
        refused(tls12_only, tls, &s).await;
    }
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_a_transport_failure() {
    let s = setup();
    let ca = ca_file(&s);
    for tls12_only in [true, false] {
        let tls = tls::mtls_config(files(&ca, &s.stranger)).unwrap();
        refused(tls12_only, tls, &s).await;
    }
}

#[tokio::test]
async fn a_server_outside_our_ca_is_refused() {
    let s = setup();
    let (url, seen) = server(&s.pki, &s.server.0, &s.server.1, false).await;
    let other_ca = s.pki.dir.join("other-ca.pem");
    let tls = tls::mtls_config(files(&other_ca, &s.client)).unwrap();
    let outcome = endpoint(url, tls).connect().unwrap().start().await;
    assert!(matches!(&outcome, PollOutcome::Transport(t) if t.to_lowercase().contains("certificate")), "{outcome:?}");
    assert!(seen.await.unwrap().error.is_some());
}
