//! The stateright `Model`: which actions are enabled in a state and what each one leads to.
//!
//! Time: `Tick` advances real time by one tick and is enabled only when no urgent action is
//! (pod steps, server answers, a delayed request at its deadline): every component acts as soon
//! as it can, and slowness is a fault the checker chooses (pause, late request, lost answer).
//! Messages arrive and faults happen at any moment, until the checker chooses `Stop`; from then
//! on the run lasts `recovery` ticks and ends, and the liveness property is judged there.

use stateright::{Model, Property};

use crate::config::Config;
use crate::faults::Fault;
use crate::pod::Step;
use crate::properties;
use crate::server::Stage;
use crate::state::World;

/// The slot protocol of one channel, under one configuration.
#[derive(Clone, Debug)]
pub struct SlotProtocol {
    pub cfg: Config,
}

/// Everything that can happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// One tick of real time.
    Tick,
    /// The next message reaches the server's queue.
    Arrive,
    Pod {
        pod: u8,
        step: Step,
    },
    /// The server answers request `request` (index into its sorted list) of `stream`.
    Answer {
        stream: u8,
        request: u8,
    },
    /// A delayed request reaches the server.
    Deliver {
        stream: u8,
        request: u8,
    },
    Fault(Fault),
    Resume(u8),
    /// Redis writes a snapshot (the one a rollback restores).
    Snapshot,
    /// Faults and arrivals stop for good; the liveness clock starts.
    Stop,
}

impl SlotProtocol {
    pub fn new(cfg: Config) -> SlotProtocol {
        SlotProtocol { cfg }
    }

    /// The property called `name`, if there is one.
    pub fn property_named(&self, name: &str) -> Option<Property<SlotProtocol>> {
        self.properties().into_iter().find(|p| p.name == name)
    }

    /// The urgent actions: if any is enabled, time does not move.
    fn urgent(&self, w: &World, out: &mut Vec<Action>) {
        let mut steps = Vec::new();
        for (p, pod) in w.pods.iter().enumerate().take(self.cfg.pods) {
            pod.steps(&self.cfg, &w.redis, &mut steps);
            out.extend(steps.drain(..).map(|step| Action::Pod { pod: p as u8, step }));
        }
        for (i, r) in w.server.requests.iter().enumerate() {
            let (stream, request) = (r.stream, i as u8);
            if w.server.can_answer(i) {
                out.push(Action::Answer { stream, request });
            }
            if let Stage::Transit { left: 0, .. } = r.stage {
                out.push(Action::Deliver { stream, request });
            }
        }
    }

    /// The environment's choices: arrivals, faults, resumes, snapshots, the stop.
    fn choices(&self, w: &World, out: &mut Vec<Action>) {
        for (p, pod) in w.pods.iter().enumerate().take(self.cfg.pods) {
            if pod.paused {
                out.push(Action::Resume(p as u8));
            }
        }
        for (i, r) in w.server.requests.iter().enumerate() {
            if let Stage::Transit { left: 1.., .. } = r.stage {
                out.push(Action::Deliver { stream: r.stream, request: i as u8 });
            }
        }
        if w.ghost.stopped {
            return;
        }
        if w.server.arrived < self.cfg.messages {
            out.push(Action::Arrive);
        }
        if w.ghost.faults_left > 0 {
            let mut faults = Vec::new();
            Fault::enabled(&self.cfg, w, &mut faults);
            let allowed = faults.into_iter().filter(|f| self.cfg.faults.allows(f.kind()));
            out.extend(allowed.map(Action::Fault));
            let rollback = self.cfg.faults.allows(crate::config::FaultKind::RedisRollback);
            if rollback && w.redis.snapshot.is_none() {
                out.push(Action::Snapshot);
            }
        }
        if w.pods.iter().all(|p| !p.paused) {
            out.push(Action::Stop);
        }
    }
}

impl Model for SlotProtocol {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World::initial(&self.cfg).canonical(&self.cfg)]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        if w.ghost.stopped && (w.ghost.calm >= self.cfg.recovery || w.all_persisted()) {
            // The run is over: everything received is persisted (it stays so: nothing arrives
            // any more and the inbox only grows), or the recovery bound has passed without it.
            return;
        }
        let before = actions.len();
        self.urgent(w, actions);
        if actions.len() == before {
            actions.push(Action::Tick);
        }
        self.choices(w, actions);
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let cfg = &self.cfg;
        let mut w = last.clone();
        match action {
            Action::Tick => w.tick(),
            Action::Arrive => w.server.arrive(),
            Action::Pod { pod, step } => w.step(cfg, pod as usize, step),
            Action::Answer { request, .. } => w.answer(request as usize, false),
            Action::Deliver { request, .. } => w.deliver(cfg, request as usize),
            Action::Fault(fault) => w.fault(cfg, fault),
            Action::Resume(p) => w.pods[p as usize].paused = false,
            Action::Snapshot => w.redis.snapshot = Some(w.redis.data),
            Action::Stop => {
                w.ghost.stopped = true;
                w.ghost.faults_left = 0;
                w.redis.snapshot = None;
            }
        }
        Some(w.canonical(cfg))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::properties()
    }
}
