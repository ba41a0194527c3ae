//! In-memory confirmations over the fake inbox and the fake outbound store:
//! committed inbox rows of type pacs.002 / admi.002 not correlated yet are
//! read oldest first, each one's verdict applied with `confirm`, then the row
//! is marked correlated. The fake reads a report the way the real parser
//! reduces it: the reference is the row's `OrgnlEndToEndId` (its meta's
//! end-to-end id), the verdict RJCT when the body carries `<TxSts>RJCT`.
//! Also the builders of outbound requests and status reports for tests.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;

use super::inbox::FakeInbox;
use super::outbound::FakeOutboundStore;
use crate::domain::ChannelId;
use crate::ports::outbound::{ConfirmOutcome, ConfirmRef, NewOutbound, OutboundStore, Priority, SpiVerdict};
use crate::ports::{ConfirmError, Confirmations, Correlated, InboundMessage, MessageMeta};

pub struct FakeConfirmations {
    inbox: Arc<FakeInbox>,
    store: Arc<FakeOutboundStore>,
    correlated: Mutex<HashSet<i64>>,
    down: AtomicBool,
}

impl FakeConfirmations {
    pub fn new(inbox: Arc<FakeInbox>, store: Arc<FakeOutboundStore>) -> Arc<Self> {
        Arc::new(FakeConfirmations { inbox, store, correlated: Mutex::default(), down: AtomicBool::new(false) })
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Inbox rows correlated so far.
    pub fn correlated(&self) -> usize {
        self.correlated.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[async_trait::async_trait]
impl Confirmations for FakeConfirmations {
    async fn correlate(&self, max: u32) -> Result<Correlated, ConfirmError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ConfirmError::Unavailable("fake inbox down".into()));
        }
        let rows: Vec<_> = {
            let done = self.correlated.lock().unwrap_or_else(|p| p.into_inner());
            self.inbox
                .rows()
                .into_iter()
                .filter(|r| r.message.malformed.is_none() && !done.contains(&r.id))
                .filter(|r| crate::outbound::is_status_report(r.message.meta.msg_type()))
                .take(max as usize)
                .collect()
        };
        let mut out = Correlated { rows: rows.len(), ..Correlated::default() };
        for row in &rows {
            let Some(e2e) = row.message.meta.end_to_end_id.clone() else {
                out.unreadable += 1;
                continue;
            };
            let verdict = if String::from_utf8_lossy(&row.message.raw).contains("<TxSts>RJCT") {
                SpiVerdict::Rejected { reason: "RJCT".into() }
            } else {
                SpiVerdict::Confirmed
            };
            match self.store.confirm(&ConfirmRef::EndToEndId(e2e), &verdict).await {
                Ok(ConfirmOutcome::Applied(events)) => out.applied.extend(events),
                Ok(ConfirmOutcome::AlreadyFinal(_)) => out.already_final += 1,
                Ok(ConfirmOutcome::Unknown) => out.unknown += 1,
                Err(e) => return Err(ConfirmError::Unavailable(e.to_string())),
            }
        }
        self.correlated.lock().unwrap_or_else(|p| p.into_inner()).extend(rows.iter().map(|r| r.id));
        Ok(out)
    }
}

/// A raw outbound message whose `GrpHdr/MsgId` is `msg_id`.
pub fn outbound_xml(msg_id: &str, msg_def: &str) -> Bytes {
    Bytes::from(format!(
        "<Envelope><AppHdr><MsgDefIdr>{msg_def}</MsgDefIdr></AppHdr><Document><GrpHdr><MsgId>{msg_id}</MsgId></GrpHdr></Document></Envelope>"
    ))
}

/// A valid outbound pacs.008 request; its EndToEndId is `E{msg_id}`.
pub fn outbound(msg_id: &str, channel: ChannelId, priority: Priority, deadline: SystemTime) -> NewOutbound {
    NewOutbound {
        msg_id: msg_id.to_owned(),
        msg_type: "pacs.008".into(),
        channel,
        priority,
        deadline,
        end_to_end_ids: vec![format!("E{msg_id}")],
        ingress_ref: None,
        raw: outbound_xml(msg_id, "pacs.008.spi.1.16"),
    }
}

/// An inbound pacs.002 from the SPI about the transaction `end_to_end_id` (ACSC, or RJCT).
pub fn status_report(resource_id: &str, end_to_end_id: &str, accepted: bool) -> InboundMessage {
    let status = if accepted { "ACSC" } else { "RJCT" };
    let raw = format!(
        "<Envelope><AppHdr><MsgDefIdr>pacs.002.spi.1.17</MsgDefIdr></AppHdr><Document><FIToFIPmtStsRpt>\
         <TxInfAndSts><OrgnlEndToEndId>{end_to_end_id}</OrgnlEndToEndId><TxSts>{status}</TxSts></TxInfAndSts>\
         </FIToFIPmtStsRpt></Document></Envelope>"
    );
    InboundMessage {
        resource_id: resource_id.to_owned(),
        raw: Bytes::from(raw),
        meta: MessageMeta {
            msg_def: Some("pacs.002.spi.1.17".into()),
            end_to_end_id: Some(end_to_end_id.to_owned()),
            ..MessageMeta::default()
        },
        malformed: None,
    }
}
