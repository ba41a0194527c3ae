//! The faults the checker may choose, and what each does to the world.

use crate::config::{Config, FaultKind};
use crate::pod::{Holding, Lease, Pod, Stage};
use crate::state::World;

/// One fault; each spends one unit of the run's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    Pause(u8),
    /// Crash and restart with an empty memory.
    Crash(u8),
    /// `handover.rs`: hand one slot over at once (abort the GET, release gate and lease).
    Drain {
        pod: u8,
        slot: u8,
    },
    RedisForget,
    RedisEvict,
    RedisRollback,
    /// The pod's GET leaves now and reaches the server within `within` ticks.
    DelaySend {
        pod: u8,
        slot: u8,
        within: u8,
    },
    /// Request `request` (an index into the server's list) is answered, the answer is lost.
    LoseAnswer {
        stream: u8,
        request: u8,
    },
}

impl Fault {
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Pause(_) => FaultKind::Pause,
            Fault::Crash(_) => FaultKind::Crash,
            Fault::Drain { .. } => FaultKind::Drain,
            Fault::RedisForget => FaultKind::RedisForget,
            Fault::RedisEvict => FaultKind::RedisEvict,
            Fault::RedisRollback => FaultKind::RedisRollback,
            Fault::DelaySend { .. } => FaultKind::RequestDelay,
            Fault::LoseAnswer { .. } => FaultKind::AnswerLost,
        }
    }

    /// The faults enabled in `w` (the budget is checked by the caller).
    pub fn enabled(cfg: &Config, w: &World, out: &mut Vec<Fault>) {
        for p in 0..cfg.pods {
            let pod = &w.pods[p];
            let id = p as u8;
            // A pod holding nothing has nothing to do late: pausing it is just a slow standby.
            if !pod.paused && pod.holds_any() {
                out.push(Fault::Pause(id));
            }
            out.push(Fault::Crash(id));
            for s in 0..cfg.slots {
                if !pod.paused && matches!(pod.slots[s], Lease::Held(_)) {
                    out.push(Fault::Drain { pod: id, slot: s as u8 });
                }
                if let Some(within) = pod.send_delay(cfg, s) {
                    out.push(Fault::DelaySend { pod: id, slot: s as u8, within });
                }
            }
        }
        out.push(Fault::RedisForget);
        out.push(Fault::RedisEvict);
        if w.redis.snapshot.is_some() {
            out.push(Fault::RedisRollback);
        }
        for (i, r) in w.server.requests.iter().enumerate() {
            if r.owner.is_some() && w.server.can_answer(i) {
                out.push(Fault::LoseAnswer { stream: r.stream, request: i as u8 });
            }
        }
    }
}

impl World {
    pub fn fault(&mut self, cfg: &Config, fault: Fault) {
        self.ghost.faults_left -= 1;
        match fault {
            Fault::Pause(p) => self.pods[p as usize].paused = true,
            Fault::Crash(p) => {
                for s in 0..cfg.slots {
                    self.server.disown(s, p);
                }
                self.pods[p as usize] = Pod::fresh(None);
            }
            Fault::Drain { pod, slot } => self.drain(cfg, pod as usize, slot as usize),
            Fault::RedisForget => self.redis.forget(cfg),
            Fault::RedisEvict => self.redis.evict(),
            Fault::RedisRollback => self.redis.roll_back(cfg),
            Fault::DelaySend { pod, slot, within } => self.send(cfg, pod as usize, slot as usize, Some(within)),
            Fault::LoseAnswer { request, .. } => self.answer(request as usize, true),
        }
    }

    /// `handover.rs`: abort a GET that has not returned, release the gate (clearing
    /// `busy_until` only when nothing of ours can be in flight and the previous holder's window
    /// has passed), release the lease.
    fn drain(&mut self, cfg: &Config, p: usize, s: usize) {
        let Lease::Held(Holding { grant, stage, .. }) = self.pods[p].slots[s] else { return };
        let released = match stage {
            Stage::Claim => None,
            Stage::Ready(r) => Some((r.fence, cfg.safeguards.gate && !r.aborted && r.wait == 0)),
            Stage::Polling(q) => Some((q.fence, false)),
        };
        self.lose(p, s);
        if let Some((fence, clear)) = released {
            self.pg.release(cfg, s, fence, clear);
        }
        self.redis.release(cfg, s, grant);
    }
}
