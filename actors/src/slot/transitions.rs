//! The slot's transitions: each handler moves the state machine one step,
//! arms at most one continuation (timer or task) under a fresh generation, and
//! writes the new state on the status board.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use super::acquire::{self, AcquireResult};
use super::cycle::{self, CycleEnd, CycleInput, CycleReport};
use super::handover::Holding;
use super::{DrainOutcome, Phase, Slot, SlotMsg, SlotState, schedule};
use crate::backoff::jittered;
use crate::fair::Share;
use crate::ports::{GrantId, LostCause, PodBeat, Pool};
use crate::task::OwnedTask;

type Me = ActorRef<SlotMsg>;

impl Slot {
    pub(super) fn enter(&self, state: &mut SlotState, phase: Phase) {
        state.phase = phase;
        let id = self.owner();
        self.ctx.board.set_state(&id, phase.name());
        match phase.fence() {
            Some(fence) => self.ctx.board.set_detail(&id, "fence", fence),
            None if !matches!(phase, Phase::Draining) => self.ctx.board.remove_detail(&id, "fence"),
            None => {}
        }
    }

    pub(super) fn next_generation(state: &mut SlotState) -> u64 {
        state.generation += 1;
        state.generation
    }

    fn pool(&self) -> Pool {
        Pool::Stream(self.slot.channel)
    }

    pub(super) fn share<'a>(&'a self, pods: &'a [PodBeat]) -> Share<'a> {
        let c = &self.ctx.config;
        let me_cooling = self.ctx.failover.channel_cooling(self.slot.channel, Instant::now());
        Share { me: &c.pod_id, pods, channel: self.slot.channel, slots: c.stream_pool.get(), me_cooling }
    }

    pub(super) fn retry_acquire(&self, me: &Me, state: &mut SlotState, after: Duration) {
        let generation = Self::next_generation(state);
        me.send_after(after, move || SlotMsg::TryAcquire { generation });
    }

    /// Standby, or Cooldown while this slot's failover cooldown runs.
    pub(super) fn standby(&self, me: &Me, state: &mut SlotState, after: Duration) {
        if let Some(until) = self.cooling_until() {
            return self.cool_down(me, state, until, after);
        }
        self.enter(state, Phase::Standby);
        self.retry_acquire(me, state, after);
    }

    pub(super) fn try_acquire(&self, me: &Me, state: &mut SlotState) {
        let interval = self.ctx.config.timing.acquire_interval;
        if !matches!(state.phase, Phase::Standby | Phase::Cooldown) || state.drain.is_some() {
            return;
        }
        if let Some(until) = self.cooling_until() {
            return self.cool_down(me, state, until, Duration::ZERO);
        }
        if state.phase == Phase::Cooldown {
            self.end_cooldown(state);
        }
        // A Standby slot holds nothing: an entry under its name was left by a
        // killed incarnation (its acquire task raced the cleanup). Give it back.
        if let Some(orphan) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release_in_background(vec![orphan]);
        }
        let Some(pods) = self.ctx.view.pods() else { return self.retry_acquire(me, state, jittered(interval)) };
        let share = self.share(&pods);
        let (owner, pool) = (self.owner(), self.pool());
        state.adopting = if self.ctx.ledger.reserve(&owner, pool, share.acquire_limit()) {
            false
        } else if self.orphan_due(&share) && self.ctx.ledger.reserve(&owner, pool, usize::MAX) {
            true
        } else {
            return self.retry_acquire(me, state, jittered(interval));
        };
        self.enter(state, Phase::Acquiring);
        let generation = Self::next_generation(state);
        let (ctx, slot, owner, me) = (self.ctx.clone(), self.slot, self.owner(), me.clone());
        state.task = Some(OwnedTask::spawn(async move {
            let notice_to = me.clone();
            let notice: crate::ledger::LostNotice = Box::new(move |grant, cause| {
                let _ = notice_to.send_message(SlotMsg::LeaseLost { grant: grant.clone(), cause });
            });
            let result = acquire::run(ctx, slot, owner, notice).await;
            let _ = me.send_message(SlotMsg::Acquired { generation, result });
        }));
    }

    pub(super) fn on_acquired(
        &self,
        me: &Me,
        state: &mut SlotState,
        result: AcquireResult,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        let adopting = std::mem::take(&mut state.adopting);
        let t = &self.ctx.config.timing;
        let retry = match result {
            AcquireResult::Granted(granted) if granted.lease.current().is_some() => {
                let granted = *granted;
                let id = self.owner();
                state.failures.reset();
                if adopting {
                    self.adopted();
                }
                self.ctx.board.mark_cursor(&id, granted.claim.pull_next.as_ref().map(|_| Instant::now()));
                tracing::info!(slot = %self.slot, fence = granted.claim.fence, resume = granted.claim.pull_next.is_some(), "slot granted");
                state.holding = Some(Holding {
                    lease: granted.lease,
                    grant: granted.grant,
                    fence: granted.claim.fence,
                    cursor: granted.claim.pull_next,
                    cursor_stored: true,
                    unpersisted: None,
                    stream: Some(self.ctx.ports.icom.stream(self.slot.channel)),
                    adopted: adopting.then(Instant::now),
                });
                if let Some(close) = state.drain.as_ref().map(|d| d.close) {
                    self.hand_over(me, state, close);
                    return Ok(());
                }
                self.enter(state, Phase::Holding { fence: granted.claim.fence });
                let first = schedule::first_poll(self.ctx.config.poll_mode, self.slot.n, &self.ctx.clock);
                self.arm_poll(me, state, first);
                return Ok(());
            }
            AcquireResult::Granted(_) => self.lose(state, "lease lost while claiming".into()),
            AcquireResult::Full => jittered(t.acquire_interval),
            AcquireResult::Quarantined(remaining) => remaining + jittered(t.acquire_interval),
            AcquireResult::Failed(why) => {
                self.ctx.board.set_error(&self.owner(), why);
                state.backoff.next_delay().max(t.acquire_interval / 4)
            }
            AcquireResult::Fatal(why) => {
                self.ctx.ledger.cancel_reservation(&self.owner());
                return Err(why.into());
            }
        };
        self.ctx.ledger.cancel_reservation(&self.owner());
        if state.drain.is_some() {
            self.finish_drain(state, DrainOutcome::Idle);
        } else {
            self.standby(me, state, retry);
        }
        Ok(())
    }

    fn arm_poll(&self, me: &Me, state: &mut SlotState, after: Duration) {
        let generation = Self::next_generation(state);
        if after.is_zero() {
            let _ = me.send_message(SlotMsg::Poll { generation });
        } else {
            me.send_after(after, move || SlotMsg::Poll { generation });
        }
    }

    pub(super) fn poll(&self, me: &Me, state: &mut SlotState) {
        let Phase::Holding { fence } = state.phase else { return };
        if let Some(pods) = self.ctx.view.pods() {
            let held = self.ctx.ledger.held_slots(self.pool());
            if !self.adopted_recently(state) && self.share(&pods).must_hand_over(self.slot.n, &held) {
                tracing::info!(slot = %self.slot, "over the fair share while another pod waits: handing over");
                return self.hand_over(me, state, false);
            }
        }
        let Some(holding) = state.holding.as_mut() else { return };
        let stream = holding.stream.take().unwrap_or_else(|| self.ctx.ports.icom.stream(self.slot.channel));
        let input = CycleInput {
            ctx: self.ctx.clone(),
            slot: self.slot,
            fence,
            cursor: holding.cursor.clone(),
            cursor_stored: holding.cursor_stored,
            lease: holding.lease.clone(),
            unpersisted: holding.unpersisted.take(),
            stage: state.stage.clone(),
        };
        state.stage.store(cycle::stage_of(&input), Ordering::SeqCst);
        let generation = Self::next_generation(state);
        let me = me.clone();
        let task = OwnedTask::spawn(async move {
            let report = cycle::run(input, stream).await;
            let _ = me.send_message(SlotMsg::CycleDone { generation, report });
        });
        self.ctx.ledger.attach_task(&self.owner(), task.abort_handle());
        state.task = Some(task);
        self.enter(state, Phase::Polling { fence });
    }

    pub(super) fn on_cycle(
        &self,
        me: &Me,
        state: &mut SlotState,
        report: CycleReport,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        let Phase::Polling { fence } = state.phase else { return Ok(()) };
        let Some(holding) = state.holding.as_mut() else { return Ok(()) };
        holding.stream = Some(report.stream);
        let (id, t) = (self.owner(), &self.ctx.config.timing);
        let board = &self.ctx.board;
        board.set_detail(&id, "last_poll_outcome", end_label(&report.end));
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
        if let Some(close) = state.drain.as_ref().map(|d| d.close) {
            self.hand_over(me, state, close);
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
        self.enter(state, Phase::Holding { fence });
        self.arm_poll(me, state, next);
        Ok(())
    }

    /// Stops using the slot at once: aborts the task, drops the connection,
    /// releases the lease in the background. Returns when to try again.
    pub(super) fn lose(&self, state: &mut SlotState, why: String) -> Duration {
        tracing::warn!(slot = %self.slot, %why, "slot lost");
        state.task = None;
        state.holding = None;
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
        let ours = state.holding.as_ref().is_some_and(|h| h.grant == grant);
        if !ours || !matches!(state.phase, Phase::Holding { .. } | Phase::Polling { .. }) {
            return;
        }
        crate::metrics::lease_lost(cause_label(cause));
        let retry = self.lose(state, format!("lease lost: {cause}"));
        self.after_loss(me, state, retry);
    }
}

fn end_label(end: &CycleEnd) -> &'static str {
    match end {
        CycleEnd::Delivered { .. } => "messages",
        CycleEnd::Empty { .. } => "empty",
        CycleEnd::StreamGone => "unknown_stream",
        CycleEnd::Backoff { .. } => "error",
        CycleEnd::CommitFailed { .. } => "commit_failed",
        CycleEnd::LeaseLost(_) => "lease_lost",
        CycleEnd::Fatal(_) => "fatal",
    }
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
