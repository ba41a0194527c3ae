//! The JSON shapes of the outbound endpoints: a stored message (times in
//! RFC 3339, UTC), its history, a page of one status.

use std::time::SystemTime;

use cabine_actors::domain::ChannelId;
use cabine_actors::ports::outbound::{HistoryEntry, OutboundDetail, OutboundRow, OutboundStatus, Page, Priority};
use cabine_actors::ports::outbound_bus::ResultStatus;
use serde::Serialize;

/// RFC 3339 in UTC, e.g. `2024-01-02T13:00:00.123456Z`.
pub fn rfc3339(at: SystemTime) -> String {
    time::OffsetDateTime::from(at).format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

#[derive(Debug, Serialize)]
pub struct RowView {
    pub id: i64,
    pub msg_id: Option<String>,
    pub msg_type: Option<String>,
    pub channel: Option<ChannelId>,
    pub priority: Priority,
    pub status: OutboundStatus,
    pub attempts: u32,
    pub deadline: String,
    pub not_before: String,
    pub resource_ids: Vec<String>,
    pub last_error: Option<String>,
    pub ingress_ref: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub sent_at: Option<String>,
    pub confirmed_at: Option<String>,
    pub unconfirmed_since: Option<String>,
}

impl From<OutboundRow> for RowView {
    fn from(r: OutboundRow) -> Self {
        RowView {
            id: r.id,
            msg_id: r.msg_id,
            msg_type: r.msg_type,
            channel: r.channel,
            priority: r.priority,
            status: r.status,
            attempts: r.attempts,
            deadline: rfc3339(r.deadline),
            not_before: rfc3339(r.not_before),
            resource_ids: r.resource_ids,
            last_error: r.last_error,
            ingress_ref: r.ingress_ref,
            created_at: rfc3339(r.created_at),
            updated_at: rfc3339(r.updated_at),
            sent_at: r.sent_at.map(rfc3339),
            confirmed_at: r.confirmed_at.map(rfc3339),
            unconfirmed_since: r.unconfirmed_since.map(rfc3339),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct HistoryView {
    pub at: String,
    pub from: Option<OutboundStatus>,
    pub to: OutboundStatus,
    pub attempt: u32,
    /// The result event this change published to the bank's core, if any.
    pub event: Option<ResultStatus>,
    pub detail: Option<String>,
}

impl From<HistoryEntry> for HistoryView {
    fn from(h: HistoryEntry) -> Self {
        HistoryView { at: rfc3339(h.at), from: h.from, to: h.to, attempt: h.attempt, event: h.event, detail: h.detail }
    }
}

/// `GET /v1/outbound/{msg_id}`: the row's fields, then its history, oldest first.
#[derive(Debug, Serialize)]
pub struct DetailView {
    #[serde(flatten)]
    pub row: RowView,
    pub history: Vec<HistoryView>,
}

impl From<OutboundDetail> for DetailView {
    fn from(d: OutboundDetail) -> Self {
        DetailView { row: d.row.into(), history: d.history.into_iter().map(HistoryView::from).collect() }
    }
}

/// `GET /v1/outbound?status=…`: rows oldest first; `next` is the `after` of the next page.
#[derive(Debug, Serialize)]
pub struct PageView {
    pub status: OutboundStatus,
    pub rows: Vec<RowView>,
    pub next: Option<i64>,
}

impl PageView {
    pub fn of(status: OutboundStatus, page: Page) -> Self {
        PageView { status, rows: page.rows.into_iter().map(RowView::from).collect(), next: page.next_after }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_are_rfc3339_utc_and_names_are_snake_case() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_704_200_000_250);
        assert_eq!(rfc3339(at), "2024-01-02T12:53:20.25Z");
        let h = HistoryView::from(HistoryEntry {
            at,
            from: Some(OutboundStatus::Dead),
            to: OutboundStatus::Queued,
            attempt: 3,
            event: Some(ResultStatus::Accepted),
            detail: Some("reprocessed by an operator".into()),
        });
        let v = serde_json::to_value(&h).unwrap();
        assert_eq!(v["from"], "dead");
        assert_eq!(v["event"], "accepted");
        assert_eq!(v["at"], "2024-01-02T12:53:20.25Z");
    }
}
