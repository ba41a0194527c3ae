//! The sender's transitions: each handler moves the state machine one step,
//! arms at most one continuation (timer or task) under a fresh generation and
//! writes the new state on the status board.

use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;

use super::{
    Acquire, Holding, Phase, Sender, SenderDrain, SenderMsg, SenderState, TurnEnd, TurnInput, TurnReport, turn,
};
use crate::backoff::jittered;
use crate::ledger::LostNotice;
use crate::ports::{Acquired, GrantId, LeaseError, LostCause, Pool};
use crate::task::OwnedTask;

type Me = ActorRef<SenderMsg>;

impl Sender {
    pub(super) fn enter(&self, state: &mut SenderState, phase: Phase) {
        state.phase = phase;
        self.ctx.board.set_state(&self.owner(), phase.name());
    }

    fn next_generation(state: &mut SenderState) -> u64 {
        state.generation += 1;
        state.generation
    }

    fn arm(&self, me: &Me, state: &mut SenderState, after: Duration, msg: fn(u64) -> SenderMsg) {
        let generation = Self::next_generation(state);
        if after.is_zero() {
            let _ = me.send_message(msg(generation));
        } else {
            me.send_after(after, move || msg(generation));
        }
    }

    fn paused(state: &SenderState) -> bool {
        state.paused_until.is_some_and(|t| t > Instant::now())
    }

    pub(super) fn on_wake(&self, me: &Me, state: &mut SenderState) {
        if state.draining || Self::paused(state) {
            return;
        }
        match state.phase {
            // Refused lately: the armed TryAcquire serves this wake (its generation stays current).
            Phase::Standby if Self::acquire_held_back(state) => state.woken = true,
            Phase::Standby => self.acquire(me, state),
            Phase::Idle => self.arm(me, state, Duration::ZERO, |generation| SenderMsg::Turn { generation }),
            // The turn may have looked before the new row: look again right after it;
            // an acquire refused now retries on its timer even if the last depth read saw nothing.
            Phase::Acquiring | Phase::Sending | Phase::Releasing => state.woken = true,
            Phase::Drained => {}
        }
    }

    fn acquire_held_back(state: &SenderState) -> bool {
        state.acquire_not_before.is_some_and(|t| t > Instant::now())
    }

    /// No acquire before `after` from now (a wake meanwhile is remembered); the timer tries then.
    fn retry_acquire(&self, me: &Me, state: &mut SenderState, after: Duration) {
        state.acquire_not_before = Some(Instant::now() + after);
        self.arm(me, state, after, |generation| SenderMsg::TryAcquire { generation });
    }

    pub(super) fn acquire(&self, me: &Me, state: &mut SenderState) {
        if state.phase != Phase::Standby || state.draining {
            return;
        }
        // Standby holds nothing: an entry under our name is a killed incarnation's leftover.
        if let Some(orphan) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release_in_background(vec![orphan]);
        }
        self.enter(state, Phase::Acquiring);
        let generation = Self::next_generation(state);
        let (ctx, owner, channel, me) = (self.ctx.clone(), self.owner(), self.channel, me.clone());
        state.task = Some(OwnedTask::spawn(async move {
            let notice_to = me.clone();
            let notice: LostNotice = Box::new(move |grant, cause| {
                let _ = notice_to.send_message(SenderMsg::LeaseLost { grant: grant.clone(), cause });
            });
            let result = match ctx.ports.leases.acquire(Pool::Send(channel), None).await {
                Ok(Acquired::Granted(lease)) => {
                    let (grant, slot) = (lease.grant.clone(), lease.slot);
                    Acquire::Granted { lease: ctx.ledger.hold(&owner, lease, notice), grant, slot }
                }
                Ok(Acquired::Full) => Acquire::Full,
                Ok(Acquired::Quarantined { remaining }) => Acquire::Quarantined(remaining),
                Err(LeaseError::Fatal(e)) => Acquire::Fatal(format!("lease store fatal: {e}")),
                Err(e) => Acquire::Failed(e.to_string()),
            };
            let _ = me.send_message(SenderMsg::Acquired { generation, result });
        }));
    }

    pub(super) fn on_acquired(
        &self,
        me: &Me,
        state: &mut SenderState,
        result: Acquire,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        let every = self.ctx.config.timing.acquire_interval;
        let retry = match result {
            Acquire::Granted { lease, grant, slot } if lease.current().is_some() => {
                let conn = Some(self.ports.sends.sender(self.channel));
                state.holding = Some(Holding { lease, grant, conn, last_work: Instant::now(), lost: false });
                self.ctx.board.set_detail(&self.owner(), "slot", slot);
                // The first turn runs now: it serves a wake that came while acquiring.
                (state.woken, state.acquire_not_before) = (false, None);
                if state.draining {
                    self.release(me, state);
                    return Ok(());
                }
                self.enter(state, Phase::Idle);
                self.turn(me, state);
                return Ok(());
            }
            Acquire::Granted { .. } => jittered(every),
            Acquire::Full => jittered(every),
            Acquire::Quarantined(remaining) => remaining + jittered(every),
            Acquire::Failed(why) => {
                self.ctx.board.set_error(&self.owner(), why);
                state.backoff.next_delay().max(every / 4)
            }
            Acquire::Fatal(why) => return Err(why.into()),
        };
        if let Some(orphan) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release_in_background(vec![orphan]);
        }
        self.enter(state, Phase::Standby);
        if state.draining {
            self.finish_drain(state);
        } else {
            self.retry_acquire(me, state, retry);
        }
        Ok(())
    }

    pub(super) fn turn(&self, me: &Me, state: &mut SenderState) {
        if state.phase != Phase::Idle || state.draining {
            return;
        }
        let Some(holding) = state.holding.as_mut() else { return };
        let conn = holding.conn.take().unwrap_or_else(|| self.ports.sends.sender(self.channel));
        let c = &self.ctx.config;
        let input = TurnInput {
            config: self.config.clone(),
            ports: self.ports.clone(),
            timing: c.timing.clone(),
            channel: self.channel,
            lease: holding.lease.clone(),
            lease_budget: self.config.send_timeout + c.timing.request_margin,
            clock: self.ctx.clock,
            single: state.single,
            publishing: state.publishing.take(),
        };
        let generation = Self::next_generation(state);
        let me = me.clone();
        state.task = Some(OwnedTask::spawn(async move {
            let report = turn::run(input, conn).await;
            let _ = me.send_message(SenderMsg::TurnDone { generation, report: Box::new(report) });
        }));
        self.enter(state, Phase::Sending);
    }

    pub(super) fn on_turn(
        &self,
        me: &Me,
        state: &mut SenderState,
        mut report: TurnReport,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        state.publishing = report.publishing.take();
        self.show(&report);
        let woken = std::mem::take(&mut state.woken);
        let Some(holding) = state.holding.as_mut() else {
            self.enter(state, Phase::Standby);
            return Ok(());
        };
        holding.conn = report.conn;
        let lost = holding.lost;
        if matches!(report.end, TurnEnd::Sent { .. } | TurnEnd::RateLimited { .. }) {
            holding.last_work = Instant::now();
            state.drain.finished_send = state.draining;
        }
        self.enter(state, Phase::Idle);
        if let TurnEnd::LeaseLost(why) = &report.end {
            self.lose(me, state, why.clone());
            return Ok(());
        }
        if lost {
            self.lose(me, state, "send lease lost during the turn".into());
            return Ok(());
        }
        if state.draining {
            self.release(me, state);
            return Ok(());
        }
        match report.end {
            TurnEnd::Sent { .. } => {
                state.single = false;
                state.backoff.reset();
                self.arm(me, state, Duration::ZERO, |generation| SenderMsg::Turn { generation });
            }
            TurnEnd::TooLarge => {
                state.single = true;
                self.arm(me, state, Duration::ZERO, |generation| SenderMsg::Turn { generation });
            }
            TurnEnd::Empty if woken => self.arm(me, state, Duration::ZERO, |generation| SenderMsg::Turn { generation }),
            TurnEnd::Empty => self.idle(me, state),
            TurnEnd::RateLimited { retry_after } | TurnEnd::BucketWait { retry_after } => {
                self.pause(me, state, retry_after)
            }
            TurnEnd::BreakerRefused { retry_after, .. } => {
                self.pause(me, state, retry_after);
                state.paused_for_breaker = true;
            }
            TurnEnd::Backoff(why) => {
                self.ctx.board.set_error(&self.owner(), why);
                let delay = state.backoff.next_delay();
                self.pause(me, state, delay);
            }
            TurnEnd::LeaseLost(_) => {}
            TurnEnd::Fatal(why) => return Err(why.into()),
        }
        Ok(())
    }

    fn show(&self, report: &TurnReport) {
        let (id, board) = (self.owner(), &self.ctx.board);
        board.set_detail(&id, "last_outcome", report.end.label());
        if let TurnEnd::Sent { messages, .. } = report.end {
            board.add_detail(&id, "batches", 1);
            board.add_detail(&id, "messages", messages as u64);
        }
        if let Some(breaker) = report.breaker {
            board.set_detail(&id, "breaker", breaker.as_str());
        }
    }

    /// No work: look again after `idle_poll` (or on a wake), release after `idle_release`.
    fn idle(&self, me: &Me, state: &mut SenderState) {
        let since = state.holding.as_ref().map_or(Duration::MAX, |h| h.last_work.elapsed());
        if since >= self.config.idle_release {
            return self.release(me, state);
        }
        self.arm(me, state, self.config.idle_poll, |generation| SenderMsg::Turn { generation });
    }

    /// Nothing may be sent for `after`: keep the lease for a short pause, release it for a long one.
    fn pause(&self, me: &Me, state: &mut SenderState, after: Duration) {
        state.paused_until = Some(Instant::now() + after);
        state.paused_for_breaker = false;
        if after >= self.config.idle_release {
            self.release(me, state);
        } else {
            self.arm(me, state, after, |generation| SenderMsg::Turn { generation });
        }
    }

    /// The breaker was seen closed: a pause it caused ends now, and the sender
    /// looks for work (it may have released its lease for the pause).
    pub(super) fn on_breaker_closed(&self, me: &Me, state: &mut SenderState) {
        if !std::mem::take(&mut state.paused_for_breaker) || !Self::paused(state) {
            return;
        }
        tracing::info!(sender = %self.owner(), "breaker closed: resuming before its break time");
        state.paused_until = None;
        if self.work_likely() {
            self.on_wake(me, state);
        }
    }

    pub(super) fn release(&self, me: &Me, state: &mut SenderState) {
        state.holding = None;
        self.enter(state, Phase::Releasing);
        let generation = Self::next_generation(state);
        let (ctx, owner, me) = (self.ctx.clone(), self.owner(), me.clone());
        let publishing = state.publishing.take();
        state.task = Some(OwnedTask::spawn(async move {
            // A sender back in standby (or drained) has published what it recorded (or left it to the sweep).
            if let Some(publishing) = publishing {
                let _ = publishing.await;
            }
            if let Some(lease) = ctx.ledger.remove(&owner) {
                ctx.release(vec![lease]).await;
            }
            let _ = me.send_message(SenderMsg::Released { generation });
        }));
    }

    pub(super) fn on_released(&self, me: &Me, state: &mut SenderState) {
        state.task = None;
        self.ctx.board.remove_detail(&self.owner(), "slot");
        if state.draining {
            state.drain.released = true;
            return self.finish_drain(state);
        }
        self.enter(state, Phase::Standby);
        let woken = std::mem::take(&mut state.woken);
        if Self::paused(state) {
            let after = state.paused_until.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()));
            self.arm(me, state, after, |generation| SenderMsg::TryAcquire { generation });
        } else if woken {
            self.acquire(me, state);
        }
    }

    /// The lease is gone: drop the connection, give the ledger entry back, standby.
    fn lose(&self, me: &Me, state: &mut SenderState, why: String) {
        tracing::warn!(sender = %self.owner(), %why, "send lease lost");
        state.task = None;
        state.holding = None;
        if let Some(lease) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release_in_background(vec![lease]);
        }
        self.ctx.board.set_error(&self.owner(), why);
        self.ctx.board.remove_detail(&self.owner(), "slot");
        self.enter(state, Phase::Standby);
        if state.draining {
            return self.finish_drain(state);
        }
        let every = self.ctx.config.timing.acquire_interval;
        self.retry_acquire(me, state, jittered(every));
    }

    pub(super) fn on_lease_lost(&self, me: &Me, state: &mut SenderState, grant: GrantId, cause: LostCause) {
        let Some(holding) = state.holding.as_mut().filter(|h| h.grant == grant) else { return };
        crate::metrics::lease_lost("send");
        holding.lost = true;
        // A turn in flight finishes and is recorded; an idle sender stops at once.
        if state.phase == Phase::Idle {
            self.lose(me, state, format!("send lease lost: {cause}"));
        }
    }

    pub(super) fn on_drain(&self, me: &Me, state: &mut SenderState, reply: RpcReplyPort<SenderDrain>) {
        state.draining = true;
        state.drain_reply = Some(reply);
        match state.phase {
            Phase::Standby | Phase::Drained => self.finish_drain(state),
            Phase::Idle => self.release(me, state),
            // An acquire, a turn or a release finishes first.
            Phase::Acquiring | Phase::Sending | Phase::Releasing => {}
        }
    }

    fn finish_drain(&self, state: &mut SenderState) {
        state.generation += 1;
        self.enter(state, Phase::Drained);
        if let Some(reply) = state.drain_reply.take() {
            let _ = reply.send(state.drain);
        }
    }
}
