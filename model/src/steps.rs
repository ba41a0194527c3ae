//! What each pod step and each server answer does to the world: the slot actor's cycle of
//! `actors/src/slot/cycle.rs` against Redis, Postgres and the server.

use crate::config::Config;
use crate::pod::{Holding, Lease, Polling, Ready, Stage, Step};
use crate::redis::{Acquired, Grant, Renewed};
use crate::server::{Answer, Request, Stage as Wire};
use crate::state::{Token, World};

impl World {
    /// Runs one enabled step of pod `p`.
    pub fn step(&mut self, cfg: &Config, p: usize, step: Step) {
        match step {
            Step::Heartbeat => self.heartbeat(cfg, p),
            Step::Report => {
                self.redis.report_amnesia(cfg);
                self.pods[p].report = false;
            }
            Step::Acquire(s) => self.acquire(cfg, p, s as usize),
            Step::Claim(s) => self.claim(cfg, p, s as usize),
            Step::Arm(s) => self.arm(cfg, p, s as usize),
            Step::Send(s) => self.send(cfg, p, s as usize, None),
            Step::Handle(s) => self.handle(cfg, p, s as usize),
            Step::Timeout(s) => {
                let (h, Stage::Polling(q)) = self.holding(p, s as usize) else { unreachable!() };
                self.server.disown(s as usize, p as u8);
                let wait = if cfg.safeguards.abort_wait { q.slack } else { 0 };
                let ready = Ready { fence: q.fence, token: q.token, wait, window: 0, aborted: true };
                self.pods[p].slots[s as usize] = Lease::Held(Holding { stage: Stage::Ready(ready), ..h });
            }
        }
    }

    fn holding(&self, p: usize, s: usize) -> (Holding, Stage) {
        match self.pods[p].slots[s] {
            Lease::Held(h) => (h, h.stage),
            Lease::Standby => unreachable!("step of a slot not held"),
        }
    }

    fn set_stage(&mut self, p: usize, s: usize, stage: Stage) {
        if let Lease::Held(h) = &mut self.pods[p].slots[s] {
            h.stage = stage;
        }
    }

    /// The slot is lost: abort its GET (the server keeps it), drop everything, go standby.
    pub fn lose(&mut self, p: usize, s: usize) {
        if let Lease::Held(Holding { stage: Stage::Polling(_), .. }) = self.pods[p].slots[s] {
            self.server.disown(s, p as u8);
        }
        self.pods[p].slots[s] = Lease::Standby;
    }

    /// One heartbeat: a renew sent after the local validity ended is late (the slot is lost
    /// without asking); the others go in one renew_many call.
    fn heartbeat(&mut self, cfg: &Config, p: usize) {
        let mut held: Vec<(usize, Grant)> = Vec::new();
        for s in 0..cfg.slots {
            match self.pods[p].slots[s] {
                Lease::Held(h) if h.valid == 0 => self.lose(p, s),
                Lease::Held(h) => held.push((s, h.grant)),
                Lease::Standby => {}
            }
        }
        self.pods[p].beat = cfg.timing.heartbeat;
        if held.is_empty() {
            return;
        }
        let (fates, epoch) = self.redis.renew(cfg, self.pods[p].epoch, &held, &mut self.ghost.epochs);
        self.pods[p].epoch = Some(epoch);
        for (s, fate) in fates {
            match fate {
                Renewed::Extended => {
                    if let Lease::Held(h) = &mut self.pods[p].slots[s] {
                        h.valid = cfg.timing.validity();
                    }
                }
                Renewed::Gone => {
                    // Still locally valid (late ones were dropped above): partial amnesia.
                    self.pods[p].report |= cfg.safeguards.quarantine;
                    self.lose(p, s);
                }
                Renewed::Void => self.lose(p, s),
            }
        }
    }

    fn acquire(&mut self, cfg: &Config, p: usize, s: usize) {
        let grant = Grant { pod: p as u8, nonce: self.ghost.nonces[s] + 1 };
        let (answer, epoch) = self.redis.acquire(cfg, self.pods[p].epoch, s, grant, &mut self.ghost.epochs);
        let pod = &mut self.pods[p];
        pod.epoch = Some(epoch);
        if let Acquired::Granted(grant) = answer {
            self.ghost.nonces[s] = grant.nonce;
            if !pod.holds_any() {
                pod.beat = cfg.timing.heartbeat;
            }
            pod.slots[s] = Lease::Held(Holding { grant, valid: cfg.timing.validity(), stage: Stage::Claim });
        }
    }

    fn claim(&mut self, cfg: &Config, p: usize, s: usize) {
        let c = self.pg.claim(cfg, s);
        self.ghost.fence_regressed |= c.fence <= self.ghost.claimed[s];
        self.ghost.takeover |= c.fence > 1;
        self.ghost.claimed[s] = c.fence;
        // The claim's own window arms the first request only when there is nothing to wait for.
        let window = if c.wait == 0 { window(cfg) } else { 0 };
        let ready = Ready { fence: c.fence, token: c.pull_next, wait: c.wait, window, aborted: false };
        self.set_stage(p, s, Stage::Ready(ready));
    }

    fn arm(&mut self, cfg: &Config, p: usize, s: usize) {
        let (_, Stage::Ready(r)) = self.holding(p, s) else { unreachable!() };
        if self.pg.arm(cfg, s, r.fence) {
            self.set_stage(p, s, Stage::Ready(Ready { window: window(cfg), ..r }));
        } else {
            self.lose(p, s);
        }
    }

    /// The GET leaves: at once, or (fault) delayed by at most `delay` ticks.
    pub fn send(&mut self, cfg: &Config, p: usize, s: usize, delay: Option<u8>) {
        let (_, Stage::Ready(r)) = self.holding(p, s) else { unreachable!() };
        let slack = r.window.saturating_sub(1);
        let timeout = cfg.timing.request_timeout;
        let polling = Polling { fence: r.fence, token: r.token, timeout, slack, answer: None };
        self.set_stage(p, s, Stage::Polling(polling));
        match delay {
            None => self.admit(cfg, s, r.token, Some(p as u8)),
            Some(left) => self.server.send_delayed(s, r.token, p as u8, left),
        }
    }

    /// A GET reaches the server.
    pub fn admit(&mut self, cfg: &Config, s: usize, token: Token, owner: Option<u8>) {
        let (reading, advanced) = self.server.follow(s, token, cfg.timing.hold);
        if advanced {
            self.age_tokens(s);
        }
        let stage = Wire::Admitted { pull_next: Token::CURRENT, reading };
        self.server.push(Request { stream: s as u8, owner, stage });
    }

    /// The server answers request `i`; a lost answer never reaches its pod.
    pub fn answer(&mut self, i: usize, lost: bool) {
        let (request, answer) = self.server.answer(i);
        let Some(p) = request.owner.filter(|_| !lost) else { return };
        if let Lease::Held(Holding { stage: Stage::Polling(q), .. }) =
            &mut self.pods[p as usize].slots[request.stream as usize]
        {
            q.answer = Some(answer);
        }
    }

    /// A delayed GET reaches the server.
    pub fn deliver(&mut self, cfg: &Config, i: usize) {
        let (request, token) = self.server.take_transit(i);
        self.admit(cfg, request.stream as usize, token, request.owner);
    }

    /// `cycle.rs` after the answer: commit the batch, or store the cursor after a 204, under the
    /// fence; either write arms the next GET. A refused write means the fence is lost.
    fn handle(&mut self, cfg: &Config, p: usize, s: usize) {
        let (h, Stage::Polling(q)) = self.holding(p, s) else { unreachable!() };
        let written = match q.answer {
            Some(Answer::Batch { messages, pull_next }) => {
                self.pg.commit(cfg, s, q.fence, messages, pull_next).then_some(pull_next)
            }
            Some(Answer::Empty { pull_next }) => self.pg.store_cursor(cfg, s, q.fence, pull_next).then_some(pull_next),
            Some(Answer::Unknown) => {
                self.ghost.unknown_token = true;
                self.redis.release(cfg, s, h.grant);
                None
            }
            None => unreachable!("handle without an answer"),
        };
        match written {
            Some(token) => {
                let ready = Ready { fence: q.fence, token, wait: 0, window: window(cfg), aborted: false };
                self.set_stage(p, s, Stage::Ready(ready));
            }
            None => self.lose(p, s),
        }
    }
}

/// The window a fresh fenced write opens: this tick and `margin` more (none without the gate).
fn window(cfg: &Config) -> u8 {
    if cfg.safeguards.gate { cfg.timing.margin + 1 } else { 0 }
}
