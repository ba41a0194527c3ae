//! The pod's lease ledger: every lease this pod holds (or is acquiring), keyed
//! by the owning actor's status id (`slot/cpm/3`, `leader`).
//!
//! LeaseHeartbeat renews what it lists here in one call per tick and tells the
//! owner when a lease is lost; supervisors release a failed child's entries
//! (ractor runs no `post_stop` on failure); fair share counts it. The owner's
//! poll task reads the current lease through a [`HeldLease`] (a watch channel)
//! and checks its validity before every request.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::ports::{GrantId, Lease, LostCause, Pool};

/// Called (outside the ledger's lock) when the heartbeat finds a lease lost.
pub type LostNotice = Box<dyn Fn(&GrantId, LostCause) + Send + Sync>;

/// What a holder's poll task sees of its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseView {
    Held(Lease),
    Lost(LostCause),
    /// Given back by the owner (handover, drain, cleanup).
    Released,
}

enum Entry {
    /// Counted for fair share while the acquire is in flight.
    Reserved(Pool),
    Held(Held),
}

struct Held {
    lease: Lease,
    view: watch::Sender<LeaseView>,
    on_lost: LostNotice,
    /// The owner's in-flight request task, aborted when the lease goes away.
    task: Option<AbortHandle>,
}

impl Held {
    fn end(self, view: LeaseView) -> Lease {
        if let Some(task) = &self.task {
            task.abort();
        }
        let _ = self.view.send(view);
        self.lease
    }
}

#[derive(Default)]
pub struct LeaseLedger {
    entries: Mutex<BTreeMap<String, Entry>>,
}

impl LeaseLedger {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves a place in `pool` for `owner` if the pod holds (or reserves) fewer than `limit`.
    pub fn reserve(&self, owner: &str, pool: Pool, limit: usize) -> bool {
        let mut entries = self.lock();
        let taken = entries.iter().filter(|(o, e)| o.as_str() != owner && entry_pool(e) == pool).count();
        if taken >= limit {
            return false;
        }
        entries.insert(owner.to_owned(), Entry::Reserved(pool));
        true
    }

    /// Drops `owner`'s reservation (not a held lease).
    pub fn cancel_reservation(&self, owner: &str) {
        let mut entries = self.lock();
        if matches!(entries.get(owner), Some(Entry::Reserved(_))) {
            entries.remove(owner);
        }
    }

    /// Records a granted lease; from now on the heartbeat renews it. A lease
    /// still recorded under `owner` is ended and returned, for the caller to
    /// release in the store (else it would stay held until its TTL).
    pub fn hold(&self, owner: &str, lease: Lease, on_lost: LostNotice) -> (HeldLease, Option<Lease>) {
        let (view, rx) = watch::channel(LeaseView::Held(lease.clone()));
        let previous = self.lock().insert(owner.to_owned(), Entry::Held(Held { lease, view, on_lost, task: None }));
        let replaced = match previous {
            Some(Entry::Held(old)) => Some(old.end(LeaseView::Released)),
            _ => None,
        };
        (HeldLease { rx }, replaced)
    }

    /// Ties the owner's request task to its lease: losing or releasing the lease aborts it.
    pub fn attach_task(&self, owner: &str, task: AbortHandle) {
        if let Some(Entry::Held(held)) = self.lock().get_mut(owner) {
            held.task = Some(task);
        }
    }

    /// Unties the owner's task from its lease: the task is about to give the lease back itself.
    pub fn detach_task(&self, owner: &str) {
        if let Some(Entry::Held(held)) = self.lock().get_mut(owner) {
            held.task = None;
        }
    }

    /// Removes `owner`'s entry; returns its lease for the caller to release in the store.
    pub fn remove(&self, owner: &str) -> Option<Lease> {
        match self.lock().remove(owner)? {
            Entry::Held(held) => Some(held.end(LeaseView::Released)),
            Entry::Reserved(_) => None,
        }
    }

    /// Removes every entry whose owner matches (a failed subtree); aborts their tasks.
    pub fn take_owned(&self, owned: impl Fn(&str) -> bool) -> Vec<Lease> {
        let mut entries = self.lock();
        let owners: Vec<String> = entries.keys().filter(|o| owned(o)).cloned().collect();
        owners
            .into_iter()
            .filter_map(|o| match entries.remove(&o)? {
                Entry::Held(held) => Some(held.end(LeaseView::Released)),
                Entry::Reserved(_) => None,
            })
            .collect()
    }

    /// Every held lease with its owner: what the heartbeat renews.
    pub fn held(&self) -> Vec<(String, Lease)> {
        self.lock()
            .iter()
            .filter_map(|(o, e)| match e {
                Entry::Held(h) => Some((o.clone(), h.lease.clone())),
                Entry::Reserved(_) => None,
            })
            .collect()
    }

    /// Applies a `renew_many` answer for `sent` (same order). Entries released or
    /// re-granted meanwhile are left alone. Returns the owners that lost their lease.
    pub fn apply_renewals(
        &self,
        sent: &[(String, Lease)],
        answers: Vec<Result<Lease, LostCause>>,
    ) -> Vec<(String, LostCause)> {
        let mut lost = Vec::new();
        let mut notices = Vec::new();
        {
            let mut entries = self.lock();
            for ((owner, lease), answer) in sent.iter().zip(answers) {
                let same_grant = matches!(entries.get(owner), Some(Entry::Held(h)) if h.lease.grant == lease.grant);
                if !same_grant {
                    continue;
                }
                match answer {
                    Ok(renewed) => {
                        if let Some(Entry::Held(h)) = entries.get_mut(owner) {
                            h.lease.valid_until = h.lease.valid_until.max(renewed.valid_until);
                            let _ = h.view.send(LeaseView::Held(h.lease.clone()));
                        }
                    }
                    Err(cause) => {
                        if let Some(Entry::Held(h)) = entries.remove(owner) {
                            notices.push((h.on_lost, h.lease.grant.clone(), cause));
                            let _ = h.view.send(LeaseView::Lost(cause));
                            if let Some(t) = h.task {
                                t.abort();
                            }
                        }
                        lost.push((owner.clone(), cause));
                    }
                }
            }
        }
        for (notice, grant, cause) in notices {
            notice(&grant, cause);
        }
        lost
    }

    /// Marks as lost every lease whose local validity has passed (renewals failing).
    pub fn expire_overdue(&self, cause: LostCause) -> Vec<(String, LostCause)> {
        let overdue: Vec<(String, Lease)> = self.held().into_iter().filter(|(_, l)| !l.is_valid()).collect();
        let answers = overdue.iter().map(|_| Err(cause)).collect();
        self.apply_renewals(&overdue, answers)
    }

    /// Slots of `pool` held by this pod (reservations excluded), ascending.
    pub fn held_slots(&self, pool: Pool) -> Vec<u8> {
        let mut slots: Vec<u8> = self
            .lock()
            .values()
            .filter_map(|e| match e {
                Entry::Held(h) if h.lease.pool == pool => Some(h.lease.slot),
                _ => None,
            })
            .collect();
        slots.sort_unstable();
        slots
    }

    /// `owner`'s current lease, if held.
    pub fn lease_of(&self, owner: &str) -> Option<Lease> {
        match self.lock().get(owner) {
            Some(Entry::Held(h)) => Some(h.lease.clone()),
            _ => None,
        }
    }

    /// Held slots as `pool/slot` strings (`cpm:stream/3`), for the pod's heartbeat.
    pub fn held_names(&self) -> Vec<String> {
        self.held().into_iter().map(|(_, l)| slot_name(l.pool, l.slot)).collect()
    }
}

/// `cpm:stream/3`: how a held slot is named in heartbeats and status pages.
pub fn slot_name(pool: Pool, slot: u8) -> String {
    format!("{pool}/{slot}")
}

fn entry_pool(e: &Entry) -> Pool {
    match e {
        Entry::Reserved(p) => *p,
        Entry::Held(h) => h.lease.pool,
    }
}

/// A holder's live view of its lease (renewals included).
#[derive(Clone)]
pub struct HeldLease {
    rx: watch::Receiver<LeaseView>,
}

impl HeldLease {
    pub fn view(&self) -> LeaseView {
        self.rx.borrow().clone()
    }

    /// The lease if still held.
    pub fn current(&self) -> Option<Lease> {
        match &*self.rx.borrow() {
            LeaseView::Held(l) => Some(l.clone()),
            _ => None,
        }
    }

    /// Waits (at most `patience`) until the lease is valid for a request of
    /// `request`; a lease lost, released or not renewed in time is an error.
    pub async fn ready_for(&mut self, request: Duration, patience: Duration) -> Result<(), LostCause> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match self.view() {
                LeaseView::Held(l) if l.is_valid_for(request) => return Ok(()),
                LeaseView::Held(_) => {}
                LeaseView::Lost(cause) => return Err(cause),
                LeaseView::Released => return Err(LostCause::Missing),
            }
            match tokio::time::timeout_at(deadline, self.rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(LostCause::Missing),
                Err(_) => return Err(LostCause::Expired),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::time::Instant;

    use super::*;
    use crate::domain::ChannelId;

    fn lease(slot: u8, grant: &str, secs: u64) -> Lease {
        Lease {
            pool: Pool::Stream(ChannelId::Cpm),
            slot,
            grant: GrantId(grant.into()),
            valid_until: Instant::now() + Duration::from_secs(secs),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reservations_cap_a_pool_and_renewals_reach_the_holder() {
        let ledger = LeaseLedger::default();
        let pool = Pool::Stream(ChannelId::Cpm);
        assert!(ledger.reserve("slot/cpm/1", pool, 2));
        assert!(ledger.reserve("slot/cpm/2", pool, 2));
        assert!(!ledger.reserve("slot/cpm/3", pool, 2));
        ledger.cancel_reservation("slot/cpm/2");
        let (mut held, _) = ledger.hold("slot/cpm/1", lease(1, "g1", 2), Box::new(|_, _| {}));
        assert_eq!(ledger.held_slots(pool), vec![1]);
        let sent = ledger.held();
        let renewed = lease(1, "g1", 10);
        assert!(ledger.apply_renewals(&sent, vec![Ok(renewed.clone())]).is_empty());
        assert_eq!(held.current(), Some(renewed));
        assert_eq!(held.ready_for(Duration::from_secs(9), Duration::ZERO).await, Ok(()));
        assert_eq!(held.ready_for(Duration::from_secs(11), Duration::from_secs(1)).await, Err(LostCause::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_notifies_its_owner_once_and_stale_answers_change_nothing() {
        let ledger = LeaseLedger::default();
        let lost = Arc::new(AtomicUsize::new(0));
        let counter = lost.clone();
        let (held, _) = ledger.hold(
            "slot/cpm/1",
            lease(1, "g1", 2),
            Box::new(move |_, _| _ = counter.fetch_add(1, Ordering::SeqCst)),
        );
        let sent = ledger.held();
        // Re-granted meanwhile: the old answer is ignored, the replaced grant is handed back for release.
        let (_fresh, replaced) = ledger.hold("slot/cpm/1", lease(1, "g2", 2), Box::new(|_, _| {}));
        assert_eq!(replaced.map(|l| l.grant), Some(GrantId("g1".into())));
        assert!(ledger.apply_renewals(&sent, vec![Err(LostCause::Stolen)]).is_empty());
        assert_eq!(held.view(), LeaseView::Released);
        let sent = ledger.held();
        let g2_lost = Arc::new(AtomicUsize::new(0));
        let c2 = g2_lost.clone();
        let _again =
            ledger.hold("slot/cpm/1", lease(1, "g2", 2), Box::new(move |_, _| _ = c2.fetch_add(1, Ordering::SeqCst)));
        let out = ledger.apply_renewals(&sent, vec![Err(LostCause::Amnesia)]);
        assert_eq!(out, vec![("slot/cpm/1".to_owned(), LostCause::Amnesia)]);
        assert_eq!(g2_lost.load(Ordering::SeqCst), 1);
        assert_eq!(lost.load(Ordering::SeqCst), 0);
        assert!(ledger.held().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overdue_leases_expire_and_subtrees_are_taken_whole() {
        let ledger = LeaseLedger::default();
        ledger.hold("slot/cpm/1", lease(1, "a", 1), Box::new(|_, _| {}));
        ledger.hold("slot/cpm/2", lease(2, "b", 5), Box::new(|_, _| {}));
        ledger.hold("leader", Lease { pool: Pool::Leader, ..lease(1, "c", 5) }, Box::new(|_, _| {}));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(ledger.expire_overdue(LostCause::Unreachable).len(), 1);
        assert_eq!(ledger.held_names(), vec!["leader/1".to_owned(), "cpm:stream/2".to_owned()]);
        let taken = ledger.take_owned(|o| o.starts_with("slot/cpm/"));
        assert_eq!(taken.len(), 1);
        assert_eq!(ledger.lease_of("leader").map(|l| l.slot), Some(1));
    }
}
