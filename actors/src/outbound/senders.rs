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
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::sender::{Sender, SenderDrain, SenderMsg};
use super::{OutboundConfig, OutboundPorts};
use crate::domain::ChannelId;
use crate::metrics;
use crate::ports::Pool;
use crate::ports::breaker::{BreakerError, BreakerState, BreakerView};
use crate::ports::ratelimit::{BucketError, BucketLevel};
use crate::supervision::{Supervision, Verdict};
use crate::task::OwnedTask;
use crate::tree::RestartError;
use crate::tree::context::TreeContext;

pub enum SendChannelMsg {
    Respawn {
        n: u8,
        generation: u64,
    },
    RestartSender {
        n: u8,
        reply: RpcReplyPort<Result<(), RestartError>>,
    },
    Probe {
        generation: u64,
    },
    Probed {
        generation: u64,
        breaker: Result<BreakerView, BreakerError>,
        bucket: Result<BucketLevel, BucketError>,
    },
    /// Drain every sender by `deadline`; answers what they said (a sender that did not answer in time is missing).
    Drain {
        deadline: Instant,
        reply: RpcReplyPort<Vec<SenderDrain>>,
    },
}

pub struct SendChannelState {
    supervision: Supervision<u8>,
    probe_generation: u64,
    probe: Option<OwnedTask>,
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
        state.supervision.adopt(child.get_cell(), n);
        Ok(())
    }

    fn release_sender(&self, n: u8) {
        let leases = self.ctx.ledger.take_owned(|o| o == Sender::id(self.channel, n));
        self.ctx.release_in_background(leases);
    }

    fn probe(&self, me: &ActorRef<SendChannelMsg>, state: &mut SendChannelState) {
        state.probe_generation += 1;
        let (generation, channel, ports, me) = (state.probe_generation, self.channel, self.ports.clone(), me.clone());
        state.probe = Some(OwnedTask::spawn(async move {
            let (breaker, bucket) = tokio::join!(ports.breaker.state(channel), ports.bucket.level(channel));
            let _ = me.send_message(SendChannelMsg::Probed { generation, breaker, bucket });
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
        Ok(SendChannelState { supervision, probe_generation: 0, probe: None, draining: false })
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
            SendChannelMsg::Respawn { n, generation }
                if !state.draining && state.supervision.take_respawn(&n, generation) =>
            {
                self.spawn_sender(&me, state, n).await?
            }
            SendChannelMsg::RestartSender { n, reply } => {
                let ok = !state.draining && state.supervision.stop_for_restart(&n, "operator restart");
                let id = Sender::id(self.channel, n);
                let _ = reply.send(if ok { Ok(()) } else { Err(RestartError::NotRunning(id)) });
            }
            SendChannelMsg::Probe { generation } if generation == state.probe_generation && !state.draining => {
                self.probe(&me, state)
            }
            SendChannelMsg::Probed { generation, breaker, bucket } if generation == state.probe_generation => {
                state.probe = None;
                if matches!(&breaker, Ok(v) if matches!(v.state, BreakerState::Closed | BreakerState::Degraded)) {
                    self.breaker_closed(state);
                }
                self.show(breaker, bucket);
                state.probe_generation += 1;
                let generation = state.probe_generation;
                me.send_after(self.config.status_interval, move || SendChannelMsg::Probe { generation });
            }
            SendChannelMsg::Drain { deadline, reply } => self.drain(state, deadline, reply),
            _ => {}
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<SendChannelMsg>,
        event: SupervisionEvent,
        state: &mut SendChannelState,
    ) -> Result<(), ActorProcessingErr> {
        match state.supervision.on_event(&event) {
            Verdict::Restart { key: n, after, counted, why } => {
                self.release_sender(n);
                let id = Sender::id(self.channel, n);
                self.ctx.board.count_restart(&id);
                metrics::restart("sender");
                if counted {
                    tracing::warn!(sender = %id, %why, ?after, "sender failed: restarting it");
                    self.ctx.board.set_error(&id, why);
                }
                if state.draining {
                    return Ok(());
                }
                self.ctx.board.set_state(&id, "restarting");
                if after.is_zero() {
                    self.spawn_sender(&me, state, n).await?;
                } else {
                    let generation = state.supervision.arm_respawn(n);
                    me.send_after(after, move || SendChannelMsg::Respawn { n, generation });
                }
            }
            Verdict::Escalate { key: n, why } => {
                self.release_sender(n);
                return Err(format!("{}: {why}", Self::id(self.channel)).into());
            }
            Verdict::Retired(n) => self.release_sender(n),
            Verdict::Ignore => {}
        }
        Ok(())
    }
}

impl SendChannel {
    /// Tells every sender the breaker lets calls through (a no-op for one not paused by it).
    fn breaker_closed(&self, state: &SendChannelState) {
        for n in 1..=self.config.senders_per_channel.get() {
            if let Some(sender) = state.supervision.child(&n) {
                let _ = ActorRef::<SenderMsg>::from(sender).send_message(SenderMsg::BreakerClosed);
            }
        }
    }

    fn drain(&self, state: &mut SendChannelState, deadline: Instant, reply: RpcReplyPort<Vec<SenderDrain>>) {
        state.draining = true;
        state.probe = None;
        state.probe_generation += 1;
        state.supervision.cancel_respawns();
        self.ctx.board.set_state(&Self::id(self.channel), "draining");
        let senders: Vec<ActorRef<SenderMsg>> = (1..=self.config.senders_per_channel.get())
            .filter_map(|n| state.supervision.child(&n))
            .map(ActorRef::from)
            .collect();
        let budget = deadline.saturating_duration_since(Instant::now());
        tokio::spawn(async move {
            let mut calls = JoinSet::new();
            for sender in senders {
                calls.spawn(async move { sender.call(SenderMsg::Drain, Some(budget)).await });
            }
            let mut outcomes = Vec::new();
            while let Some(done) = calls.join_next().await {
                if let Ok(Ok(ractor::rpc::CallResult::Success(outcome))) = done {
                    outcomes.push(outcome);
                }
            }
            let _ = reply.send(outcomes);
        });
    }
}
