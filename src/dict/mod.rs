//! DICT key lookups for the bank core (spec 1.8.0 of `bacen/pix-dict-api`):
//! the client ([`client`], XML in [`xml`]), the cluster's buckets mirroring
//! the Central Bank's request limiting ([`bucket`], Lua in Redis), the
//! cluster's lookup cache ([`cache`]) and the lookup that ties them together
//! ([`lookup`]); `GET /v1/dict/entries/{key}` and `cabine dict get` call it.

pub mod bucket;
pub mod cache;
pub mod client;
pub mod lookup;
pub mod xml;

use std::sync::Arc;

use crate::config::Settings;
use crate::redis::guard::ScriptClock;

pub use client::{DictClient, DictError, Found, LookupHeaders};
pub use lookup::{Answer, DictLookups, LookupError, Source};

/// The pod's DICT lookups from its settings; `None` when `dict.enabled` is false.
pub fn from_settings(settings: &Settings, redis: fred::prelude::Client) -> Result<Option<Arc<DictLookups>>, DictError> {
    let d = &settings.dict;
    if !d.enabled {
        return Ok(None);
    }
    let client = DictClient::new(d, &settings.cluster.ispb)?;
    let base = format!("{}:{}:{}", settings.redis.prefix, settings.cluster.name, settings.cluster.ispb);
    let buckets = bucket::DictBuckets::new(redis.clone(), base.clone(), &d.category, ScriptClock::Server);
    let cache_redis = if d.cache_url.is_empty() {
        redis
    } else {
        let own = crate::config::RedisSettings { url: d.cache_url.clone(), ..settings.redis.clone() };
        crate::redis::connect(&own).map_err(|e| DictError::Setup(format!("dict.cache_url: {e}")))?
    };
    let cache = cache::DictCache::new(cache_redis, base, d.cache_found_ttl, d.cache_not_found_ttl, d.stale_ttl);
    Ok(Some(Arc::new(DictLookups::new(client, buckets, cache))))
}
