//! This pod's view of Redis's memory: the epoch it last saw and its LOCAL
//! quarantine. Once this pod has seen amnesia (or a running quarantine), it
//! grants itself nothing until the quarantine ends, even if Redis forgets the
//! quarantine key again.

use std::time::Duration;

use tokio::time::Instant;

/// What a grant/renew script said about the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochState {
    /// Nothing happened.
    Same,
    /// The epoch key was missing; this call wrote a new one and the quarantine.
    Amnesia,
    /// Another Redis server (restart from a snapshot, failover): a quarantine
    /// runs, leases whose key survived go on.
    Restarted,
    /// The epoch differs from the one we knew: another pod saw amnesia.
    Changed,
}

impl EpochState {
    pub fn parse(s: &str) -> Option<EpochState> {
        match s {
            "same" => Some(EpochState::Same),
            "amnesia" => Some(EpochState::Amnesia),
            "restarted" => Some(EpochState::Restarted),
            "changed" => Some(EpochState::Changed),
            _ => None,
        }
    }
}

/// Known epoch + local quarantine deadline. Held under a short mutex, never across an await.
#[derive(Debug, Default)]
pub struct EpochView {
    known: Option<String>,
    quarantine_until: Option<Instant>,
}

impl EpochView {
    /// The epoch to send as "known" ('' when this pod has seen none yet).
    pub fn known(&self) -> String {
        self.known.clone().unwrap_or_default()
    }

    /// Time left in the local quarantine, if any.
    pub fn quarantine_left(&self, now: Instant) -> Option<Duration> {
        self.quarantine_until.map(|until| until.saturating_duration_since(now)).filter(|d| !d.is_zero())
    }

    /// This pod starts (or extends) its local quarantine to `now + left`.
    pub fn quarantine_for(&mut self, left: Duration, now: Instant) {
        let until = now + left;
        self.quarantine_until = Some(self.quarantine_until.map_or(until, |u| u.max(until)));
    }

    /// Records a reply: the epoch Redis holds now and the quarantine left there
    /// (`left`, measured from `now`, the reply's arrival — later than the detection).
    /// Returns true when this moved the known epoch (news worth logging once per pod).
    pub fn observe(&mut self, epoch: &str, left: Duration, now: Instant) -> bool {
        let moved = self.known.as_deref().is_some_and(|known| known != epoch);
        self.known = Some(epoch.to_owned());
        if !left.is_zero() {
            let until = now + left;
            self.quarantine_until = Some(self.quarantine_until.map_or(until, |u| u.max(until)));
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_quarantine_only_grows_and_outlives_redis() {
        let now = Instant::now();
        let mut v = EpochView::default();
        assert_eq!(v.known(), "");
        assert!(!v.observe("e1", Duration::from_secs(5), now), "adopting the first epoch is no news");
        assert_eq!(v.known(), "e1");
        // Redis forgot the quarantine again: the local rule still holds.
        assert!(!v.observe("e1", Duration::ZERO, now + Duration::from_secs(1)));
        assert_eq!(v.quarantine_left(now + Duration::from_secs(1)), Some(Duration::from_secs(4)));
        assert!(v.observe("e2", Duration::from_secs(1), now + Duration::from_secs(2)));
        assert_eq!(v.known(), "e2");
        assert_eq!(v.quarantine_left(now + Duration::from_secs(2)), Some(Duration::from_secs(3)));
        assert_eq!(v.quarantine_left(now + Duration::from_secs(5)), None);
    }
}
