//! Sender(channel, k): one send slot of a channel on this pod. Standby until
//! rows may be ready (the dispatcher's hints), then acquires ANY free slot of
//! the cluster-wide `Pool::Send(channel)` and claims that slot's gate row
//! (next fence, the previous holder's busy window: DESIGN §2.5), opens a fresh
//! connection, and plays turns (one batch each, in a spawned task) while
//! there is work; after `idle_release` without work, or a pause longer than
//! that (breaker open, 429, empty bucket), it releases the lease; a pause for
//! an open breaker ends as soon as SendChannel sees it closed. Nothing is sent
//! outside a valid lease and an armed gate: each turn checks the lease has
//! room for a whole send and passes the gate just before the POST. A lease
//! lost during a send lets that send finish and be recorded, then the sender
//! drops the connection and goes standby.
//!
//! Standby → Acquiring → Idle ⇄ Sending → (Releasing) → Standby; Drained.

mod finish;
mod grant;
mod lifecycle;
mod prepare;
mod turn;
pub mod verdict;

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{OutboundConfig, OutboundPorts};
use crate::backoff::Backoff;
use crate::config::TreeTiming;
use crate::domain::ChannelId;
use crate::gate::Gate;
use crate::lease::Acquisition;
use crate::ledger::HeldLease;
use crate::ports::breaker::BreakerState;
use crate::ports::outbound::BatchSize;
use crate::ports::{GrantId, IcomSender, LostCause};
use crate::slot::schedule::WallClock;
use crate::task::OwnedTask;
use crate::timers::{Stamped, Timers};
use crate::tree::context::TreeContext;
use crate::tree::exits::ChildKey;

use finish::FinishLine;
pub use grant::SendGrant;
use prepare::Prepared;

/// What one turn needs; the connection travels alongside.
pub struct TurnInput {
    pub config: Arc<OutboundConfig>,
    pub ports: OutboundPorts,
    pub timing: TreeTiming,
    pub channel: ChannelId,
    pub lease: HeldLease,
    /// A send starts only while the lease is valid for this long (send timeout + margin).
    pub lease_budget: Duration,
    pub clock: WallClock,
    /// How many rows to take (one after a batch over the body limit).
    pub size: BatchSize,
    /// The send slot's gate (fence, armed request); it comes back in the report.
    pub gate: Gate,
    /// Which send slot the gate is of.
    pub slot: u8,
    /// A batch prepared during the previous POST (admitted, claimed, drawn).
    pub prepared: Option<Prepared>,
    /// The previous turn's finish (record, breaker, publish), maybe still running.
    pub finishing: Option<JoinHandle<()>>,
    /// The sender's finish stage.
    pub line: FinishLine,
    /// Prepare the next batch while this one's POST is in flight.
    pub pipeline: bool,
}

/// How a turn ended, i.e. what the sender does next.
#[derive(Debug, PartialEq, Eq)]
pub enum TurnEnd {
    /// A POST was answered (`reply` label).
    Sent {
        reply: &'static str,
        messages: usize,
    },
    /// 429: pause the sender this long (not an attempt).
    RateLimited {
        retry_after: Duration,
    },
    /// No ready row.
    Empty,
    BreakerRefused {
        state: BreakerState,
        retry_after: Duration,
    },
    BucketWait {
        retry_after: Duration,
    },
    /// Refused before the wire for its size: the next turn takes one message.
    TooLarge,
    LeaseLost(String),
    /// A dependency is unavailable (fail closed): pause with backoff.
    Backoff(String),
    Fatal(String),
}

impl TurnEnd {
    /// How long rows put back by this end wait before being taken again.
    pub fn wait(&self) -> Duration {
        match self {
            TurnEnd::BucketWait { retry_after } | TurnEnd::RateLimited { retry_after } => *retry_after,
            _ => Duration::ZERO,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            TurnEnd::Sent { reply, .. } => reply,
            TurnEnd::RateLimited { .. } => "rate_limited",
            TurnEnd::Empty => "empty",
            TurnEnd::BreakerRefused { .. } => "breaker_refused",
            TurnEnd::BucketWait { .. } => "bucket_wait",
            TurnEnd::TooLarge => "too_large",
            TurnEnd::LeaseLost(_) => "lease_lost",
            TurnEnd::Backoff(_) => "backoff",
            TurnEnd::Fatal(_) => "fatal",
        }
    }
}

pub struct TurnReport {
    pub end: TurnEnd,
    /// `None` when the connection broke (timeout, transport): a fresh one is opened.
    pub conn: Option<Box<dyn IcomSender>>,
    pub gate: Gate,
    pub took: Duration,
    pub breaker: Option<BreakerState>,
    /// This turn's finish, running in the background: the next turn's starts after it.
    pub finishing: Option<JoinHandle<()>>,
    /// The next batch, prepared during this turn's POST (only after a clean answer).
    pub prepared: Option<Prepared>,
}

/// What a sender did when the pod drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderDrain {
    /// It held a send lease and released it.
    pub released: bool,
    /// A send was in flight and was finished and recorded first.
    pub finished_send: bool,
}

pub enum SenderMsg {
    /// Rows may be ready on the channel (dispatcher hint).
    Wake,
    /// A timer or task result, stamped with the generation it was armed in.
    Stamped(u64, Step),
    LeaseLost {
        grant: GrantId,
        cause: LostCause,
    },
    /// SendChannel saw the shared breaker closed (an operator reset, another
    /// pod's successful probe): a pause for an open breaker ends now.
    BreakerClosed,
    Drain(RpcReplyPort<SenderDrain>),
    /// A task of this sender panicked: it fails, its supervisor releases the lease.
    Panicked(String),
}

/// What a sender's timers and tasks bring back.
pub enum Step {
    TryAcquire,
    Acquired(Acquisition<Box<SendGrant>>),
    Turn,
    TurnDone(Box<TurnReport>),
    Released,
}

impl Stamped for SenderMsg {
    type Step = Step;

    fn stamped(generation: u64, step: Step) -> Self {
        SenderMsg::Stamped(generation, step)
    }

    fn panicked(why: String) -> Self {
        SenderMsg::Panicked(why)
    }
}

/// Where the sender is, with that phase's data.
pub enum Phase {
    /// Holds nothing. No acquire before `not_before` (refused or lost lately), however often woken.
    Standby { not_before: Option<Instant> },
    /// Acquiring a send lease and claiming its gate row in `task`.
    Acquiring { task: OwnedTask },
    /// Holds a send slot, no turn running.
    Idle(Holding),
    /// A turn runs in `task`, which owns the connection and the live gate (a
    /// sender stopped mid-turn leaves its POST in doubt: the gate is not released).
    Sending { holding: Holding, task: OwnedTask },
    /// Giving the lease back in `task` (after the last publish, with the gate settled).
    Releasing { task: OwnedTask },
    /// The pod stops: idle for good.
    Drained,
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Standby { .. } => "standby",
            Phase::Acquiring { .. } => "acquiring",
            Phase::Idle(_) => "idle",
            Phase::Sending { .. } => "sending",
            Phase::Releasing { .. } => "releasing",
            Phase::Drained => "drained",
        }
    }

    fn holding_mut(&mut self) -> Option<&mut Holding> {
        match self {
            Phase::Idle(h) | Phase::Sending { holding: h, .. } => Some(h),
            _ => None,
        }
    }
}

/// A send slot held.
pub struct Holding {
    lease: HeldLease,
    /// Loss notices naming another grant are not ours.
    grant: GrantId,
    /// Which slot of the send pool.
    slot: u8,
    /// The slot's durable permit.
    gate: Gate,
    /// `None`: open a fresh connection for the next POST (after a broken one).
    conn: Option<Box<dyn IcomSender>>,
    /// Last POST (or 429): the idle release counts from here.
    last_work: Instant,
    /// The heartbeat reported it lost while a turn was running.
    lost: bool,
    /// The next batch, prepared during the last POST: the next turn posts it.
    prepared: Option<Prepared>,
}

/// Why nothing may be sent for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// A 429, an empty bucket or a backoff: until then.
    Until(Instant),
    /// An open breaker: until then, or until SendChannel sees it closed.
    BreakerOpen { until: Instant },
}

impl Pause {
    fn until(self) -> Instant {
        match self {
            Pause::Until(t) | Pause::BreakerOpen { until: t } => t,
        }
    }
}

/// A drain asked for, and what the sender will answer.
struct Drain {
    reply: Option<RpcReplyPort<SenderDrain>>,
    report: SenderDrain,
}

pub struct SenderState {
    phase: Phase,
    timers: Timers,
    /// The last turn's finish (record, breaker, publish): not aborted if the sender stops (an
    /// unrecorded claim is recovered, the outbox is swept).
    finishing: Option<JoinHandle<()>>,
    /// Records, counts and publishes behind the POSTs.
    line: FinishLine,
    /// Work-hint watcher: turns the dispatcher's signals into `Wake`s.
    watcher: Option<OwnedTask>,
    backoff: Backoff,
    pause: Option<Pause>,
    /// The last batch was over the body limit: the next turn takes one message.
    split: bool,
    /// A wake arrived that could not be served at once (mid-turn, releasing,
    /// refused a lease lately): served as soon as the sender may act on it.
    woken: bool,
    drain: Option<Drain>,
}

/// A sender's key under SendChannel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SenderId {
    pub channel: ChannelId,
    pub n: u8,
}

impl ChildKey for SenderId {
    fn id(&self) -> String {
        Sender::id(self.channel, self.n)
    }

    fn kind(&self) -> &'static str {
        "sender"
    }

    fn owns(&self, owner: &str) -> bool {
        owner == self.id()
    }
}

pub struct Sender {
    pub channel: ChannelId,
    pub n: u8,
    pub ctx: TreeContext,
    pub config: Arc<OutboundConfig>,
    pub ports: OutboundPorts,
}

impl Sender {
    /// Status id and ledger owner: `sender/cpm/1`.
    pub fn id(channel: ChannelId, n: u8) -> String {
        format!("sender/{channel}/{n}")
    }

    fn owner(&self) -> String {
        Self::id(self.channel, self.n)
    }

    /// Rows may be waiting on this channel: the last depth probe saw queued rows (or none was read yet).
    fn work_likely(&self) -> bool {
        self.ctx.signal.depth().is_none_or(|d| d.lines.iter().any(|l| l.channel == self.channel && l.queued > 0))
    }
}

impl Actor for Sender {
    type Msg = SenderMsg;
    type State = SenderState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<SenderMsg>, _: ()) -> Result<SenderState, ActorProcessingErr> {
        let parent = super::senders::SendChannel::id(self.channel);
        self.ctx.board.register(&self.owner(), Some(&parent), "sender");
        let t = &self.ctx.config.timing;
        Ok(SenderState {
            phase: Phase::Standby { not_before: None },
            timers: Timers::default(),
            finishing: None,
            line: FinishLine::new(self.ports.clone(), self.config.clone(), t.clone(), self.channel),
            watcher: None,
            backoff: Backoff::new(t.backoff_base, t.backoff_max),
            pause: None,
            split: false,
            woken: false,
            drain: None,
        })
    }

    async fn post_start(&self, me: ActorRef<SenderMsg>, state: &mut SenderState) -> Result<(), ActorProcessingErr> {
        let mut work = self.ctx.signal.watch_work(self.channel);
        let wake = me.clone();
        state.watcher = Some(OwnedTask::spawn(async move {
            while work.changed().await.is_ok() {
                if wake.send_message(SenderMsg::Wake).is_err() {
                    return;
                }
            }
        }));
        self.enter(state, Phase::Standby { not_before: None });
        if self.ctx.signal.depth().is_some() && self.work_likely() {
            let _ = me.send_message(SenderMsg::Wake);
        }
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<SenderMsg>,
        msg: SenderMsg,
        state: &mut SenderState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SenderMsg::Wake => self.on_wake(&me, state),
            SenderMsg::Stamped(generation, step) if state.timers.is_current(generation) => {
                self.step(&me, state, step)?
            }
            SenderMsg::Stamped(..) => tracing::trace!(sender = %self.owner(), "stale timer or task result dropped"),
            SenderMsg::LeaseLost { grant, cause } => self.on_lease_lost(&me, state, grant, cause),
            SenderMsg::BreakerClosed => self.on_breaker_closed(&me, state),
            SenderMsg::Drain(reply) => self.on_drain(&me, state, reply),
            SenderMsg::Panicked(why) => return Err(why.into()),
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<SenderMsg>, state: &mut SenderState) -> Result<(), ActorProcessingErr> {
        state.phase = Phase::Drained;
        state.watcher = None;
        if let Some(lease) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release(vec![lease]).await;
        }
        self.ctx.board.remove_detail(&self.owner(), "slot");
        if state.drain.is_none() {
            self.ctx.board.set_state(&self.owner(), "stopped");
        }
        Ok(())
    }
}

impl Sender {
    fn step(&self, me: &ActorRef<SenderMsg>, state: &mut SenderState, step: Step) -> Result<(), ActorProcessingErr> {
        match step {
            Step::TryAcquire => {
                if std::mem::take(&mut state.woken) || self.work_likely() {
                    self.acquire(me, state)
                }
            }
            Step::Acquired(result) => self.on_acquired(me, state, result)?,
            Step::Turn => self.turn(me, state),
            Step::TurnDone(report) => self.on_turn(me, state, *report)?,
            Step::Released => self.on_released(me, state),
        }
        Ok(())
    }
}
