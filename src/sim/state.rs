//! The simulator's shared state: the lanes per (ispb, channel), the live faults
//! per channel, the generator, the ledger, the outbound log, the settlement
//! record and the MsgIds already accepted. Everything a handler of any listener may touch.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::SystemTime;

use cabine_actors::domain::ChannelId;
use tokio_util::task::TaskTracker;

use super::SimConfig;
use super::audit::{LaneAudit, OutboundRecord, Ring};
use super::bucket::TokenBucket;
use super::faults::{FaultPatch, Faults};
use super::generator::{Generator, Templates};
use super::lane::{Lane, Ledger};
use super::settlement::{Direction, Entry};
use super::template::TemplateError;

/// Index of a channel in per-channel arrays.
pub fn slot(channel: ChannelId) -> usize {
    match channel {
        ChannelId::Cpm => 0,
        ChannelId::Csm => 1,
    }
}

/// MsgIds accepted per participant, forgetting the oldest beyond a bound.
#[derive(Debug)]
struct AcceptedIds {
    seen: HashSet<String>,
    order: VecDeque<String>,
    cap: usize,
}

impl AcceptedIds {
    /// True when `key` is new (and now remembered).
    fn admit(&mut self, key: String) -> bool {
        if self.seen.contains(&key) {
            return false;
        }
        if self.order.len() >= self.cap
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.order.push_back(key.clone());
        self.seen.insert(key);
        true
    }
}

pub struct Shared {
    pub cfg: SimConfig,
    pub seed: u64,
    pub tls: bool,
    /// Multipart boundary of every stream response.
    pub boundary: String,
    pub templates: Templates,
    lanes: HashMap<Arc<str>, [Arc<Lane>; 2]>,
    faults: [RwLock<Faults>; 2],
    generator: Mutex<Generator>,
    pub ledger: Arc<Ledger>,
    pub outbound: Mutex<Ring<OutboundRecord>>,
    /// Every participant's settled credits and debits (the reconciliation's truth).
    pub settlements: Mutex<Ring<Entry>>,
    accepted: Mutex<AcceptedIds>,
    resource_salt: u32,
    resource_seq: AtomicU64,
    /// The task of every request being handled: each outlives its client's connection, not the
    /// simulator (shutdown waits for them).
    pub requests: TaskTracker,
    /// The simulated DICT (its own listener; the control API reads and sets it).
    pub dict: Arc<super::dict::DictState>,
}

/// A well-mixed function of the seed (SplitMix64), for identifiers derived from it.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn new(cfg: SimConfig, tls: bool) -> Result<Self, TemplateError> {
        let seed = cfg.seed.unwrap_or_else(rand::random);
        let ledger = Arc::new(Mutex::new(Ring::new(cfg.ledger_cap)));
        let now = cfg.clock.now();
        let lanes = cfg
            .ispbs
            .iter()
            .map(|ispb| {
                let ispb: Arc<str> = Arc::from(ispb.as_str());
                let lane = |channel| {
                    let bucket = TokenBucket::full(cfg.buckets.for_channel(channel, now), now);
                    Arc::new(Lane::new(ispb.clone(), channel, bucket, ledger.clone(), cfg.clock.clone()))
                };
                (ispb.clone(), [lane(ChannelId::Cpm), lane(ChannelId::Csm)])
            })
            .collect();
        let no_faults = Faults::none(cfg.hold, cfg.stream_idle);
        Ok(Shared {
            seed,
            tls,
            boundary: format!("icom-sim-{:016x}", splitmix64(seed ^ 0xb0)),
            templates: Templates::compile()?,
            lanes,
            faults: [RwLock::new(no_faults), RwLock::new(no_faults)],
            generator: Mutex::new(Generator::new(seed)),
            ledger,
            outbound: Mutex::new(Ring::new(cfg.outbound_cap)),
            settlements: Mutex::new(Ring::new(cfg.ledger_cap)),
            accepted: Mutex::new(AcceptedIds { seen: HashSet::new(), order: VecDeque::new(), cap: cfg.dedup_cap }),
            resource_salt: splitmix64(seed) as u32,
            resource_seq: AtomicU64::new(0),
            requests: TaskTracker::new(),
            dict: Arc::new(super::dict::DictState::new(
                seed,
                cfg.ispbs.iter().map(|i| i.as_str().to_owned()).collect(),
                &cfg.dict_category,
            )),
            cfg,
        })
    }

    pub fn now(&self) -> SystemTime {
        self.cfg.clock.now()
    }

    pub fn lane(&self, ispb: &str, channel: ChannelId) -> Option<&Arc<Lane>> {
        self.lanes.get(ispb).map(|pair| &pair[slot(channel)])
    }

    /// Every lane, in configuration order of the ISPBs, primary first.
    pub fn lanes(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.cfg.ispbs.iter().filter_map(|i| self.lanes.get(i.as_str())).flat_map(|pair| pair.iter())
    }

    /// The only lane of a channel when a single ISPB is served (connections are attributed at accept).
    pub fn sole_lane(&self, channel: ChannelId) -> Option<&Arc<Lane>> {
        if self.lanes.len() == 1 { self.lanes.values().next().map(|pair| &pair[slot(channel)]) } else { None }
    }

    pub fn faults(&self, channel: ChannelId) -> Faults {
        *self.faults[slot(channel)].read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a patch to one channel or both; all or nothing.
    pub fn update_faults(&self, channels: &[ChannelId], patch: &FaultPatch) -> Result<(), String> {
        let mut next = Vec::with_capacity(channels.len());
        for c in channels {
            let mut f = self.faults(*c);
            f.apply(patch)?;
            next.push((*c, f));
        }
        for (c, f) in next {
            *self.faults[slot(c)].write().unwrap_or_else(PoisonError::into_inner) = f;
        }
        Ok(())
    }

    /// A fresh ResourceId: 32 lowercase hex characters, unique for the life of the simulator.
    pub fn next_resource_id(&self) -> Arc<str> {
        let n = self.resource_seq.fetch_add(1, Ordering::Relaxed) + 1;
        Arc::from(format!("{:08x}{:024x}", self.resource_salt, n))
    }

    pub fn generator(&self) -> MutexGuard<'_, Generator> {
        lock(&self.generator)
    }

    /// True when `msg_id` was never accepted from `ispb` before (and now is).
    pub fn admit_msg_id(&self, ispb: &str, msg_id: &str) -> bool {
        lock(&self.accepted).admit(format!("{ispb}/{msg_id}"))
    }

    pub fn record_outbound(&self, mut record: OutboundRecord) {
        let mut log = lock(&self.outbound);
        record.seq = log.next_seq();
        log.push(record);
    }

    /// Books one movement of `ispb`'s settlement account, now.
    pub fn settle(&self, ispb: &Arc<str>, direction: Direction, end_to_end_id: &str, msg_id: &str, amount: String) {
        let settled_at_ms = super::clock::unix_millis(self.now());
        let mut record = lock(&self.settlements);
        let seq = record.next_seq();
        record.push(Entry {
            seq,
            ispb: ispb.clone(),
            end_to_end_id: end_to_end_id.to_owned(),
            msg_id: msg_id.to_owned(),
            direction,
            amount,
            settled_at_ms,
        });
    }

    pub fn settlements(&self) -> MutexGuard<'_, Ring<Entry>> {
        lock(&self.settlements)
    }

    pub fn audit(&self) -> Vec<LaneAudit> {
        self.lanes().map(|l| l.audit()).collect()
    }

    /// Back to a fresh simulator (same addresses, same seed, ResourceIds keep counting).
    pub fn reset(&self) {
        let now = self.now();
        for lane in self.lanes() {
            lane.clear(TokenBucket::full(self.cfg.buckets.for_channel(lane.channel, now), now));
        }
        let no_faults = Faults::none(self.cfg.hold, self.cfg.stream_idle);
        for f in &self.faults {
            *f.write().unwrap_or_else(PoisonError::into_inner) = no_faults;
        }
        *self.generator() = Generator::new(self.seed);
        lock(&self.ledger).clear();
        lock(&self.outbound).clear();
        lock(&self.settlements).clear();
        let mut accepted = lock(&self.accepted);
        accepted.seen.clear();
        accepted.order.clear();
    }
}
