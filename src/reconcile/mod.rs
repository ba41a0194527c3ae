//! The Reconciler's adapter ([`Reconciliation`]): for each closed window it
//! asks the SPI for the statement of our settlement account (a `camt.060`
//! sent through the outbound queue like any message), waits for the
//! `camt.053` pages on the inbound path, compares ([`compare`]), settles the
//! sends the statement decides (through the outbound store's own
//! transitions, result events published) and records the run and its
//! findings ([`records`]).
//!
//! Architecture invariant: the Reconciler changes a send only at the
//! statement's word, and only through `settle_in_doubt` / `confirm` — the
//! statements every other verdict goes through, each with its history line
//! and result event.

pub mod compare;
pub mod records;
pub mod request;
pub mod statement;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cabine_actors::domain::ChannelId;
use cabine_actors::metrics;
use cabine_actors::ports::outbound::{
    ConfirmOutcome, ConfirmRef, NewOutbound, OutboundStatus, OutboundStore, Priority, Settled, Settlement, SpiVerdict,
};
use cabine_actors::ports::outbound_bus::{ResultEvent, ResultSink, WorkHints};
use cabine_actors::ports::reconcile::{ReconcileError, Reconciliation, WindowReport};

use compare::{Finding, SendAction, Window};
use records::{NewDiscrepancy, Records};
use statement::{Pages, StatementEntry};

/// How the Reconciler picks its windows and waits for statements (`[reconcile]`).
#[derive(Clone, Debug)]
pub struct ReconcilePolicy {
    pub interval: Duration,
    pub settle_margin: Duration,
    pub report_timeout: Duration,
    pub lookback: Duration,
    pub max_windows: u32,
    pub channel: ChannelId,
    /// How often the inbox is read for the statement's pages.
    pub poll_every: Duration,
}

impl ReconcilePolicy {
    pub fn from_settings(s: &crate::config::Settings) -> Self {
        let r = &s.reconcile;
        ReconcilePolicy {
            interval: r.interval,
            settle_margin: r.settle_margin,
            report_timeout: r.report_timeout,
            lookback: r.lookback,
            max_windows: r.max_windows,
            channel: s.reconcile_channel(),
            poll_every: Duration::from_millis(200),
        }
    }

    /// The closed windows after `last_end` (else those of the last `lookback`, at least one),
    /// oldest first, at most `max_windows`.
    pub fn due_windows(&self, last_end: Option<SystemTime>, now: SystemTime) -> Vec<(SystemTime, SystemTime)> {
        let closed_until = align_down(now.checked_sub(self.settle_margin).unwrap_or(UNIX_EPOCH), self.interval);
        let first = last_end.map(|t| align_down(t, self.interval)).unwrap_or_else(|| {
            let back = self.lookback.max(self.interval);
            align_down(closed_until.checked_sub(back).unwrap_or(UNIX_EPOCH), self.interval)
        });
        let mut windows = Vec::new();
        let mut from = first;
        while from + self.interval <= closed_until && windows.len() < self.max_windows as usize {
            windows.push((from, from + self.interval));
            from += self.interval;
        }
        windows
    }
}

/// `at` rounded down to a multiple of `step` since the UNIX epoch.
fn align_down(at: SystemTime, step: Duration) -> SystemTime {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    let step = step.as_millis().max(1);
    UNIX_EPOCH + Duration::from_millis(u64::try_from(since / step * step).unwrap_or(u64::MAX))
}

/// The ports a reconciliation acts through.
pub struct PgReconciliation {
    pub records: Records,
    pub store: Arc<dyn OutboundStore>,
    pub results: Arc<dyn ResultSink>,
    pub hints: Arc<dyn WorkHints>,
    pub policy: ReconcilePolicy,
}

/// An action stored before it is applied reads `planned: …` until it is.
pub const PLANNED: &str = "planned: ";

/// Our clock and Postgres's may differ: pages are looked for from this long before the request.
const CLOCK_SLACK: Duration = Duration::from_secs(60);

#[async_trait::async_trait]
impl Reconciliation for PgReconciliation {
    async fn reconcile_due(&self) -> Result<Vec<WindowReport>, ReconcileError> {
        let last = self.records.last_scheduled_end().await?;
        let mut done = Vec::new();
        for (from, to) in self.policy.due_windows(last, SystemTime::now()) {
            done.push(self.reconcile_window(from, to, "schedule").await?);
        }
        Ok(done)
    }
}

impl PgReconciliation {
    /// Reconciles `[from, to)` now (a scheduled window, or an operator's).
    pub async fn reconcile_window(
        &self,
        from: SystemTime,
        to: SystemTime,
        origin: &str,
    ) -> Result<WindowReport, ReconcileError> {
        let id = self.records.open(from, to, origin).await.inspect_err(|_| metrics::reconcile_failed())?;
        match self.attempt(id, Window { from, to }).await {
            Ok(report) => {
                metrics::reconciled(&report);
                Ok(report)
            }
            Err(e) => {
                metrics::reconcile_failed();
                if let Err(also) = self.records.failed(id, &e.to_string()).await {
                    tracing::warn!(reconciliation = id, error = %also, "recording a failed reconciliation failed");
                }
                Err(e)
            }
        }
    }

    async fn attempt(&self, id: i64, window: Window) -> Result<WindowReport, ReconcileError> {
        let margin = self.policy.settle_margin;
        let asked = (window.from.checked_sub(margin).unwrap_or(UNIX_EPOCH), window.to + margin);
        let entries = self.statement(id, asked).await?;
        let inbox = self.records.inbox_credits(asked.0).await?;
        let e2es: Vec<String> = entries.iter().map(|e| e.end_to_end_id.clone()).collect();
        let sends = self.records.sends(&e2es, window.from, window.to).await?;
        let findings = compare::compare(window, &entries, &inbox, &sends);
        let settled = self.act(id, findings).await?;
        self.records.done(id, entries.len(), settled).await?;
        Ok(WindowReport {
            id,
            from: window.from,
            to: window.to,
            statement_entries: entries.len() as u64,
            discrepancies: self.records.counts(id).await?,
            settled_sends: settled as u64,
        })
    }

    /// Sends the camt.060 for `[from, to)` and waits for the whole statement.
    async fn statement(
        &self,
        id: i64,
        (from, to): (SystemTime, SystemTime),
    ) -> Result<Vec<StatementEntry>, ReconcileError> {
        let ispb = &self.records.ispb;
        let msg_id = request::new_msg_id(ispb);
        let now = SystemTime::now();
        let raw = request::reporting_request(ispb, &msg_id, from, to, now);
        self.records.requested(id, &msg_id).await?;
        let request = NewOutbound {
            msg_id: msg_id.clone(),
            msg_type: "camt.060".into(),
            channel: self.policy.channel,
            priority: Priority::High,
            deadline: now + self.policy.report_timeout,
            end_to_end_ids: Vec::new(),
            ingress_ref: None,
            raw: raw.into(),
        };
        self.store.insert(&request).await.map_err(|e| ReconcileError::Unavailable(e.to_string()))?;
        self.hints.rows_stored(self.policy.channel);
        let started = Instant::now();
        let since = now.checked_sub(CLOCK_SLACK).unwrap_or(UNIX_EPOCH);
        let (mut pages, mut seen) = (Pages::default(), Vec::new());
        loop {
            for (row, raw) in self.records.statement_pages(since, &seen).await? {
                seen.push(row);
                match statement::read_page(&raw) {
                    Ok(page) if page.request_msg_id == msg_id => pages.add(page),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(inbox_id = row, error = %e, "unreadable statement page"),
                }
            }
            if pages.is_whole() {
                return Ok(pages.entries());
            }
            self.refused(&msg_id).await?;
            if started.elapsed() >= self.policy.report_timeout {
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(ReconcileError::NoStatement { request: msg_id, waited_ms });
            }
            tokio::time::sleep(self.policy.poll_every).await;
        }
    }

    /// An error when the request can no longer be answered (refused, expired).
    async fn refused(&self, msg_id: &str) -> Result<(), ReconcileError> {
        let detail = self.store.get(msg_id).await.map_err(|e| ReconcileError::Unavailable(e.to_string()))?;
        match detail.map(|d| d.row) {
            Some(row)
                if matches!(
                    row.status,
                    OutboundStatus::Rejected
                        | OutboundStatus::RejectedBySpi
                        | OutboundStatus::RejectedInvalid
                        | OutboundStatus::Timeout
                        | OutboundStatus::Dead
                ) =>
            {
                let why = row.last_error.unwrap_or_default();
                Err(ReconcileError::Unavailable(format!(
                    "statement request {msg_id} is {}: {why}",
                    row.status.as_str()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Stores the findings (the evidence first, each action as planned), then applies each
    /// finding's action and records what it did; how many sends changed.
    async fn act(&self, id: i64, findings: Vec<Finding>) -> Result<usize, ReconcileError> {
        let planned: Vec<NewDiscrepancy> = findings
            .iter()
            .map(|f| NewDiscrepancy {
                kind: f.kind,
                end_to_end_id: f.end_to_end_id.clone(),
                msg_id: f.msg_id.clone(),
                evidence: f.evidence.clone(),
                action: f.action.as_ref().map(|a| format!("{PLANNED}{}", a.label())),
            })
            .collect();
        self.records.add_discrepancies(id, &planned).await?;
        let (mut events, mut settled) = (Vec::new(), 0);
        for f in &findings {
            if let Some(a) = &f.action {
                let (done, changed) = self.apply(a, f, &mut events).await?;
                settled += usize::from(changed);
                self.records.acted(id, f.kind, &f.end_to_end_id, &done).await?;
            }
        }
        if !events.is_empty()
            && let Err(e) = self.results.publish(&events).await
        {
            tracing::warn!(error = %e, "reconciled result events left for the sweep");
        }
        Ok(settled)
    }

    /// One send's change: what was done, and whether the row changed.
    async fn apply(
        &self,
        action: &SendAction,
        f: &Finding,
        events: &mut Vec<ResultEvent>,
    ) -> Result<(String, bool), ReconcileError> {
        let unavailable = |e: cabine_actors::ports::outbound::OutboundError| ReconcileError::Unavailable(e.to_string());
        let evidence = format!("statement evidence for {}: {}", f.end_to_end_id, f.evidence);
        let settled = |s: Settled, done: &str, events: &mut Vec<ResultEvent>| match s {
            Settled::Done(event) => {
                events.push(event);
                (done.to_owned(), true)
            }
            Settled::NotFound => ("none: no such row".to_owned(), false),
            Settled::NotInDoubt(status) => (format!("none: it is {}", status.as_str()), false),
        };
        let confirmed = |c: ConfirmOutcome, done: &str, events: &mut Vec<ResultEvent>| match c {
            ConfirmOutcome::Applied(applied) => {
                events.extend(applied);
                (done.to_owned(), true)
            }
            ConfirmOutcome::AlreadyFinal(status) => (format!("none: it is {}", status.as_str()), false),
            ConfirmOutcome::Unknown => ("none: no such row".to_owned(), false),
        };
        Ok(match action {
            SendAction::Confirm { msg_id, in_doubt: true } => {
                let s = self.store.settle_in_doubt(msg_id, &Settlement::Stored(SpiVerdict::Confirmed)).await;
                settled(s.map_err(unavailable)?, "confirmed", events)
            }
            SendAction::Confirm { msg_id, in_doubt: false } => {
                let c = self.store.confirm(&ConfirmRef::MsgId(msg_id.clone()), &SpiVerdict::Confirmed).await;
                confirmed(c.map_err(unavailable)?, "confirmed", events)
            }
            SendAction::NotSettled { msg_id, in_doubt: true } => {
                let s = self.store.settle_in_doubt(msg_id, &Settlement::NotStored { evidence }).await;
                settled(s.map_err(unavailable)?, "timeout", events)
            }
            SendAction::NotSettled { msg_id, in_doubt: false } => {
                let verdict = SpiVerdict::Rejected { reason: format!("not settled: {evidence}") };
                let c = self.store.confirm(&ConfirmRef::MsgId(msg_id.clone()), &verdict).await;
                confirmed(c.map_err(unavailable)?, "rejected_by_spi", events)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ReconcilePolicy {
        ReconcilePolicy {
            interval: Duration::from_secs(600),
            settle_margin: Duration::from_secs(120),
            report_timeout: Duration::from_secs(60),
            lookback: Duration::from_secs(3600),
            max_windows: 4,
            channel: ChannelId::Cpm,
            poll_every: Duration::from_millis(200),
        }
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn windows_are_aligned_closed_and_bounded() {
        let p = policy();
        // 10:13 → closed until 10:11 → the last whole window is 10:00–10:10.
        let now = at(36_000 + 13 * 60);
        let first = p.due_windows(None, now);
        assert_eq!(first.len(), 4, "lookback 1h holds 6 windows, at most 4 per run");
        assert_eq!(first[0], (at(36_000 - 3000), at(36_000 - 2400)), "9:10: an hour before 10:10");
        let next = p.due_windows(Some(at(36_000)), now);
        assert_eq!(next, vec![(at(36_000), at(36_600))]);
        assert!(p.due_windows(Some(at(36_600)), now).is_empty(), "10:10–10:20 is still open");
        let short = ReconcilePolicy { lookback: Duration::from_secs(1), ..p };
        assert_eq!(short.due_windows(None, now), vec![(at(36_000), at(36_600))], "at least the last closed one");
    }
}
