//! The watchdog's rules, as a pure function of what it read (an
//! [`Observation`]) and what it remembers between reads (a [`History`]): when
//! each slot's stream last moved (its stored pull-next changes after every
//! answered poll; a claim does not change it), since when it has had no
//! holder, and which alerts are up. A slot's own stall clock also restarts
//! when it gets a holder or a new fence (a new holder gets its full
//! `stale_after`); the channel's clock moves only with a stream. A source that could not be read leaves the
//! alerts that depend on it as they were: blindness neither raises nor clears.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::alert::{Alert, AlertKey, AlertKind};
use crate::config::TreeConfig;
use crate::domain::{ChannelId, SlotId};
use crate::ports::{Holder, PodBeat, Pool, SlotCursor};

/// One read of the cluster, each source on its own.
pub struct Observation {
    pub at: Instant,
    pub pods: Result<Vec<PodBeat>, String>,
    /// Holders of every pool read (stream and send of each channel, the leader).
    pub holders: Vec<(Pool, Result<Vec<Holder>, String>)>,
    pub cursors: Result<Vec<SlotCursor>, String>,
    pub oldest_unpublished: Result<Duration, String>,
}

impl Observation {
    fn holders(&self, pool: Pool) -> Option<&Result<Vec<Holder>, String>> {
        self.holders.iter().find(|(p, _)| *p == pool).map(|(_, h)| h)
    }
}

/// What one evaluation found.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// Every active alert, by key.
    pub alerts: Vec<Alert>,
    pub raised: Vec<Alert>,
    pub cleared: Vec<Alert>,
    /// Sources that could not be read.
    pub blind: Vec<String>,
    /// Per channel whose holders were read: its free slots and since when.
    pub free: Vec<(ChannelId, Vec<(u8, Instant)>)>,
}

struct Track {
    pull_next: Option<String>,
    fence: i64,
    /// The stream moved, or the slot got a holder or a new fence.
    moved_at: Instant,
    unheld_since: Option<Instant>,
}

/// What the watchdog remembers between reads.
#[derive(Default)]
pub struct History {
    slots: BTreeMap<SlotId, Track>,
    /// When any slot of the channel last moved its stream (first read: then).
    channels: BTreeMap<ChannelId, Instant>,
    raised: BTreeMap<AlertKey, Alert>,
}

/// Alerts found true now, and the (kind, channel) scopes that could not be judged.
#[derive(Default)]
struct Findings {
    found: BTreeMap<AlertKey, String>,
    unknown: BTreeSet<(AlertKind, Option<ChannelId>)>,
}

impl Findings {
    fn raise(&mut self, kind: AlertKind, channel: Option<ChannelId>, slot: Option<u8>, detail: String) {
        self.found.insert((kind, channel, slot), detail);
    }
}

impl History {
    /// Applies one observation; `wall_ms` stamps newly raised alerts.
    pub fn evaluate(&mut self, obs: &Observation, config: &TreeConfig, wall_ms: u64) -> Evaluation {
        let mut eval = Evaluation { blind: blind_sources(obs), ..Default::default() };
        let mut f = Findings::default();
        for &ch in &config.channels {
            self.track_cursors(obs, config, ch);
            let free = self.track_holders(obs, config, ch);
            if let Some(free) = free {
                eval.free.push((ch, free));
            }
            match (obs.holders(Pool::Stream(ch)), &obs.cursors) {
                (Some(Ok(holders)), Ok(cursors)) => self.judge_channel(obs, config, ch, holders, cursors, &mut f),
                _ => {
                    f.unknown.insert((AlertKind::ZeroActive, Some(ch)));
                    f.unknown.insert((AlertKind::StaleSlot, Some(ch)));
                }
            }
            let pools = [(Pool::Stream(ch), config.stream_pool.get()), (Pool::Send(ch), config.watchdog.send_pool)];
            judge_cap(obs, Some(ch), &pools, &mut f);
        }
        judge_cap(obs, None, &[(Pool::Leader, 1)], &mut f);
        match &obs.oldest_unpublished {
            Ok(age) if *age > config.watchdog.lag_after => {
                let detail =
                    format!("the oldest inbox row not on the bus is {age:?} old (> {:?})", config.watchdog.lag_after);
                f.raise(AlertKind::Lag, None, None, detail);
            }
            Ok(_) => {}
            Err(_) => _ = f.unknown.insert((AlertKind::Lag, None)),
        }
        self.settle(f, wall_ms, &mut eval);
        eval
    }

    /// Unheld-since per slot from the stream pool's holders; the free slots, when read.
    fn track_holders(&mut self, obs: &Observation, config: &TreeConfig, ch: ChannelId) -> Option<Vec<(u8, Instant)>> {
        let Some(Ok(holders)) = obs.holders(Pool::Stream(ch)) else { return None };
        let mut free = Vec::new();
        for n in 1..=config.stream_pool.get() {
            let track = self.track(SlotId { channel: ch, n }, obs.at);
            if holders.iter().any(|h| h.slot == n) {
                if track.unheld_since.take().is_some() {
                    track.moved_at = obs.at;
                }
            } else {
                free.push((n, *track.unheld_since.get_or_insert(obs.at)));
            }
        }
        Some(free)
    }

    /// When each slot's stream last moved (its pull-next changed), and the channel's.
    fn track_cursors(&mut self, obs: &Observation, config: &TreeConfig, ch: ChannelId) {
        let channel_moved = *self.channels.entry(ch).or_insert(obs.at);
        let Ok(cursors) = &obs.cursors else { return };
        let mut moved = channel_moved;
        for n in 1..=config.stream_pool.get() {
            let slot = SlotId { channel: ch, n };
            let row = cursors.iter().find(|c| c.slot == slot);
            let (pull_next, fence) = (row.and_then(|c| c.pull_next.clone()), row.map_or(0, |c| c.fence));
            let track = self.track(slot, obs.at);
            if track.pull_next != pull_next {
                (track.pull_next, track.moved_at) = (pull_next, obs.at);
                moved = obs.at;
            }
            if track.fence != fence {
                (track.fence, track.moved_at) = (fence, obs.at);
                // Claimed since the last read: free (again) only from now, even if no read saw it held.
                if track.unheld_since.is_some() {
                    track.unheld_since = Some(obs.at);
                }
            }
        }
        self.channels.insert(ch, moved);
    }

    fn track(&mut self, slot: SlotId, now: Instant) -> &mut Track {
        self.slots.entry(slot).or_insert(Track { pull_next: None, fence: 0, moved_at: now, unheld_since: None })
    }

    fn judge_channel(
        &self,
        obs: &Observation,
        config: &TreeConfig,
        ch: ChannelId,
        holders: &[Holder],
        cursors: &[SlotCursor],
        f: &mut Findings,
    ) {
        let (w, now) = (&config.watchdog, obs.at);
        let quiet = now.saturating_duration_since(self.channels.get(&ch).copied().unwrap_or(now));
        let n_held = holders.iter().filter(|h| (1..=config.stream_pool.get()).contains(&h.slot)).count();
        if quiet > w.zero_active_after {
            let detail = format!(
                "no slot of {ch} moved its stream for {quiet:?} (> {:?}); {n_held} of {} held{}",
                w.zero_active_after,
                config.stream_pool.get(),
                if n_held > 0 { ", every holder failing" } else { ", no holder" }
            );
            f.raise(AlertKind::ZeroActive, Some(ch), None, detail);
        }
        for n in 1..=config.stream_pool.get() {
            let slot = SlotId { channel: ch, n };
            let Some(track) = self.slots.get(&slot) else { continue };
            let still = now.saturating_duration_since(track.moved_at);
            match holders.iter().find(|h| h.slot == n) {
                Some(h) if still > w.stale_after && quiet <= w.stale_after => {
                    let fence = cursors.iter().find(|c| c.slot == slot).map_or(0, |c| c.fence);
                    let detail = format!(
                        "held by {}{} (fence {fence}) but its stream has not moved for {still:?} while other slots deliver",
                        h.pod,
                        liveness(obs, &h.pod)
                    );
                    f.raise(AlertKind::StaleSlot, Some(ch), Some(n), detail);
                }
                Some(_) => {}
                None => {
                    let unheld = track.unheld_since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
                    if unheld > w.unheld_after {
                        let detail = format!("no holder for {unheld:?} (> {:?})", w.unheld_after);
                        f.raise(AlertKind::StaleSlot, Some(ch), Some(n), detail);
                    }
                }
            }
        }
    }

    /// Turns findings into the active set: since kept, blind scopes kept as they were.
    fn settle(&mut self, f: Findings, wall_ms: u64, eval: &mut Evaluation) {
        let mut active: BTreeMap<AlertKey, Alert> = BTreeMap::new();
        for (key, detail) in f.found {
            let since_ms = self.raised.get(&key).map_or(wall_ms, |a| a.since_ms);
            let (kind, channel, slot) = key;
            active.insert(key, Alert { kind, channel, slot, since_ms, detail });
        }
        for (key, alert) in &self.raised {
            if f.unknown.contains(&(key.0, key.1)) && !active.contains_key(key) {
                active.insert(*key, alert.clone());
            }
        }
        eval.raised = active.iter().filter(|(k, _)| !self.raised.contains_key(k)).map(|(_, a)| a.clone()).collect();
        eval.cleared = self.raised.iter().filter(|(k, _)| !active.contains_key(k)).map(|(_, a)| a.clone()).collect();
        eval.alerts = active.values().cloned().collect();
        self.raised = active;
    }
}

fn liveness(obs: &Observation, pod: &str) -> &'static str {
    match &obs.pods {
        Ok(pods) if !pods.iter().any(|p| p.pod_id == pod) => " (no heartbeat: not live)",
        _ => "",
    }
}

/// More holders than slots (or a slot number beyond the pool) in any of `pools`.
fn judge_cap(obs: &Observation, channel: Option<ChannelId>, pools: &[(Pool, u8)], f: &mut Findings) {
    let mut breaches = Vec::new();
    let mut blind = false;
    for (pool, size) in pools {
        match obs.holders(*pool) {
            Some(Ok(holders)) => {
                let beyond = holders.iter().any(|h| h.slot == 0 || h.slot > *size);
                if holders.len() > usize::from(*size) || beyond {
                    let slots: Vec<String> = holders.iter().map(|h| format!("{}@{}", h.slot, h.pod)).collect();
                    breaches.push(format!("{pool}: {} holders for {size} slots [{}]", holders.len(), slots.join(", ")));
                }
            }
            Some(Err(_)) => blind = true,
            None => {}
        }
    }
    if !breaches.is_empty() {
        f.raise(AlertKind::Cap, channel, None, breaches.join("; "));
    } else if blind {
        f.unknown.insert((AlertKind::Cap, channel));
    }
}

fn blind_sources(obs: &Observation) -> Vec<String> {
    let mut blind = Vec::new();
    if let Err(e) = &obs.pods {
        blind.push(format!("live pods: {e}"));
    }
    for (pool, holders) in &obs.holders {
        if let Err(e) = holders {
            blind.push(format!("{pool} holders: {e}"));
        }
    }
    if let Err(e) = &obs.cursors {
        blind.push(format!("slot cursors: {e}"));
    }
    if let Err(e) = &obs.oldest_unpublished {
        blind.push(format!("publication lag: {e}"));
    }
    blind
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
