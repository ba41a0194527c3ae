//! The slot's transitions: each handler moves the state machine one step,
//! arms at most one continuation (timer or task) under a fresh stamp, and
//! writes the new state on the status board.

use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use super::acquire::{self, Granted};
use super::cycle::{self, CycleEnd, CycleInput, CycleReport};
use super::handover::Holding;
use super::{DrainOutcome, Handover, Phase, Slot, SlotMsg, SlotState, Step, schedule};
use crate::backoff::jittered;
use crate::fair::Share;
use crate::lease::{self, Acquisition};
use crate::ports::{GrantId, LostCause, PodBeat, Pool};

type Me = ActorRef<SlotMsg>;

impl Slot {
    pub(super) fn enter(&self, state: &mut SlotState, phase: Phase) {
        let id = self.owner();
        self.ctx.board.set_state(&id, phase.name());
        match phase.fence() {
            Some(fence) => self.ctx.board.set_detail(&id, "fence", fence),
            None if !matches!(phase, Phase::Draining { .. }) => self.ctx.board.remove_detail(&id, "fence"),
            None => {}
        }
        state.phase = phase;
    }

    fn pool(&self) -> Pool {
        Pool::Stream(self.slot.channel)
    }

    pub(super) fn share<'a>(&'a self, pods: &'a [PodBeat]) -> Share<'a> {
        let c = &self.ctx.config;
        let me_cooling = self.ctx.failover.channel_cooling(self.slot.channel, Instant::now());
        Share { me: &c.pod_id, pods, channel: self.slot.channel, slots: c.stream_pool.get(), me_cooling }
    }

    /// Standby, or Cooldown while this slot's failover cooldown runs.
    pub(super) fn standby(&self, me: &Me, state: &mut SlotState, after: Duration) {
        if let Some(until) = self.cooling_until() {
            return self.cool_down(me, state, until, after);
        }
        self.enter(state, Phase::Standby);
        state.timers.arm(me, after, Step::TryAcquire);
    }

    pub(super) fn try_acquire(&self, me: &Me, state: &mut SlotState) {
        let interval = self.ctx.config.timing.acquire_interval;
        if !matches!(state.phase, Phase::Standby | Phase::Cooldown) || state.drain.is_some() {
            return;
        }
        if let Some(until) = self.cooling_until() {
            return self.cool_down(me, state, until, Duration::ZERO);
        }
        if matches!(state.phase, Phase::Cooldown) {
            self.end_cooldown(state);
        }
        lease::release_leftover(&self.ctx, &self.owner());
        let Some(pods) = self.ctx.view.pods() else {
            return state.timers.arm(me, jittered(interval), Step::TryAcquire);
        };
        let share = self.share(&pods);
        let (owner, pool) = (self.owner(), self.pool());
        let adopting = if self.ctx.ledger.reserve(&owner, pool, share.acquire_limit()) {
            false
        } else if self.orphan_due(&share) && self.ctx.ledger.reserve(&owner, pool, usize::MAX) {
            true
        } else {
            return state.timers.arm(me, jittered(interval), Step::TryAcquire);
        };
        let (ctx, slot, notice) = (self.ctx.clone(), self.slot, lease::lost_notice(me, lost));
        let task = state.timers.spawn(me, async move { Step::Acquired(acquire::run(ctx, slot, owner, notice).await) });
        self.enter(state, Phase::Acquiring { task, adopting });
    }

    pub(super) fn on_acquired(
        &self,
        me: &Me,
        state: &mut SlotState,
        result: Acquisition<Box<Granted>>,
    ) -> Result<(), ActorProcessingErr> {
        let Phase::Acquiring { adopting, .. } = state.phase else { return Ok(()) };
        let t = &self.ctx.config.timing;
        let retry = match result {
            Acquisition::Granted(granted) if granted.held.lease.current().is_some() => {
                self.hold(me, state, *granted, adopting);
                return Ok(());
            }
            Acquisition::Granted(_) => self.lose(state, "lease lost while claiming".into()),
            Acquisition::Full => jittered(t.acquire_interval),
            Acquisition::Quarantined(remaining) => remaining + jittered(t.acquire_interval),
            Acquisition::Retry(why) => {
                self.ctx.board.set_error(&self.owner(), why);
                state.backoff.next_delay().max(t.acquire_interval / 4)
            }
            Acquisition::Fatal(why) => {
                self.ctx.ledger.cancel_reservation(&self.owner());
                return Err(why.into());
            }
        };
        self.ctx.ledger.cancel_reservation(&self.owner());
        self.after_loss(me, state, retry);
        Ok(())
    }

    /// Granted and claimed: resume the stored stream (or hand over at once when draining).
    fn hold(&self, me: &Me, state: &mut SlotState, granted: Granted, adopting: bool) {
        let Granted { held, claim, gate } = granted;
        let id = self.owner();
        state.failures.reset();
        if adopting {
            self.adopted();
        }
        self.ctx.board.mark_cursor(&id, claim.pull_next.as_ref().map(|_| Instant::now()));
        tracing::info!(
            slot = %self.slot, fence = claim.fence, resume = claim.pull_next.is_some(), wait = ?claim.wait, "slot granted"
        );
        let holding = Holding {
            lease: held.lease,
            grant: held.grant,
            gate,
            cursor: claim.pull_next,
            cursor_stored: true,
            unpersisted: None,
            stream: Some(self.ctx.ports.icom.stream(self.slot.channel)),
            adopted: adopting.then(Instant::now),
        };
        self.enter(state, Phase::Holding(holding));
        if let Some(handover) = state.drain.as_ref().map(|d| d.handover) {
            return self.hand_over(me, state, handover);
        }
        let first = schedule::first_poll(self.ctx.config.poll_mode, self.slot.n, &self.ctx.clock);
        state.timers.arm(me, first, Step::Poll);
    }

    pub(super) fn poll(&self, me: &Me, state: &mut SlotState) {
        let Phase::Holding(holding) = &state.phase else { return };
        if let Some(pods) = self.ctx.view.pods() {
            let held = self.ctx.ledger.held_slots(self.pool());
            let adopted_recently = self.adopted_recently(holding);
            if !adopted_recently && self.share(&pods).must_hand_over(self.slot.n, &held) {
                tracing::info!(slot = %self.slot, "over the fair share while another pod waits: handing over");
                return self.hand_over(me, state, Handover::KeepOpen);
            }
        }
        let mut holding = match std::mem::replace(&mut state.phase, Phase::Standby) {
            Phase::Holding(holding) => holding,
            other => {
                state.phase = other;
                return;
            }
        };
        let stream = holding.stream.take().unwrap_or_else(|| self.ctx.ports.icom.stream(self.slot.channel));
        let gate = holding.gate.clone();
        let input = CycleInput {
            ctx: self.ctx.clone(),
            slot: self.slot,
            gate,
            cursor: holding.cursor.clone(),
            cursor_stored: holding.cursor_stored,
            lease: holding.lease.clone(),
            unpersisted: holding.unpersisted.take(),
            stage: state.stage.clone(),
        };
        state.stage.set(cycle::stage_of(&input));
        let task = state.timers.spawn(me, async move { Step::CycleDone(cycle::run(input, stream).await) });
        self.ctx.ledger.attach_task(&self.owner(), task.abort_handle());
        self.enter(state, Phase::Polling { holding, task });
    }

    pub(super) fn on_cycle(
        &self,
        me: &Me,
        state: &mut SlotState,
        report: CycleReport,
    ) -> Result<(), ActorProcessingErr> {
        let mut holding = match std::mem::replace(&mut state.phase, Phase::Standby) {
            Phase::Polling { holding, .. } => holding,
            other => {
                state.phase = other;
                return Ok(());
            }
        };
        holding.stream = Some(report.stream);
        holding.gate = report.gate;
        let (id, t) = (self.owner(), &self.ctx.config.timing);
        let board = &self.ctx.board;
        board.set_detail(&id, "last_poll_outcome", report.end.label());
        board.add_detail(&id, "polls", 1);
        let (next, failed) = match report.end {
            CycleEnd::Delivered { cursor, received, persisted, duplicates, malformed } => {
                board.add_detail(&id, "messages_received", received as u64);
                board.add_detail(&id, "messages_persisted", persisted as u64);
                board.add_detail(&id, "duplicates", duplicates as u64);
                board.add_detail(&id, "malformed", malformed as u64);
                board.mark_cursor(&id, Some(Instant::now()));
                (holding.cursor, holding.cursor_stored) = (Some(cursor), true);
                state.backoff.reset();
                (Duration::ZERO, None)
            }
            CycleEnd::Empty { cursor, stored } => {
                if holding.cursor.as_deref() != Some(cursor.as_str()) {
                    board.mark_cursor(&id, Some(Instant::now()));
                }
                (holding.cursor, holding.cursor_stored) = (Some(cursor), stored);
                state.backoff.reset();
                let mode = self.ctx.config.poll_mode;
                (schedule::after_empty(mode, self.slot.n, report.took, t.empty_poll_floor, &self.ctx.clock), None)
            }
            CycleEnd::StreamGone => {
                tracing::warn!(slot = %self.slot, "stored stream unknown to the server: starting a new one");
                (holding.cursor, holding.cursor_stored) = (None, false);
                board.mark_cursor(&id, None);
                (Duration::ZERO, None)
            }
            CycleEnd::Backoff { why, at_least, reconnect } => {
                if reconnect {
                    holding.stream = None;
                }
                board.set_error(&id, why.clone());
                (state.backoff.next_delay().max(at_least.unwrap_or_default()), Some(why))
            }
            CycleEnd::CommitFailed { received, why } => {
                holding.unpersisted = Some(received);
                board.set_error(&id, why.clone());
                (state.backoff.next_delay(), Some(why))
            }
            CycleEnd::LeaseLost(why) => {
                let retry = self.lose(state, why);
                self.after_loss(me, state, retry);
                return Ok(());
            }
            CycleEnd::Fatal(why) => return Err(why.into()),
        };
        self.enter(state, Phase::Holding(holding));
        if let Some(handover) = state.drain.as_ref().map(|d| d.handover) {
            self.hand_over(me, state, handover);
            return Ok(());
        }
        let next = match failed {
            None => {
                self.cycle_succeeded(state);
                next
            }
            Some(why) => match self.cycle_failed(state, next) {
                Some(next) => next,
                None => {
                    self.fail_over(me, state, &why);
                    return Ok(());
                }
            },
        };
        state.timers.arm(me, next, Step::Poll);
        Ok(())
    }

    /// Stops using the slot at once: aborts the task, drops the connection,
    /// releases the lease in the background. The gate is left as it stands (a
    /// request may be in flight; the next holder waits it out). Returns when to try again.
    pub(super) fn lose(&self, state: &mut SlotState, why: String) -> Duration {
        tracing::warn!(slot = %self.slot, %why, "slot lost");
        state.phase = Phase::Standby;
        let id = self.owner();
        if let Some(lease) = self.ctx.ledger.remove(&id) {
            self.ctx.release_in_background(vec![lease]);
        }
        self.ctx.board.set_error(&id, why);
        self.ctx.board.mark_cursor(&id, None);
        jittered(self.ctx.config.timing.acquire_interval)
    }

    pub(super) fn after_loss(&self, me: &Me, state: &mut SlotState, retry: Duration) {
        if state.drain.is_some() {
            self.finish_drain(state, DrainOutcome::Idle);
        } else {
            self.standby(me, state, retry);
        }
    }

    pub(super) fn on_lease_lost(&self, me: &Me, state: &mut SlotState, grant: GrantId, cause: LostCause) {
        let handing_over = matches!(&state.phase, Phase::Draining { grant: g, .. } if *g == grant);
        if !handing_over && state.phase.holding().is_none_or(|h| h.grant != grant) {
            return;
        }
        crate::metrics::lease_lost(cause_label(cause));
        let retry = self.lose(state, format!("lease lost: {cause}"));
        self.after_loss(me, state, retry);
    }
}

fn lost(grant: GrantId, cause: LostCause) -> SlotMsg {
    SlotMsg::LeaseLost { grant, cause }
}

fn cause_label(cause: LostCause) -> &'static str {
    match cause {
        LostCause::Expired => "expired",
        LostCause::Stolen => "stolen",
        LostCause::Missing => "missing",
        LostCause::Amnesia => "amnesia",
        LostCause::Unreachable => "unreachable",
    }
}
