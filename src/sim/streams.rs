//! The stream book of one (ispb, channel): one shared queue of messages and the
//! open streams reading from it, counted like a real ICOM server. Each answer
//! carries the stream's current pull-next; a GET on it acknowledges every
//! message handed out on the stream so far, repeating the previous one
//! re-delivers them all. Several requests may read one stream at once (a
//! client that gave up on a held GET while the server still holds it, two
//! pods that both think they own the stream): none gives way to another, each
//! may be handed its own batch, and every batch waits on the stream,
//! unacknowledged, until the next GET on the current pull-next. A stream idle
//! too long is expired and what it had pending goes back to the head of the
//! queue. Pure state, no I/O: the lane drives it under its mutex.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::generator::Draft;

/// One message on the queue or handed out on a stream.
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
    /// The pull-next before `next` (repeating it re-delivers `pending`), none right after start.
    previous: Option<Arc<str>>,
    /// The current pull-next: a GET or DELETE on it acknowledges `pending`.
    next: Arc<str>,
    /// Every message handed out since the last acknowledgement, in the order handed out: one
    /// batch per answered read, several when several requests read at once.
    pending: Vec<Message>,
    /// Requests on this stream being handled now (held or being answered): a busy stream never
    /// expires, and a read that finds another one here is a concurrent read.
    active: u32,
    last_seen: Instant,
}

/// Admission to read on a stream.
#[derive(Debug)]
pub struct Ticket {
    pub stream: u64,
    /// The stream's current pull-next at admission.
    pub pull_next: Arc<str>,
    /// What this request acknowledged (a GET on the current pull-next).
    pub acked: Vec<Message>,
    /// Everything pending, to send again (repeating the previous pull-next while messages wait).
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
    /// A batch of its own, now pending on the stream, answered with the current pull-next.
    Batch {
        messages: Vec<Message>,
        first: u64,
        again: u64,
        pull_next: Arc<str>,
    },
    Empty,
    /// The stream was closed, expired or forgotten while the request waited.
    Gone,
}

/// Outcome of `DELETE` on a token.
#[derive(Debug)]
pub enum Close {
    /// The current pull-next: everything pending is acknowledged.
    Acked(Vec<Message>),
    /// The previous pull-next: everything pending went back to the head of the queue.
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

    /// Forgets everything (control `reset`); stream ids keep counting, so a request still held on
    /// a forgotten stream finds it gone.
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
        let stream = Stream { previous: None, next: next.clone(), pending: Vec::new(), active: 1, last_seen: now };
        self.streams.insert(id, stream);
        Ok(Ticket { stream: id, pull_next: next, acked: Vec::new(), redeliver: None, readers: 1 })
    }

    /// `GET` on a pull-next token: the current one acknowledges everything pending and moves the
    /// stream on; the previous one re-delivers everything pending, or waits when nothing is.
    pub fn follow(&mut self, token: &str, now: Instant) -> Result<Ticket, Refusal> {
        let id = *self.tokens.get(token).ok_or(Refusal::UnknownToken)?;
        let stream = self.streams.get_mut(&id).ok_or(Refusal::UnknownToken)?;
        let mut acked = Vec::new();
        let mut redeliver = None;
        if *stream.next == *token {
            acked = std::mem::take(&mut stream.pending);
            if let Some(old) = stream.previous.take() {
                self.tokens.remove(&old);
            }
            let fresh = new_token();
            self.tokens.insert(fresh.clone(), id);
            stream.previous = Some(std::mem::replace(&mut stream.next, fresh));
        } else if !stream.pending.is_empty() {
            redeliver = Some(stream.pending.clone());
        }
        stream.active += 1;
        stream.last_seen = now;
        Ok(Ticket { stream: id, pull_next: stream.next.clone(), acked, redeliver, readers: stream.active })
    }

    /// Hands a waiting request up to `max` messages from the head of the queue, a batch of its
    /// own that joins what is pending on the stream.
    pub fn take(&mut self, stream: u64, max: usize) -> Take {
        let Some(s) = self.streams.get_mut(&stream) else {
            return Take::Gone;
        };
        let n = max.min(self.queue.len());
        if n == 0 {
            return Take::Empty;
        }
        let mut messages: Vec<Message> = self.queue.drain(..n).collect();
        let again = messages.iter().filter(|m| m.delivered_before).count() as u64;
        for m in &mut messages {
            m.delivered_before = true;
        }
        s.pending.extend(messages.iter().cloned());
        Take::Batch { messages, first: n as u64 - again, again, pull_next: s.next.clone() }
    }

    /// The stream's current pull-next (what an answer carries), none once it is gone.
    pub fn pull_next(&self, stream: u64) -> Option<Arc<str>> {
        self.streams.get(&stream).map(|s| s.next.clone())
    }

    /// A request on the stream ended (answered, even to a client that went away).
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
        if let Some(previous) = &stream.previous {
            self.tokens.remove(previous);
        }
        Some(stream)
    }

    /// Puts messages back at the head of the queue, in their order.
    fn requeue(&mut self, pending: Vec<Message>) {
        for m in pending.into_iter().rev() {
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

    /// The batch a waiting request is handed, and the pull-next it is answered with.
    fn hand(book: &mut Book, ticket: &Ticket, max: usize) -> (Vec<Message>, Arc<str>) {
        match book.take(ticket.stream, max) {
            Take::Batch { messages, pull_next, .. } => (messages, pull_next),
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// A request handed a batch and answered.
    fn read(book: &mut Book, ticket: &Ticket, max: usize) -> Vec<Message> {
        let (messages, _) = hand(book, ticket, max);
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
        match book.take(t.stream, 10) {
            Take::Batch { messages, first, again, .. } => {
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

    /// Opens a stream, answers its start empty, and starts two reads on it: one on the current
    /// pull-next and a repeat of that same token (now the previous one, nothing pending).
    fn two_readers(book: &mut Book) -> (Ticket, Ticket) {
        let t0 = book.open(6, Instant::now()).unwrap();
        book.leave(t0.stream, Instant::now());
        let first = book.follow(&t0.pull_next, Instant::now()).unwrap();
        let second = book.follow(&t0.pull_next, Instant::now()).unwrap();
        assert!(second.redeliver.is_none(), "nothing pending: the repeat waits");
        assert_eq!((first.readers, second.readers), (1, 2));
        (first, second)
    }

    #[test]
    fn a_newer_request_does_not_supersede_a_holding_one() {
        let mut book = Book::default();
        let (t1, t1_again) = two_readers(&mut book);
        book.enqueue(msgs(&["a"]));
        assert_eq!(ids(&hand(&mut book, &t1, 10).0), ["a"], "the older request still reads");
        assert!(matches!(book.take(t1_again.stream, 10), Take::Empty));
        assert_eq!(book.unacknowledged(), 1);
    }

    #[test]
    fn concurrent_readers_each_get_a_batch_and_the_next_get_acknowledges_both() {
        let mut book = Book::default();
        let (a, b) = two_readers(&mut book);
        book.enqueue(msgs(&["a", "b", "c"]));
        let (for_a, next_a) = hand(&mut book, &a, 2);
        let (for_b, next_b) = hand(&mut book, &b, 2);
        assert_eq!((ids(&for_a), ids(&for_b)), (vec!["a", "b"], vec!["c"]));
        assert_eq!((&next_a, &next_b), (&a.pull_next, &a.pull_next), "both carry the current pull-next");
        assert_eq!(book.unacknowledged(), 3, "both batches wait on the stream");
        book.leave(a.stream, Instant::now());
        book.leave(b.stream, Instant::now());
        let next = book.follow(&next_b, Instant::now()).unwrap();
        assert_eq!(ids(&next.acked), ["a", "b", "c"], "one GET acknowledges every batch pending");
        assert_eq!(book.unacknowledged(), 0);
    }

    #[test]
    fn a_held_request_is_answered_with_the_pull_next_current_when_it_answers() {
        let mut book = Book::default();
        let (a, b) = two_readers(&mut book);
        book.leave(b.stream, Instant::now());
        // Another read moves the stream on while `a` still waits.
        let moved = book.follow(&a.pull_next, Instant::now()).unwrap();
        assert_eq!(moved.readers, 2);
        book.enqueue(msgs(&["a"]));
        let (_, answered_with) = hand(&mut book, &a, 10);
        assert_eq!(answered_with, moved.pull_next);
        assert_eq!(book.pull_next(a.stream), Some(moved.pull_next));
    }

    #[test]
    fn repeating_the_previous_token_redelivers_everything_pending() {
        let mut book = Book::default();
        let (a, b) = two_readers(&mut book);
        book.enqueue(msgs(&["a", "b", "c"]));
        hand(&mut book, &a, 2);
        hand(&mut book, &b, 2);
        let previous = book.streams[&a.stream].previous.clone().unwrap();
        let repeat = book.follow(&previous, Instant::now()).unwrap();
        assert_eq!(ids(repeat.redeliver.as_deref().unwrap()), ["a", "b", "c"], "same ResourceIds");
        assert_eq!(repeat.pull_next, a.pull_next);
        assert_eq!(repeat.readers, 3);
        assert_eq!(book.unacknowledged(), 3, "still pending");
    }

    #[test]
    fn expiry_requeues_everything_pending_in_order() {
        let mut book = Book::default();
        let (a, b) = two_readers(&mut book);
        book.enqueue(msgs(&["a", "b", "c", "d"]));
        hand(&mut book, &a, 2);
        hand(&mut book, &b, 1);
        assert_eq!(book.expire(Duration::ZERO, Instant::now() + Duration::from_secs(1)), (0, 0), "busy");
        book.leave(a.stream, Instant::now());
        book.leave(b.stream, Instant::now());
        assert_eq!(book.expire(Duration::ZERO, Instant::now() + Duration::from_secs(1)), (1, 3));
        assert!(matches!(book.take(a.stream, 10), Take::Gone));
        let fresh = book.open(6, Instant::now()).unwrap();
        assert_eq!(ids(&hand(&mut book, &fresh, 10).0), ["a", "b", "c", "d"]);
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
        /// A client opens a stream (its start request is being handled).
        Open,
        /// Client i starts a GET on the pull-next it was last answered with.
        FollowNext(usize),
        /// Client i starts a GET repeating the token of its last request.
        FollowPrevious(usize),
        /// Request r, still waiting, is handed what the queue has.
        Take {
            request: usize,
            max: usize,
        },
        /// Request r is answered (its client may have gone away: it is answered all the same).
        Answer(usize),
        CloseNext(usize),
        ClosePrevious(usize),
        Expire,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u8..20).prop_map(Op::Enqueue),
            Just(Op::Open),
            (0usize..8).prop_map(Op::FollowNext),
            (0usize..8).prop_map(Op::FollowPrevious),
            (0usize..8, 1usize..=10).prop_map(|(request, max)| Op::Take { request, max }),
            (0usize..8).prop_map(Op::Answer),
            (0usize..8).prop_map(Op::CloseNext),
            (0usize..8).prop_map(Op::ClosePrevious),
            Just(Op::Expire),
        ]
    }

    /// What a client remembers of its stream: the pull-next it was last answered with and the
    /// token of its last request.
    struct Client {
        pull_next: Arc<str>,
        used: Option<Arc<str>>,
    }

    /// A request being handled: whose, on which stream.
    struct Request {
        client: usize,
        stream: u64,
    }

    /// The model: clients (several may read one stream at once) and their requests in progress.
    #[derive(Default)]
    struct World {
        book: Book,
        clients: Vec<Client>,
        requests: Vec<Request>,
        acked: Vec<Arc<str>>,
        made: u32,
    }

    impl World {
        fn apply(&mut self, op: Op, now: Instant) {
            match op {
                Op::Enqueue(n) => self.enqueue(n),
                Op::Open => {
                    if let Ok(ticket) = self.book.open(6, now) {
                        let client = self.clients.len();
                        self.clients.push(Client { pull_next: ticket.pull_next.clone(), used: None });
                        self.requests.push(Request { client, stream: ticket.stream });
                    }
                }
                Op::FollowNext(i) => self.follow(i, true, now),
                Op::FollowPrevious(i) => self.follow(i, false, now),
                Op::Take { request, max } => {
                    let Some(r) = self.requests.get(request) else { return };
                    if let Take::Batch { pull_next, .. } = self.book.take(r.stream, max) {
                        let r = self.requests.remove(request);
                        self.answered(r, Some(pull_next), now);
                    }
                }
                Op::Answer(request) => {
                    if request < self.requests.len() {
                        let r = self.requests.remove(request);
                        let pull_next = self.book.pull_next(r.stream);
                        self.answered(r, pull_next, now);
                    }
                }
                Op::CloseNext(i) | Op::ClosePrevious(i) => {
                    let Some(c) = self.clients.get(i) else { return };
                    let token = match op {
                        Op::CloseNext(_) => Some(c.pull_next.clone()),
                        _ => c.used.clone(),
                    };
                    if let Some(Close::Acked(batch)) = token.map(|t| self.book.close(&t)) {
                        self.acked.extend(batch.iter().map(|m| m.resource_id.clone()));
                    }
                }
                Op::Expire => {
                    self.book.expire(Duration::ZERO, now + Duration::from_secs(1));
                }
            }
        }

        fn enqueue(&mut self, n: u8) {
            let first = self.made;
            self.made += u32::from(n);
            let messages = (first..self.made).map(|k| Message::new(Arc::from(k.to_string()), Draft::Raw(Bytes::new())));
            self.book.enqueue(messages);
        }

        fn follow(&mut self, client: usize, next: bool, now: Instant) {
            let Some(c) = self.clients.get_mut(client) else { return };
            let token = if next { c.pull_next.clone() } else { c.used.clone().unwrap_or_else(|| c.pull_next.clone()) };
            let Ok(ticket) = self.book.follow(&token, now) else { return };
            c.used = Some(token);
            self.acked.extend(ticket.acked.iter().map(|m| m.resource_id.clone()));
            let request = Request { client, stream: ticket.stream };
            if ticket.redeliver.is_some() {
                self.answered(request, Some(ticket.pull_next), now);
            } else {
                self.requests.push(request);
            }
        }

        fn answered(&mut self, request: Request, pull_next: Option<Arc<str>>, now: Instant) {
            self.book.leave(request.stream, now);
            if let (Some(c), Some(p)) = (self.clients.get_mut(request.client), pull_next) {
                c.pull_next = p;
            }
        }

        /// Every message in exactly one place — queued, pending on one stream, or acknowledged
        /// once — and every stream's count of requests true.
        fn check(&self) -> Result<(), TestCaseError> {
            let mut seen: HashSet<Arc<str>> = HashSet::new();
            let queued = self.book.queue.iter().map(|m| &m.resource_id);
            let pending = self.book.streams.values().flat_map(|s| s.pending.iter().map(|m| &m.resource_id));
            for id in self.acked.iter().chain(queued).chain(pending) {
                prop_assert!(seen.insert(id.clone()), "{id} twice");
            }
            prop_assert_eq!(seen.len(), self.made as usize);
            prop_assert!(self.book.open_streams() <= 6);
            for (id, s) in &self.book.streams {
                let handled = self.requests.iter().filter(|r| r.stream == *id).count();
                prop_assert_eq!(s.active as usize, handled, "requests on stream {}", id);
            }
            Ok(())
        }
    }

    proptest! {
        /// Whatever clients do — several at once on one stream, abandoning requests the server
        /// still answers — every message is in exactly one place and none is acknowledged twice.
        #[test]
        fn no_message_is_lost_or_acknowledged_twice(ops in proptest::collection::vec(op(), 1..160)) {
            let mut world = World::default();
            let now = Instant::now();
            for op in ops {
                world.apply(op, now);
                world.check()?;
            }
        }
    }
}
