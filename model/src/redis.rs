//! The lease store as the Lua scripts see it: slot keys with a TTL, the epoch, the quarantine,
//! whether the server's identity changed since a script last looked, and one snapshot to roll
//! back to. Each operation here is one script call, atomic like in Redis.

use crate::config::{Config, Detection};
use crate::state::MAX;

/// Who a slot key was granted to; the nonce makes each grant unique (the real grant id is a pod
/// id plus a random nonce), so a pod that lost a slot and won it again holds a different grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub pod: u8,
    pub nonce: u8,
}

/// A slot key: the grant and the ticks left before Redis expires it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub grant: Grant,
    pub ttl: u8,
}

/// The data a restart or a restore can lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Store {
    pub keys: [Option<Key>; MAX],
    /// `cabine:{cluster}:epoch`; missing means amnesia (or a brand-new cluster).
    pub epoch: Option<u8>,
    /// Ticks left of the quarantine key (0 = none); it has a TTL, so eviction drops it.
    pub quarantine: u8,
}

impl Store {
    fn tick(&mut self) {
        for key in &mut self.keys {
            if let Some(k) = key {
                k.ttl -= 1;
                if k.ttl == 0 {
                    *key = None;
                }
            }
        }
        self.quarantine = self.quarantine.saturating_sub(1);
    }
}

/// The Redis server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Redis {
    pub data: Store,
    /// The last snapshot (RDB) the checker chose to take; its TTLs run on like the live keys'.
    pub snapshot: Option<Store>,
    /// The server restarted (new `run_id`) and no script has compared the stored one yet.
    pub identity_changed: bool,
}

/// What an acquire answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    Granted(Grant),
    /// Missing epoch, stale epoch, quarantine or slot taken.
    Refused,
}

/// What renew_many answered for one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewed {
    Extended,
    /// The key is missing or holds another grant.
    Gone,
    /// The epoch is missing or not the one the pod knows: every grant of the pod is void.
    Void,
}

impl Redis {
    pub fn initial(epoch: u8) -> Redis {
        Redis { data: Store { epoch: Some(epoch), ..Store::default() }, snapshot: None, identity_changed: false }
    }

    /// `epoch.lua` `check_epoch`, the identity half: a changed `run_id` starts a quarantine.
    fn check_identity(&mut self, cfg: &Config) {
        if self.identity_changed {
            self.identity_changed = false;
            self.start_quarantine(cfg);
        }
    }

    fn start_quarantine(&mut self, cfg: &Config) {
        if cfg.safeguards.quarantine {
            self.data.quarantine = self.data.quarantine.max(cfg.timing.quarantine());
        }
    }

    /// `epoch.lua` `check_epoch`: a changed identity starts a quarantine; a missing epoch is
    /// written afresh with a quarantine. Returns the current epoch and whether it is new.
    /// `epochs` counts the epoch values handed out so far (a fresh one differs from all).
    fn check_epoch(&mut self, cfg: &Config, epochs: &mut u8) -> (u8, bool) {
        self.check_identity(cfg);
        match self.data.epoch {
            Some(e) => (e, false),
            None => {
                *epochs += 1;
                let fresh = *epochs;
                self.data.epoch = Some(fresh);
                self.start_quarantine(cfg);
                (fresh, true)
            }
        }
    }

    /// Whether an acquire would change anything (else a standby pod has nothing to do).
    pub fn acquire_matters(&self, cfg: &Config, known: Option<u8>, slot: usize) -> bool {
        let identity = self.identity_changed && cfg.safeguards.detection == Detection::Prompt;
        identity
            || self.data.epoch.is_none()
            || known != self.data.epoch
            || (self.data.quarantine == 0 && self.data.keys[slot].is_none())
    }

    /// `acquire.lua`: returns the answer and the epoch the caller now knows.
    pub fn acquire(
        &mut self,
        cfg: &Config,
        known: Option<u8>,
        slot: usize,
        grant: Grant,
        epochs: &mut u8,
    ) -> (Acquired, u8) {
        let (epoch, new) = self.check_epoch(cfg, epochs);
        let stale = !new && known.is_some_and(|k| k != epoch);
        // A new epoch refuses through its quarantine (none when the quarantine is switched off).
        if stale || self.data.quarantine > 0 || self.data.keys[slot].is_some() {
            return (Acquired::Refused, epoch);
        }
        self.data.keys[slot] = Some(Key { grant, ttl: cfg.timing.ttl() });
        (Acquired::Granted(grant), epoch)
    }

    /// `renew_many.lua` for one pod's held slots: returns each slot's fate and the epoch the
    /// pod now knows.
    pub fn renew(
        &mut self,
        cfg: &Config,
        known: Option<u8>,
        held: &[(usize, Grant)],
        epochs: &mut u8,
    ) -> (Vec<(usize, Renewed)>, u8) {
        let (epoch, new) = self.check_epoch(cfg, epochs);
        let void = new || known != Some(epoch);
        let fates = held
            .iter()
            .map(|&(slot, grant)| {
                let fate = match self.data.keys[slot].as_mut() {
                    _ if void => Renewed::Void,
                    Some(key) if key.grant == grant => {
                        key.ttl = cfg.timing.ttl();
                        Renewed::Extended
                    }
                    _ => Renewed::Gone,
                };
                (slot, fate)
            })
            .collect();
        (fates, epoch)
    }

    /// `quarantine.lua` (`LeaseStore::report_amnesia`): a renew found amnesia.
    pub fn report_amnesia(&mut self, cfg: &Config) {
        self.check_identity(cfg);
        self.start_quarantine(cfg);
    }

    /// `release.lua`: compare-and-delete.
    pub fn release(&mut self, cfg: &Config, slot: usize, grant: Grant) {
        self.check_identity(cfg);
        if self.data.keys[slot].is_some_and(|k| k.grant == grant) {
            self.data.keys[slot] = None;
        }
    }

    /// Fault: a restart without persistence.
    pub fn forget(&mut self, cfg: &Config) {
        self.data = Store::default();
        self.identity_changed = cfg.safeguards.detection == Detection::Prompt;
    }

    /// Fault: eviction of every key with a TTL; the server is the same one.
    pub fn evict(&mut self) {
        self.data.keys = [None; MAX];
        self.data.quarantine = 0;
    }

    /// Fault: a restart from the last snapshot (a failover to a lagging replica looks the same).
    pub fn roll_back(&mut self, cfg: &Config) {
        if let Some(snapshot) = self.snapshot.take() {
            self.data = snapshot;
            self.identity_changed = cfg.safeguards.detection == Detection::Prompt;
        }
    }

    pub fn tick(&mut self) {
        self.data.tick();
        if let Some(s) = self.snapshot.as_mut() {
            s.tick();
        }
    }
}
