//! The model's whole state: every timer is kept as "ticks left" (clamped at 0), never as an
//! absolute instant, so two moments that look alike from inside are one state and the state
//! space is finite without a time bound.

use crate::config::Config;
use crate::pod::Pod;
use crate::postgres::Postgres;
use crate::redis::Redis;
use crate::server::Server;

/// Upper bound of pods and of slots (arrays keep the state flat and cheap to hash).
pub const MAX: usize = 3;

/// A pull-next token of one stream, by how far behind the stream's current one it is: the
/// server's chain hands out a fresh token with every GET on the current one, so only the age
/// relative to it matters (0 = current, 1 = previous: re-delivers, 2 = older: unknown, 404).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Token(pub u8);

impl Token {
    pub const CURRENT: Token = Token(0);

    /// The same token after one more GET on the current token of its stream.
    pub fn aged(self) -> Token {
        Token((self.0 + 1).min(2))
    }
}

/// Bookkeeping of the checker itself: not part of any real component.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Ghost {
    /// Faults the checker may still choose.
    pub faults_left: u8,
    /// Faults and arrivals are over; the liveness clock runs.
    pub stopped: bool,
    /// Ticks since `stopped` (saturates at the configured recovery bound).
    pub calm: u8,
    /// The last epoch value handed out (a fresh epoch must differ from every earlier one).
    pub epochs: u8,
    /// Per slot, grants handed out so far: the nonce that makes each grant unique.
    pub nonces: [u8; MAX],
    /// Per slot, the fence the last claim returned.
    pub claimed: [u8; MAX],
    /// Some claim took a slot that had been claimed before (a change of holder).
    pub takeover: bool,
    /// A claim returned a fence not above an earlier one.
    pub fence_regressed: bool,
    /// Some GET was answered 404 (its pull-next had fallen out of the chain).
    pub unknown_token: bool,
}

/// Everything: the pods, Redis, Postgres, the ICOM server, and the checker's ghost bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct World {
    pub pods: [Pod; MAX],
    pub redis: Redis,
    pub pg: Postgres,
    pub server: Server,
    pub ghost: Ghost,
}

impl World {
    /// A running cluster: Redis holds an epoch every pod knows, no slot is held yet, each slot's
    /// stream is open with its current pull-next stored in the row.
    pub fn initial(cfg: &Config) -> World {
        World {
            pods: [Pod::fresh(Some(1)), Pod::fresh(Some(1)), Pod::fresh(Some(1))],
            redis: Redis::initial(1),
            pg: Postgres::default(),
            server: Server::default(),
            ghost: Ghost { faults_left: cfg.faults.budget, epochs: 1, ..Ghost::default() },
        }
    }

    /// A fresh epoch value for Redis to write.
    pub fn new_epoch(&mut self) -> u8 {
        self.ghost.epochs += 1;
        self.ghost.epochs
    }

    /// One GET on the current token of `stream` was admitted: every token of it ages.
    pub fn age_tokens(&mut self, stream: usize) {
        self.pg.rows[stream].pull_next = self.pg.rows[stream].pull_next.aged();
        self.server.age_tokens(stream);
        for pod in &mut self.pods {
            pod.age_tokens(stream);
        }
    }

    /// Bit mask of the messages the server has received.
    pub fn received(&self) -> u8 {
        ((1u16 << self.server.arrived) - 1) as u8
    }

    /// Every message the server received is in the inbox.
    pub fn all_persisted(&self) -> bool {
        self.received() & !self.pg.inbox == 0
    }

    /// One tick of real time: every clock advances, every timer counts down.
    pub fn tick(&mut self) {
        self.redis.tick();
        self.pg.tick();
        self.server.tick();
        for pod in &mut self.pods {
            pod.tick();
        }
        if self.ghost.stopped {
            self.ghost.calm += 1;
        }
    }
}
