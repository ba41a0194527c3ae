//! In-memory outbound store with the Postgres store's rules: one row per MsgId
//! (an unreadable request once per ingress ref), ready rows claimed per channel
//! by priority then deadline with a claim token (a row past its deadline is
//! never claimed, a claimed row never expires), outcomes applied only under
//! the caller's claim (a 201 always: it is a fact), attempts, poison, backoff
//! with full jitter, 429 and not-sent waits that are not attempts, recovery of
//! stale claims, `in_doubt` past the deadline after an attempt that may have
//! reached the SPI, verdicts and settlements, and a history whose event lines
//! are the outbox.
//! Wall time comes from a clock that follows tokio's (paused) time.

mod parked;
mod reads;
mod record;
mod table;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

pub use table::{HistoryLine, StoreAudit, StoredRow};

use table::Table;

use crate::domain::ChannelId;
use crate::ports::outbound::{
    Batch, BatchSize, ClaimToken, ConfirmOutcome, ConfirmRef, Inserted, InvalidOutbound, NewOutbound, OutboundDetail,
    OutboundError, OutboundStatus, OutboundStore, Page, Parked, ParkedPage, ParkedState, Priority, QueueDepth,
    Recorded, Reprocessed, SendResult, Settled, Settlement, SpiVerdict, Unparked,
};
use crate::ports::outbound_bus::{Arrival, OutboundRequest, ResultEvent};
use crate::slot::schedule::WallClock;

/// The adapter's policy (`[timing]` and `[outbound]` in the real one).
#[derive(Clone, Debug)]
pub struct FakeOutboundPolicy {
    pub poison_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub processing_timeout: Duration,
    pub unconfirmed_after: Duration,
    pub retry_after_default: Duration,
}

impl Default for FakeOutboundPolicy {
    fn default() -> Self {
        FakeOutboundPolicy {
            poison_attempts: 5,
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            processing_timeout: Duration::from_secs(10),
            unconfirmed_after: Duration::from_secs(30),
            retry_after_default: Duration::from_millis(500),
        }
    }
}

pub struct FakeOutboundStore {
    policy: FakeOutboundPolicy,
    clock: WallClock,
    table: Mutex<Table>,
}

impl FakeOutboundStore {
    pub fn new(policy: FakeOutboundPolicy) -> Arc<Self> {
        Arc::new(FakeOutboundStore { policy, clock: WallClock::start(), table: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's wall clock (follows tokio's paused time): build deadlines with it.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    pub fn set_unavailable(&self, down: bool) {
        self.lock().unavailable = down;
    }

    /// Every insert holding `msg_id` fails with `error` (a request the store chokes on).
    pub fn poison(&self, msg_id: &str, error: OutboundError) {
        self.lock().poison.insert(msg_id.to_owned(), error);
    }

    /// Parked requests (both states), in parking order.
    pub fn parked_rows(&self) -> Vec<Parked> {
        self.lock().parked.clone()
    }

    /// Claims up to `max` ready rows (and expires overdue ones); the latency to answer with.
    fn take_now(&self, channel: ChannelId, max: BatchSize) -> Result<(Batch, Duration), OutboundError> {
        let mut t = self.open()?;
        let expired = self.expire(&mut t, Some(channel), 100);
        let now = self.now();
        let ready = t.pick(
            |r| {
                r.status == OutboundStatus::Queued
                    && r.channel == Some(channel)
                    && r.not_before <= now
                    && r.deadline > now
            },
            |r| (r.priority, r.deadline, r.id),
            max.get(),
        );
        let claim = ClaimToken(format!("claim-{:016x}", rand::random::<u64>()));
        let note = Some(format!("claim {}", claim.0));
        let mut messages = Vec::with_capacity(ready.len());
        for i in ready {
            t.change(i, now, note.clone(), |r| {
                r.status = OutboundStatus::Sending;
                (r.claim, r.claimed_at) = (Some(claim.0.clone()), Some(now));
            });
            messages.push(t.rows[i].ready());
        }
        t.audit.takes += 1;
        t.audit.claimed += messages.len() as u64;
        Ok((Batch { claim, channel, messages, expired }, t.take_latency))
    }

    /// A take claims its rows at once and answers after `latency` (a row inserted meanwhile is not in it).
    pub fn set_take_latency(&self, latency: Duration) {
        self.lock().take_latency = latency;
    }

    /// Recording outcomes applies them at once and answers after `latency`.
    pub fn set_record_latency(&self, latency: Duration) {
        self.lock().record_latency = latency;
    }

    fn open(&self) -> Result<std::sync::MutexGuard<'_, Table>, OutboundError> {
        let t = self.lock();
        if t.unavailable { Err(OutboundError::Unavailable("fake outbound store down".into())) } else { Ok(t) }
    }

    pub fn rows(&self) -> Vec<StoredRow> {
        self.lock().rows.clone()
    }

    pub fn row(&self, msg_id: &str) -> Option<StoredRow> {
        let t = self.lock();
        t.by_msg_id.get(msg_id).map(|i| t.rows[*i].clone())
    }

    pub fn status_of(&self, msg_id: &str) -> Option<OutboundStatus> {
        self.row(msg_id).map(|r| r.status)
    }

    pub fn count(&self, status: OutboundStatus) -> usize {
        self.lock().rows.iter().filter(|r| r.status == status).count()
    }

    pub fn history(&self) -> Vec<HistoryLine> {
        self.lock().history.clone()
    }

    pub fn audit(&self) -> StoreAudit {
        self.lock().audit.clone()
    }

    /// Result events not marked published, older than `older_than`, at most `max`.
    pub fn unpublished(&self, older_than: Duration, max: u32) -> Vec<ResultEvent> {
        let now = self.now();
        let t = self.lock();
        t.history
            .iter()
            .filter(|h| h.event.is_some() && !h.published && h.at + older_than <= now)
            .take(max as usize)
            .filter_map(|h| t.event_at(h))
            .collect()
    }

    pub fn mark_published(&self, ids: &[i64]) {
        let mut t = self.lock();
        for id in ids {
            if let Some(line) = usize::try_from(id - 1).ok().and_then(|i| t.history.get_mut(i)) {
                line.published = true;
            }
        }
    }

    fn insert_row(&self, t: &mut Table, row: table::StoredRow) -> Inserted {
        let now = row.created_at;
        let idx = t.rows.len();
        if let Some(m) = &row.msg_id {
            t.by_msg_id.insert(m.clone(), idx);
        }
        if let Some(r) = &row.ingress_ref {
            t.by_ref.insert(r.clone(), idx);
        }
        t.rows.push(row);
        t.audit.inserts += 1;
        let event = t.log(idx, None, now, None).expect("an insert is an event");
        Inserted::New { event }
    }

    fn duplicate(t: &mut Table, idx: usize, raw: &[u8]) -> Inserted {
        t.audit.duplicates += 1;
        let row = &t.rows[idx];
        Inserted::Duplicate { row: row.view(), same_body: row.raw.as_ref() == raw }
    }

    fn insert_valid(&self, t: &mut Table, msg: &NewOutbound) -> Inserted {
        let existing = t.by_msg_id.get(&msg.msg_id).or_else(|| msg.ingress_ref.as_ref().and_then(|r| t.by_ref.get(r)));
        if let Some(idx) = existing.copied() {
            return Self::duplicate(t, idx, &msg.raw);
        }
        let row = self.new_row(t.rows.len() as i64 + 1, msg);
        self.insert_row(t, row)
    }

    fn insert_unreadable(&self, t: &mut Table, msg: &InvalidOutbound) -> Inserted {
        if let Some(idx) = msg.ingress_ref.as_ref().and_then(|r| t.by_ref.get(r)).copied() {
            return Self::duplicate(t, idx, &msg.raw);
        }
        let now = self.now();
        let placeholder = NewOutbound {
            msg_id: String::new(),
            msg_type: String::new(),
            channel: msg.channel.unwrap_or(ChannelId::Cpm),
            priority: Priority::Normal,
            deadline: now,
            end_to_end_ids: Vec::new(),
            ingress_ref: msg.ingress_ref.clone(),
            raw: msg.raw.clone(),
        };
        let mut row = self.new_row(t.rows.len() as i64 + 1, &placeholder);
        (row.msg_id, row.msg_type, row.channel) = (None, None, msg.channel);
        row.status = OutboundStatus::RejectedInvalid;
        row.last_error = Some(msg.reason.clone());
        self.insert_row(t, row)
    }

    /// Queued rows past their deadline (of `channel`, or all) → `timeout`, or
    /// `in_doubt` when an earlier attempt may have reached the SPI.
    fn expire(&self, t: &mut Table, channel: Option<ChannelId>, max: u32) -> Vec<ResultEvent> {
        let now = self.now();
        let due = t.pick(
            |r| r.status == OutboundStatus::Queued && channel.is_none_or(|c| r.channel == Some(c)) && r.deadline <= now,
            |r| r.deadline,
            max as usize,
        );
        due.into_iter()
            .filter_map(|i| {
                let note = Some(match t.rows[i].maybe_stored_at {
                    None => "deadline passed before sending".to_owned(),
                    Some(_) => "deadline passed after an attempt that may have reached the SPI".to_owned(),
                });
                t.change(i, now, note.clone(), |r| {
                    r.status = r.past_deadline();
                    r.last_error = note;
                })
            })
            .collect()
    }

    fn new_row(&self, id: i64, msg: &NewOutbound) -> StoredRow {
        let now = self.now();
        StoredRow {
            id,
            msg_id: Some(msg.msg_id.clone()),
            msg_type: Some(msg.msg_type.clone()),
            channel: Some(msg.channel),
            priority: msg.priority,
            deadline: msg.deadline,
            status: OutboundStatus::Queued,
            attempts: 0,
            attempts_base: 0,
            not_before: now,
            claim: None,
            claimed_at: None,
            resource_ids: Vec::new(),
            end_to_end_ids: msg.end_to_end_ids.clone(),
            last_error: None,
            ingress_ref: msg.ingress_ref.clone(),
            raw: msg.raw.clone(),
            created_at: now,
            updated_at: now,
            sent_at: None,
            confirmed_at: None,
            unconfirmed_since: None,
            maybe_stored_at: None,
        }
    }
}

#[async_trait::async_trait]
impl OutboundStore for FakeOutboundStore {
    async fn insert(&self, msg: &NewOutbound) -> Result<Inserted, OutboundError> {
        let mut t = self.open()?;
        Ok(self.insert_valid(&mut t, msg))
    }

    async fn insert_invalid(&self, msg: &InvalidOutbound) -> Result<Inserted, OutboundError> {
        let mut t = self.open()?;
        Ok(self.insert_unreadable(&mut t, msg))
    }

    async fn insert_batch(&self, requests: &[OutboundRequest]) -> Result<Vec<Inserted>, OutboundError> {
        let mut t = self.open()?;
        let poisoned = requests.iter().find_map(|r| match r {
            OutboundRequest::Valid(m) => t.poison.get(&m.msg_id).cloned(),
            OutboundRequest::Invalid(_) => None,
        });
        if let Some(error) = poisoned {
            return Err(error);
        }
        Ok(requests
            .iter()
            .map(|r| match r {
                OutboundRequest::Valid(m) => self.insert_valid(&mut t, m),
                OutboundRequest::Invalid(m) => self.insert_unreadable(&mut t, m),
            })
            .collect())
    }

    async fn park(&self, arrivals: &[Arrival], reason: &str) -> Result<usize, OutboundError> {
        let mut t = self.open()?;
        Ok(parked::park(&mut t, arrivals, reason, self.now()))
    }

    async fn parked(&self, after: Option<i64>, limit: u32) -> Result<ParkedPage, OutboundError> {
        let t = self.open()?;
        Ok(parked::page(&t, after, limit))
    }

    async fn parked_request(&self, ingress_ref: &str) -> Result<Option<Parked>, OutboundError> {
        let t = self.open()?;
        Ok(parked::find(&t, ingress_ref).map(|i| t.parked[i].clone()))
    }

    async fn unpark(&self, ingress_ref: &str, request: &OutboundRequest) -> Result<Unparked, OutboundError> {
        let state = {
            let t = self.open()?;
            parked::find(&t, ingress_ref).map(|i| t.parked[i].state)
        };
        match state {
            None => return Ok(Unparked::NotFound),
            Some(ParkedState::Reprocessed) => return Ok(Unparked::AlreadyReprocessed),
            Some(ParkedState::Parked) => {}
        }
        let mut stored = self.insert_batch(std::slice::from_ref(request)).await?;
        let inserted = stored.pop().ok_or_else(|| OutboundError::Fatal("an insert without its answer".into()))?;
        let mut t = self.open()?;
        if let Some(i) = parked::find(&t, ingress_ref) {
            let msg_id = match &inserted {
                Inserted::New { event } => event.msg_id.clone(),
                Inserted::Duplicate { row, .. } => row.msg_id.clone(),
            };
            let now = self.now();
            let p = &mut t.parked[i];
            (p.state, p.reprocessed_at, p.outbound_msg_id) = (ParkedState::Reprocessed, Some(now), msg_id);
        }
        Ok(Unparked::Stored(inserted))
    }

    async fn take_ready(&self, channel: ChannelId, max: BatchSize) -> Result<Batch, OutboundError> {
        let (batch, latency) = self.take_now(channel, max)?;
        tokio::time::sleep(latency).await;
        Ok(batch)
    }

    async fn record(&self, claim: &ClaimToken, outcomes: &[(String, SendResult)]) -> Result<Recorded, OutboundError> {
        let (recorded, latency) = {
            let mut t = self.open()?;
            (record::apply(&mut t, &self.policy, self.now(), claim, outcomes), t.record_latency)
        };
        tokio::time::sleep(latency).await;
        Ok(recorded)
    }

    async fn expire_overdue(&self, max: u32) -> Result<Vec<ResultEvent>, OutboundError> {
        let mut t = self.open()?;
        Ok(self.expire(&mut t, None, max))
    }

    async fn recover_stale_claims(&self, max: u32) -> Result<Vec<ResultEvent>, OutboundError> {
        let mut t = self.open()?;
        Ok(record::recover(&mut t, &self.policy, self.now(), max))
    }

    async fn confirm(&self, reference: &ConfirmRef, verdict: &SpiVerdict) -> Result<ConfirmOutcome, OutboundError> {
        let mut t = self.open()?;
        Ok(record::confirm(&mut t, self.now(), reference, verdict))
    }

    async fn settle_in_doubt(&self, msg_id: &str, settlement: &Settlement) -> Result<Settled, OutboundError> {
        let mut t = self.open()?;
        Ok(record::settle(&mut t, self.now(), msg_id, settlement))
    }

    async fn stored_body(&self, msg_id: &str) -> Result<Option<Bytes>, OutboundError> {
        let t = self.open()?;
        Ok(t.by_msg_id.get(msg_id).map(|i| t.rows[*i].raw.clone()))
    }

    async fn flag_unconfirmed(&self, max: u32) -> Result<Vec<String>, OutboundError> {
        let mut t = self.open()?;
        let now = self.now();
        let after = self.policy.unconfirmed_after;
        let due = t.pick(
            |r| {
                r.status == OutboundStatus::Sent
                    && r.unconfirmed_since.is_none()
                    && r.sent_at.is_some_and(|s| s + after < now)
            },
            |r| r.sent_at,
            max as usize,
        );
        let note = Some(format!("no confirmation {} ms after sending", after.as_millis()));
        Ok(due
            .into_iter()
            .filter_map(|i| {
                t.change(i, now, note.clone(), |r| r.unconfirmed_since = Some(now));
                t.rows[i].msg_id.clone()
            })
            .collect())
    }

    async fn reprocess(&self, msg_id: &str) -> Result<Reprocessed, OutboundError> {
        let mut t = self.open()?;
        let Some(idx) = t.by_msg_id.get(msg_id).copied() else { return Ok(Reprocessed::NotFound) };
        let status = t.rows[idx].status;
        if !matches!(status, OutboundStatus::Dead | OutboundStatus::Rejected) {
            return Ok(Reprocessed::NotAllowed(status));
        }
        let now = self.now();
        let event = t.change(idx, now, Some("reprocessed by an operator".into()), |r| {
            let budget = r.deadline.duration_since(r.created_at).unwrap_or_default();
            (r.status, r.attempts_base, r.not_before, r.last_error) = (OutboundStatus::Queued, r.attempts, now, None);
            r.deadline = now + budget;
        });
        Ok(Reprocessed::Queued(event.expect("queued after dead/rejected is an event")))
    }

    async fn get(&self, msg_id: &str) -> Result<Option<OutboundDetail>, OutboundError> {
        let t = self.open()?;
        Ok(reads::detail(&t, msg_id))
    }

    async fn list(&self, status: OutboundStatus, after: Option<i64>, limit: u32) -> Result<Page, OutboundError> {
        let t = self.open()?;
        Ok(reads::page(&t, status, after, limit))
    }

    async fn depth(&self) -> Result<QueueDepth, OutboundError> {
        let t = self.open()?;
        Ok(reads::depth(&t))
    }
}
