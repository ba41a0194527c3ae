//! The slot's side of failover and orphan pickup: counting failed cycles,
//! handing the slot over when they go on (only when another live pod could
//! take it: alone, a pod keeps trying), sitting out the cooldown, and adopting
//! a slot that nobody has taken for longer than the orphan grace.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ractor::ActorRef;
use tokio::time::Instant;

use super::handover::Holding;
use super::{Handover, Phase, Slot, SlotMsg, SlotState, Step};
use crate::fair::Share;
use crate::metrics;
use crate::ports::Pool;
use crate::ports::incident::{Incident, IncidentKind};

type Me = ActorRef<SlotMsg>;

impl Slot {
    /// A cycle got an answer: the failure run ends, and the pod's failover streak on the channel.
    pub(super) fn cycle_succeeded(&self, state: &mut SlotState) {
        if state.failures.count() > 0 {
            state.failures.reset();
            self.ctx.board.set_detail(&self.owner(), "failures", 0);
        }
        self.ctx.failover.succeeded(self.slot.channel);
    }

    /// A cycle failed and would back off `backoff`: `Some(delay)` before the
    /// next poll (never past the moment continuous failure reaches `after`), or
    /// `None` when the slot must fail over now.
    pub(super) fn cycle_failed(&self, state: &mut SlotState, backoff: Duration) -> Option<Duration> {
        let (now, config) = (Instant::now(), &self.ctx.config.failover);
        let count = state.failures.record(now);
        self.ctx.board.set_detail(&self.owner(), "failures", count);
        if !state.failures.due(now, config) {
            return Some(backoff.min(state.failures.time_left(now, config)));
        }
        let others = self.ctx.view.pods().is_some_and(|pods| self.share(&pods).others_eligible());
        if others { None } else { Some(backoff) }
    }

    /// Hands the slot over (stream and cursor kept for the next holder) and starts its cooldown.
    pub(super) fn fail_over(&self, me: &Me, state: &mut SlotState, why: &str) {
        let now = Instant::now();
        let (count, took) = (state.failures.count(), state.failures.failing_for(now));
        let cooldown = self.ctx.failover.start_cooldown(self.slot, &self.ctx.config.failover, now);
        state.failures.reset();
        metrics::slot_failover(self.slot.channel);
        let (id, board) = (self.owner(), &self.ctx.board);
        board.add_detail(&id, "failovers", 1);
        board.set_detail(&id, "failures", 0);
        let error = format!("failed over after {count} failed cycles in {took:?} (last: {why}); cooldown {cooldown:?}");
        self.ctx.ports.incidents.record(Incident {
            kind: IncidentKind::Failover,
            channel: Some(self.slot.channel),
            slot: Some(self.slot.n),
            detail: error.clone(),
        });
        board.set_error(&id, error);
        tracing::warn!(slot = %self.slot, count, ?took, ?cooldown, %why, "poll cycles keep failing on this pod: handing the slot over");
        self.hand_over(me, state, Handover::KeepOpen);
    }

    /// When this slot's cooldown ends, if it is still running.
    pub(super) fn cooling_until(&self) -> Option<Instant> {
        self.ctx.failover.cooling_until(self.slot, Instant::now())
    }

    /// Sits in Cooldown until `until` (at least `after`), then tries to acquire again.
    pub(super) fn cool_down(&self, me: &Me, state: &mut SlotState, until: Instant, after: Duration) {
        let left = until.saturating_duration_since(Instant::now());
        if !matches!(state.phase, Phase::Cooldown) {
            self.enter(state, Phase::Cooldown);
            let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() + left;
            self.ctx.board.set_detail(&self.owner(), "cooldown_until_ms", wall.as_millis() as u64);
        }
        state.timers.arm(me, left.max(after), Step::TryAcquire);
    }

    /// The cooldown is over: back to Standby.
    pub(super) fn end_cooldown(&self, state: &mut SlotState) {
        self.ctx.board.remove_detail(&self.owner(), "cooldown_until_ms");
        tracing::info!(slot = %self.slot, "failover cooldown over: standby again");
        self.enter(state, Phase::Standby);
    }

    /// Over its pod's quota, may this standby adopt its slot as an orphan now?
    /// Free (as the watchdog saw it) for the grace, plus one acquire interval
    /// per pod ahead of this one in the adoption order (least loaded first).
    pub(super) fn orphan_due(&self, share: &Share) -> bool {
        let c = &self.ctx.config;
        let max_age = c.watchdog.interval * 3;
        let Some(free_for) = self.ctx.sightings.free_for(self.slot, Instant::now(), max_age) else { return false };
        let held = self.ctx.ledger.held_slots(Pool::Stream(self.slot.channel)).len();
        let rank = u32::try_from(share.orphan_rank(held)).unwrap_or(u32::MAX);
        free_for >= c.failover.orphan_grace + c.timing.acquire_interval.saturating_mul(rank)
    }

    /// Granted as an orphan: counted and shown.
    pub(super) fn adopted(&self) {
        metrics::orphan_adopted(self.slot.channel);
        self.ctx.board.add_detail(&self.owner(), "orphans_adopted", 1);
        tracing::warn!(slot = %self.slot, "adopted a slot nobody took for the orphan grace (beyond the fair share)");
    }

    /// An adopted orphan is not handed back for fair share within a cooldown:
    /// the pod that did not take it gets no immediate second chance (no ping-pong).
    pub(super) fn adopted_recently(&self, holding: &Holding) -> bool {
        let hold = self.ctx.config.failover.cooldown;
        holding.adopted.is_some_and(|at| at.elapsed() < hold)
    }
}
