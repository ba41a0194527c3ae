//! The Redis adapter of the lease port (DESIGN §3): one Lua call per
//! operation, local validity `t0 + lease − drift_margin` with `t0` taken before
//! the command is sent, Redis TTL `lease + lock_delay`, and the amnesia
//! quarantine (epoch key checked inside every acquire and renew).

use std::sync::Mutex;
use std::time::Duration;

use cabine_actors::ports::{Acquired, GrantId, Holder, Lease, LeaseError, LeaseStore, LostCause, Pool, Quarantine};
use fred::prelude::{Client, KeysInterface, Value};
use fred::types::scripts::Script;
use tokio::time::Instant;

use super::epoch::{EpochState, EpochView};
use super::grant;
use super::keys::KeyLayout;
use super::lease_metrics::{self as m, HeldSlots};
use super::scripts::{self, SCRIPTS, ScriptError};
use crate::config::Settings;

/// Everything the adapter is told at start.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub keys: KeyLayout,
    /// First part of every grant id.
    pub pod_id: String,
    /// Slots per channel of the stream and send pools (the leader pool has 1).
    pub stream_slots: u8,
    pub send_slots: u8,
    pub lease: Duration,
    pub lock_delay: Duration,
    pub drift_margin: Duration,
    /// Every call fails with `Unavailable` (or loses its leases) past this.
    pub command_timeout: Duration,
}

impl LeaseConfig {
    pub fn from_settings(s: &Settings, pod_id: &str) -> LeaseConfig {
        LeaseConfig {
            keys: KeyLayout::new(&s.redis.prefix, &s.cluster.name, s.cluster.ispb.as_str()),
            pod_id: pod_id.to_owned(),
            stream_slots: s.pools.stream.get(),
            send_slots: s.pools.send.get(),
            lease: s.timing.lease,
            lock_delay: s.timing.lock_delay,
            drift_margin: s.timing.drift_margin,
            command_timeout: s.redis.command_timeout,
        }
    }

    pub fn pool_size(&self, pool: Pool) -> u8 {
        match pool {
            Pool::Stream(_) => self.stream_slots,
            Pool::Send(_) => self.send_slots,
            Pool::Leader => 1,
        }
    }

    /// Redis TTL of a slot, and the length of an amnesia quarantine.
    pub fn ttl(&self) -> Duration {
        self.lease + self.lock_delay
    }

    /// How long after `t0` a lease may be used.
    pub fn validity(&self) -> Duration {
        self.lease.saturating_sub(self.drift_margin)
    }
}

/// Leased slots in Redis.
pub struct RedisLeaseStore {
    client: Client,
    config: LeaseConfig,
    epoch: Mutex<EpochView>,
    held: HeldSlots,
}

/// The epoch part common to the acquire/renew replies.
struct EpochReply {
    state: EpochState,
    epoch: String,
    left: Duration,
}

impl RedisLeaseStore {
    pub fn new(client: Client, config: LeaseConfig) -> RedisLeaseStore {
        m::describe();
        RedisLeaseStore { client, config, epoch: Mutex::default(), held: HeldSlots::default() }
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// SCRIPT LOAD of every script (later calls reload on NOSCRIPT anyway).
    pub async fn load_scripts(&self) -> Result<(), LeaseError> {
        scripts::load_all(&self.client, self.config.command_timeout).await.map_err(to_lease_error)
    }

    fn view(&self) -> std::sync::MutexGuard<'_, EpochView> {
        self.epoch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn candidates(&self, pool: Pool, slot: Option<u8>) -> Result<Vec<u8>, LeaseError> {
        let size = self.config.pool_size(pool);
        match slot {
            None => Ok((1..=size).collect()),
            Some(n) if (1..=size).contains(&n) => Ok(vec![n]),
            Some(n) => Err(LeaseError::Fatal(format!("slot {n} is outside pool {pool} of {size}"))),
        }
    }

    /// KEYS of a grant/renew script: epoch, quarantine, server, then the slots.
    fn keys(&self, slots: impl IntoIterator<Item = String>) -> Vec<String> {
        let k = &self.config.keys;
        let mut keys = vec![k.epoch(), k.quarantine(), k.server()];
        keys.extend(slots);
        keys
    }

    /// ARGV head of a grant/renew script: known epoch, fresh epoch, quarantine ms, TTL ms.
    fn epoch_args(&self, known: String) -> Vec<Value> {
        let ttl = millis(self.config.ttl());
        vec![known.into(), grant::fresh_epoch().into(), ttl.into(), ttl.into()]
    }

    async fn call(
        &self,
        op: &'static str,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Vec<Value>, ScriptError> {
        let reply = scripts::call(&self.client, op, script, keys, args, self.config.command_timeout).await?;
        scripts::array(op, reply)
    }

    /// Records what a reply said about the epoch; loud when it is amnesia.
    fn observe(&self, reply: &EpochReply, arrived: Instant) {
        let moved = self.view().observe(&reply.epoch, reply.left, arrived);
        match reply.state {
            EpochState::Same => {}
            EpochState::Changed if !moved => {} // another task of this pod already saw it
            EpochState::Amnesia => {
                m::amnesia("missing");
                tracing::error!(
                    epoch = %reply.epoch, quarantine = ?reply.left,
                    "REDIS AMNESIA: the epoch key was gone; every lease is lost and no pool grants anything \
                     during the quarantine (a brand-new cluster looks the same and waits once)"
                );
            }
            EpochState::Restarted if !moved => {
                m::amnesia("restarted");
                tracing::error!(
                    epoch = %reply.epoch, quarantine = ?reply.left,
                    "REDIS SERVER CHANGED (restart from a snapshot, failover): its keys may be from the past; \
                     no pool grants anything during the quarantine, leases whose key survived go on"
                );
            }
            EpochState::Restarted => {}
            EpochState::Changed => {
                m::amnesia("changed");
                tracing::warn!(
                    epoch = %reply.epoch, quarantine = ?reply.left,
                    "redis epoch changed (amnesia seen by another pod): every lease of the old epoch is lost"
                );
            }
        }
    }

    fn lost(&self, lease: &Lease, cause: LostCause) -> LostCause {
        m::lost(lease.pool, cause);
        self.held.drop_grant(&lease.grant.0);
        cause
    }

    fn renewed(&self, lease: &Lease, t0: Instant) -> Lease {
        let renewed = Lease { valid_until: t0 + self.config.validity(), ..lease.clone() };
        self.held.hold(&renewed);
        renewed
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_lease_error(e: ScriptError) -> LeaseError {
    match e {
        ScriptError::Unavailable { .. } => LeaseError::Unavailable(e.to_string()),
        ScriptError::Fatal { .. } => LeaseError::Fatal(e.to_string()),
    }
}

fn grant_epoch(lease: &Lease) -> Result<String, LeaseError> {
    grant::parse(&lease.grant.0)
        .map(|p| p.epoch.to_owned())
        .ok_or_else(|| LeaseError::Fatal(format!("grant {} was not made by this adapter", lease.grant)))
}

/// Parses `{state, epoch, left ms, …}`; `state` also takes the acquire codes,
/// and after `granted` / `full` the third item is not a quarantine.
fn epoch_reply(op: &'static str, items: &[Value]) -> Result<(String, EpochReply), ScriptError> {
    let [state, epoch, left, ..] = items else {
        return Err(scripts::bad_reply(op, &Value::Array(items.to_vec())));
    };
    let code = scripts::text(op, state)?;
    let left = if matches!(code.as_str(), "granted" | "full") { 0 } else { scripts::int(op, left)?.max(0) };
    let reply = EpochReply {
        state: EpochState::parse(&code).unwrap_or(EpochState::Same),
        epoch: scripts::text(op, epoch)?,
        left: Duration::from_millis(left as u64),
    };
    Ok((code, reply))
}

/// The lease in an acquire reply `{'granted', epoch, n, grant}`: candidate `n` of `slots`.
fn granted_lease(pool: Pool, slots: &[u8], items: &[Value], valid_until: Instant) -> Result<Lease, LeaseError> {
    let bad = || to_lease_error(scripts::bad_reply("acquire", &Value::Array(items.to_vec())));
    let taken = items.get(2).and_then(Value::as_i64).and_then(|n| usize::try_from(n).ok());
    let slot = taken.and_then(|n| n.checked_sub(1)).and_then(|i| slots.get(i)).copied().ok_or_else(bad)?;
    let grant = items.get(3).and_then(Value::as_string).filter(|g| !g.is_empty()).ok_or_else(bad)?;
    Ok(Lease { pool, slot, grant: GrantId(grant), valid_until })
}

/// Per-slot outcome of renew.lua / renew_many.lua.
fn renew_outcome(op: &'static str, v: &Value) -> Result<Result<(), LostCause>, ScriptError> {
    match scripts::int(op, v)? {
        1 => Ok(Ok(())),
        0 => Ok(Err(LostCause::Missing)),
        -1 => Ok(Err(LostCause::Stolen)),
        -2 => Ok(Err(LostCause::Amnesia)),
        _ => Err(scripts::bad_reply(op, v)),
    }
}

#[async_trait::async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn acquire(&self, pool: Pool, slot: Option<u8>) -> Result<Acquired, LeaseError> {
        let slots = self.candidates(pool, slot)?;
        let local = self.view().quarantine_left(Instant::now());
        if let Some(remaining) = local {
            m::refused(pool, m::QUARANTINE);
            return Ok(Acquired::Quarantined { remaining });
        }
        let keys = self.keys(slots.iter().map(|n| self.config.keys.slot(pool, *n)));
        let mut args = self.epoch_args(self.view().known());
        args.extend([self.config.pod_id.clone().into(), grant::nonce().into()]);
        let t0 = Instant::now();
        let items = self.call("acquire", &SCRIPTS.acquire, keys, args).await.map_err(to_lease_error)?;
        let arrived = Instant::now();
        let (code, reply) = epoch_reply("acquire", &items).map_err(to_lease_error)?;
        self.observe(&reply, arrived);
        match code.as_str() {
            "granted" => {
                let lease = granted_lease(pool, &slots, &items, t0 + self.config.validity())?;
                self.held.hold(&lease);
                m::granted(pool);
                Ok(Acquired::Granted(lease))
            }
            "full" => {
                m::refused(pool, m::FULL);
                Ok(Acquired::Full)
            }
            "quarantined" | "amnesia" | "restarted" | "changed" => {
                m::refused(pool, m::QUARANTINE);
                let local = self.view().quarantine_left(Instant::now()).unwrap_or_default();
                Ok(Acquired::Quarantined { remaining: local.max(reply.left) })
            }
            _ => Err(to_lease_error(scripts::bad_reply("acquire", &Value::Array(items)))),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let granted_in = grant_epoch(lease)?;
        if !lease.is_valid() {
            return Err(LeaseError::Lost(self.lost(lease, LostCause::Expired)));
        }
        let keys = self.keys([self.config.keys.slot(lease.pool, lease.slot)]);
        let mut args = self.epoch_args(granted_in);
        args.push(lease.grant.0.clone().into());
        let t0 = Instant::now();
        let items = match self.call("renew", &SCRIPTS.renew, keys, args).await {
            Ok(items) => items,
            Err(e) => {
                m::renew_failed();
                return Err(match e {
                    ScriptError::Unavailable { .. } => LeaseError::Lost(self.lost(lease, LostCause::Unreachable)),
                    fatal => to_lease_error(fatal),
                });
            }
        };
        let arrived = Instant::now();
        let (_, reply) = epoch_reply("renew", &items).map_err(to_lease_error)?;
        self.observe(&reply, arrived);
        let outcome = items.get(3).ok_or_else(|| scripts::bad_reply("renew", &Value::Null));
        let outcome = outcome.and_then(|v| renew_outcome("renew", v)).map_err(to_lease_error)?;
        match outcome {
            _ if arrived >= lease.valid_until => Err(LeaseError::Lost(self.lost(lease, LostCause::Expired))),
            Ok(()) => Ok(self.renewed(lease, t0)),
            Err(cause) => Err(LeaseError::Lost(self.lost(lease, cause))),
        }
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease, LostCause>>, LeaseError> {
        let epochs = leases.iter().map(grant_epoch).collect::<Result<Vec<_>, _>>()?;
        let (sent, expired): (Vec<usize>, Vec<usize>) = (0..leases.len()).partition(|&i| leases[i].is_valid());
        let mut out: Vec<Result<Lease, LostCause>> = vec![Err(LostCause::Expired); leases.len()];
        for i in expired {
            self.lost(&leases[i], LostCause::Expired);
        }
        if sent.is_empty() {
            return Ok(out);
        }
        let keys = self.keys(sent.iter().map(|&i| self.config.keys.slot(leases[i].pool, leases[i].slot)));
        let mut args = self.epoch_args(self.view().known());
        for &i in &sent {
            args.extend([leases[i].grant.0.clone().into(), epochs[i].clone().into()]);
        }
        let t0 = Instant::now();
        let items = match self.call("renew_many", &SCRIPTS.renew_many, keys, args).await {
            Ok(items) => items,
            Err(e) => {
                m::renew_failed();
                if matches!(e, ScriptError::Fatal { .. }) {
                    return Err(to_lease_error(e));
                }
                for &i in &sent {
                    out[i] = Err(self.lost(&leases[i], LostCause::Unreachable));
                }
                return Ok(out);
            }
        };
        let arrived = Instant::now();
        let (_, reply) = epoch_reply("renew_many", &items).map_err(to_lease_error)?;
        self.observe(&reply, arrived);
        if items.len() != 3 + sent.len() {
            return Err(to_lease_error(scripts::bad_reply("renew_many", &Value::Array(items))));
        }
        for (k, &i) in sent.iter().enumerate() {
            let lease = &leases[i];
            out[i] = match renew_outcome("renew_many", &items[3 + k]).map_err(to_lease_error)? {
                _ if arrived >= lease.valid_until => Err(self.lost(lease, LostCause::Expired)),
                Ok(()) => Ok(self.renewed(lease, t0)),
                Err(cause) => Err(self.lost(lease, cause)),
            };
        }
        Ok(out)
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.held.drop_grant(&lease.grant.0);
        let keys = vec![self.config.keys.slot(lease.pool, lease.slot)];
        let args = vec![Value::from(lease.grant.0.clone())];
        let timeout = self.config.command_timeout;
        scripts::call(&self.client, "release", &SCRIPTS.release, keys, args, timeout).await.map_err(to_lease_error)?;
        Ok(())
    }

    async fn holders(&self, pool: Pool) -> Result<Vec<Holder>, LeaseError> {
        let keys: Vec<String> = (1..=self.config.pool_size(pool)).map(|n| self.config.keys.slot(pool, n)).collect();
        let items = self.call("holders", &SCRIPTS.holders, keys, Vec::new()).await.map_err(to_lease_error)?;
        items
            .chunks(3)
            .map(|c| {
                let [slot, grant, ttl] = c else { return Err(scripts::bad_reply("holders", &Value::Null)) };
                let grant = scripts::text("holders", grant)?;
                let pod = grant::parse(&grant).map_or(grant.clone(), |p| p.pod.to_owned());
                let slot = u8::try_from(scripts::int("holders", slot)?).unwrap_or(0);
                Ok(Holder { pool, slot, grant, pod, ttl_ms: scripts::int("holders", ttl)? })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_lease_error)
    }

    async fn report_amnesia(&self, evidence: &str) -> Result<Duration, LeaseError> {
        // This pod quarantines itself first, whatever becomes of the call.
        self.view().quarantine_for(self.config.ttl(), Instant::now());
        let keys = vec![self.config.keys.quarantine()];
        let args = vec![Value::from(millis(self.config.ttl())), Value::from(evidence.to_owned())];
        let timeout = self.config.command_timeout;
        let reply = scripts::call(&self.client, "quarantine", &SCRIPTS.quarantine, keys, args, timeout)
            .await
            .map_err(to_lease_error)?;
        let left = Duration::from_millis(
            u64::try_from(scripts::int("quarantine", &reply).map_err(to_lease_error)?).unwrap_or(0),
        );
        self.view().quarantine_for(left, Instant::now());
        m::amnesia("partial");
        Ok(left)
    }

    async fn quarantine(&self) -> Result<Option<Quarantine>, LeaseError> {
        let key = self.config.keys.quarantine();
        let timeout = self.config.command_timeout;
        let read = async {
            let reason: Option<String> = self.client.get(&key).await?;
            let left: i64 = self.client.pttl(&key).await?;
            Ok::<_, fred::error::Error>((reason, left))
        };
        match tokio::time::timeout(timeout, read).await {
            Err(_) => Err(LeaseError::Unavailable(format!("quarantine read: no reply within {timeout:?}"))),
            Ok(Err(e)) => Err(LeaseError::Unavailable(format!("quarantine read: {e}"))),
            Ok(Ok((Some(reason), left))) if left > 0 => {
                Ok(Some(Quarantine { remaining_ms: u64::try_from(left).unwrap_or(0), reason }))
            }
            Ok(Ok(_)) => Ok(None),
        }
    }
}
