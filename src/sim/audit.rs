//! What the simulator saw, as the judge of cabine's invariants: counters per
//! (ispb, channel) with their peaks, the ledger of acknowledged ResourceIds
//! (the Central Bank's "truth" for reconciliation) and the log of messages
//! received from participants. Both logs are bounded rings.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize, Serializer};

/// A live count with its high-water mark.
#[derive(Debug, Default)]
pub struct Gauge {
    now: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    /// Adds one and returns the new value (the peak follows).
    pub fn enter(&self) -> u64 {
        let now = self.now.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(now, Ordering::AcqRel);
        now
    }

    pub fn leave(&self) {
        let _ = self.now.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }

    /// Sets the value (for counts kept elsewhere, e.g. open streams), raising the peak.
    pub fn set(&self, value: u64) {
        self.now.store(value, Ordering::Release);
        self.peak.fetch_max(value, Ordering::AcqRel);
    }

    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Forgets the peak (keeps the live value, which is still true).
    pub fn reset_peak(&self) {
        self.peak.store(self.now(), Ordering::Release);
    }
}

/// A high-water mark of something counted elsewhere (e.g. requests on one stream).
#[derive(Debug, Default)]
pub struct Peak(AtomicU64);

impl Peak {
    pub fn raise(&self, value: u64) {
        self.0.fetch_max(value, Ordering::AcqRel);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
    pub fn clear(&self) {
        self.0.store(0, Ordering::Release);
    }
}

/// A plain counter.
#[derive(Debug, Default)]
pub struct Count(AtomicU64);

impl Count {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn clear(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// Every counter of one (ispb, channel).
#[derive(Debug, Default)]
pub struct LaneCounters {
    pub in_flight: Gauge,
    pub in_flight_streams: Gauge,
    pub in_flight_sends: Gauge,
    pub tcp_connections: Gauge,
    pub open_streams: Gauge,
    /// Reads that began on a stream while another request on it was still being handled.
    pub concurrent_reads: Count,
    /// Most requests handled at once on one stream.
    pub reads_per_stream: Peak,
    pub rejected_429: Count,
    pub rejected_streams: Count,
    pub rejected_in_flight: Count,
    pub rejected_rate: Count,
    pub fault_429: Count,
    pub fault_5xx: Count,
    pub fault_4xx_sends: Count,
    pub send_requests: Count,
    pub fault_resets: Count,
    pub injected: Count,
    pub replies: Count,
    pub delivered: Count,
    pub redelivered: Count,
    pub acknowledged: Count,
    pub expired_streams: Count,
    pub received_outbound: Count,
    pub duplicates_outbound: Count,
    pub malformed_outbound: Count,
    pub refused_sends: Count,
}

impl LaneCounters {
    /// Back to zero; live gauges keep their value and restart their peak from it.
    pub fn clear(&self) {
        for g in [&self.in_flight, &self.in_flight_streams, &self.in_flight_sends, &self.tcp_connections] {
            g.reset_peak();
        }
        self.open_streams.set(0);
        self.open_streams.reset_peak();
        self.reads_per_stream.clear();
        for c in [
            &self.concurrent_reads,
            &self.rejected_429,
            &self.rejected_streams,
            &self.rejected_in_flight,
            &self.rejected_rate,
            &self.fault_429,
            &self.fault_5xx,
            &self.fault_4xx_sends,
            &self.send_requests,
            &self.fault_resets,
            &self.injected,
            &self.replies,
            &self.delivered,
            &self.redelivered,
            &self.acknowledged,
            &self.expired_streams,
            &self.received_outbound,
            &self.duplicates_outbound,
            &self.malformed_outbound,
            &self.refused_sends,
        ] {
            c.clear();
        }
    }
}

/// `GET /sim/audit`: the generator's seed and every (ispb, channel).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuditReport {
    pub seed: u64,
    pub lanes: Vec<LaneAudit>,
}

/// `GET /sim/audit`: one (ispb, channel).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneAudit {
    pub ispb: String,
    /// `cpm` or `csm`.
    pub channel: String,
    pub open_streams: u64,
    pub max_open_streams: u64,
    /// Reads (GET on a pull-next) that began while another request on the same stream was still
    /// being handled (held or answered): two clients believe they own one stream.
    pub concurrent_reads: u64,
    /// Most requests handled at once on one stream (1 for a client that waits for each answer).
    pub max_reads_per_stream: u64,
    /// Requests being handled now / at most at once (both endpoints, refused ones included).
    pub in_flight: u64,
    pub max_in_flight: u64,
    pub max_in_flight_streams: u64,
    pub max_in_flight_sends: u64,
    pub tcp_connections: u64,
    pub max_tcp_connections: u64,
    /// Every 429 answered, whatever the cause; the causes follow.
    pub rejected_429: u64,
    pub rejected_streams: u64,
    pub rejected_in_flight: u64,
    pub rejected_rate: u64,
    pub fault_429: u64,
    pub fault_5xx: u64,
    /// POSTs answered 403 by the `reject_sends_ratio` fault.
    pub fault_4xx_sends: u64,
    /// Every request that reached the send endpoint (refused or faulted ones included):
    /// what the breaker tests count.
    pub send_requests: u64,
    pub fault_resets: u64,
    /// Messages put on the queue by `/sim/inject` and as replies to sends.
    pub injected: u64,
    pub replies: u64,
    /// First deliveries / deliveries again (repeated pull-next, or after an expiry re-queue).
    pub delivered: u64,
    pub redelivered: u64,
    pub acknowledged: u64,
    /// Queued, not delivered (or delivered and re-queued).
    pub pending: u64,
    /// Delivered, not yet acknowledged.
    pub unacknowledged: u64,
    pub expired_streams: u64,
    pub received_outbound: u64,
    pub duplicates_outbound: u64,
    pub malformed_outbound: u64,
    /// POSTs refused with a 4xx (nothing stored).
    pub refused_sends: u64,
}

fn as_str<S: Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

/// One acknowledged ResourceId.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerEntry {
    pub seq: u64,
    #[serde(serialize_with = "as_str")]
    pub ispb: Arc<str>,
    pub channel: &'static str,
    #[serde(serialize_with = "as_str")]
    pub resource_id: Arc<str>,
    pub acked_at_ms: u64,
}

/// The messages received from participants, or the acknowledgements: a ring with sequence numbers.
#[derive(Debug)]
pub struct Ring<T> {
    entries: VecDeque<T>,
    /// Sequence number of `entries[0]`.
    first_seq: u64,
    cap: usize,
}

/// A page of a ring after `since`.
#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub entries: Vec<T>,
    /// Pass as `since` for the next page.
    pub next_since: u64,
    /// The oldest sequence number still kept (older ones were dropped: the ring is bounded).
    pub oldest_seq: u64,
}

impl<T: Clone> Ring<T> {
    pub fn new(cap: usize) -> Self {
        Ring { entries: VecDeque::new(), first_seq: 1, cap: cap.max(1) }
    }

    /// The sequence number the next pushed entry gets.
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.entries.len() as u64
    }

    pub fn push(&mut self, entry: T) {
        if self.entries.len() == self.cap {
            self.entries.pop_front();
            self.first_seq += 1;
        }
        self.entries.push_back(entry);
    }

    /// Every entry kept, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter()
    }

    pub fn clear(&mut self) {
        self.first_seq = self.next_seq();
        self.entries.clear();
    }

    /// Entries with a sequence number above `since` that pass `keep`, at most `limit`.
    pub fn page(&self, since: u64, limit: usize, keep: impl Fn(&T) -> bool) -> Page<T> {
        let start = since.saturating_add(1).max(self.first_seq);
        let skip = (start - self.first_seq) as usize;
        let mut entries = Vec::new();
        let mut next_since = since.max(self.first_seq.saturating_sub(1));
        for (i, e) in self.entries.iter().enumerate().skip(skip) {
            if entries.len() == limit {
                break;
            }
            next_since = self.first_seq + i as u64;
            if keep(e) {
                entries.push(e.clone());
            }
        }
        Page { entries, next_since, oldest_seq: self.first_seq }
    }
}

/// What happened to a message a participant sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboundOutcome {
    Accepted,
    Duplicate,
    Malformed,
}

/// One message received on `POST …/msgs`.
#[derive(Clone, Debug, Serialize)]
pub struct OutboundRecord {
    pub seq: u64,
    #[serde(serialize_with = "as_str")]
    pub ispb: Arc<str>,
    pub channel: &'static str,
    #[serde(serialize_with = "as_str")]
    pub resource_id: Arc<str>,
    pub received_at_ms: u64,
    pub outcome: OutboundOutcome,
    pub msg_def: Option<String>,
    pub biz_msg_id: Option<String>,
    pub msg_id: Option<String>,
    pub end_to_end_ids: Vec<String>,
    pub from: Option<String>,
    /// Why it was malformed.
    pub reason: Option<String>,
    #[serde(skip)]
    pub body: Bytes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_pages_after_since_and_forgets_the_oldest() {
        let mut ring = Ring::new(3);
        for n in 1..=5u64 {
            assert_eq!(ring.next_seq(), n);
            ring.push(n);
        }
        let page = ring.page(0, 10, |_| true);
        assert_eq!(page.entries, vec![3, 4, 5]);
        assert_eq!((page.next_since, page.oldest_seq), (5, 3));
        let page = ring.page(3, 1, |_| true);
        assert_eq!((page.entries, page.next_since), (vec![4], 4));
        let page = ring.page(0, 10, |n| n % 2 == 1);
        assert_eq!((page.entries, page.next_since), (vec![3, 5], 5));
        assert!(ring.page(5, 10, |_| true).entries.is_empty());
        ring.clear();
        assert_eq!(ring.next_seq(), 6);
    }

    #[test]
    fn a_gauge_keeps_its_peak() {
        let g = Gauge::default();
        g.enter();
        g.enter();
        g.leave();
        assert_eq!((g.now(), g.peak()), (1, 2));
        g.reset_peak();
        assert_eq!(g.peak(), 1);
    }
}
