//! The fake store's reads: one message with its history, pages by status, and
//! the queue depth by (channel, priority).

use super::table::Table;
use crate::ports::outbound::{DepthLine, HistoryEntry, OutboundDetail, OutboundStatus, Page, ParkedState, QueueDepth};

pub fn detail(t: &Table, msg_id: &str) -> Option<OutboundDetail> {
    let row = &t.rows[*t.by_msg_id.get(msg_id)?];
    let history = t
        .history
        .iter()
        .filter(|h| h.row == row.id)
        .map(|h| HistoryEntry {
            at: h.at,
            from: h.from,
            to: h.to,
            attempt: h.attempt,
            event: h.event,
            detail: h.detail.clone(),
        })
        .collect();
    Some(OutboundDetail { row: row.view(), history })
}

pub fn page(t: &Table, status: OutboundStatus, after: Option<i64>, limit: u32) -> Page {
    let limit = limit.clamp(1, 500) as usize;
    let rows: Vec<_> = t
        .rows
        .iter()
        .filter(|r| r.status == status && r.id > after.unwrap_or(0))
        .take(limit)
        .map(|r| r.view())
        .collect();
    let next_after = (rows.len() == limit).then(|| rows.last().map(|r| r.id)).flatten();
    Page { rows, next_after }
}

pub fn depth(t: &Table) -> QueueDepth {
    let mut lines: Vec<DepthLine> = Vec::new();
    for r in t.rows.iter().filter(|r| matches!(r.status, OutboundStatus::Queued | OutboundStatus::Sending)) {
        let Some(channel) = r.channel else { continue };
        let i = match lines.iter().position(|l| l.channel == channel && l.priority == r.priority) {
            Some(i) => i,
            None => {
                lines.push(DepthLine { channel, priority: r.priority, queued: 0, sending: 0, oldest_queued: None });
                lines.len() - 1
            }
        };
        let line = &mut lines[i];
        if r.status == OutboundStatus::Queued {
            line.queued += 1;
            line.oldest_queued = Some(line.oldest_queued.map_or(r.created_at, |o| o.min(r.created_at)));
        } else {
            line.sending += 1;
        }
    }
    lines.sort_by_key(|l| (l.channel, l.priority));
    let parked = t.parked.iter().filter(|p| p.state == ParkedState::Parked).count() as u64;
    QueueDepth { lines, parked }
}
