//! The watchdog's rules on synthetic observations: each alert raised after its
//! threshold, cleared when the cause goes, kept (not cleared) while blind.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::config::TreeConfig;
use crate::domain::PoolSize;

const CPM: ChannelId = ChannelId::Cpm;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn config() -> TreeConfig {
    let mut c = TreeConfig::new("w");
    c.stream_pool = PoolSize::try_from(4).unwrap();
    c.watchdog.stale_after = s(30);
    c.watchdog.unheld_after = s(60);
    c.watchdog.zero_active_after = s(30);
    c.watchdog.lag_after = s(60);
    c
}

fn holder(pool: Pool, slot: u8, pod: &str) -> Holder {
    Holder { pool, slot, grant: format!("{pod}#1#{slot}"), pod: pod.into(), ttl_ms: 1000 }
}

/// A world where `held` slots of cpm are held by "a" and slot n's pull-next is `tokens[n-1]`.
struct World {
    t0: Instant,
    held: Vec<u8>,
    tokens: [u32; 4],
    fences: [i64; 4],
    extra_holders: Vec<Holder>,
    cursors_down: bool,
    lag: Duration,
}

impl World {
    fn new() -> Self {
        World {
            t0: Instant::now(),
            held: vec![1, 2, 3, 4],
            tokens: [1; 4],
            fences: [3; 4],
            extra_holders: vec![],
            cursors_down: false,
            lag: s(0),
        }
    }

    fn at(&self, secs: u64) -> Observation {
        let stream = Pool::Stream(CPM);
        let mut holders: Vec<Holder> = self.held.iter().map(|n| holder(stream, *n, "a")).collect();
        holders.extend(self.extra_holders.iter().cloned());
        let cursors = (1..=4u8)
            .map(|n| SlotCursor {
                slot: SlotId { channel: CPM, n },
                fence: self.fences[usize::from(n) - 1],
                holder: Some("a#1".into()),
                pull_next: Some(format!("/stream/{n}-{}", self.tokens[usize::from(n) - 1])),
                age: s(0),
                busy_for: None,
            })
            .collect();
        Observation {
            at: self.t0 + s(secs),
            pods: Ok(vec![]),
            holders: vec![(stream, Ok(holders)), (Pool::Send(CPM), Ok(vec![])), (Pool::Leader, Ok(vec![]))],
            cursors: if self.cursors_down { Err("postgres down".into()) } else { Ok(cursors) },
            oldest_unpublished: Ok(self.lag),
        }
    }
}

fn keys(alerts: &[Alert]) -> Vec<AlertKey> {
    alerts.iter().map(Alert::key).collect()
}

#[test]
fn zero_active_is_raised_when_no_stream_moves_and_cleared_by_one_that_does() {
    let (c, mut h, mut w) = (config(), History::default(), World::new());
    assert!(h.evaluate(&w.at(0), &c, 1).alerts.is_empty());
    assert!(h.evaluate(&w.at(30), &c, 2).alerts.is_empty(), "not past the threshold yet");
    let e = h.evaluate(&w.at(31), &c, 3);
    assert_eq!(keys(&e.raised), vec![(AlertKind::ZeroActive, Some(CPM), None)]);
    assert!(e.alerts[0].detail.contains("every holder failing"), "{}", e.alerts[0].detail);
    let e = h.evaluate(&w.at(40), &c, 4);
    assert!(e.raised.is_empty() && e.alerts[0].since_ms == 3, "raised once, since kept");
    w.tokens = w.tokens.map(|t| t + 1);
    let e = h.evaluate(&w.at(41), &c, 5);
    assert_eq!(keys(&e.cleared), vec![(AlertKind::ZeroActive, Some(CPM), None)]);
    assert!(e.alerts.is_empty());
    // Nobody holds anything at all: zero-active (no holder) and every slot unheld.
    w.held.clear();
    let e = h.evaluate(&w.at(72), &c, 6);
    assert!(e.alerts.iter().any(|a| a.kind == AlertKind::ZeroActive && a.detail.contains("no holder")));
    assert_eq!(e.free, vec![(CPM, (1..=4).map(|n| (n, w.t0 + s(72))).collect())]);
}

#[test]
fn a_held_slot_whose_stream_stands_still_while_others_move_is_stale() {
    let (c, mut h, mut w) = (config(), History::default(), World::new());
    h.evaluate(&w.at(0), &c, 1);
    for t in [10, 20, 31] {
        for i in 1..4 {
            w.tokens[i] += 1;
        }
        let e = h.evaluate(&w.at(t), &c, t);
        assert_eq!(e.alerts.is_empty(), t < 31, "t={t}: {:?}", e.alerts);
    }
    let alerts = h.evaluate(&w.at(32), &c, 32).alerts;
    assert_eq!(keys(&alerts), vec![(AlertKind::StaleSlot, Some(CPM), Some(1))]);
    assert!(alerts[0].detail.contains("held by a") && alerts[0].detail.contains("fence 3"), "{}", alerts[0].detail);
    w.tokens[0] += 1;
    let e = h.evaluate(&w.at(33), &c, 33);
    assert_eq!(keys(&e.cleared), vec![(AlertKind::StaleSlot, Some(CPM), Some(1))]);
}

#[test]
fn a_slot_nobody_holds_is_stale_after_unheld_after_and_fine_once_held() {
    let (c, mut h, mut w) = (config(), History::default(), World::new());
    w.held = vec![1, 2, 3];
    let move_held = |w: &mut World| (0..3).for_each(|i| w.tokens[i] += 1);
    for t in (0..=60).step_by(10) {
        move_held(&mut w);
        let e = h.evaluate(&w.at(t), &c, t);
        assert!(e.alerts.is_empty(), "t={t}: {:?}", e.alerts);
        assert_eq!(e.free, vec![(CPM, vec![(4, w.t0)])], "slot 4 free since the first read");
    }
    move_held(&mut w);
    let e = h.evaluate(&w.at(61), &c, 61);
    assert_eq!(keys(&e.raised), vec![(AlertKind::StaleSlot, Some(CPM), Some(4))]);
    assert!(e.raised[0].detail.contains("no holder"));
    w.held.push(4);
    move_held(&mut w);
    assert_eq!(h.evaluate(&w.at(62), &c, 62).cleared.len(), 1);
}

#[test]
fn a_slot_claimed_between_two_reads_is_free_only_from_the_read_that_saw_its_new_fence() {
    let (c, mut h, mut w) = (config(), History::default(), World::new());
    w.held = vec![1, 2, 3];
    h.evaluate(&w.at(0), &c, 1);
    // Slot 4 held and released again between two reads: its fence moved.
    w.fences[3] += 1;
    let e = h.evaluate(&w.at(1), &c, 2);
    assert_eq!(e.free, vec![(CPM, vec![(4, w.t0 + s(1))])]);
}

#[test]
fn lag_and_cap_are_raised_and_cleared() {
    let (c, mut h, mut w) = (config(), History::default(), World::new());
    w.lag = s(61);
    w.extra_holders.push(holder(Pool::Stream(CPM), 5, "intruder"));
    let e = h.evaluate(&w.at(0), &c, 1);
    let mut raised = keys(&e.raised);
    raised.sort();
    assert_eq!(raised, vec![(AlertKind::Lag, None, None), (AlertKind::Cap, Some(CPM), None)]);
    let cap = e.alerts.iter().find(|a| a.kind == AlertKind::Cap).unwrap();
    assert!(cap.detail.contains("cpm:stream: 5 holders for 4 slots"), "{}", cap.detail);
    (w.lag, w.extra_holders) = (s(1), vec![]);
    assert_eq!(h.evaluate(&w.at(1), &c, 2).cleared.len(), 2);
}

#[test]
fn blindness_neither_raises_nor_clears() {
    let (c, mut h, mut w) = (config(), History::default(), World::new());
    h.evaluate(&w.at(0), &c, 1);
    assert_eq!(h.evaluate(&w.at(31), &c, 2).raised.len(), 1, "zero-active");
    w.cursors_down = true;
    w.tokens[0] += 1;
    let e = h.evaluate(&w.at(40), &c, 3);
    assert!(e.cleared.is_empty() && e.alerts.len() == 1, "kept while blind: {e:?}");
    assert_eq!(e.blind, vec!["slot cursors: postgres down".to_owned()]);
    w.cursors_down = false;
    assert_eq!(h.evaluate(&w.at(41), &c, 4).cleared.len(), 1, "cleared once seen moving");
    // Blind from the very start: nothing is raised.
    let (mut fresh, mut w) = (History::default(), World::new());
    w.cursors_down = true;
    assert!(fresh.evaluate(&w.at(100), &c, 1).alerts.is_empty());
}
