//! Scheduled poll mode: polls land on UNIX-time multiples of the cycle, slot n
//! offset by (n − 1) × stagger; a batch is acknowledged at once.

use std::collections::BTreeMap;
use std::time::Duration;

use cabine_actors::testkit::{FakeWorld, RequestKind};
use cabine_actors::{PollMode, Tree};

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn scheduled_polls_keep_to_the_cycle_grid_with_staggered_slots() {
    let mut s = settings();
    s.lease.stream_slots = 2;
    s.icom.hold = ms(100);
    let world = FakeWorld::new(s);
    let mut cfg = config("pod-a", 2);
    cfg.poll_mode = PollMode::Scheduled { cycle: ms(1000), stagger: ms(300) };
    // A holder moves its stream once per cycle: the watchdog's thresholds allow for it.
    (cfg.watchdog.stale_after, cfg.watchdog.zero_active_after) = (ms(5000), ms(5000));
    let tree = Tree::start(cfg, world.ports("pod-a")).await.unwrap();
    tokio::time::sleep(ms(6000)).await;

    // Requests per stream (the token names it), after its first.
    let mut by_stream: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    let origin = world.icom.log()[0].at;
    for r in world.icom.log().into_iter().filter(|r| r.kind == RequestKind::Next) {
        let stream = r.token.unwrap().rsplit('/').next().unwrap().split('-').next().unwrap().to_owned();
        by_stream.entry(stream).or_default().push(r.at - origin);
    }
    assert_eq!(by_stream.len(), 2, "{by_stream:?}");
    let firsts: Vec<Duration> = by_stream.values().map(|t| t[0]).collect();
    for times in by_stream.values() {
        assert!(times.len() >= 4, "{times:?}");
        for pair in times.windows(2) {
            assert_eq!(pair[1] - pair[0], ms(1000), "one poll per cycle: {times:?}");
        }
    }
    let gap = (firsts[1].as_millis() as i64 - firsts[0].as_millis() as i64).rem_euclid(1000);
    assert!(gap == 300 || gap == 700, "slots staggered by 300 ms, got {gap} ms");

    inject(&world, "s", 25);
    assert_all_delivered_once(&world, ms(2500)).await;
    tree.shutdown().await;
}
