//! Restart bookkeeping shared by every supervisor: which child an actor id is,
//! which exits were asked for (operator restart, retirement), the restart
//! intensity window, and the [`Plan`] an exit calls for. Pure bookkeeping, no
//! I/O: what every supervisor does around a plan (release the child's leases,
//! the board, metrics) is `tree::exits::settle`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use ractor::{ActorCell, ActorId, SupervisionEvent};
use tokio::time::Instant;

use crate::backoff::half_jittered;
use crate::config::RestartPolicy;

/// What a child's exit calls for.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<K> {
    /// Not one of our children, or not an exit.
    Ignore,
    /// Start the child again after `after`. `counted` is false for exits we
    /// asked for (operator restart), true for failures.
    Restart { key: K, after: Duration, counted: bool, why: String },
    /// An exit we asked for; the child stays down.
    Retired(K),
    /// Beyond the restart intensity: the supervisor gives up.
    Escalate { key: K, why: String },
}

/// What a supervisor does next about a child's exit.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan<K> {
    /// Start it again now (an operator restart).
    SpawnNow(K),
    /// Start it again when the respawn timer stamped `generation` fires.
    Later { key: K, after: Duration, generation: u64 },
    /// Beyond the restart intensity: the supervisor fails with this reason.
    Escalate(String),
    /// Not one of ours, retired, or draining: nothing to start.
    Nothing,
}

/// A child's exit as booked, for the board and the lease release.
#[derive(Debug, PartialEq, Eq)]
pub struct Exit<K> {
    pub key: K,
    /// `Some` when the child is to be restarted: whether it counts as a failure, and why it stopped.
    pub restart: Option<(bool, String)>,
}

enum AfterExit {
    Restart,
    Retire,
}

pub struct Supervision<K> {
    policy: RestartPolicy,
    live: HashMap<ActorId, (K, ActorCell)>,
    expected: HashMap<ActorId, AfterExit>,
    recent: VecDeque<(Instant, K)>,
    generation: u64,
    /// Respawn timers still wanted, by child: a timer whose generation is not
    /// here is stale (the child was respawned already, or we are draining).
    pending: HashMap<K, u64>,
}

impl<K: Clone + Eq + std::hash::Hash> Supervision<K> {
    pub fn new(policy: RestartPolicy) -> Self {
        Supervision {
            policy,
            live: HashMap::new(),
            expected: HashMap::new(),
            recent: VecDeque::new(),
            generation: 0,
            pending: HashMap::new(),
        }
    }

    /// Records a freshly spawned child.
    pub fn adopt(&mut self, cell: ActorCell, key: K) {
        self.pending.remove(&key);
        self.live.insert(cell.get_id(), (key, cell));
    }

    pub fn child(&self, key: &K) -> Option<ActorCell> {
        self.live.values().find(|(k, _)| k == key).map(|(_, c)| c.clone())
    }

    /// Stops `key` so that its exit restarts it at once, uncounted. False when not running.
    pub fn stop_for_restart(&mut self, key: &K, reason: &str) -> bool {
        self.stop_expecting(key, AfterExit::Restart, reason)
    }

    /// Stops `key` for good. False when not running.
    pub fn retire(&mut self, key: &K, reason: &str) -> bool {
        self.stop_expecting(key, AfterExit::Retire, reason)
    }

    fn stop_expecting(&mut self, key: &K, after: AfterExit, reason: &str) -> bool {
        let Some(cell) = self.child(key) else { return false };
        self.expected.insert(cell.get_id(), after);
        cell.stop(Some(reason.to_owned()));
        true
    }

    /// Forgets every pending respawn (draining, or leadership lost).
    pub fn cancel_respawns(&mut self) {
        self.pending.clear();
    }

    /// Arms a respawn timer for `key`; the timer message carries the returned generation.
    pub fn arm_respawn(&mut self, key: K) -> u64 {
        self.generation += 1;
        self.pending.insert(key, self.generation);
        self.generation
    }

    /// True when this respawn timer is still wanted.
    pub fn take_respawn(&mut self, key: &K, generation: u64) -> bool {
        if self.pending.get(key) == Some(&generation) {
            self.pending.remove(key);
            true
        } else {
            false
        }
    }

    /// Books `event` and says what to do: restart now, later (a respawn timer
    /// armed here), escalate, or nothing — nothing is restarted while `draining`.
    pub fn plan(&mut self, event: &SupervisionEvent, draining: bool) -> (Option<Exit<K>>, Plan<K>) {
        match self.on_event(event) {
            Verdict::Ignore => (None, Plan::Nothing),
            Verdict::Retired(key) => (Some(Exit { key, restart: None }), Plan::Nothing),
            Verdict::Escalate { key, why } => (Some(Exit { key, restart: None }), Plan::Escalate(why)),
            Verdict::Restart { key, after, counted, why } => {
                let exit = Exit { key: key.clone(), restart: Some((counted, why)) };
                let plan = if draining {
                    Plan::Nothing
                } else if after.is_zero() {
                    Plan::SpawnNow(key)
                } else {
                    let generation = self.arm_respawn(key.clone());
                    Plan::Later { key, after, generation }
                };
                (Some(exit), plan)
            }
        }
    }

    pub fn on_event(&mut self, event: &SupervisionEvent) -> Verdict<K> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, format!("failed: {err}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, format!("stopped: {}", reason.as_deref().unwrap_or("no reason")))
            }
            _ => return Verdict::Ignore,
        };
        let Some((key, _)) = self.live.remove(&cell.get_id()) else { return Verdict::Ignore };
        match self.expected.remove(&cell.get_id()) {
            Some(AfterExit::Restart) => Verdict::Restart { key, after: Duration::ZERO, counted: false, why },
            Some(AfterExit::Retire) => Verdict::Retired(key),
            None => self.count_failure(key, why),
        }
    }

    fn count_failure(&mut self, key: K, why: String) -> Verdict<K> {
        let now = Instant::now();
        while self.recent.front().is_some_and(|(t, _)| now.duration_since(*t) > self.policy.window) {
            self.recent.pop_front();
        }
        self.recent.push_back((now, key.clone()));
        if self.recent.len() > self.policy.max_restarts as usize {
            let why = format!(
                "{} restarts within {:?} (max {}); last: {why}",
                self.recent.len(),
                self.policy.window,
                self.policy.max_restarts
            );
            return Verdict::Escalate { key, why };
        }
        let attempts = self.recent.iter().filter(|(_, k)| *k == key).count() as u32;
        let exp = self.policy.backoff_base.saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
        Verdict::Restart { key, after: half_jittered(exp.min(self.policy.backoff_max)), counted: true, why }
    }
}
