//! The sender's transitions: each handler moves the state machine one step,
//! arms at most one continuation (timer or task) under a fresh stamp and
//! writes the new state on the status board.

use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;

use super::{
    Drain, Holding, Pause, Phase, SendGrant, Sender, SenderDrain, SenderMsg, SenderState, Step, TurnEnd, TurnInput,
    TurnReport, grant, turn,
};
use crate::backoff::jittered;
use crate::lease::{self, Acquisition};
use crate::ports::outbound::BatchSize;
use crate::ports::{GrantId, LostCause};
use crate::tree::context::TreeContext;

type Me = ActorRef<SenderMsg>;

impl Sender {
    pub(super) fn enter(&self, state: &mut SenderState, phase: Phase) {
        self.ctx.board.set_state(&self.owner(), phase.name());
        state.phase = phase;
    }

    fn paused(state: &SenderState) -> bool {
        state.pause.is_some_and(|p| p.until() > Instant::now())
    }

    fn draining(state: &SenderState) -> bool {
        state.drain.is_some()
    }

    pub(super) fn on_wake(&self, me: &Me, state: &mut SenderState) {
        if Self::draining(state) || Self::paused(state) {
            return;
        }
        match state.phase {
            // Refused lately: the armed TryAcquire serves this wake (its stamp stays current).
            Phase::Standby { not_before: Some(t) } if t > Instant::now() => state.woken = true,
            Phase::Standby { .. } => self.acquire(me, state),
            Phase::Idle(_) => state.timers.arm(me, Duration::ZERO, Step::Turn),
            // The turn may have looked before the new row: look again right after it;
            // an acquire refused now retries on its timer even if the last depth read saw nothing.
            Phase::Acquiring { .. } | Phase::Sending { .. } | Phase::Releasing { .. } => state.woken = true,
            Phase::Drained => {}
        }
    }

    /// No acquire before `after` from now (a wake meanwhile is remembered); the timer tries then.
    fn retry_acquire(&self, me: &Me, state: &mut SenderState, after: Duration) {
        self.enter(state, Phase::Standby { not_before: Some(Instant::now() + after) });
        state.timers.arm(me, after, Step::TryAcquire);
    }

    pub(super) fn acquire(&self, me: &Me, state: &mut SenderState) {
        if !matches!(state.phase, Phase::Standby { .. }) || Self::draining(state) {
            return;
        }
        lease::release_leftover(&self.ctx, &self.owner());
        let (ctx, ports, owner, channel) = (self.ctx.clone(), self.ports.clone(), self.owner(), self.channel);
        let (timeout, notice) = (self.config.send_timeout, lease::lost_notice(me, lost));
        let task = state
            .timers
            .spawn(me, async move { Step::Acquired(grant::run(ctx, ports, owner, channel, timeout, notice).await) });
        self.enter(state, Phase::Acquiring { task });
    }

    pub(super) fn on_acquired(
        &self,
        me: &Me,
        state: &mut SenderState,
        result: Acquisition<Box<SendGrant>>,
    ) -> Result<(), ActorProcessingErr> {
        let every = self.ctx.config.timing.acquire_interval;
        let retry = match result {
            Acquisition::Granted(granted) if granted.held.lease.current().is_some() => {
                let SendGrant { held, gate } = *granted;
                let conn = Some(self.ports.sends.sender(self.channel));
                let holding = Holding {
                    lease: held.lease,
                    grant: held.grant,
                    slot: held.slot,
                    gate,
                    conn,
                    last_work: Instant::now(),
                    lost: false,
                    prepared: None,
                };
                self.ctx.board.set_detail(&self.owner(), "slot", held.slot);
                // The first turn runs now: it serves a wake that came while acquiring.
                state.woken = false;
                if Self::draining(state) {
                    self.release(me, state, holding);
                    return Ok(());
                }
                self.enter(state, Phase::Idle(holding));
                self.turn(me, state);
                return Ok(());
            }
            Acquisition::Granted(_) | Acquisition::Full => jittered(every),
            Acquisition::Quarantined(remaining) => remaining + jittered(every),
            Acquisition::Retry(why) => {
                self.ctx.board.set_error(&self.owner(), why);
                state.backoff.next_delay().max(every / 4)
            }
            Acquisition::Fatal(why) => return Err(why.into()),
        };
        lease::release_leftover(&self.ctx, &self.owner());
        if Self::draining(state) {
            self.enter(state, Phase::Standby { not_before: None });
            self.finish_drain(state);
        } else {
            self.retry_acquire(me, state, retry);
        }
        Ok(())
    }

    pub(super) fn turn(&self, me: &Me, state: &mut SenderState) {
        if Self::draining(state) {
            return;
        }
        let Some(mut holding) = take_idle(state) else { return };
        let conn = holding.conn.take().unwrap_or_else(|| self.ports.sends.sender(self.channel));
        let gate = holding.gate.clone();
        let c = &self.ctx.config;
        let size = if state.split { BatchSize::new(1).unwrap_or(BatchSize::MAX) } else { self.config.batch_size };
        let input = TurnInput {
            config: self.config.clone(),
            ports: self.ports.clone(),
            timing: c.timing.clone(),
            channel: self.channel,
            lease: holding.lease.clone(),
            lease_budget: self.config.send_timeout + c.timing.request_margin,
            clock: self.ctx.clock,
            size,
            gate,
            slot: holding.slot,
            prepared: holding.prepared.take(),
            finishing: state.finishing.take(),
            line: state.line.clone(),
            pipeline: !state.split,
        };
        let task = state.timers.spawn(me, async move { Step::TurnDone(Box::new(turn::run(input, conn).await)) });
        self.enter(state, Phase::Sending { holding, task });
    }

    pub(super) fn on_turn(
        &self,
        me: &Me,
        state: &mut SenderState,
        mut report: TurnReport,
    ) -> Result<(), ActorProcessingErr> {
        state.finishing = report.finishing.take();
        self.show(&report);
        let woken = std::mem::take(&mut state.woken);
        let Phase::Sending { mut holding, .. } =
            std::mem::replace(&mut state.phase, Phase::Standby { not_before: None })
        else {
            self.enter(state, Phase::Standby { not_before: None });
            return Ok(());
        };
        holding.conn = report.conn;
        holding.gate = report.gate;
        holding.prepared = report.prepared.take();
        if matches!(report.end, TurnEnd::Sent { .. } | TurnEnd::RateLimited { .. }) {
            holding.last_work = Instant::now();
            if let Some(drain) = state.drain.as_mut() {
                drain.report.finished_send = true;
            }
        }
        if !matches!(report.end, TurnEnd::Sent { .. }) || holding.lost || Self::draining(state) {
            self.return_unsent(state, &mut holding, "the sender stops sending for now");
        }
        if let TurnEnd::LeaseLost(why) = &report.end {
            self.lose(me, state, why.clone());
            return Ok(());
        }
        if holding.lost {
            self.lose(me, state, "send lease lost during the turn".into());
            return Ok(());
        }
        if Self::draining(state) {
            self.release(me, state, holding);
            return Ok(());
        }
        self.enter(state, Phase::Idle(holding));
        match report.end {
            TurnEnd::Sent { .. } => {
                state.split = false;
                state.backoff.reset();
                state.timers.arm(me, Duration::ZERO, Step::Turn);
            }
            TurnEnd::TooLarge => {
                state.split = true;
                state.timers.arm(me, Duration::ZERO, Step::Turn);
            }
            TurnEnd::Empty if woken => state.timers.arm(me, Duration::ZERO, Step::Turn),
            TurnEnd::Empty => self.idle(me, state),
            TurnEnd::RateLimited { retry_after } | TurnEnd::BucketWait { retry_after } => {
                self.pause(me, state, Pause::Until(Instant::now() + retry_after))
            }
            TurnEnd::BreakerRefused { retry_after, .. } => {
                self.pause(me, state, Pause::BreakerOpen { until: Instant::now() + retry_after })
            }
            TurnEnd::Backoff(why) => {
                self.ctx.board.set_error(&self.owner(), why);
                let delay = state.backoff.next_delay();
                self.pause(me, state, Pause::Until(Instant::now() + delay));
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
        let since = match &state.phase {
            Phase::Idle(h) => h.last_work.elapsed(),
            _ => Duration::MAX,
        };
        if since >= self.config.idle_release {
            return self.release_idle(me, state);
        }
        state.timers.arm(me, self.config.idle_poll, Step::Turn);
    }

    /// Nothing may be sent until the pause ends: keep the lease for a short pause, release it for a long one.
    fn pause(&self, me: &Me, state: &mut SenderState, pause: Pause) {
        state.pause = Some(pause);
        let after = pause.until().saturating_duration_since(Instant::now());
        if after >= self.config.idle_release {
            self.release_idle(me, state);
        } else {
            state.timers.arm(me, after, Step::Turn);
        }
    }

    /// The breaker was seen closed: a pause it caused ends now, and the sender
    /// looks for work (it may have released its lease for the pause).
    pub(super) fn on_breaker_closed(&self, me: &Me, state: &mut SenderState) {
        if !matches!(state.pause, Some(Pause::BreakerOpen { .. })) || !Self::paused(state) {
            return;
        }
        tracing::info!(sender = %self.owner(), "breaker closed: resuming before its break time");
        state.pause = None;
        if self.work_likely() {
            self.on_wake(me, state);
        }
    }

    /// Releases the slot held while idle.
    fn release_idle(&self, me: &Me, state: &mut SenderState) {
        if let Some(holding) = take_idle(state) {
            self.release(me, state, holding);
        }
    }

    /// Gives the slot back in a task: after the last publish, the gate settled, the lease released.
    fn release(&self, me: &Me, state: &mut SenderState, mut holding: Holding) {
        self.return_unsent(state, &mut holding, "the sender releases its slot");
        let (ctx, owner, finishing, line) =
            (self.ctx.clone(), self.owner(), state.finishing.take(), state.line.clone());
        let (gates, channel) = (self.ports.gates.clone(), self.channel);
        let task = state.timers.spawn(me, async move {
            // A sender back in standby (or drained) has recorded and published what it sent (or left it
            // to the janitor's recovery and sweep).
            line.flushed(finishing).await;
            let Holding { slot, gate, .. } = holding;
            if gate.may_clear(Instant::now())
                && let Err(e) = gates.release(channel, slot, gate.fence).await
            {
                tracing::warn!(%channel, slot, error = %e, "send gate not cleared: the next holder waits it out");
            }
            release_lease(&ctx, &owner).await;
            Step::Released
        });
        self.enter(state, Phase::Releasing { task });
    }

    pub(super) fn on_released(&self, me: &Me, state: &mut SenderState) {
        self.ctx.board.remove_detail(&self.owner(), "slot");
        if let Some(drain) = state.drain.as_mut() {
            drain.report.released = true;
            self.enter(state, Phase::Standby { not_before: None });
            return self.finish_drain(state);
        }
        self.enter(state, Phase::Standby { not_before: None });
        let woken = std::mem::take(&mut state.woken);
        if Self::paused(state) {
            let after = state.pause.map_or(Duration::ZERO, |p| p.until().saturating_duration_since(Instant::now()));
            state.timers.arm(me, after, Step::TryAcquire);
        } else if woken {
            self.acquire(me, state);
        }
    }

    /// The lease is gone: drop the connection, give the ledger entry back,
    /// standby. The gate is left standing (a POST may be in flight).
    fn lose(&self, me: &Me, state: &mut SenderState, why: String) {
        tracing::warn!(sender = %self.owner(), %why, "send lease lost");
        if let Some(mut holding) = take_idle(state) {
            self.return_unsent(state, &mut holding, "send lease lost");
        }
        state.phase = Phase::Standby { not_before: None };
        if let Some(lease) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release_in_background(vec![lease]);
        }
        self.ctx.board.set_error(&self.owner(), why);
        self.ctx.board.remove_detail(&self.owner(), "slot");
        if Self::draining(state) {
            self.enter(state, Phase::Standby { not_before: None });
            return self.finish_drain(state);
        }
        let every = self.ctx.config.timing.acquire_interval;
        self.retry_acquire(me, state, jittered(every));
    }

    pub(super) fn on_lease_lost(&self, me: &Me, state: &mut SenderState, grant: GrantId, cause: LostCause) {
        let Some(holding) = state.phase.holding_mut().filter(|h| h.grant == grant) else { return };
        crate::metrics::lease_lost("send");
        holding.lost = true;
        // A turn in flight finishes and is recorded; an idle sender stops at once.
        if matches!(state.phase, Phase::Idle(_)) {
            self.lose(me, state, format!("send lease lost: {cause}"));
        }
    }

    pub(super) fn on_drain(&self, me: &Me, state: &mut SenderState, reply: RpcReplyPort<SenderDrain>) {
        state.drain = Some(Drain { reply: Some(reply), report: SenderDrain::default() });
        match state.phase {
            Phase::Standby { .. } | Phase::Drained => self.finish_drain(state),
            Phase::Idle(_) => self.release_idle(me, state),
            // An acquire, a turn or a release finishes first.
            Phase::Acquiring { .. } | Phase::Sending { .. } | Phase::Releasing { .. } => {}
        }
    }

    fn finish_drain(&self, state: &mut SenderState) {
        state.timers.invalidate();
        self.enter(state, Phase::Drained);
        if let Some(drain) = state.drain.as_mut()
            && let Some(reply) = drain.reply.take()
        {
            let _ = reply.send(drain.report);
        }
    }
}

impl Sender {
    /// A batch prepared for a POST that will not come goes back to the queue
    /// (`NotSent`, not an attempt), after the last finish.
    fn return_unsent(&self, state: &mut SenderState, holding: &mut Holding, why: &str) {
        let Some(prepared) = holding.prepared.take() else { return };
        let last = state.finishing.take();
        state.finishing = Some(state.line.start_now(last, prepared.give_back(Duration::ZERO, why)));
    }
}

/// The holding of an idle sender, taken out of its phase; any other phase is left as it is.
fn take_idle(state: &mut SenderState) -> Option<Holding> {
    match std::mem::replace(&mut state.phase, Phase::Drained) {
        Phase::Idle(holding) => Some(holding),
        other => {
            state.phase = other;
            None
        }
    }
}

fn lost(grant: GrantId, cause: LostCause) -> SenderMsg {
    SenderMsg::LeaseLost { grant, cause }
}

async fn release_lease(ctx: &TreeContext, owner: &str) {
    if let Some(lease) = ctx.ledger.remove(owner) {
        ctx.release(vec![lease]).await;
    }
}
