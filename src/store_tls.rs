//! TLS to the stores (Postgres, Redis, NATS): the rustls client configuration
//! each client is built with, from the PEM files its configuration section
//! names. One rule for all three: the server is trusted through the CA file
//! the section names (`{section}.ca_file`), never through system roots; a
//! client certificate (`cert_file` + `key_file`) is presented when configured.
//! ring provider, TLS 1.3 and 1.2. Errors name the configuration key and the
//! file, never a file's content.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Chain to the CA file and the host name of the URL (Postgres `verify-full`, `rediss://`, `tls://`).
    Full,
    /// Chain to the CA file only, any host name (Postgres `verify-ca`).
    ChainOnly,
    /// Nothing: encrypted but not authenticated (Postgres `require`). Never for production.
    Nothing,
}

/// What one store's TLS client needs: which section configures it, how much to
/// verify, the CA file (required unless [`Verify::Nothing`]) and the optional identity.
#[derive(Clone, Debug)]
pub struct StoreTls {
    /// `postgres`, `redis` or `nats`: the prefix of every key an error names.
    pub section: &'static str,
    pub verify: Verify,
    pub ca_file: PathBuf,
    /// `(cert_file, key_file)` for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A TLS setup that cannot be used: a configuration error, fatal at boot (exit 64).
#[derive(Debug, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct StoreTlsError {
    /// The configuration key at fault (`postgres.ca_file`, `nats.key_file`, ...).
    pub key: String,
    pub problem: TlsProblem,
}

/// What is wrong with the file a key names.
#[derive(Debug, thiserror::Error)]
pub enum TlsProblem {
    #[error("{path}: cannot read: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: no {what} in PEM")]
    Empty { path: PathBuf, what: &'static str },
    #[error("{path}: bad PEM: {reason}")]
    Pem { path: PathBuf, reason: String },
    /// rustls refused the material (a key that does not match its certificate, a CA it cannot use).
    #[error("{0}")]
    Rejected(String),
}

fn fault(key: &str, problem: TlsProblem) -> StoreTlsError {
    StoreTlsError { key: key.to_owned(), problem }
}

impl StoreTls {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    /// Reads the PEM files and builds the client configuration.
    pub fn client_config(&self) -> Result<ClientConfig, StoreTlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = self.verifier(&provider)?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| fault(&self.key("ca_file"), TlsProblem::Rejected(e.to_string())))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let Some((cert_file, key_file)) = &self.identity else { return Ok(builder.with_no_client_auth()) };
        let chain = certificates(&self.key("cert_file"), cert_file)?;
        let key = private_key(&self.key("key_file"), key_file)?;
        builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| fault(&self.key("key_file"), TlsProblem::Rejected(e.to_string())))
    }

    fn verifier(&self, provider: &Arc<CryptoProvider>) -> Result<Arc<dyn ServerCertVerifier>, StoreTlsError> {
        let algorithms = provider.signature_verification_algorithms;
        if self.verify == Verify::Nothing {
            return Ok(Arc::new(AnyCertificate { algorithms }));
        }
        let key = self.key("ca_file");
        let mut roots = RootCertStore::empty();
        for ca in certificates(&key, &self.ca_file)? {
            roots
                .add(ca)
                .map_err(|e| fault(&key, TlsProblem::Pem { path: self.ca_file.clone(), reason: e.to_string() }))?;
        }
        let roots = Arc::new(roots);
        if self.verify == Verify::ChainOnly {
            return Ok(Arc::new(ChainOnly { roots, algorithms }));
        }
        WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map(|v| v as Arc<dyn ServerCertVerifier>)
            .map_err(|e| fault(&key, TlsProblem::Rejected(e.to_string())))
    }
}

/// For a store without TLS whose client type still wants a configuration: trusts
/// no server, presents nothing, and is never used for a handshake.
pub fn trusting_nothing(section: &'static str) -> Result<ClientConfig, StoreTlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| fault(&format!("{section}.ca_file"), TlsProblem::Rejected(e.to_string())))?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth())
}

/// Postgres `verify-ca`: the chain must lead to the CA file; the host name is not checked.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(&cert, &self.roots, intermediates, now, self.algorithms.all)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Postgres `require`: any certificate; the handshake signatures are still checked,
/// so the session is encrypted to whoever holds the presented key.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

fn certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, StoreTlsError> {
    let pem = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fault(key, TlsProblem::Pem { path: path.into(), reason: e.to_string() }))?;
    if certs.is_empty() {
        return Err(fault(key, TlsProblem::Empty { path: path.into(), what: "certificate" }));
    }
    Ok(certs)
}

fn private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, StoreTlsError> {
    let pem = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            fault(key, TlsProblem::Empty { path: path.into(), what: "private key" })
        }
        // The parser's message never quotes the key's bytes.
        other => fault(key, TlsProblem::Pem { path: path.into(), reason: other.to_string() }),
    })
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, StoreTlsError> {
    std::fs::read(path).map_err(|e| fault(key, TlsProblem::Read { path: path.into(), reason: e.to_string() }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    /// A CA (PEM, in a file under `dir`) and a leaf for `name`, signed by it.
    fn chain(dir: &Path, name: &str) -> (PathBuf, CertificateDer<'static>) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let ca_path = dir.join("ca.pem");
        std::fs::write(&ca_path, ca_cert.pem()).unwrap();
        let leaf = CertificateParams::new(vec![name.to_owned()]).unwrap();
        let leaf = leaf.signed_by(&KeyPair::generate().unwrap(), &Issuer::new(ca, ca_key)).unwrap();
        (ca_path, leaf.der().clone())
    }

    fn verdict(verify: Verify, ca_file: PathBuf, leaf: &CertificateDer<'_>, host: &str) -> Result<(), rustls::Error> {
        let tls = StoreTls { section: "postgres", verify, ca_file, identity: None };
        let verifier = tls.verifier(&Arc::new(rustls::crypto::ring::default_provider())).unwrap();
        let name = ServerName::try_from(host.to_owned()).unwrap();
        verifier.verify_server_cert(leaf, &[], &name, &[], UnixTime::now()).map(|_| ())
    }

    #[test]
    fn full_checks_the_name_chain_only_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf) = chain(dir.path(), "db.internal");
        assert!(verdict(Verify::Full, ca.clone(), &leaf, "db.internal").is_ok());
        let wrong_name = verdict(Verify::Full, ca.clone(), &leaf, "127.0.0.1").unwrap_err();
        assert!(wrong_name.to_string().contains("not valid for name"), "{wrong_name}");
        assert!(verdict(Verify::ChainOnly, ca, &leaf, "127.0.0.1").is_ok());
    }

    #[test]
    fn a_foreign_chain_is_refused_even_without_the_name_check() {
        let dir = tempfile::tempdir().unwrap();
        let (_, leaf) = chain(dir.path(), "db.internal");
        let other = tempfile::tempdir().unwrap();
        let (other_ca, _) = chain(other.path(), "db.internal");
        let err = verdict(Verify::ChainOnly, other_ca, &leaf, "db.internal").unwrap_err();
        assert!(err.to_string().starts_with("invalid peer certificate"), "{err}");
    }

    #[test]
    fn errors_name_the_key_and_the_file() {
        let tls =
            StoreTls { section: "nats", verify: Verify::Full, ca_file: "/nonexistent/ca.pem".into(), identity: None };
        let err = tls.client_config().unwrap_err();
        assert_eq!(err.key, "nats.ca_file");
        assert!(err.to_string().starts_with("nats.ca_file: /nonexistent/ca.pem: cannot read"), "{err}");
    }
}
