//! The cluster's DICT lookup cache in Redis: a found entry for
//! `cache_found_ttl` (one with an open claim, like a "not found", for
//! `cache_not_found_ttl`), never an error; and, for a found entry without an
//! open claim, a stale copy kept for `stale_ttl` that is served only while the
//! DICT cannot answer. It may live on a Redis of its own (`dict.cache_url`),
//! apart from the leases.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use fred::types::Expiration;
use serde::{Deserialize, Serialize};

use super::xml::Entry;

/// One cached answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cached {
    /// `None`: the DICT said "not found".
    pub entry: Option<Entry>,
    /// When the DICT answered (ms since the UNIX epoch).
    pub fetched_at_ms: u64,
}

impl Cached {
    pub fn age(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.fetched_at_ms))
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The cache of one deployment and participant.
pub struct DictCache {
    client: Client,
    base: String,
    found_ttl: Duration,
    not_found_ttl: Duration,
    stale_ttl: Duration,
}

impl DictCache {
    pub fn new(
        client: Client,
        base: String,
        found_ttl: Duration,
        not_found_ttl: Duration,
        stale_ttl: Duration,
    ) -> DictCache {
        DictCache { client, base, found_ttl, not_found_ttl, stale_ttl }
    }

    fn key(&self, kind: &str, key: &str) -> String {
        format!("{}:dict:{kind}:{key}", self.base)
    }

    async fn read(&self, kind: &str, key: &str) -> Result<Option<Cached>, String> {
        let raw: Option<String> = self.client.get(self.key(kind, key)).await.map_err(|e| e.to_string())?;
        Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
    }

    /// The fresh answer for `key`, if any.
    pub async fn fresh(&self, key: &str) -> Result<Option<Cached>, String> {
        self.read("cache", key).await
    }

    /// The stale copy of `key`'s entry (found, no open claim), if any.
    pub async fn stale(&self, key: &str) -> Result<Option<Cached>, String> {
        self.read("stale", key).await
    }

    /// Caches what the DICT answered; a found entry without an open claim also as the stale copy.
    pub async fn put(&self, key: &str, answer: &Cached) -> Result<(), String> {
        let text = serde_json::to_string(answer).map_err(|e| e.to_string())?;
        // An entry with an open claim may change owner soon: it lives no longer than a "not found".
        let claimed = answer.entry.as_ref().is_some_and(|e| e.open_claim_creation_date.is_some());
        let ttl = if answer.entry.is_some() && !claimed { self.found_ttl } else { self.not_found_ttl };
        let px = |d: Duration| Some(Expiration::PX(d.as_millis().max(1) as i64));
        let () = self
            .client
            .set(self.key("cache", key), text.as_str(), px(ttl), None, false)
            .await
            .map_err(|e| e.to_string())?;
        match &answer.entry {
            Some(e) if e.open_claim_creation_date.is_none() => {
                let () = self
                    .client
                    .set(self.key("stale", key), text.as_str(), px(self.stale_ttl), None, false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            // The owner may change (an open claim) or the key is gone: no stale copy to serve.
            _ => {
                let _: i64 = self.client.del(self.key("stale", key)).await.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
