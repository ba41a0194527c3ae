//! Parked requests: what the intake gave up on after `outbound.max_deliver`
//! deliveries, kept as it came off the bus until an operator reprocesses it.

use std::time::SystemTime;

use crate::ports::outbound::Inserted;
use crate::ports::outbound_bus::Arrival;

/// Where a parked request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParkedState {
    /// Waiting for an operator.
    Parked,
    /// Parsed again and stored (see `outbound_msg_id`).
    Reprocessed,
}

impl ParkedState {
    pub fn as_str(self) -> &'static str {
        match self {
            ParkedState::Parked => "parked",
            ParkedState::Reprocessed => "reprocessed",
        }
    }
}

impl std::str::FromStr for ParkedState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "parked" => Ok(ParkedState::Parked),
            "reprocessed" => Ok(ParkedState::Reprocessed),
            other => Err(format!("unknown parked state {other:?}")),
        }
    }
}

/// One parked request as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    pub id: i64,
    /// The bus message, its delivery count as it was parked.
    pub arrival: Arrival,
    pub reason: String,
    pub state: ParkedState,
    pub parked_at: SystemTime,
    pub reprocessed_at: Option<SystemTime>,
    /// The MsgId it was stored under by a reprocess (none when unreadable).
    pub outbound_msg_id: Option<String>,
}

/// A page of parked requests, oldest first; `next_after` continues it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParkedPage {
    pub rows: Vec<Parked>,
    pub next_after: Option<i64>,
}

/// The answer to an unpark.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant, reason = "one per operator reprocess call, never stored")]
pub enum Unparked {
    /// Stored now (or found stored: a duplicate), the parked row marked reprocessed.
    Stored(Inserted),
    NotFound,
    /// Reprocessed before: nothing done.
    AlreadyReprocessed,
}
