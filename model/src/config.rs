//! What one run of the checker explores: sizes, timings, which safeguards are on and which
//! faults the checker may choose, plus the named configurations the tests run.

use crate::properties::{NO_LOSS, ONE_REQUEST_PER_STREAM, PERSISTED, WITHIN_CAP};

/// Durations in ticks of the one global clock. Every pod's monotonic clock runs at the same rate
/// (a paused pod's clock runs on too), so one clock serves them all; `drift` is the margin the
/// pods keep anyway (DESIGN §3 "Local validity").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A grant is locally valid for `lease - drift` from the moment the acquire/renew was sent.
    pub lease: u8,
    /// Added to the Redis TTL so a vanished holder's requests end before the key can be taken.
    pub lock_delay: u8,
    /// The heartbeat renews every lease of a pod this often.
    pub heartbeat: u8,
    /// The pod aborts a request it sent this long ago; also the room a lease must have left.
    pub request_timeout: u8,
    /// The server answers an idle long-poll with 204 after this long (must be < request_timeout).
    pub hold: u8,
    /// A request must leave within this of the fenced write that armed it (the gate, §2.5).
    pub margin: u8,
    /// Subtracted from the local validity of a lease.
    pub drift: u8,
}

impl Timing {
    /// The model's default timings; they meet DESIGN §3's boot invariants: request timeout +
    /// heartbeat ≤ lease (2 + 1 ≤ 3), lease ≥ 3 × heartbeat (3 ≥ 3), lock delay ≥ request timeout
    /// (2 ≥ 2), and hold < request timeout. Small numbers keep the state space small; only their
    /// ratios matter.
    pub const DEFAULT: Timing =
        Timing { lease: 3, lock_delay: 2, heartbeat: 1, request_timeout: 2, hold: 1, margin: 1, drift: 0 };

    /// `busy_until` is set this far ahead of a fenced write: the request it arms leaves within
    /// `margin` and the server answers it within `hold` < `request_timeout`.
    pub fn budget(&self) -> u8 {
        self.request_timeout + self.margin
    }

    /// The Redis TTL of a slot key.
    pub fn ttl(&self) -> u8 {
        self.lease + self.lock_delay
    }

    /// How long a quarantine keeps every pool from granting.
    pub fn quarantine(&self) -> u8 {
        self.lease + self.lock_delay
    }

    /// How long after sending an acquire/renew the pod may use the slot.
    pub fn validity(&self) -> u8 {
        self.lease - self.drift
    }
}

/// How a change of the Redis server's identity (restart, snapshot restore, failover) is noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detection {
    /// The next script call sees the stored `run_id` differ and starts a quarantine.
    Prompt,
    /// Nothing compares the `run_id`: a restore that keeps the epoch is seen only when a renew
    /// finds its key gone or re-granted (the window the gate must cover).
    Late,
}

/// The protocol's safeguards; the negative controls switch one of them off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Safeguards {
    /// The durable request gate (`busy_until`, the claim's wait, one write per request, margin).
    pub gate: bool,
    /// Quarantine after a lost epoch, a changed identity or a renew that finds amnesia.
    pub quarantine: bool,
    /// Commits, cursor stores, arms and releases are conditioned on the row's fence.
    pub fence: bool,
    /// How a Redis identity change is noticed.
    pub detection: Detection,
    /// After a timeout the holder sends its next GET only once the budget of the write that
    /// armed the aborted one has passed (the fix this model found, see docs/model.md): the
    /// aborted GET may still be at the server until that write + margin + hold.
    pub abort_wait: bool,
}

impl Safeguards {
    /// The protocol as specified.
    pub const ALL: Safeguards =
        Safeguards { gate: true, quarantine: true, fence: true, detection: Detection::Prompt, abort_wait: true };
}

/// A fault the checker may choose; each one spends one unit of the run's fault budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A pod stops taking steps (its clock runs on) until the checker resumes it.
    Pause,
    /// A pod loses all memory and restarts; its requests live on at the server.
    Crash,
    /// A pod hands one slot over at once: aborts its GET and releases the lease (rolling deploy).
    Drain,
    /// Redis restarts without persistence: every key, the epoch included, is gone.
    RedisForget,
    /// Redis evicts the keys with a TTL: slot keys and the quarantine; the epoch stays.
    RedisEvict,
    /// Redis restarts from its last snapshot (taken by the checker at any earlier step).
    RedisRollback,
    /// A request reaches the server late (never later than the gate's margin allows, see docs).
    RequestDelay,
    /// An answer never reaches the pod, which times out and asks again.
    AnswerLost,
}

/// Which faults a run may choose and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    pub kinds: &'static [FaultKind],
    /// At most this many faults in one run (keeps the state space finite).
    pub budget: u8,
    /// The longest a delayed request may travel; with the gate on, also never past the margin.
    pub request_delay: u8,
}

impl Faults {
    pub fn allows(&self, kind: FaultKind) -> bool {
        self.kinds.contains(&kind)
    }
}

/// What the test expects of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No safety counterexample and the liveness property holds.
    Holds,
    /// The checker finds a counterexample to each of these properties.
    Violates(&'static [&'static str]),
}

/// One configuration of the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub name: &'static str,
    /// Pods competing for the slots (≤ 3).
    pub pods: usize,
    /// Stream slots of the channel, one stream each (≤ 3); the cap equals this.
    pub slots: usize,
    /// Messages the server receives over a run (≤ 8).
    pub messages: u8,
    pub timing: Timing,
    pub safeguards: Safeguards,
    pub faults: Faults,
    /// Liveness bound: this many ticks after faults stop, every received message is persisted.
    pub recovery: u8,
    /// Store one state per class of pod and slot permutations (see `canon.rs`).
    pub symmetry: bool,
    pub expect: Expect,
}

use FaultKind::*;

const POD_FAULTS: &[FaultKind] = &[Pause, Crash, Drain, RequestDelay, AnswerLost];
const RESTART_FAULTS: &[FaultKind] = &[RedisForget, RedisRollback];
const EVICTION_FAULTS: &[FaultKind] = &[Pause, RedisEvict];
const ROLLBACK_FAULTS: &[FaultKind] = &[RedisRollback];
const ALL_FAULTS: &[FaultKind] =
    &[Pause, Crash, Drain, RedisForget, RedisEvict, RedisRollback, RequestDelay, AnswerLost];

/// Ticks after the last fault within which the protocol persists everything: the least bound
/// that holds in every configuration (measured: 9 fails, see docs/model.md).
pub const RECOVERY: u8 = 10;

impl Config {
    fn protocol(
        name: &'static str,
        kinds: &'static [FaultKind],
        budget: u8,
        messages: u8,
        detection: Detection,
    ) -> Config {
        Config {
            name,
            pods: 2,
            slots: 2,
            messages,
            timing: Timing::DEFAULT,
            safeguards: Safeguards { detection, ..Safeguards::ALL },
            faults: Faults { kinds, budget, request_delay: 2 },
            recovery: RECOVERY,
            symmetry: true,
            expect: Expect::Holds,
        }
    }

    fn control(
        name: &'static str,
        safeguards: Safeguards,
        kinds: &'static [FaultKind],
        violates: &'static [&'static str],
    ) -> Config {
        Config {
            name,
            pods: 2,
            slots: 2,
            messages: 1,
            timing: Timing::DEFAULT,
            safeguards,
            faults: Faults { kinds, budget: 2, request_delay: 2 },
            recovery: RECOVERY,
            symmetry: false,
            expect: Expect::Violates(violates),
        }
    }

    /// The full protocol under two faults of the pods: pauses, crashes, drains, late requests and
    /// lost answers.
    pub fn pod_faults() -> Config {
        Config::protocol("protocol/pod faults", POD_FAULTS, 2, 1, Detection::Prompt)
    }

    /// Two Redis restarts (empty, or from a snapshot), the identity change noticed by the next
    /// script call.
    pub fn redis_restarts() -> Config {
        Config::protocol("protocol/redis restarts, prompt detection", RESTART_FAULTS, 2, 1, Detection::Prompt)
    }

    /// Two faults among pauses and evictions, noticed only by a renew that finds its key gone
    /// (the window the gate must cover).
    pub fn redis_eviction() -> Config {
        Config::protocol("protocol/eviction and pauses, late detection", EVICTION_FAULTS, 2, 1, Detection::Late)
    }

    /// Two restores of a snapshot with the epoch still in it, noticed only by a renew.
    pub fn redis_rollback() -> Config {
        Config::protocol("protocol/snapshot restores, late detection", ROLLBACK_FAULTS, 2, 1, Detection::Late)
    }

    /// One fault of any kind, two messages, late detection.
    pub fn any_fault() -> Config {
        Config::protocol("protocol/any fault, two messages", ALL_FAULTS, 1, 2, Detection::Late)
    }

    /// Every configuration of the full protocol.
    pub fn protocols() -> Vec<Config> {
        vec![
            Config::pod_faults(),
            Config::redis_restarts(),
            Config::redis_eviction(),
            Config::redis_rollback(),
            Config::any_fault(),
        ]
    }

    /// Gate off, Redis evicts keys: a second holder reads the stream the first still reads.
    pub fn no_gate_eviction() -> Config {
        let safeguards = Safeguards { gate: false, ..Safeguards::ALL };
        Config::control("control/no gate, eviction", safeguards, &[RedisEvict], &[ONE_REQUEST_PER_STREAM, NO_LOSS])
    }

    /// Gate off, a pod drains: its aborted GET is still read by the server as the next holder GETs.
    pub fn no_gate_drain() -> Config {
        let safeguards = Safeguards { gate: false, ..Safeguards::ALL };
        Config::control("control/no gate, drain", safeguards, &[Drain], &[ONE_REQUEST_PER_STREAM, NO_LOSS])
    }

    /// Gate off and no lock delay: a paused holder's late request outlives its lease.
    pub fn no_lock_delay() -> Config {
        let safeguards = Safeguards { gate: false, ..Safeguards::ALL };
        let mut c = Config::control(
            "control/no gate, no lock delay",
            safeguards,
            &[Pause, RequestDelay],
            &[ONE_REQUEST_PER_STREAM, WITHIN_CAP],
        );
        c.timing.lock_delay = 0;
        c
    }

    /// Gate off and no quarantine: Redis forgets everything and grants the slot again at once.
    pub fn no_quarantine() -> Config {
        let safeguards = Safeguards { gate: false, quarantine: false, ..Safeguards::ALL };
        Config::control("control/no gate, no quarantine", safeguards, &[RedisForget], &[ONE_REQUEST_PER_STREAM])
    }

    /// Gate on but writes not fenced: after an eviction the old holder's cursor store still
    /// arms a GET, which the new holder's wait (read at its claim) does not cover.
    pub fn no_fence() -> Config {
        let safeguards = Safeguards { fence: false, ..Safeguards::ALL };
        let kinds = &[RedisEvict, RequestDelay];
        let control = Config::control("control/no fence, eviction", safeguards, kinds, &[ONE_REQUEST_PER_STREAM]);
        // One slot and no message are enough for an overlap; they keep the search short.
        Config { slots: 1, messages: 0, ..control }
    }

    /// Gate on, but a timed-out holder sends again at once: its aborted GET, delivered late
    /// within the margin, is still held by the server.
    pub fn no_abort_wait() -> Config {
        let safeguards = Safeguards { abort_wait: false, ..Safeguards::ALL };
        Config::control("control/no abort wait", safeguards, &[RequestDelay], &[ONE_REQUEST_PER_STREAM, NO_LOSS])
    }

    /// Two Redis restarts, but the run ends one tick before the slots can possibly be taken
    /// over again (quarantine, then claim and wait): the `eventually` property must fail.
    pub fn short_recovery() -> Config {
        let mut c = Config::control("control/recovery bound too short", Safeguards::ALL, RESTART_FAULTS, &[PERSISTED]);
        c.recovery = 6;
        c
    }

    /// Every negative control.
    pub fn controls() -> Vec<Config> {
        vec![
            Config::no_gate_eviction(),
            Config::no_gate_drain(),
            Config::no_lock_delay(),
            Config::no_quarantine(),
            Config::no_fence(),
            Config::no_abort_wait(),
            Config::short_recovery(),
        ]
    }
}
