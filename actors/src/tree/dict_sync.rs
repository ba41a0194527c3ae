//! DictSync (a Root child when the DICT side is on): every `dict_sync`
//! interval, takes the Central Bank's DICT buckets (`GET /policies/`) over the
//! cluster's mirror, in a spawned task, one at a time. Its board entry shows
//! the participant bucket's tokens and the last failure; a failure is shown,
//! counted and retried at the next tick (the mirror goes on alone meanwhile).

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::ports::{DictLevel, DictSyncError};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

pub const ID: &str = "dict";

pub enum DictSyncMsg {
    Tick { generation: u64 },
    Synced { generation: u64, result: Result<DictLevel, DictSyncError> },
}

pub struct DictSyncState {
    generation: u64,
    task: Option<OwnedTask>,
}

pub struct DictSync {
    pub ctx: TreeContext,
    pub every: Duration,
}

impl Actor for DictSync {
    type Msg = DictSyncMsg;
    type State = DictSyncState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<DictSyncMsg>, _: ()) -> Result<DictSyncState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some("root"), "dict");
        Ok(DictSyncState { generation: 0, task: None })
    }

    async fn post_start(&self, me: ActorRef<DictSyncMsg>, state: &mut DictSyncState) -> Result<(), ActorProcessingErr> {
        self.sync(&me, state)
    }

    async fn handle(
        &self,
        me: ActorRef<DictSyncMsg>,
        msg: DictSyncMsg,
        state: &mut DictSyncState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DictSyncMsg::Tick { generation } if generation == state.generation => self.sync(&me, state)?,
            DictSyncMsg::Synced { generation, result } if generation == state.generation => {
                state.task = None;
                let board = &self.ctx.board;
                match result {
                    Ok(level) => {
                        board.set_detail(ID, "participant_tokens", level.participant_tokens);
                        board.add_detail(ID, "syncs", 1);
                        board.set_state(ID, "idle");
                    }
                    Err(e) => {
                        board.add_detail(ID, "sync_failures", 1);
                        board.set_error(ID, e.to_string());
                        board.set_state(ID, "retrying");
                    }
                }
                state.generation += 1;
                let generation = state.generation;
                me.send_after(self.every, move || DictSyncMsg::Tick { generation });
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<DictSyncMsg>,
        _state: &mut DictSyncState,
    ) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "stopped");
        Ok(())
    }
}

impl DictSync {
    fn sync(&self, me: &ActorRef<DictSyncMsg>, state: &mut DictSyncState) -> Result<(), ActorProcessingErr> {
        let port = self.ctx.ports.dict.clone().ok_or("DictSync without a dict port")?;
        state.generation += 1;
        let (generation, me) = (state.generation, me.clone());
        self.ctx.board.set_state(ID, "syncing");
        state.task = Some(OwnedTask::spawn(async move {
            let result = port.sync().await;
            let _ = me.send_message(DictSyncMsg::Synced { generation, result });
        }));
        Ok(())
    }
}
