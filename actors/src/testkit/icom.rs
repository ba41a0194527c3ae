//! In-memory ICOM server with the stream semantics of DESIGN §1: `start` opens
//! a stream (429 beyond `max_streams`), every answer carries a new pull-next,
//! a GET on it acknowledges the previous batch, repeating the previous
//! pull-next redelivers the unacknowledged batch with the same resource ids,
//! an unknown token is 404, DELETE acknowledges and closes, an idle stream
//! expires and its batch is queued again. Messages of a channel are split
//! across its open streams; an empty GET is held for `hold`. Like a real
//! server, a request is served to its end even if its client went away (it
//! stays in flight and can still be handed a batch, which then waits
//! unacknowledged on its stream), and several requests may read one stream at
//! once (each may be handed its own batch; the next GET on the current
//! pull-next acknowledges them all). It counts what the judge needs: open
//! streams, concurrent requests, concurrent reads of one stream, connections,
//! delivered vs acknowledged, and acknowledgements of messages not yet in the inbox.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::ports::{InboundMessage, MessageMeta, PollOutcome};

pub use super::icom_conn::{FakeConnector, RequestKind, RequestRecord};

#[derive(Clone, Debug)]
pub struct FakeIcomSettings {
    pub max_streams: usize,
    pub max_in_flight: usize,
    pub hold: Duration,
    pub batch_max: usize,
    pub idle_expiry: Option<Duration>,
}

impl Default for FakeIcomSettings {
    fn default() -> Self {
        FakeIcomSettings {
            max_streams: 6,
            max_in_flight: 6,
            hold: Duration::from_secs(1),
            batch_max: 10,
            idle_expiry: None,
        }
    }
}

/// Per-channel figures for assertions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IcomAudit {
    pub injected: u64,
    /// Messages sent in answers, redeliveries included.
    pub delivered: u64,
    pub redelivered: u64,
    /// Distinct messages acknowledged, and acknowledgements of an already acknowledged one.
    pub acked: u64,
    pub acked_twice: u64,
    /// Acknowledgements of a message the inbox did not hold yet (invariant 2 broken).
    pub acked_before_commit: u64,
    pub streams_started: u64,
    pub streams_closed: u64,
    pub streams_expired: u64,
    pub open_streams: usize,
    pub max_open_streams: usize,
    pub max_in_flight: usize,
    /// Reads that began while another request on the same stream was still being served:
    /// two pods believed they owned one slot.
    pub concurrent_reads: u64,
    pub connections: usize,
    pub max_connections: usize,
    /// 429 answers: a start beyond `max_streams`, a request beyond `max_in_flight`.
    pub too_many_streams: u64,
    pub rate_limited: u64,
    /// Messages waiting for a stream, and delivered but not acknowledged.
    pub pending: usize,
    pub unacked: usize,
}

/// Decides, at acknowledgement time, whether a message is safely persisted.
pub type AckJudge = Box<dyn Fn(ChannelId, &str) -> bool + Send + Sync>;

pub(super) struct StreamRec {
    pub(super) token: String,
    pub(super) prev: Option<String>,
    pub(super) seq: u64,
    pub(super) unacked: Vec<InboundMessage>,
    pub(super) last_used: Instant,
    /// Requests on this stream being served now.
    pub(super) active: u32,
}

#[derive(Default)]
pub(super) struct ChannelTable {
    pub(super) pending: VecDeque<InboundMessage>,
    pub(super) streams: BTreeMap<u64, StreamRec>,
    pub(super) in_flight: usize,
    pub(super) scripted: VecDeque<PollOutcome>,
    /// While set, every request of the channel, from every pod, gets this answer.
    pub(super) outage: Option<PollOutcome>,
    pub(super) audit: IcomAudit,
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) channels: HashMap<ChannelId, ChannelTable>,
    pub(super) next_id: u64,
    pub(super) acked: HashMap<String, u32>,
    pub(super) log: Vec<RequestRecord>,
}

pub struct FakeIcom {
    pub(super) settings: FakeIcomSettings,
    pub(super) table: Mutex<Table>,
    pub(super) arrivals: Notify,
    pub(super) judge: Mutex<Option<AckJudge>>,
}

impl FakeIcom {
    pub fn new(settings: FakeIcomSettings) -> Arc<Self> {
        Arc::new(FakeIcom { settings, table: Mutex::default(), arrivals: Notify::new(), judge: Mutex::default() })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_ack_judge(&self, judge: AckJudge) {
        *self.judge.lock().unwrap_or_else(|p| p.into_inner()) = Some(judge);
    }

    /// Queues messages for the channel's streams.
    pub fn inject(&self, channel: ChannelId, messages: impl IntoIterator<Item = InboundMessage>) {
        let mut t = self.lock();
        let ch = t.channels.entry(channel).or_default();
        for m in messages {
            ch.pending.push_back(m);
            ch.audit.injected += 1;
        }
        drop(t);
        self.arrivals.notify_waiters();
    }

    /// The next requests on the channel get these answers, without touching any stream.
    pub fn script(&self, channel: ChannelId, outcomes: impl IntoIterator<Item = PollOutcome>) {
        self.lock().channels.entry(channel).or_default().scripted.extend(outcomes);
    }

    /// Every request of the channel gets `answer` (e.g. a 503) until called with `None`.
    pub fn set_outage(&self, channel: ChannelId, answer: Option<PollOutcome>) {
        self.lock().channels.entry(channel).or_default().outage = answer;
    }

    pub fn audit(&self, channel: ChannelId) -> IcomAudit {
        let mut t = self.lock();
        let ch = t.channels.entry(channel).or_default();
        let mut audit = ch.audit.clone();
        audit.open_streams = ch.streams.len();
        audit.pending = ch.pending.len();
        audit.unacked = ch.streams.values().map(|s| s.unacked.len()).sum();
        audit
    }

    /// Every request so far, in order.
    pub fn log(&self) -> Vec<RequestRecord> {
        self.lock().log.clone()
    }

    /// The stream ids currently open on the channel.
    pub fn open_stream_ids(&self, channel: ChannelId) -> Vec<u64> {
        self.lock().channels.get(&channel).map(|c| c.streams.keys().copied().collect()).unwrap_or_default()
    }

    pub(super) fn ack(
        &self,
        channel: ChannelId,
        ch: &mut ChannelTable,
        acked: &mut HashMap<String, u32>,
        batch: Vec<InboundMessage>,
    ) {
        let judge = self.judge.lock().unwrap_or_else(|p| p.into_inner());
        for m in batch {
            if judge.as_ref().is_some_and(|j| !j(channel, &m.resource_id)) {
                ch.audit.acked_before_commit += 1;
            }
            let times = acked.entry(m.resource_id).or_default();
            *times += 1;
            if *times == 1 {
                ch.audit.acked += 1;
            } else {
                ch.audit.acked_twice += 1;
            }
        }
    }

    /// Expires idle streams, queueing their unacknowledged batch again.
    pub(super) fn expire_idle(&self, ch: &mut ChannelTable) {
        let Some(idle) = self.settings.idle_expiry else { return };
        let now = Instant::now();
        let expired: Vec<u64> =
            ch.streams.iter().filter(|(_, s)| now - s.last_used > idle).map(|(id, _)| *id).collect();
        for id in expired {
            if let Some(s) = ch.streams.remove(&id) {
                ch.audit.streams_expired += 1;
                for m in s.unacked.into_iter().rev() {
                    ch.pending.push_front(m);
                }
                self.arrivals.notify_waiters();
            }
        }
    }

    /// Serves one read on stream `id`: a batch as soon as one is pending, else
    /// `Empty` after `hold`. `fresh_token` issues a new pull-next.
    pub(super) async fn read(&self, channel: ChannelId, id: u64, fresh_token: bool) -> PollOutcome {
        let _reading = Reading::begin(self, channel, id);
        let deadline = Instant::now() + self.settings.hold;
        loop {
            let arrival = self.arrivals.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            if let Some(outcome) = self.try_read(channel, id, fresh_token, Instant::now() >= deadline) {
                return outcome;
            }
            tokio::select! {
                _ = arrival => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn try_read(&self, channel: ChannelId, id: u64, fresh_token: bool, give_up: bool) -> Option<PollOutcome> {
        let mut t = self.lock();
        let ch = t.channels.entry(channel).or_default();
        let take = ch.pending.len().min(self.settings.batch_max);
        if take == 0 && !give_up {
            return None;
        }
        if !ch.streams.contains_key(&id) {
            // Expired (or closed) while we waited: nothing is handed out.
            return Some(PollOutcome::UnknownStream);
        }
        let batch: Vec<InboundMessage> = ch.pending.drain(..take).collect();
        ch.audit.delivered += batch.len() as u64;
        let s = ch.streams.get_mut(&id)?;
        if fresh_token {
            s.seq += 1;
            s.token = format!("/api/v1/out/99999010/stream/{id}-{}", s.seq);
        }
        s.unacked.extend(batch.iter().cloned());
        s.last_used = Instant::now();
        let pull_next = s.token.clone();
        Some(if batch.is_empty() {
            PollOutcome::Empty { pull_next }
        } else {
            PollOutcome::Messages { batch, pull_next }
        })
    }
}

/// A read on one stream while it is being served: counts concurrent reads.
struct Reading<'a> {
    icom: &'a FakeIcom,
    channel: ChannelId,
    id: u64,
}

impl<'a> Reading<'a> {
    fn begin(icom: &'a FakeIcom, channel: ChannelId, id: u64) -> Self {
        let mut t = icom.lock();
        let ch = t.channels.entry(channel).or_default();
        if let Some(s) = ch.streams.get_mut(&id) {
            if s.active > 0 {
                ch.audit.concurrent_reads += 1;
            }
            s.active += 1;
        }
        Reading { icom, channel, id }
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut t = self.icom.lock();
        if let Some(s) = t.channels.entry(self.channel).or_default().streams.get_mut(&self.id) {
            s.active = s.active.saturating_sub(1);
            s.last_used = Instant::now();
        }
    }
}

/// A well-formed inbound message (a pacs.008) with this resource id.
pub fn message(resource_id: &str) -> InboundMessage {
    let raw = format!("<Envelope><AppHdr><BizMsgIdr>M99999010{resource_id}</BizMsgIdr></AppHdr></Envelope>");
    InboundMessage {
        resource_id: resource_id.to_owned(),
        raw: Bytes::from(raw),
        meta: MessageMeta { msg_def: Some("pacs.008.spi.1.16".into()), ..Default::default() },
        malformed: None,
    }
}

/// A message the client could not read, marked malformed with `reason`.
pub fn malformed(resource_id: &str, reason: &str) -> InboundMessage {
    InboundMessage {
        resource_id: resource_id.to_owned(),
        raw: Bytes::from_static(b"<Envelope><AppHdr>"),
        meta: MessageMeta::default(),
        malformed: Some(reason.to_owned()),
    }
}
