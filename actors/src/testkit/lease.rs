//! In-memory lease store with the Redis design's semantics (DESIGN §3): TTL =
//! lease + lock_delay, local validity = t0 + lease − drift_margin, grants
//! checked on renew and release, an epoch whose loss (amnesia) quarantines
//! every pool for lease + lock_delay. Shared by several pods in one test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::ledger::slot_name;
use crate::ports::{Acquired, GrantId, Holder, Lease, LeaseError, LeaseStore, LostCause, Pool, Quarantine};

#[derive(Clone, Debug)]
pub struct FakeLeaseSettings {
    pub lease: Duration,
    pub lock_delay: Duration,
    pub drift_margin: Duration,
    pub stream_slots: u8,
    pub send_slots: u8,
}

#[derive(Clone)]
struct Key {
    grant: String,
    expires: Instant,
}

/// The slot keys at one moment, to roll the store back to (a restore from an older snapshot).
#[derive(Clone)]
pub struct LeaseSnapshot {
    keys: HashMap<(Pool, u8), Key>,
}

/// What the store saw, for assertions.
#[derive(Clone, Debug, Default)]
pub struct LeaseAudit {
    pub grants: u64,
    /// Acquire calls that reached the store, by pool (granted or not).
    pub acquires: HashMap<Pool, u64>,
    /// Releases that freed a key, by slot name (`cpm:stream/2`).
    pub releases: HashMap<String, u64>,
    pub renew_many_calls: u64,
    pub quarantined_answers: u64,
    /// Partial amnesia reported by pods (each report's evidence).
    pub amnesia_reports: Vec<String>,
}

struct Validity {
    pool: Pool,
    pod: String,
    valid_until: Instant,
    released: bool,
}

#[derive(Default)]
struct Table {
    keys: HashMap<(Pool, u8), Key>,
    epoch: u64,
    epoch_missing: bool,
    quarantine_until: Option<Instant>,
    /// Why the running quarantine started.
    quarantine_reason: String,
    grant_epochs: HashMap<String, u64>,
    /// Every grant's local validity as its holder computes it (acquire, renewals), and whether it was given back.
    validity: HashMap<String, Validity>,
    unavailable: bool,
    latency: Duration,
    audit: LeaseAudit,
}

pub struct FakeLeaseStore {
    settings: FakeLeaseSettings,
    table: Mutex<Table>,
    nonce: AtomicU64,
}

impl FakeLeaseStore {
    pub fn new(settings: FakeLeaseSettings) -> Arc<Self> {
        Arc::new(FakeLeaseStore { settings, table: Mutex::default(), nonce: AtomicU64::new(1) })
    }

    /// This store as seen by one pod (grants carry its id).
    pub fn for_pod(self: &Arc<Self>, pod: &str) -> Arc<dyn LeaseStore> {
        Arc::new(PodLeases { store: self.clone(), pod: pod.to_owned() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ttl(&self) -> Duration {
        self.settings.lease + self.settings.lock_delay
    }

    fn size(&self, pool: Pool) -> u8 {
        match pool {
            Pool::Stream(_) => self.settings.stream_slots,
            Pool::Send(_) => self.settings.send_slots,
            Pool::Leader => 1,
        }
    }

    /// Redis restarted without persistence: every key and the epoch are gone.
    pub fn forget_everything(&self) {
        let mut t = self.lock();
        t.keys.clear();
        t.epoch_missing = true;
    }

    /// Eviction of every key with a TTL (or a rollback to a snapshot without
    /// them): the slot keys and the quarantine are gone, the epoch survives.
    pub fn evict_ttl_keys(&self) {
        let mut t = self.lock();
        t.keys.clear();
        t.quarantine_until = None;
    }

    /// The slot keys now (SAVE).
    pub fn snapshot(&self) -> LeaseSnapshot {
        LeaseSnapshot { keys: self.lock().keys.clone() }
    }

    /// Back to `snapshot`'s keys (a restart from it, or a failover to a replica
    /// that lagged), the epoch unchanged and nothing detected yet: only a renewal
    /// that finds its key gone or re-granted tells.
    pub fn restore(&self, snapshot: &LeaseSnapshot) {
        let mut t = self.lock();
        t.keys = snapshot.keys.clone();
        t.quarantine_until = None;
    }

    /// Another grant takes the slot's key (a split brain the fences must absorb).
    pub fn steal(&self, pool: Pool, slot: u8) {
        let expires = Instant::now() + self.ttl();
        self.lock().keys.insert((pool, slot), Key { grant: "intruder:0".into(), expires });
    }

    pub fn set_unavailable(&self, down: bool) {
        self.lock().unavailable = down;
    }

    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// The pod holding `slot` of `pool` now, if any.
    pub fn holder_pod(&self, pool: Pool, slot: u8) -> Option<String> {
        let t = self.lock();
        let key = t.keys.get(&(pool, slot)).filter(|k| k.expires > Instant::now())?;
        Some(key.grant.split(':').next().unwrap_or_default().to_owned())
    }

    /// Slots of a channel's stream pool held by `pod`.
    pub fn held_by(&self, channel: ChannelId, pod: &str) -> Vec<u8> {
        let pool = Pool::Stream(channel);
        let mut slots: Vec<u8> =
            (1..=self.settings.stream_slots).filter(|n| self.holder_pod(pool, *n).as_deref() == Some(pod)).collect();
        slots.sort_unstable();
        slots
    }

    /// True when `pod` holds a grant of `pool` that is still valid by its holder's
    /// own reckoning (t0 + lease − drift of its last renewal) and not given back:
    /// what entitles it to send.
    pub fn holds_valid(&self, pool: Pool, pod: &str) -> bool {
        let now = Instant::now();
        self.lock().validity.values().any(|v| v.pool == pool && v.pod == pod && !v.released && v.valid_until > now)
    }

    pub fn audit(&self) -> LeaseAudit {
        self.lock().audit.clone()
    }

    /// Detects a missing epoch (as every acquire/renew script does) and starts the quarantine.
    fn check_epoch(&self, t: &mut Table, now: Instant) {
        if t.epoch_missing {
            t.epoch_missing = false;
            t.epoch += 1;
            t.quarantine_until = Some(now + self.ttl());
            t.quarantine_reason = "amnesia: the epoch key was gone".into();
        }
    }

    fn acquire(&self, pod: &str, pool: Pool, slot: Option<u8>, t0: Instant) -> Acquired {
        let mut t = self.lock();
        let now = Instant::now();
        *t.audit.acquires.entry(pool).or_default() += 1;
        self.check_epoch(&mut t, now);
        if let Some(until) = t.quarantine_until.filter(|u| *u > now) {
            t.audit.quarantined_answers += 1;
            return Acquired::Quarantined { remaining: until - now };
        }
        t.keys.retain(|_, k| k.expires > now);
        let candidates: Vec<u8> = match slot {
            Some(n) => vec![n],
            None => (1..=self.size(pool)).collect(),
        };
        let Some(n) = candidates.into_iter().find(|n| *n <= self.size(pool) && !t.keys.contains_key(&(pool, *n)))
        else {
            return Acquired::Full;
        };
        let grant = format!("{pod}:{}", self.nonce.fetch_add(1, Ordering::SeqCst));
        t.keys.insert((pool, n), Key { grant: grant.clone(), expires: now + self.ttl() });
        let epoch = t.epoch;
        t.grant_epochs.insert(grant.clone(), epoch);
        t.audit.grants += 1;
        let valid_until = t0 + self.settings.lease - self.settings.drift_margin;
        t.validity.insert(grant.clone(), Validity { pool, pod: pod.to_owned(), valid_until, released: false });
        Acquired::Granted(Lease { pool, slot: n, grant: GrantId(grant), valid_until })
    }

    fn renew_one(&self, t: &mut Table, lease: &Lease, t0: Instant, now: Instant) -> Result<Lease, LostCause> {
        if t.grant_epochs.get(&lease.grant.0) != Some(&t.epoch) {
            return Err(LostCause::Amnesia);
        }
        let key = (lease.pool, lease.slot);
        if t0 >= lease.valid_until {
            return Err(LostCause::Expired);
        }
        match t.keys.get(&key) {
            None => return Err(LostCause::Missing),
            Some(k) if k.expires <= now => {
                t.keys.remove(&key);
                return Err(LostCause::Missing);
            }
            Some(k) if k.grant != lease.grant.0 => return Err(LostCause::Stolen),
            Some(_) => {}
        }
        if let Some(k) = t.keys.get_mut(&key) {
            k.expires = now + self.ttl();
        }
        let valid_until = t0 + self.settings.lease - self.settings.drift_margin;
        if let Some(v) = t.validity.get_mut(&lease.grant.0) {
            v.valid_until = v.valid_until.max(valid_until);
        }
        Ok(Lease { valid_until, ..lease.clone() })
    }

    fn release(&self, lease: &Lease) {
        let mut t = self.lock();
        if let Some(v) = t.validity.get_mut(&lease.grant.0) {
            v.released = true;
        }
        let key = (lease.pool, lease.slot);
        if t.keys.get(&key).is_some_and(|k| k.grant == lease.grant.0) {
            t.keys.remove(&key);
            *t.audit.releases.entry(slot_name(lease.pool, lease.slot)).or_default() += 1;
        }
    }

    /// One simulated round trip: t0 first, then latency, then the outage check.
    async fn round_trip(&self) -> Result<Instant, LeaseError> {
        let t0 = Instant::now();
        let (latency, down) = {
            let t = self.lock();
            (t.latency, t.unavailable)
        };
        tokio::time::sleep(latency).await;
        if down { Err(LeaseError::Unavailable("fake lease store down".into())) } else { Ok(t0) }
    }
}

struct PodLeases {
    store: Arc<FakeLeaseStore>,
    pod: String,
}

#[async_trait::async_trait]
impl LeaseStore for PodLeases {
    async fn acquire(&self, pool: Pool, slot: Option<u8>) -> Result<Acquired, LeaseError> {
        let t0 = self.store.round_trip().await?;
        Ok(self.store.acquire(&self.pod, pool, slot, t0))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let mut answers = self.renew_many(std::slice::from_ref(lease)).await?;
        answers.remove(0).map_err(LeaseError::Lost)
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease, LostCause>>, LeaseError> {
        let t0 = self.store.round_trip().await?;
        let mut t = self.store.lock();
        let now = Instant::now();
        self.store.check_epoch(&mut t, now);
        t.audit.renew_many_calls += 1;
        Ok(leases.iter().map(|l| self.store.renew_one(&mut t, l, t0, now)).collect())
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.store.round_trip().await?;
        self.store.release(lease);
        Ok(())
    }

    async fn holders(&self, pool: Pool) -> Result<Vec<Holder>, LeaseError> {
        self.store.round_trip().await?;
        let t = self.store.lock();
        let now = Instant::now();
        let mut holders: Vec<Holder> = t
            .keys
            .iter()
            .filter(|((p, _), k)| *p == pool && k.expires > now)
            .map(|((p, n), k)| Holder {
                pool: *p,
                slot: *n,
                grant: k.grant.clone(),
                pod: k.grant.split(':').next().unwrap_or_default().to_owned(),
                ttl_ms: (k.expires - now).as_millis() as i64,
            })
            .collect();
        holders.sort_by_key(|h| h.slot);
        Ok(holders)
    }

    async fn report_amnesia(&self, evidence: &str) -> Result<Duration, LeaseError> {
        self.store.round_trip().await?;
        let mut t = self.store.lock();
        let until = Instant::now() + self.store.ttl();
        if t.quarantine_until.is_none_or(|u| u < until) {
            t.quarantine_until = Some(until);
            t.quarantine_reason = format!("partial amnesia: {evidence}");
        }
        t.audit.amnesia_reports.push(evidence.to_owned());
        Ok(self.store.ttl())
    }

    async fn quarantine(&self) -> Result<Option<Quarantine>, LeaseError> {
        self.store.round_trip().await?;
        let t = self.store.lock();
        let now = Instant::now();
        Ok(t.quarantine_until
            .filter(|u| *u > now)
            .map(|u| Quarantine { remaining_ms: (u - now).as_millis() as u64, reason: t.quarantine_reason.clone() }))
    }
}
