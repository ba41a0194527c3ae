//! Slot(channel, n): one stream slot of a channel, on every pod — the holder
//! polls the slot's ICOM stream, the others are hot standbys.
//!
//! Standby tries `acquire(Stream(ch), Some(n))` every acquire interval within
//! the pod's fair share; a grant claims the cursor row (next fence) and resumes
//! the stored pull-next. Each poll cycle runs in a spawned task owning the
//! connection; its result comes back as a message. Lease loss (heartbeat
//! notice, fence lost, lease too short) aborts the task and drops the
//! connection: nothing is acknowledged and the next holder gets the batch
//! again. Every timer and task carries the generation current when it was
//! armed; anything older is dropped. Cycles that keep failing hand the slot
//! over and sit out a cooldown; a standby over its fair share adopts a slot
//! left free past the orphan grace (`slot/failover.rs`).

pub mod acquire;
pub mod cycle;
mod failover;
pub mod handover;
mod phase;
pub mod schedule;
mod transitions;

use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

pub use phase::Phase;

use crate::backoff::Backoff;
use crate::domain::SlotId;
use crate::failover::FailureRun;
use crate::ports::{GrantId, LostCause, PodBeat};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;
use acquire::AcquireResult;
use cycle::CycleReport;
use handover::Holding;

/// How a slot ended its drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// It held nothing.
    Idle,
    /// Lease released, stream left open for the next holder.
    HandedOver,
    /// Stream closed (DELETE) and lease released: no other pod runs this slot.
    Closed,
}

pub enum SlotMsg {
    TryAcquire {
        generation: u64,
    },
    Acquired {
        generation: u64,
        result: AcquireResult,
    },
    Poll {
        generation: u64,
    },
    CycleDone {
        generation: u64,
        report: CycleReport,
    },
    HandedOver {
        generation: u64,
        closed: bool,
    },
    /// From the heartbeat (through the ledger): the lease with `grant` is gone.
    LeaseLost {
        grant: GrantId,
        cause: LostCause,
    },
    /// The pod stops: hand over (or close when no other live pod in `others` runs this slot).
    Drain {
        others: Vec<PodBeat>,
        reply: RpcReplyPort<DrainOutcome>,
    },
}

pub struct SlotState {
    phase: Phase,
    generation: u64,
    holding: Option<Holding>,
    /// The acquire, cycle or handover task in flight (aborted when dropped).
    task: Option<OwnedTask>,
    /// The cycle task's stage (`cycle::REQUESTING` / `cycle::PERSISTING`).
    stage: Arc<AtomicU8>,
    backoff: Backoff,
    drain: Option<PendingDrain>,
    /// Consecutive failed cycles while holding (the failover rule).
    failures: FailureRun,
    /// The acquire in flight adopts an orphan (beyond the fair share).
    adopting: bool,
}

struct PendingDrain {
    close: bool,
    reply: Option<RpcReplyPort<DrainOutcome>>,
}

pub struct Slot {
    pub slot: SlotId,
    pub ctx: TreeContext,
}

impl Slot {
    /// Status id and ledger owner: `slot/cpm/3`.
    pub fn owner(&self) -> String {
        format!("slot/{}", self.slot)
    }
}

impl Actor for Slot {
    type Msg = SlotMsg;
    type State = SlotState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<SlotMsg>, _args: ()) -> Result<SlotState, ActorProcessingErr> {
        let parent = format!("channel/{}", self.slot.channel);
        self.ctx.board.register(&self.owner(), Some(&parent), "slot");
        let t = &self.ctx.config.timing;
        Ok(SlotState {
            phase: Phase::Standby,
            generation: 0,
            holding: None,
            task: None,
            stage: Arc::default(),
            backoff: Backoff::new(t.backoff_base, t.backoff_max),
            drain: None,
            failures: FailureRun::default(),
            adopting: false,
        })
    }

    async fn post_start(&self, me: ActorRef<SlotMsg>, state: &mut SlotState) -> Result<(), ActorProcessingErr> {
        let first_try = self.ctx.config.timing.acquire_interval.mul_f64(rand::random_range(0.0..=0.25));
        // A restarted slot still sits out a cooldown its previous incarnation started.
        self.standby(&me, state, first_try);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<SlotMsg>,
        msg: SlotMsg,
        state: &mut SlotState,
    ) -> Result<(), ActorProcessingErr> {
        let current = state.generation;
        match msg {
            SlotMsg::TryAcquire { generation } if generation == current => self.try_acquire(&me, state),
            SlotMsg::Acquired { generation, result } if generation == current => {
                self.on_acquired(&me, state, result)?
            }
            SlotMsg::Poll { generation } if generation == current => self.poll(&me, state),
            SlotMsg::CycleDone { generation, report } if generation == current => self.on_cycle(&me, state, report)?,
            SlotMsg::HandedOver { generation, closed } if generation == current => {
                self.on_handed_over(&me, state, closed)
            }
            SlotMsg::LeaseLost { grant, cause } => self.on_lease_lost(&me, state, grant, cause),
            SlotMsg::Drain { others, reply } => self.on_drain(&me, state, others, reply),
            _ => tracing::trace!(slot = %self.slot, "stale timer or task result dropped"),
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<SlotMsg>, state: &mut SlotState) -> Result<(), ActorProcessingErr> {
        state.task = None;
        state.holding = None;
        self.ctx.ledger.cancel_reservation(&self.owner());
        if let Some(lease) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release(vec![lease]).await;
        }
        self.ctx.board.set_state(&self.owner(), "stopped");
        Ok(())
    }
}
