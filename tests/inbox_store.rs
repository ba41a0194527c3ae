//! The Postgres inbox against a real Postgres: fences that only go up, writes
//! refused to a superseded holder, redelivery without duplicates, malformed
//! messages kept raw, and a batch committed with its cursor or not at all.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use cabine_actors::domain::{ChannelId, SlotId};
use cabine_actors::ports::{InboundMessage, InboxError, InboxStore, MessageMeta};
use support::{TestDb, batch, message, slot};

/// The busy window every gate write asks for here (DESIGN §2.5).
const BUSY: std::time::Duration = std::time::Duration::from_millis(1500);

#[tokio::test]
async fn claim_creates_the_row_and_returns_the_stored_cursor() {
    let db = TestDb::new("inbox_claim", &[]).await;
    let inbox = db.inbox();
    let first = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap();
    assert_eq!((first.fence, first.pull_next), (1, None));
    inbox.store_cursor(slot(1), 1, Some("/api/v1/out/x/stream/abc"), BUSY).await.unwrap();
    let second = inbox.claim(slot(1), "pod-b", BUSY).await.unwrap();
    assert_eq!((second.fence, second.pull_next.as_deref()), (2, Some("/api/v1/out/x/stream/abc")));
    assert_eq!(db.cursor(slot(1)).await.2.as_deref(), Some("pod-b"));
    let other = inbox.claim(SlotId { channel: ChannelId::Csm, n: 1 }, "pod-a", BUSY).await.unwrap();
    assert_eq!(other.fence, 1, "each slot has its own fence");
}

#[tokio::test]
async fn fences_strictly_increase_even_across_concurrent_claimers() {
    let db = TestDb::new("inbox_fence", &[]).await;
    // Several shapes of contention, each on its own slot: (claimers, claims each).
    for (n, (claimers, claims)) in [(2usize, 12usize), (4, 8), (6, 6)].into_iter().enumerate() {
        let target = slot(n as u8 + 1);
        let mut tasks = Vec::new();
        for c in 0..claimers {
            let inbox = db.inbox();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::with_capacity(claims);
                for _ in 0..claims {
                    seen.push(inbox.claim(target, &format!("claimer-{c}"), BUSY).await.unwrap().fence);
                    tokio::task::yield_now().await;
                }
                seen
            }));
        }
        let mut all = BTreeSet::new();
        for task in tasks {
            let seen = task.await.unwrap();
            assert!(seen.windows(2).all(|w| w[0] < w[1]), "one claimer's fences go up: {seen:?}");
            for f in seen {
                assert!(all.insert(f), "fence {f} handed out twice");
            }
        }
        let expected: BTreeSet<i64> = (1..=(claimers * claims) as i64).collect();
        assert_eq!(all, expected, "every claim took the next fence, none skipped or repeated");
        assert_eq!(db.cursor(target).await.0, (claimers * claims) as i64);
    }
}

#[tokio::test]
async fn a_stale_fence_can_neither_commit_nor_store_a_cursor() {
    let db = TestDb::new("inbox_stale", &[]).await;
    let inbox = db.inbox();
    let stale = inbox.claim(slot(2), "pod-a", BUSY).await.unwrap().fence;
    inbox.store_cursor(slot(2), stale, Some("p-1"), BUSY).await.unwrap();
    let current = inbox.claim(slot(2), "pod-b", BUSY).await.unwrap().fence;
    assert!(current > stale);

    let lost = InboxError::FenceLost { ours: stale, current };
    assert_eq!(inbox.commit(slot(2), stale, &batch("S", 3), "p-stale", BUSY).await, Err(lost.clone()));
    assert_eq!(inbox.store_cursor(slot(2), stale, Some("p-stale"), BUSY).await, Err(lost.clone()));
    assert_eq!(inbox.store_cursor(slot(2), stale, None, BUSY).await, Err(lost));
    assert_eq!(db.count("true").await, 0, "nothing committed by the stale holder");
    assert_eq!(db.cursor(slot(2)).await, (current, Some("p-1".into()), Some("pod-b".into())));

    let fresh = inbox.commit(slot(2), current, &batch("S", 3), "p-2", BUSY).await.unwrap();
    assert_eq!(fresh.inserted.len(), 3, "the current holder commits the same batch");
    assert_eq!(db.cursor(slot(2)).await.1.as_deref(), Some("p-2"));
}

#[tokio::test]
async fn a_redelivered_batch_inserts_nothing_and_reports_duplicates() {
    let db = TestDb::new("inbox_dup", &[]).await;
    let inbox = db.inbox();
    let fence = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap().fence;
    let first = inbox.commit(slot(1), fence, &batch("D", 10), "p-1", BUSY).await.unwrap();
    assert_eq!((first.inserted.len(), first.duplicates, first.malformed), (10, 0, 0));
    assert!(first.inserted.windows(2).all(|w| w[0].id < w[1].id), "rows in id order");
    assert!(first.inserted.iter().all(|r| r.slot == slot(1)));

    let again = inbox.commit(slot(1), fence, &batch("D", 10), "p-1", BUSY).await.unwrap();
    assert_eq!((again.inserted.len(), again.duplicates), (0, 10));

    // The next holder gets the same batch back and half of a new one.
    let next = inbox.claim(slot(1), "pod-b", BUSY).await.unwrap().fence;
    let mut mixed = batch("D", 5);
    mixed.extend(batch("E", 4));
    mixed.push(message("E-0", None));
    let summary = inbox.commit(slot(1), next, &mixed, "p-2", BUSY).await.unwrap();
    let keys: Vec<&str> = summary.inserted.iter().map(|r| r.message.resource_id.as_str()).collect();
    assert_eq!(keys, ["E-0", "E-1", "E-2", "E-3"]);
    assert_eq!(summary.duplicates, 6, "5 redelivered + 1 repeated inside the batch");
    assert_eq!(db.count("true").await, 14);

    let too_big = batch("F", cabine::inbox::MAX_BATCH + 1);
    assert!(matches!(inbox.commit(slot(1), next, &too_big, "p-3", BUSY).await, Err(InboxError::Fatal(_))));
    assert_eq!(db.cursor(slot(1)).await.1.as_deref(), Some("p-2"));
}

#[tokio::test]
async fn malformed_messages_are_persisted_raw_with_their_reason() {
    let db = TestDb::new("inbox_bad", &[]).await;
    let inbox = db.inbox();
    let fence = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap().fence;
    let garbage: &[u8] = b"\x00\xff\xfe<Envelope><AppHdr>unterminated";
    let unreadable = InboundMessage {
        resource_id: "R-bad".into(),
        raw: Bytes::from_static(garbage),
        meta: MessageMeta::default(),
        malformed: Some("unparseable XML: unexpected end".into()),
    };
    let keyless = InboundMessage {
        resource_id: String::new(),
        raw: Bytes::from_static(b"<part without id/>"),
        meta: MessageMeta::default(),
        malformed: None,
    };
    let batch = vec![message("R-good", None), unreadable, keyless.clone()];
    let summary = inbox.commit(slot(1), fence, &batch, "p-1", BUSY).await.unwrap();
    assert_eq!((summary.inserted.len(), summary.malformed, summary.duplicates), (3, 2, 0));
    let stored_key = summary.inserted[2].message.resource_id.clone();
    assert!(stored_key.starts_with("missing:"), "{stored_key}");

    let conn = db.pool.get().await.unwrap();
    let rows =
        conn.query("SELECT resource_id, reason, raw, raw_bytes FROM inbox_dead_letter ORDER BY id", &[]).await.unwrap();
    assert_eq!(rows.len(), 2, "the dead-letter view holds both malformed rows");
    assert_eq!(rows[0].get::<_, String>("resource_id"), "R-bad");
    assert_eq!(rows[0].get::<_, String>("reason"), "unparseable XML: unexpected end");
    assert_eq!(rows[0].get::<_, Vec<u8>>("raw"), garbage, "raw bytes intact");
    assert_eq!(rows[0].get::<_, i32>("raw_bytes") as usize, garbage.len());
    assert_eq!(rows[1].get::<_, String>("resource_id"), stored_key);
    assert_eq!(rows[1].get::<_, String>("reason"), "no PI-ResourceId");
    assert_eq!(db.count("status = 'received' AND resource_id = 'R-good'").await, 1);
    assert_eq!(db.cursor(slot(1)).await.1.as_deref(), Some("p-1"), "the batch is acknowledged like any other");

    let again = inbox.commit(slot(1), fence, &[keyless], "p-1", BUSY).await.unwrap();
    assert_eq!(again.duplicates, 0, "a keyless part at another place is another dead letter: kept, never lost");
    let redelivered = inbox.commit(slot(1), fence, &batch_of_three_again(), "p-1", BUSY).await.unwrap();
    assert_eq!(redelivered.duplicates, 3, "the same keyless part at the same place maps to the same key");
}

#[tokio::test]
async fn a_resource_id_too_large_for_the_index_and_a_nul_in_a_field_commit_as_malformed_rows() {
    let db = TestDb::new("inbox_poison", &[]).await;
    let inbox = db.inbox();
    let fence = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap().fence;
    // 4 KB passes the 8 KB header limit but not the unique btree index (~2.7 KB a row).
    let huge = message(&cabine::harness::incompressible(13, 4096), None);
    let mut nul = message("R-nul", None);
    nul.meta.biz_msg_id = Some("M00038166\0X".into());
    let poison = vec![message("R-before", None), huge.clone(), nul, message("R-after", None)];
    let summary = inbox.commit(slot(1), fence, &poison, "p-1", BUSY).await.expect("committed, poison and all");
    assert_eq!((summary.inserted.len(), summary.malformed, summary.duplicates), (4, 2, 0));
    let derived = summary.inserted[1].message.resource_id.clone();
    assert!(derived.starts_with("resource-id:") && derived.len() < 100, "{derived}");
    assert_eq!(db.cursor(slot(1)).await.1.as_deref(), Some("p-1"), "the stream moves on");
    assert_eq!(db.count("status = 'received' AND resource_id IN ('R-before', 'R-after')").await, 2);

    let conn = db.pool.get().await.unwrap();
    let rows = conn.query("SELECT resource_id, reason, raw FROM inbox_dead_letter ORDER BY id", &[]).await.unwrap();
    assert_eq!(rows.len(), 2, "both kept as dead letters");
    assert_eq!(rows[0].get::<_, String>(0), derived);
    assert!(rows[0].get::<_, String>(1).contains("PI-ResourceId of 4096 bytes"));
    assert_eq!(rows[0].get::<_, Vec<u8>>(2), huge.raw.to_vec(), "raw bytes intact");
    assert_eq!(rows[1].get::<_, String>(0), "R-nul");
    assert!(rows[1].get::<_, String>(1).contains("NUL byte in BizMsgIdr"));

    let again = inbox.commit(slot(1), fence, &poison, "p-2", BUSY).await.unwrap();
    assert_eq!(again.duplicates, 4, "a redelivery maps the huge ResourceId to the same key");
}

fn batch_of_three_again() -> Vec<InboundMessage> {
    vec![
        message("R-good", None),
        InboundMessage {
            resource_id: "R-bad".into(),
            raw: Bytes::from_static(b"whatever"),
            meta: MessageMeta::default(),
            malformed: Some("again".into()),
        },
        InboundMessage {
            resource_id: String::new(),
            raw: Bytes::from_static(b"<part without id/>"),
            meta: MessageMeta::default(),
            malformed: None,
        },
    ]
}

#[tokio::test]
async fn a_commit_that_fails_midway_leaves_neither_rows_nor_cursor() {
    let db = TestDb::new("inbox_atomic", &[]).await;
    let inbox = db.inbox();
    let fence = inbox.claim(slot(3), "pod-a", BUSY).await.unwrap().fence;
    inbox.store_cursor(slot(3), fence, Some("p-0"), BUSY).await.unwrap();
    let conn = db.pool.get().await.unwrap();
    conn.batch_execute(
        "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'boom'; END $$;
         CREATE TRIGGER refuse_boom BEFORE INSERT ON inbox FOR EACH ROW WHEN (NEW.resource_id = 'A-boom')
         EXECUTE FUNCTION refuse_boom();",
    )
    .await
    .unwrap();
    drop(conn);

    let mut poisoned = batch("A", 4);
    poisoned.push(message("A-boom", None));
    poisoned.extend(batch("B", 3));
    let err = inbox.commit(slot(3), fence, &poisoned, "p-1", BUSY).await.unwrap_err();
    assert!(matches!(err, InboxError::Fatal(ref m) if m.contains("boom")), "{err:?}");
    assert_eq!(db.count("true").await, 0, "the four rows before the failure are gone too");
    assert_eq!(db.cursor(slot(3)).await.1.as_deref(), Some("p-0"), "the cursor did not move");

    let ok = inbox.commit(slot(3), fence, &batch("A", 4), "p-1", BUSY).await.unwrap();
    assert_eq!(ok.inserted.len(), 4);
}

#[tokio::test]
async fn a_commit_past_the_query_timeout_is_unavailable_and_cancelled() {
    let db = TestDb::new("inbox_slow", &[("CABINE__POSTGRES__QUERY_TIMEOUT", "300ms")]).await;
    let inbox = db.inbox();
    let fence = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap().fence;
    inbox.store_cursor(slot(1), fence, Some("p-0"), BUSY).await.unwrap();
    // Another session holds the slot row: the commit waits on its lock past the timeout.
    let mut blocker = db.pool.get().await.unwrap();
    let tx = blocker.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM slot_cursor WHERE slot = 1 FOR UPDATE", &[]).await.unwrap();
    let err = inbox.commit(slot(1), fence, &batch("T", 2), "p-1", BUSY).await.unwrap_err();
    assert!(matches!(err, InboxError::Unavailable(_)), "{err:?}");
    tokio::time::sleep(Duration::from_millis(200)).await; // let the cancel reach the server
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(db.count("true").await, 0, "the timed-out statement never committed later");
    assert_eq!(db.cursor(slot(1)).await.1.as_deref(), Some("p-0"));
}

#[tokio::test]
async fn an_unreachable_postgres_is_unavailable_not_fatal() {
    let port = cabine::harness::free_port().unwrap();
    let url = format!("postgres://root@127.0.0.1:{port}/test");
    let settings = support::settings(&cabine::harness::unique_name("inbox_down"), &[("CABINE__POSTGRES__URL", &url)]);
    let pool = cabine::db::pool(&settings.postgres).unwrap();
    let inbox = cabine::inbox::PgInbox::new(pool, &settings.cluster.ispb, Duration::from_secs(2));
    assert!(matches!(inbox.claim(slot(1), "pod-a", BUSY).await, Err(InboxError::Unavailable(_))));
    assert!(matches!(inbox.commit(slot(1), 1, &batch("X", 1), "p", BUSY).await, Err(InboxError::Unavailable(_))));
    assert!(matches!(inbox.store_cursor(slot(1), 1, None, BUSY).await, Err(InboxError::Unavailable(_))));
}

#[tokio::test]
async fn the_watchdog_reads_every_cursor_row_of_its_participant() {
    let db = TestDb::new("inbox_cursors", &[]).await;
    let inbox = db.inbox();
    assert!(inbox.cursors().await.unwrap().is_empty());
    inbox.claim(slot(2), "pod-a#e#1", BUSY).await.unwrap();
    inbox.claim(slot(1), "pod-b#e#2", BUSY).await.unwrap();
    inbox.claim(slot(1), "pod-a#e#3", BUSY).await.unwrap();
    inbox.store_cursor(slot(1), 2, Some("/api/v1/out/x/stream/1-1"), BUSY).await.unwrap();
    let rows = inbox.cursors().await.unwrap();
    let seen: Vec<(SlotId, i64, Option<&str>, Option<&str>)> =
        rows.iter().map(|c| (c.slot, c.fence, c.holder.as_deref(), c.pull_next.as_deref())).collect();
    assert_eq!(
        seen,
        vec![(slot(1), 2, Some("pod-a#e#3"), Some("/api/v1/out/x/stream/1-1")), (slot(2), 1, Some("pod-a#e#1"), None)]
    );
    assert!(rows.iter().all(|c| c.age < Duration::from_secs(5)), "{rows:?}");
}
