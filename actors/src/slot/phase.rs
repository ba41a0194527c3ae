//! The slot's state machine, as shown in status, each phase carrying its own
//! data (the holding, the task in flight):
//! Standby → Acquiring → Holding{fence} ⇄ Polling{fence} → (Draining) → Standby,
//! Draining → Cooldown → Standby after a failover, and Drained once the pod stops.

use super::handover::Holding;
use crate::task::OwnedTask;

pub enum Phase {
    /// Not holding the slot; tries to acquire it every acquire interval (within fair share).
    Standby,
    /// An acquire (lease, then the fenced claim of the cursor row) is in flight.
    /// `adopting`: it takes an orphan beyond the pod's fair share.
    Acquiring { task: OwnedTask, adopting: bool },
    /// Holds the lease and fence; waiting for the next poll (pacing or backoff).
    Holding(Holding),
    /// A poll cycle (gate → GET → commit → publish) is in flight in `task`,
    /// which owns the connection and the live gate (an abort marks `holding.gate`
    /// in doubt: `Gate::aborted`).
    Polling { holding: Holding, task: OwnedTask },
    /// Handing the slot over in `task`: closing the stream if asked, releasing
    /// the lease (`grant`: a loss notice for it ends the handover).
    Draining { task: OwnedTask, grant: crate::ports::GrantId },
    /// Failed over: this pod stays out of acquiring the slot until the cooldown ends.
    Cooldown,
    /// The pod is stopping: handed over (or closed) and idle for good.
    Drained,
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Standby => "standby",
            Phase::Acquiring { .. } => "acquiring",
            Phase::Holding(_) => "holding",
            Phase::Polling { .. } => "polling",
            Phase::Draining { .. } => "draining",
            Phase::Cooldown => "cooldown",
            Phase::Drained => "drained",
        }
    }

    /// The fence held, while holding or polling.
    pub fn fence(&self) -> Option<i64> {
        self.holding().map(|h| h.gate.fence)
    }

    pub fn holding(&self) -> Option<&Holding> {
        match self {
            Phase::Holding(h) | Phase::Polling { holding: h, .. } => Some(h),
            _ => None,
        }
    }
}
