//! Conformance, streams: the simulator driven through the REAL client
//! (`IcomChannels` from `Settings`). Start / next / close and their typed
//! outcomes, 10-message multipart batches whose envelopes parse, the ledger of
//! acknowledgements, redelivery on the previous pull-next, idle expiry that
//! re-queues, the 7th stream refused with the audit showing 6.

mod conformance_support;
mod sim_support;

use std::time::{Duration, Instant};

use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{CloseOutcome, IcomConnector, PollOutcome};
use conformance_support::{empty, ids, messages, read_all, rig};
use sim_support::ISPB;

#[tokio::test]
async fn an_empty_stream_is_held_then_empty_and_closes_through_the_connector_port() {
    let r = rig(|_| {}).await;
    // Through the port the slots use: `IcomConnector::stream`.
    let mut stream = r.channels.stream(ChannelId::Cpm);
    let began = Instant::now();
    let pull_next = empty(stream.start().await);
    assert!(began.elapsed() >= Duration::from_millis(190), "held {:?} (hold 200 ms)", began.elapsed());
    assert!(pull_next.starts_with(&format!("/api/v1/out/{ISPB}/stream/")), "{pull_next}");
    let again = empty(stream.next(&pull_next).await);
    assert_ne!(again, pull_next, "every response hands out a new pull-next");
    assert_eq!(r.audit().await["open_streams"], 1);

    assert_eq!(stream.close(&again).await, CloseOutcome::Closed, "DELETE → 200");
    assert_eq!(stream.close(&again).await, CloseOutcome::Closed, "DELETE of an unknown stream → 410 → Closed");
    assert_eq!(stream.next(&again).await, PollOutcome::UnknownStream, "GET on a closed stream → 404");
    let audit = r.audit().await;
    assert_eq!((audit["open_streams"].as_u64(), audit["max_open_streams"].as_u64()), (Some(0), Some(1)));
}

#[tokio::test]
async fn ten_message_batches_are_read_acknowledged_and_their_envelopes_parse() {
    let r = rig(|_| {}).await;
    let (injected, msg_ids) = r.inject(25, "pacs008").await;
    let mut client = r.client();

    let (first, p1) = messages(client.start().await);
    assert_eq!(ids(&first), injected[..10], "10 per read with Accept: multipart/mixed");
    for (m, msg_id) in first.iter().zip(&msg_ids) {
        assert_eq!(m.malformed, None, "{m:?}");
        assert_eq!(m.meta.msg_def.as_deref(), Some("pacs.008.spi.1.16"));
        assert_eq!(m.meta.biz_msg_id, *msg_id);
        assert_eq!(m.meta.msg_id, *msg_id, "GrpHdr/MsgId = BizMsgIdr in SPI messages");
        let e2e = m.meta.end_to_end_id.as_deref().expect("EndToEndId");
        assert!(e2e.starts_with('E') && e2e.len() == 32, "{e2e}");
        assert_eq!(m.meta.to.as_deref(), Some(ISPB));
        assert!(m.meta.from.as_deref().is_some_and(|f| f.len() == 8));
    }
    assert_eq!(r.audit().await["acknowledged"], 0, "nothing acknowledged before the next GET");
    let (second, p2) = messages(client.next(&p1).await);
    assert_eq!(ids(&second), injected[10..20]);
    assert_eq!(r.audit().await["acknowledged"], 10, "following the pull-next acknowledged the first batch");
    let (third, p3) = messages(client.next(&p2).await);
    assert_eq!(ids(&third), injected[20..]);
    let p4 = empty(client.next(&p3).await);
    assert_eq!(client.close(&p4).await, CloseOutcome::Closed);

    let audit = r.audit().await;
    assert_eq!((audit["delivered"].as_u64(), audit["acknowledged"].as_u64()), (Some(25), Some(25)));
    assert_eq!((audit["redelivered"].as_u64(), audit["unacknowledged"].as_u64()), (Some(0), Some(0)));
    let ledger = r.t.control_get(&format!("/sim/ledger?ispb={ISPB}&channel=cpm")).await;
    let acked: Vec<&str> =
        ledger["entries"].as_array().unwrap().iter().map(|e| e["resource_id"].as_str().unwrap()).collect();
    assert_eq!(acked, injected.iter().map(String::as_str).collect::<Vec<_>>(), "the ledger is what was read");
}

#[tokio::test]
async fn an_unknown_token_is_an_unknown_stream() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    let mut client = r.client();
    let bogus = format!("/api/v1/out/{ISPB}/stream/00000000000000000000000000000000");
    assert_eq!(client.next(&bogus).await, PollOutcome::UnknownStream, "404 on next");
    assert_eq!(client.close(&bogus).await, CloseOutcome::Closed, "410 on DELETE is success");
    assert_eq!(r.audit().await["open_streams"], 0);
}

#[tokio::test]
async fn repeating_the_previous_pull_next_redelivers_the_same_resource_ids() {
    let r = rig(|_| {}).await;
    let (injected, _) = r.inject(15, "pacs002").await;
    let mut client = r.client();
    let (first, p1) = messages(client.start().await);
    assert_eq!(ids(&first), injected[..10]);
    let (second, p2) = messages(client.next(&p1).await);
    assert_eq!(ids(&second), injected[10..]);

    // The answer to `next(p1)` was "lost": ask again with the same, previous, pull-next.
    let (again, p2_again) = messages(client.next(&p1).await);
    assert_eq!(ids(&again), ids(&second), "same batch, same ResourceIds");
    assert_eq!(again.iter().map(|m| &m.raw).collect::<Vec<_>>(), second.iter().map(|m| &m.raw).collect::<Vec<_>>());
    assert_eq!(p2_again, p2, "and the same pull-next");
    let audit = r.audit().await;
    assert_eq!((audit["redelivered"].as_u64(), audit["acknowledged"].as_u64()), (Some(5), Some(10)));

    let p3 = empty(client.next(&p2).await);
    assert_eq!(r.audit().await["acknowledged"], 15);
    assert_eq!(client.next(&p1).await, PollOutcome::UnknownStream, "two steps back is unknown");
    assert_eq!(client.close(&p3).await, CloseOutcome::Closed);
}

#[tokio::test]
async fn an_idle_stream_expires_and_its_batch_is_requeued_at_the_head() {
    let r = rig(|c| c.stream_idle = Duration::from_millis(300)).await;
    let (injected, _) = r.inject(13, "pacs008").await;
    let mut client = r.client();
    let (first, p1) = messages(client.start().await);
    assert_eq!(ids(&first), injected[..10]);

    conformance_support::wait_audit(&r, Duration::from_secs(3), "the idle stream expires", |a| {
        a["expired_streams"] == 1 && a["open_streams"] == 0
    })
    .await;
    assert_eq!(client.next(&p1).await, PollOutcome::UnknownStream, "the expired stream's token is gone");

    // Its unacknowledged batch went back to the head of the queue, ahead of the 3 never read.
    let mut reader = r.client();
    let first_read = reader.start().await;
    let (all, last) = read_all(&mut reader, first_read, 13, 4).await;
    assert_eq!(ids(&all), injected, "re-queued batch first, in its order, then the rest");
    assert_eq!(reader.close(&last).await, CloseOutcome::Closed);
    let audit = r.audit().await;
    assert_eq!((audit["redelivered"].as_u64(), audit["acknowledged"].as_u64()), (Some(10), Some(13)));
}

#[tokio::test]
async fn the_seventh_stream_is_too_many_streams_and_the_audit_shows_six() {
    let r = rig(|c| c.hold = Duration::ZERO).await;
    let mut clients: Vec<_> = (0..7).map(|_| r.client()).collect();
    let mut open = Vec::new();
    for client in clients.iter_mut().take(6) {
        open.push(empty(client.start().await));
    }
    assert_eq!(clients[6].start().await, PollOutcome::TooManyStreams, "429 on the 7th start");
    let audit = r.audit().await;
    assert_eq!((audit["open_streams"].as_u64(), audit["max_open_streams"].as_u64()), (Some(6), Some(6)));
    assert_eq!((audit["rejected_streams"].as_u64(), audit["rejected_429"].as_u64()), (Some(1), Some(1)));

    // Closing one frees a place.
    assert_eq!(clients[0].close(&open[0]).await, CloseOutcome::Closed);
    let seventh = empty(clients[6].start().await);
    let audit = r.audit().await;
    assert_eq!((audit["open_streams"].as_u64(), audit["max_open_streams"].as_u64()), (Some(6), Some(6)));
    for (client, pull_next) in clients.iter_mut().skip(1).zip(open.iter().skip(1).chain([&seventh])) {
        assert_eq!(client.close(pull_next).await, CloseOutcome::Closed);
    }
    assert_eq!(r.audit().await["open_streams"], 0);
}
