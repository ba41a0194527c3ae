//! `--tls DIR`: a throw-away PKI generated with rcgen at start — a CA, a server
//! certificate (SAN 127.0.0.1 and localhost) and a client certificate per ISPB
//! (CN = ISPB) — written to DIR as PEM files, and the rustls server config that
//! requires a client certificate signed by that CA (TLS 1.2 and 1.3).
//!
//! Files: `ca.pem`, `ca-key.pem`, `server.pem`, `server-key.pem`,
//! `client-{ISPB}.pem`, `client-{ISPB}-key.pem` and
//! `client-{ISPB}-identity.pem` (certificate + key, for clients that take one file).
//!
//! The server key is RSA 2048 when it can be had (the Central Bank's suite is
//! ECDHE-RSA-AES128-GCM-SHA256): rcgen on ring cannot generate RSA keys, so
//! the key comes from the `openssl` command; without it (`auto`) the server key
//! is ECDSA P-256 (suite ECDHE-ECDSA-AES128-GCM-SHA256). Client keys are ECDSA P-256.

use std::path::PathBuf;
use std::sync::Arc;

use cabine_actors::domain::Ispb;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::Serialize;
use tokio_rustls::TlsAcceptor;

/// Which key the server certificate gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerKeyKind {
    /// RSA when `openssl` is available, else ECDSA.
    #[default]
    Auto,
    /// RSA 2048 (needs the `openssl` command).
    Rsa,
    /// ECDSA P-256.
    Ecdsa,
}

/// Where to write the PKI and which server key to use.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    pub dir: PathBuf,
    pub server_key: ServerKeyKind,
}

/// The files written, for clients and tests.
#[derive(Clone, Debug, Serialize)]
pub struct TlsFiles {
    pub dir: PathBuf,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// `rsa-2048` or `ecdsa-p256`.
    pub server_key_algorithm: &'static str,
    pub clients: Vec<ClientFiles>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClientFiles {
    pub ispb: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Certificate and key in one PEM.
    pub identity: PathBuf,
}

impl TlsFiles {
    pub fn client(&self, ispb: &str) -> Option<&ClientFiles> {
        self.clients.iter().find(|c| c.ispb == ispb)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("writing {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("RSA key from openssl: {0}")]
    Openssl(String),
    #[error("TLS server configuration: {0}")]
    Config(String),
}

/// Generates the PKI into `opts.dir` (overwriting) and builds the acceptor.
pub fn provision(opts: &TlsOptions, ispbs: &[Ispb]) -> Result<(TlsFiles, TlsAcceptor), TlsError> {
    std::fs::create_dir_all(&opts.dir).map_err(|source| TlsError::Io { path: opts.dir.clone(), source })?;
    let write = |name: &str, text: &str| -> Result<PathBuf, TlsError> {
        let path = opts.dir.join(name);
        std::fs::write(&path, text).map_err(|source| TlsError::Io { path: path.clone(), source })?;
        Ok(path)
    };

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "cabine sim CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_cert_path = write("ca.pem", &ca_cert.pem())?;
    write("ca-key.pem", &ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca, ca_key);

    let (server_key, algorithm) = server_key(opts.server_key)?;
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    server.distinguished_name.push(DnType::CommonName, "icom simulator");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &issuer)?;
    let server_cert_path = write("server.pem", &server_cert.pem())?;
    let server_key_path = write("server-key.pem", &server_key.serialize_pem())?;

    let mut clients = Vec::with_capacity(ispbs.len());
    for ispb in ispbs {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, ispb.as_str());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer)?;
        let name = format!("client-{ispb}");
        clients.push(ClientFiles {
            ispb: ispb.to_string(),
            cert: write(&format!("{name}.pem"), &cert.pem())?,
            key: write(&format!("{name}-key.pem"), &key.serialize_pem())?,
            identity: write(&format!("{name}-identity.pem"), &format!("{}{}", cert.pem(), key.serialize_pem()))?,
        });
    }

    let acceptor = acceptor(ca_cert.der().clone(), server_cert.der().clone(), server_key.serialize_der())?;
    let files = TlsFiles {
        dir: opts.dir.clone(),
        ca_cert: ca_cert_path,
        server_cert: server_cert_path,
        server_key: server_key_path,
        server_key_algorithm: algorithm,
        clients,
    };
    Ok((files, acceptor))
}

fn server_key(kind: ServerKeyKind) -> Result<(KeyPair, &'static str), TlsError> {
    let rsa = || -> Result<KeyPair, TlsError> {
        let pem = openssl_rsa_pem()?;
        Ok(KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256)?)
    };
    match kind {
        ServerKeyKind::Rsa => Ok((rsa()?, "rsa-2048")),
        ServerKeyKind::Ecdsa => Ok((KeyPair::generate()?, "ecdsa-p256")),
        ServerKeyKind::Auto => match rsa() {
            Ok(key) => Ok((key, "rsa-2048")),
            Err(e) => {
                tracing::warn!(error = %e, "no RSA key for the simulator's server certificate: using ECDSA P-256");
                Ok((KeyPair::generate()?, "ecdsa-p256"))
            }
        },
    }
}

fn openssl_rsa_pem() -> Result<String, TlsError> {
    let out = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
        .output()
        .map_err(|e| TlsError::Openssl(e.to_string()))?;
    if !out.status.success() {
        return Err(TlsError::Openssl(String::from_utf8_lossy(&out.stderr).trim().to_owned()));
    }
    String::from_utf8(out.stdout).map_err(|e| TlsError::Openssl(e.to_string()))
}

fn acceptor(ca: CertificateDer<'static>, cert: CertificateDer<'static>, key: Vec<u8>) -> Result<TlsAcceptor, TlsError> {
    let config_err = |e: &dyn std::fmt::Display| TlsError::Config(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(ca).map_err(|e| config_err(&e))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| config_err(&e))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .map_err(|e| config_err(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert], key)
        .map_err(|e| config_err(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
