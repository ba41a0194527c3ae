//! The DICT buckets shared by the cluster in Redis (`bucket.lua`, one round
//! trip per stage): a lookup is admitted and pre-charged its worst cost (a
//! 404), the difference refunded once the DICT answered (not to a participant
//! bucket the Central Bank's state overwrote meanwhile: a new epoch); a cached
//! answer charges the payer's bucket alone; the Central Bank's state
//! (`GET /policies/{policy}`) overwrites the participant bucket. Unreachable
//! Redis admits (fail-open: rate limits, not the connection cap), logged and
//! counted — the Central Bank's own bucket still stands behind it.

use std::time::Duration;

use fred::prelude::*;

use crate::redis::guard::{GuardScript, ScriptClock, ScriptFailure};

const BUCKET_LUA: &str = include_str!("bucket.lua");

pub const PARTICIPANT: &str = "ENTRIES_READ_PARTICIPANT_ANTISCAN";
pub const USER: &str = "ENTRIES_READ_USER_ANTISCAN";
pub const USER_V2: &str = "ENTRIES_READ_USER_ANTISCAN_V2";

/// What a lookup costs (spec 1.8.0): (participant, user) for an answer and for a 404.
pub const COST_FOUND: (f64, f64) = (1.0, 1.0);
pub const COST_NOT_FOUND: (f64, f64) = (3.0, 20.0);

/// (refill per minute, capacity) of the participant bucket per category (spec 1.8.0).
pub fn category(name: &str) -> (f64, f64) {
    match name {
        "B" => (8_000.0, 15_000.0),
        "C" => (2_000.0, 8_000.0),
        "D" => (500.0, 4_000.0),
        "E" => (50.0, 3_000.0),
        "F" => (2.0, 1_000.0),
        _ => (12_000.0, 20_000.0),
    }
}

/// The user policy a key type draws from: EMAIL and PHONE keys, or the others (V2).
pub fn user_policy(key_type: &str) -> &'static str {
    if key_type == "EMAIL" || key_type == "PHONE" { USER } else { USER_V2 }
}

/// A payer's user bucket: 100 tokens for a natural person (CPF), 1,000 for a legal entity; 2 per minute.
fn user_limits(payer_id: &str) -> (f64, f64) {
    if payer_id.len() == 11 { (2.0, 100.0) } else { (2.0, 1_000.0) }
}

/// What the buckets said of a lookup.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Admitted and pre-charged; `participant_left` tokens after the charge; `epoch` of the
    /// participant bucket (a refund after a newer `set` leaves the participant bucket alone).
    Admitted { participant_left: i64, epoch: i64 },
    /// Refused: the named policy's bucket is empty for `retry_after`.
    Refused { policy: &'static str, retry_after: Duration },
    /// Redis could not be asked: admitted without a charge (fail-open).
    Unchecked(String),
}

/// The cluster's DICT buckets.
pub struct DictBuckets {
    client: Client,
    base: String,
    participant: (f64, f64),
    clock: ScriptClock,
    script: GuardScript,
}

impl DictBuckets {
    /// Keys under `{prefix}:{cluster}:{ispb}:dict:`; the participant bucket sized by `category`.
    pub fn new(client: Client, base: String, category_name: &str, clock: ScriptClock) -> DictBuckets {
        DictBuckets { client, base, participant: category(category_name), clock, script: GuardScript::new(BUCKET_LUA) }
    }

    fn keys(&self, policy: &str, payer_id: &str) -> Vec<String> {
        vec![
            format!("{}:dict:bucket:{PARTICIPANT}", self.base),
            format!("{}:dict:bucket:{policy}:{payer_id}", self.base),
        ]
    }

    async fn call(
        &self,
        op: &str,
        key_type: &str,
        payer_id: &str,
        amounts: (f64, f64),
        set: (f64, f64),
    ) -> Result<Vec<i64>, String> {
        let (u_rate, u_cap) = user_limits(payer_id);
        let args: Vec<Value> = vec![
            op.into(),
            (self.clock.arg() as i64).into(),
            self.participant.1.into(),
            self.participant.0.into(),
            u_cap.into(),
            u_rate.into(),
            amounts.0.into(),
            amounts.1.into(),
            set.0.into(),
            set.1.into(),
        ];
        let keys = self.keys(user_policy(key_type), payer_id);
        self.script.run(&self.client, keys, args).await.map_err(|f| match f {
            ScriptFailure::Transient(e) | ScriptFailure::Fatal(e) => e,
        })
    }

    /// Admits a lookup of a `key_type` key for `payer_id`, pre-charging a 404's cost.
    pub async fn admit(&self, key_type: &str, payer_id: &str) -> Admission {
        admission(self.call("admit", key_type, payer_id, COST_NOT_FOUND, (0.0, 0.0)).await, key_type)
    }

    /// A cached answer served to `payer_id`: its user bucket pays what the DICT would have
    /// charged (1, or 20 for a key not found), so a payer cannot scan keys through the cache.
    /// The participant bucket is not touched: the DICT was not asked.
    pub async fn charge_user(&self, key_type: &str, payer_id: &str, found: bool) -> Admission {
        let cost = if found { COST_FOUND.1 } else { COST_NOT_FOUND.1 };
        admission(self.call("charge_user", key_type, payer_id, (0.0, cost), (0.0, 0.0)).await, key_type)
    }

    /// Gives back what an admitted lookup (of participant `epoch`) was pre-charged beyond its real cost.
    pub async fn refund(&self, key_type: &str, payer_id: &str, amounts: (f64, f64), epoch: i64) {
        if let Err(e) = self.call("refund", key_type, payer_id, amounts, (epoch as f64, 0.0)).await {
            tracing::warn!(error = %e, "DICT bucket refund lost (the mirror stays lower: it refuses earlier)");
        }
    }

    /// Takes the Central Bank's participant bucket (tokens, capacity, refill per minute).
    pub async fn set_participant(&self, tokens: f64, capacity: f64, per_minute: f64) -> Result<(), String> {
        self.call("set", "EVP", "00000000000", (tokens, -1.0), (capacity, per_minute)).await.map(|_| ())
    }

    /// Empties `payer_id`'s user bucket (the Central Bank refused it).
    pub async fn empty_user(&self, key_type: &str, payer_id: &str) -> Result<(), String> {
        self.call("set", key_type, payer_id, (-1.0, 0.0), (0.0, 0.0)).await.map(|_| ())
    }

    /// The participant bucket's tokens now (metrics, status).
    pub async fn participant_tokens(&self) -> Result<i64, String> {
        self.call("peek", "EVP", "00000000000", (0.0, 0.0), (0.0, 0.0)).await.map(|r| r.get(3).copied().unwrap_or(0))
    }
}

/// What the script's reply (`{admitted, refused by, wait_ms, participant, user, epoch}`) says.
fn admission(reply: Result<Vec<i64>, String>, key_type: &str) -> Admission {
    match reply {
        Ok(r) if r.first() == Some(&1) => Admission::Admitted {
            participant_left: r.get(3).copied().unwrap_or(0),
            epoch: r.get(5).copied().unwrap_or(0),
        },
        Ok(r) => {
            let policy = if r.get(1) == Some(&1) { PARTICIPANT } else { user_policy(key_type) };
            let wait = u64::try_from(r.get(2).copied().unwrap_or(1000)).unwrap_or(1000).max(1);
            Admission::Refused { policy, retry_after: Duration::from_millis(wait) }
        }
        Err(e) => {
            metrics::counter!("cabine_dict_bucket_fail_open_total").increment(1);
            tracing::warn!(error = %e, "DICT bucket unreachable: lookup admitted unchecked (fail-open)");
            Admission::Unchecked(e)
        }
    }
}
