//! One pod's supervision tree and the handle the `cabine` wiring drives:
//! start it, read its status without touching a mailbox, restart one actor by
//! id, drain it on SIGTERM, and wait for its end (normal or escalated).
//!
//! ```text
//! Root ── LeaseHeartbeat
//!      ├─ Leader ── Sweeper, OutboundJanitor (while leading)
//!      ├─ Channel(cpm) ── Slot(cpm,1) … Slot(cpm,N)
//!      ├─ Channel(csm) ── Slot(csm,1) … Slot(csm,N)
//!      ├─ OutboundDispatcher, Confirmer          (when outbound is configured)
//!      ├─ SendChannel(cpm) ── Sender(cpm,1) … Sender(cpm,K)
//!      ├─ Watchdog                               (cluster view, alerts, orphan sightings)
//!      └─ DictSync                               (when the DICT side is on: the DICT's buckets)
//! ```

pub mod channel;
pub mod context;
pub mod dict_sync;
mod drain;
pub mod exits;
pub mod heartbeat;
pub mod leader;
pub mod reconciler;
mod root;
pub mod sweeper;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::Serialize;
use tokio::sync::watch;

use crate::board::StatusBoard;
use crate::config::{Ports, TreeConfig, TreeConfigError};
use crate::status::ActorStatus;
use context::TreeContext;
use root::{Root, RootMsg};

/// How the tree ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeExit {
    /// Drained and stopped on request.
    Normal,
    /// Restart intensity exceeded at Root: the process should exit non-zero.
    Escalated(String),
    /// Stopped abruptly by [`Tree::kill`] (nothing drained, nothing released).
    Killed,
}

impl TreeExit {
    pub fn is_failure(&self) -> bool {
        !matches!(self, TreeExit::Normal)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error(transparent)]
    Config(#[from] TreeConfigError),
    #[error("the tree did not start: {0}")]
    Spawn(String),
}

/// Why `restart(id)` refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RestartError {
    #[error("no actor with id {0:?}")]
    UnknownActor(String),
    #[error("{0:?} cannot be restarted alone (restart the pod)")]
    NotRestartable(String),
    #[error("{0:?} is not running right now")]
    NotRunning(String),
    #[error("the tree is draining or stopped")]
    TreeStopped,
}

/// What the drain did, slot by slot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DrainReport {
    /// Leases released, streams left open for the next holder.
    pub handed_over: usize,
    /// Streams closed (no other live pod runs the slot).
    pub closed: usize,
    /// Slots that held nothing.
    pub idle: usize,
    /// Slots that did not answer within `drain_time`.
    pub unanswered: usize,
    /// Leases released by force at the deadline.
    pub forced: usize,
    /// Senders that released their send lease (after finishing the send in flight).
    pub senders_released: usize,
    /// Sends in flight that were finished and recorded before the release.
    pub sends_finished: usize,
    /// Senders that did not answer within `drain_time`.
    pub senders_unanswered: usize,
    /// The dispatcher stopped pulling (a round storing requests finished first).
    pub dispatcher_stopped: bool,
    pub took_ms: u64,
}

/// A running tree. Cheap status reads; control goes through Root's mailbox.
pub struct Tree {
    root: ActorRef<RootMsg>,
    ctx: TreeContext,
    exit: watch::Receiver<Option<TreeExit>>,
    killed: Arc<AtomicBool>,
}

impl Tree {
    pub async fn start(config: TreeConfig, ports: Ports) -> Result<Tree, TreeError> {
        config.validate()?;
        if config.outbound.is_some() && ports.outbound.is_none() {
            return Err(TreeConfigError { key: "outbound", rule: "the outbound actors need the outbound ports" }.into());
        }
        let ctx = TreeContext::new(config, ports);
        let (root, join) =
            Actor::spawn(None, Root { ctx: ctx.clone() }, ()).await.map_err(|e| TreeError::Spawn(e.to_string()))?;
        let (tx, exit) = watch::channel(None);
        let killed = Arc::new(AtomicBool::new(false));
        let (end_ctx, end_killed) = (ctx.clone(), killed.clone());
        tokio::spawn(async move {
            let _ = join.await;
            let exit = if end_killed.load(Ordering::SeqCst) {
                TreeExit::Killed
            } else {
                release_everything(&end_ctx).await;
                let recorded = end_ctx.exit.lock().unwrap_or_else(|p| p.into_inner()).clone();
                recorded.unwrap_or_else(|| TreeExit::Escalated("root stopped unexpectedly".into()))
            };
            let _ = tx.send(Some(exit));
        });
        Ok(Tree { root, ctx, exit, killed })
    }

    /// The whole tree as `/actors` shows it (no mailbox involved).
    pub fn status(&self) -> ActorStatus {
        self.ctx.board.snapshot()
    }

    /// The board itself, for an HTTP closure that outlives this handle.
    pub fn status_board(&self) -> StatusBoard {
        self.ctx.board.clone()
    }

    /// The outbound actors' in-memory hints, for the relay of other pods' work hints.
    pub fn outbound_signal(&self) -> crate::outbound::OutboundSignal {
        self.ctx.signal.clone()
    }

    /// The watchdog's active alerts (no mailbox involved).
    pub fn alerts(&self) -> Vec<crate::watchdog::Alert> {
        self.ctx.alerts.get()
    }

    /// A window reconciled outside the Reconciler (an operator's): its CRITICAL
    /// discrepancies raise the `reconcile` alert, a clean window clears it.
    pub fn reconciled(&self, window: &crate::ports::reconcile::WindowReport) {
        self.ctx.alerts.set_reconcile(reconciler::alert_of(window));
    }

    /// Stops and restarts exactly the actor `id` (`slot/cpm/3`, `channel/cpm`,
    /// `leader`, `sweeper`, `lease-heartbeat`, `outbound-dispatcher`, `confirmer`,
    /// `senders/cpm`, `sender/cpm/1`, `outbound-janitor`, `watchdog`); its leases are released, siblings run on.
    pub async fn restart(&self, id: &str) -> Result<(), RestartError> {
        let id = id.to_owned();
        match self.root.call(|reply| RootMsg::Restart { id, reply }, Some(self.control_budget())).await {
            Ok(CallResult::Success(answer)) => answer,
            _ => Err(RestartError::TreeStopped),
        }
    }

    /// SIGTERM: hands every slot over (or closes its stream when alone) within
    /// `drain_time`, then the tree stops with [`TreeExit::Normal`].
    pub async fn drain(&self) -> DrainReport {
        let budget = self.ctx.config.timing.drain_time + self.control_budget();
        match self.root.call(RootMsg::Drain, Some(budget)).await {
            Ok(CallResult::Success(report)) => report,
            _ => DrainReport::default(),
        }
    }

    /// Waits for the tree's end.
    pub async fn wait(&self) -> TreeExit {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(done) => done.clone().unwrap_or(TreeExit::Killed),
            Err(_) => TreeExit::Killed,
        }
    }

    /// Drain, then wait for the end, all within `stop_timeout`; past it, kill.
    pub async fn shutdown(&self) -> TreeExit {
        let graceful = async {
            self.drain().await;
            self.wait().await
        };
        match tokio::time::timeout(self.ctx.config.timing.stop_timeout, graceful).await {
            Ok(exit) => exit,
            Err(_) => {
                tracing::warn!("stop timeout elapsed: killing the tree");
                self.kill();
                self.wait().await
            }
        }
    }

    /// Abrupt stop, as a crash looks to the cluster: tasks aborted, connections
    /// dropped, leases NOT released (they expire), heartbeat key left to expire.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        self.root.kill();
    }

    fn control_budget(&self) -> Duration {
        self.ctx.config.timing.heartbeat.max(Duration::from_secs(1))
    }
}

/// Final cleanup after Root ended (drained or failed): every lease left, and the pod's key.
async fn release_everything(ctx: &TreeContext) {
    let leftovers = ctx.ledger.take_owned(|_| true);
    ctx.release(leftovers).await;
    let budget = ctx.config.timing.heartbeat;
    let _ = tokio::time::timeout(budget, ctx.ports.pods.leave(&ctx.config.pod_id)).await;
}
