//! The durable request gate (DESIGN §2.5) against a real Postgres, for the
//! stream slots (the inbox's cursor rows) and the send slots (`send_slot`):
//! a new holder learns what is left of the previous holder's busy window, by
//! Postgres's clock; every fenced write only extends `busy_until`; a
//! superseded holder can neither arm nor clear it; a release by the holder
//! clears it for the next one.

mod support;

use std::time::Duration;

use cabine::outbound::PgSendGates;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{GateError, InboxError, InboxStore, SendGates};
use support::{TestDb, batch, slot};

const BUSY: Duration = Duration::from_millis(1500);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `busy_until - now()` of a stream slot's row, in ms (None when clear).
async fn busy_left(db: &TestDb, table: &str, n: i16) -> Option<i64> {
    let conn = db.pool.get().await.unwrap();
    let sql = format!(
        "SELECT (extract(epoch FROM busy_until - now()) * 1000)::bigint FROM {table} WHERE channel = 'cpm' AND slot = $1"
    );
    conn.query_one(&sql, &[&n]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_new_stream_holder_waits_out_the_previous_window_and_a_stale_one_cannot_arm_or_clear() {
    let db = TestDb::new("gate_stream", &[]).await;
    let inbox = db.inbox();
    let first = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap();
    assert_eq!(first.wait, Duration::ZERO, "a fresh row has no previous window");
    let left = busy_left(&db, "slot_cursor", 1).await.unwrap();
    assert!((1300..=1500).contains(&left), "the claim armed the first request: {left} ms");
    // The holder's GET came back with a batch: the commit arms the next GET.
    tokio::time::sleep(ms(300)).await;
    inbox.commit(slot(1), first.fence, &batch("G", 2), "p-1", BUSY).await.unwrap();
    let left = busy_left(&db, "slot_cursor", 1).await.unwrap();
    assert!((1300..=1500).contains(&left), "the commit extended busy_until: {left} ms");
    // Redis forgot the lease: another pod is granted and claims. It must wait the window out.
    let second = inbox.claim(slot(1), "pod-b", BUSY).await.unwrap();
    assert!(second.wait >= ms(1200) && second.wait <= BUSY, "wait {:?}", second.wait);
    let left = busy_left(&db, "slot_cursor", 1).await.unwrap();
    assert!((1300..=1500).contains(&left), "a claim opens a window, it does not stack one on the last: {left} ms");
    // The stale holder can write nothing: no arm, no cursor, no commit, no clearing.
    let lost = InboxError::FenceLost { ours: 1, current: 2 };
    assert_eq!(inbox.arm(slot(1), first.fence, BUSY).await, Err(lost.clone()));
    assert_eq!(inbox.release(slot(1), first.fence).await, Err(lost.clone()));
    assert_eq!(inbox.store_cursor(slot(1), first.fence, Some("p-x"), BUSY).await, Err(lost));
    assert!(busy_left(&db, "slot_cursor", 1).await.unwrap() >= 1200, "busy_until untouched by the stale holder");
    // The holder's own writes never move busy_until back.
    inbox.arm(slot(1), second.fence, ms(100)).await.unwrap();
    assert!(busy_left(&db, "slot_cursor", 1).await.unwrap() >= 1200, "greatest(): never shortened");
    // Leaving with nothing in flight clears it: the next holder goes at once.
    inbox.release(slot(1), second.fence).await.unwrap();
    assert_eq!(busy_left(&db, "slot_cursor", 1).await, None);
    let third = inbox.claim(slot(1), "pod-c", BUSY).await.unwrap();
    assert_eq!((third.fence, third.wait), (3, Duration::ZERO));
}

#[tokio::test]
async fn the_send_slots_gate_is_claimed_armed_and_released_under_its_fence() {
    let db = TestDb::new("gate_send", &[]).await;
    let gates = PgSendGates::new(db.pool.clone(), &db.settings.cluster.ispb, db.settings.postgres.query_timeout);
    let cpm = ChannelId::Cpm;
    let a = gates.claim(cpm, 1, "pod-a#1", BUSY).await.unwrap();
    assert_eq!((a.fence, a.wait), (1, Duration::ZERO));
    let other = gates.claim(cpm, 2, "pod-a#2", BUSY).await.unwrap();
    assert_eq!(other.fence, 1, "each send slot has its own row");
    gates.arm(cpm, 1, a.fence, BUSY).await.unwrap();
    // The sender is killed mid-POST, its lease released: the next holder of slot 1 waits.
    let b = gates.claim(cpm, 1, "pod-b#1", BUSY).await.unwrap();
    assert!(b.fence == 2 && b.wait >= ms(1200) && b.wait <= BUSY, "{b:?}");
    assert_eq!(gates.arm(cpm, 1, a.fence, BUSY).await, Err(GateError::FenceLost { ours: 1, current: 2 }));
    assert_eq!(gates.release(cpm, 1, a.fence).await, Err(GateError::FenceLost { ours: 1, current: 2 }));
    gates.release(cpm, 1, b.fence).await.unwrap();
    assert_eq!(busy_left(&db, "send_slot", 1).await, None);
    assert_eq!(gates.claim(cpm, 1, "pod-c#1", BUSY).await.unwrap().wait, Duration::ZERO);
}

#[tokio::test]
async fn a_claim_waiting_on_a_holders_commit_sees_the_window_that_commit_opened() {
    let db = TestDb::new("gate_race", &[]).await;
    let inbox = db.inbox();
    let a = inbox.claim(slot(2), "pod-a", ms(10)).await.unwrap();
    tokio::time::sleep(ms(50)).await;
    // The holder's commit and a new claim race on the row lock: either the commit
    // lands first (and the claim waits out its window) or the claim does (and the
    // commit is refused). Never both a successful commit and a claim with no wait.
    let received = batch("R", 1);
    let (commit, claim) =
        tokio::join!(inbox.commit(slot(2), a.fence, &received, "p-r", BUSY), inbox.claim(slot(2), "pod-b", BUSY));
    let claim = claim.unwrap();
    match commit {
        Ok(_) => assert!(claim.wait >= ms(1200), "commit first: the claim waits {:?}", claim.wait),
        Err(e) => assert_eq!(e, InboxError::FenceLost { ours: 1, current: 2 }),
    }
}
