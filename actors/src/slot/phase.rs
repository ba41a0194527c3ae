//! The slot's state machine, as shown in status:
//! Standby → Acquiring → Holding{fence} ⇄ Polling{fence} → (Draining) → Standby,
//! Draining → Cooldown → Standby after a failover, and Drained once the pod stops.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not holding the slot; tries to acquire it every acquire interval (within fair share).
    Standby,
    /// An acquire (lease, then the fenced claim of the cursor row) is in flight.
    Acquiring,
    /// Holds the lease and fence; waiting for the next poll (pacing or backoff).
    Holding { fence: i64 },
    /// A poll cycle (GET → commit → publish) is in flight in a spawned task.
    Polling { fence: i64 },
    /// Handing the slot over: closing the stream if asked, releasing the lease.
    Draining,
    /// Failed over: this pod stays out of acquiring the slot until the cooldown ends.
    Cooldown,
    /// The pod is stopping: handed over (or closed) and idle for good.
    Drained,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Standby => "standby",
            Phase::Acquiring => "acquiring",
            Phase::Holding { .. } => "holding",
            Phase::Polling { .. } => "polling",
            Phase::Draining => "draining",
            Phase::Cooldown => "cooldown",
            Phase::Drained => "drained",
        }
    }

    pub fn fence(self) -> Option<i64> {
        match self {
            Phase::Holding { fence } | Phase::Polling { fence } => Some(fence),
            _ => None,
        }
    }
}
