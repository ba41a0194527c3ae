//! The DICT's request limiting as spec 1.8.0 describes it: token buckets per
//! policy, lazily refilled. `ENTRIES_READ_PARTICIPANT_ANTISCAN` per requesting
//! participant, sized by its category (A–F); `ENTRIES_READ_USER_ANTISCAN`
//! (EMAIL, PHONE keys) and `_V2` (CPF, CNPJ, EVP) per payer, 100 tokens for a
//! natural person, 1,000 for a legal entity, 2 per minute. A lookup is refused
//! (429) when a bucket it draws from is empty; an answer costs 1 (participant
//! and user), a 404 costs 3 (participant) and 20 (user).

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

pub const PARTICIPANT: &str = "ENTRIES_READ_PARTICIPANT_ANTISCAN";
pub const USER: &str = "ENTRIES_READ_USER_ANTISCAN";
pub const USER_V2: &str = "ENTRIES_READ_USER_ANTISCAN_V2";

/// (refill per minute, capacity) of the participant bucket per category.
pub fn category(name: &str) -> Option<(f64, f64)> {
    Some(match name {
        "A" => (12_000.0, 20_000.0),
        "B" => (8_000.0, 15_000.0),
        "C" => (2_000.0, 8_000.0),
        "D" => (500.0, 4_000.0),
        "E" => (50.0, 3_000.0),
        "F" => (2.0, 1_000.0),
        _ => return None,
    })
}

/// The user policy a key type draws from.
pub fn user_policy(key_type: &str) -> &'static str {
    if key_type == "EMAIL" || key_type == "PHONE" { USER } else { USER_V2 }
}

/// What a lookup costs each bucket: (participant, user).
pub fn costs(found: bool) -> (f64, f64) {
    if found { (1.0, 1.0) } else { (3.0, 20.0) }
}

/// One bucket's state, as `GET /policies/` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct BucketState {
    pub name: &'static str,
    pub available: u64,
    pub capacity: u64,
    pub refill_tokens: u64,
    pub refill_period_sec: u64,
}

#[derive(Clone, Debug)]
struct Bucket {
    tokens: f64,
    capacity: f64,
    per_minute: f64,
    at: Instant,
}

impl Bucket {
    fn full((per_minute, capacity): (f64, f64), now: Instant) -> Bucket {
        Bucket { tokens: capacity, capacity, per_minute, at: now }
    }

    fn refill(&mut self, now: Instant) -> f64 {
        let minutes = now.saturating_duration_since(self.at).as_secs_f64() / 60.0;
        self.tokens = (self.tokens + minutes * self.per_minute).min(self.capacity);
        self.at = now;
        self.tokens
    }

    fn state(&mut self, name: &'static str, now: Instant) -> BucketState {
        BucketState {
            name,
            available: self.refill(now).floor() as u64,
            capacity: self.capacity as u64,
            refill_tokens: self.per_minute as u64,
            refill_period_sec: 60,
        }
    }
}

/// Every bucket of the simulated DICT.
pub struct Policies {
    pub category: String,
    participants: HashMap<String, Bucket>,
    users: HashMap<(&'static str, String), Bucket>,
}

/// A payer's bucket size by its id: 11 digits (CPF) a natural person, else a legal entity.
fn user_limits(payer: &str) -> (f64, f64) {
    if payer.len() == 11 { (2.0, 100.0) } else { (2.0, 1_000.0) }
}

impl Policies {
    pub fn new(category: &str) -> Policies {
        Policies { category: category.to_owned(), participants: HashMap::new(), users: HashMap::new() }
    }

    fn participant(&mut self, ispb: &str, now: Instant) -> &mut Bucket {
        let limits = category(&self.category).unwrap_or((12_000.0, 20_000.0));
        self.participants.entry(ispb.to_owned()).or_insert_with(|| Bucket::full(limits, now))
    }

    fn user(&mut self, policy: &'static str, payer: &str, now: Instant) -> &mut Bucket {
        self.users.entry((policy, payer.to_owned())).or_insert_with(|| Bucket::full(user_limits(payer), now))
    }

    /// The empty bucket that refuses this lookup, if any.
    pub fn refusal(&mut self, ispb: &str, payer: &str, key_type: &str, now: Instant) -> Option<&'static str> {
        if self.participant(ispb, now).refill(now) < 1.0 {
            return Some(PARTICIPANT);
        }
        let policy = user_policy(key_type);
        (self.user(policy, payer, now).refill(now) < 1.0).then_some(policy)
    }

    /// Charges an answered lookup.
    pub fn charge(&mut self, ispb: &str, payer: &str, key_type: &str, found: bool, now: Instant) {
        let (participant, user) = costs(found);
        let p = self.participant(ispb, now);
        p.tokens = (p.tokens - participant).max(0.0);
        let u = self.user(user_policy(key_type), payer, now);
        u.tokens = (u.tokens - user).max(0.0);
    }

    /// The participant's buckets as `GET /policies/` lists them (user buckets at a fresh payer's size).
    pub fn states(&mut self, ispb: &str, now: Instant) -> Vec<BucketState> {
        let participant = self.participant(ispb, now).state(PARTICIPANT, now);
        let fresh = |name| Bucket::full(user_limits("00000000000"), now).state(name, now);
        vec![participant, fresh(USER), fresh(USER_V2)]
    }

    /// A new category: the participant buckets start full at its size.
    pub fn set_category(&mut self, name: &str) -> bool {
        if category(name).is_none() {
            return false;
        }
        self.category = name.to_owned();
        self.participants.clear();
        true
    }

    /// Sets the participant bucket's tokens (tests: an almost empty bucket without thousands of lookups).
    pub fn set_participant_tokens(&mut self, ispb: &str, tokens: f64, now: Instant) {
        let bucket = self.participant(ispb, now);
        bucket.refill(now);
        bucket.tokens = tokens.clamp(0.0, bucket.capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_not_found_costs_more_and_an_empty_bucket_refuses() {
        let t0 = Instant::now();
        let mut p = Policies::new("F");
        p.set_participant_tokens("99999010", 4.0, t0);
        assert_eq!(p.refusal("99999010", "12345678901", "CPF", t0), None);
        p.charge("99999010", "12345678901", "CPF", false, t0);
        assert_eq!(p.states("99999010", t0)[0].available, 1);
        p.charge("99999010", "12345678901", "CPF", true, t0);
        assert_eq!(p.refusal("99999010", "12345678901", "CPF", t0), Some(PARTICIPANT));
        // F refills 2 per minute: one token after 30 s.
        assert_eq!(p.refusal("99999010", "12345678901", "CPF", t0 + Duration::from_secs(31)), None);
    }

    #[test]
    fn a_natural_persons_bucket_runs_dry_after_five_misses() {
        let t0 = Instant::now();
        let mut p = Policies::new("A");
        for _ in 0..5 {
            assert_eq!(p.refusal("99999010", "12345678901", "EMAIL", t0), None);
            p.charge("99999010", "12345678901", "EMAIL", false, t0);
        }
        assert_eq!(p.refusal("99999010", "12345678901", "EMAIL", t0), Some(USER));
        assert_eq!(p.refusal("99999010", "12345678901", "CPF", t0), None, "V2 is another bucket");
        assert_eq!(p.refusal("99999010", "12345678000199", "EMAIL", t0), None, "another payer");
    }
}
