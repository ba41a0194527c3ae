//! The lease port: leased slots of the cluster-wide connection budget (DESIGN §3).
//!
//! A [`Lease`] is valid locally until `valid_until = t0 + lease − drift_margin`,
//! `t0` being a monotonic instant taken BEFORE the acquire/renew command was
//! sent. Holders check [`Lease::is_valid_for`] before every request and never
//! start one that could outlive the lease. Redis holds no fences.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::domain::ChannelId;

/// A pool of leased slots. Serialized as its display form (`cpm:stream`, `csm:send`, `leader`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Pool {
    /// Open streams of a channel (default 4 slots).
    Stream(ChannelId),
    /// Concurrent sends of a channel (default 2 slots).
    Send(ChannelId),
    /// The leader lock: a pool of size 1.
    Leader,
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pool::Stream(c) => write!(f, "{c}:stream"),
            Pool::Send(c) => write!(f, "{c}:send"),
            Pool::Leader => f.write_str("leader"),
        }
    }
}

impl From<Pool> for String {
    fn from(p: Pool) -> String {
        p.to_string()
    }
}

impl TryFrom<String> for Pool {
    type Error = String;
    fn try_from(s: String) -> Result<Pool, String> {
        if s == "leader" {
            return Ok(Pool::Leader);
        }
        let (channel, kind) = s.split_once(':').ok_or_else(|| format!("not a pool: {s:?}"))?;
        let channel: ChannelId = channel.parse()?;
        match kind {
            "stream" => Ok(Pool::Stream(channel)),
            "send" => Ok(Pool::Send(channel)),
            _ => Err(format!("not a pool kind: {kind:?}")),
        }
    }
}

/// Unique per grant (pod id + random nonce): a renew or release with a stale
/// grant changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GrantId(pub String);

impl fmt::Display for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The right to use one slot until `valid_until` (monotonic, local).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub pool: Pool,
    /// 1-based slot number within the pool.
    pub slot: u8,
    pub grant: GrantId,
    pub valid_until: Instant,
}

impl Lease {
    /// Time left before the lease must be considered lost.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// True when a request that may take `request` can start and end inside the lease.
    pub fn is_valid_for(&self, request: Duration) -> bool {
        Instant::now() + request < self.valid_until
    }
}

/// The answer to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    Granted(Lease),
    /// Every slot (or the requested one) is held by someone.
    Full,
    /// Redis forgot its keys (or this is a brand-new cluster): nothing is
    /// granted until the quarantine (lease + lock_delay) ends.
    Quarantined {
        remaining: Duration,
    },
}

/// Why a held lease stopped being ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum LostCause {
    /// The renew's reply arrived after `valid_until` (or none arrived in time).
    #[error("renewal too late")]
    Expired,
    /// The slot's key holds another grant.
    #[error("slot held by another grant")]
    Stolen,
    /// The slot's key is gone (expired in Redis).
    #[error("slot key missing")]
    Missing,
    /// Redis lost its memory (epoch gone or changed).
    #[error("redis amnesia")]
    Amnesia,
    /// Redis could not be reached before `valid_until`.
    #[error("redis unreachable")]
    Unreachable,
}

/// Lease operations that failed as a whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Redis unreachable or slow: nothing granted (fail closed); retry with backoff.
    #[error("lease store unavailable: {0}")]
    Unavailable(String),
    /// The lease is no longer ours: stop using the slot at once.
    #[error("lease lost: {0}")]
    Lost(LostCause),
    /// A bug or a broken server (script error): escalate.
    #[error("lease store fatal: {0}")]
    Fatal(String),
}

/// Who holds a slot, for status pages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pool: Pool,
    pub slot: u8,
    pub grant: String,
    /// Pod id part of the grant.
    pub pod: String,
    /// Redis TTL left in milliseconds (lease + lock_delay at grant).
    pub ttl_ms: i64,
}

/// A quarantine running in the lease store: nothing is granted meanwhile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    pub remaining_ms: u64,
    /// What started it (amnesia, a server restart, partial amnesia and its evidence).
    pub reason: String,
}

/// Leased slots in a shared store; one round trip per call.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes `slot` if given, else the first free slot of `pool`.
    async fn acquire(&self, pool: Pool, slot: Option<u8>) -> Result<Acquired, LeaseError>;
    /// Extends one lease; `Err(Lost(_))` when it is no longer ours.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError>;
    /// Extends every lease this pod holds in one call; per-lease outcome in order.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease, LostCause>>, LeaseError>;
    /// Frees the slot at once if it is still ours; no-op otherwise.
    async fn release(&self, lease: &Lease) -> Result<(), LeaseError>;
    /// Current holders of a pool.
    async fn holders(&self, pool: Pool) -> Result<Vec<Holder>, LeaseError>;
    /// Partial amnesia (DESIGN §3): a renew found a locally valid lease's key
    /// missing or re-granted, so the store lost keys. Starts the quarantine
    /// (lease + lock_delay from now) for the whole cluster and for this pod;
    /// returns its length.
    async fn report_amnesia(&self, evidence: &str) -> Result<Duration, LeaseError>;
    /// The quarantine running now, if any.
    async fn quarantine(&self) -> Result<Option<Quarantine>, LeaseError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_serialize_as_their_display_form() {
        for pool in [Pool::Stream(ChannelId::Cpm), Pool::Send(ChannelId::Csm), Pool::Leader] {
            let json = serde_json::to_string(&pool).unwrap();
            assert_eq!(json, format!("\"{pool}\""));
            assert_eq!(serde_json::from_str::<Pool>(&json).unwrap(), pool);
        }
        assert!(serde_json::from_str::<Pool>("\"cpm:other\"").is_err());
    }
}
