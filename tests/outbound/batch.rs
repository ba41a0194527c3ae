//! A pulled batch stored in one go against real Postgres: new rows, duplicates
//! of stored rows and of rows earlier in the same batch (a different body stays
//! a refused duplicate) and unreadable requests, answered in the batch's order.

use std::time::Duration;

use bytes::Bytes;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::outbound::{Inserted, InvalidOutbound, OutboundStatus, OutboundStore, Priority};
use cabine_actors::ports::outbound_bus::{OutboundRequest, ResultStatus};

use crate::store::{Rig, minutes, msg};

fn unreadable(ingress_ref: Option<&str>) -> InvalidOutbound {
    InvalidOutbound {
        ingress_ref: ingress_ref.map(str::to_owned),
        channel: Some(ChannelId::Cpm),
        claimed_msg_id: None,
        reason: "body: malformed XML".into(),
        raw: Bytes::from_static(b"<Envelope>"),
    }
}

/// An answer as compared: a new row's event (status, dedup id), or the stored row's status and same body.
#[derive(Debug, PartialEq)]
enum Outcome {
    New(ResultStatus, String),
    Duplicate(OutboundStatus, bool),
}

fn outcome(i: &Inserted) -> Outcome {
    match i {
        Inserted::New { event } => Outcome::New(event.status, event.dedup_id()),
        Inserted::Duplicate { row, same_body } => Outcome::Duplicate(row.status, *same_body),
    }
}

#[tokio::test]
async fn a_batch_with_duplicates_and_an_unreadable_request_is_answered_in_order() {
    let rig = Rig::new().await;
    let (stored, resent) = (msg(1, Priority::Normal, minutes(5)), msg(2, Priority::Normal, minutes(5)));
    rig.store.insert(&stored).await.unwrap();
    rig.store.insert(&resent).await.unwrap();
    let mut altered = resent.clone();
    altered.raw = Bytes::from_static(b"<other/>");
    let mut fresh = msg(3, Priority::Critical, minutes(5));
    fresh.ingress_ref = Some("OUT:1:11".into());
    let twice = {
        let mut m = fresh.clone();
        m.ingress_ref = Some("OUT:1:15".into());
        m
    };
    let mut two_e2e = msg(4, Priority::Low, minutes(7));
    two_e2e.end_to_end_ids.push("E9999901000000000000000000000444".into());
    let requests = [
        OutboundRequest::Valid(fresh.clone()),
        OutboundRequest::Valid(stored.clone()),
        OutboundRequest::Invalid(unreadable(Some("OUT:1:13"))),
        OutboundRequest::Valid(altered),
        OutboundRequest::Valid(twice),
        OutboundRequest::Valid(two_e2e.clone()),
        OutboundRequest::Invalid(unreadable(None)),
    ];
    let answers = rig.store.insert_batch(&requests).await.unwrap();
    let outcomes: Vec<_> = answers.iter().map(outcome).collect();
    let queued = Outcome::Duplicate(OutboundStatus::Queued, true);
    assert_eq!(
        outcomes[..6],
        [
            Outcome::New(ResultStatus::Accepted, format!("{}:accepted:0", fresh.msg_id)),
            queued,
            Outcome::New(ResultStatus::RejectedInvalid, "OUT:1:13:rejected_invalid:0".into()),
            Outcome::Duplicate(OutboundStatus::Queued, false),
            Outcome::Duplicate(OutboundStatus::Queued, true),
            Outcome::New(ResultStatus::Accepted, format!("{}:accepted:0", two_e2e.msg_id)),
        ]
    );
    assert!(
        matches!(&answers[6], Inserted::New { event } if event.status == ResultStatus::RejectedInvalid),
        "an unreadable request without ingress ref is kept: {:?}",
        answers[6]
    );
    let detail = rig.store.get(&two_e2e.msg_id).await.unwrap().unwrap();
    let deadline_off = two_e2e.deadline.duration_since(detail.row.deadline).unwrap_or_default();
    assert_eq!(detail.row.priority, Priority::Low);
    assert!(deadline_off < Duration::from_millis(1), "deadline stored to the microsecond: {deadline_off:?}");
    assert_eq!(detail.history.len(), 1, "one history line per new row");
    let client = rig.pool.get().await.unwrap();
    let e2e: Vec<String> = client
        .query_one("SELECT end_to_end_ids FROM outbound WHERE msg_id = $1", &[&two_e2e.msg_id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(e2e, two_e2e.end_to_end_ids);
    let counts: (i64, i64) = {
        let r = client
            .query_one("SELECT (SELECT count(*) FROM outbound), (SELECT count(*) FROM outbound_history)", &[])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(counts, (6, 6), "2 stored before + 4 new rows, one history line each");
    assert!(rig.store.insert_batch(&[]).await.unwrap().is_empty());
    let again = rig.store.insert_batch(&requests).await.unwrap();
    let new_again: Vec<bool> = again.iter().map(|a| matches!(a, Inserted::New { .. })).collect();
    assert_eq!(new_again, [false, false, false, false, false, false, true], "a redelivered batch is duplicates");
    drop(client);
    rig.drop_schema().await;
}
