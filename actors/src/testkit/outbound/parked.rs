//! The fake store's parked requests: kept once per ingress ref, paged oldest
//! first, and unparked by storing the request again as an insert would.

use super::table::Table;
use crate::ports::outbound::{Parked, ParkedPage, ParkedState};
use crate::ports::outbound_bus::Arrival;

/// Parks what is not parked yet (by ingress ref); returns how many are new.
pub fn park(t: &mut Table, arrivals: &[Arrival], reason: &str, now: std::time::SystemTime) -> usize {
    let mut new = 0;
    for a in arrivals {
        let known = a.ingress_ref.is_some() && t.parked.iter().any(|p| p.arrival.ingress_ref == a.ingress_ref);
        if known {
            continue;
        }
        let id = t.parked.len() as i64 + 1;
        t.parked.push(Parked {
            id,
            arrival: a.clone(),
            reason: reason.to_owned(),
            state: ParkedState::Parked,
            parked_at: now,
            reprocessed_at: None,
            outbound_msg_id: None,
        });
        new += 1;
    }
    new
}

pub fn page(t: &Table, after: Option<i64>, limit: u32) -> ParkedPage {
    let limit = limit.clamp(1, 500) as usize;
    let rows: Vec<Parked> = t
        .parked
        .iter()
        .filter(|p| p.state == ParkedState::Parked && p.id > after.unwrap_or(0))
        .take(limit)
        .cloned()
        .collect();
    let next_after = (rows.len() == limit).then(|| rows.last().map(|r| r.id)).flatten();
    ParkedPage { rows, next_after }
}

pub fn find(t: &Table, ingress_ref: &str) -> Option<usize> {
    t.parked.iter().position(|p| p.arrival.ingress_ref.as_deref() == Some(ingress_ref))
}
