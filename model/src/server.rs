//! The ICOM server of one channel (`src/sim/streams.rs` `Book`, `src/sim/lane.rs`
//! `Lane::read`), with the real server's semantics: one shared queue, a token chain per stream,
//! no superseding (two reads of one stream both hold, each may be handed its own batch), and a
//! request the client aborted stays until the server answers it.

use crate::state::{MAX, Token};

/// What the server hands back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// 200 with a batch (bit mask of messages) and the next pull-next.
    Batch { messages: u8, pull_next: Token },
    /// 204 after the hold, with the next pull-next.
    Empty { pull_next: Token },
    /// 404: the token is no longer in the chain.
    Unknown,
}

impl Answer {
    pub fn age_tokens(&mut self) {
        match self {
            Answer::Batch { pull_next, .. } | Answer::Empty { pull_next } => *pull_next = pull_next.aged(),
            Answer::Unknown => {}
        }
    }
}

/// How an admitted GET will be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reading {
    /// Holding: answers with whatever reaches the queue, or 204 when `left` reaches 0.
    Hold { left: u8 },
    /// The previous token with a batch pending: that batch again, at once.
    Redeliver(u8),
    /// 404 at once.
    Unknown,
}

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Sent but delayed on its way (the request-delay fault); must arrive within `left` ticks.
    Transit { token: Token, left: u8 },
    /// At the server: in flight until answered; counted by the cap.
    Admitted { pull_next: Token, reading: Reading },
}

/// One GET on a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    pub stream: u8,
    /// The pod waiting for the answer; `None` once it aborted or crashed (the answer goes nowhere).
    pub owner: Option<u8>,
    pub stage: Stage,
}

impl Request {
    pub fn in_flight(&self) -> bool {
        matches!(self.stage, Stage::Admitted { .. })
    }
}

/// Requests in transit or in flight: a fixed array (cloning a state allocates nothing), kept
/// sorted so equal states hash equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requests {
    len: u8,
    items: [Request; Requests::CAPACITY],
}

impl Default for Requests {
    fn default() -> Self {
        let none = Request { stream: 0, owner: None, stage: Stage::Transit { token: Token::CURRENT, left: 0 } };
        Requests { len: 0, items: [none; Requests::CAPACITY] }
    }
}

impl Requests {
    /// Two pods × two slots, plus the GETs they abandoned, never come near it.
    const CAPACITY: usize = 8;

    pub fn iter(&self) -> std::slice::Iter<'_, Request> {
        self.items[..self.len as usize].iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Request> {
        self.items[..self.len as usize].iter_mut()
    }

    pub fn get(&self, i: usize) -> &Request {
        &self.items[..self.len as usize][i]
    }

    fn push(&mut self, r: Request) {
        assert!((self.len as usize) < Requests::CAPACITY, "more requests than the model has room for");
        self.items[self.len as usize] = r;
        self.len += 1;
        self.sort();
    }

    fn remove(&mut self, i: usize) -> Request {
        let r = self.items[i];
        self.items.copy_within(i + 1..self.len as usize, i);
        self.len -= 1;
        self.items[self.len as usize] = Requests::default().items[0];
        r
    }

    pub fn sort(&mut self) {
        self.items[..self.len as usize].sort_unstable();
    }
}

/// The server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Server {
    /// Messages received, not yet handed to any read (bit mask).
    pub queue: u8,
    /// How many messages have reached the server (message i is bit i).
    pub arrived: u8,
    /// Messages the server counts as acknowledged (the next GET or DELETE on the current token).
    pub acked: u8,
    /// Per stream, the batches handed out and not acknowledged yet.
    pub pending: [u8; MAX],
    pub requests: Requests,
}

impl Server {
    /// A GET reaches the server (`Book::follow`): following the current token acknowledges the
    /// pending batches; the previous one re-delivers them; anything older is unknown. Returns how
    /// it will be answered and whether the chain moved on (then every copy of the stream's
    /// tokens ages, before the request is pushed with the fresh one).
    pub fn follow(&mut self, stream: usize, token: Token, hold: u8) -> (Reading, bool) {
        let pending = self.pending[stream];
        match token.0 {
            0 => {
                self.acked |= pending;
                self.pending[stream] = 0;
                (Reading::Hold { left: hold }, true)
            }
            1 if pending != 0 => (Reading::Redeliver(pending), false),
            1 => (Reading::Hold { left: hold }, false),
            _ => (Reading::Unknown, false),
        }
    }

    /// A delayed GET leaves the pod.
    pub fn send_delayed(&mut self, stream: usize, token: Token, owner: u8, left: u8) {
        self.push(Request { stream: stream as u8, owner: Some(owner), stage: Stage::Transit { token, left } });
    }

    pub fn push(&mut self, request: Request) {
        self.requests.push(request);
    }

    /// Whether request `i` can be answered now; answering then is urgent.
    pub fn can_answer(&self, i: usize) -> bool {
        match self.requests.get(i).stage {
            Stage::Admitted { reading: Reading::Hold { left }, .. } => self.queue != 0 || left == 0,
            Stage::Admitted { .. } => true,
            Stage::Transit { .. } => false,
        }
    }

    /// Answers request `i`: returns it (with its owner) and the answer.
    pub fn answer(&mut self, i: usize) -> (Request, Answer) {
        let request = self.requests.remove(i);
        let Stage::Admitted { pull_next, reading } = request.stage else {
            unreachable!("answer of a request in transit")
        };
        let answer = match reading {
            Reading::Redeliver(messages) => Answer::Batch { messages, pull_next },
            Reading::Unknown => Answer::Unknown,
            Reading::Hold { .. } if self.queue != 0 => {
                let messages = std::mem::take(&mut self.queue);
                self.pending[request.stream as usize] |= messages;
                Answer::Batch { messages, pull_next }
            }
            Reading::Hold { .. } => Answer::Empty { pull_next },
        };
        (request, answer)
    }

    /// Takes a request in transit off the wire (it is then admitted).
    pub fn take_transit(&mut self, i: usize) -> (Request, Token) {
        let request = self.requests.remove(i);
        let Stage::Transit { token, .. } = request.stage else { unreachable!("delivery of an admitted request") };
        (request, token)
    }

    /// The pod of `owner` forgot its request on `stream` (abort, crash, lease lost).
    pub fn disown(&mut self, stream: usize, owner: u8) {
        for r in self.requests.iter_mut() {
            if r.stream as usize == stream && r.owner == Some(owner) {
                r.owner = None;
            }
        }
        self.requests.sort();
    }

    /// A message reaches the queue.
    pub fn arrive(&mut self) {
        self.queue |= 1 << self.arrived;
        self.arrived += 1;
    }

    pub fn age_tokens(&mut self, stream: usize) {
        for r in self.requests.iter_mut() {
            if r.stream as usize == stream {
                match &mut r.stage {
                    Stage::Transit { token, .. } => *token = token.aged(),
                    Stage::Admitted { pull_next, .. } => *pull_next = pull_next.aged(),
                }
            }
        }
    }

    /// Requests the server is handling now, on `stream` or on all streams.
    pub fn in_flight(&self, stream: Option<usize>) -> usize {
        self.requests.iter().filter(|r| r.in_flight() && stream.is_none_or(|s| r.stream as usize == s)).count()
    }

    pub fn tick(&mut self) {
        for r in self.requests.iter_mut() {
            match &mut r.stage {
                Stage::Transit { left, .. } | Stage::Admitted { reading: Reading::Hold { left }, .. } => {
                    *left = left.saturating_sub(1)
                }
                Stage::Admitted { .. } => {}
            }
        }
    }
}
