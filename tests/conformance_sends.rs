//! Conformance, sends: `IcomClient::send` against the simulator's independent
//! parsers (multer, flate2) — one gzipped XML, 10-message gzipped multipart,
//! the SPI's answers read back through the client's stream (pacs.002 per
//! EndToEndId, admi.002 for a duplicate MsgId or an unreadable message — and
//! understood as verdicts by cabine's outbound reader), the
//! token bucket's 429 + Retry-After and its recovery, 400/413 refusals with
//! their problem, and the batch the client refuses to build (11 messages).

mod conformance_support;
mod sim_support;

use std::time::Duration;

use bytes::Bytes;
use cabine::icom::{SendOutcome, WireError};
use cabine::outbound::correlate::verdicts;
use cabine::sim::BucketRate;
use cabine_actors::ports::outbound::{ConfirmRef, SpiVerdict};
use cabine_actors::ports::{CloseOutcome, InboundMessage};
use conformance_support::{Rig, end_to_end_id, pacs008, read_all, rig};
use sim_support::{ISPB, msg_id};

/// Reads `n` messages from a fresh stream, then closes it (acknowledging them).
async fn read_answers(r: &Rig, n: usize) -> Vec<InboundMessage> {
    let mut client = r.client();
    let first = client.start().await;
    let (got, pull_next) = read_all(&mut client, first, n, 2 + n / 10).await;
    assert_eq!(client.close(&pull_next).await, CloseOutcome::Closed);
    assert_eq!(got.len(), n, "exactly {n} answers");
    got
}

fn text(m: &InboundMessage) -> &str {
    std::str::from_utf8(&m.raw).expect("UTF-8")
}

fn accepted(outcome: SendOutcome) -> Vec<String> {
    match outcome {
        SendOutcome::Accepted { resource_ids } => resource_ids,
        other => panic!("expected Accepted, got {other:?}"),
    }
}

#[tokio::test]
async fn a_pacs008_sent_is_answered_by_a_pacs002_read_from_the_stream() {
    let r = rig(|_| {}).await;
    let (id, e2e) = (msg_id(100), [end_to_end_id(100), end_to_end_id(101)]);
    let mut sender = r.client();
    let ids = accepted(sender.send(&[pacs008(&id, &[&e2e[0], &e2e[1]])]).await.unwrap());
    assert_eq!(ids.len(), 1, "one ResourceId per message");
    let log = r.outbound().await;
    assert_eq!((log[0]["resource_id"].as_str(), log[0]["msg_id"].as_str()), (Some(ids[0].as_str()), Some(&*id)));

    let answers = read_answers(&r, 2).await;
    for (answer, e2e) in answers.iter().zip(&e2e) {
        assert_eq!(answer.malformed, None);
        let meta = &answer.meta;
        assert!(meta.msg_def.as_deref().is_some_and(|d| d.starts_with("pacs.002.spi.")), "{meta:?}");
        assert_eq!(meta.msg_type(), "pacs.002");
        assert_eq!(meta.end_to_end_id.as_deref(), Some(e2e.as_str()), "OrgnlEndToEndId = the sent EndToEndId");
        assert_eq!((meta.from.as_deref(), meta.to.as_deref()), (Some("00038166"), Some(ISPB)));
        let biz = meta.biz_msg_id.as_deref().unwrap();
        assert!(biz.len() == 32 && biz.starts_with("M00038166"), "{biz}");
        assert!(text(answer).contains("<TxSts>ACSP</TxSts>"));
        assert!(text(answer).contains(&format!("OrgnlMsgId {id}")));
        // cabine's outbound side reads the same answer as a confirmation of that EndToEndId.
        let verdicts = verdicts(&answer.raw).unwrap();
        assert_eq!(verdicts, [(ConfirmRef::EndToEndId(e2e.clone()), SpiVerdict::Confirmed)]);
    }
    let audit = r.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["replies"].as_u64()), (Some(1), Some(2)));
}

#[tokio::test]
async fn ten_messages_go_in_one_gzipped_multipart_post_and_arrive_intact() {
    let r = rig(|_| {}).await;
    let batch: Vec<(String, String)> = (200..210).map(|n| (msg_id(n), end_to_end_id(n))).collect();
    let bodies: Vec<Bytes> = batch.iter().map(|(id, e2e)| pacs008(id, &[e2e])).collect();
    let ids = accepted(r.client().send(&bodies).await.unwrap());
    assert_eq!(ids.len(), 10);
    assert_eq!(ids.iter().collect::<std::collections::HashSet<_>>().len(), 10, "distinct ResourceIds");

    // The simulator's own multipart parser (multer) split exactly the bytes the client was given.
    let log = r.outbound().await;
    assert_eq!(log.len(), 10);
    for ((entry, body), (id, resource_id)) in log.iter().zip(&bodies).zip(batch.iter().map(|b| &b.0).zip(&ids)) {
        assert_eq!(entry["body"].as_str().unwrap().as_bytes(), &body[..]);
        assert_eq!(
            (entry["msg_id"].as_str(), entry["resource_id"].as_str()),
            (Some(id.as_str()), Some(&**resource_id))
        );
        assert_eq!(entry["outcome"], "accepted");
    }

    // Ten answers come back in ONE multipart read of ten, in order.
    let mut client = r.client();
    let (answers, pull_next) = conformance_support::messages(client.start().await);
    let e2e: Vec<_> = answers.iter().map(|m| m.meta.end_to_end_id.clone().unwrap()).collect();
    assert_eq!(e2e, batch.iter().map(|b| b.1.clone()).collect::<Vec<_>>());
    assert_eq!(client.close(&pull_next).await, CloseOutcome::Closed);
}

#[tokio::test]
async fn a_duplicate_msg_id_is_answered_by_an_admi002_on_the_stream() {
    let r = rig(|_| {}).await;
    let (id, e2e) = (msg_id(300), end_to_end_id(300));
    let mut sender = r.client();
    accepted(sender.send(&[pacs008(&id, &[&e2e])]).await.unwrap());
    let again = accepted(sender.send(&[pacs008(&id, &[&e2e])]).await.unwrap());
    assert_eq!(again.len(), 1, "the POST only stores: the verdict comes on the stream");

    let answers = read_answers(&r, 2).await;
    assert_eq!(answers[0].meta.msg_type(), "pacs.002");
    let reject = &answers[1];
    assert_eq!(reject.meta.msg_type(), "admi.002", "{:?}", reject.meta);
    assert!(text(reject).contains(&format!("<Ref>{id}</Ref>")) && text(reject).contains("AM05"));
    // The refusal of a copy is no verdict on the message: the first copy's pacs.002 decides.
    assert!(verdicts(&reject.raw).unwrap().is_empty(), "AM05 refuses the copy, not the payment");
    assert_eq!(verdicts(&answers[0].raw).unwrap().len(), 1, "the pacs.002 is the verdict");
    let audit = r.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["duplicates_outbound"].as_u64()), (Some(2), Some(1)));
}

#[tokio::test]
async fn an_unreadable_message_sent_is_answered_by_an_admi002() {
    let r = rig(|_| {}).await;
    let ids = accepted(r.client().send(&[Bytes::from_static(b"<Envelope><AppHdr>cut")]).await.unwrap());
    let answers = read_answers(&r, 1).await;
    assert_eq!(answers[0].meta.msg_type(), "admi.002");
    assert!(text(&answers[0]).contains(&format!("<Ref>{}</Ref>", ids[0])) && text(&answers[0]).contains("FF01"));
    assert_eq!(r.audit().await["malformed_outbound"], 1);
}

#[tokio::test]
async fn the_token_bucket_answers_429_with_retry_after_then_recovers() {
    let r = rig(|c| c.buckets.primary = BucketRate::new(10.0, 10.0)).await;
    let mut sender = r.client();
    let ten: Vec<Bytes> = (400..410).map(|n| pacs008(&msg_id(n), &[&end_to_end_id(n)])).collect();
    assert_eq!(accepted(sender.send(&ten).await.unwrap()).len(), 10, "a full bucket holds ten pacs.008");
    let one = [pacs008(&msg_id(410), &[&end_to_end_id(410)])];
    let SendOutcome::RateLimited { retry_after: Some(wait) } = sender.send(&one).await.unwrap() else {
        panic!("the empty bucket answers 429 with Retry-After")
    };
    assert_eq!(wait, Duration::from_secs(1), "whole seconds, at least one");
    let audit = r.audit().await;
    assert_eq!((audit["rejected_rate"].as_u64(), audit["received_outbound"].as_u64()), (Some(1), Some(10)));

    tokio::time::sleep(wait).await;
    assert_eq!(accepted(sender.send(&one).await.unwrap()).len(), 1, "after Retry-After the bucket admits again");
}

#[tokio::test]
async fn empty_and_oversized_messages_are_rejected_with_their_problem() {
    let r = rig(|c| c.max_body_bytes = 64 * 1024).await;
    let mut sender = r.client();
    let SendOutcome::Rejected { status: 400, problem: Some(p) } = sender.send(&[Bytes::new()]).await.unwrap() else {
        panic!("an empty message is a 400")
    };
    assert!(p.kind.as_deref().is_some_and(|k| k.ends_with("/error/emptyMessage")), "{p:?}");

    // 100 KiB that gzip to a few hundred bytes: the limit holds on the inflated body.
    let padding = " ".repeat(100 * 1024);
    let big = Bytes::from(sim_support::pacs008(&msg_id(500), &[&end_to_end_id(500)]).replace("<Sgntr/>", &padding));
    let SendOutcome::Rejected { status: 413, problem: Some(p) } = sender.send(&[big]).await.unwrap() else {
        panic!("an inflated body over the limit is a 413")
    };
    assert!(p.kind.as_deref().is_some_and(|k| k.ends_with("/error/payloadTooLarge")), "{p:?}");
    let audit = r.audit().await;
    assert_eq!((audit["refused_sends"].as_u64(), audit["received_outbound"].as_u64()), (Some(2), Some(0)));
}

#[tokio::test]
async fn the_client_refuses_to_build_an_eleven_message_batch() {
    let r = rig(|_| {}).await;
    let eleven: Vec<Bytes> = (600..611).map(|n| pacs008(&msg_id(n), &[&end_to_end_id(n)])).collect();
    let refused = r.client().send(&eleven).await.unwrap_err();
    assert_eq!(refused, WireError::BatchSize { len: 11, max: 10 });
    assert_eq!(r.client().send(&[]).await.unwrap_err(), WireError::BatchSize { len: 0, max: 10 });
    let audit = r.audit().await;
    assert_eq!((audit["max_in_flight"].as_u64(), audit["max_tcp_connections"].as_u64()), (Some(0), Some(0)));
}
