//! Slot(channel, n): one stream slot of a channel, on every pod — the holder
//! polls the slot's ICOM stream, the others are hot standbys.
//!
//! Standby tries `acquire(Stream(ch), Some(n))` every acquire interval within
//! the pod's fair share; a grant claims the cursor row (next fence, and the
//! previous holder's busy window: DESIGN §2.5) and resumes the stored
//! pull-next. Each poll cycle runs in a spawned task owning the connection;
//! its result comes back as a message. Lease loss (heartbeat notice, fence
//! lost, lease too short) aborts the task and drops the connection: nothing
//! is acknowledged and the next holder gets the batch again. Every timer and
//! task is stamped with the current generation ([`crate::timers`]); anything
//! older is dropped. Cycles that keep failing hand the slot over and sit out a
//! cooldown; a standby over its fair share adopts a slot left free past the
//! orphan grace (`slot/failover.rs`).

pub mod acquire;
pub mod cycle;
mod failover;
pub mod handover;
mod phase;
pub mod schedule;
mod transitions;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

pub use phase::Phase;

use crate::backoff::Backoff;
use crate::domain::SlotId;
use crate::failover::FailureRun;
use crate::lease::Acquisition;
use crate::ports::{GrantId, LostCause, PodBeat};
use crate::timers::{Stamped, Timers};
use crate::tree::context::TreeContext;
use acquire::Granted;
use cycle::{CycleReport, StageCell};

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

/// What a handover does with the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Leave it open for the next holder (who resumes the stored pull-next).
    KeepOpen,
    /// DELETE it on the stored pull-next (no other pod runs this slot).
    Close,
}

pub enum SlotMsg {
    /// A timer or task result, stamped with the generation it was armed in.
    Stamped(u64, Step),
    /// From the heartbeat (through the ledger): the lease with `grant` is gone.
    LeaseLost { grant: GrantId, cause: LostCause },
    /// The pod stops: hand over (or close when no other live pod in `others` runs this slot).
    Drain { others: Vec<PodBeat>, reply: RpcReplyPort<DrainOutcome> },
    /// A task of this slot panicked: the slot fails, its supervisor releases the lease.
    Panicked(String),
}

/// What a slot's timers and tasks bring back.
pub enum Step {
    TryAcquire,
    Acquired(Acquisition<Box<Granted>>),
    Poll,
    CycleDone(CycleReport),
    /// The handover task ended: whether the stream was closed.
    HandedOver(Handover),
}

impl Stamped for SlotMsg {
    type Step = Step;

    fn stamped(generation: u64, step: Step) -> Self {
        SlotMsg::Stamped(generation, step)
    }

    fn panicked(why: String) -> Self {
        SlotMsg::Panicked(why)
    }
}

pub struct SlotState {
    /// Where the slot is, with the data of that phase (the holding, the task).
    phase: Phase,
    /// Stamps timers and task results; moving it on drops the older ones.
    timers: Timers,
    /// The running cycle's stage: a drain aborts a GET, lets a start or a commit finish.
    stage: StageCell,
    /// Delay before the next poll after a failed cycle or acquire.
    backoff: Backoff,
    /// A drain asked for and not answered yet.
    drain: Option<PendingDrain>,
    /// Consecutive failed cycles while holding (the failover rule).
    failures: FailureRun,
}

struct PendingDrain {
    handover: Handover,
    reply: Option<RpcReplyPort<DrainOutcome>>,
}

pub struct Slot {
    pub slot: SlotId,
    pub ctx: TreeContext,
}

impl Slot {
    /// Status id and ledger owner of a slot: `slot/cpm/3`.
    pub fn id(slot: SlotId) -> String {
        format!("slot/{slot}")
    }

    pub fn owner(&self) -> String {
        Self::id(self.slot)
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
            timers: Timers::default(),
            stage: StageCell::default(),
            backoff: Backoff::new(t.backoff_base, t.backoff_max),
            drain: None,
            failures: FailureRun::default(),
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
        match msg {
            SlotMsg::Stamped(generation, step) if state.timers.is_current(generation) => self.step(&me, state, step)?,
            SlotMsg::Stamped(..) => tracing::trace!(slot = %self.slot, "stale timer or task result dropped"),
            SlotMsg::LeaseLost { grant, cause } => self.on_lease_lost(&me, state, grant, cause),
            SlotMsg::Drain { others, reply } => self.on_drain(&me, state, others, reply),
            SlotMsg::Panicked(why) => return Err(why.into()),
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<SlotMsg>, state: &mut SlotState) -> Result<(), ActorProcessingErr> {
        state.phase = Phase::Drained;
        self.ctx.ledger.cancel_reservation(&self.owner());
        if let Some(lease) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release(vec![lease]).await;
        }
        self.ctx.board.set_state(&self.owner(), "stopped");
        Ok(())
    }
}

impl Slot {
    fn step(&self, me: &ActorRef<SlotMsg>, state: &mut SlotState, step: Step) -> Result<(), ActorProcessingErr> {
        match step {
            Step::TryAcquire => self.try_acquire(me, state),
            Step::Acquired(result) => self.on_acquired(me, state, result)?,
            Step::Poll => self.poll(me, state),
            Step::CycleDone(report) => self.on_cycle(me, state, report)?,
            Step::HandedOver(handover) => self.on_handed_over(me, state, handover),
        }
        Ok(())
    }
}
