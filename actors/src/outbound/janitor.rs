//! OutboundJanitor (a leader singleton, next to the Sweeper): every
//! `janitor_interval`, in one spawned task, expires queued rows past their
//! deadline, returns claims whose sender vanished to the queue (an attempt),
//! flags sent rows without confirmation, publishes the events of those
//! changes and republishes result events left unpublished (bus down, crash).
//!
//! Why on the leader: these are cluster-wide scans; one runner does the work
//! once instead of P pods repeating the same queries (the statements lock with
//! SKIP LOCKED, so a leadership overlap is harmless), and a leader change
//! delays them by at most a lease. Senders also expire their own channel's
//! overdue rows on every take, so deadlines do not wait for the janitor.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::{OutboundConfig, OutboundPorts};
use crate::metrics;
use crate::ports::outbound::OutboundError;
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

pub const ID: &str = "outbound-janitor";

#[derive(Debug, Default)]
pub struct JanitorReport {
    pub expired: usize,
    pub recovered: usize,
    pub flagged: usize,
    pub republished: usize,
    /// Transient failures of this round (the next round retries).
    pub errors: Vec<String>,
    pub fatal: Option<String>,
}

pub enum JanitorMsg {
    Tick { generation: u64 },
    Done { generation: u64, report: JanitorReport },
}

pub struct JanitorState {
    generation: u64,
    task: Option<OwnedTask>,
}

pub struct OutboundJanitor {
    pub ctx: TreeContext,
    pub config: Arc<OutboundConfig>,
    pub ports: OutboundPorts,
}

impl Actor for OutboundJanitor {
    type Msg = JanitorMsg;
    type State = JanitorState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<JanitorMsg>, _: ()) -> Result<JanitorState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some(crate::tree::leader::ID), "outbound-janitor");
        Ok(JanitorState { generation: 0, task: None })
    }

    async fn post_start(&self, me: ActorRef<JanitorMsg>, state: &mut JanitorState) -> Result<(), ActorProcessingErr> {
        self.round(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<JanitorMsg>,
        msg: JanitorMsg,
        state: &mut JanitorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JanitorMsg::Tick { generation } if generation == state.generation => self.round(&me, state),
            JanitorMsg::Done { generation, report } if generation == state.generation => {
                state.task = None;
                if let Some(fatal) = report.fatal {
                    return Err(fatal.into());
                }
                self.show(report);
                state.generation += 1;
                let generation = state.generation;
                me.send_after(self.config.janitor_interval, move || JanitorMsg::Tick { generation });
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<JanitorMsg>, _state: &mut JanitorState) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "stopped");
        Ok(())
    }
}

impl OutboundJanitor {
    fn round(&self, me: &ActorRef<JanitorMsg>, state: &mut JanitorState) {
        state.generation += 1;
        let (generation, me) = (state.generation, me.clone());
        let (ports, config, republish_after) =
            (self.ports.clone(), self.config.clone(), self.ctx.config.timing.republish_after);
        self.ctx.board.set_state(ID, "sweeping");
        state.task = Some(OwnedTask::spawn(async move {
            let report = run(ports, config, republish_after).await;
            let _ = me.send_message(JanitorMsg::Done { generation, report });
        }));
    }

    fn show(&self, report: JanitorReport) {
        let board = &self.ctx.board;
        let figures = [
            ("expired", report.expired),
            ("recovered", report.recovered),
            ("flagged_unconfirmed", report.flagged),
            ("republished", report.republished),
        ];
        for (key, n) in figures {
            board.add_detail(ID, key, n as u64);
            metrics::outbound_upkeep(key, n);
        }
        match report.errors.first() {
            Some(e) => {
                board.set_error(ID, e.clone());
                board.set_state(ID, "retrying");
            }
            None => board.set_state(ID, "idle"),
        }
    }
}

async fn run(ports: OutboundPorts, config: Arc<OutboundConfig>, republish_after: std::time::Duration) -> JanitorReport {
    let mut report = JanitorReport::default();
    let max = config.janitor_batch;
    let store = &ports.store;
    let mut events = Vec::new();
    match store.expire_overdue(max).await {
        Ok(ev) => (report.expired, events) = (ev.len(), ev),
        Err(e) => note(&mut report, "expire", e),
    }
    match store.recover_stale_claims(max).await {
        Ok(ev) => {
            report.recovered = ev.len();
            events.extend(ev);
        }
        Err(e) => note(&mut report, "recover", e),
    }
    match store.flag_unconfirmed(max).await {
        Ok(ids) => report.flagged = ids.len(),
        Err(e) => note(&mut report, "flag", e),
    }
    if !events.is_empty()
        && let Err(e) = ports.results.publish(&events).await
    {
        report.errors.push(format!("publish: {e}"));
    }
    match ports.results.sweep(republish_after, max).await {
        Ok(n) => report.republished = n,
        Err(e) => report.errors.push(format!("republish: {e}")),
    }
    report
}

fn note(report: &mut JanitorReport, step: &str, e: OutboundError) {
    match e {
        OutboundError::Unavailable(m) => report.errors.push(format!("{step}: {m}")),
        OutboundError::Fatal(m) | OutboundError::Refused(m) => report.fatal = Some(format!("{step}: {m}")),
    }
}
