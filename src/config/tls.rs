//! TLS to the stores, as configured: `postgres.sslmode` and the `ca_file` /
//! `cert_file` / `key_file` of the `postgres`, `redis` and `nats` sections.
//!
//! Redis and NATS use TLS when their URL says so (`rediss://`, `tls://`);
//! Postgres when `postgres.sslmode` is not `disable`. TLS trusts only the CA
//! file named, never system roots, so a TLS URL without its `ca_file` is
//! refused at boot — and so is a file set where TLS is off (a setting that
//! looks secure and is not). Every named file is read and parsed at boot: a
//! missing or unreadable one is a configuration error naming its key (exit 64).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ConfigError, NatsSettings, PostgresSettings, RedisSettings, Settings};
use crate::store_tls::{StoreTls, Verify};

/// libpq's `sslmode`, without the modes that fall back to plain text (`allow`, `prefer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// No TLS: only for a Postgres on loopback or inside the pod's own network.
    #[default]
    Disable,
    /// Encrypted, the server's certificate not checked. Never for production.
    Require,
    /// Encrypted; the certificate chains to `postgres.ca_file`; any host name.
    VerifyCa,
    /// Encrypted; the certificate chains to `postgres.ca_file` and names the URL's host. Production.
    VerifyFull,
}

/// The three files of one section, whatever the section.
struct Files<'a> {
    section: &'static str,
    ca: &'a Path,
    cert: &'a Path,
    key: &'a Path,
}

impl Files<'_> {
    fn any(&self) -> Option<&'static str> {
        [("ca_file", self.ca), ("cert_file", self.cert), ("key_file", self.key)]
            .into_iter()
            .find(|(_, p)| !p.as_os_str().is_empty())
            .map(|(k, _)| k)
    }

    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    /// TLS is off: no file may be set.
    fn none(&self, why: &str) -> Result<Option<StoreTls>, ConfigError> {
        match self.any() {
            Some(name) => Err(ConfigError::invalid(self.key(name), format!("set, but {why}: TLS is off"))),
            None => Ok(None),
        }
    }

    /// TLS is on with `verify`: the CA file unless nothing is verified, the identity whole or absent.
    fn tls(&self, verify: Verify, ca_rule: &str) -> Result<Option<StoreTls>, ConfigError> {
        let (has_ca, has_cert, has_key) = (!empty(self.ca), !empty(self.cert), !empty(self.key));
        if verify != Verify::Nothing && !has_ca {
            return Err(ConfigError::invalid(self.key("ca_file"), format!("required: {ca_rule}")));
        }
        if verify == Verify::Nothing && has_ca {
            return Err(ConfigError::invalid(
                self.key("ca_file"),
                format!("set, but {ca_rule}: use verify-ca or verify-full to check the server against it"),
            ));
        }
        if has_cert != has_key {
            let missing = if has_cert { "key_file" } else { "cert_file" };
            return Err(ConfigError::invalid(
                self.key(missing),
                "a client certificate needs both cert_file and key_file",
            ));
        }
        let identity = has_cert.then(|| (self.cert.to_owned(), self.key.to_owned()));
        Ok(Some(StoreTls { section: self.section, verify, ca_file: self.ca.to_owned(), identity }))
    }
}

fn empty(p: &Path) -> bool {
    p.as_os_str().is_empty()
}

impl PostgresSettings {
    /// The TLS the pool connects with; `None` for `sslmode = disable`.
    pub fn tls(&self) -> Result<Option<StoreTls>, ConfigError> {
        if self.url.to_ascii_lowercase().contains("sslmode") {
            return Err(ConfigError::invalid(
                "postgres.url",
                "carries sslmode: set postgres.sslmode (and postgres.ca_file) instead",
            ));
        }
        let files = Files { section: "postgres", ca: &self.ca_file, cert: &self.cert_file, key: &self.key_file };
        match self.sslmode {
            SslMode::Disable => files.none("postgres.sslmode is disable"),
            SslMode::Require => files.tls(Verify::Nothing, "postgres.sslmode is require (verifies nothing)"),
            SslMode::VerifyCa => {
                files.tls(Verify::ChainOnly, "postgres.sslmode verify-ca checks the server against it")
            }
            SslMode::VerifyFull => files.tls(Verify::Full, "postgres.sslmode verify-full checks the server against it"),
        }
    }
}

impl RedisSettings {
    /// The TLS the client connects with; `None` unless the URL is `rediss://` (or `valkeys://`).
    pub fn tls(&self) -> Result<Option<StoreTls>, ConfigError> {
        let files = Files { section: "redis", ca: &self.ca_file, cert: &self.cert_file, key: &self.key_file };
        let scheme = self.url.split("://").next().unwrap_or_default().to_ascii_lowercase();
        if scheme.starts_with("rediss") || scheme.starts_with("valkeys") {
            files.tls(Verify::Full, "redis.url is rediss:// and TLS trusts only this CA")
        } else {
            files.none("redis.url is not rediss://")
        }
    }
}

impl NatsSettings {
    /// The TLS the client connects with; `None` unless every server of the URL is `tls://`.
    pub fn tls(&self) -> Result<Option<StoreTls>, ConfigError> {
        let files = Files { section: "nats", ca: &self.ca_file, cert: &self.cert_file, key: &self.key_file };
        let servers: Vec<&str> = self.url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
        let tls = servers.iter().filter(|u| u.to_ascii_lowercase().starts_with("tls://")).count();
        match tls {
            0 => files.none("nats.url is not tls://"),
            n if n == servers.len() => files.tls(Verify::Full, "nats.url is tls:// and TLS trusts only this CA"),
            _ => Err(ConfigError::invalid("nats.url", "mixes tls:// and plain servers: use tls:// for all")),
        }
    }
}

/// The rules above, then every named file read and parsed.
pub(super) fn check_store_tls(s: &Settings) -> Result<(), ConfigError> {
    for tls in [s.postgres.tls()?, s.redis.tls()?, s.nats.tls()?].into_iter().flatten() {
        tls.client_config().map_err(|e| ConfigError::invalid(e.key, e.problem.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_with_env as load;

    fn refused(env: &[(&str, &str)]) -> (String, String) {
        match load(env) {
            Err(ConfigError::Invalid { key, rule }) => (key, rule),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_plain_and_valid() {
        let s = load(&[]).unwrap();
        assert_eq!(s.postgres.sslmode, SslMode::Disable);
        assert!(s.postgres.tls().unwrap().is_none() && s.redis.tls().unwrap().is_none());
        assert!(s.nats.tls().unwrap().is_none());
    }

    #[test]
    fn a_tls_url_without_its_ca_names_the_key() {
        assert_eq!(refused(&[("CABINE__POSTGRES__SSLMODE", "verify-full")]).0, "postgres.ca_file");
        assert_eq!(refused(&[("CABINE__REDIS__URL", "rediss://127.0.0.1:6380")]).0, "redis.ca_file");
        assert_eq!(refused(&[("CABINE__NATS__URL", "tls://127.0.0.1:4443")]).0, "nats.ca_file");
    }

    #[test]
    fn files_where_tls_is_off_are_refused() {
        let (key, rule) = refused(&[("CABINE__REDIS__CA_FILE", "/etc/ca.pem")]);
        assert_eq!(key, "redis.ca_file");
        assert!(rule.contains("not rediss://"), "{rule}");
        assert_eq!(refused(&[("CABINE__POSTGRES__CERT_FILE", "/etc/c.pem")]).0, "postgres.cert_file");
        let require = [("CABINE__POSTGRES__SSLMODE", "require"), ("CABINE__POSTGRES__CA_FILE", "/etc/ca.pem")];
        assert_eq!(refused(&require).0, "postgres.ca_file");
    }

    #[test]
    fn tls_in_the_postgres_url_and_mixed_nats_servers_are_refused() {
        let url = [("CABINE__POSTGRES__URL", "postgres://u@h/db?sslmode=require")];
        assert_eq!(refused(&url).0, "postgres.url");
        assert_eq!(refused(&[("CABINE__NATS__URL", "tls://a:4222,nats://b:4222")]).0, "nats.url");
        assert_eq!(refused(&[("CABINE__POSTGRES__SSLMODE", "prefer")]).0, "postgres.sslmode");
    }

    #[test]
    fn a_missing_file_or_half_an_identity_names_its_key() {
        let missing = [("CABINE__NATS__URL", "tls://h:4222"), ("CABINE__NATS__CA_FILE", "/nonexistent/ca.pem")];
        let (key, rule) = refused(&missing);
        assert_eq!(key, "nats.ca_file");
        assert!(rule.starts_with("/nonexistent/ca.pem: cannot read"), "{rule}");
        let half = [
            ("CABINE__REDIS__URL", "rediss://h:6380"),
            ("CABINE__REDIS__CA_FILE", "/nonexistent/ca.pem"),
            ("CABINE__REDIS__CERT_FILE", "/nonexistent/c.pem"),
        ];
        assert_eq!(refused(&half).0, "redis.key_file");
    }

    #[test]
    fn require_needs_no_file() {
        let s = load(&[("CABINE__POSTGRES__SSLMODE", "require")]).unwrap();
        let tls = s.postgres.tls().unwrap().expect("TLS on");
        assert_eq!(tls.verify, Verify::Nothing);
    }
}
