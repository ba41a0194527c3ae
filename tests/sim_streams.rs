//! The simulator's streams, driven with plain HTTP: batches of ten with a
//! PI-ResourceId per part, acknowledgement by following the pull-next,
//! redelivery on the previous one, 204 after the hold, 404/410, the stream and
//! in-flight caps, idle expiry, gzip, and the ledger that records acks.

mod sim_support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use sim_support::{ISPB, TestSim, read, start, start_path};

/// Waits (at most 1.5 s) until `n` requests are in flight.
async fn wait_in_flight(t: &TestSim, n: u64) {
    let deadline = Instant::now() + Duration::from_millis(1_500);
    while t.audit().await["in_flight"].as_u64() != Some(n) {
        assert!(Instant::now() < deadline, "{n} requests never got in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn batches_of_ten_are_acknowledged_by_following_the_pull_next() {
    let t = start(|_| {}).await;
    let injected = t.inject(25, "pacs008").await;

    let first = read(t.open()).await;
    assert_eq!(first.status, 200);
    assert!(first.headers["content-type"].to_str().unwrap().starts_with("multipart/mixed; boundary="));
    assert_eq!(first.ids(), injected[..10]);
    assert!(first.pull_next().starts_with(&format!("/api/v1/out/{ISPB}/stream/")));
    assert!(first.messages[0].1.contains("<MsgDefIdr>pacs.008.spi.1.16</MsgDefIdr>"));
    let second = read(t.next(first.pull_next())).await;
    assert_eq!(second.ids(), injected[10..20]);
    let third = read(t.next(second.pull_next())).await;
    assert_eq!(third.ids(), injected[20..]);
    assert_eq!(t.audit().await["acknowledged"], 20);

    // Nothing left: held for the hold time, then 204 — still with a pull-next.
    let began = Instant::now();
    let empty = read(t.next(third.pull_next())).await;
    assert_eq!(empty.status, 204);
    assert!(began.elapsed() >= Duration::from_millis(190), "held {:?}", began.elapsed());
    let audit = t.audit().await;
    assert_eq!((audit["delivered"].as_u64(), audit["acknowledged"].as_u64()), (Some(25), Some(25)));
    assert_eq!((audit["pending"].as_u64(), audit["unacknowledged"].as_u64()), (Some(0), Some(0)));

    let ledger = t.control_get(&format!("/sim/ledger?ispb={ISPB}&channel=cpm")).await;
    let acked: Vec<&str> =
        ledger["entries"].as_array().unwrap().iter().map(|e| e["resource_id"].as_str().unwrap()).collect();
    assert_eq!(acked, injected.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ledger["entries"][0]["acked_at_ms"].as_u64().unwrap() > 0);
    let after = t.control_get(&format!("/sim/ledger?since={}", ledger["entries"][19]["seq"])).await;
    assert_eq!(after["entries"].as_array().unwrap().len(), 5);

    // DELETE closes (200), a second DELETE finds nothing (410), a GET on it is 404.
    let del = t.icom(Method::DELETE, empty.pull_next()).send().await.unwrap();
    assert_eq!(del.status(), 200);
    let again = t.icom(Method::DELETE, empty.pull_next()).send().await.unwrap();
    assert_eq!(again.status(), 410);
    assert_eq!(read(t.next(empty.pull_next())).await.status, 404);
    assert_eq!(t.audit().await["open_streams"], 0);
}

#[tokio::test]
async fn without_multipart_a_read_carries_one_message_and_its_resource_id() {
    let t = start(|_| {}).await;
    let injected = t.inject(2, "pacs002").await;
    let one = read(t.icom(Method::GET, &start_path(ISPB))).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.headers["content-type"], "application/xml; charset=utf-8");
    assert_eq!(one.ids(), injected[..1]);
    assert!(one.messages[0].1.contains("<MsgDefIdr>pacs.002.spi.1.17</MsgDefIdr>"));
    let two = read(t.icom(Method::GET, one.pull_next())).await;
    assert_eq!(two.ids(), injected[1..]);
}

#[tokio::test]
async fn repeating_the_previous_pull_next_redelivers_the_same_batch() {
    let t = start(|_| {}).await;
    let injected = t.inject(15, "pacs008").await;
    let first = read(t.open()).await;
    let second = read(t.next(first.pull_next())).await;
    assert_eq!(second.ids(), injected[10..]);
    // The response to `second` was "lost": the client repeats the pull-next it used.
    let again = read(t.next(first.pull_next())).await;
    assert_eq!(again.ids(), second.ids());
    assert_eq!(again.messages, second.messages, "same ResourceIds, same bytes");
    assert_eq!(again.pull_next(), second.pull_next());
    let audit = t.audit().await;
    assert_eq!((audit["redelivered"].as_u64(), audit["acknowledged"].as_u64()), (Some(5), Some(10)));
    // An unknown token is 404.
    assert_eq!(read(t.next(&format!("/api/v1/out/{ISPB}/stream/0123abcd"))).await.status, 404);
    // Moving on acknowledges the redelivered batch once.
    let end = read(t.next(second.pull_next())).await;
    assert_eq!(end.status, 204);
    assert_eq!(t.audit().await["acknowledged"], 15);
}

#[tokio::test]
async fn an_idle_stream_expires_and_its_batch_goes_back_to_the_head() {
    let t = start(|c| c.stream_idle = Duration::from_millis(300)).await;
    let injected = t.inject(13, "pacs008").await;
    let first = read(t.open()).await;
    assert_eq!(first.ids(), injected[..10]);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(read(t.next(first.pull_next())).await.status, 404, "expired");
    let audit = t.audit().await;
    assert_eq!((audit["expired_streams"].as_u64(), audit["open_streams"].as_u64()), (Some(1), Some(0)));
    assert_eq!(audit["pending"], 13);
    let fresh = read(t.open()).await;
    assert_eq!(fresh.ids(), injected[..10], "the unacknowledged batch comes first, in order");
    let rest = read(t.next(fresh.pull_next())).await;
    assert_eq!(rest.ids(), injected[10..]);
    let audit = t.audit().await;
    assert_eq!((audit["redelivered"].as_u64(), audit["delivered"].as_u64()), (Some(10), Some(13)));
}

#[tokio::test]
async fn the_seventh_stream_is_refused_with_429() {
    let t = start(|c| c.hold = Duration::ZERO).await;
    let mut streams = Vec::new();
    for _ in 0..6 {
        let r = read(t.open()).await;
        assert_eq!(r.status, 204, "hold 0: an empty read answers at once");
        streams.push(r.pull_next().to_owned());
    }
    let seventh = t.open().send().await.unwrap();
    assert_eq!(seventh.status(), 429);
    let audit = t.audit().await;
    assert_eq!(audit["max_open_streams"], 6);
    assert_eq!((audit["rejected_429"].as_u64(), audit["rejected_streams"].as_u64()), (Some(1), Some(1)));
    // Closing one makes room again.
    assert_eq!(t.icom(Method::DELETE, &streams[0]).send().await.unwrap().status(), 200);
    assert_eq!(read(t.open()).await.status, 204);
    assert_eq!(t.audit().await["max_open_streams"], 6);
}

#[tokio::test]
async fn over_max_in_flight_is_429_or_503_and_the_audit_keeps_the_peak() {
    for (status, config) in [(429u16, 429u16), (503, 503)] {
        let t = start(|c| {
            c.hold = Duration::from_secs(2);
            c.max_streams = 10;
            c.over_in_flight_status = reqwest::StatusCode::from_u16(config).unwrap();
        })
        .await;
        let holders: Vec<_> = (0..6).map(|_| tokio::spawn(t.open().send())).collect();
        wait_in_flight(&t, 6).await;
        let seventh = t.open().send().await.unwrap();
        assert_eq!(seventh.status(), status);
        assert!(seventh.text().await.unwrap().contains("/error/tooManyRequests"));
        for h in holders {
            assert_eq!(h.await.unwrap().unwrap().status(), 204);
        }
        let audit = t.audit().await;
        assert_eq!(audit["max_in_flight"], 7, "the refused request was in flight too");
        assert_eq!(audit["rejected_in_flight"], 1);
        assert_eq!(audit["rejected_429"], if status == 429 { 1 } else { 0 });
        assert_eq!(audit["in_flight"], 0);
        assert!(audit["max_tcp_connections"].as_u64().unwrap() >= 7);
    }
}

#[tokio::test]
async fn messages_of_one_participant_are_split_across_its_streams() {
    let t = start(|_| {}).await;
    let injected = t.inject(40, "pacs008").await;
    let a = read(t.open()).await;
    let b = read(t.open()).await;
    let a2 = read(t.next(a.pull_next())).await;
    let b2 = read(t.next(b.pull_next())).await;
    let mut seen = HashSet::new();
    for r in [&a, &b, &a2, &b2] {
        assert_eq!(r.messages.len(), 10);
        for id in r.ids() {
            assert!(seen.insert(id), "each message goes to one stream");
        }
    }
    assert_eq!(seen, injected.into_iter().collect::<HashSet<_>>());
}

#[tokio::test]
async fn a_long_poll_answers_as_soon_as_a_message_arrives() {
    let t = start(|c| c.hold = Duration::from_secs(5)).await;
    let poll = tokio::spawn(read(t.open()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let began = Instant::now();
    let ids = t.inject(1, "pacs008").await;
    let r = poll.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.ids(), ids);
    assert!(began.elapsed() < Duration::from_secs(2), "{:?}", began.elapsed());
}

#[tokio::test]
async fn responses_are_gzipped_when_the_client_accepts_it() {
    let t = start(|_| {}).await;
    let injected = t.inject(10, "pacs008").await;
    let r = read(t.open().header("accept-encoding", "gzip")).await;
    assert_eq!(r.headers["content-encoding"], "gzip");
    assert_eq!(r.ids(), injected);
    let plain = read(t.next(r.pull_next())).await;
    assert_eq!(plain.status, 204);
    assert!(plain.headers.get("content-encoding").is_none());
}

#[tokio::test]
async fn paced_injection_arrives_over_time() {
    let t = start(|c| c.hold = Duration::from_millis(100)).await;
    let began = Instant::now();
    let ids = t.inject_json(json!({ "count": 20, "kind": "pacs008", "rate_per_s": 20.0 })).await;
    assert_eq!(ids.len(), 20);
    assert!(t.audit().await["injected"].as_u64().unwrap() < 20, "not all at once");
    let mut got = Vec::new();
    let mut r = read(t.open()).await;
    while got.len() < 20 && began.elapsed() < Duration::from_secs(5) {
        got.extend(r.ids());
        r = read(t.next(r.pull_next())).await;
    }
    assert_eq!(got, ids);
    assert!(began.elapsed() >= Duration::from_millis(500), "{:?}", began.elapsed());
}

#[tokio::test]
async fn wrong_paths_methods_and_participants_are_refused() {
    let t = start(|_| {}).await;
    let status = |m: Method, p: String| {
        let req = t.icom(m, &p);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(Method::GET, "/nothing".into()).await, 404);
    assert_eq!(status(Method::POST, start_path(ISPB)).await, 405);
    assert_eq!(status(Method::GET, start_path("12345678")).await, 403);
    assert_eq!(status(Method::DELETE, format!("/api/v1/out/{ISPB}/stream/unknown")).await, 410);
    let r = t.icom(Method::GET, "/nothing").send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/problem+xml"));
    assert!(r.text().await.unwrap().contains("<problem xmlns=\"urn:ietf:rfc:7807\">"));
}

#[tokio::test]
async fn sends_share_the_in_flight_cap_unless_counted_separately() {
    for separate in [false, true] {
        let t = start(|c| {
            c.hold = Duration::from_secs(2);
            c.sends_counted_separately = separate;
        })
        .await;
        let holders: Vec<_> = (0..6).map(|_| tokio::spawn(t.open().send())).collect();
        wait_in_flight(&t, 6).await;
        let xml = sim_support::pacs008(&sim_support::msg_id(if separate { 51 } else { 50 }), &[]);
        let send = t.send_xml(xml).send().await.unwrap();
        assert_eq!(send.status(), if separate { 201 } else { 429 }, "separate caps: {separate}");
        for h in holders {
            assert_eq!(h.await.unwrap().unwrap().status(), 204);
        }
        let audit = t.audit().await;
        assert_eq!(
            (audit["max_in_flight_streams"].as_u64(), audit["max_in_flight_sends"].as_u64()),
            (Some(6), Some(1))
        );
    }
}
