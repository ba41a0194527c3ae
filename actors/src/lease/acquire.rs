//! Acquiring a lease: ask the store for a slot of a pool (a given one, or the
//! first free), record a grant in the pod's ledger at once — from then on the
//! heartbeat renews it and a supervisor releases it if the owner fails — and
//! say what the owner does next. A grant that replaces one still recorded
//! under the same owner gives the old one back.

use std::time::Duration;

use ractor::{ActorRef, Message};

use crate::ledger::{HeldLease, LostNotice};
use crate::ports::incident::{Incident, IncidentKind};
use crate::ports::{Acquired, GrantId, LeaseError, LostCause, Pool};
use crate::tree::context::TreeContext;

/// A granted lease, recorded in the ledger.
pub struct Held {
    /// The owner's live view of it (renewals, loss).
    pub lease: HeldLease,
    /// The grant the heartbeat's loss notices name.
    pub grant: GrantId,
    /// Which slot of the pool was granted (1-based).
    pub slot: u8,
}

/// What an acquire came to, i.e. what the owner does next. `G` is what the
/// owner holds once granted: the lease alone, or with the claim it adds on top.
pub enum Acquisition<G = Held> {
    Granted(G),
    /// Every slot asked for is held by someone: try again later.
    Full,
    /// The lease store forgot (or may have forgotten) keys: nothing is granted for this long.
    Quarantined(Duration),
    /// Transient (store unreachable or slow): back off and retry. Fail closed.
    Retry(String),
    /// A bug or a broken store: the owner fails and its supervisor decides.
    Fatal(String),
}

impl<G> Acquisition<G> {
    /// The grant, or the refusal re-typed for an owner that adds its own claim on top.
    pub fn granted<H>(self) -> Result<G, Acquisition<H>> {
        match self {
            Acquisition::Granted(g) => Ok(g),
            Acquisition::Full => Err(Acquisition::Full),
            Acquisition::Quarantined(left) => Err(Acquisition::Quarantined(left)),
            Acquisition::Retry(why) => Err(Acquisition::Retry(why)),
            Acquisition::Fatal(why) => Err(Acquisition::Fatal(why)),
        }
    }
}

/// Asks for `slot` of `pool` (any free one when `None`) for `owner`; `on_lost`
/// is called when the heartbeat finds the lease lost.
pub async fn acquire(ctx: &TreeContext, owner: &str, pool: Pool, slot: Option<u8>, on_lost: LostNotice) -> Acquisition {
    match ctx.ports.leases.acquire(pool, slot).await {
        Ok(Acquired::Granted(lease)) => {
            let (grant, slot) = (lease.grant.clone(), lease.slot);
            let (lease, replaced) = ctx.ledger.hold(owner, lease, on_lost);
            if let Some(old) = replaced {
                tracing::warn!(%owner, grant = %old.grant, "a new grant replaced one still recorded: releasing the old one");
                ctx.release(vec![old]).await;
            }
            Acquisition::Granted(Held { lease, grant, slot })
        }
        Ok(Acquired::Full) => Acquisition::Full,
        Ok(Acquired::Quarantined { remaining }) => {
            // Every acquire of every slot meets it: the log folds the repeats.
            ctx.ports.incidents.record(Incident {
                kind: IncidentKind::Quarantine,
                channel: None,
                slot: None,
                detail: format!("lease store in quarantine, {remaining:?} left"),
            });
            Acquisition::Quarantined(remaining)
        }
        Err(LeaseError::Unavailable(e)) => Acquisition::Retry(format!("lease store unavailable: {e}")),
        Err(LeaseError::Lost(cause)) => Acquisition::Retry(format!("lease lost while acquiring: {cause}")),
        Err(LeaseError::Fatal(e)) => Acquisition::Fatal(format!("lease store fatal: {e}")),
    }
}

/// An owner about to acquire holds nothing: an entry under its name was left by
/// a killed incarnation (its acquire task raced the cleanup). Give it back.
pub fn release_leftover(ctx: &TreeContext, owner: &str) {
    if let Some(leftover) = ctx.ledger.remove(owner) {
        ctx.release_in_background(vec![leftover]);
    }
}

/// A loss notice that sends `make(grant, cause)` to `me`.
pub fn lost_notice<M: Message>(me: &ActorRef<M>, make: fn(GrantId, LostCause) -> M) -> LostNotice {
    let me = me.clone();
    Box::new(move |grant, cause| {
        let _ = me.send_message(make(grant.clone(), cause));
    })
}
