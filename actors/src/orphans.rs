//! Sightings of free stream slots: written by this pod's watchdog from the
//! lease store's holders each interval, read by its standby slots deciding
//! whether to adopt an orphan (a slot free for longer than the grace). A
//! sighting older than the caller's `max_age` counts for nothing, so a
//! watchdog that stopped reading never makes a slot look orphaned.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{ChannelId, SlotId};

struct Sighting {
    at: Instant,
    free_since: BTreeMap<u8, Instant>,
}

#[derive(Clone, Default)]
pub struct FreeSlots {
    channels: Arc<Mutex<BTreeMap<ChannelId, Sighting>>>,
}

impl FreeSlots {
    /// The channel's free slots seen `at`, each with since when it has been free.
    pub fn record(&self, channel: ChannelId, at: Instant, free: Vec<(u8, Instant)>) {
        let sighting = Sighting { at, free_since: free.into_iter().collect() };
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).insert(channel, sighting);
    }

    /// How long `slot` has been free, if the last sighting is at most `max_age` old.
    pub fn free_for(&self, slot: SlotId, now: Instant, max_age: Duration) -> Option<Duration> {
        let channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let sighting = channels.get(&slot.channel).filter(|s| now.saturating_duration_since(s.at) <= max_age)?;
        sighting.free_since.get(&slot.n).map(|since| now.saturating_duration_since(*since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_sighting_tells_how_long_a_slot_has_been_free_and_a_stale_one_nothing() {
        let (free, t0) = (FreeSlots::default(), Instant::now());
        let slot = |n| SlotId { channel: ChannelId::Cpm, n };
        let s = Duration::from_secs;
        free.record(ChannelId::Cpm, t0 + s(5), vec![(2, t0)]);
        assert_eq!(free.free_for(slot(2), t0 + s(6), s(3)), Some(s(6)));
        assert_eq!(free.free_for(slot(1), t0 + s(6), s(3)), None, "held at the last sighting");
        assert_eq!(free.free_for(slot(2), t0 + s(9), s(3)), None, "sighting too old");
        assert_eq!(free.free_for(SlotId { channel: ChannelId::Csm, n: 2 }, t0 + s(6), s(3)), None);
    }
}
