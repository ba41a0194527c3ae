//! A pod: what it remembers (lost on a crash) and which protocol step it takes next. A pod acts
//! as soon as a step is enabled (maximal progress); slowness is the Pause fault.

use crate::config::Config;
use crate::redis::{Grant, Redis};
use crate::server::Answer;
use crate::state::{MAX, Token};

/// One protocol step of a pod; the `u8` is the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `heartbeat.rs` tick: renew_many over every held slot.
    Heartbeat,
    /// `LeaseStore::report_amnesia`: a renew found its key gone while the lease was valid.
    Report,
    /// `lease/acquire.rs` `acquire()` of a standby slot.
    Acquire(u8),
    /// `InboxStore::claim` right after the grant.
    Claim(u8),
    /// `InboxStore::arm`: a fenced write for the next request (the last one is used or too old).
    Arm(u8),
    /// `cycle.rs`: the GET on the slot's pull-next, once `Gate::ready` says so.
    Send(u8),
    /// `cycle.rs`: commit the batch (or store the cursor after a 204) under the fence.
    Handle(u8),
    /// The request timeout: abort the GET (the server keeps it) and arm again.
    Timeout(u8),
}

/// Between a grant and the next lost lease: the slot actor's cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Granted; the row is not claimed yet.
    Claim,
    /// Between requests.
    Ready(Ready),
    /// A GET is out.
    Polling(Polling),
}

/// Between two requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ready {
    pub fence: u8,
    pub token: Token,
    /// Ticks left of the wait the claim returned (the previous holder's `busy_until`).
    pub wait: u8,
    /// Ticks left in which the last unused fenced write may still arm a request (0 = none).
    pub window: u8,
    /// The last request was aborted: it may still be at the server, so a release must not
    /// clear `busy_until`.
    pub aborted: bool,
}

/// A GET is out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Polling {
    pub fence: u8,
    /// The token the GET was sent with (a retry after a timeout sends it again).
    pub token: Token,
    /// Ticks left before the pod gives up on it.
    pub timeout: u8,
    /// Ticks from the timeout to the end of the budget of the write that armed this GET
    /// (`write + margin - send`): how long the aborted GET may outlive the timeout.
    pub slack: u8,
    /// The server's answer, once it arrived.
    pub answer: Option<Answer>,
}

/// A held slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holding {
    pub grant: Grant,
    /// Ticks left of local validity (`t0 + lease - drift`, t0 taken when the call was sent).
    pub valid: u8,
    pub stage: Stage,
}

/// One slot actor's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Lease {
    #[default]
    Standby,
    Held(Holding),
}

/// A pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pod {
    /// Takes no step until resumed (SIGSTOP, a long GC, a starved VM).
    pub paused: bool,
    /// The Redis epoch it last saw (none after a restart).
    pub epoch: Option<u8>,
    /// Ticks left until the next heartbeat (0 while nothing is held).
    pub beat: u8,
    /// A renew found amnesia; the report to Redis is due.
    pub report: bool,
    pub slots: [Lease; MAX],
}

impl Pod {
    pub fn fresh(epoch: Option<u8>) -> Pod {
        Pod { paused: false, epoch, beat: 0, report: false, slots: [Lease::Standby; MAX] }
    }

    pub fn holds_any(&self) -> bool {
        self.slots.iter().any(|l| matches!(l, Lease::Held(_)))
    }

    /// `Gate::ready` plus the lease check: may the GET of a slot in `Ready` leave now?
    fn may_send(cfg: &Config, h: &Holding, r: &Ready) -> bool {
        h.valid > cfg.timing.request_timeout && (!cfg.safeguards.gate || (r.wait == 0 && r.window > 0))
    }

    /// How long a GET sent now may travel: within the margin of its write with the gate on.
    pub fn send_delay(&self, cfg: &Config, slot: usize) -> Option<u8> {
        let Lease::Held(h @ Holding { stage: Stage::Ready(r), .. }) = &self.slots[slot] else { return None };
        if self.paused || !Pod::may_send(cfg, h, r) {
            return None;
        }
        let bound =
            if cfg.safeguards.gate { cfg.faults.request_delay.min(r.window - 1) } else { cfg.faults.request_delay };
        (bound > 0).then_some(bound)
    }

    /// The steps enabled now (all urgent).
    pub fn steps(&self, cfg: &Config, redis: &Redis, out: &mut Vec<Step>) {
        if self.paused {
            return;
        }
        if self.report {
            out.push(Step::Report);
        }
        if self.beat == 0 && self.holds_any() {
            out.push(Step::Heartbeat);
        }
        for (s, lease) in self.slots.iter().enumerate().take(cfg.slots) {
            let slot = s as u8;
            match lease {
                Lease::Standby if redis.acquire_matters(cfg, self.epoch, s) => out.push(Step::Acquire(slot)),
                Lease::Standby => {}
                Lease::Held(h) => match &h.stage {
                    Stage::Claim => out.push(Step::Claim(slot)),
                    Stage::Ready(r) if Pod::may_send(cfg, h, r) => out.push(Step::Send(slot)),
                    Stage::Ready(r) if r.wait == 0 && h.valid > cfg.timing.request_timeout => out.push(Step::Arm(slot)),
                    Stage::Ready(_) => {}
                    Stage::Polling(p) if p.answer.is_some() => out.push(Step::Handle(slot)),
                    Stage::Polling(p) if p.timeout == 0 => out.push(Step::Timeout(slot)),
                    Stage::Polling(_) => {}
                },
            }
        }
    }

    /// One more GET on the current token of `stream`: the tokens this pod keeps for it age.
    pub fn age_tokens(&mut self, stream: usize) {
        if let Lease::Held(h) = &mut self.slots[stream] {
            match &mut h.stage {
                Stage::Claim => {}
                Stage::Ready(r) => r.token = r.token.aged(),
                Stage::Polling(p) => {
                    p.token = p.token.aged();
                    if let Some(a) = p.answer.as_mut() {
                        a.age_tokens();
                    }
                }
            }
        }
    }

    pub fn tick(&mut self) {
        self.beat = if self.holds_any() { self.beat.saturating_sub(1) } else { 0 };
        for lease in &mut self.slots {
            if let Lease::Held(h) = lease {
                h.valid = h.valid.saturating_sub(1);
                match &mut h.stage {
                    Stage::Claim => {}
                    Stage::Ready(r) => {
                        r.wait = r.wait.saturating_sub(1);
                        r.window = r.window.saturating_sub(1);
                    }
                    Stage::Polling(p) => p.timeout = p.timeout.saturating_sub(1),
                }
            }
        }
    }
}
