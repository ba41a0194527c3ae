//! One (ispb, channel) of the simulator: its stream book behind a mutex, the
//! wake-up for long-polls, its counters and its token bucket. `read` is the
//! long-poll of DESIGN §1: acknowledge, re-deliver, or hold until messages
//! arrive or the hold time passes.

use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cabine_actors::domain::ChannelId;
use tokio::sync::Notify;

use super::audit::{LaneAudit, LaneCounters, LedgerEntry, Ring};
use super::bucket::TokenBucket;
use super::clock::{SimClock, unix_millis};
use super::streams::{Book, Close, Message, Refusal, Take, Ticket};

/// The acknowledged ResourceIds of every lane.
pub type Ledger = Mutex<Ring<LedgerEntry>>;

pub struct Lane {
    pub ispb: Arc<str>,
    pub channel: ChannelId,
    book: Mutex<Book>,
    arrivals: Notify,
    pub counters: LaneCounters,
    pub bucket: Mutex<TokenBucket>,
    /// `/api/v1/out/{ispb}/stream/`
    pub pull_prefix: String,
    ledger: Arc<Ledger>,
    clock: Arc<dyn SimClock>,
}

/// What a read answers.
#[derive(Debug)]
pub enum ReadOutcome {
    Batch { messages: Vec<Message>, pull_next: Arc<str> },
    Empty { pull_next: Arc<str> },
    TooManyStreams,
    UnknownToken,
}

/// How a read may go.
#[derive(Clone, Copy, Debug)]
pub struct ReadRules {
    pub max_messages: usize,
    pub hold: Duration,
    pub max_streams: usize,
}

/// Keeps a stream "busy" (not expirable) while a request on it is being handled, even if abandoned.
struct Presence<'a> {
    lane: &'a Lane,
    stream: u64,
}

impl Drop for Presence<'_> {
    fn drop(&mut self) {
        self.lane.book().leave(self.stream, Instant::now());
    }
}

impl Lane {
    pub fn new(
        ispb: Arc<str>,
        channel: ChannelId,
        bucket: TokenBucket,
        ledger: Arc<Ledger>,
        clock: Arc<dyn SimClock>,
    ) -> Self {
        let pull_prefix = format!("/api/v1/out/{ispb}/stream/");
        Lane {
            ispb,
            channel,
            book: Mutex::new(Book::default()),
            arrivals: Notify::new(),
            counters: LaneCounters::default(),
            bucket: Mutex::new(bucket),
            pull_prefix,
            ledger,
            clock,
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn queued(&self) -> usize {
        self.book().queued()
    }

    /// Appends messages to the queue and wakes the long-polls.
    pub fn enqueue(&self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        self.book().enqueue(messages);
        self.arrivals.notify_waiters();
    }

    /// `start` (token `None`) or `GET` on a pull-next. Other requests may read the same stream at
    /// once: none gives way, each may be handed its own batch, all are answered with the stream's
    /// current pull-next.
    pub async fn read(&self, token: Option<&str>, rules: ReadRules) -> ReadOutcome {
        let admitted = {
            let mut book = self.book();
            let ticket = match token {
                None => book.open(rules.max_streams, Instant::now()),
                Some(t) => book.follow(t, Instant::now()),
            };
            self.counters.open_streams.set(book.open_streams() as u64);
            ticket
        };
        let ticket = match admitted {
            Ok(t) => t,
            Err(Refusal::TooManyStreams) => {
                self.counters.rejected_streams.add(1);
                return ReadOutcome::TooManyStreams;
            }
            Err(Refusal::UnknownToken) => return ReadOutcome::UnknownToken,
        };
        let _presence = Presence { lane: self, stream: ticket.stream };
        self.count_readers(ticket.readers);
        self.acknowledge(&ticket.acked);
        if let Some(messages) = ticket.redeliver {
            self.counters.redelivered.add(messages.len() as u64);
            return ReadOutcome::Batch { messages, pull_next: ticket.pull_next };
        }
        self.hold(&ticket, rules).await
    }

    /// Waits for messages until the hold passes: a batch of the request's own, or empty.
    async fn hold(&self, ticket: &Ticket, rules: ReadRules) -> ReadOutcome {
        let deadline = tokio::time::Instant::now() + rules.hold;
        loop {
            let mut arrival = pin!(self.arrivals.notified());
            arrival.as_mut().enable();
            let took = self.book().take(ticket.stream, rules.max_messages);
            match took {
                Take::Batch { messages, first, again, pull_next } => {
                    self.counters.delivered.add(first);
                    self.counters.redelivered.add(again);
                    return ReadOutcome::Batch { messages, pull_next };
                }
                Take::Gone => return ReadOutcome::Empty { pull_next: ticket.pull_next.clone() },
                Take::Empty => {}
            }
            if tokio::time::timeout_at(deadline, arrival).await.is_err() {
                let current = self.book().pull_next(ticket.stream);
                return ReadOutcome::Empty { pull_next: current.unwrap_or_else(|| ticket.pull_next.clone()) };
            }
        }
    }

    /// A read began on a stream with `readers` requests on it now (itself included).
    fn count_readers(&self, readers: u32) {
        self.counters.reads_per_stream.raise(u64::from(readers));
        if readers > 1 {
            self.counters.concurrent_reads.add(1);
        }
    }

    /// `DELETE` on a pull-next: true when the stream existed.
    pub fn close(&self, token: &str) -> bool {
        let closed = {
            let mut book = self.book();
            let closed = book.close(token);
            self.counters.open_streams.set(book.open_streams() as u64);
            closed
        };
        match closed {
            Close::Acked(batch) => {
                self.acknowledge(&batch);
                true
            }
            Close::Requeued(n) => {
                if n > 0 {
                    self.arrivals.notify_waiters();
                }
                true
            }
            Close::Unknown => false,
        }
    }

    /// Expires idle streams, re-queueing their batches at the head.
    pub fn expire_idle(&self, idle: Duration) {
        let (expired, requeued) = {
            let mut book = self.book();
            let r = book.expire(idle, Instant::now());
            self.counters.open_streams.set(book.open_streams() as u64);
            r
        };
        self.counters.expired_streams.add(expired);
        if requeued > 0 {
            self.arrivals.notify_waiters();
        }
    }

    fn acknowledge(&self, batch: &[Message]) {
        if batch.is_empty() {
            return;
        }
        self.counters.acknowledged.add(batch.len() as u64);
        let at = unix_millis(self.clock.now());
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        for m in batch {
            let seq = ledger.next_seq();
            ledger.push(LedgerEntry {
                seq,
                ispb: self.ispb.clone(),
                channel: self.channel.as_str(),
                resource_id: m.resource_id.clone(),
                acked_at_ms: at,
            });
        }
    }

    /// Forgets the queue, the streams and the counters; wakes every long-poll.
    pub fn clear(&self, bucket: TokenBucket) {
        self.book().clear();
        self.counters.clear();
        *self.bucket.lock().unwrap_or_else(PoisonError::into_inner) = bucket;
        self.arrivals.notify_waiters();
    }

    pub fn audit(&self) -> LaneAudit {
        let (open, queued, unacked) = {
            let book = self.book();
            (book.open_streams() as u64, book.queued() as u64, book.unacknowledged() as u64)
        };
        let c = &self.counters;
        LaneAudit {
            ispb: self.ispb.to_string(),
            channel: self.channel.as_str().to_owned(),
            open_streams: open,
            max_open_streams: c.open_streams.peak(),
            concurrent_reads: c.concurrent_reads.get(),
            max_reads_per_stream: c.reads_per_stream.get(),
            in_flight: c.in_flight.now(),
            max_in_flight: c.in_flight.peak(),
            max_in_flight_streams: c.in_flight_streams.peak(),
            max_in_flight_sends: c.in_flight_sends.peak(),
            tcp_connections: c.tcp_connections.now(),
            max_tcp_connections: c.tcp_connections.peak(),
            rejected_429: c.rejected_429.get(),
            rejected_streams: c.rejected_streams.get(),
            rejected_in_flight: c.rejected_in_flight.get(),
            rejected_rate: c.rejected_rate.get(),
            fault_429: c.fault_429.get(),
            fault_5xx: c.fault_5xx.get(),
            fault_4xx_sends: c.fault_4xx_sends.get(),
            send_requests: c.send_requests.get(),
            fault_resets: c.fault_resets.get(),
            injected: c.injected.get(),
            replies: c.replies.get(),
            delivered: c.delivered.get(),
            redelivered: c.redelivered.get(),
            acknowledged: c.acknowledged.get(),
            pending: queued,
            unacknowledged: unacked,
            expired_streams: c.expired_streams.get(),
            received_outbound: c.received_outbound.get(),
            duplicates_outbound: c.duplicates_outbound.get(),
            malformed_outbound: c.malformed_outbound.get(),
            refused_sends: c.refused_sends.get(),
        }
    }
}
