//! OutboundDispatcher (every pod): pulls requests from the durable consumer
//! the pods share, one intake round at a time in a spawned task (store, then
//! acknowledge, then publish the result events). Every `status_interval` it
//! reads the queue depth by (channel, priority): shown on the board and in
//! metrics, handed to the senders, and used for back-pressure — while the
//! queued rows (last depth + rows inserted since) reach `max_queued` it stops
//! pulling, and resumes once a probe shows fewer. It pulls only once a depth
//! is known (fail closed), and again only after a probe once a round found the
//! store down (each pull spends a delivery of what it takes; past
//! `max_deliver` a request is parked). Parked requests waiting for an
//! operator show as `parked_waiting` and `cabine_outbound_parked`. Drain: stop
//! pulling; a pull still waiting on the bus is aborted (nothing taken), a
//! round that is storing finishes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Map, Value};

use super::intake::{self, IntakeEnd, IntakeReport};
use super::{OutboundConfig, OutboundPorts};
use crate::backoff::Backoff;
use crate::metrics;
use crate::ports::outbound::{OutboundError, Priority, QueueDepth};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

pub const ID: &str = "outbound-dispatcher";

pub enum DispatcherMsg {
    Pull {
        generation: u64,
    },
    Pulled {
        generation: u64,
        report: IntakeReport,
    },
    Probe {
        generation: u64,
    },
    Probed {
        generation: u64,
        result: Result<QueueDepth, OutboundError>,
    },
    /// The pod stops: no more pulls; answers once no intake round is running.
    Drain(RpcReplyPort<()>),
}

pub struct DispatcherState {
    pull_generation: u64,
    probe_generation: u64,
    intake: Option<OwnedTask>,
    probe: Option<OwnedTask>,
    stage: Arc<AtomicU8>,
    /// Queued rows at the last probe plus rows inserted since (an upper bound); `None` before the first probe.
    queued: Option<u64>,
    paused: bool,
    backoff: Backoff,
    draining: bool,
    drain_reply: Option<RpcReplyPort<()>>,
}

pub struct OutboundDispatcher {
    pub ctx: TreeContext,
    pub config: Arc<OutboundConfig>,
    pub ports: OutboundPorts,
}

impl Actor for OutboundDispatcher {
    type Msg = DispatcherMsg;
    type State = DispatcherState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<DispatcherMsg>, _: ()) -> Result<DispatcherState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some("root"), "outbound-dispatcher");
        self.ctx.board.set_detail(ID, "max_queued", self.config.max_queued);
        let t = &self.ctx.config.timing;
        Ok(DispatcherState {
            pull_generation: 0,
            probe_generation: 0,
            intake: None,
            probe: None,
            stage: Arc::default(),
            queued: None,
            paused: false,
            backoff: Backoff::new(t.backoff_base, t.backoff_max),
            draining: false,
            drain_reply: None,
        })
    }

    async fn post_start(
        &self,
        me: ActorRef<DispatcherMsg>,
        state: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "probing");
        self.probe(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<DispatcherMsg>,
        msg: DispatcherMsg,
        state: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DispatcherMsg::Pull { generation } if generation == state.pull_generation => self.pull(&me, state),
            DispatcherMsg::Pulled { generation, report } if generation == state.pull_generation => {
                self.on_pulled(&me, state, report)?
            }
            DispatcherMsg::Probe { generation } if generation == state.probe_generation => self.probe(&me, state),
            DispatcherMsg::Probed { generation, result } if generation == state.probe_generation => {
                self.on_probed(&me, state, result)?
            }
            DispatcherMsg::Drain(reply) => self.drain(state, reply),
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<DispatcherMsg>,
        state: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        state.intake = None;
        state.probe = None;
        if !state.draining {
            self.ctx.board.set_state(ID, "stopped");
        }
        Ok(())
    }
}

impl OutboundDispatcher {
    fn pull(&self, me: &ActorRef<DispatcherMsg>, state: &mut DispatcherState) {
        if state.draining || state.paused || state.intake.is_some() || state.queued.is_none() {
            return;
        }
        state.pull_generation += 1;
        let generation = state.pull_generation;
        let (config, ports, signal, stage) =
            (self.config.clone(), self.ports.clone(), self.ctx.signal.clone(), state.stage.clone());
        let me = me.clone();
        state.intake = Some(OwnedTask::spawn(async move {
            let report = intake::run(config, ports, signal, stage).await;
            let _ = me.send_message(DispatcherMsg::Pulled { generation, report });
        }));
        self.ctx.board.set_state(ID, "pulling");
    }

    fn on_pulled(
        &self,
        me: &ActorRef<DispatcherMsg>,
        state: &mut DispatcherState,
        report: IntakeReport,
    ) -> Result<(), ActorProcessingErr> {
        state.intake = None;
        let board = &self.ctx.board;
        for (key, n) in [
            ("pulled", report.pulled),
            ("inserted", report.inserted),
            ("duplicates", report.duplicates),
            ("invalid", report.invalid),
            ("parked", report.parked),
            ("ack_failures", report.ack_failures),
        ] {
            board.add_detail(ID, key, n as u64);
        }
        state.queued = state.queued.map(|q| q + report.inserted as u64);
        if state.draining {
            self.finish_drain(state);
            return Ok(());
        }
        match report.end {
            IntakeEnd::Done => {
                state.backoff.reset();
                self.set_paused(state, state.queued.unwrap_or(0) >= self.config.max_queued);
                self.pull(me, state);
            }
            IntakeEnd::Unavailable(why) => {
                board.set_error(ID, why);
                board.set_state(ID, "backoff");
                state.pull_generation += 1;
                let generation = state.pull_generation;
                me.send_after(state.backoff.next_delay(), move || DispatcherMsg::Pull { generation });
            }
            IntakeEnd::StoreUnavailable(why) => {
                // Fail closed until a depth probe gets an answer: pulling while
                // the store is down would spend every request's deliveries.
                board.set_error(ID, why);
                board.set_state(ID, "store unavailable");
                state.queued = None;
            }
            IntakeEnd::Fatal(why) => return Err(why.into()),
        }
        Ok(())
    }

    fn probe(&self, me: &ActorRef<DispatcherMsg>, state: &mut DispatcherState) {
        if state.draining {
            return;
        }
        state.probe_generation += 1;
        let (generation, store, me) = (state.probe_generation, self.ports.store.clone(), me.clone());
        state.probe = Some(OwnedTask::spawn(async move {
            let result = store.depth().await;
            let _ = me.send_message(DispatcherMsg::Probed { generation, result });
        }));
    }

    fn on_probed(
        &self,
        me: &ActorRef<DispatcherMsg>,
        state: &mut DispatcherState,
        result: Result<QueueDepth, OutboundError>,
    ) -> Result<(), ActorProcessingErr> {
        state.probe = None;
        match result {
            Ok(depth) => {
                state.queued = Some(depth.queued());
                self.show_depth(&depth);
                self.ctx.signal.set_depth(depth);
                self.set_paused(state, state.queued.unwrap_or(0) >= self.config.max_queued);
                self.pull(me, state);
            }
            Err(OutboundError::Unavailable(e)) => self.ctx.board.set_error(ID, format!("queue depth unknown: {e}")),
            Err(e @ (OutboundError::Fatal(_) | OutboundError::Refused(_))) => {
                return Err(format!("queue depth: {e}").into());
            }
        }
        state.probe_generation += 1;
        let generation = state.probe_generation;
        me.send_after(self.config.status_interval, move || DispatcherMsg::Probe { generation });
        Ok(())
    }

    fn set_paused(&self, state: &mut DispatcherState, paused: bool) {
        let board = &self.ctx.board;
        if paused != state.paused {
            tracing::info!(paused, queued = state.queued, max = self.config.max_queued, "outbound back-pressure");
            metrics::backpressure(paused);
        }
        state.paused = paused;
        board.set_detail(ID, "backpressure", paused);
        if paused && state.intake.is_none() {
            board.set_state(ID, "backpressure");
        }
    }

    /// Depth by channel and priority on the board and in metrics.
    fn show_depth(&self, depth: &QueueDepth) {
        let mut by_channel = Map::new();
        for channel in &self.ctx.config.channels {
            let mut line = Map::new();
            for p in Priority::ALL {
                let queued =
                    depth.lines.iter().filter(|l| l.channel == *channel && l.priority == p).map(|l| l.queued).sum();
                metrics::queue_depth(*channel, p.as_str(), queued);
                line.insert(p.as_str().into(), Value::from(queued));
            }
            by_channel.insert(channel.as_str().into(), Value::Object(line));
        }
        let board = &self.ctx.board;
        board.set_detail(ID, "queue_depth", Value::Object(by_channel));
        board.set_detail(ID, "queued", depth.queued());
        board.set_detail(ID, "parked_waiting", depth.parked);
        metrics::parked(depth.parked);
        board.set_detail(ID, "sending", depth.lines.iter().map(|l| l.sending).sum::<u64>());
    }

    fn drain(&self, state: &mut DispatcherState, reply: RpcReplyPort<()>) {
        state.draining = true;
        state.probe = None;
        state.probe_generation += 1;
        state.drain_reply = Some(reply);
        self.ctx.board.set_state(ID, "draining");
        if state.intake.is_some() && state.stage.load(Ordering::SeqCst) == intake::PULLING {
            // Still waiting on the bus: nothing was taken, nothing to finish.
            state.intake = None;
            state.pull_generation += 1;
        }
        if state.intake.is_none() {
            self.finish_drain(state);
        }
    }

    fn finish_drain(&self, state: &mut DispatcherState) {
        self.ctx.board.set_state(ID, "drained");
        if let Some(reply) = state.drain_reply.take() {
            let _ = reply.send(());
        }
    }
}
