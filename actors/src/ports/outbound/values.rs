//! The values an outbound message carries: priority, deadline (a class or an
//! instant) and status.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// Sending order within a channel: `critical` (salaries, court orders) first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Critical,
    High,
    Normal,
    Low,
}

impl Priority {
    pub const ALL: [Priority; 4] = [Priority::Critical, Priority::High, Priority::Normal, Priority::Low];

    /// 0 (critical) ..= 3 (low): the stored sort key.
    pub fn rank(self) -> i16 {
        self as i16
    }

    pub fn from_rank(rank: i16) -> Option<Priority> {
        Priority::ALL.get(usize::try_from(rank).ok()?).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

impl FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("a priority is critical|high|normal|low, got {s:?}"))
    }
}

/// A named time budget from acceptance to sending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineClass {
    /// 5 minutes by default.
    Standard,
    /// PIX Saque/Troco: 30 seconds by default.
    SaqueTroco,
}

impl DeadlineClass {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadlineClass::Standard => "standard",
            DeadlineClass::SaqueTroco => "saque_troco",
        }
    }
}

impl FromStr for DeadlineClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "standard" => Ok(DeadlineClass::Standard),
            "saque_troco" => Ok(DeadlineClass::SaqueTroco),
            other => Err(format!("a deadline class is standard|saque_troco, got {other:?}")),
        }
    }
}

/// The budget of each [`DeadlineClass`] (config `outbound.deadlines`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadlineBudgets {
    pub standard: Duration,
    pub saque_troco: Duration,
}

impl Default for DeadlineBudgets {
    fn default() -> Self {
        DeadlineBudgets { standard: Duration::from_secs(300), saque_troco: Duration::from_secs(30) }
    }
}

/// What the publisher asked for: a class, or an explicit instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    Class(DeadlineClass),
    At(SystemTime),
}

impl Deadline {
    /// The absolute deadline, a class counting from `published` (when the core published it).
    pub fn resolve(self, published: SystemTime, budgets: &DeadlineBudgets) -> SystemTime {
        match self {
            Deadline::At(at) => at,
            Deadline::Class(DeadlineClass::Standard) => published + budgets.standard,
            Deadline::Class(DeadlineClass::SaqueTroco) => published + budgets.saque_troco,
        }
    }
}

/// Where a stored outbound message stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboundStatus {
    /// Waiting for its turn (or for `not_before` after a retry).
    Queued,
    /// Claimed by a sender (claim token), in flight or about to be.
    Sending,
    /// ICOM answered 201 with a ResourceId.
    Sent,
    /// The SPI accepted it (pacs.002).
    Confirmed,
    /// ICOM refused it with a permanent 4xx: not stored, not retried.
    Rejected,
    /// The SPI refused it after storing (pacs.002 RJCT, admi.002).
    RejectedBySpi,
    /// The request could not be read (no MsgId, bad headers, malformed XML): kept, never sent.
    RejectedInvalid,
    /// Its deadline passed and no attempt can have reached the SPI (never
    /// posted, or refused for sure): never sent afterwards.
    Timeout,
    /// No longer sent, yet an attempt may have reached the SPI (5xx, timeout,
    /// transport error, a claim recovered after a crash mid-send): it waits for
    /// the SPI's verdict or the Reconciler; never sent again by itself.
    InDoubt,
    /// Poison: `poison_attempts` failed sends.
    Dead,
}

impl OutboundStatus {
    pub const ALL: [OutboundStatus; 10] = [
        OutboundStatus::Queued,
        OutboundStatus::Sending,
        OutboundStatus::Sent,
        OutboundStatus::Confirmed,
        OutboundStatus::Rejected,
        OutboundStatus::RejectedBySpi,
        OutboundStatus::RejectedInvalid,
        OutboundStatus::Timeout,
        OutboundStatus::InDoubt,
        OutboundStatus::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutboundStatus::Queued => "queued",
            OutboundStatus::Sending => "sending",
            OutboundStatus::Sent => "sent",
            OutboundStatus::Confirmed => "confirmed",
            OutboundStatus::Rejected => "rejected",
            OutboundStatus::RejectedBySpi => "rejected_by_spi",
            OutboundStatus::RejectedInvalid => "rejected_invalid",
            OutboundStatus::Timeout => "timeout",
            OutboundStatus::InDoubt => "in_doubt",
            OutboundStatus::Dead => "dead",
        }
    }
}

impl fmt::Display for OutboundStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OutboundStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        OutboundStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown outbound status {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>().unwrap(), p);
            assert_eq!(Priority::from_rank(p.rank()), Some(p));
        }
        for s in OutboundStatus::ALL {
            assert_eq!(s.as_str().parse::<OutboundStatus>().unwrap(), s);
        }
        assert!("urgent".parse::<Priority>().is_err());
        assert_eq!(Priority::from_rank(4), None);
    }

    #[test]
    fn deadline_classes_count_from_publication() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let b = DeadlineBudgets::default();
        assert_eq!(Deadline::Class(DeadlineClass::SaqueTroco).resolve(t0, &b), t0 + Duration::from_secs(30));
        assert_eq!(Deadline::Class(DeadlineClass::Standard).resolve(t0, &b), t0 + Duration::from_secs(300));
        assert_eq!(Deadline::At(t0).resolve(t0 + Duration::from_secs(5), &b), t0);
    }
}
