//! A state change of outbound rows as ONE statement: lock the rows a `pick`
//! query selects (`id`, `from_status`, `note`), apply `set`, and write one
//! history line per row — a result event when the change is one the bank's
//! core hears about. Returns the history lines with what an event carries.

use std::time::SystemTime;

use cabine_actors::ports::outbound_bus::{ResultEvent, ResultStatus};
use tokio_postgres::Row;

/// Which history lines are result events: entering `sending` or going back to
/// `queued` after a try is internal; `queued` after a reprocess is `accepted`.
const EVENT_OF: &str = "CASE \
    WHEN status = from_status OR status = 'sending' THEN NULL \
    WHEN status = 'queued' THEN CASE WHEN from_status IN ('dead', 'rejected') THEN 'accepted' END \
    ELSE status END";

/// The columns every transition (and the insert) returns, in [`Change::from_row`]'s order.
pub(super) const CHANGE_COLUMNS: &str =
    "h.id, h.event, h.at, c.msg_id, c.ingress_ref, c.channel, c.status, c.attempts, c.resource_ids, h.detail";

/// `pick` must lock its rows (`FOR UPDATE [SKIP LOCKED]`) and select `id, from_status, note`.
pub(super) fn transition_sql(pick: &str, set: &str) -> String {
    format!(
        "WITH prev AS ({pick}),
        changed AS (
            UPDATE outbound o SET {set}, updated_at = now() FROM prev WHERE o.id = prev.id
            RETURNING o.id, o.msg_id, o.ingress_ref, o.channel, o.status, o.attempts, o.resource_ids,
                      o.last_error, prev.from_status, prev.note
        ),
        hist AS (
            INSERT INTO outbound_history (outbound_id, from_status, to_status, attempt, event, detail)
            SELECT id, from_status, status, attempts, {EVENT_OF}, COALESCE(note, last_error) FROM changed
            RETURNING id, outbound_id, event, at, detail
        )
        SELECT {CHANGE_COLUMNS} FROM hist h JOIN changed c ON c.id = h.outbound_id ORDER BY h.id"
    )
}

/// One changed row, as the statement returned it.
#[derive(Debug)]
pub(super) struct Change {
    pub msg_id: Option<String>,
    pub event: Option<ResultEvent>,
}

impl Change {
    pub(super) fn from_row(r: &Row) -> Result<Change, String> {
        let msg_id: Option<String> = r.try_get(3).map_err(|e| e.to_string())?;
        let event = match r.try_get::<_, Option<String>>(1).map_err(|e| e.to_string())? {
            None => None,
            Some(ev) => Some(ResultEvent {
                id: r.try_get(0).map_err(|e| e.to_string())?,
                msg_id: msg_id.clone(),
                ingress_ref: r.try_get(4).map_err(|e| e.to_string())?,
                channel: r.try_get::<_, Option<String>>(5).map_err(|e| e.to_string())?.and_then(|c| c.parse().ok()),
                status: ev.parse::<ResultStatus>()?,
                attempt: u32::try_from(r.try_get::<_, i32>(7).map_err(|e| e.to_string())?).unwrap_or(0),
                at: r.try_get::<_, SystemTime>(2).map_err(|e| e.to_string())?,
                resource_ids: r.try_get(8).map_err(|e| e.to_string())?,
                detail: r.try_get(9).map_err(|e| e.to_string())?,
            }),
        };
        Ok(Change { msg_id, event })
    }
}
