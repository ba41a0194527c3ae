//! Fair share of a channel's stream slots across live pods (DESIGN §4).
//!
//! With `P` live pods (from heartbeat keys) and `N` slots, pods sorted by id
//! get a quota of `floor(N/P)`, the first `N mod P` one more: the quotas sum to
//! exactly `N` and none exceeds `ceil(N/P)`. A pod holds more than its quota
//! only while no other live pod is waiting (holding fewer than its own quota);
//! a standby acquires only below its pod's quota. Extras are handed over from
//! the highest-numbered slots, gracefully, between poll cycles.

use std::sync::{Arc, RwLock};

use crate::domain::ChannelId;
use crate::ports::{PodBeat, Pool};

/// The live pods as the heartbeat last read them; `None` until the first read.
#[derive(Clone, Default)]
pub struct ClusterView {
    pods: Arc<RwLock<Option<Vec<PodBeat>>>>,
}

impl ClusterView {
    pub fn set(&self, pods: Vec<PodBeat>) {
        *self.pods.write().unwrap_or_else(|p| p.into_inner()) = Some(pods);
    }

    pub fn pods(&self) -> Option<Vec<PodBeat>> {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// One channel's pool as seen from pod `me`.
pub struct Share<'a> {
    pub me: &'a str,
    pub pods: &'a [PodBeat],
    pub channel: ChannelId,
    /// Stream slots per channel (N).
    pub slots: u8,
}

impl Share<'_> {
    /// Live pod ids, sorted, this pod included even before its first beat lands.
    fn live_ids(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self.pods.iter().map(|p| p.pod_id.as_str()).collect();
        ids.push(self.me);
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// How many slots of the channel `pod` should hold.
    pub fn quota(&self, pod: &str) -> usize {
        let ids = self.live_ids();
        let (n, p) = (usize::from(self.slots), ids.len());
        let rank = ids.iter().position(|i| *i == pod).unwrap_or(p);
        n / p + usize::from(rank < n % p)
    }

    fn held_by(&self, beat: &PodBeat) -> usize {
        let prefix = format!("{}/", Pool::Stream(self.channel));
        beat.held.iter().filter(|h| h.starts_with(&prefix)).count()
    }

    /// Another live pod holds fewer slots than its quota.
    pub fn someone_waiting(&self) -> bool {
        self.pods.iter().filter(|p| p.pod_id != self.me).any(|p| self.held_by(p) < self.quota(&p.pod_id))
    }

    /// What a standby of this pod may acquire up to (its reservation limit).
    pub fn acquire_limit(&self) -> usize {
        self.quota(self.me)
    }

    /// Should slot `n`, held by this pod together with `my_held`, be handed over?
    pub fn must_hand_over(&self, n: u8, my_held: &[u8]) -> bool {
        let quota = self.quota(self.me);
        if my_held.len() <= quota || !self.someone_waiting() {
            return false;
        }
        let mut sorted = my_held.to_vec();
        sorted.sort_unstable();
        sorted.iter().position(|s| *s == n).is_some_and(|rank| rank >= quota)
    }

    /// On drain: close slot `n`'s stream unless another live pod runs slot `n`
    /// (no other pod, or the pool shrank below `n` on the others). A pod that
    /// did not say its pool size is assumed to run it.
    pub fn close_on_drain(&self, n: u8) -> bool {
        !self.pods.iter().filter(|p| p.pod_id != self.me).any(|p| p.streams.get(&self.channel).is_none_or(|s| *s >= n))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::ledger::slot_name;

    fn beat(pod: &str, held: &[u8]) -> PodBeat {
        PodBeat {
            pod_id: pod.into(),
            pid: 1,
            version: "t".into(),
            uptime_s: 0,
            held: held.iter().map(|n| slot_name(Pool::Stream(ChannelId::Cpm), *n)).collect(),
            streams: BTreeMap::from([(ChannelId::Cpm, 4)]),
        }
    }

    fn share<'a>(me: &'a str, pods: &'a [PodBeat]) -> Share<'a> {
        Share { me, pods, channel: ChannelId::Cpm, slots: 4 }
    }

    #[test]
    fn a_lone_pod_takes_everything_and_a_newcomer_gets_half() {
        let alone = [beat("a", &[1, 2, 3, 4])];
        assert_eq!(share("a", &alone).acquire_limit(), 4);
        let two = [beat("a", &[1, 2, 3, 4]), beat("b", &[])];
        let a = share("a", &two);
        assert!(a.someone_waiting());
        assert_eq!(a.quota("a"), 2);
        assert!(!a.must_hand_over(2, &[1, 2, 3, 4]));
        assert!(a.must_hand_over(3, &[1, 2, 3, 4]));
        assert!(a.must_hand_over(4, &[1, 2, 3, 4]));
    }

    #[test]
    fn nobody_hands_over_while_no_one_waits() {
        let three = [beat("a", &[1, 2]), beat("b", &[3]), beat("c", &[4])];
        for me in ["a", "b", "c"] {
            assert!(!share(me, &three).someone_waiting(), "{me}");
        }
        // b holds two, c none: c waits, b (quota 1) gives its highest away.
        let skewed = [beat("a", &[1, 2]), beat("b", &[3, 4]), beat("c", &[])];
        assert!(share("b", &skewed).must_hand_over(4, &[3, 4]));
        assert!(!share("a", &skewed).must_hand_over(2, &[1, 2]));
    }

    #[test]
    fn drain_closes_only_streams_no_other_pod_runs() {
        let alone = [beat("a", &[1])];
        assert!(share("a", &alone).close_on_drain(1));
        let mut shrunk = beat("b", &[]);
        shrunk.streams.insert(ChannelId::Cpm, 2);
        let pods = [beat("a", &[]), shrunk];
        assert!(!share("a", &pods).close_on_drain(2));
        assert!(share("a", &pods).close_on_drain(3));
    }

    proptest! {
        #[test]
        fn quotas_sum_to_the_pool_and_never_exceed_the_ceiling(slots in 1u8..=6, pods in 1usize..=8) {
            let beats: Vec<PodBeat> = (0..pods).map(|i| beat(&format!("pod-{i}"), &[])).collect();
            let s = Share { me: "pod-0", pods: &beats, channel: ChannelId::Cpm, slots };
            let quotas: Vec<usize> = beats.iter().map(|b| s.quota(&b.pod_id)).collect();
            prop_assert_eq!(quotas.iter().sum::<usize>(), usize::from(slots));
            let ceil = usize::from(slots).div_ceil(pods);
            prop_assert!(quotas.iter().all(|q| *q <= ceil));
        }
    }
}
