//! The Postgres outbound store: once per MsgId, ordered and exclusive takes,
//! deadlines, retries and poison, 429s, reprocess, crashed claims,
//! confirmations, and the history/result events of every change.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cabine::db::Db;
use cabine::outbound::{OutboundPolicy, PgOutboundStore};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::outbound::{
    BatchSize, ClaimToken, Inserted, InvalidOutbound, NewOutbound, OutboundStatus, OutboundStore, Priority,
    Reprocessed, SendResult,
};
use cabine_actors::ports::outbound_bus::{ResultEvent, ResultStatus};

use crate::common::settings;

const PACS008: &str = include_str!("../data/spi/pacs.008_END_1_msg.xml");
const TEMPLATE_ID: &str = "M0003816612345678901234567890123";
const TEMPLATE_E2E: &str = "E9999901012341234123412345678900";

pub struct Rig {
    pub pool: Db,
    pub store: PgOutboundStore,
    pub schema: String,
    policy: OutboundPolicy,
    pub ispb: cabine::config::Ispb,
}

pub fn policy() -> OutboundPolicy {
    OutboundPolicy {
        poison_attempts: 3,
        backoff_base: Duration::from_millis(40),
        backoff_max: Duration::from_millis(120),
        processing_timeout: Duration::from_millis(500),
        unconfirmed_after: Duration::from_millis(400),
        retry_after_default: Duration::from_millis(150),
        query_timeout: Duration::from_secs(1),
    }
}

impl Rig {
    pub async fn new() -> Rig {
        let s = settings("obs", &[]);
        let pool = cabine::db::pool(&s.postgres).unwrap();
        cabine::db::migrate(&pool, &s.postgres.schema).await.unwrap();
        let store = PgOutboundStore::new(pool.clone(), &s.cluster.ispb, policy());
        Rig { pool, store, schema: s.postgres.schema.clone(), policy: policy(), ispb: s.cluster.ispb.clone() }
    }

    /// Another pod's store over its own pool, same schema.
    pub fn other_pod(&self) -> PgOutboundStore {
        let mut s = settings("obs", &[]);
        s.postgres.schema = self.schema.clone();
        PgOutboundStore::new(cabine::db::pool(&s.postgres).unwrap(), &self.ispb, self.policy.clone())
    }

    pub async fn drop_schema(self) {
        let conn = self.pool.get().await.unwrap();
        conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema)).await.unwrap();
    }

    pub async fn status(&self, msg_id: &str) -> OutboundStatus {
        self.store.get(msg_id).await.unwrap().expect("stored").row.status
    }

    pub async fn take(&self, n: usize) -> (ClaimToken, Vec<String>) {
        let batch = self.store.take_ready(ChannelId::Cpm, BatchSize::new(n).unwrap()).await.unwrap();
        (batch.claim, batch.messages.into_iter().map(|m| m.msg_id).collect())
    }

    async fn rows(&self) -> i64 {
        self.pool.get().await.unwrap().query_one("SELECT count(*) FROM outbound", &[]).await.unwrap().get(0)
    }
}

/// A pacs.008 with its own MsgId (and EndToEndId `E{n}…`).
pub fn msg(n: u32, priority: Priority, deadline_in: Duration) -> NewOutbound {
    let msg_id = format!("M99999010{n:023}");
    let e2e = format!("E99999010{n:023}");
    let raw = PACS008.replace(TEMPLATE_ID, &msg_id).replace(TEMPLATE_E2E, &e2e);
    NewOutbound {
        msg_id,
        msg_type: "pacs.008".into(),
        channel: ChannelId::Cpm,
        priority,
        deadline: SystemTime::now() + deadline_in,
        end_to_end_ids: vec![e2e],
        ingress_ref: None,
        raw: Bytes::from(raw),
    }
}

pub fn minutes(n: u64) -> Duration {
    Duration::from_secs(60 * n)
}

fn new_event(i: Inserted) -> ResultEvent {
    match i {
        Inserted::New { event, .. } => event,
        dup => panic!("expected a new row, got {dup:?}"),
    }
}

pub fn statuses(events: &[ResultEvent]) -> Vec<ResultStatus> {
    events.iter().map(|e| e.status).collect()
}

#[tokio::test]
async fn a_msg_id_is_stored_once_and_a_duplicate_returns_its_state() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    let event = new_event(rig.store.insert(&m).await.unwrap());
    assert_eq!((event.status, event.dedup_id()), (ResultStatus::Accepted, format!("{}:accepted:0", m.msg_id)));
    match rig.store.insert(&m).await.unwrap() {
        Inserted::Duplicate { row, same_body } => assert!(same_body && row.status == OutboundStatus::Queued),
        other => panic!("{other:?}"),
    }
    let (claim, _) = rig.take(10).await;
    let sent = SendResult::Sent { resource_id: "R1".into() };
    rig.store.record(&claim, &[(m.msg_id.clone(), sent)]).await.unwrap();
    let mut altered = m.clone();
    altered.raw = Bytes::from_static(b"<other/>");
    match rig.store.insert(&altered).await.unwrap() {
        Inserted::Duplicate { row, same_body } => {
            assert_eq!((row.status, same_body, row.resource_ids), (OutboundStatus::Sent, false, vec!["R1".to_owned()]))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.rows().await, 1);
    rig.drop_schema().await;
}

#[tokio::test]
async fn concurrent_inserts_of_one_msg_id_store_one_row() {
    let rig = Rig::new().await;
    let other = Arc::new(rig.other_pod());
    let m = msg(7, Priority::Normal, minutes(5));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (store, m) = (other.clone(), m.clone());
        tasks.push(tokio::spawn(async move { (i, store.insert(&m).await.unwrap()) }));
    }
    let mut new = 0;
    for t in tasks {
        if matches!(t.await.unwrap().1, Inserted::New { .. }) {
            new += 1;
        }
    }
    assert_eq!((new, rig.rows().await), (1, 1));
    rig.drop_schema().await;
}

#[tokio::test]
async fn ready_rows_come_by_priority_then_deadline_one_channel_at_a_time() {
    let rig = Rig::new().await;
    let plan = [
        (1, Priority::Low, 1),
        (2, Priority::Normal, 2),
        (3, Priority::Critical, 5),
        (4, Priority::Critical, 3),
        (5, Priority::High, 1),
    ];
    for (n, p, m) in plan {
        rig.store.insert(&msg(n, p, minutes(m))).await.unwrap();
    }
    let mut csm = msg(6, Priority::Critical, minutes(1));
    csm.channel = ChannelId::Csm;
    rig.store.insert(&csm).await.unwrap();
    let (_, first) = rig.take(2).await;
    let (_, rest) = rig.take(10).await;
    let id = |n: u32| msg(n, Priority::Low, minutes(1)).msg_id;
    assert_eq!(first, vec![id(4), id(3)], "critical first, earlier deadline first");
    assert_eq!(rest, vec![id(5), id(2), id(1)], "then high, normal, low; csm stays");
    let depth = rig.store.depth().await.unwrap();
    assert_eq!(depth.queued(), 1);
    assert_eq!(depth.lines.iter().map(|l| l.sending).sum::<u64>(), 5);
    rig.drop_schema().await;
}

#[tokio::test]
async fn two_concurrent_takers_never_take_a_row_twice() {
    let rig = Rig::new().await;
    for n in 0..60 {
        rig.store.insert(&msg(n, Priority::ALL[n as usize % 4], minutes(5))).await.unwrap();
    }
    let pods = [Arc::new(rig.other_pod()), Arc::new(rig.other_pod())];
    let mut tasks = Vec::new();
    for pod in pods {
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = pod.take_ready(ChannelId::Cpm, BatchSize::new(7).unwrap()).await.unwrap();
                if batch.messages.is_empty() {
                    return mine;
                }
                mine.extend(batch.messages.into_iter().map(|m| m.msg_id));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (60, 60), "every row once, none twice");
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_row_past_its_deadline_times_out_and_is_never_taken() {
    let rig = Rig::new().await;
    let late = msg(1, Priority::Critical, Duration::from_millis(300));
    rig.store.insert(&late).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let batch = rig.store.take_ready(ChannelId::Cpm, BatchSize::MAX).await.unwrap();
    assert!(batch.messages.is_empty());
    assert_eq!(statuses(&batch.expired), [ResultStatus::Timeout]);
    assert_eq!(batch.expired[0].dedup_id(), format!("{}:timeout:0", late.msg_id));
    assert!(rig.take(10).await.1.is_empty());
    assert!(rig.store.expire_overdue(100).await.unwrap().is_empty(), "expired once");
    assert_eq!(rig.store.reprocess(&late.msg_id).await.unwrap(), Reprocessed::NotAllowed(OutboundStatus::Timeout));
    rig.drop_schema().await;
}

#[tokio::test]
async fn the_take_itself_skips_overdue_rows_the_expiry_has_not_reached() {
    let rig = Rig::new().await;
    for n in 0..105 {
        rig.store.insert(&msg(n, Priority::Critical, Duration::from_millis(200))).await.unwrap();
    }
    let fresh = msg(999, Priority::Low, minutes(5));
    rig.store.insert(&fresh).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let batch = rig.store.take_ready(ChannelId::Cpm, BatchSize::MAX).await.unwrap();
    assert_eq!(batch.expired.len(), 100, "the expiry on the way is bounded");
    let taken: Vec<&str> = batch.messages.iter().map(|m| m.msg_id.as_str()).collect();
    assert_eq!(taken, [fresh.msg_id.as_str()], "5 overdue rows are left queued, yet never taken");
    assert_eq!(rig.store.expire_overdue(100).await.unwrap().len(), 5);
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_claimed_row_does_not_expire_but_never_goes_back_to_the_queue_late() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, Duration::from_millis(500));
    rig.store.insert(&m).await.unwrap();
    let (claim, taken) = rig.take(10).await;
    assert_eq!(taken, vec![m.msg_id.as_str()]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(rig.store.expire_overdue(100).await.unwrap().is_empty(), "a claimed row is the sender's");
    assert_eq!(rig.status(&m.msg_id).await, OutboundStatus::Sending);
    let not_sent = SendResult::NotSent { retry_after: Duration::ZERO, reason: "no lease".into() };
    let rec = rig.store.record(&claim, &[(m.msg_id.clone(), not_sent)]).await.unwrap();
    assert_eq!(statuses(&rec.events), [ResultStatus::Timeout]);
    assert!(rig.take(10).await.1.is_empty());
    rig.drop_schema().await;
}

#[tokio::test]
async fn status_pages_and_history() {
    let rig = Rig::new().await;
    for n in 0..5 {
        rig.store.insert(&msg(n, Priority::Low, minutes(5))).await.unwrap();
    }
    let first = rig.store.list(OutboundStatus::Queued, None, 2).await.unwrap();
    assert_eq!(first.rows.len(), 2);
    let second = rig.store.list(OutboundStatus::Queued, first.next_after, 10).await.unwrap();
    assert_eq!((second.rows.len(), second.next_after), (3, None));
    assert!(second.rows[0].id > first.rows[1].id);
    let depth = rig.store.depth().await.unwrap();
    assert_eq!(depth.lines.len(), 1);
    assert_eq!((depth.lines[0].priority, depth.lines[0].queued), (Priority::Low, 5));
    assert!(depth.lines[0].oldest_queued.is_some());
    assert!(rig.store.get("M-unknown").await.unwrap().is_none());
    let detail = rig.store.get(&msg(0, Priority::Low, minutes(5)).msg_id).await.unwrap().unwrap();
    assert_eq!(detail.history.len(), 1);
    assert_eq!((detail.history[0].from, detail.history[0].event), (None, Some(ResultStatus::Accepted)));
    rig.drop_schema().await;
}

#[tokio::test]
async fn an_unreadable_request_is_kept_once_per_ingress_ref() {
    let rig = Rig::new().await;
    let bad = InvalidOutbound {
        ingress_ref: Some("OUT:7:123".into()),
        channel: Some(ChannelId::Cpm),
        claimed_msg_id: Some("M1".into()),
        reason: "body: malformed XML".into(),
        raw: Bytes::from_static(b"<Envelope>"),
    };
    let ev = new_event(rig.store.insert_invalid(&bad).await.unwrap());
    assert_eq!(ev.dedup_id(), "OUT:7:123:rejected_invalid:0");
    assert!(ev.detail.as_deref().unwrap().contains("MsgId read: M1"));
    assert!(matches!(rig.store.insert_invalid(&bad).await.unwrap(), Inserted::Duplicate { same_body: true, .. }));
    let anonymous = InvalidOutbound { ingress_ref: None, ..bad };
    new_event(rig.store.insert_invalid(&anonymous).await.unwrap());
    new_event(rig.store.insert_invalid(&anonymous).await.unwrap());
    assert_eq!(rig.rows().await, 3);
    let page = rig.store.list(OutboundStatus::RejectedInvalid, None, 10).await.unwrap();
    assert_eq!(page.rows.len(), 3);
    assert!(page.rows.iter().all(|r| r.msg_id.is_none()), "an invalid request reserves no MsgId");
    rig.drop_schema().await;
}

#[tokio::test]
async fn an_unreachable_postgres_is_unavailable_not_fatal() {
    let mut s = settings("obs", &[]);
    s.postgres.url = format!("postgres://root@127.0.0.1:{}/test", cabine::harness::free_port().unwrap());
    s.postgres.wait_timeout = Duration::from_millis(300);
    s.postgres.create_timeout = Duration::from_millis(300);
    let store = PgOutboundStore::new(cabine::db::pool(&s.postgres).unwrap(), &s.cluster.ispb, policy());
    let err = store.insert(&msg(1, Priority::Normal, minutes(5))).await.unwrap_err();
    assert!(matches!(err, cabine_actors::ports::outbound::OutboundError::Unavailable(_)), "{err:?}");
}
