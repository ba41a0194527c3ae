//! Handing a slot over (drain, fair share, failover): the transitions, then the task.
//! The stream stays open for the next holder, who resumes it from the stored
//! pull-next; only when asked (no other pod runs this slot) is it closed —
//! DELETE on the stored pull-next, which acknowledges only what is persisted,
//! through the gate like any request — and a `None` cursor stored. Then the
//! gate: `busy_until` is cleared when none of our requests can still be in
//! flight, else left standing so the next holder waits it out (an aborted GET
//! lives on at the server until its hold ends). The lease is released last.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use tokio::time::Instant;

use super::cycle::{Received, Stage};
use super::{DrainOutcome, Handover, PendingDrain, Phase, Slot, SlotMsg, SlotState, Step};
use crate::backoff::jittered;
use crate::domain::SlotId;
use crate::gate::{self, Gate, Ready};
use crate::ledger::HeldLease;
use crate::ports::{CloseOutcome, GrantId, IcomStream, LostCause, PodBeat};
use crate::tree::context::TreeContext;

/// What the slot holds while it holds the lease.
pub struct Holding {
    pub lease: HeldLease,
    /// Loss notices naming another grant are not ours.
    pub grant: GrantId,
    /// The slot's durable permit: our fence, the previous holder's window, the armed request.
    pub gate: Gate,
    /// The pull-next to use next; `None`: start a new stream.
    pub cursor: Option<String>,
    /// False when `cursor` is known but storing it failed (retried on the next empty answer).
    pub cursor_stored: bool,
    /// A received batch not committed yet (inbox down): never acknowledged, it
    /// comes back to whoever GETs the stored pull-next.
    pub unpersisted: Option<Received>,
    /// `None`: open a fresh connection for the next request (after a broken one).
    pub stream: Option<Box<dyn IcomStream>>,
    /// When it was adopted as an orphan (beyond the fair share), if it was.
    pub adopted: Option<Instant>,
}

impl Slot {
    pub(super) fn on_drain(
        &self,
        me: &ActorRef<SlotMsg>,
        state: &mut SlotState,
        others: Vec<PodBeat>,
        reply: RpcReplyPort<DrainOutcome>,
    ) {
        let handover =
            if self.share(&others).close_on_drain(self.slot.n) { Handover::Close } else { Handover::KeepOpen };
        state.drain = Some(PendingDrain { handover, reply: Some(reply) });
        match &state.phase {
            Phase::Standby | Phase::Cooldown | Phase::Drained => self.finish_drain(state, DrainOutcome::Idle),
            Phase::Holding(_) => self.hand_over(me, state, handover),
            Phase::Polling { .. } if state.stage.get() == Stage::Requesting && handover == Handover::KeepOpen => {
                // The GET on the stored pull-next has not returned (or the gate is
                // being passed): abort it; nothing is acknowledged, and the next holder
                // waits out its busy window. (A `start` or a commit in flight finishes
                // first; so does a GET on a stream about to be closed: the DELETE must
                // not race it.)
                self.hand_over(me, state, handover);
            }
            // Acquiring, starting a stream, persisting a batch, or already handing over: finishes first.
            Phase::Acquiring { .. } | Phase::Polling { .. } | Phase::Draining { .. } => {}
        }
    }

    /// Takes the holding out of the phase (aborting a cycle in flight, whose
    /// request is then in doubt) and hands the slot over in a task.
    pub(super) fn hand_over(&self, me: &ActorRef<SlotMsg>, state: &mut SlotState, handover: Handover) {
        let holding = match std::mem::replace(&mut state.phase, Phase::Standby) {
            Phase::Holding(holding) => holding,
            Phase::Polling { mut holding, task } => {
                drop(task);
                // The task owned the live gate: what it sent is in doubt.
                holding.gate = holding.gate.aborted(tokio::time::Instant::now());
                holding
            }
            other => {
                // Nothing held: a drain is answered at once, anything else changes nothing.
                state.phase = other;
                if state.drain.is_some() {
                    self.finish_drain(state, DrainOutcome::Idle);
                }
                return;
            }
        };
        let (ctx, slot, owner, grant) = (self.ctx.clone(), self.slot, self.owner(), holding.grant.clone());
        let task =
            state.timers.spawn(me, async move { Step::HandedOver(run(ctx, slot, owner, holding, handover).await) });
        // Losing the lease aborts the handover too (its DELETE must not outlive the lease).
        self.ctx.ledger.attach_task(&self.owner(), task.abort_handle());
        self.enter(state, Phase::Draining { task, grant });
    }

    pub(super) fn on_handed_over(&self, me: &ActorRef<SlotMsg>, state: &mut SlotState, handover: Handover) {
        let id = self.owner();
        self.ctx.board.mark_cursor(&id, None);
        tracing::info!(slot = %self.slot, ?handover, "slot handed over");
        if state.drain.is_some() {
            let outcome = match handover {
                Handover::Close => DrainOutcome::Closed,
                Handover::KeepOpen => DrainOutcome::HandedOver,
            };
            return self.finish_drain(state, outcome);
        }
        self.standby(me, state, jittered(self.ctx.config.timing.acquire_interval));
    }

    pub(super) fn finish_drain(&self, state: &mut SlotState, outcome: DrainOutcome) {
        state.timers.invalidate();
        self.enter(state, Phase::Drained);
        if let Some(reply) = state.drain.as_mut().and_then(|d| d.reply.take()) {
            let _ = reply.send(outcome);
        }
    }
}

/// Closes the stream if asked, settles the gate, releases the lease. Returns what was done to the stream.
pub async fn run(ctx: TreeContext, slot: SlotId, owner: String, mut holding: Holding, handover: Handover) -> Handover {
    let closed = match holding.cursor.clone() {
        // An aborted GET may still be held on the stream: leave it open rather than race it.
        Some(_) if handover == Handover::Close && holding.gate.in_doubt() => {
            tracing::info!(%slot, "a request of ours may still be in flight: the stream is left open");
            false
        }
        Some(cursor) if handover == Handover::Close => close_stream(&ctx, slot, &mut holding, &cursor).await,
        _ => false,
    };
    drop(holding.stream.take());
    settle_gate(&ctx, slot, &holding.gate).await;
    // This very task gives the lease back: removing the entry must not abort it.
    ctx.ledger.detach_task(&owner);
    if let Some(lease) = ctx.ledger.remove(&owner) {
        ctx.release(vec![lease]).await;
    }
    if closed { Handover::Close } else { Handover::KeepOpen }
}

/// Clears `busy_until` when nothing of ours can be in flight; else leaves it for the next holder to wait out.
async fn settle_gate(ctx: &TreeContext, slot: SlotId, gate: &Gate) {
    if !gate.may_clear(Instant::now()) {
        tracing::info!(%slot, "a request of ours may still be in flight: the next holder waits out busy_until");
        return;
    }
    if let Err(e) = ctx.ports.inbox.release(slot, gate.fence).await {
        tracing::warn!(%slot, error = %e, "gate not cleared: the next holder waits out busy_until");
    }
}

async fn close_stream(ctx: &TreeContext, slot: SlotId, holding: &mut Holding, cursor: &str) -> bool {
    let inbox = ctx.ports.inbox.clone();
    if let Err(blocked) = gate::pass(&mut holding.gate, |fence, busy_for| inbox.arm(slot, fence, busy_for)).await {
        tracing::warn!(%slot, ?blocked, "gate closed to the DELETE; leaving the stream open");
        return false;
    }
    // After the gate (which may have waited): the DELETE must fit in the lease too.
    let mut lease = holding.lease.clone();
    let ready = lease.ready_for(ctx.config.request_budget(), Duration::ZERO).await;
    if let Err(cause) =
        ready.and_then(|()| holding.gate.ready(Instant::now()).eq(&Ready::Go).then_some(()).ok_or(LostCause::Expired))
    {
        tracing::warn!(%slot, %cause, "no room left in the lease or the gate to close the stream; leaving it open");
        return false;
    }
    let mut stream = holding.stream.take().unwrap_or_else(|| ctx.ports.icom.stream(slot.channel));
    holding.gate.spend();
    match stream.close(cursor).await {
        CloseOutcome::Closed => {
            holding.gate.answered();
            let (sent, busy_for) = (Instant::now(), holding.gate.busy_for());
            match ctx.ports.inbox.store_cursor(slot, holding.gate.fence, None, busy_for).await {
                Ok(()) => holding.gate.written(sent),
                Err(e) => {
                    tracing::warn!(%slot, error = %e, "stream closed but its cursor not cleared; the next holder starts anew")
                }
            }
            true
        }
        CloseOutcome::Failed(e) => {
            tracing::warn!(%slot, error = %e, "closing the stream failed; leaving it to the server's expiry");
            false
        }
    }
}
