//! Sweeper (a leader singleton): every `sweep_interval`, republishes inbox rows
//! left unpublished for longer than `republish_after` (bus down, a pod crashed
//! between commit and publish). One sweep at a time, in a spawned task.

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::metrics;
use crate::ports::PublishError;
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

pub const ID: &str = "sweeper";

pub enum SweeperMsg {
    Tick { generation: u64 },
    Swept { generation: u64, result: Result<usize, PublishError> },
}

pub struct SweeperState {
    generation: u64,
    task: Option<OwnedTask>,
}

pub struct Sweeper {
    pub ctx: TreeContext,
}

impl Actor for Sweeper {
    type Msg = SweeperMsg;
    type State = SweeperState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<SweeperMsg>, _: ()) -> Result<SweeperState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some(super::leader::ID), "sweeper");
        Ok(SweeperState { generation: 0, task: None })
    }

    async fn post_start(&self, me: ActorRef<SweeperMsg>, state: &mut SweeperState) -> Result<(), ActorProcessingErr> {
        self.sweep(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<SweeperMsg>,
        msg: SweeperMsg,
        state: &mut SweeperState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SweeperMsg::Tick { generation } if generation == state.generation => self.sweep(&me, state),
            SweeperMsg::Swept { generation, result } if generation == state.generation => {
                state.task = None;
                let board = &self.ctx.board;
                match result {
                    Ok(rows) => {
                        metrics::republished(rows);
                        board.add_detail(ID, "republished", rows as u64);
                        board.set_state(ID, "idle");
                    }
                    Err(e) => {
                        board.set_error(ID, e.to_string());
                        board.set_state(ID, "retrying");
                    }
                }
                state.generation += 1;
                let generation = state.generation;
                me.send_after(self.ctx.config.timing.sweep_interval, move || SweeperMsg::Tick { generation });
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<SweeperMsg>, _state: &mut SweeperState) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "stopped");
        Ok(())
    }
}

impl Sweeper {
    fn sweep(&self, me: &ActorRef<SweeperMsg>, state: &mut SweeperState) {
        state.generation += 1;
        let (generation, ctx, me) = (state.generation, self.ctx.clone(), me.clone());
        self.ctx.board.set_state(ID, "sweeping");
        state.task = Some(OwnedTask::spawn(async move {
            let result = ctx.ports.publisher.sweep(ctx.config.timing.republish_after).await;
            let _ = me.send_message(SweeperMsg::Swept { generation, result });
        }));
    }
}
