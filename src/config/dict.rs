//! The `[dict]` section: where the DICT answers (its base URL, `…/api/v1/`, and
//! the mTLS files), the participant's category (the size of its lookup bucket),
//! the cluster-wide lookup cache's lifetimes and how often the local buckets
//! are re-synchronised from `GET /policies/`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Settings};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DictSettings {
    /// Serve `GET /v1/dict/entries/{key}` on this pod.
    pub enabled: bool,
    /// The DICT API root (spec 1.8.0: `https://dict.pi.rsfn.net.br:16422/api/v1/`).
    pub base_url: String,
    /// The rate-limit API root (`GET /policies/`); empty: `base_url`.
    pub policies_url: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The participant's category, A–F: the capacity and refill of `ENTRIES_READ_PARTICIPANT_ANTISCAN`.
    pub category: String,
    /// Bound on one DICT request.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// The cache's own Redis (`redis://` or `rediss://`, with the `redis.*` TLS files and password);
    /// empty: the pod's Redis. In production give the cache a Redis of its own: its size grows with
    /// the distinct keys looked up, and the leases must never share its memory pressure.
    pub cache_url: String,
    /// Lifetime of a found entry in the cache.
    #[serde(with = "humantime_serde")]
    pub cache_found_ttl: Duration,
    /// Lifetime of a "not found" in the cache.
    #[serde(with = "humantime_serde")]
    pub cache_not_found_ttl: Duration,
    /// How long a found entry stays servable as `stale_cache` while the DICT is unreachable.
    #[serde(with = "humantime_serde")]
    pub stale_ttl: Duration,
    /// The local buckets take the Central Bank's state (`GET /policies/`) this often, and after a 429.
    #[serde(with = "humantime_serde")]
    pub policy_sync_interval: Duration,
}

impl DictSettings {
    /// Where `GET /policies/` is asked.
    pub fn policies_root(&self) -> &str {
        if self.policies_url.is_empty() { &self.base_url } else { &self.policies_url }
    }
}

pub fn check_dict(s: &Settings) -> Result<(), ConfigError> {
    let d = &s.dict;
    if !d.enabled {
        return Ok(());
    }
    if !matches!(d.category.as_str(), "A" | "B" | "C" | "D" | "E" | "F") {
        return Err(ConfigError::invalid("dict.category", format!("{:?} is not a category: one of A..=F", d.category)));
    }
    for (key, url) in [("dict.base_url", d.base_url.as_str()), ("dict.policies_url", d.policies_root())] {
        let parsed = reqwest::Url::parse(url).map_err(|e| ConfigError::invalid(key, format!("{url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || !url.ends_with('/') {
            return Err(ConfigError::invalid(key, format!("{url:?}: an http(s) URL ending in '/' (the API root)")));
        }
        let tls = [&d.ca_file, &d.cert_file, &d.key_file].iter().all(|f| !f.as_os_str().is_empty());
        if parsed.scheme() == "https" && !tls {
            return Err(ConfigError::invalid(
                "dict.ca_file, dict.cert_file, dict.key_file",
                "https needs all three".to_owned(),
            ));
        }
    }
    let zero = [d.request_timeout, d.cache_found_ttl, d.cache_not_found_ttl, d.stale_ttl, d.policy_sync_interval];
    if zero.iter().any(Duration::is_zero) {
        return Err(ConfigError::invalid("dict", "every duration must be greater than zero".to_owned()));
    }
    if d.stale_ttl < d.cache_found_ttl {
        return Err(ConfigError::invalid("dict.stale_ttl", "must be >= dict.cache_found_ttl".to_owned()));
    }
    Ok(())
}
