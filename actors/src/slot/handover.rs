//! Handing a slot over (drain, fair share, failover): the transitions, then the task.
//! The stream stays open for the next holder, who resumes it from the stored
//! pull-next; only when asked (no other pod runs this slot) is it closed —
//! DELETE on the stored pull-next, which acknowledges only what is persisted —
//! and a `None` cursor stored. The lease is released last, so the slot is
//! never used by two holders.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};

use super::{DrainOutcome, PendingDrain, Phase, Slot, SlotMsg, SlotState, cycle};
use crate::backoff::jittered;
use crate::domain::SlotId;
use crate::ledger::HeldLease;
use crate::ports::{CloseOutcome, IcomStream, PodBeat};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

/// What the slot held when it decided to hand over.
pub struct Holding {
    pub lease: HeldLease,
    pub grant: crate::ports::GrantId,
    pub fence: i64,
    pub cursor: Option<String>,
    pub cursor_stored: bool,
    /// A received batch not committed yet (inbox down): never acknowledged, it
    /// comes back to whoever GETs the stored pull-next.
    pub unpersisted: Option<super::cycle::Received>,
    /// `None` while a cycle task owns it (or after it was dropped with an aborted task).
    pub stream: Option<Box<dyn IcomStream>>,
    /// When it was adopted as an orphan (beyond the fair share), if it was.
    pub adopted: Option<tokio::time::Instant>,
}

impl Slot {
    pub(super) fn on_drain(
        &self,
        me: &ActorRef<SlotMsg>,
        state: &mut SlotState,
        others: Vec<PodBeat>,
        reply: RpcReplyPort<DrainOutcome>,
    ) {
        let close = self.share(&others).close_on_drain(self.slot.n);
        state.drain = Some(PendingDrain { close, reply: Some(reply) });
        match state.phase {
            Phase::Standby | Phase::Cooldown | Phase::Drained => self.finish_drain(state, DrainOutcome::Idle),
            Phase::Holding { .. } => self.hand_over(me, state, close),
            Phase::Polling { .. } if state.stage.load(Ordering::SeqCst) == cycle::REQUESTING => {
                // The GET on the stored pull-next has not returned: abort it; nothing
                // is acknowledged. (A `start` or a commit in flight finishes first.)
                state.task = None;
                self.hand_over(me, state, close);
            }
            // Acquiring, starting a stream, persisting a batch, or already handing over: finishes first.
            Phase::Acquiring | Phase::Polling { .. } | Phase::Draining => {}
        }
    }

    pub(super) fn hand_over(&self, me: &ActorRef<SlotMsg>, state: &mut SlotState, close: bool) {
        state.task = None;
        let Some(holding) = state.holding.take() else {
            return self.finish_drain(state, DrainOutcome::Idle);
        };
        self.enter(state, Phase::Draining);
        let generation = Self::next_generation(state);
        let (ctx, slot, owner, me) = (self.ctx.clone(), self.slot, self.owner(), me.clone());
        state.task = Some(OwnedTask::spawn(async move {
            let closed = run(ctx, slot, owner, holding, close).await;
            let _ = me.send_message(SlotMsg::HandedOver { generation, closed });
        }));
    }

    pub(super) fn on_handed_over(&self, me: &ActorRef<SlotMsg>, state: &mut SlotState, closed: bool) {
        state.task = None;
        let id = self.owner();
        self.ctx.board.mark_cursor(&id, None);
        tracing::info!(slot = %self.slot, closed, "slot handed over");
        if state.drain.is_some() {
            let outcome = if closed { DrainOutcome::Closed } else { DrainOutcome::HandedOver };
            return self.finish_drain(state, outcome);
        }
        self.standby(me, state, jittered(self.ctx.config.timing.acquire_interval));
    }

    pub(super) fn finish_drain(&self, state: &mut SlotState, outcome: DrainOutcome) {
        state.generation += 1;
        self.enter(state, Phase::Drained);
        if let Some(reply) = state.drain.as_mut().and_then(|d| d.reply.take()) {
            let _ = reply.send(outcome);
        }
    }
}

/// Returns whether the stream was closed.
pub async fn run(ctx: TreeContext, slot: SlotId, owner: String, mut holding: Holding, close: bool) -> bool {
    let closed = match holding.cursor.clone() {
        Some(cursor) if close => close_stream(&ctx, slot, &mut holding, &cursor).await,
        _ => false,
    };
    drop(holding.stream.take());
    if let Some(lease) = ctx.ledger.remove(&owner) {
        ctx.release(vec![lease]).await;
    }
    closed
}

async fn close_stream(ctx: &TreeContext, slot: SlotId, holding: &mut Holding, cursor: &str) -> bool {
    let mut lease = holding.lease.clone();
    if let Err(cause) = lease.ready_for(ctx.config.request_budget(), Duration::ZERO).await {
        tracing::warn!(%slot, %cause, "lease too short to close the stream; leaving it open");
        return false;
    }
    let mut stream = holding.stream.take().unwrap_or_else(|| ctx.ports.icom.stream(slot.channel));
    match stream.close(cursor).await {
        CloseOutcome::Closed => {
            if let Err(e) = ctx.ports.inbox.store_cursor(slot, holding.fence, None).await {
                tracing::warn!(%slot, error = %e, "stream closed but its cursor not cleared; the next holder starts anew");
            }
            true
        }
        CloseOutcome::Failed(e) => {
            tracing::warn!(%slot, error = %e, "closing the stream failed; leaving it to the server's expiry");
            false
        }
    }
}
