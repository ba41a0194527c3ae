//! The Reconciler's hook on `in_doubt` rows: once it has asked the SPI, a
//! message it holds takes its verdict (`confirmed` / `rejected_by_spi`) and
//! one it never stored becomes `timeout` — the core may then pay again under a
//! new MsgId. Only an `in_doubt` row changes; each change is one statement
//! with its history line and result event.

use cabine_actors::ports::outbound::{OutboundError, Settled, Settlement, SpiVerdict};

use super::PgOutboundStore;
use crate::outbound::transition::transition_sql;

impl PgOutboundStore {
    pub(super) async fn settle(&self, msg_id: &str, settlement: &Settlement) -> Result<Settled, OutboundError> {
        let (status, note) = match settlement {
            Settlement::Stored(SpiVerdict::Confirmed) => ("confirmed", "reconciled: the SPI holds it, accepted".into()),
            Settlement::Stored(SpiVerdict::Rejected { reason }) => ("rejected_by_spi", format!("reconciled: {reason}")),
            Settlement::NotStored { evidence } => {
                ("timeout", format!("reconciled: never stored at the SPI ({evidence})"))
            }
        };
        let sql = transition_sql(
            "SELECT id, status AS from_status, $3::text AS note FROM outbound
             WHERE msg_id = $1 AND ispb = $2 AND status = 'in_doubt' FOR UPDATE",
            "status = $4::text, last_error = prev.note,
             confirmed_at = CASE WHEN $4::text = 'timeout' THEN NULL ELSE now() END,
             sent_at = CASE WHEN $4::text = 'timeout' THEN sent_at ELSE COALESCE(sent_at, maybe_stored_at) END",
        );
        let changes = self.changes(&sql, &[&msg_id, &self.ispb, &note, &status]).await?;
        if let Some(event) = changes.into_iter().find_map(|c| c.event) {
            metrics::counter!("cabine_outbound_in_doubt_settled_total", "status" => status).increment(1);
            return Ok(Settled::Done(event));
        }
        Ok(match self.row_where("msg_id", msg_id).await? {
            None => Settled::NotFound,
            Some(row) => Settled::NotInDoubt(row.status),
        })
    }
}
