//! What every actor of one pod's tree shares: read-only config, the ports,
//! the lease ledger, the status board, the live-pod view, the exit cell, and
//! the failover cooldowns, free-slot sightings and alerts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::board::StatusBoard;
use crate::config::{Ports, TreeConfig};
use crate::failover::FailoverBook;
use crate::fair::ClusterView;
use crate::ledger::LeaseLedger;
use crate::orphans::FreeSlots;
use crate::outbound::{OutboundConfig, OutboundPorts, OutboundSignal};
use crate::ports::Lease;
use crate::slot::schedule::WallClock;
use crate::tree::TreeExit;
use crate::watchdog::AlertBoard;

#[derive(Clone)]
pub struct TreeContext {
    pub config: Arc<TreeConfig>,
    pub ports: Ports,
    pub ledger: Arc<LeaseLedger>,
    pub board: StatusBoard,
    pub view: ClusterView,
    pub clock: WallClock,
    /// In-memory hints between the outbound actors (and from the slots to the confirmer).
    pub signal: OutboundSignal,
    /// Written by Root when it ends (normal after a drain, escalated on failure).
    pub exit: Arc<Mutex<Option<TreeExit>>>,
    /// The pod's failover cooldowns (slots, heartbeat).
    pub failover: Arc<FailoverBook>,
    /// Free slots as the watchdog last saw them (orphan pickup).
    pub sightings: FreeSlots,
    /// The watchdog's active alerts (`/cluster`).
    pub alerts: AlertBoard,
}

impl TreeContext {
    pub fn new(config: TreeConfig, ports: Ports) -> Self {
        let ledger = Arc::new(LeaseLedger::default());
        TreeContext {
            config: Arc::new(config),
            ports,
            board: StatusBoard::new(ledger.clone()),
            ledger,
            view: ClusterView::default(),
            clock: WallClock::start(),
            signal: OutboundSignal::default(),
            exit: Arc::default(),
            failover: Arc::default(),
            sightings: FreeSlots::default(),
            alerts: AlertBoard::default(),
        }
    }

    /// The outbound configuration and ports, when the outbound actors run.
    pub fn outbound(&self) -> Option<(Arc<OutboundConfig>, OutboundPorts)> {
        let config = self.config.outbound.as_ref()?;
        Some((Arc::new(config.clone()), self.ports.outbound.clone()?))
    }

    /// Bound on one lease-store call made while stopping.
    fn release_budget(&self) -> Duration {
        self.config.timing.heartbeat
    }

    /// Releases leases taken from the ledger, awaiting the store (bounded).
    pub async fn release(&self, leases: Vec<Lease>) {
        for lease in leases {
            let outcome = tokio::time::timeout(self.release_budget(), self.ports.leases.release(&lease)).await;
            match outcome {
                Ok(Ok(())) => tracing::debug!(pool = %lease.pool, slot = lease.slot, "lease released"),
                Ok(Err(e)) => {
                    tracing::warn!(pool = %lease.pool, slot = lease.slot, error = %e, "lease release failed; it expires")
                }
                Err(_) => tracing::warn!(pool = %lease.pool, slot = lease.slot, "lease release timed out; it expires"),
            }
        }
    }

    /// The same, without waiting: for supervisors cleaning up after a failed child.
    pub fn release_in_background(&self, leases: Vec<Lease>) {
        if leases.is_empty() {
            return;
        }
        let ctx = self.clone();
        tokio::spawn(async move { ctx.release(leases).await });
    }

    pub fn set_exit(&self, exit: TreeExit) {
        let mut cell = self.exit.lock().unwrap_or_else(|p| p.into_inner());
        cell.get_or_insert(exit);
    }
}
