//! Channel(ch): supervisor of the channel's Slot(ch, 1..=N) actors.
//!
//! Supervision policy (one_for_one): when a slot fails (or stops without being
//! asked to), its lease is released at once (taken from the ledger: ractor runs
//! no `post_stop` on failure) and only that slot is restarted, after a backoff
//! of base × 2^(k−1) (capped, jittered) for its k-th restart in the window,
//! through a generation-stamped timer. More than `max_restarts` restarts of
//! any of its slots within `window` make the Channel fail to Root. An operator
//! restart (`restart("slot/cpm/3")`) stops that slot gracefully and starts it
//! again at once, not counted. While draining nothing is restarted.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;

use super::exits::{self, ChildKey};
use super::{RestartError, context::TreeContext};
use crate::domain::{ChannelId, SlotId};
use crate::ports::PodBeat;
use crate::slot::{DrainOutcome, Slot, SlotMsg};
use crate::supervision::{Plan, Supervision};

pub enum ChannelMsg {
    Respawn {
        n: u8,
        generation: u64,
    },
    RestartSlot {
        n: u8,
        reply: RpcReplyPort<Result<(), RestartError>>,
    },
    /// Drain every slot by `deadline`; answers their outcomes (a slot that did not answer in time is missing).
    Drain {
        others: Vec<PodBeat>,
        deadline: Instant,
        reply: RpcReplyPort<Vec<DrainOutcome>>,
    },
}

pub struct ChannelState {
    supervision: Supervision<SlotId>,
    /// The pod stops: nothing is restarted any more.
    draining: bool,
}

impl ChildKey for SlotId {
    fn id(&self) -> String {
        Slot::id(*self)
    }

    fn kind(&self) -> &'static str {
        "slot"
    }

    fn owns(&self, owner: &str) -> bool {
        owner == self.id()
    }
}

pub struct Channel {
    pub channel: ChannelId,
    pub ctx: TreeContext,
}

impl Channel {
    pub fn id(channel: ChannelId) -> String {
        format!("channel/{channel}")
    }

    fn slot_id(&self, n: u8) -> SlotId {
        SlotId { channel: self.channel, n }
    }

    async fn spawn_slot(
        &self,
        me: &ActorRef<ChannelMsg>,
        state: &mut ChannelState,
        n: u8,
    ) -> Result<(), ActorProcessingErr> {
        let slot = Slot { slot: self.slot_id(n), ctx: self.ctx.clone() };
        let (child, _) = Actor::spawn_linked(None, slot, (), me.get_cell()).await?;
        state.supervision.adopt(child.get_cell(), self.slot_id(n));
        Ok(())
    }
}

impl Actor for Channel {
    type Msg = ChannelMsg;
    type State = ChannelState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<ChannelMsg>, _: ()) -> Result<ChannelState, ActorProcessingErr> {
        self.ctx.board.register(&Self::id(self.channel), Some("root"), "channel");
        Ok(ChannelState { supervision: Supervision::new(self.ctx.config.restart), draining: false })
    }

    async fn post_start(&self, me: ActorRef<ChannelMsg>, state: &mut ChannelState) -> Result<(), ActorProcessingErr> {
        for n in 1..=self.ctx.config.stream_pool.get() {
            self.spawn_slot(&me, state, n).await?;
        }
        self.ctx.board.set_state(&Self::id(self.channel), "supervising");
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<ChannelMsg>,
        msg: ChannelMsg,
        state: &mut ChannelState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ChannelMsg::Respawn { n, generation } => {
                if !state.draining && state.supervision.take_respawn(&self.slot_id(n), generation) {
                    self.spawn_slot(&me, state, n).await?;
                }
            }
            ChannelMsg::RestartSlot { n, reply } => {
                let slot = self.slot_id(n);
                let ok = !state.draining && state.supervision.stop_for_restart(&slot, "operator restart");
                let _ = reply.send(if ok { Ok(()) } else { Err(RestartError::NotRunning(slot.id())) });
            }
            ChannelMsg::Drain { others, deadline, reply } => {
                state.draining = true;
                state.supervision.cancel_respawns();
                self.ctx.board.set_state(&Self::id(self.channel), "draining");
                let slots: Vec<ActorRef<SlotMsg>> = (1..=self.ctx.config.stream_pool.get())
                    .filter_map(|n| state.supervision.child(&self.slot_id(n)))
                    .map(ActorRef::from)
                    .collect();
                let budget = deadline.saturating_duration_since(Instant::now());
                tokio::spawn(async move {
                    let ask = move |reply| SlotMsg::Drain { others: others.clone(), reply };
                    let _ = reply.send(exits::ask_all(slots, Some(budget), ask).await);
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<ChannelMsg>,
        event: SupervisionEvent,
        state: &mut ChannelState,
    ) -> Result<(), ActorProcessingErr> {
        match exits::settle(&self.ctx, &mut state.supervision, &event, state.draining) {
            Plan::SpawnNow(slot) => self.spawn_slot(&me, state, slot.n).await?,
            Plan::Later { key: slot, after, generation } => {
                me.send_after(after, move || ChannelMsg::Respawn { n: slot.n, generation });
            }
            Plan::Escalate(why) => return Err(format!("{}: {why}", Self::id(self.channel)).into()),
            Plan::Nothing => {}
        }
        Ok(())
    }
}
