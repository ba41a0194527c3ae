//! Sends whose outcome is unknown, and waits that must end: a row that may
//! have reached the SPI (5xx, timeout, transport, a claim recovered after a
//! crash) is `in_doubt` past its deadline — never `timeout`, which tells the
//! bank's core it was never sent — until a verdict (or the Reconciler) settles
//! it; and every statement of the store ends within `postgres.query_timeout`,
//! cancelled on the server, even when the table is locked.

use std::time::{Duration, Instant};

use cabine::outbound::{OutboundPolicy, PgOutboundStore};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::outbound::{
    BatchSize, ConfirmOutcome, ConfirmRef, OutboundError, OutboundStore, Priority, SendResult, SpiVerdict,
};

use crate::store::{Rig, minutes, msg, policy, statuses};

fn names(events: &[cabine_actors::ports::outbound_bus::ResultEvent]) -> Vec<&'static str> {
    statuses(events).into_iter().map(|s| s.as_str()).collect()
}

async fn status(rig: &Rig, msg_id: &str) -> &'static str {
    rig.status(msg_id).await.as_str()
}

fn failed(why: &str) -> SendResult {
    SendResult::Failed { reason: why.into() }
}

#[tokio::test]
async fn a_send_that_may_have_reached_the_spi_is_in_doubt_at_its_deadline_until_its_verdict() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, Duration::from_millis(400));
    rig.store.insert(&m).await.unwrap();
    let (claim, _) = rig.take(10).await;
    let rec = rig.store.record(&claim, &[(m.msg_id.clone(), failed("HTTP 503"))]).await.unwrap();
    assert!(rec.events.is_empty(), "a retry is internal");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let expired = rig.store.expire_overdue(100).await.unwrap();
    assert_eq!(names(&expired), ["in_doubt"], "the 503 may have stored it: not a timeout");
    assert_eq!(expired[0].dedup_id(), format!("{}:in_doubt:1", m.msg_id));
    assert!(rig.store.expire_overdue(100).await.unwrap().is_empty(), "its event once");
    assert!(rig.take(10).await.1.is_empty(), "never sent again by itself");
    assert_eq!(status(&rig, &m.msg_id).await, "in_doubt");
    // The SPI's pacs.002 (the first copy was stored after all) settles it.
    let by_e2e = ConfirmRef::EndToEndId(m.end_to_end_ids[0].clone());
    let ConfirmOutcome::Applied(events) = rig.store.confirm(&by_e2e, &SpiVerdict::Confirmed).await.unwrap() else {
        panic!("the verdict applies to an in-doubt row")
    };
    assert_eq!(names(&events), ["confirmed"]);
    assert_eq!(status(&rig, &m.msg_id).await, "confirmed");
    rig.drop_schema().await;
}

#[tokio::test]
async fn only_rows_never_possibly_stored_time_out() {
    let rig = Rig::new().await;
    let (never, limited, refused) = (
        msg(1, Priority::Normal, Duration::from_millis(400)),
        msg(2, Priority::Normal, Duration::from_millis(400)),
        msg(3, Priority::Normal, Duration::from_millis(400)),
    );
    for m in [&never, &limited, &refused] {
        rig.store.insert(m).await.unwrap();
    }
    let (claim, _) = rig.take(10).await;
    let waits = SendResult::RateLimited { retry_after: Some(Duration::from_millis(10)) };
    let refusal = SendResult::Rejected { status: 403, reason: "forbidden".into() };
    let not_sent = SendResult::NotSent { retry_after: Duration::ZERO, reason: "no lease".into() };
    let outcomes =
        [(never.msg_id.clone(), not_sent), (limited.msg_id.clone(), waits), (refused.msg_id.clone(), refusal)];
    rig.store.record(&claim, &outcomes).await.unwrap();
    assert_eq!(status(&rig, &refused.msg_id).await, "rejected", "a definite 4xx: not stored");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let expired = rig.store.expire_overdue(100).await.unwrap();
    assert_eq!(names(&expired), ["timeout", "timeout"], "not sent, or refused with a 429: never stored");
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_failure_or_a_put_back_past_the_deadline_after_a_doubtful_attempt_is_in_doubt() {
    let rig = Rig::new().await;
    let (a, b) = (msg(1, Priority::Normal, Duration::from_millis(400)), msg(2, Priority::Normal, minutes(5)));
    rig.store.insert(&a).await.unwrap();
    let (claim, _) = rig.take(10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Sent while still in time; the timeout of the POST is recorded after the deadline.
    let rec = rig.store.record(&claim, &[(a.msg_id.clone(), failed("no answer within the send timeout"))]).await;
    assert_eq!(names(&rec.unwrap().events), ["in_doubt"]);

    // A 503, then a resend refused with a 4xx: the first copy may still be at the SPI.
    rig.store.insert(&b).await.unwrap();
    let (claim, _) = rig.take(10).await;
    rig.store.record(&claim, &[(b.msg_id.clone(), failed("HTTP 503"))]).await.unwrap();
    let claim = take_when_ready(&rig, &b.msg_id).await;
    let refusal = SendResult::Rejected { status: 403, reason: "forbidden".into() };
    let rec = rig.store.record(&claim, &[(b.msg_id.clone(), refusal)]).await.unwrap();
    assert_eq!(names(&rec.events), ["in_doubt"], "not `rejected`: that would say it was never stored");
    rig.drop_schema().await;
}

async fn take_when_ready(rig: &Rig, msg_id: &str) -> cabine_actors::ports::outbound::ClaimToken {
    for _ in 0..100 {
        let (claim, ids) = rig.take(10).await;
        if ids == [msg_id] {
            return claim;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{msg_id} never became ready");
}

#[tokio::test]
async fn a_claim_recovered_after_a_crash_mid_send_is_in_doubt_past_its_deadline() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, Duration::from_millis(300));
    rig.store.insert(&m).await.unwrap();
    let (crashed, _) = rig.take(10).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let recovered = rig.store.recover_stale_claims(100).await.unwrap();
    assert_eq!(names(&recovered), ["in_doubt"], "its sender may have posted it before vanishing");
    // The vanished sender's late 201 is a fact: in doubt → sent.
    let sent = SendResult::Sent { resource_id: "R1".into() };
    let rec = rig.store.record(&crashed, &[(m.msg_id.clone(), sent)]).await.unwrap();
    assert_eq!(names(&rec.events), ["sent"]);
    rig.drop_schema().await;
}

#[tokio::test]
async fn in_doubt_rows_are_listed_for_the_reconciler_and_not_reprocessed() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, Duration::from_millis(300));
    rig.store.insert(&m).await.unwrap();
    let (claim, _) = rig.take(10).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    rig.store.record(&claim, &[(m.msg_id.clone(), failed("transport: connection reset"))]).await.unwrap();
    let status: cabine_actors::ports::outbound::OutboundStatus = "in_doubt".parse().expect("a status");
    let page = rig.store.list(status, None, 10).await.unwrap();
    assert_eq!(page.rows.iter().filter_map(|r| r.msg_id.as_deref()).collect::<Vec<_>>(), [m.msg_id.as_str()]);
    let refused = rig.store.reprocess(&m.msg_id).await.unwrap();
    assert!(matches!(refused, cabine_actors::ports::outbound::Reprocessed::NotAllowed(s) if s == status));
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_locked_outbound_table_answers_unavailable_within_the_query_timeout() {
    let rig = Rig::new().await;
    let (a, b) = (msg(1, Priority::Normal, minutes(5)), msg(2, Priority::Normal, minutes(5)));
    rig.store.insert(&a).await.unwrap();
    let (claim, _) = rig.take(10).await;
    rig.store.insert(&b).await.unwrap();
    let query_timeout = Duration::from_millis(300);
    let store = PgOutboundStore::new(rig.pool.clone(), &rig.ispb, OutboundPolicy { query_timeout, ..policy() });
    // Connections opened beforehand: under the lock every call waits on it, none on a new connection.
    let warm: Vec<_> = futures::future::join_all((0..4).map(|_| rig.pool.get())).await;
    drop(warm);
    let mut conn = rig.pool.get().await.unwrap();
    let lock = conn.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE outbound IN ACCESS EXCLUSIVE MODE").await.unwrap();

    let bound = query_timeout + Duration::from_millis(700);
    let sent = [(a.msg_id.clone(), SendResult::Sent { resource_id: "R1".into() })];
    let c = msg(3, Priority::Normal, minutes(5));
    let started = Instant::now();
    let calls = tokio::time::timeout(Duration::from_secs(10), async {
        let mut took = Vec::new();
        let mut timed = Instant::now();
        let mut lap = |outcome: Result<usize, OutboundError>| {
            took.push(timed.elapsed());
            timed = Instant::now();
            outcome
        };
        let take = lap(store.take_ready(ChannelId::Cpm, BatchSize::MAX).await.map(|b| b.messages.len()));
        let record = lap(store.record(&claim, &sent).await.map(|r| r.events.len()));
        let insert = lap(store.insert(&c).await.map(|_| 0));
        let expire = lap(store.expire_overdue(10).await.map(|e| e.len()));
        let read = lap(store.get(&a.msg_id).await.map(|_| 0));
        ([take, record, insert, expire, read], took)
    })
    .await;
    let (calls, took) = calls.expect("every call ends while the table stays locked");
    let names = ["take_ready", "record", "insert", "expire_overdue", "get"];
    for ((call, outcome), took) in names.iter().zip(&calls).zip(&took) {
        assert!(matches!(outcome, Err(OutboundError::Unavailable(_))), "{call}: {outcome:?}");
        assert!(*took >= query_timeout && *took < bound, "{call} answered after {took:?}: {outcome:?}");
    }
    assert!(started.elapsed() < bound * 5);

    // Cancelled on the server: none of them commits once the lock is gone.
    lock.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(&rig, &a.msg_id).await, "sending", "the record was cancelled");
    assert_eq!(status(&rig, &b.msg_id).await, "queued", "the claim was cancelled");
    assert!(rig.store.get(&c.msg_id).await.unwrap().is_none(), "the insert was cancelled");
    rig.drop_schema().await;
}

#[tokio::test]
async fn the_reconciler_settles_in_doubt_rows_and_only_those() {
    use cabine_actors::ports::outbound::{OutboundStatus, Settled, Settlement};
    let rig = Rig::new().await;
    let all: Vec<_> = (1..=3).map(|n| msg(n, Priority::Normal, Duration::from_millis(300))).collect();
    for m in &all {
        rig.store.insert(m).await.unwrap();
    }
    let (claim, _) = rig.take(10).await;
    let outcomes: Vec<_> = all.iter().map(|m| (m.msg_id.clone(), failed("HTTP 502"))).collect();
    rig.store.record(&claim, &outcomes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(names(&rig.store.expire_overdue(10).await.unwrap()), ["in_doubt"; 3]);
    assert_eq!(rig.store.in_doubt(None, 10).await.unwrap().rows.len(), 3, "the Reconciler's work list");

    let settle = async |m: &cabine_actors::ports::outbound::NewOutbound, s: Settlement| {
        let settled = rig.store.settle_in_doubt(&m.msg_id, &s).await.unwrap();
        let Settled::Done(event) = settled else { panic!("{settled:?}") };
        event.status.as_str()
    };
    let never = Settlement::NotStored { evidence: "no such MsgId at the SPI".into() };
    assert_eq!(settle(&all[0], never.clone()).await, "timeout", "never stored: the core may pay again");
    assert_eq!(settle(&all[1], Settlement::Stored(SpiVerdict::Confirmed)).await, "confirmed");
    let refused = Settlement::Stored(SpiVerdict::Rejected { reason: "RJCT AB03".into() });
    assert_eq!(settle(&all[2], refused).await, "rejected_by_spi");
    let row = rig.store.get(&all[1].msg_id).await.unwrap().unwrap().row;
    assert!(row.sent_at.is_some() && row.confirmed_at.is_some(), "stored, so sent: {row:?}");

    let again = rig.store.settle_in_doubt(&all[0].msg_id, &never).await.unwrap();
    assert_eq!(again, Settled::NotInDoubt(OutboundStatus::Timeout), "settled once");
    assert_eq!(rig.store.settle_in_doubt("M-unknown", &never).await.unwrap(), Settled::NotFound);
    assert!(rig.store.in_doubt(None, 10).await.unwrap().rows.is_empty());
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_connection_cut_by_the_timeout_is_cancelled_and_never_lent_again() {
    use cabine::db::bounded::with_conn;
    let mut s = crate::common::settings("obs", &[]);
    s.postgres.pool_size = 1;
    let pool = cabine::db::pool(&s.postgres).unwrap();
    let pid = async |timeout: Duration| {
        with_conn(&pool, timeout, |c| async move {
            let row = c.query_one("SELECT pg_backend_pid()", &[]).await;
            row.map(|r| r.get::<_, i32>(0)).map_err(|e| OutboundError::Fatal(e.to_string()))
        })
        .await
    };
    let first = pid(Duration::from_secs(2)).await.unwrap();
    let started = Instant::now();
    let cut: Result<(), OutboundError> = with_conn(&pool, Duration::from_millis(200), |c| async move {
        c.batch_execute("SELECT pg_sleep(5)").await.map_err(|e| OutboundError::Fatal(e.to_string()))
    })
    .await;
    assert!(matches!(cut, Err(OutboundError::Unavailable(_))), "{cut:?}");
    let next = pid(Duration::from_secs(2)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "the next call did not wait behind the cut statement");
    assert_ne!(next, first, "the only pooled connection was cut: the next call gets a fresh one");
    let conn = pool.get().await.unwrap();
    let mut sleeping = 1;
    for _ in 0..50 {
        let row = conn.query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&first]).await.unwrap();
        sleeping = row.get::<_, i64>(0);
        if sleeping == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sleeping, 0, "the cut backend was cancelled and its connection closed");
}
