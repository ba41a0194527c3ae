//! rustls for the ICOM client: the ring provider, TLS 1.2 and 1.3 with the
//! Central Bank's suite `ECDHE-RSA-AES128-GCM-SHA256` offered, the
//! participant's certificate (mTLS) and the CA read from PEM files. Errors
//! name files, never their content.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CipherSuite, ClientConfig, RootCertStore};

/// The suite the Central Bank's ICOM negotiates (TLS 1.2).
pub const CENTRAL_BANK_SUITE: CipherSuite = CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256;

/// A TLS setup that cannot be used: fatal, fix the configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: no {what} in PEM")]
    Empty { path: PathBuf, what: &'static str },
    #[error("{path}: bad PEM: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("tls configuration: {0}")]
    Rustls(String),
}

/// The ring provider with every suite it has, the Central Bank's among them.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The three PEM files of a channel (`ca_file`, `cert_file`, `key_file`).
#[derive(Clone, Copy, Debug)]
pub struct PemFiles<'a> {
    pub ca: &'a Path,
    pub cert: &'a Path,
    pub key: &'a Path,
}

/// mTLS: trusts only the CA file's certificates, presents the participant's chain.
pub fn mtls_config(files: PemFiles<'_>) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in certificates(files.ca)? {
        roots.add(ca).map_err(|e| TlsError::Pem { path: files.ca.into(), reason: e.to_string() })?;
    }
    let chain = certificates(files.cert)?;
    let key_pem = read(files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty { path: files.key.into(), what: "private key" },
        other => TlsError::Pem { path: files.key.into(), reason: other.to_string() },
    })?;
    let mut config = builder()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The config handed to the HTTP client of a plain `http://` channel (a local
/// simulator): no roots, no identity, never used for a handshake.
pub fn plain_config() -> Result<ClientConfig, TlsError> {
    Ok(builder()?.with_root_certificates(RootCertStore::empty()).with_no_client_auth())
}

/// TLS 1.3 and 1.2 on the ring provider.
pub fn builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, TlsError> {
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Rustls(e.to_string()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: path.into(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { path: path.into(), what: "certificate" });
    }
    Ok(certs)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read { path: path.into(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_central_bank_suite_is_offered() {
        let p = provider();
        let suites: Vec<CipherSuite> = p.cipher_suites.iter().map(|s| s.suite()).collect();
        assert!(suites.contains(&CENTRAL_BANK_SUITE), "{suites:?}");
        let config = plain_config().unwrap();
        let offered: Vec<CipherSuite> = config.crypto_provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert!(offered.contains(&CENTRAL_BANK_SUITE));
    }

    #[test]
    fn missing_files_are_named() {
        let missing = Path::new("/nonexistent/ca.pem");
        let err = mtls_config(PemFiles { ca: missing, cert: missing, key: missing }).unwrap_err();
        assert!(err.to_string().starts_with("/nonexistent/ca.pem: cannot read"), "{err}");
    }
}
