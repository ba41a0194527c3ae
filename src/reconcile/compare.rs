//! The comparison itself, pure: one window's Central Bank statement against
//! our inbox credits and our sends, giving the discrepancies (with their
//! evidence) and what to do to the sends the statement settles.
//!
//! The statement covers `[from − margin, to + margin)`; the window is
//! `[from, to)`. Entries settled inside the window are checked against our
//! records; our records inside the window are checked against the whole
//! statement, so a settlement a little before or after its message does not
//! look like a discrepancy.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use cabine_actors::ports::outbound::OutboundStatus;
use cabine_actors::ports::reconcile::DiscrepancyKind;
use serde_json::{Value, json};

use super::statement::{Direction, StatementEntry};

/// The window under reconciliation.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub from: SystemTime,
    pub to: SystemTime,
}

impl Window {
    fn holds(&self, at: SystemTime) -> bool {
        self.from <= at && at < self.to
    }
}

/// One inbox pacs.008 (a credit to us).
#[derive(Clone, Debug)]
pub struct InboxCredit {
    pub id: i64,
    pub end_to_end_id: String,
    pub msg_id: Option<String>,
    pub received_at: SystemTime,
    /// When the payer's PSP accepted it (`AccptncDtTm`): within seconds of its
    /// settlement, however late it reached us.
    pub accepted_at: Option<SystemTime>,
    pub amount_cents: Option<u64>,
}

impl InboxCredit {
    /// When it settled, as near as our records tell: acceptance, else arrival.
    fn settled_about(&self) -> SystemTime {
        self.accepted_at.unwrap_or(self.received_at)
    }
}

/// One of our sends (an outbound pacs.008 row).
#[derive(Clone, Debug)]
pub struct OurSend {
    pub msg_id: String,
    pub status: OutboundStatus,
    pub end_to_end_ids: Vec<String>,
    pub amounts: HashMap<String, u64>,
    /// `sent_at`, else `maybe_stored_at`: when it may have reached the SPI.
    pub attempted_at: Option<SystemTime>,
}

/// What the Reconciler does to a send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendAction {
    /// The statement settles it: `confirmed`.
    Confirm { msg_id: String, in_doubt: bool },
    /// The statement never settled it: `timeout` (in doubt) or `rejected_by_spi` (sent).
    NotSettled { msg_id: String, in_doubt: bool },
}

impl SendAction {
    /// What it means to do, as stored while planned.
    pub fn label(&self) -> &'static str {
        match self {
            SendAction::Confirm { .. } => "confirm",
            SendAction::NotSettled { in_doubt: true, .. } => "timeout",
            SendAction::NotSettled { in_doubt: false, .. } => "rejected_by_spi",
        }
    }
}

/// One discrepancy found.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub kind: DiscrepancyKind,
    pub end_to_end_id: String,
    pub msg_id: Option<String>,
    pub evidence: Value,
    pub action: Option<SendAction>,
}

fn entry_evidence(e: &StatementEntry) -> Value {
    json!({
        "statement": {
            "direction": e.direction.label(),
            "amount": e.amount,
            "settled_at": humantime::format_rfc3339_millis(e.settled_at).to_string(),
            "msg_id": e.msg_id,
        }
    })
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    if let Value::Object(map) = &mut base {
        map.insert(key.to_owned(), value);
    }
    base
}

fn cents_text(cents: Option<u64>) -> Value {
    cents.map_or(Value::Null, |c| Value::String(format!("{}.{:02}", c / 100, c % 100)))
}

/// Our sends that may still change at the statement's word.
fn unsettled(status: OutboundStatus) -> bool {
    !matches!(
        status,
        OutboundStatus::Confirmed
            | OutboundStatus::Rejected
            | OutboundStatus::RejectedBySpi
            | OutboundStatus::RejectedInvalid
            | OutboundStatus::Timeout
            | OutboundStatus::Dead
    )
}

/// Everything that differs. `sends` holds every send carrying an EndToEndId of
/// the statement, plus our unconfirmed sends attempted in the window.
pub fn compare(window: Window, statement: &[StatementEntry], inbox: &[InboxCredit], sends: &[OurSend]) -> Vec<Finding> {
    let mut found = Vec::new();
    let listed: HashSet<&str> = statement.iter().map(|e| e.end_to_end_id.as_str()).collect();
    let mut inbox_by_e2e: HashMap<&str, Vec<&InboxCredit>> = HashMap::new();
    for c in inbox {
        inbox_by_e2e.entry(c.end_to_end_id.as_str()).or_default().push(c);
    }
    let mut send_by_e2e: HashMap<&str, &OurSend> = HashMap::new();
    for s in sends {
        for e2e in &s.end_to_end_ids {
            send_by_e2e.insert(e2e.as_str(), s);
        }
    }
    let mut confirmed_here: HashSet<&str> = HashSet::new();
    for e in statement.iter().filter(|e| window.holds(e.settled_at)) {
        match e.direction {
            Direction::Credit => credit(e, &inbox_by_e2e, &send_by_e2e, &mut found),
            Direction::Debit => {
                if let Some(s) = debit(e, &inbox_by_e2e, &send_by_e2e, &mut found) {
                    confirmed_here.insert(s);
                }
            }
        }
    }
    for c in inbox.iter().filter(|c| window.holds(c.settled_about()) && !listed.contains(c.end_to_end_id.as_str())) {
        found.push(Finding {
            kind: DiscrepancyKind::UnknownInbound,
            end_to_end_id: c.end_to_end_id.clone(),
            msg_id: c.msg_id.clone(),
            evidence: json!({
                "ours": {
                    "inbox_id": c.id,
                    "received_at": humantime::format_rfc3339_millis(c.received_at).to_string(),
                    "accepted_at": c.accepted_at.map(|t| humantime::format_rfc3339_millis(t).to_string()),
                },
                "statement": null,
            }),
            action: None,
        });
    }
    for s in sends {
        let in_window = s.attempted_at.is_some_and(|at| window.holds(at));
        let maybe = matches!(s.status, OutboundStatus::InDoubt | OutboundStatus::Sent);
        if !in_window || !maybe || confirmed_here.contains(s.msg_id.as_str()) {
            continue;
        }
        if s.end_to_end_ids.iter().any(|e| listed.contains(e.as_str())) {
            continue;
        }
        let in_doubt = s.status == OutboundStatus::InDoubt;
        found.push(Finding {
            kind: DiscrepancyKind::NotSettled,
            end_to_end_id: s.end_to_end_ids.first().cloned().unwrap_or_default(),
            msg_id: Some(s.msg_id.clone()),
            evidence: json!({ "ours": { "status": s.status.as_str(), "end_to_end_ids": s.end_to_end_ids }, "statement": null }),
            action: Some(SendAction::NotSettled { msg_id: s.msg_id.clone(), in_doubt }),
        });
    }
    found
}

/// A credit the Central Bank settled to us.
fn credit(
    e: &StatementEntry,
    inbox: &HashMap<&str, Vec<&InboxCredit>>,
    sends: &HashMap<&str, &OurSend>,
    found: &mut Vec<Finding>,
) {
    let evidence = entry_evidence(e);
    let finding = |kind, msg_id: Option<String>, evidence| Finding {
        kind,
        end_to_end_id: e.end_to_end_id.clone(),
        msg_id,
        evidence,
        action: None,
    };
    let Some(rows) = inbox.get(e.end_to_end_id.as_str()) else {
        let (kind, ours) = match sends.get(e.end_to_end_id.as_str()) {
            Some(s) => (DiscrepancyKind::Mismatch, json!({ "direction": "debit", "msg_id": s.msg_id })),
            None => (DiscrepancyKind::MissingInbound, Value::Null),
        };
        found.push(finding(kind, e.msg_id.clone(), with(evidence, "ours", ours)));
        return;
    };
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    if rows.len() > 1 {
        let ours = json!({ "inbox_ids": ids });
        found.push(finding(DiscrepancyKind::DuplicateInbound, e.msg_id.clone(), with(evidence.clone(), "ours", ours)));
    }
    let amount = rows[0].amount_cents;
    if amount.is_some() && amount != e.amount_cents {
        let ours = json!({ "inbox_ids": ids, "amount": cents_text(amount) });
        found.push(finding(DiscrepancyKind::Mismatch, e.msg_id.clone(), with(evidence, "ours", ours)));
    }
}

/// A debit the Central Bank settled from us; the MsgId of the send it settles, when one does.
fn debit<'s>(
    e: &StatementEntry,
    inbox: &HashMap<&str, Vec<&InboxCredit>>,
    sends: &HashMap<&str, &'s OurSend>,
    found: &mut Vec<Finding>,
) -> Option<&'s str> {
    let evidence = entry_evidence(e);
    let finding = |kind, msg_id: Option<String>, evidence, action| Finding {
        kind,
        end_to_end_id: e.end_to_end_id.clone(),
        msg_id,
        evidence,
        action,
    };
    let Some(send) = sends.get(e.end_to_end_id.as_str()) else {
        let (kind, ours) = match inbox.get(e.end_to_end_id.as_str()) {
            Some(rows) => (DiscrepancyKind::Mismatch, json!({ "direction": "credit", "inbox_id": rows[0].id })),
            None => (DiscrepancyKind::UnknownOutbound, Value::Null),
        };
        found.push(finding(kind, e.msg_id.clone(), with(evidence, "ours", ours), None));
        return None;
    };
    let msg_id = Some(send.msg_id.clone());
    let ours =
        json!({ "status": send.status.as_str(), "amount": cents_text(send.amounts.get(&e.end_to_end_id).copied()) });
    let amount = send.amounts.get(&e.end_to_end_id).copied();
    if amount.is_some() && amount != e.amount_cents {
        found.push(finding(
            DiscrepancyKind::Mismatch,
            msg_id.clone(),
            with(evidence.clone(), "ours", ours.clone()),
            None,
        ));
    }
    match send.status {
        OutboundStatus::Confirmed => {}
        status if unsettled(status) => {
            let action =
                SendAction::Confirm { msg_id: send.msg_id.clone(), in_doubt: status == OutboundStatus::InDoubt };
            found.push(finding(
                DiscrepancyKind::SettledUnconfirmed,
                msg_id,
                with(evidence, "ours", ours),
                Some(action),
            ));
        }
        // We told the core it failed (timeout, rejected, dead) and the Central Bank settled it.
        _ => found.push(finding(DiscrepancyKind::Mismatch, msg_id, with(evidence, "ours", ours), None)),
    }
    Some(&send.msg_id)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    fn entry(e2e: &str, direction: Direction, cents: u64, s: u64) -> StatementEntry {
        StatementEntry {
            end_to_end_id: e2e.into(),
            msg_id: Some(format!("M-{e2e}")),
            direction,
            amount: format!("{}.{:02}", cents / 100, cents % 100),
            amount_cents: Some(cents),
            settled_at: at(s),
        }
    }

    fn inbox(id: i64, e2e: &str, cents: u64, s: u64) -> InboxCredit {
        InboxCredit {
            id,
            end_to_end_id: e2e.into(),
            msg_id: None,
            received_at: at(s + 30),
            accepted_at: Some(at(s)),
            amount_cents: Some(cents),
        }
    }

    fn send(msg_id: &str, e2e: &str, status: OutboundStatus, cents: u64, s: u64) -> OurSend {
        OurSend {
            msg_id: msg_id.into(),
            status,
            end_to_end_ids: vec![e2e.into()],
            amounts: [(e2e.to_owned(), cents)].into(),
            attempted_at: Some(at(s)),
        }
    }

    fn kinds(found: &[Finding]) -> Vec<(DiscrepancyKind, &str)> {
        let mut k: Vec<_> = found.iter().map(|f| (f.kind, f.end_to_end_id.as_str())).collect();
        k.sort();
        k
    }

    const W: Window = Window { from: UNIX_EPOCH, to: UNIX_EPOCH };

    fn window() -> Window {
        Window { from: at(100), to: at(200) }
    }

    #[test]
    fn agreeing_records_give_nothing() {
        let st = [entry("E1", Direction::Credit, 100, 150), entry("E2", Direction::Debit, 250, 160)];
        let found = compare(
            window(),
            &st,
            &[inbox(1, "E1", 100, 151)],
            &[send("M2", "E2", OutboundStatus::Confirmed, 250, 159)],
        );
        assert!(found.is_empty(), "{found:?}");
        assert!(compare(W, &[], &[], &[]).is_empty());
    }

    #[test]
    fn each_discrepancy_is_found_with_its_kind() {
        use DiscrepancyKind::*;
        let st = [
            entry("MISSING", Direction::Credit, 100, 150),
            entry("DUP", Direction::Credit, 100, 150),
            entry("AMOUNT", Direction::Credit, 100, 150),
            entry("GHOST", Direction::Debit, 100, 150),
            entry("DOUBT", Direction::Debit, 100, 150),
            entry("LATE", Direction::Credit, 100, 210),
        ];
        let inbox = [
            inbox(1, "DUP", 100, 151),
            inbox(2, "DUP", 100, 152),
            inbox(3, "AMOUNT", 200, 151),
            inbox(4, "UNKNOWN", 100, 151),
            inbox(5, "LATE", 100, 211),
        ];
        let sends = [
            send("MD", "DOUBT", OutboundStatus::InDoubt, 100, 149),
            send("MN", "NEVER", OutboundStatus::InDoubt, 100, 149),
            send("MS", "OUTSIDE", OutboundStatus::Sent, 100, 99),
        ];
        let found = compare(window(), &st, &inbox, &sends);
        assert_eq!(
            kinds(&found),
            vec![
                (MissingInbound, "MISSING"),
                (UnknownInbound, "UNKNOWN"),
                (DuplicateInbound, "DUP"),
                (UnknownOutbound, "GHOST"),
                (SettledUnconfirmed, "DOUBT"),
                (NotSettled, "NEVER"),
                (Mismatch, "AMOUNT"),
            ]
        );
        let doubt = found.iter().find(|f| f.kind == SettledUnconfirmed).unwrap();
        assert_eq!(doubt.action, Some(SendAction::Confirm { msg_id: "MD".into(), in_doubt: true }));
        let never = found.iter().find(|f| f.kind == NotSettled).unwrap();
        assert_eq!(never.action, Some(SendAction::NotSettled { msg_id: "MN".into(), in_doubt: true }));
        assert_eq!(doubt.evidence["statement"]["amount"], "1.00");
    }

    #[test]
    fn a_settled_send_we_called_failed_is_a_mismatch() {
        let st = [entry("E", Direction::Debit, 100, 150)];
        let found = compare(window(), &st, &[], &[send("M", "E", OutboundStatus::Timeout, 100, 140)]);
        assert_eq!(kinds(&found), vec![(DiscrepancyKind::Mismatch, "E")]);
        assert_eq!(found[0].action, None);
    }

    #[test]
    fn a_credit_that_is_our_own_send_is_a_direction_mismatch() {
        let st = [entry("E", Direction::Credit, 100, 150)];
        let found = compare(window(), &st, &[], &[send("M", "E", OutboundStatus::Confirmed, 100, 140)]);
        assert_eq!(kinds(&found), vec![(DiscrepancyKind::Mismatch, "E")]);
        assert_eq!(found[0].evidence["ours"]["direction"], "debit");
    }
}
