//! In-memory inbox with the Postgres design's rules: `claim` takes the next
//! fence of the slot's cursor row (created at 0), every `commit` and
//! `store_cursor` fails with `FenceLost` unless the fence is still the row's,
//! rows are unique per (channel, resource id) and a commit is all or nothing.
//! The gate (DESIGN §2.5) as the SQL does it, on tokio's clock for Postgres's:
//! every fenced write keeps the row busy, a claim says what is left of the
//! previous holder's window. A commit delay makes "abort while persisting" observable.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{ChannelId, SlotId};
use crate::ports::{Claim, CommitSummary, CommittedRow, InboundMessage, InboxError, InboxStore, SlotCursor};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorRow {
    pub fence: i64,
    pub pull_next: Option<String>,
    pub holder: String,
    /// Last claim, commit or cursor store.
    pub updated_at: Instant,
    /// The gate: no new holder sends before this.
    pub busy_until: Option<Instant>,
}

#[derive(Clone, Debug)]
pub struct InboxRow {
    pub id: i64,
    pub slot: SlotId,
    pub fence: i64,
    pub message: InboundMessage,
    pub committed_at: Instant,
}

#[derive(Clone, Debug, Default)]
pub struct InboxAudit {
    pub claims: u64,
    pub commits: u64,
    /// Commits and cursor writes refused for a stale fence.
    pub fence_rejections: u64,
    /// Messages of committed batches that were already in the inbox.
    pub duplicates: u64,
}

#[derive(Default)]
struct Table {
    cursors: HashMap<SlotId, CursorRow>,
    rows: Vec<InboxRow>,
    keys: HashSet<(ChannelId, String)>,
    audit: InboxAudit,
    fail_commits: usize,
    fatal_claims: bool,
    commit_delay: Duration,
}

#[derive(Default)]
pub struct FakeInbox {
    table: Mutex<Table>,
}

impl FakeInbox {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_commit_delay(&self, delay: Duration) {
        self.lock().commit_delay = delay;
    }

    /// The next `n` commits fail as if Postgres were unreachable.
    pub fn fail_next_commits(&self, n: usize) {
        self.lock().fail_commits = n;
    }

    /// Every claim fails with `Fatal` (a broken schema).
    pub fn set_fatal_claims(&self, fatal: bool) {
        self.lock().fatal_claims = fatal;
    }

    pub fn rows(&self) -> Vec<InboxRow> {
        self.lock().rows.clone()
    }

    pub fn contains(&self, channel: ChannelId, resource_id: &str) -> bool {
        self.lock().keys.contains(&(channel, resource_id.to_owned()))
    }

    pub fn cursor(&self, slot: SlotId) -> Option<CursorRow> {
        self.lock().cursors.get(&slot).cloned()
    }

    pub fn audit(&self) -> InboxAudit {
        self.lock().audit.clone()
    }

    /// The row while `fence` is still its own.
    fn fenced(t: &mut Table, slot: SlotId, fence: i64) -> Result<&mut CursorRow, InboxError> {
        let current = t.cursors.get(&slot).map_or(0, |c| c.fence);
        if current != fence {
            t.audit.fence_rejections += 1;
            return Err(InboxError::FenceLost { ours: fence, current });
        }
        t.cursors.get_mut(&slot).ok_or(InboxError::FenceLost { ours: fence, current: 0 })
    }
}

/// `busy_until = max(busy_until, now + busy_for)`.
fn arm(row: &mut CursorRow, busy_for: Duration) {
    let until = Instant::now() + busy_for;
    row.busy_until = Some(row.busy_until.map_or(until, |b| b.max(until)));
}

#[async_trait::async_trait]
impl InboxStore for FakeInbox {
    async fn claim(&self, slot: SlotId, holder: &str, busy_for: Duration) -> Result<Claim, InboxError> {
        let mut t = self.lock();
        if t.fatal_claims {
            return Err(InboxError::Fatal("relation \"slot_cursor\" does not exist".into()));
        }
        t.audit.claims += 1;
        let row = t.cursors.entry(slot).or_insert(CursorRow {
            fence: 0,
            pull_next: None,
            holder: String::new(),
            updated_at: Instant::now(),
            busy_until: None,
        });
        let now = Instant::now();
        row.fence += 1;
        row.holder = holder.to_owned();
        row.updated_at = now;
        let wait = row.busy_until.map_or(Duration::ZERO, |b| b.saturating_duration_since(now));
        arm(row, busy_for);
        Ok(Claim { fence: row.fence, pull_next: row.pull_next.clone(), wait })
    }

    async fn commit(
        &self,
        slot: SlotId,
        fence: i64,
        batch: &[InboundMessage],
        pull_next: &str,
        busy_for: Duration,
    ) -> Result<CommitSummary, InboxError> {
        let delay = self.lock().commit_delay;
        tokio::time::sleep(delay).await;
        let mut t = self.lock();
        if t.fail_commits > 0 {
            t.fail_commits -= 1;
            return Err(InboxError::Unavailable("fake inbox down".into()));
        }
        Self::fenced(&mut t, slot, fence)?;
        let mut summary = CommitSummary::default();
        for message in batch {
            if !t.keys.insert((slot.channel, message.resource_id.clone())) {
                summary.duplicates += 1;
                continue;
            }
            let id = t.rows.len() as i64 + 1;
            let row = InboxRow { id, slot, fence, message: message.clone(), committed_at: Instant::now() };
            t.rows.push(row);
            summary.malformed += usize::from(message.malformed.is_some());
            summary.inserted.push(CommittedRow { id, slot, message: message.clone() });
        }
        t.audit.commits += 1;
        t.audit.duplicates += summary.duplicates as u64;
        if let Some(c) = t.cursors.get_mut(&slot) {
            c.pull_next = Some(pull_next.to_owned());
            c.updated_at = Instant::now();
            arm(c, busy_for);
        }
        Ok(summary)
    }

    async fn store_cursor(
        &self,
        slot: SlotId,
        fence: i64,
        pull_next: Option<&str>,
        busy_for: Duration,
    ) -> Result<(), InboxError> {
        let mut t = self.lock();
        let row = Self::fenced(&mut t, slot, fence)?;
        row.pull_next = pull_next.map(str::to_owned);
        row.updated_at = Instant::now();
        arm(row, busy_for);
        Ok(())
    }

    async fn arm(&self, slot: SlotId, fence: i64, busy_for: Duration) -> Result<(), InboxError> {
        let mut t = self.lock();
        arm(Self::fenced(&mut t, slot, fence)?, busy_for);
        Ok(())
    }

    async fn release(&self, slot: SlotId, fence: i64) -> Result<(), InboxError> {
        let mut t = self.lock();
        Self::fenced(&mut t, slot, fence)?.busy_until = None;
        Ok(())
    }

    async fn cursors(&self) -> Result<Vec<SlotCursor>, InboxError> {
        let t = self.lock();
        let mut rows: Vec<SlotCursor> = t
            .cursors
            .iter()
            .map(|(slot, c)| SlotCursor {
                slot: *slot,
                fence: c.fence,
                holder: Some(c.holder.clone()),
                pull_next: c.pull_next.clone(),
                age: c.updated_at.elapsed(),
                busy_for: c.busy_until.map(|b| b.saturating_duration_since(Instant::now())).filter(|d| !d.is_zero()),
            })
            .collect();
        rows.sort_by_key(|c| c.slot);
        Ok(rows)
    }
}
