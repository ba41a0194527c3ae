//! Reconciler (a leader singleton): once when the leader starts it and then
//! every `reconcile.interval`, reconciles the closed windows against the
//! Central Bank's statement in a spawned task (one at a time). A failed run is
//! retried after `retry_after`; a window with a CRITICAL discrepancy raises
//! the `reconcile` alert until a later window reconciles clean. Its metrics
//! are the adapter's (operator runs count too).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::ports::reconcile::{ReconcileError, Reconciliation, WindowReport};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;
use crate::watchdog::{Alert, AlertKind};

pub const ID: &str = "reconciler";

/// When the Reconciler runs.
#[derive(Clone, Debug)]
pub struct ReconcileSchedule {
    pub interval: Duration,
    /// After a failed run.
    pub retry_after: Duration,
}

pub enum ReconcilerMsg {
    Tick { generation: u64 },
    Ran { generation: u64, result: Result<Vec<WindowReport>, ReconcileError> },
}

pub struct ReconcilerState {
    generation: u64,
    task: Option<OwnedTask>,
}

pub struct Reconciler {
    pub ctx: TreeContext,
    pub port: Arc<dyn Reconciliation>,
    pub schedule: ReconcileSchedule,
}

impl Actor for Reconciler {
    type Msg = ReconcilerMsg;
    type State = ReconcilerState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<ReconcilerMsg>, _: ()) -> Result<ReconcilerState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some(super::leader::ID), "reconciler");
        Ok(ReconcilerState { generation: 0, task: None })
    }

    async fn post_start(
        &self,
        me: ActorRef<ReconcilerMsg>,
        state: &mut ReconcilerState,
    ) -> Result<(), ActorProcessingErr> {
        self.run(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<ReconcilerMsg>,
        msg: ReconcilerMsg,
        state: &mut ReconcilerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReconcilerMsg::Tick { generation } if generation == state.generation => self.run(&me, state),
            ReconcilerMsg::Ran { generation, result } if generation == state.generation => {
                state.task = None;
                let next = match result {
                    Ok(windows) => {
                        self.record(&windows);
                        self.schedule.interval
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reconciliation failed; retrying");
                        self.ctx.board.set_error(ID, e.to_string());
                        self.ctx.board.set_state(ID, "retrying");
                        self.schedule.retry_after
                    }
                };
                state.generation += 1;
                let generation = state.generation;
                me.send_after(next, move || ReconcilerMsg::Tick { generation });
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<ReconcilerMsg>,
        _state: &mut ReconcilerState,
    ) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "stopped");
        Ok(())
    }
}

impl Reconciler {
    fn run(&self, me: &ActorRef<ReconcilerMsg>, state: &mut ReconcilerState) {
        state.generation += 1;
        let (generation, port, me) = (state.generation, self.port.clone(), me.clone());
        self.ctx.board.set_state(ID, "reconciling");
        state.task = Some(OwnedTask::spawn(async move {
            let result = port.reconcile_due().await;
            let _ = me.send_message(ReconcilerMsg::Ran { generation, result });
        }));
    }

    /// Board and alert after a successful run (the adapter counts the metrics of every window).
    fn record(&self, windows: &[WindowReport]) {
        let board = &self.ctx.board;
        board.set_state(ID, "idle");
        for w in windows {
            board.add_detail(ID, "windows", 1);
            board.add_detail(ID, "settled_sends", w.settled_sends);
            let found: u64 = w.discrepancies.iter().map(|(_, n)| n).sum();
            board.add_detail(ID, "discrepancies", found);
            if found > 0 {
                tracing::warn!(
                    reconciliation = w.id,
                    found,
                    critical = w.critical(),
                    "reconciliation found discrepancies"
                );
            }
            self.ctx.alerts.set_reconcile(alert_of(w));
        }
    }
}

/// The `reconcile` alert a window raises (CRITICAL discrepancies), or `None` (it clears it).
pub fn alert_of(w: &WindowReport) -> Option<Alert> {
    (w.critical() > 0).then(|| Alert {
        kind: AlertKind::Reconcile,
        channel: None,
        slot: None,
        since_ms: now_ms(),
        detail: format!("reconciliation {}: {} CRITICAL discrepancies", w.id, w.critical()),
    })
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
