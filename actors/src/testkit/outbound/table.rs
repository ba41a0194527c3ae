//! The fake outbound table: rows, their history (the outbox) and the one
//! transition helper every change goes through, with the event rule of the
//! Postgres store (entering `sending` or going back to `queued` after a try is
//! internal; `queued` after a reprocess is `accepted`; `in_doubt` is an event).

use std::collections::HashMap;
use std::time::SystemTime;

use bytes::Bytes;

use crate::domain::ChannelId;
use crate::ports::outbound::{OutboundRow, OutboundStatus, Priority, ReadyMessage};
use crate::ports::outbound_bus::{ResultEvent, ResultStatus};

/// One stored message, as the test sees it.
#[derive(Clone, Debug)]
pub struct StoredRow {
    pub id: i64,
    pub msg_id: Option<String>,
    pub msg_type: Option<String>,
    pub channel: Option<ChannelId>,
    pub priority: Priority,
    pub deadline: SystemTime,
    pub status: OutboundStatus,
    pub attempts: u32,
    pub attempts_base: u32,
    pub not_before: SystemTime,
    pub claim: Option<String>,
    pub claimed_at: Option<SystemTime>,
    pub resource_ids: Vec<String>,
    pub end_to_end_ids: Vec<String>,
    pub last_error: Option<String>,
    pub ingress_ref: Option<String>,
    pub raw: Bytes,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
    pub sent_at: Option<SystemTime>,
    pub confirmed_at: Option<SystemTime>,
    pub unconfirmed_since: Option<SystemTime>,
    /// The first attempt that may have reached the SPI (a failure, a vanished sender's claim).
    pub maybe_stored_at: Option<SystemTime>,
}

impl StoredRow {
    /// Not sent (again) past its deadline: `timeout` only when no attempt may have reached the SPI.
    pub fn past_deadline(&self) -> OutboundStatus {
        if self.maybe_stored_at.is_some() { OutboundStatus::InDoubt } else { OutboundStatus::Timeout }
    }

    pub fn view(&self) -> OutboundRow {
        OutboundRow {
            id: self.id,
            msg_id: self.msg_id.clone(),
            msg_type: self.msg_type.clone(),
            channel: self.channel,
            priority: self.priority,
            deadline: self.deadline,
            status: self.status,
            attempts: self.attempts,
            not_before: self.not_before,
            resource_ids: self.resource_ids.clone(),
            last_error: self.last_error.clone(),
            ingress_ref: self.ingress_ref.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            sent_at: self.sent_at,
            confirmed_at: self.confirmed_at,
            unconfirmed_since: self.unconfirmed_since,
        }
    }

    pub fn ready(&self) -> ReadyMessage {
        ReadyMessage {
            id: self.id,
            msg_id: self.msg_id.clone().unwrap_or_default(),
            msg_type: self.msg_type.clone().unwrap_or_default(),
            priority: self.priority,
            deadline: self.deadline,
            attempts: self.attempts,
            raw: self.raw.clone(),
        }
    }
}

/// One history line; `event` set makes it a result event (the outbox).
#[derive(Clone, Debug)]
pub struct HistoryLine {
    pub id: i64,
    pub row: i64,
    pub from: Option<OutboundStatus>,
    pub to: OutboundStatus,
    pub attempt: u32,
    pub event: Option<ResultStatus>,
    pub detail: Option<String>,
    pub at: SystemTime,
    pub published: bool,
}

#[derive(Clone, Debug, Default)]
pub struct StoreAudit {
    pub inserts: u64,
    pub duplicates: u64,
    pub takes: u64,
    pub claimed: u64,
    /// Outcomes ignored because their claim was recovered (or the row confirmed) meanwhile.
    pub stale_outcomes: u64,
}

#[derive(Default)]
pub struct Table {
    pub rows: Vec<StoredRow>,
    pub by_msg_id: HashMap<String, usize>,
    pub by_ref: HashMap<String, usize>,
    pub history: Vec<HistoryLine>,
    pub unavailable: bool,
    /// Parked requests, in parking order.
    pub parked: Vec<crate::ports::outbound::Parked>,
    /// An insert holding one of these MsgIds fails with the error given.
    pub poison: HashMap<String, crate::ports::outbound::OutboundError>,
    /// How long a take's answer travels back after the rows were claimed.
    pub take_latency: std::time::Duration,
    /// How long recording outcomes takes (applied at once, answered after it).
    pub record_latency: std::time::Duration,
    pub audit: StoreAudit,
}

/// The event a change publishes, if any.
pub fn event_of(from: Option<OutboundStatus>, to: OutboundStatus) -> Option<ResultStatus> {
    use OutboundStatus as S;
    if from == Some(to) || to == S::Sending {
        return None;
    }
    Some(match to {
        S::Queued if from.is_none() || matches!(from, Some(S::Dead | S::Rejected)) => ResultStatus::Accepted,
        S::Queued | S::Sending => return None,
        S::Sent => ResultStatus::Sent,
        S::Confirmed => ResultStatus::Confirmed,
        S::Rejected => ResultStatus::Rejected,
        S::RejectedBySpi => ResultStatus::RejectedBySpi,
        S::RejectedInvalid => ResultStatus::RejectedInvalid,
        S::Timeout => ResultStatus::Timeout,
        S::InDoubt => ResultStatus::InDoubt,
        S::Dead => ResultStatus::Dead,
    })
}

impl Table {
    /// Applies `apply` to row `idx` and writes its history line; returns the event.
    pub fn change(
        &mut self,
        idx: usize,
        now: SystemTime,
        note: Option<String>,
        apply: impl FnOnce(&mut StoredRow),
    ) -> Option<ResultEvent> {
        let row = &mut self.rows[idx];
        let from = row.status;
        apply(row);
        row.updated_at = now;
        self.log(idx, Some(from), now, note)
    }

    /// Writes the history line of row `idx` entering its current status from `from`.
    pub fn log(
        &mut self,
        idx: usize,
        from: Option<OutboundStatus>,
        now: SystemTime,
        note: Option<String>,
    ) -> Option<ResultEvent> {
        let row = &self.rows[idx];
        let event = event_of(from, row.status);
        let id = self.history.len() as i64 + 1;
        let detail = note.or_else(|| row.last_error.clone());
        self.history.push(HistoryLine {
            id,
            row: row.id,
            from,
            to: row.status,
            attempt: row.attempts,
            event,
            detail: detail.clone(),
            at: now,
            published: false,
        });
        event.map(|status| ResultEvent {
            id,
            msg_id: row.msg_id.clone(),
            ingress_ref: row.ingress_ref.clone(),
            channel: row.channel,
            status,
            attempt: row.attempts,
            at: now,
            resource_ids: row.resource_ids.clone(),
            detail,
        })
    }

    /// Indexes of rows matching `keep`, in `order`, at most `max`.
    pub fn pick<K: Ord>(
        &self,
        keep: impl Fn(&StoredRow) -> bool,
        order: impl Fn(&StoredRow) -> K,
        max: usize,
    ) -> Vec<usize> {
        let mut found: Vec<usize> = (0..self.rows.len()).filter(|i| keep(&self.rows[*i])).collect();
        found.sort_by_key(|i| order(&self.rows[*i]));
        found.truncate(max);
        found
    }

    /// The event of a history line, rebuilt (for the republish sweep).
    pub fn event_at(&self, line: &HistoryLine) -> Option<ResultEvent> {
        let row = &self.rows[usize::try_from(line.row - 1).ok()?];
        Some(ResultEvent {
            id: line.id,
            msg_id: row.msg_id.clone(),
            ingress_ref: row.ingress_ref.clone(),
            channel: row.channel,
            status: line.event?,
            attempt: line.attempt,
            at: line.at,
            resource_ids: row.resource_ids.clone(),
            detail: line.detail.clone(),
        })
    }
}
