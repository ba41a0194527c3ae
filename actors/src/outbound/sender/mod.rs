//! Sender(channel, k): one send slot of a channel on this pod. Standby until
//! rows may be ready (the dispatcher's hints), then acquires ANY free slot of
//! the cluster-wide `Pool::Send(channel)`, opens a fresh connection, and plays
//! turns (one batch each, in a spawned task) while there is work; after
//! `idle_release` without work, or a pause longer than that (breaker open,
//! 429, empty bucket), it releases the lease; a pause for an open breaker ends
//! as soon as SendChannel sees it closed. Nothing is sent outside a valid
//! lease: each turn checks the lease has room for a whole send first. A lease
//! lost during a send lets that send finish and be recorded, then the sender
//! drops the connection and goes standby.
//!
//! Standby → Acquiring → Idle ⇄ Sending → (Releasing) → Standby; Drained.

mod lifecycle;
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
use crate::ledger::HeldLease;
use crate::ports::breaker::BreakerState;
use crate::ports::{GrantId, IcomSender, LostCause};
use crate::slot::schedule::WallClock;
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

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
    /// Take one message only (the last batch was over the body limit).
    pub single: bool,
    /// The previous turn's result events, maybe still being published.
    pub publishing: Option<JoinHandle<()>>,
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
    pub took: Duration,
    pub breaker: Option<BreakerState>,
    /// Result events still being published: the next turn waits for them before publishing its own.
    pub publishing: Option<JoinHandle<()>>,
}

/// What a sender did when the pod drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderDrain {
    /// It held a send lease and released it.
    pub released: bool,
    /// A send was in flight and was finished and recorded first.
    pub finished_send: bool,
}

pub enum Acquire {
    Granted { lease: HeldLease, grant: GrantId, slot: u8 },
    Full,
    Quarantined(Duration),
    Failed(String),
    Fatal(String),
}

pub enum SenderMsg {
    /// Rows may be ready on the channel (dispatcher hint).
    Wake,
    TryAcquire {
        generation: u64,
    },
    Acquired {
        generation: u64,
        result: Acquire,
    },
    Turn {
        generation: u64,
    },
    TurnDone {
        generation: u64,
        report: Box<TurnReport>,
    },
    Released {
        generation: u64,
    },
    LeaseLost {
        grant: GrantId,
        cause: LostCause,
    },
    /// SendChannel saw the shared breaker closed (an operator reset, another
    /// pod's successful probe): a pause for an open breaker ends now.
    BreakerClosed,
    Drain(RpcReplyPort<SenderDrain>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Standby,
    Acquiring,
    Idle,
    Sending,
    Releasing,
    Drained,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Standby => "standby",
            Phase::Acquiring => "acquiring",
            Phase::Idle => "idle",
            Phase::Sending => "sending",
            Phase::Releasing => "releasing",
            Phase::Drained => "drained",
        }
    }
}

pub struct Holding {
    lease: HeldLease,
    grant: GrantId,
    conn: Option<Box<dyn IcomSender>>,
    last_work: Instant,
    /// The heartbeat reported it lost while a turn was running.
    lost: bool,
}

pub struct SenderState {
    phase: Phase,
    generation: u64,
    holding: Option<Holding>,
    task: Option<OwnedTask>,
    watcher: Option<OwnedTask>,
    /// The last turn's result events being published (not aborted if the sender stops: the outbox is swept anyway).
    publishing: Option<JoinHandle<()>>,
    backoff: Backoff,
    /// Do not acquire or send before this (breaker open, 429, empty bucket).
    paused_until: Option<Instant>,
    /// The pause is an open breaker's: it ends when the breaker is seen closed.
    paused_for_breaker: bool,
    single: bool,
    /// A wake arrived that could not be served at once (mid-turn, releasing,
    /// refused a lease lately): served as soon as the sender may act on it.
    woken: bool,
    /// Refused a lease (or lost one): no acquire before this, however often woken.
    acquire_not_before: Option<Instant>,
    draining: bool,
    drain: SenderDrain,
    drain_reply: Option<RpcReplyPort<SenderDrain>>,
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
            phase: Phase::Standby,
            generation: 0,
            holding: None,
            task: None,
            watcher: None,
            publishing: None,
            backoff: Backoff::new(t.backoff_base, t.backoff_max),
            paused_until: None,
            paused_for_breaker: false,
            single: false,
            woken: false,
            acquire_not_before: None,
            draining: false,
            drain: SenderDrain::default(),
            drain_reply: None,
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
        self.enter(state, Phase::Standby);
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
        let current = state.generation;
        match msg {
            SenderMsg::Wake => self.on_wake(&me, state),
            SenderMsg::TryAcquire { generation } if generation == current => {
                if std::mem::take(&mut state.woken) || self.work_likely() {
                    self.acquire(&me, state)
                }
            }
            SenderMsg::Acquired { generation, result } if generation == current => {
                self.on_acquired(&me, state, result)?
            }
            SenderMsg::Turn { generation } if generation == current => self.turn(&me, state),
            SenderMsg::TurnDone { generation, report } if generation == current => self.on_turn(&me, state, *report)?,
            SenderMsg::Released { generation } if generation == current => self.on_released(&me, state),
            SenderMsg::LeaseLost { grant, cause } => self.on_lease_lost(&me, state, grant, cause),
            SenderMsg::BreakerClosed => self.on_breaker_closed(&me, state),
            SenderMsg::Drain(reply) => self.on_drain(&me, state, reply),
            _ => tracing::trace!(sender = %self.owner(), "stale timer or task result dropped"),
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<SenderMsg>, state: &mut SenderState) -> Result<(), ActorProcessingErr> {
        state.task = None;
        state.watcher = None;
        state.holding = None;
        if let Some(lease) = self.ctx.ledger.remove(&self.owner()) {
            self.ctx.release(vec![lease]).await;
        }
        self.ctx.board.remove_detail(&self.owner(), "slot");
        if !state.draining {
            self.ctx.board.set_state(&self.owner(), "stopped");
        }
        Ok(())
    }
}
