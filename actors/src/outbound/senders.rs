//! SendChannel(ch) (`senders/cpm`): supervisor of the channel's Sender(ch,
//! 1..=K) actors, K = `senders_per_channel` on every pod (the cluster-wide send
//! pool caps how many hold a lease at once). Every `status_interval` it reads
//! the channel's shared breaker and rate bucket for the board and metrics;
//! a breaker seen closed ends the senders' pauses for it at once (an operator
//! reset, or another pod's probe, need not wait out each sender's break time).
//!
//! Supervision policy (one_for_one), as Channel: a failed sender's lease is
//! released at once (ractor runs no `post_stop` on failure) and only that
//! sender is restarted after a backoff of base × 2^(k−1) (capped, jittered);
//! more than `max_restarts` restarts within `window` make SendChannel fail to
//! Root. An operator restart (`restart("sender/cpm/1")`) is immediate and not
//! counted. While draining nothing is restarted.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;

use super::sender::{Sender, SenderDrain, SenderId, SenderMsg};
use super::{OutboundConfig, OutboundPorts};
use crate::domain::ChannelId;
use crate::metrics;
use crate::ports::Pool;
use crate::ports::breaker::{BreakerError, BreakerState, BreakerView};
use crate::ports::ratelimit::{BucketError, BucketLevel};
use crate::supervision::{Plan, Supervision};
use crate::task::OwnedTask;
use crate::timers::{Stamped, Timers};
use crate::tree::RestartError;
use crate::tree::context::TreeContext;
use crate::tree::exits;

pub enum SendChannelMsg {
    Respawn {
        n: u8,
        generation: u64,
    },
    RestartSender {
        n: u8,
        reply: RpcReplyPort<Result<(), RestartError>>,
    },
    /// The status probe's timer or result; only the latest stamp counts.
    Probe(u64, ProbeStep),
    /// The probe task panicked: SendChannel fails.
    ProbePanicked(String),
    /// Drain every sender by `deadline`; answers what they said (a sender that did not answer in time is missing).
    Drain {
        deadline: Instant,
        reply: RpcReplyPort<Vec<SenderDrain>>,
    },
}

pub enum ProbeStep {
    /// Time to read the breaker and the bucket.
    Start,
    Done {
        breaker: Result<BreakerView, BreakerError>,
        bucket: Result<BucketLevel, BucketError>,
    },
}

impl Stamped for SendChannelMsg {
    type Step = ProbeStep;

    fn stamped(generation: u64, step: ProbeStep) -> Self {
        SendChannelMsg::Probe(generation, step)
    }

    fn panicked(why: String) -> Self {
        SendChannelMsg::ProbePanicked(why)
    }
}

pub struct SendChannelState {
    supervision: Supervision<SenderId>,
    /// Stamps the probe's timer and task.
    probe_timers: Timers,
    probe: Option<OwnedTask>,
    /// The pod stops: no restart, no probe.
    draining: bool,
}

pub struct SendChannel {
    pub channel: ChannelId,
    pub ctx: TreeContext,
    pub config: Arc<OutboundConfig>,
    pub ports: OutboundPorts,
}

impl SendChannel {
    pub fn id(channel: ChannelId) -> String {
        format!("senders/{channel}")
    }

    async fn spawn_sender(
        &self,
        me: &ActorRef<SendChannelMsg>,
        state: &mut SendChannelState,
        n: u8,
    ) -> Result<(), ActorProcessingErr> {
        let sender = Sender {
            channel: self.channel,
            n,
            ctx: self.ctx.clone(),
            config: self.config.clone(),
            ports: self.ports.clone(),
        };
        let (child, _) = Actor::spawn_linked(None, sender, (), me.get_cell()).await?;
        state.supervision.adopt(child.get_cell(), self.sender_id(n));
        Ok(())
    }

    fn sender_id(&self, n: u8) -> SenderId {
        SenderId { channel: self.channel, n }
    }

    fn probe(&self, me: &ActorRef<SendChannelMsg>, state: &mut SendChannelState) {
        let (channel, ports) = (self.channel, self.ports.clone());
        state.probe = Some(state.probe_timers.spawn(me, async move {
            let (breaker, bucket) = tokio::join!(ports.breaker.state(channel), ports.bucket.level(channel));
            ProbeStep::Done { breaker, bucket }
        }));
    }

    fn show(&self, breaker: Result<BreakerView, BreakerError>, bucket: Result<BucketLevel, BucketError>) {
        let (id, board) = (Self::id(self.channel), &self.ctx.board);
        match breaker {
            Ok(view) => {
                metrics::breaker_state(self.channel, state_code(view.state));
                board.set_detail(&id, "breaker", serde_json::to_value(&view).unwrap_or_default());
            }
            Err(e) => board.set_error(&id, format!("breaker unknown: {e}")),
        }
        match bucket {
            Ok(level) => board.set_detail(&id, "bucket", serde_json::to_value(level).unwrap_or_default()),
            Err(e) => board.set_error(&id, format!("bucket unknown: {e}")),
        }
        let holding = self.ctx.ledger.held_slots(Pool::Send(self.channel)).len();
        board.set_detail(&id, "holding", holding);
        metrics::senders_holding(self.channel, holding);
    }
}

fn state_code(state: BreakerState) -> u8 {
    match state {
        BreakerState::Closed => 0,
        BreakerState::Degraded => 1,
        BreakerState::Open => 2,
        BreakerState::HalfOpen => 3,
    }
}

impl Actor for SendChannel {
    type Msg = SendChannelMsg;
    type State = SendChannelState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<SendChannelMsg>, _: ()) -> Result<SendChannelState, ActorProcessingErr> {
        self.ctx.board.register(&Self::id(self.channel), Some("root"), "senders");
        let supervision = Supervision::new(self.ctx.config.restart);
        Ok(SendChannelState { supervision, probe_timers: Timers::default(), probe: None, draining: false })
    }

    async fn post_start(
        &self,
        me: ActorRef<SendChannelMsg>,
        state: &mut SendChannelState,
    ) -> Result<(), ActorProcessingErr> {
        for n in 1..=self.config.senders_per_channel.get() {
            self.spawn_sender(&me, state, n).await?;
        }
        self.ctx.board.set_state(&Self::id(self.channel), "supervising");
        self.probe(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<SendChannelMsg>,
        msg: SendChannelMsg,
        state: &mut SendChannelState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SendChannelMsg::Respawn { n, generation } => {
                if !state.draining && state.supervision.take_respawn(&self.sender_id(n), generation) {
                    self.spawn_sender(&me, state, n).await?
                }
            }
            SendChannelMsg::RestartSender { n, reply } => {
                let id = self.sender_id(n);
                let ok = !state.draining && state.supervision.stop_for_restart(&id, "operator restart");
                let _ =
                    reply.send(if ok { Ok(()) } else { Err(RestartError::NotRunning(Sender::id(self.channel, n))) });
            }
            SendChannelMsg::Probe(generation, step) if state.probe_timers.is_current(generation) && !state.draining => {
                match step {
                    ProbeStep::Start => self.probe(&me, state),
                    ProbeStep::Done { breaker, bucket } => {
                        state.probe = None;
                        if matches!(&breaker, Ok(v) if matches!(v.state, BreakerState::Closed | BreakerState::Degraded))
                        {
                            self.breaker_closed(state);
                        }
                        self.show(breaker, bucket);
                        state.probe_timers.arm(&me, self.config.status_interval, ProbeStep::Start);
                    }
                }
            }
            SendChannelMsg::Probe(..) => tracing::trace!("stale probe dropped"),
            SendChannelMsg::ProbePanicked(why) => return Err(why.into()),
            SendChannelMsg::Drain { deadline, reply } => self.drain(state, deadline, reply),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<SendChannelMsg>,
        event: SupervisionEvent,
        state: &mut SendChannelState,
    ) -> Result<(), ActorProcessingErr> {
        match exits::settle(&self.ctx, &mut state.supervision, &event, state.draining) {
            Plan::SpawnNow(id) => self.spawn_sender(&me, state, id.n).await?,
            Plan::Later { key: id, after, generation } => {
                me.send_after(after, move || SendChannelMsg::Respawn { n: id.n, generation });
            }
            Plan::Escalate(why) => return Err(format!("{}: {why}", Self::id(self.channel)).into()),
            Plan::Nothing => {}
        }
        Ok(())
    }
}

impl SendChannel {
    /// Tells every sender the breaker lets calls through (a no-op for one not paused by it).
    fn breaker_closed(&self, state: &SendChannelState) {
        for n in 1..=self.config.senders_per_channel.get() {
            if let Some(sender) = state.supervision.child(&self.sender_id(n)) {
                let _ = ActorRef::<SenderMsg>::from(sender).send_message(SenderMsg::BreakerClosed);
            }
        }
    }

    fn drain(&self, state: &mut SendChannelState, deadline: Instant, reply: RpcReplyPort<Vec<SenderDrain>>) {
        state.draining = true;
        state.probe = None;
        state.probe_timers.invalidate();
        state.supervision.cancel_respawns();
        self.ctx.board.set_state(&Self::id(self.channel), "draining");
        let senders: Vec<ActorRef<SenderMsg>> = (1..=self.config.senders_per_channel.get())
            .filter_map(|n| state.supervision.child(&self.sender_id(n)))
            .map(ActorRef::from)
            .collect();
        let budget = deadline.saturating_duration_since(Instant::now());
        tokio::spawn(async move {
            let _ = reply.send(exits::ask_all(senders, Some(budget), SenderMsg::Drain).await);
        });
    }
}
