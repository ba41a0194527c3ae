//! The rate-bucket port (Redis): the Central Bank's operation token bucket per
//! (ispb, channel), mirrored cluster-wide so the pods together never draw a 429
//! from it. Tokens are counted in milli-tokens (a pacs.002 costs 0.2 = 200).
//! Fail closed: when the store is unreachable nothing is drawn and rows wait.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::ChannelId;

/// A cost in milli-tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cost(pub u64);

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, rhs: Cost) -> Cost {
        Cost(self.0 + rhs.0)
    }
}

/// What each message type costs (config `outbound.bucket.cost_*_milli`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostTable {
    pub pacs008_milli: u64,
    pub pacs002_milli: u64,
    pub other_milli: u64,
}

impl Default for CostTable {
    /// The Central Bank's: 1 per pacs.008, 0.2 per pacs.002, 1 otherwise.
    fn default() -> Self {
        CostTable { pacs008_milli: 1_000, pacs002_milli: 200, other_milli: 1_000 }
    }
}

impl CostTable {
    /// Cost of one message of type `msg_type` (`pacs.008`, `pacs.002`, ...).
    pub fn of(&self, msg_type: &str) -> Cost {
        Cost(match msg_type {
            "pacs.008" => self.pacs008_milli,
            "pacs.002" => self.pacs002_milli,
            _ => self.other_milli,
        })
    }

    /// Cost of a batch: the sum of its messages'.
    pub fn of_batch<'a>(&self, msg_types: impl IntoIterator<Item = &'a str>) -> Cost {
        msg_types.into_iter().map(|t| self.of(t)).fold(Cost(0), |a, b| a + b)
    }
}

/// The answer to a draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// Drawn; `left` milli-tokens remain.
    Taken { left: u64 },
    /// Not enough tokens: nothing drawn; enough will have refilled after `retry_after`.
    Wait { retry_after: Duration },
}

/// A bucket as status pages show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketLevel {
    pub tokens_milli: u64,
    pub capacity_milli: u64,
    /// Tokens per second (= milli-tokens per millisecond).
    pub refill_per_s: u64,
    /// The secondary channel's night schedule (00:00–07:59 Brasília) is in force.
    pub night: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// Store unreachable or slow: treat as no tokens (fail closed), retry later.
    #[error("rate bucket unavailable: {0}")]
    Unavailable(String),
    /// The cost exceeds the bucket's capacity: this draw can never succeed (split the batch).
    #[error("cost {cost} milli-tokens exceeds the bucket's capacity {capacity}")]
    TooCostly { cost: u64, capacity: u64 },
    /// A bug or a broken server (script error): escalate.
    #[error("rate bucket fatal: {0}")]
    Fatal(String),
}

/// The shared token bucket of each channel; one round trip per call.
#[async_trait::async_trait]
pub trait RateBucket: Send + Sync + 'static {
    /// Draws `cost` at once, or nothing.
    async fn try_take(&self, channel: ChannelId, cost: Cost) -> Result<Draw, BucketError>;
    /// The current level, refill included; draws nothing.
    async fn level(&self, channel: ChannelId) -> Result<BucketLevel, BucketError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_the_central_bank_s() {
        let t = CostTable::default();
        assert_eq!(t.of("pacs.008"), Cost(1_000));
        assert_eq!(t.of("pacs.002"), Cost(200));
        assert_eq!(t.of("admi.004"), Cost(1_000));
        assert_eq!(t.of_batch(["pacs.002"; 5]), Cost(1_000));
        assert_eq!(t.of_batch(["pacs.008", "pacs.002"]), Cost(1_200));
    }
}
