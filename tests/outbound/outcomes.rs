//! The Postgres outbound store after a send: retries with backoff and
//! poison, 429s, permanent rejections and reprocess, vanished senders, the
//! SPI's verdicts and unconfirmed messages.

use std::time::{Duration, SystemTime};

use cabine_actors::ports::outbound::{
    ClaimToken, ConfirmOutcome, ConfirmRef, OutboundStatus, OutboundStore, Priority, Reprocessed, SendResult,
    SpiVerdict,
};
use cabine_actors::ports::outbound_bus::ResultStatus;

use crate::store::{Rig, minutes, msg, statuses};

#[tokio::test]
async fn failures_back_off_with_jitter_and_turn_dead_after_the_poison_count() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    for attempt in 1..=3u32 {
        let claim = take_when_ready(&rig, &m.msg_id).await;
        let before = SystemTime::now();
        let failed = SendResult::Failed { reason: format!("HTTP 503 #{attempt}") };
        let rec = rig.store.record(&claim, &[(m.msg_id.clone(), failed)]).await.unwrap();
        let row = rig.store.get(&m.msg_id).await.unwrap().unwrap().row;
        assert_eq!(row.attempts, attempt);
        if attempt < 3 {
            assert!(rec.events.is_empty(), "a retry is internal");
            assert_eq!(row.status, OutboundStatus::Queued);
            let cap = Duration::from_millis((40 << (attempt - 1)).min(120) + 50);
            let wait = row.not_before.duration_since(before).unwrap_or_default();
            assert!(wait <= cap, "attempt {attempt}: waits {wait:?}, full jitter under {cap:?}");
        } else {
            assert_eq!(row.status, OutboundStatus::Dead);
            assert_eq!(rec.events[0].dedup_id(), format!("{}:dead:3", m.msg_id));
            assert_eq!(rec.events[0].detail.as_deref(), Some("HTTP 503 #3"));
        }
    }
    let history = rig.store.get(&m.msg_id).await.unwrap().unwrap().history;
    let path: Vec<&str> = history.iter().map(|h| h.to.as_str()).collect();
    assert_eq!(path, ["queued", "sending", "queued", "sending", "queued", "sending", "dead"]);
    rig.drop_schema().await;
}

async fn take_when_ready(rig: &Rig, msg_id: &str) -> ClaimToken {
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
async fn a_429_waits_retry_after_without_counting_an_attempt() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    let (claim, _) = rig.take(10).await;
    let limited = SendResult::RateLimited { retry_after: Some(Duration::from_millis(300)) };
    let rec = rig.store.record(&claim, &[(m.msg_id.clone(), limited)]).await.unwrap();
    assert!(rec.events.is_empty() && rec.stale.is_empty());
    let row = rig.store.get(&m.msg_id).await.unwrap().unwrap().row;
    assert_eq!((row.status, row.attempts), (OutboundStatus::Queued, 0));
    assert!(rig.take(10).await.1.is_empty(), "waits for Retry-After");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let (claim, ids) = rig.take(10).await;
    assert_eq!(ids, [m.msg_id.as_str()]);
    let default_wait = SendResult::RateLimited { retry_after: None };
    rig.store.record(&claim, &[(m.msg_id.clone(), default_wait)]).await.unwrap();
    let row = rig.store.get(&m.msg_id).await.unwrap().unwrap().row;
    assert_eq!(row.attempts, 0, "still no attempt counted");
    assert!(row.not_before > SystemTime::now() + Duration::from_millis(50), "retry_after_default applies");
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_permanent_rejection_is_final_until_reprocessed_with_the_same_msg_id() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::High, minutes(5));
    rig.store.insert(&m).await.unwrap();
    let (claim, _) = rig.take(10).await;
    let rejected = SendResult::Rejected { status: 400, reason: "invalidHeader".into() };
    let rec = rig.store.record(&claim, &[(m.msg_id.clone(), rejected)]).await.unwrap();
    assert_eq!(statuses(&rec.events), [ResultStatus::Rejected]);
    assert_eq!(rec.events[0].detail.as_deref(), Some("HTTP 400: invalidHeader"));
    assert!(rig.take(10).await.1.is_empty());
    let Reprocessed::Queued(ev) = rig.store.reprocess(&m.msg_id).await.unwrap() else { panic!("reprocessable") };
    assert_eq!(ev.dedup_id(), format!("{}:accepted:1", m.msg_id), "a distinct id from the first acceptance");
    assert_eq!(rig.take(10).await.1, [m.msg_id.as_str()]);
    assert_eq!(rig.store.reprocess(&m.msg_id).await.unwrap(), Reprocessed::NotAllowed(OutboundStatus::Sending));
    assert_eq!(rig.store.reprocess("M-unknown").await.unwrap(), Reprocessed::NotFound);
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_reprocessed_dead_message_gets_a_fresh_poison_count() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    for _ in 0..3 {
        let claim = take_when_ready(&rig, &m.msg_id).await;
        rig.store.record(&claim, &[(m.msg_id.clone(), SendResult::Failed { reason: "503".into() })]).await.unwrap();
    }
    assert_eq!(rig.status(&m.msg_id).await, OutboundStatus::Dead);
    assert!(matches!(rig.store.reprocess(&m.msg_id).await.unwrap(), Reprocessed::Queued(_)));
    let claim = take_when_ready(&rig, &m.msg_id).await;
    rig.store.record(&claim, &[(m.msg_id.clone(), SendResult::Failed { reason: "503".into() })]).await.unwrap();
    let row = rig.store.get(&m.msg_id).await.unwrap().unwrap().row;
    assert_eq!((row.status, row.attempts), (OutboundStatus::Queued, 4), "one attempt since the reprocess");
    let page = rig.store.list(OutboundStatus::Dead, None, 10).await.unwrap();
    assert!(page.rows.is_empty());
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_vanished_sender_s_claim_returns_to_the_queue_after_the_processing_timeout() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    let (crashed, _) = rig.take(10).await;
    assert!(rig.store.recover_stale_claims(100).await.unwrap().is_empty(), "not yet");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(rig.store.recover_stale_claims(100).await.unwrap().is_empty(), "no event: internal");
    let row = rig.store.get(&m.msg_id).await.unwrap().unwrap().row;
    assert_eq!((row.status, row.attempts), (OutboundStatus::Queued, 1), "the crashed try counts");
    let late = SendResult::Failed { reason: "late".into() };
    let rec = rig.store.record(&crashed, &[(m.msg_id.clone(), late)]).await.unwrap();
    assert_eq!(rec.stale, [m.msg_id.as_str()], "the old claim no longer applies");
    let (claim, ids) = rig.take(10).await;
    assert_eq!(ids, [m.msg_id.as_str()]);
    let rec =
        rig.store.record(&claim, &[(m.msg_id.clone(), SendResult::Sent { resource_id: "R9".into() })]).await.unwrap();
    assert_eq!(rec.events[0].dedup_id(), format!("{}:sent:2", m.msg_id));
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_201_counts_even_from_a_recovered_claim() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    let (crashed, _) = rig.take(10).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    rig.store.recover_stale_claims(100).await.unwrap();
    let rec =
        rig.store.record(&crashed, &[(m.msg_id.clone(), SendResult::Sent { resource_id: "R1".into() })]).await.unwrap();
    assert_eq!(statuses(&rec.events), [ResultStatus::Sent]);
    assert!(rig.take(10).await.1.is_empty(), "stored at ICOM: never sent again");
    rig.drop_schema().await;
}

#[tokio::test]
async fn the_spi_s_verdict_finds_the_message_by_msg_id_or_end_to_end_id() {
    let rig = Rig::new().await;
    let (a, b) = (msg(1, Priority::Normal, minutes(5)), msg(2, Priority::Normal, minutes(5)));
    rig.store.insert(&a).await.unwrap();
    rig.store.insert(&b).await.unwrap();
    let (claim, _) = rig.take(10).await;
    let sent = |r: &str| SendResult::Sent { resource_id: r.into() };
    rig.store.record(&claim, &[(a.msg_id.clone(), sent("R1")), (b.msg_id.clone(), sent("R2"))]).await.unwrap();
    let by_e2e = ConfirmRef::EndToEndId(a.end_to_end_ids[0].clone());
    let ConfirmOutcome::Applied(mut ev) = rig.store.confirm(&by_e2e, &SpiVerdict::Confirmed).await.unwrap() else {
        panic!("applied")
    };
    let ev = ev.pop().expect("the verdict's event");
    assert_eq!((ev.status, ev.resource_ids.clone()), (ResultStatus::Confirmed, vec!["R1".to_owned()]));
    assert_eq!(
        rig.store.confirm(&by_e2e, &SpiVerdict::Confirmed).await.unwrap(),
        ConfirmOutcome::AlreadyFinal(OutboundStatus::Confirmed)
    );
    let rejected = SpiVerdict::Rejected { reason: "RJCT AB03".into() };
    let ConfirmOutcome::Applied(mut ev) =
        rig.store.confirm(&ConfirmRef::MsgId(b.msg_id.clone()), &rejected).await.unwrap()
    else {
        panic!("applied")
    };
    let ev = ev.pop().expect("the verdict's event");
    assert_eq!((ev.status, ev.detail.as_deref()), (ResultStatus::RejectedBySpi, Some("RJCT AB03")));
    assert_eq!(
        rig.store.confirm(&ConfirmRef::MsgId("M0".into()), &SpiVerdict::Confirmed).await.unwrap(),
        ConfirmOutcome::Unknown
    );
    let row = rig.store.get(&a.msg_id).await.unwrap().unwrap().row;
    assert!(row.confirmed_at.is_some() && row.sent_at.is_some());
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_verdict_that_overtakes_the_201_wins() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    let (claim, _) = rig.take(10).await;
    rig.store.confirm(&ConfirmRef::MsgId(m.msg_id.clone()), &SpiVerdict::Confirmed).await.unwrap();
    let rec =
        rig.store.record(&claim, &[(m.msg_id.clone(), SendResult::Sent { resource_id: "R1".into() })]).await.unwrap();
    assert_eq!(rec.stale, [m.msg_id.as_str()]);
    assert_eq!(rig.status(&m.msg_id).await, OutboundStatus::Confirmed);
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_sent_message_without_a_verdict_is_flagged_once() {
    let rig = Rig::new().await;
    let m = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&m).await.unwrap();
    let (claim, _) = rig.take(10).await;
    rig.store.record(&claim, &[(m.msg_id.clone(), SendResult::Sent { resource_id: "R1".into() })]).await.unwrap();
    assert!(rig.store.flag_unconfirmed(100).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rig.store.flag_unconfirmed(100).await.unwrap(), [m.msg_id.as_str()]);
    assert!(rig.store.flag_unconfirmed(100).await.unwrap().is_empty(), "once");
    let detail = rig.store.get(&m.msg_id).await.unwrap().unwrap();
    assert!(detail.row.unconfirmed_since.is_some() && detail.row.status == OutboundStatus::Sent);
    let last = detail.history.last().unwrap();
    assert!(last.event.is_none() && last.detail.as_deref().unwrap().contains("no confirmation"));
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_verdict_that_overtakes_the_record_of_its_send_still_yields_sent_then_confirmed() {
    let rig = Rig::new().await;
    let a = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&a).await.unwrap();
    let (claim, _) = rig.take(10).await;
    // The SPI's pacs.002 is correlated while the sender still holds the 201.
    let by_e2e = ConfirmRef::EndToEndId(a.end_to_end_ids[0].clone());
    let ConfirmOutcome::Applied(events) = rig.store.confirm(&by_e2e, &SpiVerdict::Confirmed).await.unwrap() else {
        panic!("applied")
    };
    let order: Vec<ResultStatus> = events.iter().map(|e| e.status).collect();
    assert_eq!(order, [ResultStatus::Sent, ResultStatus::Confirmed]);
    // The late record changes no state but keeps the ResourceId.
    let recorded =
        rig.store.record(&claim, &[(a.msg_id.clone(), SendResult::Sent { resource_id: "R1".into() })]).await.unwrap();
    assert!(recorded.events.is_empty(), "no second sent event");
    let detail = rig.store.get(&a.msg_id).await.unwrap().expect("stored");
    assert_eq!(
        (detail.row.status, detail.row.resource_ids.clone()),
        (OutboundStatus::Confirmed, vec!["R1".to_owned()])
    );
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_verdict_waiting_on_the_record_of_its_send_is_applied_once_the_record_commits() {
    let rig = Rig::new().await;
    let a = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&a).await.unwrap();
    rig.take(10).await;
    // The sender's record transaction holds the row...
    let mut conn = rig.pool.get().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM outbound WHERE msg_id = $1 FOR UPDATE", &[&a.msg_id]).await.unwrap();
    let store = rig.other_pod();
    let by_e2e = ConfirmRef::EndToEndId(a.end_to_end_ids[0].clone());
    let verdict = tokio::spawn(async move { store.confirm(&by_e2e, &SpiVerdict::Confirmed).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and commits `sent` while the verdict waits for it.
    tx.execute(
        "UPDATE outbound SET status = 'sent', sent_at = now(), claim = NULL, claimed_at = NULL WHERE msg_id = $1",
        &[&a.msg_id],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let ConfirmOutcome::Applied(events) = verdict.await.unwrap() else { panic!("the verdict was dropped") };
    assert_eq!(events.last().map(|e| e.status), Some(ResultStatus::Confirmed));
    assert_eq!(rig.status(&a.msg_id).await, OutboundStatus::Confirmed);
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_201_recorded_while_a_verdict_holds_the_row_still_keeps_its_resource_id() {
    let rig = Rig::new().await;
    let a = msg(1, Priority::Normal, minutes(5));
    rig.store.insert(&a).await.unwrap();
    let (claim, _) = rig.take(10).await;
    // The confirmer's transaction holds the row (sent before the verdict, then confirmed)...
    let mut conn = rig.pool.get().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM outbound WHERE msg_id = $1 FOR UPDATE", &[&a.msg_id]).await.unwrap();
    let store = rig.other_pod();
    let id = a.msg_id.clone();
    let record = tokio::spawn(async move {
        store.record(&claim, &[(id, SendResult::Sent { resource_id: "R1".into() })]).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.execute(
        "UPDATE outbound SET status = 'confirmed', sent_at = now(), confirmed_at = now(), claim = NULL, claimed_at = NULL
         WHERE msg_id = $1",
        &[&a.msg_id],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // ...so the record's transition finds it final: no second event, but the ResourceId is kept.
    let recorded = record.await.unwrap();
    assert!(recorded.events.is_empty(), "{recorded:?}");
    let detail = rig.store.get(&a.msg_id).await.unwrap().expect("stored");
    assert_eq!((detail.row.status, detail.row.resource_ids), (OutboundStatus::Confirmed, vec!["R1".to_owned()]));
    rig.drop_schema().await;
}
