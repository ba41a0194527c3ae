//! The outbound actors' configuration (built by the `cabine` crate from its
//! `[outbound]`, `[timing]` and `[pools]` settings) and the ports they drive.

use std::sync::Arc;
use std::time::Duration;

use crate::config::TreeConfigError;
use crate::domain::PoolSize;
use crate::ports::breaker::CircuitBreaker;
use crate::ports::outbound::{BatchSize, OutboundStore};
use crate::ports::outbound_bus::{OutboundIngress, ResultSink, WorkHints};
use crate::ports::ratelimit::{CostTable, RateBucket};
use crate::ports::{Confirmations, SendConnector, SendGates};

#[derive(Clone, Debug)]
pub struct OutboundConfig {
    /// Sender slots per enabled channel on this pod, each with its own send
    /// lease and connection; the cluster-wide send pool caps them all.
    pub senders_per_channel: PoolSize,
    /// Messages per POST (1..=10).
    pub batch_size: BatchSize,
    /// Raw bytes one POST may carry; a claimed batch is cut to fit (at least one message).
    pub max_batch_bytes: usize,
    /// Requests per pull from the bus, and the longest wait of one pull.
    pub pull_batch: usize,
    pub pull_wait: Duration,
    /// A request delivered more often than this without being stored is parked
    /// (kept raw, acknowledged) instead of being tried again: one poison
    /// request never comes back every `ack_wait` forever, nor takes the
    /// requests pulled beside it along.
    pub max_deliver: u32,
    /// Back-pressure: the dispatcher stops pulling while this many rows are queued.
    pub max_queued: u64,
    /// Queue depth, breaker and bucket are read this often (status, metrics, back-pressure).
    pub status_interval: Duration,
    pub costs: CostTable,
    /// Bound of one POST; a send starts only while the lease is valid for it + `request_margin`.
    pub send_timeout: Duration,
    /// A successful send slower than this counts as slow for the breaker.
    pub slow_call: Duration,
    /// A sender gives its lease back after this long without work...
    pub idle_release: Duration,
    /// ...looking for work this often meanwhile.
    pub idle_poll: Duration,
    /// An empty bucket that refills within this is waited for with the batch in hand;
    /// a longer wait puts the batch back.
    pub bucket_wait_max: Duration,
    /// How long a 429 without `Retry-After` pauses the sender.
    pub retry_after_default: Duration,
    /// How long a sender keeps retrying to record a send's outcome (Postgres down).
    pub record_patience: Duration,
    /// The leader's janitor runs this often, each step at most `janitor_batch` rows.
    pub janitor_interval: Duration,
    pub janitor_batch: u32,
    /// The confirmer runs after every inbox commit holding status reports, and at least this often...
    pub confirm_interval: Duration,
    /// ...correlating at most this many rows per pass.
    pub confirm_batch: u32,
}

impl OutboundConfig {
    /// DESIGN §6 and `config/default.toml` defaults.
    pub fn new(senders_per_channel: PoolSize) -> Self {
        OutboundConfig {
            senders_per_channel,
            batch_size: BatchSize::MAX,
            max_batch_bytes: 4 * 1024 * 1024,
            pull_batch: 100,
            pull_wait: Duration::from_secs(1),
            max_deliver: 10,
            max_queued: 50_000,
            status_interval: Duration::from_secs(1),
            costs: CostTable::default(),
            send_timeout: Duration::from_secs(5),
            slow_call: Duration::from_secs(2),
            idle_release: Duration::from_secs(2),
            idle_poll: Duration::from_millis(200),
            bucket_wait_max: Duration::from_secs(1),
            retry_after_default: Duration::from_secs(1),
            record_patience: Duration::from_secs(60),
            janitor_interval: Duration::from_secs(5),
            janitor_batch: 500,
            confirm_interval: Duration::from_secs(5),
            confirm_batch: 200,
        }
    }

    pub fn validate(&self) -> Result<(), TreeConfigError> {
        let fail = |key, rule| Err(TreeConfigError { key, rule });
        if !(1..=1000).contains(&self.pull_batch) || self.pull_wait.is_zero() {
            return fail("outbound.pull_batch", "pull_batch in 1..=1000 and pull_wait > 0");
        }
        if self.max_deliver == 0 {
            return fail("outbound.max_deliver", "must be ≥ 1");
        }
        if self.max_queued == 0 || self.max_batch_bytes == 0 {
            return fail("outbound.max_queued", "max_queued and max_batch_bytes must be > 0");
        }
        let intervals = [self.status_interval, self.idle_poll, self.janitor_interval, self.confirm_interval];
        if intervals.iter().any(Duration::is_zero) || self.send_timeout.is_zero() {
            return fail("outbound.intervals", "status, idle poll, janitor, confirm intervals and send_timeout > 0");
        }
        if self.idle_poll > self.idle_release {
            return fail("outbound.idle_poll", "must be ≤ idle_release");
        }
        if self.janitor_batch == 0 {
            return fail("outbound.janitor_batch", "must be ≥ 1");
        }
        if self.confirm_batch == 0 {
            return fail("outbound.confirm_batch", "must be ≥ 1");
        }
        Ok(())
    }
}

/// The outbound ports, as shared trait objects.
#[derive(Clone)]
pub struct OutboundPorts {
    pub store: Arc<dyn OutboundStore>,
    pub ingress: Arc<dyn OutboundIngress>,
    pub results: Arc<dyn ResultSink>,
    pub bucket: Arc<dyn RateBucket>,
    pub breaker: Arc<dyn CircuitBreaker>,
    pub sends: Arc<dyn SendConnector>,
    /// The send slots' gate rows (DESIGN §2.5).
    pub gates: Arc<dyn SendGates>,
    pub confirmations: Arc<dyn Confirmations>,
    /// "Rows stored on this channel", to the other pods' senders.
    pub hints: Arc<dyn WorkHints>,
}
