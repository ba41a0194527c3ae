//! The acquire task of a standby slot: the lease for this very slot
//! ([`crate::lease::acquire`], recorded in the ledger at once so that a failure
//! of the slot still gets it released), then the fenced claim of the slot's
//! cursor row — the next fence, the stored pull-next, and the previous
//! holder's busy window, which arms the first request (DESIGN §2.5).

use tokio::time::Instant;

use crate::domain::SlotId;
use crate::gate::Gate;
use crate::lease::{self, Acquisition, Held};
use crate::ledger::LostNotice;
use crate::ports::{Claim, InboxError, Pool};
use crate::tree::context::TreeContext;

/// A slot granted and claimed.
pub struct Granted {
    pub held: Held,
    pub claim: Claim,
    pub gate: Gate,
}

pub async fn run(ctx: TreeContext, slot: SlotId, owner: String, notice: LostNotice) -> Acquisition<Box<Granted>> {
    let held = match lease::acquire(&ctx, &owner, Pool::Stream(slot.channel), Some(slot.n), notice).await.granted() {
        Ok(held) => held,
        Err(refused) => return refused,
    };
    let t = &ctx.config.timing;
    if held.lease.current().is_none_or(|lease| !lease.is_valid()) {
        // Paused between the grant and the claim: a claim now would take the fence
        // from whoever holds the slot since. Give the lease back, try again later.
        lease::release_leftover(&ctx, &owner);
        return Acquisition::Retry("the lease lapsed before the claim".into());
    }
    let sent = Instant::now();
    match ctx.ports.inbox.claim(slot, &held.grant.0, t.long_poll_timeout + t.gate_margin).await {
        Ok(claim) => {
            let gate = Gate::claimed(claim.fence, sent, Instant::now(), claim.wait, t.long_poll_timeout, t.gate_margin);
            Acquisition::Granted(Box::new(Granted { held, claim, gate }))
        }
        Err(e) => {
            if let Some(lease) = ctx.ledger.remove(&owner) {
                ctx.release(vec![lease]).await;
            }
            match e {
                InboxError::Fatal(m) => Acquisition::Fatal(format!("inbox fatal on claim: {m}")),
                other => Acquisition::Retry(format!("claim failed: {other}")),
            }
        }
    }
}
