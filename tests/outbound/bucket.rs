//! The Redis rate bucket: refill math, costs, waits, concurrent pods, the
//! secondary channel's schedule, NOSCRIPT reload and failing closed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cabine::config::{ChannelId, Settings};
use cabine::redis::bucket::RedisBucket;
use cabine::redis::guard::ScriptClock;
use cabine_actors::ports::ratelimit::{BucketError, Cost, Draw, RateBucket};
use fred::prelude::*;
use rand::{Rng, SeedableRng};

use crate::common::{PrivateRedis, brasilia_ms, clean_redis, keys, redis, settings};

/// Defaults without the reserve: the Central Bank's arithmetic to the milli-token.
fn exact_settings() -> Settings {
    settings("bkt", &[("CABINE__OUTBOUND__BUCKET__RESERVE", "0s")])
}

fn bucket(client: &Client, s: &Settings, clock: ScriptClock) -> RedisBucket {
    RedisBucket::new(client.clone(), keys(s), &s.outbound.bucket, clock)
}

#[tokio::test]
async fn refills_lazily_at_the_configured_rate_up_to_capacity() {
    let s = exact_settings();
    let client = redis(&s).await;
    let (clock, now) = ScriptClock::pinned(brasilia_ms(12, 0, 0));
    let b = bucket(&client, &s, clock);
    let cpm = ChannelId::Cpm;
    assert_eq!(b.level(cpm).await.unwrap().tokens_milli, 3_750_000, "an absent bucket is full");
    assert_eq!(b.try_take(cpm, Cost(3_750_000)).await.unwrap(), Draw::Taken { left: 0 });
    // 1000 milli-tokens at 750 per ms: 2 ms.
    assert_eq!(b.try_take(cpm, Cost(1_000)).await.unwrap(), Draw::Wait { retry_after: Duration::from_millis(2) });
    now.fetch_add(1, Ordering::SeqCst);
    assert_eq!(b.try_take(cpm, Cost(1_000)).await.unwrap(), Draw::Wait { retry_after: Duration::from_millis(1) });
    now.fetch_add(1, Ordering::SeqCst);
    assert_eq!(b.try_take(cpm, Cost(1_000)).await.unwrap(), Draw::Taken { left: 500 });
    now.fetch_add(10_000, Ordering::SeqCst);
    let level = b.level(cpm).await.unwrap();
    assert_eq!((level.tokens_milli, level.capacity_milli, level.refill_per_s), (3_750_000, 3_750_000, 750));
    clean_redis(&client, &s).await;
}

#[tokio::test]
async fn a_draw_leaves_the_reserve_in_hand() {
    // 50 ms at 750 tokens/s: 37.5 tokens stay in the bucket for POSTs still on their way.
    let s = settings("bkt", &[("CABINE__OUTBOUND__BUCKET__RESERVE", "50ms")]);
    let client = redis(&s).await;
    let (clock, now) = ScriptClock::pinned(brasilia_ms(12, 0, 0));
    let b = bucket(&client, &s, clock);
    let cpm = ChannelId::Cpm;
    assert_eq!(b.try_take(cpm, Cost(3_700_000)).await.unwrap(), Draw::Taken { left: 50_000 });
    // 50 000 − 37 500 in hand: 12.5 tokens may go, 13 may not until 0.5 token more has come (1 ms).
    assert_eq!(b.try_take(cpm, Cost(13_000)).await.unwrap(), Draw::Wait { retry_after: Duration::from_millis(1) });
    assert_eq!(b.try_take(cpm, Cost(12_500)).await.unwrap(), Draw::Taken { left: 37_500 });
    now.fetch_add(2, Ordering::SeqCst);
    assert_eq!(b.try_take(cpm, Cost(1_000)).await.unwrap(), Draw::Taken { left: 38_000 });
    let err = b.try_take(cpm, Cost(3_750_000)).await.unwrap_err();
    assert!(matches!(err, BucketError::TooCostly { .. }), "more than capacity − reserve is never possible: {err:?}");
    clean_redis(&client, &s).await;
}

#[tokio::test]
async fn a_pacs_002_costs_a_fifth_of_a_token() {
    let s = exact_settings();
    let client = redis(&s).await;
    let (clock, now) = ScriptClock::pinned(brasilia_ms(12, 0, 0));
    let b = bucket(&client, &s, clock);
    let costs = RedisBucket::costs(&s.outbound.bucket);
    assert_eq!(costs.of("pacs.002"), Cost(200));
    assert!(matches!(b.try_take(ChannelId::Cpm, Cost(3_750_000)).await.unwrap(), Draw::Taken { left: 0 }));
    now.fetch_add(1, Ordering::SeqCst); // +750 milli-tokens
    for left in [550, 350, 150] {
        assert_eq!(b.try_take(ChannelId::Cpm, costs.of("pacs.002")).await.unwrap(), Draw::Taken { left });
    }
    assert!(matches!(b.try_take(ChannelId::Cpm, costs.of("pacs.002")).await.unwrap(), Draw::Wait { .. }));
    assert!(matches!(b.try_take(ChannelId::Cpm, costs.of("pacs.008")).await.unwrap(), Draw::Wait { .. }));
    let err = b.try_take(ChannelId::Cpm, Cost(3_750_001)).await.unwrap_err();
    assert!(matches!(err, BucketError::TooCostly { capacity: 3_750_000, .. }), "{err:?}");
    clean_redis(&client, &s).await;
}

#[tokio::test]
async fn the_secondary_channel_follows_brasilia_s_clock() {
    let s = settings(
        "bkt",
        &[("CABINE__ICOM__CHANNELS__CSM__ENABLED", "true"), ("CABINE__OUTBOUND__BUCKET__RESERVE", "0s")],
    );
    let client = redis(&s).await;
    let (clock, now) = ScriptClock::pinned(brasilia_ms(7, 59, 59));
    let b = bucket(&client, &s, clock);
    let csm = ChannelId::Csm;
    let night = b.level(csm).await.unwrap();
    assert!(night.night);
    assert_eq!((night.capacity_milli, night.refill_per_s), (5_000_000, 350));
    assert_eq!(b.try_take(csm, Cost(4_000_000)).await.unwrap(), Draw::Taken { left: 1_000_000 });
    now.store(brasilia_ms(8, 0, 0), Ordering::SeqCst);
    let day = b.level(csm).await.unwrap();
    assert!(!day.night);
    assert_eq!((day.tokens_milli, day.capacity_milli, day.refill_per_s), (350_000, 350_000, 35), "clamped to 350");
    assert_eq!(b.try_take(csm, Cost(350_000)).await.unwrap(), Draw::Taken { left: 0 });
    assert_eq!(b.try_take(csm, Cost(1_000)).await.unwrap(), Draw::Wait { retry_after: Duration::from_millis(29) });
    now.store(brasilia_ms(23, 59, 59), Ordering::SeqCst);
    assert!(!b.level(csm).await.unwrap().night);
    now.store(brasilia_ms(24, 0, 0), Ordering::SeqCst);
    let midnight = b.level(csm).await.unwrap();
    assert!(midnight.night);
    assert_eq!(midnight.capacity_milli, 5_000_000);
    clean_redis(&client, &s).await;
}

/// Property: two pods (two connections) drawing random costs at once never
/// take more than the bucket holds — with the clock pinned (no refill), the
/// sum of what was granted equals exactly what left the bucket.
#[tokio::test]
async fn two_pods_drawing_at_once_never_overdraw() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for round in 0..6 {
        let capacity: u64 = rng.random_range(10..30);
        let s = settings(
            "bkt",
            &[
                ("CABINE__OUTBOUND__BUCKET__CHANNELS__CPM__CAPACITY", &capacity.to_string()),
                ("CABINE__OUTBOUND__BUCKET__RESERVE", "0s"),
            ],
        );
        let (a, b) = (redis(&s).await, redis(&s).await);
        let (clock, _) = ScriptClock::pinned(brasilia_ms(12, 0, 0));
        let pods = [Arc::new(bucket(&a, &s, clock.clone())), Arc::new(bucket(&b, &s, clock))];
        let mut tasks = Vec::new();
        for i in 0..80 {
            let pod = pods[i % 2].clone();
            let cost = Cost(rng.random_range(1..=5) * 200);
            tasks.push(tokio::spawn(async move { (cost, pod.try_take(ChannelId::Cpm, cost).await.unwrap()) }));
        }
        let mut granted = 0;
        for t in tasks {
            if let (cost, Draw::Taken { .. }) = t.await.unwrap() {
                granted += cost.0;
            }
        }
        let left = pods[0].level(ChannelId::Cpm).await.unwrap().tokens_milli;
        assert!(granted <= capacity * 1000, "seed {seed} round {round}: granted {granted} > {capacity} tokens");
        assert_eq!(granted + left, capacity * 1000, "seed {seed} round {round}: tokens appeared or vanished");
        clean_redis(&a, &s).await;
    }
}

/// With Redis's own clock: over a burst, the pods together never draw more
/// than capacity + refill x elapsed.
#[tokio::test]
async fn with_the_server_clock_draws_stay_within_capacity_plus_refill() {
    let s = settings(
        "bkt",
        &[
            ("CABINE__OUTBOUND__BUCKET__RESERVE", "0s"),
            ("CABINE__OUTBOUND__BUCKET__CHANNELS__CPM__CAPACITY", "20"),
            ("CABINE__OUTBOUND__BUCKET__CHANNELS__CPM__NIGHT_CAPACITY", "20"),
        ],
    );
    let (a, b) = (redis(&s).await, redis(&s).await);
    let pods = [Arc::new(bucket(&a, &s, ScriptClock::Server)), Arc::new(bucket(&b, &s, ScriptClock::Server))];
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..400 {
        let pod = pods[i % 2].clone();
        tasks.push(tokio::spawn(async move { pod.try_take(ChannelId::Cpm, Cost(1_000)).await.unwrap() }));
    }
    let mut granted = 0u64;
    for t in tasks {
        if matches!(t.await.unwrap(), Draw::Taken { .. }) {
            granted += 1;
        }
    }
    let elapsed_ms = start.elapsed().as_millis() as u64 + 1;
    assert!(granted >= 20, "a full bucket grants its capacity: {granted}");
    assert!(granted <= 20 + 750 * elapsed_ms / 1000 + 1, "granted {granted} in {elapsed_ms} ms");
    clean_redis(&a, &s).await;
}

#[tokio::test]
async fn reloads_its_script_after_a_script_flush_and_fails_closed_when_redis_is_gone() {
    let mut private = PrivateRedis::start().await;
    let s = settings("bkt", &[("CABINE__REDIS__URL", &private.url), ("CABINE__REDIS__COMMAND_TIMEOUT", "300ms")]);
    let client = redis(&s).await;
    let b = bucket(&client, &s, ScriptClock::Server);
    assert!(matches!(b.try_take(ChannelId::Cpm, Cost(1_000)).await.unwrap(), Draw::Taken { .. }));
    client.script_flush(false).await.unwrap();
    assert!(matches!(b.try_take(ChannelId::Cpm, Cost(1_000)).await.unwrap(), Draw::Taken { .. }), "NOSCRIPT reloaded");
    private.stop();
    let err = b.try_take(ChannelId::Cpm, Cost(1_000)).await.unwrap_err();
    assert!(matches!(err, BucketError::Unavailable(_)), "fail closed: {err:?}");
}
