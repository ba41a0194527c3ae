//! The JetStream publisher against real Postgres and NATS: each committed row
//! on its subject once with its `Nats-Msg-Id`, duplicates absorbed by the
//! stream, and — with a private NATS killed and restarted — rows kept in
//! Postgres, a growing lag gauge, and a sweep that republishes them once.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cabine::publish::JetStreamPublisher;
use cabine_actors::ports::{CommittedRow, InboundMessage, InboundPublisher, InboxStore, MessageMeta};
use support::{PrivateNats, TestDb, TestStreams, batch, eventually, message, slot};

/// The busy window every gate write asks for here (DESIGN §2.5).
const BUSY: std::time::Duration = std::time::Duration::from_millis(1500);

async fn commit_all(db: &TestDb, batches: &[Vec<InboundMessage>]) -> Vec<CommittedRow> {
    let inbox = db.inbox();
    let fence = inbox.claim(slot(1), "pod-a", BUSY).await.unwrap().fence;
    let mut rows = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        rows.extend(inbox.commit(slot(1), fence, b, &format!("p-{i}"), BUSY).await.unwrap().inserted);
    }
    rows
}

#[tokio::test]
async fn each_committed_row_is_published_once_on_its_subject_with_its_msg_id() {
    let db = TestDb::new("pub_once", &[]).await;
    let client = async_nats::connect(&db.settings.nats.url).await.unwrap();
    let streams = TestStreams::create(&client, &db.settings).await;
    let publisher = JetStreamPublisher::start(client.clone(), db.pool.clone(), &db.settings);

    let mut mixed = vec![message("P-2a", Some("pacs.002.spi.1.15")), message("P-un", Some("garbled"))];
    mixed.push(InboundMessage {
        resource_id: "P-bad".into(),
        raw: bytes::Bytes::from_static(b"\xffnot xml"),
        meta: MessageMeta::default(),
        malformed: Some("unparseable XML".into()),
    });
    let rows = commit_all(&db, &[batch("P", 10), batch("Q", 10), mixed]).await;
    assert_eq!(rows.len(), 23);
    for chunk in rows.chunks(10) {
        publisher.committed(chunk.to_vec()).await;
    }
    assert!(publisher.close(Duration::from_secs(10)).await, "the queue drains");

    let ispb = db.ispb();
    let prefix = &db.settings.nats.subject_prefix;
    let on_bus = streams.inbound_messages().await;
    assert_eq!(on_bus.len(), 22, "every received row once; the malformed one is a dead letter");
    let by_id: BTreeMap<&str, _> = on_bus.iter().map(|(s, id, p)| (id.as_str(), (s.as_str(), p))).collect();
    assert_eq!(by_id.len(), 22, "no Nats-Msg-Id twice");
    for row in rows.iter().filter(|r| r.message.malformed.is_none()) {
        let id = format!("{ispb}:cpm:{}", row.message.resource_id);
        let (subject, payload) = by_id.get(id.as_str()).unwrap_or_else(|| panic!("{id} not on the bus"));
        let kind = match row.message.resource_id.as_str() {
            "P-2a" => "pacs.002",
            "P-un" => "unknown",
            _ => "pacs.008",
        };
        assert_eq!(*subject, format!("{prefix}.in.{ispb}.{kind}"));
        assert_eq!(*payload, &row.message.raw);
    }
    assert_eq!(db.count("status = 'received' AND published_at IS NULL").await, 0, "all marked published");
    assert_eq!(db.count("status = 'malformed' AND published_at IS NULL").await, 1);
    let republisher = JetStreamPublisher::start(client, db.pool.clone(), &db.settings);
    assert_eq!(republisher.oldest_unpublished().await.unwrap(), Duration::ZERO, "dead letters are not lag");
    assert_eq!(republisher.sweep(Duration::ZERO).await.unwrap(), 0, "nothing left to sweep");
}

#[tokio::test]
async fn publishing_the_same_row_twice_yields_one_stream_message() {
    let db = TestDb::new("pub_dedup", &[]).await;
    let client = async_nats::connect(&db.settings.nats.url).await.unwrap();
    let streams = TestStreams::create(&client, &db.settings).await;
    let publisher = JetStreamPublisher::start(client, db.pool.clone(), &db.settings);

    let rows = commit_all(&db, &[batch("D", 10)]).await;
    publisher.committed(rows.clone()).await;
    publisher.committed(rows.clone()).await;
    assert!(eventually(Duration::from_secs(10), || async { db.count("published_at IS NULL").await == 0 }).await);

    // A lost mark (published, not recorded): the sweep publishes every row again.
    let conn = db.pool.get().await.unwrap();
    conn.execute("UPDATE inbox SET published_at = NULL", &[]).await.unwrap();
    assert_eq!(publisher.sweep(Duration::ZERO).await.unwrap(), 10, "all acknowledged, as duplicates");
    assert_eq!(db.count("published_at IS NULL").await, 0);
    assert_eq!(db.count("attempts = 1").await, 10, "each sweep republication is counted on its row");

    let on_bus = streams.inbound_messages().await;
    let ids: BTreeSet<&str> = on_bus.iter().map(|(_, id, _)| id.as_str()).collect();
    assert_eq!((on_bus.len(), ids.len()), (10, 10), "three publications of each row, one stream message");
}

#[tokio::test]
async fn a_young_row_is_left_to_the_live_path_by_the_sweep() {
    let db = TestDb::new("pub_young", &[]).await;
    let client = async_nats::connect(&db.settings.nats.url).await.unwrap();
    let streams = TestStreams::create(&client, &db.settings).await;
    let publisher = JetStreamPublisher::start(client, db.pool.clone(), &db.settings);
    commit_all(&db, &[batch("Y", 3)]).await;
    assert_eq!(publisher.sweep(Duration::from_secs(30)).await.unwrap(), 0, "younger than republish_after");
    assert!(streams.inbound_messages().await.is_empty());
    assert_eq!(publisher.sweep(Duration::ZERO).await.unwrap(), 3);
    assert_eq!(streams.inbound_messages().await.len(), 3);
}

#[tokio::test]
async fn without_a_stream_rows_stay_unpublished_until_the_sweep_finds_one() {
    let db = TestDb::new("pub_nostream", &[]).await;
    let client = async_nats::connect(&db.settings.nats.url).await.unwrap();
    let publisher = JetStreamPublisher::start(client.clone(), db.pool.clone(), &db.settings);
    let rows = commit_all(&db, &[batch("N", 5)]).await;
    publisher.committed(rows).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(db.count("published_at IS NULL").await, 5, "no stream, no PubAck, nothing marked");
    assert!(publisher.sweep(Duration::ZERO).await.is_err(), "the sweep reports the bus failure");

    let streams = TestStreams::create(&client, &db.settings).await;
    assert_eq!(publisher.sweep(Duration::ZERO).await.unwrap(), 5);
    assert_eq!(streams.inbound_messages().await.len(), 5);
    assert_eq!(db.count("attempts = 2").await, 5, "two sweeps tried each row");
}

#[tokio::test]
async fn with_nats_down_rows_wait_in_postgres_and_the_sweep_republishes_them_once() {
    let metrics = cabine::telemetry::metrics_handle();
    let store = tempfile::tempdir().unwrap();
    let mut nats = PrivateNats::start(store.path().to_path_buf());
    let url = nats.url();
    let db = TestDb::new(
        "pub_down",
        &[
            ("CABINE__NATS__URL", url.as_str()),
            ("CABINE__NATS__REQUEST_TIMEOUT", "1s"),
            ("CABINE__NATS__CONNECT_TIMEOUT", "1s"),
        ],
    )
    .await;
    let client = cabine::bus::connect(&db.settings.nats).await.unwrap();
    let streams = TestStreams::create(&client, &db.settings).await;
    let publisher = JetStreamPublisher::start(client.clone(), db.pool.clone(), &db.settings);

    let before = commit_all(&db, &[batch("A", 10)]).await;
    publisher.committed(before).await;
    assert!(eventually(Duration::from_secs(10), || async { db.count("published_at IS NULL").await == 0 }).await);

    nats.kill();
    let disconnected = || async { client.connection_state() != async_nats::connection::State::Connected };
    assert!(eventually(Duration::from_secs(5), disconnected).await, "the client noticed");
    let inbox = db.inbox();
    let fence = inbox.claim(slot(2), "pod-a", BUSY).await.unwrap().fence;
    let mut during = Vec::new();
    for i in 0..3 {
        let rows = inbox.commit(slot(2), fence, &batch(&format!("B{i}"), 10), "p", BUSY).await.unwrap().inserted;
        let handed = tokio::time::timeout(Duration::from_secs(2), publisher.committed(rows.clone())).await;
        assert!(handed.is_ok(), "a dead bus does not stall the slot");
        during.extend(rows);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(db.count("published_at IS NULL").await, 30, "rows stay unpublished, safe in Postgres");
    let lag1 = publisher.oldest_unpublished().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lag2 = publisher.oldest_unpublished().await.unwrap();
    assert!(lag2 >= lag1 + Duration::from_millis(350), "the lag grows: {lag1:?} then {lag2:?}");
    let gauge = format!("cabine_inbound_oldest_unpublished_seconds{{ispb=\"{}\"}}", db.ispb());
    let rendered = metrics.render();
    let value: f64 = rendered
        .lines()
        .find_map(|l| l.strip_prefix(&gauge).map(|v| v.trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("{gauge} missing from\n{rendered}"));
    assert!(value >= lag2.as_secs_f64() - 0.01, "the gauge shows it: {value}");
    let deferred: f64 = rendered
        .lines()
        .find_map(|l| l.strip_prefix("cabine_inbound_publish_deferred_total ").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0.0);
    assert!(deferred >= 30.0, "the live path left the rows to the sweep, counted: {deferred}");
    assert!(publisher.sweep(Duration::ZERO).await.is_err(), "the sweep reports the bus down");

    nats.restart();
    let connected = || async { client.connection_state() == async_nats::connection::State::Connected };
    assert!(eventually(Duration::from_secs(15), connected).await, "the client reconnected");
    assert_eq!(publisher.sweep(Duration::ZERO).await.unwrap(), 30, "the sweep republished what waited");
    assert_eq!(publisher.oldest_unpublished().await.unwrap(), Duration::ZERO);
    assert_eq!(db.count("published_at IS NULL").await, 0);

    let on_bus = streams.inbound_messages().await;
    let ids: BTreeSet<&str> = on_bus.iter().map(|(_, id, _)| id.as_str()).collect();
    assert_eq!(on_bus.len(), 40, "every row exactly once across the outage");
    assert_eq!(ids.len(), 40);
    for row in &during {
        assert!(ids.contains(publisher.msg_id("cpm", &row.message.resource_id).as_str()));
    }
    drop(streams);
    nats.kill();
}

#[test]
fn the_duplicate_window_must_cover_twice_republish_after() {
    let env = |w: &str, r: &str| {
        [("CABINE__NATS__DUPLICATE_WINDOW", w), ("CABINE__TIMING__REPUBLISH_AFTER", r)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let load = |w, r| cabine::config::Settings::from_sources(cabine::config::DEFAULT_TOML, None, &env(w, r));
    assert!(load("60s", "30s").is_ok());
    match load("59s", "30s") {
        Err(cabine::config::ConfigError::Invalid { key, .. }) => {
            assert_eq!(key, "nats.duplicate_window, timing.republish_after")
        }
        other => panic!("expected a violation, got {other:?}"),
    }
}

/// A publication mark (inbox and outbound outbox alike) commits without
/// waiting for the WAL flush — `synchronous_commit` off inside its own
/// transaction — and the pooled connection it ran on is synchronous again
/// afterwards, for the commits an acknowledgement waits for.
#[tokio::test]
async fn publication_marks_commit_asynchronously_and_only_themselves() {
    let db = TestDb::new("pub_async_mark", &[]).await;
    let rows = commit_all(&db, &[batch("M", 3)]).await;
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let mut conn = db.pool.get().await.unwrap();
    for mark in [cabine::publish::MARK_PUBLISHED, cabine::outbound::results::MARK_PUBLISHED] {
        let tx = conn.transaction().await.unwrap();
        tx.execute(mark, &[&ids]).await.unwrap();
        let inside: String = tx.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
        tx.commit().await.unwrap();
        let after: String = conn.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
        assert_eq!((inside.as_str(), after.as_str()), ("off", "on"), "{mark}");
    }
    assert_eq!(db.count("published_at IS NOT NULL").await, 3, "the inbox mark still marks");
}

/// A round's mark that waits on a row lock (the confirmer holds the status
/// reports it correlates for its whole pass) does not hold the next round:
/// the next rows reach the bus meanwhile, and every row is marked once the
/// lock is gone.
#[tokio::test]
async fn a_mark_waiting_on_a_row_lock_does_not_hold_the_next_round() {
    let db = TestDb::new("pub_mark_beside", &[]).await;
    let client = async_nats::connect(&db.settings.nats.url).await.unwrap();
    let streams = TestStreams::create(&client, &db.settings).await;
    let publisher = JetStreamPublisher::start(client.clone(), db.pool.clone(), &db.settings);
    let rows = commit_all(&db, &[batch("L", 2), batch("N", 2)]).await;
    let (locked, next) = rows.split_at(2);

    let mut holder = db.pool.get().await.unwrap();
    let lock = holder.transaction().await.unwrap();
    let ids: Vec<i64> = locked.iter().map(|r| r.id).collect();
    lock.query("SELECT id FROM inbox WHERE id = ANY($1) FOR UPDATE", &[&ids]).await.unwrap();

    publisher.committed(locked.to_vec()).await;
    let on_bus = |n: usize| {
        let streams = &streams;
        move || async move { streams.inbound_messages().await.len() == n }
    };
    assert!(eventually(Duration::from_secs(5), on_bus(2)).await, "the first round is published");
    publisher.committed(next.to_vec()).await;
    assert!(eventually(Duration::from_secs(5), on_bus(4)).await, "the next round is not held by the waiting mark");
    let only_locked_left = || async { db.count("published_at IS NULL").await == 2 };
    assert!(eventually(Duration::from_secs(5), only_locked_left).await, "the next mark done, the first one waiting");

    lock.rollback().await.unwrap();
    let all_marked = || async { db.count("published_at IS NULL").await == 0 };
    assert!(eventually(Duration::from_secs(5), all_marked).await, "every row marked once the lock is gone");
    assert!(publisher.close(Duration::from_secs(5)).await);
}
