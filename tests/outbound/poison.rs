//! Poison requests against real Postgres (DESIGN §2.2): a NUL byte in a MsgId
//! or an EndToEndId, an EndToEndId too large for its GIN index, or values
//! Postgres refuses for a reason nobody foresaw never fail the batch pulled
//! with them — they are kept as `rejected_invalid`, raw intact, and the rest is
//! stored. Data errors are `Refused`, never `Fatal`. Parked requests are kept
//! once per ingress ref and come back through `unpark`.

use bytes::Bytes;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::outbound::{
    Inserted, InvalidOutbound, OutboundError, OutboundStatus, OutboundStore, ParkedState, Priority, Unparked,
};
use cabine_actors::ports::outbound_bus::{Arrival, OutboundRequest, ResultStatus};

use crate::store::{Rig, minutes, msg};

fn status_of(i: &Inserted) -> ResultStatus {
    match i {
        Inserted::New { event } => event.status,
        Inserted::Duplicate { row, .. } => panic!("a duplicate of {:?}", row.msg_id),
    }
}

/// (status, count) of every row.
async fn by_status(rig: &Rig) -> Vec<(String, i64)> {
    let client = rig.pool.get().await.unwrap();
    let rows = client.query("SELECT status, count(*) FROM outbound GROUP BY 1 ORDER BY 1", &[]).await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

#[tokio::test]
async fn a_batch_of_100_with_a_nul_msg_id_and_a_4_kb_end_to_end_id_stores_98_and_keeps_2_rejected() {
    let rig = Rig::new().await;
    let mut requests: Vec<OutboundRequest> =
        (1..=98).map(|n| OutboundRequest::Valid(msg(n, Priority::Normal, minutes(5)))).collect();
    // What the bus parser makes of a NUL in the MsgId: invalid, the id read kept for the operator.
    let nul = msg(99, Priority::Normal, minutes(5));
    requests.insert(
        40,
        OutboundRequest::Invalid(InvalidOutbound {
            ingress_ref: Some("OUT:1:99".into()),
            channel: Some(ChannelId::Cpm),
            claimed_msg_id: Some("M9999901\0BAD".into()),
            reason: "body: MsgId \"M9999901\\0BAD\" is not 1..=64 letters and digits".into(),
            raw: nul.raw.clone(),
        }),
    );
    // A request handed to the store with an EndToEndId of 4 KB: too large for the GIN index.
    let mut huge = msg(100, Priority::High, minutes(5));
    huge.end_to_end_ids = vec![cabine::harness::incompressible(12, 4096)];
    huge.ingress_ref = Some("OUT:1:100".into());
    requests.insert(70, OutboundRequest::Valid(huge.clone()));

    let answers = rig.store.insert_batch(&requests).await.expect("the batch is stored, poison and all");
    let rejected: Vec<usize> =
        (0..answers.len()).filter(|i| status_of(&answers[*i]) != ResultStatus::Accepted).collect();
    assert_eq!(rejected, [40, 70], "only the two poison requests are rejected");
    assert!(answers.iter().enumerate().all(|(i, a)| rejected.contains(&i) || status_of(a) == ResultStatus::Accepted));
    assert_eq!(by_status(&rig).await, [("queued".into(), 98), ("rejected_invalid".into(), 2)]);

    let client = rig.pool.get().await.unwrap();
    let kept = client
        .query("SELECT raw, last_error, msg_id FROM outbound WHERE status = 'rejected_invalid' ORDER BY id", &[])
        .await
        .unwrap();
    assert_eq!(kept[0].get::<_, Vec<u8>>(0), nul.raw.to_vec(), "raw kept byte for byte");
    assert_eq!(kept[1].get::<_, Vec<u8>>(0), huge.raw.to_vec());
    let reasons: Vec<String> = kept.iter().map(|r| r.get(1)).collect();
    assert!(reasons[0].contains("\\0") && !reasons[0].contains('\0'), "NUL shown escaped: {}", reasons[0]);
    assert!(reasons[1].contains("EndToEndId") && reasons[1].contains("(4096 bytes)"), "{}", reasons[1]);
    assert!(reasons.iter().all(|r| r.len() < 500), "reasons are cut: {reasons:?}");
    assert!(kept.iter().all(|r| r.get::<_, Option<String>>(2).is_none()), "a rejected row reserves no MsgId");

    let again = rig.store.insert_batch(&requests).await.unwrap();
    assert!(again.iter().all(|a| matches!(a, Inserted::Duplicate { .. })), "a redelivery stores nothing new");
    drop(client);
    rig.drop_schema().await;
}

/// A trigger that refuses one MsgId with a data exception: values Postgres
/// refuses for a reason the store's own checks do not know.
async fn refuse_msg_id(rig: &Rig, msg_id: &str) {
    let client = rig.pool.get().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.msg_id = '{msg_id}' THEN
                     RAISE EXCEPTION 'value refused for the test' USING ERRCODE = '22P02';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT ON outbound FOR EACH ROW EXECUTE FUNCTION refuse_poison();"
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn values_postgres_still_refuses_cost_only_their_own_row() {
    let rig = Rig::new().await;
    let poison = msg(3, Priority::Normal, minutes(5));
    refuse_msg_id(&rig, &poison.msg_id).await;
    let requests: Vec<OutboundRequest> =
        (1..=5).map(|n| OutboundRequest::Valid(msg(n, Priority::Normal, minutes(5)))).collect();
    let answers = rig.store.insert_batch(&requests).await.expect("stored one row at a time");
    let statuses: Vec<ResultStatus> = answers.iter().map(status_of).collect();
    use ResultStatus::{Accepted, RejectedInvalid};
    assert_eq!(statuses, [Accepted, Accepted, RejectedInvalid, Accepted, Accepted]);
    let client = rig.pool.get().await.unwrap();
    let bare = client
        .query_one("SELECT last_error, raw, end_to_end_ids FROM outbound WHERE status = 'rejected_invalid'", &[])
        .await
        .unwrap();
    let reason: String = bare.get(0);
    assert!(reason.contains("refused by Postgres") && reason.contains("22P02"), "{reason}");
    assert_eq!(bare.get::<_, Vec<u8>>(1), poison.raw.to_vec());
    assert!(bare.get::<_, Vec<String>>(2).is_empty(), "the bare row keeps only the raw body");
    assert_eq!(rig.status(&msg(4, Priority::Normal, minutes(5)).msg_id).await, OutboundStatus::Queued);
    drop(client);
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_data_error_is_refused_never_fatal() {
    let rig = Rig::new().await;
    match rig.store.get("M\0NUL").await {
        Err(OutboundError::Refused(why)) => assert!(why.contains("22021"), "{why}"),
        other => panic!("a NUL in a lookup is refused values, not a bug of the store: {other:?}"),
    }
    match rig.store.stored_body("M\0NUL").await {
        Err(OutboundError::Refused(_)) => {}
        other => panic!("{other:?}"),
    }
    rig.drop_schema().await;
}

fn arrival(seq: u64, body: Bytes, deliveries: u32) -> Arrival {
    Arrival {
        ingress_ref: Some(format!("OUT:{seq}:1700000000000000000")),
        subject: "cabine.out.99999010.cpm".into(),
        headers: vec![("Cabine-Priority".into(), "high".into()), ("Cabine-Note".into(), "nul\0here".into())],
        raw: body,
        deliveries,
    }
}

#[tokio::test]
async fn parked_requests_are_kept_raw_once_listed_and_unparked_once() {
    let rig = Rig::new().await;
    let m = msg(7, Priority::High, minutes(5));
    let raw_with_nul = Bytes::from_static(b"<Envelope>\0</Envelope>");
    let arrivals = [arrival(1, m.raw.clone(), 11), arrival(2, raw_with_nul.clone(), 11)];
    assert_eq!(rig.store.park(&arrivals, "delivered more than 10 times").await.unwrap(), 2);
    assert_eq!(rig.store.park(&arrivals, "again").await.unwrap(), 0, "once per ingress ref");
    let page = rig.store.parked(None, 1).await.unwrap();
    assert_eq!(page.rows.len(), 1);
    let rest = rig.store.parked(page.next_after, 10).await.unwrap();
    assert_eq!((rest.rows.len(), rest.next_after), (1, None));
    let second = &rest.rows[0];
    assert_eq!((second.arrival.raw.clone(), second.arrival.deliveries), (raw_with_nul, 11), "raw byte for byte");
    assert_eq!(second.arrival.header("cabine-priority").as_deref(), Some("high"));
    assert_eq!(second.arrival.header("Cabine-Note").as_deref(), Some("nul\u{FFFD}here"), "headers cleaned");
    assert_eq!(rig.store.depth().await.unwrap().parked, 2);

    let reference = page.rows[0].arrival.ingress_ref.clone().unwrap();
    let mut request = m.clone();
    request.ingress_ref = Some(reference.clone());
    let unparked = rig.store.unpark(&reference, &OutboundRequest::Valid(request.clone())).await.unwrap();
    assert!(matches!(&unparked, Unparked::Stored(Inserted::New { event }) if event.status == ResultStatus::Accepted));
    assert_eq!(rig.status(&m.msg_id).await, OutboundStatus::Queued);
    let done = rig.store.parked_request(&reference).await.unwrap().unwrap();
    assert_eq!((done.state, done.outbound_msg_id.as_deref()), (ParkedState::Reprocessed, Some(m.msg_id.as_str())));
    let twice = rig.store.unpark(&reference, &OutboundRequest::Valid(request)).await.unwrap();
    assert_eq!(twice, Unparked::AlreadyReprocessed);
    assert_eq!(rig.store.depth().await.unwrap().parked, 1);
    assert_eq!(rig.store.parked(None, 10).await.unwrap().rows.len(), 1, "a reprocessed request leaves the page");
    let unknown = rig.store.unpark("OUT:404:1", &OutboundRequest::Valid(m)).await.unwrap();
    assert_eq!(unknown, Unparked::NotFound);
    rig.drop_schema().await;
}
