//! Confirmer (every pod): applies the SPI's verdicts carried by inbound
//! pacs.002 / admi.002 to the outbound messages they reference. The slots poke
//! it (in memory, no I/O on the inbound path) after committing status reports;
//! it also runs every `confirm_interval`, so reports committed by a pod that
//! crashed before its confirmer ran are applied by any pod. One pass at a time
//! in a spawned task, then again while passes come back full.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::{OutboundConfig, OutboundPorts};
use crate::metrics;
use crate::ports::outbound_bus::ResultStatus;
use crate::ports::{ConfirmError, Correlated};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

pub const ID: &str = "confirmer";

pub enum ConfirmerMsg {
    /// Status reports were committed on this pod.
    Poke,
    Tick {
        generation: u64,
    },
    Done {
        result: Result<Correlated, ConfirmError>,
    },
}

pub struct ConfirmerState {
    tick_generation: u64,
    task: Option<OwnedTask>,
    watcher: Option<OwnedTask>,
    /// A poke arrived during a pass: run once more after it.
    again: bool,
}

pub struct Confirmer {
    pub ctx: TreeContext,
    pub config: Arc<OutboundConfig>,
    pub ports: OutboundPorts,
}

impl Actor for Confirmer {
    type Msg = ConfirmerMsg;
    type State = ConfirmerState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<ConfirmerMsg>, _: ()) -> Result<ConfirmerState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some("root"), "confirmer");
        Ok(ConfirmerState { tick_generation: 0, task: None, watcher: None, again: false })
    }

    async fn post_start(
        &self,
        me: ActorRef<ConfirmerMsg>,
        state: &mut ConfirmerState,
    ) -> Result<(), ActorProcessingErr> {
        let (signal, poke) = (self.ctx.signal.clone(), me.clone());
        state.watcher = Some(OwnedTask::spawn(async move {
            loop {
                signal.reports_committed().await;
                if poke.send_message(ConfirmerMsg::Poke).is_err() {
                    return;
                }
            }
        }));
        self.run(&me, state);
        self.arm_tick(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<ConfirmerMsg>,
        msg: ConfirmerMsg,
        state: &mut ConfirmerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConfirmerMsg::Poke => self.run(&me, state),
            ConfirmerMsg::Tick { generation } if generation == state.tick_generation => {
                self.run(&me, state);
                self.arm_tick(&me, state);
            }
            ConfirmerMsg::Done { result } => self.on_done(&me, state, result)?,
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<ConfirmerMsg>,
        state: &mut ConfirmerState,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        state.watcher = None;
        self.ctx.board.set_state(ID, "stopped");
        Ok(())
    }
}

impl Confirmer {
    fn arm_tick(&self, me: &ActorRef<ConfirmerMsg>, state: &mut ConfirmerState) {
        state.tick_generation += 1;
        let generation = state.tick_generation;
        me.send_after(self.config.confirm_interval, move || ConfirmerMsg::Tick { generation });
    }

    fn run(&self, me: &ActorRef<ConfirmerMsg>, state: &mut ConfirmerState) {
        if state.task.is_some() {
            state.again = true;
            return;
        }
        let (ports, max, me) = (self.ports.clone(), self.config.confirm_batch, me.clone());
        state.task = Some(OwnedTask::spawn(async move {
            let result = ports.confirmations.correlate(max).await;
            if let Ok(done) = &result
                && !done.applied.is_empty()
                && let Err(e) = ports.results.publish(&done.applied).await
            {
                tracing::warn!(error = %e, "verdict events left for the janitor's sweep");
            }
            let _ = me.send_message(ConfirmerMsg::Done { result });
        }));
        self.ctx.board.set_state(ID, "correlating");
    }

    fn on_done(
        &self,
        me: &ActorRef<ConfirmerMsg>,
        state: &mut ConfirmerState,
        result: Result<Correlated, ConfirmError>,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        let board = &self.ctx.board;
        board.set_state(ID, "idle");
        match result {
            Ok(done) => {
                let confirmed = done.applied.iter().filter(|e| e.status == ResultStatus::Confirmed).count();
                let sent = done.applied.iter().filter(|e| e.status == ResultStatus::Sent).count();
                let figures = [
                    ("rows", done.rows),
                    ("confirmed", confirmed),
                    ("rejected_by_spi", done.applied.len() - confirmed - sent),
                    ("already_final", done.already_final),
                    ("unknown", done.unknown),
                    ("retried", done.retried),
                    ("unmatched", done.unmatched),
                    ("unreadable", done.unreadable),
                ];
                for (key, n) in figures {
                    board.add_detail(ID, key, n as u64);
                }
                metrics::outbound_upkeep("verdicts", done.applied.len());
                if state.again || done.rows >= self.config.confirm_batch as usize {
                    state.again = false;
                    self.run(me, state);
                }
            }
            Err(ConfirmError::Unavailable(e)) => board.set_error(ID, e),
            Err(ConfirmError::Fatal(e)) => return Err(format!("confirmations: {e}").into()),
        }
        Ok(())
    }
}
