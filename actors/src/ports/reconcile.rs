//! Port of the Reconciler: compare closed windows of our records against the
//! Central Bank's own statement of the settlement account, record what
//! differs, and settle the sends the statement proves (DESIGN §5,
//! "reconciliation runs and discrepancies").

use std::time::SystemTime;

/// What can differ between the Central Bank's statement and our records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DiscrepancyKind {
    /// A credit the Central Bank settled to us that is not in the inbox: money
    /// arrived and the bank core never heard of it.
    MissingInbound,
    /// An inbox pacs.008 the statement does not list.
    UnknownInbound,
    /// One credit stored more than once in the inbox.
    DuplicateInbound,
    /// A debit the Central Bank settled that no outbound row of ours carries.
    UnknownOutbound,
    /// One of our sends settled while its row was not `confirmed`: now confirmed, with the statement as evidence.
    SettledUnconfirmed,
    /// One of our sends the statement says never settled, while we thought it might have.
    NotSettled,
    /// The amount or the direction differs.
    Mismatch,
}

impl DiscrepancyKind {
    pub const ALL: [DiscrepancyKind; 7] = [
        DiscrepancyKind::MissingInbound,
        DiscrepancyKind::UnknownInbound,
        DiscrepancyKind::DuplicateInbound,
        DiscrepancyKind::UnknownOutbound,
        DiscrepancyKind::SettledUnconfirmed,
        DiscrepancyKind::NotSettled,
        DiscrepancyKind::Mismatch,
    ];

    /// The stored name and metric label.
    pub fn label(self) -> &'static str {
        match self {
            DiscrepancyKind::MissingInbound => "missing_inbound",
            DiscrepancyKind::UnknownInbound => "unknown_inbound",
            DiscrepancyKind::DuplicateInbound => "duplicate_inbound",
            DiscrepancyKind::UnknownOutbound => "unknown_outbound",
            DiscrepancyKind::SettledUnconfirmed => "settled_unconfirmed",
            DiscrepancyKind::NotSettled => "not_settled",
            DiscrepancyKind::Mismatch => "mismatch",
        }
    }

    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.label() == label)
    }

    /// Money moved that our records do not account for: CRITICAL. The others are
    /// WARNING (something to look at), or INFO when the Reconciler repaired it.
    pub fn level(self) -> Level {
        match self {
            DiscrepancyKind::MissingInbound | DiscrepancyKind::UnknownOutbound | DiscrepancyKind::Mismatch => {
                Level::Critical
            }
            DiscrepancyKind::UnknownInbound | DiscrepancyKind::DuplicateInbound => Level::Warning,
            DiscrepancyKind::SettledUnconfirmed | DiscrepancyKind::NotSettled => Level::Info,
        }
    }
}

/// Alert and discrepancy levels, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Info,
    Warning,
    Critical,
    Emergency,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warning => "WARNING",
            Level::Critical => "CRITICAL",
            Level::Emergency => "EMERGENCY",
        }
    }
}

/// One window reconciled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowReport {
    /// The `reconciliation` row.
    pub id: i64,
    pub from: SystemTime,
    pub to: SystemTime,
    /// Entries of the Central Bank's statement.
    pub statement_entries: u64,
    /// Discrepancies found, by kind (kinds with none left out).
    pub discrepancies: Vec<(DiscrepancyKind, u64)>,
    /// Sends whose status the statement settled (confirmed / timeout / rejected by the SPI).
    pub settled_sends: u64,
}

impl WindowReport {
    /// The discrepancies at CRITICAL.
    pub fn critical(&self) -> u64 {
        self.discrepancies.iter().filter(|(k, _)| k.level() == Level::Critical).map(|(_, n)| n).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconcileError {
    /// Postgres, the bus or the SPI did not answer in time: try again soon.
    #[error("reconciliation unavailable: {0}")]
    Unavailable(String),
    /// The statement did not come (or not whole) within the report timeout: try again.
    #[error("no complete statement for request {request} within {waited_ms} ms")]
    NoStatement { request: String, waited_ms: u64 },
    #[error("reconciliation failed: {0}")]
    Fatal(String),
}

#[async_trait::async_trait]
pub trait Reconciliation: Send + Sync {
    /// Reconciles every closed window not yet reconciled, oldest first (each
    /// requests its statement, waits for it, compares, records, settles).
    async fn reconcile_due(&self) -> Result<Vec<WindowReport>, ReconcileError>;
}
