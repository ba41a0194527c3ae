//! Throw-away certificates for the private servers' TLS: a CA, a server
//! certificate for 127.0.0.1 / localhost and one client certificate, made with
//! rcgen (the simulator's PKI, ECDSA keys) in a temporary directory that goes
//! away with the value. Two of them make a "wrong CA" for refusal tests.

use std::path::PathBuf;

use cabine_actors::domain::Ispb;

use crate::sim::{ServerKeyKind, TlsError, TlsOptions, provision};

/// The client certificate's CN (any name: the servers check the chain, not the name).
const CLIENT_CN: &str = "99999010";

/// A CA with one server and one client certificate, as PEM files.
pub struct TestPki {
    dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestPki {
    /// Generates a fresh PKI in a new temporary directory.
    pub fn generate() -> Result<TestPki, TlsError> {
        let dir = std::env::temp_dir().join(super::unique_name("cabine_pki"));
        let ispb: Ispb = CLIENT_CN.parse().map_err(TlsError::Config)?;
        let (files, _) = provision(&TlsOptions { dir: dir.clone(), server_key: ServerKeyKind::Ecdsa }, &[ispb])?;
        let client = files.client(CLIENT_CN).ok_or_else(|| TlsError::Config("no client certificate".into()))?;
        Ok(TestPki {
            ca: files.ca_cert.clone(),
            server_cert: files.server_cert.clone(),
            server_key: files.server_key.clone(),
            client_cert: client.cert.clone(),
            client_key: client.key.clone(),
            dir,
        })
    }

    /// What a server started with this PKI is told; `verify_clients`: a client certificate is required.
    pub fn server(&self, verify_clients: bool) -> ServerTls {
        ServerTls { ca: self.ca.clone(), cert: self.server_cert.clone(), key: self.server_key.clone(), verify_clients }
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private server's TLS: its certificate and key, the CA its clients' certificates chain to.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by `ca`.
    pub verify_clients: bool,
}
