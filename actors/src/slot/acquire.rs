//! The acquire task of a standby slot: lease from the store for this very
//! slot, recorded in the ledger at once (so a failure of the slot still gets it
//! released), then the fenced claim of the slot's cursor row.

use std::time::Duration;

use crate::domain::SlotId;
use crate::ledger::{HeldLease, LostNotice};
use crate::ports::{Acquired, Claim, GrantId, InboxError, Lease, LeaseError, Pool};
use crate::tree::context::TreeContext;

pub struct Granted {
    pub lease: HeldLease,
    pub grant: GrantId,
    pub claim: Claim,
}

pub enum AcquireResult {
    Granted(Box<Granted>),
    /// Someone else holds the slot.
    Full,
    /// The lease store forgot everything: nothing is granted for `remaining`.
    Quarantined(Duration),
    /// Transient: back off and retry.
    Failed(String),
    /// A bug or a broken store: the slot fails and its supervisor decides.
    Fatal(String),
}

pub async fn run(ctx: TreeContext, slot: SlotId, owner: String, notice: LostNotice) -> AcquireResult {
    match ctx.ports.leases.acquire(Pool::Stream(slot.channel), Some(slot.n)).await {
        Ok(Acquired::Granted(lease)) => claim(ctx, slot, owner, lease, notice).await,
        Ok(Acquired::Full) => AcquireResult::Full,
        Ok(Acquired::Quarantined { remaining }) => AcquireResult::Quarantined(remaining),
        Err(LeaseError::Unavailable(e)) => AcquireResult::Failed(format!("lease store unavailable: {e}")),
        Err(LeaseError::Lost(cause)) => AcquireResult::Failed(format!("lease lost while acquiring: {cause}")),
        Err(LeaseError::Fatal(e)) => AcquireResult::Fatal(format!("lease store fatal: {e}")),
    }
}

async fn claim(ctx: TreeContext, slot: SlotId, owner: String, lease: Lease, notice: LostNotice) -> AcquireResult {
    let grant = lease.grant.clone();
    let held = ctx.ledger.hold(&owner, lease, notice);
    match ctx.ports.inbox.claim(slot, &grant.0).await {
        Ok(claim) => AcquireResult::Granted(Box::new(Granted { lease: held, grant, claim })),
        Err(e) => {
            if let Some(lease) = ctx.ledger.remove(&owner) {
                ctx.release(vec![lease]).await;
            }
            match e {
                InboxError::Fatal(m) => AcquireResult::Fatal(format!("inbox fatal on claim: {m}")),
                other => AcquireResult::Failed(format!("claim failed: {other}")),
            }
        }
    }
}
