//! One DICT lookup for the bank core, end to end: the cluster's cache first
//! (the payer's anti-scan bucket still charged); then, one request per (key,
//! payer) per pod however many callers wait on it, the
//! shared buckets (refused locally before the Central Bank would), the DICT,
//! the cache filled with what it said (never an error); when the DICT cannot
//! answer, the stale copy of a found entry that had no open claim when the
//! DICT last said it, else unavailable. A 429 from the DICT resynchronises the
//! participant bucket from `GET /policies/{policy}` (the Central Bank's state wins).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use serde::Serialize;

use super::bucket::{self, Admission, DictBuckets};
use super::cache::{Cached, DictCache, now_ms};
use super::client::{DictClient, DictError, Found, LookupHeaders};
use super::xml::Entry;

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Dict,
    Cache,
    StaleCache,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Dict => "dict",
            Source::Cache => "cache",
            Source::StaleCache => "stale_cache",
        }
    }
}

/// A lookup's answer: the entry, or `None` for "not found".
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Answer {
    pub source: Source,
    pub age_ms: u64,
    pub entry: Option<Entry>,
}

/// A lookup with no answer, by what the caller does.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LookupError {
    /// Refused here (our mirror of a bucket is empty) or by the DICT: retry after.
    #[error("rate limited by {policy}")]
    RateLimited { policy: String, retry_after: Duration },
    /// The DICT cannot answer and nothing servable is cached.
    #[error("the DICT is unavailable and no servable entry is cached: {0}")]
    Unavailable(String),
    /// The DICT answered something the spec does not allow.
    #[error("{0}")]
    Malformed(String),
}

type Pending = Shared<BoxFuture<'static, Result<Answer, LookupError>>>;

/// The pod's DICT lookups.
pub struct DictLookups {
    client: DictClient,
    buckets: DictBuckets,
    cache: DictCache,
    inflight: Mutex<HashMap<String, Pending>>,
    /// Last resynchronisation from `GET /policies/` (a burst of 429s asks once).
    synced: Mutex<Option<Instant>>,
}

/// Least time between two resynchronisations forced by 429s.
const RESYNC_MIN: Duration = Duration::from_secs(5);

/// The key type a key's shape says (the DICT's answer names it; the bucket must be chosen before).
pub fn key_type_of(key: &str) -> &'static str {
    let digits = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit());
    match key.len() {
        11 if digits => "CPF",
        14 if digits => "CNPJ",
        _ if key.starts_with('+') => "PHONE",
        _ if key.contains('@') => "EMAIL",
        _ => "EVP",
    }
}

/// Removes a key's pending lookup when its first caller is done (or gone).
struct Done<'a>(&'a Mutex<HashMap<String, Pending>>, String);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.1);
    }
}

impl DictLookups {
    pub fn new(client: DictClient, buckets: DictBuckets, cache: DictCache) -> DictLookups {
        // The series the alert rules read exist from the start (an absent series never fires).
        for (source, outcome) in
            [("dict", "found"), ("dict", "unavailable"), ("stale_cache", "found"), ("local", "rate_limited")]
        {
            metrics::counter!("cabine_dict_lookups_total", "source" => source, "outcome" => outcome).increment(0);
        }
        DictLookups { client, buckets, cache, inflight: Mutex::new(HashMap::new()), synced: Mutex::new(None) }
    }

    /// Looks `key` up for a payment by `payer_id` (`end_to_end_id`).
    pub async fn lookup(
        self: &Arc<Self>,
        key: &str,
        payer_id: &str,
        end_to_end_id: &str,
    ) -> Result<Answer, LookupError> {
        let answer = self.answer(key, payer_id, end_to_end_id).await;
        let (source, outcome) = match &answer {
            Ok(a) => (a.source.as_str(), if a.entry.is_some() { "found" } else { "not_found" }),
            Err(LookupError::RateLimited { .. }) => ("local", "rate_limited"),
            Err(LookupError::Unavailable(_)) => ("dict", "unavailable"),
            Err(LookupError::Malformed(_)) => ("dict", "malformed"),
        };
        metrics::counter!("cabine_dict_lookups_total", "source" => source, "outcome" => outcome).increment(1);
        answer
    }

    async fn answer(self: &Arc<Self>, key: &str, payer_id: &str, end_to_end_id: &str) -> Result<Answer, LookupError> {
        match self.cache.fresh(key).await {
            Ok(Some(c)) => {
                metrics::counter!("cabine_dict_cache_total", "result" => "hit").increment(1);
                // The payer pays its anti-scan cost even for a cached answer.
                let charged = self.buckets.charge_user(key_type_of(key), payer_id, c.entry.is_some()).await;
                if let Admission::Refused { policy, retry_after } = charged {
                    return Err(LookupError::RateLimited { policy: policy.into(), retry_after });
                }
                return Ok(Answer { source: Source::Cache, age_ms: c.age().as_millis() as u64, entry: c.entry });
            }
            Ok(None) => metrics::counter!("cabine_dict_cache_total", "result" => "miss").increment(1),
            Err(e) => {
                metrics::counter!("cabine_dict_cache_total", "result" => "error").increment(1);
                tracing::warn!(error = %e, "DICT cache unreachable: asking the DICT");
            }
        }
        // One request per (key, payer): the DICT sees each payer's own PI-PayerId and EndToEndId.
        let flight = format!("{key}\u{0}{payer_id}");
        let (pending, first) = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            match inflight.get(&flight) {
                Some(p) => (p.clone(), false),
                None => {
                    let (me, k, p, e) = (self.clone(), key.to_owned(), payer_id.to_owned(), end_to_end_id.to_owned());
                    let pending = async move { me.fetch(&k, &p, &e).await }.boxed().shared();
                    inflight.insert(flight.clone(), pending.clone());
                    (pending, true)
                }
            }
        };
        let _done = first.then(|| Done(&self.inflight, flight));
        pending.await
    }

    /// The DICT asked, within the buckets; the cache filled.
    async fn fetch(self: Arc<Self>, key: &str, payer_id: &str, end_to_end_id: &str) -> Result<Answer, LookupError> {
        let key_type = key_type_of(key);
        let charged = match self.buckets.admit(key_type, payer_id).await {
            Admission::Refused { policy, retry_after } => {
                return Err(LookupError::RateLimited { policy: policy.into(), retry_after });
            }
            Admission::Admitted { participant_left, epoch } => {
                metrics::gauge!("cabine_dict_bucket_tokens", "policy" => bucket::PARTICIPANT)
                    .set(participant_left as f64);
                Some(epoch)
            }
            Admission::Unchecked(_) => None,
        };
        let me = &self;
        let refund = |amounts: (f64, f64)| async move {
            if let Some(epoch) = charged {
                me.buckets.refund(key_type, payer_id, amounts, epoch).await;
            }
        };
        let started = Instant::now();
        let asked = self.client.entry(key, &LookupHeaders { payer_id, end_to_end_id }).await;
        metrics::histogram!("cabine_dict_request_seconds").record(started.elapsed().as_secs_f64());
        match asked {
            Ok(found) => {
                let entry = match found {
                    Found::Entry(e) => {
                        let (p, u) = (
                            bucket::COST_NOT_FOUND.0 - bucket::COST_FOUND.0,
                            bucket::COST_NOT_FOUND.1 - bucket::COST_FOUND.1,
                        );
                        refund((p, u)).await;
                        Some(*e)
                    }
                    Found::NotFound => None,
                };
                let cached = Cached { entry, fetched_at_ms: now_ms() };
                if let Err(e) = self.cache.put(key, &cached).await {
                    tracing::warn!(error = %e, "DICT answer not cached (Redis)");
                }
                Ok(Answer { source: Source::Dict, age_ms: 0, entry: cached.entry })
            }
            Err(DictError::RateLimited(kind)) => {
                refund(bucket::COST_NOT_FOUND).await;
                self.after_refusal(key_type, payer_id).await;
                Err(LookupError::RateLimited { policy: format!("DICT {kind}"), retry_after: Duration::from_secs(1) })
            }
            Err(DictError::Unavailable(why)) => {
                // A 5xx or a connection never made was not counted by the DICT; a timeout may have been.
                if why.starts_with("HTTP ") || why.starts_with("connect") {
                    refund(bucket::COST_NOT_FOUND).await;
                }
                self.stale(key, why).await
            }
            Err(e @ (DictError::Malformed(_) | DictError::Setup(_))) => Err(LookupError::Malformed(e.to_string())),
        }
    }

    /// While the DICT cannot answer: the stale copy of a found entry, if one is kept.
    async fn stale(&self, key: &str, why: String) -> Result<Answer, LookupError> {
        match self.cache.stale(key).await {
            Ok(Some(c)) => {
                Ok(Answer { source: Source::StaleCache, age_ms: c.age().as_millis() as u64, entry: c.entry })
            }
            _ => Err(LookupError::Unavailable(why)),
        }
    }

    /// The DICT said 429: take its participant bucket; if that one still has tokens, the payer's was empty.
    async fn after_refusal(&self, key_type: &str, payer_id: &str) {
        let due = {
            let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
            let due = synced.is_none_or(|at| at.elapsed() >= RESYNC_MIN);
            if due {
                *synced = Some(Instant::now());
            }
            due
        };
        let participant_left = if due { self.sync().await.ok() } else { None };
        if participant_left.is_some_and(|left| left >= 1)
            && let Err(e) = self.buckets.empty_user(key_type, payer_id).await
        {
            tracing::warn!(error = %e, "DICT user bucket not emptied after a 429");
        }
    }

    /// Takes the Central Bank's participant bucket from `GET /policies/{policy}` (POLICIES_READ,
    /// 60 a minute; the list, POLICIES_LIST, allows 6); its tokens.
    pub async fn sync(&self) -> Result<u64, String> {
        let outcome = async {
            let policies = self.client.policy(bucket::PARTICIPANT).await.map_err(|e| e.to_string())?;
            let p = policies.policies.iter().find(|p| p.name == bucket::PARTICIPANT).ok_or("no participant policy")?;
            let per_minute = p.refill_tokens as f64 * 60.0 / p.refill_period_sec.max(1) as f64;
            self.buckets.set_participant(p.available as f64, p.capacity as f64, per_minute).await?;
            metrics::gauge!("cabine_dict_bucket_tokens", "policy" => bucket::PARTICIPANT).set(p.available as f64);
            Ok::<u64, String>(p.available)
        }
        .await;
        let label = if outcome.is_ok() { "ok" } else { "failed" };
        metrics::counter!("cabine_dict_policy_syncs_total", "outcome" => label).increment(1);
        outcome
    }
}

#[async_trait::async_trait]
impl cabine_actors::ports::DictPolicies for DictLookups {
    async fn sync(&self) -> Result<cabine_actors::ports::DictLevel, cabine_actors::ports::DictSyncError> {
        let tokens = DictLookups::sync(self).await.map_err(cabine_actors::ports::DictSyncError::Unavailable)?;
        Ok(cabine_actors::ports::DictLevel { participant_tokens: tokens })
    }
}
