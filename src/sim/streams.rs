//! The stream book of one (ispb, channel): one shared queue of messages and the
//! open streams reading from it. Each response hands out a new pull-next token;
//! following it acknowledges the batch it was issued with, repeating the
//! previous one re-delivers that unacknowledged batch, a stream idle too long
//! is expired and its batch goes back to the head of the queue. Pure state,
//! no I/O: the lane drives it under its mutex.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::generator::Draft;

/// One message on the queue or in a delivered batch.
#[derive(Clone, Debug)]
pub struct Message {
    pub resource_id: Arc<str>,
    pub draft: Arc<Draft>,
    /// Delivered at least once already (a later delivery counts as a redelivery).
    pub delivered_before: bool,
}

impl Message {
    pub fn new(resource_id: Arc<str>, draft: Draft) -> Self {
        Message { resource_id, draft: Arc::new(draft), delivered_before: false }
    }
}

#[derive(Debug)]
struct Stream {
    /// The token that fetched `pending` (repeating it re-delivers), none right after start.
    cursor: Option<Arc<str>>,
    /// The token handed out with `pending` (following it acknowledges).
    next: Arc<str>,
    pending: Vec<Message>,
    /// Bumped by every request: an older request still holding gives way.
    generation: u64,
    /// Requests on this stream being handled now: a busy stream never expires.
    active: u32,
    last_seen: Instant,
}

/// Admission to read on a stream.
#[derive(Debug)]
pub struct Ticket {
    pub stream: u64,
    pub generation: u64,
    pub pull_next: Arc<str>,
    /// The batch this request acknowledged (following the current pull-next).
    pub acked: Vec<Message>,
    /// The unacknowledged batch to send again (repeating the previous pull-next).
    pub redeliver: Option<Vec<Message>>,
    /// Requests on the stream being handled now, this one included (above 1: concurrent reads).
    pub readers: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooManyStreams,
    UnknownToken,
}

/// What a read found on the queue.
#[derive(Debug)]
pub enum Take {
    Batch {
        messages: Vec<Message>,
        first: u64,
        again: u64,
    },
    Empty,
    /// A newer request on the stream (or its closing) took over.
    Superseded,
}

/// Outcome of `DELETE` on a token.
#[derive(Debug)]
pub enum Close {
    /// The current pull-next: its batch is acknowledged.
    Acked(Vec<Message>),
    /// The previous pull-next: the unacknowledged batch went back to the head of the queue.
    Requeued(usize),
    Unknown,
}

#[derive(Debug, Default)]
pub struct Book {
    queue: VecDeque<Message>,
    streams: HashMap<u64, Stream>,
    tokens: HashMap<Arc<str>, u64>,
    next_stream: u64,
}

fn new_token() -> Arc<str> {
    Arc::from(format!("{:032x}", rand::random::<u128>()))
}

impl Book {
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn unacknowledged(&self) -> usize {
        self.streams.values().map(|s| s.pending.len()).sum()
    }

    pub fn enqueue(&mut self, messages: impl IntoIterator<Item = Message>) {
        self.queue.extend(messages);
    }

    /// Forgets everything (control `reset`).
    pub fn clear(&mut self) {
        *self = Book { next_stream: self.next_stream, ..Book::default() };
    }

    /// `GET …/stream/start`.
    pub fn open(&mut self, max_streams: usize, now: Instant) -> Result<Ticket, Refusal> {
        if self.streams.len() >= max_streams {
            return Err(Refusal::TooManyStreams);
        }
        self.next_stream += 1;
        let id = self.next_stream;
        let next = new_token();
        self.tokens.insert(next.clone(), id);
        let stream =
            Stream { cursor: None, next: next.clone(), pending: Vec::new(), generation: 1, active: 1, last_seen: now };
        self.streams.insert(id, stream);
        Ok(Ticket { stream: id, generation: 1, pull_next: next, acked: Vec::new(), redeliver: None, readers: 1 })
    }

    /// `GET` on a pull-next token.
    pub fn follow(&mut self, token: &str, now: Instant) -> Result<Ticket, Refusal> {
        let id = *self.tokens.get(token).ok_or(Refusal::UnknownToken)?;
        let stream = self.streams.get_mut(&id).ok_or(Refusal::UnknownToken)?;
        let mut acked = Vec::new();
        let mut redeliver = None;
        if *stream.next == *token {
            acked = std::mem::take(&mut stream.pending);
            if let Some(old) = stream.cursor.take() {
                self.tokens.remove(&old);
            }
            let fresh = new_token();
            self.tokens.insert(fresh.clone(), id);
            stream.cursor = Some(std::mem::replace(&mut stream.next, fresh));
        } else if !stream.pending.is_empty() {
            redeliver = Some(stream.pending.clone());
        }
        stream.generation += 1;
        stream.active += 1;
        stream.last_seen = now;
        Ok(Ticket {
            stream: id,
            generation: stream.generation,
            pull_next: stream.next.clone(),
            acked,
            redeliver,
            readers: stream.active,
        })
    }

    /// Moves up to `max` messages from the head of the queue into the stream's batch (a request
    /// that already took its batch gets that same batch again).
    pub fn take(&mut self, stream: u64, generation: u64, max: usize) -> Take {
        let Some(s) = self.streams.get_mut(&stream).filter(|s| s.generation == generation) else {
            return Take::Superseded;
        };
        if !s.pending.is_empty() {
            // This request already holds a batch: the same one again, never a second one on top.
            let again = s.pending.len() as u64;
            return Take::Batch { messages: s.pending.clone(), first: 0, again };
        }
        let n = max.min(self.queue.len());
        if n == 0 {
            return Take::Empty;
        }
        let mut messages: Vec<Message> = self.queue.drain(..n).collect();
        let again = messages.iter().filter(|m| m.delivered_before).count() as u64;
        for m in &mut messages {
            m.delivered_before = true;
        }
        s.pending = messages.clone();
        Take::Batch { messages, first: n as u64 - again, again }
    }

    /// A request on the stream ended (answered or abandoned).
    pub fn leave(&mut self, stream: u64, now: Instant) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.active = s.active.saturating_sub(1);
            s.last_seen = now;
        }
    }

    /// `DELETE` on a pull-next token.
    pub fn close(&mut self, token: &str) -> Close {
        let Some(id) = self.tokens.get(token).copied() else {
            return Close::Unknown;
        };
        let Some(stream) = self.remove(id) else {
            return Close::Unknown;
        };
        if *stream.next == *token {
            Close::Acked(stream.pending)
        } else {
            let n = stream.pending.len();
            self.requeue(stream.pending);
            Close::Requeued(n)
        }
    }

    /// Expires streams without a request for longer than `idle`: (streams expired, messages re-queued).
    pub fn expire(&mut self, idle: Duration, now: Instant) -> (u64, u64) {
        let stale: Vec<u64> = self
            .streams
            .iter()
            .filter(|(_, s)| s.active == 0 && now.saturating_duration_since(s.last_seen) > idle)
            .map(|(id, _)| *id)
            .collect();
        let mut requeued = 0;
        for id in &stale {
            if let Some(stream) = self.remove(*id) {
                requeued += stream.pending.len() as u64;
                self.requeue(stream.pending);
            }
        }
        (stale.len() as u64, requeued)
    }

    fn remove(&mut self, id: u64) -> Option<Stream> {
        let stream = self.streams.remove(&id)?;
        self.tokens.remove(&stream.next);
        if let Some(cursor) = &stream.cursor {
            self.tokens.remove(cursor);
        }
        Some(stream)
    }

    /// Puts a batch back at the head of the queue, in its order.
    fn requeue(&mut self, batch: Vec<Message>) {
        for m in batch.into_iter().rev() {
            self.queue.push_front(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn msgs(ids: &[&str]) -> Vec<Message> {
        ids.iter().map(|id| Message::new(Arc::from(*id), Draft::Raw(Bytes::from_static(b"<x/>")))).collect()
    }

    fn ids(batch: &[Message]) -> Vec<&str> {
        batch.iter().map(|m| &*m.resource_id).collect()
    }

    fn read(book: &mut Book, ticket: &Ticket, max: usize) -> Vec<Message> {
        let messages = match book.take(ticket.stream, ticket.generation, max) {
            Take::Batch { messages, .. } => messages,
            other => panic!("expected a batch, got {other:?}"),
        };
        book.leave(ticket.stream, Instant::now());
        messages
    }

    #[test]
    fn following_acknowledges_and_repeating_redelivers() {
        let mut book = Book::default();
        book.enqueue(msgs(&["a", "b", "c"]));
        let now = Instant::now();
        let t0 = book.open(6, now).unwrap();
        assert_eq!(ids(&read(&mut book, &t0, 2)), ["a", "b"]);
        let t1 = book.follow(&t0.pull_next, now).unwrap();
        assert_eq!(ids(&t1.acked), ["a", "b"]);
        assert_eq!(ids(&read(&mut book, &t1, 2)), ["c"]);
        // Repeating the previous pull-next (t0's) re-delivers "c" with the same pull-next.
        let again = book.follow(&t0.pull_next, now).unwrap();
        assert_eq!(ids(again.redeliver.as_deref().unwrap()), ["c"]);
        assert!(again.acked.is_empty());
        assert_eq!(again.pull_next, t1.pull_next);
        book.leave(again.stream, now);
        let t2 = book.follow(&t1.pull_next, now).unwrap();
        assert_eq!(ids(&t2.acked), ["c"]);
        // Two steps back is unknown.
        assert_eq!(book.follow(&t0.pull_next, now).unwrap_err(), Refusal::UnknownToken);
        assert_eq!(book.follow("nope", now).unwrap_err(), Refusal::UnknownToken);
    }

    #[test]
    fn the_seventh_stream_is_refused() {
        let mut book = Book::default();
        for _ in 0..6 {
            book.open(6, Instant::now()).unwrap();
        }
        assert_eq!(book.open(6, Instant::now()).unwrap_err(), Refusal::TooManyStreams);
        assert_eq!(book.open_streams(), 6);
    }

    #[test]
    fn an_idle_stream_expires_and_its_batch_goes_back_to_the_head() {
        let mut book = Book::default();
        book.enqueue(msgs(&["a", "b", "c", "d"]));
        let t0 = book.open(6, Instant::now()).unwrap();
        assert_eq!(ids(&read(&mut book, &t0, 2)), ["a", "b"]);
        assert_eq!(book.expire(Duration::from_secs(60), Instant::now()), (0, 0));
        let later = Instant::now() + Duration::from_secs(61);
        assert_eq!(book.expire(Duration::from_secs(60), later), (1, 2));
        assert_eq!(book.follow(&t0.pull_next, later).unwrap_err(), Refusal::UnknownToken);
        let t = book.open(6, later).unwrap();
        match book.take(t.stream, t.generation, 10) {
            Take::Batch { messages, first, again } => {
                assert_eq!(ids(&messages), ["a", "b", "c", "d"]);
                assert_eq!((first, again), (2, 2));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_busy_stream_does_not_expire() {
        let mut book = Book::default();
        let t0 = book.open(6, Instant::now()).unwrap();
        assert_eq!(book.expire(Duration::ZERO, Instant::now() + Duration::from_secs(1)), (0, 0));
        book.leave(t0.stream, Instant::now());
        assert_eq!(book.expire(Duration::ZERO, Instant::now() + Duration::from_secs(1)), (1, 0));
    }

    #[test]
    fn delete_acknowledges_with_the_current_token_and_requeues_with_the_previous() {
        let mut book = Book::default();
        book.enqueue(msgs(&["a", "b", "c"]));
        let t0 = book.open(6, Instant::now()).unwrap();
        read(&mut book, &t0, 1);
        match book.close(&t0.pull_next) {
            Close::Acked(batch) => assert_eq!(ids(&batch), ["a"]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(book.close(&t0.pull_next), Close::Unknown));
        let t1 = book.open(6, Instant::now()).unwrap();
        read(&mut book, &t1, 1);
        let t2 = book.follow(&t1.pull_next, Instant::now()).unwrap();
        read(&mut book, &t2, 1);
        // t1's token is now the previous one: closing with it gives "c" back.
        assert!(matches!(book.close(&t1.pull_next), Close::Requeued(1)));
        assert_eq!(book.queued(), 1);
        assert_eq!(book.open_streams(), 0);
    }

    #[test]
    fn a_newer_request_supersedes_a_holding_one() {
        let mut book = Book::default();
        let t0 = book.open(6, Instant::now()).unwrap();
        let t1 = book.follow(&t0.pull_next, Instant::now()).unwrap();
        let t1_again = book.follow(&t0.pull_next, Instant::now()).unwrap();
        book.enqueue(msgs(&["a"]));
        assert!(matches!(book.take(t1.stream, t1.generation, 10), Take::Superseded));
        assert!(matches!(book.take(t1_again.stream, t1_again.generation, 10), Take::Batch { .. }));
    }
}

#[cfg(test)]
mod properties {
    use std::collections::HashSet;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Enqueue(u8),
        Open,
        Read { stream: usize, max: usize },
        FollowNext(usize),
        FollowPrevious(usize),
        CloseNext(usize),
        ClosePrevious(usize),
        Expire,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u8..20).prop_map(Op::Enqueue),
            Just(Op::Open),
            (0usize..8, 1usize..=10).prop_map(|(stream, max)| Op::Read { stream, max }),
            (0usize..8).prop_map(Op::FollowNext),
            (0usize..8).prop_map(Op::FollowPrevious),
            (0usize..8).prop_map(Op::CloseNext),
            (0usize..8).prop_map(Op::ClosePrevious),
            Just(Op::Expire),
        ]
    }

    /// What the client side remembers of a stream: its last ticket and the token before it.
    struct Client {
        ticket: Ticket,
        previous: Option<Arc<str>>,
    }

    proptest! {
        /// Whatever a client does, every message is in exactly one place — queued, in an
        /// unacknowledged batch, or acknowledged — and nothing is acknowledged twice.
        #[test]
        fn no_message_is_lost_or_acknowledged_twice(ops in proptest::collection::vec(op(), 1..120)) {
            let mut book = Book::default();
            let mut clients: Vec<Client> = Vec::new();
            let mut acked: Vec<Arc<str>> = Vec::new();
            let mut made = 0u32;
            let now = Instant::now();
            for op in ops {
                match op {
                    Op::Enqueue(n) => {
                        book.enqueue((0..n).map(|_| {
                            made += 1;
                            Message::new(Arc::from(made.to_string()), Draft::Raw(Bytes::new()))
                        }));
                    }
                    Op::Open => {
                        if let Ok(ticket) = book.open(6, now) {
                            clients.push(Client { ticket, previous: None });
                        }
                    }
                    Op::Read { stream, max } => {
                        if let Some(c) = clients.get(stream) {
                            book.take(c.ticket.stream, c.ticket.generation, max);
                            book.leave(c.ticket.stream, now);
                        }
                    }
                    Op::FollowNext(i) | Op::FollowPrevious(i) => {
                        let Some(c) = clients.get_mut(i) else { continue };
                        let token = match op {
                            Op::FollowNext(_) => c.ticket.pull_next.clone(),
                            _ => match &c.previous { Some(p) => p.clone(), None => continue },
                        };
                        if let Ok(ticket) = book.follow(&token, now) {
                            acked.extend(ticket.acked.iter().map(|m| m.resource_id.clone()));
                            book.leave(ticket.stream, now);
                            if ticket.pull_next != c.ticket.pull_next {
                                c.previous = Some(c.ticket.pull_next.clone());
                            }
                            c.ticket = ticket;
                        }
                    }
                    Op::CloseNext(i) | Op::ClosePrevious(i) => {
                        let Some(c) = clients.get(i) else { continue };
                        let token = match op {
                            Op::CloseNext(_) => c.ticket.pull_next.clone(),
                            _ => match &c.previous { Some(p) => p.clone(), None => continue },
                        };
                        if let Close::Acked(batch) = book.close(&token) {
                            acked.extend(batch.iter().map(|m| m.resource_id.clone()));
                        }
                    }
                    Op::Expire => {
                        book.expire(Duration::ZERO, now + Duration::from_secs(1));
                    }
                }
                let mut seen: HashSet<Arc<str>> = HashSet::new();
                for id in acked.iter().chain(book.queue.iter().map(|m| &m.resource_id)) {
                    prop_assert!(seen.insert(id.clone()), "{id} twice");
                }
                for s in book.streams.values() {
                    for m in &s.pending {
                        prop_assert!(seen.insert(m.resource_id.clone()), "{} twice", m.resource_id);
                    }
                }
                prop_assert_eq!(seen.len(), made as usize);
                prop_assert!(book.open_streams() <= 6);
            }
        }
    }
}
