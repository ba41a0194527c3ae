//! Conformance, failures: every refusal and fault of the simulator arrives as
//! the right typed outcome of the REAL client — 429 with Retry-After
//! (RateLimited; TooManyStreams on start), the in-flight cap, 403 with a
//! problem (Rejected), 5xx (ServerError, and "maybe stored"), latency past the
//! timeout (Timeout, and nothing lost when the pull-next is repeated),
//! connection resets and a dead server (Transport) — and the client recovers
//! once the fault is gone.

mod conformance_support;
mod sim_support;

use std::time::Duration;

use cabine::icom::SendOutcome;
use cabine_actors::ports::{CloseOutcome, PollOutcome};
use conformance_support::{empty, end_to_end_id, messages, pacs008, rig, rig_as, wait_audit};
use serde_json::json;
use sim_support::{ISPB, OTHER, msg_id};

fn bogus_pull_next() -> String {
    pull_next_of(ISPB)
}

fn pull_next_of(ispb: &str) -> String {
    format!("/api/v1/out/{ispb}/stream/00000000000000000000000000000000")
}

#[tokio::test]
async fn a_429_fault_is_rate_limited_with_retry_after_and_too_many_streams_on_start() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    let pull_next = empty(client.start().await);
    r.t.faults(json!({ "status_429_ratio": 1.0 })).await;
    let one_second = Some(Duration::from_secs(1));
    assert_eq!(client.next(&pull_next).await, PollOutcome::RateLimited { retry_after: one_second });
    assert_eq!(client.start().await, PollOutcome::TooManyStreams, "a 429 on start means too many streams");
    let sent = client.send(&[pacs008(&msg_id(1), &[&end_to_end_id(1)])]).await.unwrap();
    assert_eq!(sent, SendOutcome::RateLimited { retry_after: one_second });
    assert_eq!(r.audit().await["fault_429"], 3);

    r.t.faults(json!({ "status_429_ratio": 0.0 })).await;
    empty(client.next(&pull_next).await);
}

#[tokio::test]
async fn the_seventh_simultaneous_request_is_refused_with_429() {
    let r = rig(|c| c.hold = Duration::from_millis(1_000)).await;
    let held: Vec<_> = (0..6)
        .map(|_| {
            let mut client = r.client();
            tokio::spawn(async move { client.start().await })
        })
        .collect();
    wait_audit(&r, Duration::from_millis(900), "six long-polls in flight", |a| a["in_flight"] == 6).await;
    let mut seventh = r.client();
    let refused = seventh.send(&[pacs008(&msg_id(2), &[&end_to_end_id(2)])]).await.unwrap();
    assert_eq!(refused, SendOutcome::RateLimited { retry_after: None }, "over the in-flight cap, nothing stored");
    for poll in held {
        empty(poll.await.unwrap());
    }
    let audit = r.audit().await;
    assert_eq!((audit["rejected_in_flight"].as_u64(), audit["received_outbound"].as_u64()), (Some(1), Some(0)));
    assert_eq!(audit["max_in_flight"], 7, "the refused request counts while it is answered");
}

#[tokio::test]
async fn a_participant_the_server_does_not_serve_is_rejected_with_a_problem() {
    let r = rig_as(OTHER, conformance_support::CLIENT_TIMEOUT, |c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    let PollOutcome::Rejected { status: 403, problem: Some(problem) } = client.start().await else {
        panic!("403 with a problem body")
    };
    assert!(problem.contains("urn:ietf:rfc:7807") && problem.contains("/error/forbidden"), "{problem}");
    let sent = client.send(&[pacs008(&msg_id(3), &[&end_to_end_id(3)])]).await.unwrap();
    let SendOutcome::Rejected { status: 403, problem: Some(p) } = sent else { panic!("{sent:?}") };
    assert_eq!(p.kind.as_deref(), Some("https://www.bcb.gov.br/pi/icom/error/forbidden"));
    let closed = client.close(&pull_next_of(OTHER)).await;
    assert!(matches!(&closed, CloseOutcome::Failed(f) if f.starts_with("status 403")), "{closed:?}");
}

#[tokio::test]
async fn a_5xx_fault_is_a_server_error_for_every_operation() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    r.t.faults(json!({ "error_5xx_ratio": 1.0, "error_status": 503 })).await;
    assert_eq!(client.start().await, PollOutcome::ServerError { status: 503 });
    assert_eq!(client.next(&bogus_pull_next()).await, PollOutcome::ServerError { status: 503 });
    let sent = client.send(&[pacs008(&msg_id(4), &[&end_to_end_id(4)])]).await.unwrap();
    assert_eq!(sent, SendOutcome::ServerError { status: 503 });
    assert!(matches!(client.close(&bogus_pull_next()).await, CloseOutcome::Failed(f) if f.starts_with("status 503")));
    assert_eq!(r.audit().await["received_outbound"], 0, "nothing stored by a plain 5xx");

    r.t.faults(json!({ "error_5xx_ratio": 0.0 })).await;
    empty(client.start().await);
}

#[tokio::test]
async fn a_5xx_after_storing_means_resend_and_the_resend_is_a_duplicate() {
    let r = rig(|_| {}).await;
    let mut client = r.client();
    let (id, e2e) = (msg_id(5), end_to_end_id(5));
    let message = pacs008(&id, &[&e2e]);
    r.t.faults(json!({ "error_5xx_ratio": 1.0, "store_before_5xx": true })).await;
    assert_eq!(client.send(std::slice::from_ref(&message)).await.unwrap(), SendOutcome::ServerError { status: 500 });
    r.t.faults(json!({ "error_5xx_ratio": 0.0 })).await;
    let SendOutcome::Accepted { resource_ids } = client.send(&[message]).await.unwrap() else { panic!("resent") };
    assert_eq!(resource_ids.len(), 1);

    let first = client.start().await;
    let (answers, pull_next) = conformance_support::read_all(&mut client, first, 2, 4).await;
    let defs: Vec<_> = answers.iter().map(|m| m.meta.msg_def.clone().unwrap()).collect();
    assert_eq!(defs, ["pacs.002.spi.1.17", "admi.002.spi.1.3"], "accepted once, then the duplicate refused");
    assert_eq!(answers[0].meta.end_to_end_id.as_deref(), Some(e2e.as_str()));
    assert!(std::str::from_utf8(&answers[1].raw).unwrap().contains(&format!("<Ref>{id}</Ref>")));
    assert_eq!(client.close(&pull_next).await, CloseOutcome::Closed);
    let audit = r.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["duplicates_outbound"].as_u64()), (Some(2), Some(1)));
}

#[tokio::test]
async fn latency_past_the_request_timeout_is_a_timeout() {
    let r = rig_as(ISPB, "400ms", |c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    r.t.faults(json!({ "latency_ms": 1_500 })).await;
    assert_eq!(client.start().await, PollOutcome::Timeout);
    let sent = client.send(&[pacs008(&msg_id(6), &[&end_to_end_id(6)])]).await.unwrap();
    assert_eq!(sent, SendOutcome::Timeout);
    assert_eq!(client.close(&bogus_pull_next()).await, CloseOutcome::Failed("timeout".into()));

    r.t.faults(json!({ "latency_ms": 0 })).await;
    empty(client.start().await);
}

#[tokio::test]
async fn a_long_poll_abandoned_on_timeout_loses_nothing_when_the_pull_next_is_repeated() {
    let r = rig_as(ISPB, "400ms", |c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    let p1 = empty(client.start().await);
    r.t.faults(json!({ "hold_ms": 1_500 })).await;
    assert_eq!(client.next(&p1).await, PollOutcome::Timeout, "held past the client's timeout");
    // Messages arrive while the abandoned request may still be held by the server.
    let (injected, _) = r.inject(3, "pacs008").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (batch, p2) = messages(client.next(&p1).await);
    assert_eq!(conformance_support::ids(&batch), injected, "the same pull-next again gets the batch");
    r.t.faults(json!({ "hold_ms": 0 })).await;
    let p3 = empty(client.next(&p2).await);
    assert_eq!(client.close(&p3).await, CloseOutcome::Closed);
    let audit = r.audit().await;
    assert_eq!((audit["acknowledged"].as_u64(), audit["pending"].as_u64()), (Some(3), Some(0)));
}

#[tokio::test]
async fn a_connection_reset_is_a_transport_failure() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    r.t.faults(json!({ "reset_ratio": 1.0 })).await;
    assert!(matches!(client.start().await, PollOutcome::Transport(_)));
    let sent = client.send(&[pacs008(&msg_id(7), &[&end_to_end_id(7)])]).await.unwrap();
    assert!(matches!(sent, SendOutcome::Transport(_)), "{sent:?}");
    assert!(matches!(client.close(&bogus_pull_next()).await, CloseOutcome::Failed(_)));
    assert_eq!(r.audit().await["fault_resets"], 3);

    r.t.faults(json!({ "reset_ratio": 0.0 })).await;
    empty(client.start().await);
}

#[tokio::test]
async fn a_server_that_closes_after_each_response_is_followed_on_new_connections() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    r.t.faults(json!({ "close_after_response": true })).await;
    let (injected, _) = r.inject(20, "pacs008").await;
    let mut client = r.client();
    let (first, p1) = messages(client.start().await);
    let (second, p2) = messages(client.next(&p1).await);
    assert_eq!(conformance_support::ids(&[first, second].concat()), injected);
    assert_eq!(client.close(&p2).await, CloseOutcome::Closed);
    let audit = r.audit().await;
    assert_eq!(audit["acknowledged"], 20);
    assert_eq!(audit["max_tcp_connections"], 1, "one connection at a time, even reconnecting");
}

#[tokio::test]
async fn a_server_gone_is_a_transport_failure() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    let pull_next = empty(client.start().await);
    let conformance_support::Rig { t, channels, .. } = r;
    t.sim.shutdown().await;
    assert!(matches!(client.next(&pull_next).await, PollOutcome::Transport(_)));
    let mut fresh = channels.client(cabine_actors::domain::ChannelId::Cpm).unwrap();
    assert!(matches!(fresh.start().await, PollOutcome::Transport(_)), "connection refused");
    let sent = fresh.send(&[pacs008(&msg_id(8), &[&end_to_end_id(8)])]).await.unwrap();
    assert!(matches!(sent, SendOutcome::Transport(_)), "{sent:?}");
}
