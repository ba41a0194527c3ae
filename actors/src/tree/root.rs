//! Root: the pod's top supervisor over LeaseHeartbeat, Leader and one Channel
//! per enabled channel. It routes operator restarts by actor id and runs the
//! drain (SIGTERM): leave the pod registry, release the leader lease, drain
//! every slot, all within `drain_time`, then stop.
//!
//! Supervision policy (one_for_one): a failed child is restarted alone after a
//! backoff of base × 2^(k−1) (capped, jittered) through a generation-stamped
//! timer; the leases of its whole subtree are released first (ractor runs no
//! `post_stop` on failure and kills the subtree). More than `max_restarts`
//! restarts within `window` make Root fail: the tree ends `Escalated` and the
//! process exits non-zero so the orchestrator replaces the pod. Operator
//! restarts are immediate and not counted. While draining nothing restarts.
//! With outbound configured, OutboundDispatcher, Confirmer and one SendChannel
//! per channel are Root children under the same rules, and so are the Watchdog
//! and, with the DICT side on, DictSync.

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;

use super::channel::{Channel, ChannelMsg};
use super::dict_sync::{self, DictSync};
use super::exits::{self, ChildKey};
use super::heartbeat::{self, HeartbeatMsg, LeaseHeartbeat};
use super::leader::{self, Leader, LeaderMsg};
use super::{DrainReport, RestartError, TreeExit, context::TreeContext, sweeper};
use crate::domain::ChannelId;
use crate::outbound::confirmer::{self, Confirmer};
use crate::outbound::dispatcher::{self, DispatcherMsg, OutboundDispatcher};
use crate::outbound::senders::{SendChannel, SendChannelMsg};
use crate::slot::DrainOutcome;
use crate::supervision::{Plan, Supervision};
use crate::watchdog::{self, Watchdog};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RootChild {
    Heartbeat,
    Leader,
    Channel(ChannelId),
    Dispatcher,
    Confirmer,
    Senders(ChannelId),
    Watchdog,
    DictSync,
}

impl ChildKey for RootChild {
    fn id(&self) -> String {
        match self {
            RootChild::Heartbeat => heartbeat::ID.into(),
            RootChild::Leader => leader::ID.into(),
            RootChild::Channel(ch) => Channel::id(*ch),
            RootChild::Dispatcher => dispatcher::ID.into(),
            RootChild::Confirmer => confirmer::ID.into(),
            RootChild::Senders(ch) => SendChannel::id(*ch),
            RootChild::Watchdog => watchdog::ID.into(),
            RootChild::DictSync => dict_sync::ID.into(),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            RootChild::Heartbeat => "lease-heartbeat",
            RootChild::Leader => "leader",
            RootChild::Channel(_) => "channel",
            RootChild::Dispatcher => "outbound-dispatcher",
            RootChild::Confirmer => "confirmer",
            RootChild::Senders(_) => "senders",
            RootChild::Watchdog => "watchdog",
            RootChild::DictSync => "dict",
        }
    }

    /// Ledger owners in this child's subtree.
    fn owns(&self, owner: &str) -> bool {
        match self {
            RootChild::Heartbeat => false,
            RootChild::Leader => owner == leader::ID,
            RootChild::Channel(ch) => owner.starts_with(&format!("slot/{ch}/")),
            RootChild::Dispatcher | RootChild::Confirmer => false,
            RootChild::Senders(ch) => owner.starts_with(&format!("sender/{ch}/")),
            RootChild::Watchdog | RootChild::DictSync => false,
        }
    }
}

pub enum RootMsg {
    Respawn { child: RootChild, generation: u64 },
    Restart { id: String, reply: RpcReplyPort<Result<(), RestartError>> },
    Drain(RpcReplyPort<DrainReport>),
    Drained { report: DrainReport, reply: RpcReplyPort<DrainReport> },
}

pub struct RootState {
    supervision: Supervision<RootChild>,
    draining: bool,
}

pub struct Root {
    pub ctx: TreeContext,
}

impl Actor for Root {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<RootMsg>, _: ()) -> Result<RootState, ActorProcessingErr> {
        self.ctx.board.register("root", None, "root");
        Ok(RootState { supervision: Supervision::new(self.ctx.config.restart), draining: false })
    }

    async fn post_start(&self, me: ActorRef<RootMsg>, state: &mut RootState) -> Result<(), ActorProcessingErr> {
        self.spawn_child(&me, state, RootChild::Heartbeat).await?;
        self.spawn_child(&me, state, RootChild::Leader).await?;
        for child in self.children().into_iter().skip(2) {
            self.spawn_child(&me, state, child).await?;
        }
        self.ctx.board.set_state("root", "running");
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<RootMsg>,
        msg: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RootMsg::Respawn { child, generation } => {
                if !state.draining && state.supervision.take_respawn(&child, generation) {
                    self.spawn_child(&me, state, child).await?;
                }
            }
            RootMsg::Restart { id, reply } => self.route_restart(state, id, reply),
            RootMsg::Drain(reply) => self.drain(&me, state, reply),
            RootMsg::Drained { report, reply } => {
                tracing::info!(?report, "drained: stopping the tree");
                self.ctx.set_exit(TreeExit::Normal);
                self.ctx.board.set_state("root", "drained");
                let _ = reply.send(report);
                me.stop(Some("drained".into()));
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<RootMsg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match exits::settle(&self.ctx, &mut state.supervision, &event, state.draining) {
            Plan::SpawnNow(child) => self.spawn_child(&me, state, child).await?,
            Plan::Later { key: child, after, generation } => {
                me.send_after(after, move || RootMsg::Respawn { child, generation });
            }
            Plan::Escalate(why) => {
                tracing::error!(%why, "restart intensity exceeded: the pod gives up");
                self.ctx.board.set_state("root", "failed");
                self.ctx.board.set_error("root", why.clone());
                self.ctx.set_exit(TreeExit::Escalated(why.clone()));
                return Err(why.into());
            }
            Plan::Nothing => {}
        }
        Ok(())
    }
}

impl Root {
    async fn spawn_child(
        &self,
        me: &ActorRef<RootMsg>,
        state: &mut RootState,
        child: RootChild,
    ) -> Result<(), ActorProcessingErr> {
        let (ctx, sup) = (self.ctx.clone(), me.get_cell());
        let cell: ActorCell = match child {
            RootChild::Heartbeat => {
                let born = Instant::now();
                Actor::spawn_linked(None, LeaseHeartbeat { ctx, born }, (), sup).await?.0.get_cell()
            }
            RootChild::Leader => Actor::spawn_linked(None, Leader { ctx }, (), sup).await?.0.get_cell(),
            RootChild::Channel(channel) => {
                Actor::spawn_linked(None, Channel { channel, ctx }, (), sup).await?.0.get_cell()
            }
            RootChild::Watchdog => Actor::spawn_linked(None, Watchdog { ctx }, (), sup).await?.0.get_cell(),
            RootChild::DictSync => {
                let every = ctx.config.dict_sync.ok_or("DictSync without dict_sync")?;
                Actor::spawn_linked(None, DictSync { ctx, every }, (), sup).await?.0.get_cell()
            }
            outbound => {
                let (config, ports) = ctx.outbound().ok_or("outbound actors without outbound ports")?;
                match outbound {
                    RootChild::Dispatcher => {
                        let actor = OutboundDispatcher { ctx, config, ports };
                        Actor::spawn_linked(None, actor, (), sup).await?.0.get_cell()
                    }
                    RootChild::Confirmer => {
                        Actor::spawn_linked(None, Confirmer { ctx, config, ports }, (), sup).await?.0.get_cell()
                    }
                    RootChild::Senders(channel) => {
                        let actor = SendChannel { channel, ctx, config, ports };
                        Actor::spawn_linked(None, actor, (), sup).await?.0.get_cell()
                    }
                    _ => unreachable!("matched above"),
                }
            }
        };
        state.supervision.adopt(cell, child);
        Ok(())
    }

    fn child_ref<M: ractor::Message>(state: &RootState, child: RootChild) -> Option<ActorRef<M>> {
        state.supervision.child(&child).map(ActorRef::from)
    }

    fn route_restart(&self, state: &mut RootState, id: String, reply: RpcReplyPort<Result<(), RestartError>>) {
        if state.draining {
            let _ = reply.send(Err(RestartError::TreeStopped));
            return;
        }
        let c = &self.ctx.config;
        if let Some(child) = self.children().into_iter().find(|k| k.id() == id) {
            let ok = state.supervision.stop_for_restart(&child, "operator restart");
            let _ = reply.send(if ok { Ok(()) } else { Err(RestartError::NotRunning(id)) });
            return;
        }
        let answer = match parse_slot(&id) {
            _ if id == "root" => Err(RestartError::NotRestartable(id)),
            _ if id == sweeper::ID || id == crate::outbound::janitor::ID => {
                match Self::child_ref::<LeaderMsg>(state, RootChild::Leader) {
                    // A mailbox already gone drops the reply port: the caller sees the tree stopping.
                    Some(leader) => {
                        let _ = leader.send_message(LeaderMsg::RestartSingleton { id, reply });
                        return;
                    }
                    None => Err(RestartError::NotRunning(id)),
                }
            }
            Some((ch, n)) if c.channels.contains(&ch) && (1..=c.stream_pool.get()).contains(&n) => {
                match Self::child_ref::<ChannelMsg>(state, RootChild::Channel(ch)) {
                    Some(channel) => {
                        let _ = channel.send_message(ChannelMsg::RestartSlot { n, reply });
                        return;
                    }
                    None => Err(RestartError::NotRunning(id)),
                }
            }
            _ => match parse_sender(&id) {
                Some((ch, n)) if self.runs_sender(ch, n) => {
                    match Self::child_ref::<SendChannelMsg>(state, RootChild::Senders(ch)) {
                        Some(senders) => {
                            let _ = senders.send_message(SendChannelMsg::RestartSender { n, reply });
                            return;
                        }
                        None => Err(RestartError::NotRunning(id)),
                    }
                }
                _ => Err(RestartError::UnknownActor(id)),
            },
        };
        let _ = reply.send(answer);
    }

    /// Every child Root runs, in start order.
    fn children(&self) -> Vec<RootChild> {
        let c = &self.ctx.config;
        let mut children = vec![RootChild::Heartbeat, RootChild::Leader];
        children.extend(c.channels.iter().map(|ch| RootChild::Channel(*ch)));
        if c.outbound.is_some() {
            children.extend([RootChild::Dispatcher, RootChild::Confirmer]);
            children.extend(c.channels.iter().map(|ch| RootChild::Senders(*ch)));
        }
        children.push(RootChild::Watchdog);
        if c.dict_sync.is_some() && self.ctx.ports.dict.is_some() {
            children.push(RootChild::DictSync);
        }
        children
    }

    fn runs_sender(&self, channel: ChannelId, n: u8) -> bool {
        let c = &self.ctx.config;
        let per_channel = c.outbound.as_ref().map_or(0, |o| o.senders_per_channel.get());
        c.channels.contains(&channel) && (1..=per_channel).contains(&n)
    }

    fn drain(&self, me: &ActorRef<RootMsg>, state: &mut RootState, reply: RpcReplyPort<DrainReport>) {
        if state.draining {
            return;
        }
        state.draining = true;
        state.supervision.cancel_respawns();
        self.ctx.board.set_state("root", "draining");
        let heartbeat = Self::child_ref::<HeartbeatMsg>(state, RootChild::Heartbeat);
        let leader = Self::child_ref::<LeaderMsg>(state, RootChild::Leader);
        let channels: Vec<ActorRef<ChannelMsg>> =
            self.ctx.config.channels.iter().filter_map(|ch| Self::child_ref(state, RootChild::Channel(*ch))).collect();
        let outbound = super::drain::OutboundRefs {
            dispatcher: Self::child_ref::<DispatcherMsg>(state, RootChild::Dispatcher),
            senders: self
                .ctx
                .config
                .channels
                .iter()
                .filter_map(|ch| Self::child_ref::<SendChannelMsg>(state, RootChild::Senders(*ch)))
                .collect(),
        };
        let (ctx, me) = (self.ctx.clone(), me.clone());
        tokio::spawn(async move {
            let report = super::drain::run(ctx, heartbeat, leader, channels, outbound).await;
            let _ = me.send_message(RootMsg::Drained { report, reply });
        });
    }
}

/// `slot/cpm/3` → (cpm, 3).
fn parse_slot(id: &str) -> Option<(ChannelId, u8)> {
    let rest = id.strip_prefix("slot/")?;
    let (ch, n) = rest.split_once('/')?;
    Some((ch.parse().ok()?, n.parse().ok()?))
}

/// `sender/cpm/1` → (cpm, 1).
fn parse_sender(id: &str) -> Option<(ChannelId, u8)> {
    let rest = id.strip_prefix("sender/")?;
    let (ch, n) = rest.split_once('/')?;
    Some((ch.parse().ok()?, n.parse().ok()?))
}

/// Slots' answers summed into the pod's drain report.
pub fn tally(report: &mut DrainReport, outcomes: &[DrainOutcome]) {
    for o in outcomes {
        match o {
            DrainOutcome::Idle => report.idle += 1,
            DrainOutcome::HandedOver => report.handed_over += 1,
            DrainOutcome::Closed => report.closed += 1,
        }
    }
}
