//! The sender's acquire task: a lease on any free slot of the channel's send
//! pool ([`crate::lease::acquire`]), then the claim of that slot's gate row —
//! the next fence and the previous holder's busy window, which arms the first
//! POST (DESIGN §2.5). A claim that fails gives the lease back.

use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::gate::Gate;
use crate::lease::{self, Acquisition, Held};
use crate::ledger::LostNotice;
use crate::outbound::OutboundPorts;
use crate::ports::{GateError, Pool};
use crate::tree::context::TreeContext;

/// A send slot granted and its gate row claimed.
pub struct SendGrant {
    pub held: Held,
    pub gate: Gate,
}

pub async fn run(
    ctx: TreeContext,
    ports: OutboundPorts,
    owner: String,
    channel: ChannelId,
    timeout: Duration,
    notice: LostNotice,
) -> Acquisition<Box<SendGrant>> {
    let held = match lease::acquire(&ctx, &owner, Pool::Send(channel), None, notice).await.granted() {
        Ok(held) => held,
        Err(refused) => return refused,
    };
    if held.lease.current().is_none_or(|lease| !lease.is_valid()) {
        // Paused between the grant and the claim: a claim now could take the fence from a live holder.
        lease::release_leftover(&ctx, &owner);
        return Acquisition::Retry("the send lease lapsed before the claim".into());
    }
    let margin = ctx.config.timing.gate_margin;
    let sent = Instant::now();
    match ports.gates.claim(channel, held.slot, &held.grant.0, timeout + margin).await {
        Ok(claim) => {
            let gate = Gate::claimed(claim.fence, sent, Instant::now(), claim.wait, timeout, margin);
            Acquisition::Granted(Box::new(SendGrant { held, gate }))
        }
        Err(e) => {
            if let Some(lease) = ctx.ledger.remove(&owner) {
                ctx.release(vec![lease]).await;
            }
            match e {
                GateError::Fatal(m) => Acquisition::Fatal(format!("send gate fatal on claim: {m}")),
                other => Acquisition::Retry(format!("send gate claim failed: {other}")),
            }
        }
    }
}
