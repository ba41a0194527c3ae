//! Metrics of the leased slots: held slots per pool (this pod), grants,
//! refusals (full / quarantine), renew failures, leases lost by cause, amnesia.

use std::collections::HashMap;
use std::sync::{Mutex, Once};

use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{Lease, LostCause, Pool};
use tokio::time::Instant;

/// Refused because every slot is held.
pub const FULL: &str = "full";
/// Refused because of a quarantine (Redis amnesia or a fresh cluster).
pub const QUARANTINE: &str = "quarantine";

pub fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        metrics::describe_gauge!("cabine_lease_held", "Slots this pod holds (valid leases), per pool.");
        metrics::describe_counter!("cabine_lease_grants_total", "Leases granted to this pod, per pool.");
        metrics::describe_counter!(
            "cabine_lease_refusals_total",
            "Acquires refused, per pool and reason (full, quarantine)."
        );
        metrics::describe_counter!("cabine_lease_renew_failures_total", "Renew calls that failed as a whole.");
        metrics::describe_counter!("cabine_lease_lost_total", "Leases lost, per pool and cause.");
        metrics::describe_counter!(
            "cabine_lease_amnesia_total",
            "Redis amnesia seen by this pod (epoch missing: detected here; changed: detected by another pod)."
        );
        metrics::describe_histogram!("cabine_redis_round_trip_seconds", "Round trip of one coordination call.");
    });
}

pub fn granted(pool: Pool) {
    metrics::counter!("cabine_lease_grants_total", "pool" => pool.to_string()).increment(1);
}

pub fn refused(pool: Pool, reason: &'static str) {
    metrics::counter!("cabine_lease_refusals_total", "pool" => pool.to_string(), "reason" => reason).increment(1);
}

pub fn renew_failed() {
    metrics::counter!("cabine_lease_renew_failures_total").increment(1);
}

pub fn lost(pool: Pool, cause: LostCause) {
    let cause = match cause {
        LostCause::Expired => "expired",
        LostCause::Stolen => "stolen",
        LostCause::Missing => "missing",
        LostCause::Amnesia => "amnesia",
        LostCause::Unreachable => "unreachable",
    };
    metrics::counter!("cabine_lease_lost_total", "pool" => pool.to_string(), "cause" => cause).increment(1);
}

pub fn amnesia(detected: &'static str) {
    metrics::counter!("cabine_lease_amnesia_total", "detected" => detected).increment(1);
}

/// This pod's valid leases, for the `cabine_lease_held` gauge. Entries leave on
/// release, on loss and at `valid_until`, so the map never exceeds the leases
/// that can be valid at once.
#[derive(Default)]
pub struct HeldSlots {
    leases: Mutex<HashMap<String, (Pool, Instant)>>,
}

impl HeldSlots {
    pub fn hold(&self, lease: &Lease) {
        self.update(|m| {
            m.insert(lease.grant.0.clone(), (lease.pool, lease.valid_until));
        });
    }

    pub fn drop_grant(&self, grant: &str) {
        self.update(|m| {
            m.remove(grant);
        });
    }

    fn update(&self, f: impl FnOnce(&mut HashMap<String, (Pool, Instant)>)) {
        let mut map = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut map);
        let now = Instant::now();
        map.retain(|_, (_, until)| *until > now);
        let mut per_pool: HashMap<Pool, usize> = HashMap::new();
        for (pool, _) in map.values() {
            *per_pool.entry(*pool).or_default() += 1;
        }
        drop(map);
        for pool in all_pools() {
            let n = per_pool.get(&pool).copied().unwrap_or(0);
            metrics::gauge!("cabine_lease_held", "pool" => pool.to_string()).set(n as f64);
        }
    }
}

fn all_pools() -> impl Iterator<Item = Pool> {
    ChannelId::ALL.into_iter().flat_map(|c| [Pool::Stream(c), Pool::Send(c)]).chain([Pool::Leader])
}
