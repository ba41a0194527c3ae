//! Sends to the simulator (`POST …/msgs`): 201 with the ResourceIds, the SPI's
//! answers on the sender's stream (pacs.002 ACSP, admi.002 for a duplicate or
//! an unreadable message), and every refusal — header whitelist, Host with a
//! port, charset, media types, length, size, gzip bombs, eleven parts, the
//! token bucket with Retry-After and its recovery.

mod sim_support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cabine::sim::{BucketRate, ManualClock};
use reqwest::Method;
use serde_json::Value;
use sim_support::{ISPB, gzip, msg_id, multipart, pacs008, raw, read, send_path, start};

fn resource_ids(r: &reqwest::Response) -> Vec<String> {
    r.headers()["pi-resourceid"].to_str().unwrap().split(',').map(str::to_owned).collect()
}

#[tokio::test]
async fn an_accepted_pacs008_is_answered_with_a_pacs002_on_the_senders_stream() {
    let t = start(|_| {}).await;
    let id = msg_id(1);
    let e2e = "E99999010202403011200abcdefghijk";
    let r = t.send_xml(pacs008(&id, &[e2e])).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let ids = resource_ids(&r);
    assert_eq!(ids.len(), 1);

    let reply = read(t.open()).await;
    assert_eq!(reply.messages.len(), 1);
    let xml = &reply.messages[0].1;
    assert!(xml.contains("<MsgDefIdr>pacs.002.spi.1.17</MsgDefIdr>"), "{xml}");
    assert!(xml.contains("<TxSts>ACSP</TxSts>"));
    assert!(xml.contains(&format!("<OrgnlEndToEndId>{e2e}</OrgnlEndToEndId>")));
    assert!(xml.contains(&format!("OrgnlMsgId {id}")));
    assert!(xml.contains(&format!("<To><FIId><FinInstnId><Othr><Id>{ISPB}</Id>")) || xml.contains(ISPB));

    let outbound = t.control_get("/sim/outbound?body=true").await;
    let rec = &outbound["entries"][0];
    assert_eq!(rec["resource_id"], ids[0].as_str());
    assert_eq!(rec["outcome"], "accepted");
    assert_eq!(rec["msg_id"], id.as_str());
    assert_eq!(rec["end_to_end_ids"][0], e2e);
    assert!(rec["body"].as_str().unwrap().contains(&id));
    let audit = t.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["replies"].as_u64()), (Some(1), Some(1)));
}

#[tokio::test]
async fn a_duplicate_msg_id_and_a_malformed_message_are_answered_with_admi002() {
    let t = start(|_| {}).await;
    let id = msg_id(2);
    let body = pacs008(&id, &["E99999010202403011200bbbbbbbbbbb"]);
    assert_eq!(t.send_xml(body.clone()).send().await.unwrap().status(), 201);
    let dup = t.send_xml(body).send().await.unwrap();
    assert_eq!(dup.status(), 201, "the POST only stores");
    let bad = t.send_xml("<Envelope><AppHdr>").send().await.unwrap();
    assert_eq!(bad.status(), 201);
    let bad_id = resource_ids(&bad).remove(0);

    let answers = read(t.open()).await;
    let bodies: Vec<&String> = answers.messages.iter().map(|(_, b)| b).collect();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert!(bodies[0].contains("<TxSts>ACSP</TxSts>"));
    assert!(
        bodies[1].contains("<MsgDefIdr>admi.002.spi.1.3</MsgDefIdr>")
            && bodies[1].contains("<RjctgPtyRsn>AM05</RjctgPtyRsn>")
    );
    assert!(bodies[1].contains(&format!("<Ref>{id}</Ref>")));
    assert!(
        bodies[2].contains("<RjctgPtyRsn>FF01</RjctgPtyRsn>") && bodies[2].contains(&format!("<Ref>{bad_id}</Ref>"))
    );
    let audit = t.audit().await;
    assert_eq!(audit["duplicates_outbound"], 1);
    assert_eq!(audit["malformed_outbound"], 1);
    assert_eq!(audit["received_outbound"], 3);
    let outbound = t.control_get("/sim/outbound").await;
    let outcomes: Vec<&str> =
        outbound["entries"].as_array().unwrap().iter().map(|e| e["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["accepted", "duplicate", "malformed"]);
}

#[tokio::test]
async fn ten_parts_are_accepted_and_eleven_refused() {
    let t = start(|_| {}).await;
    let ten: Vec<String> =
        (0..10).map(|n| pacs008(&msg_id(100 + n), &[&format!("E99999010202403011200{n:011}")])).collect();
    let r = t
        .icom(Method::POST, &send_path(ISPB))
        .header("content-type", "multipart/mixed; boundary=sep42")
        .body(multipart("sep42", &ten))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let ids = resource_ids(&r);
    assert_eq!(ids.len(), 10);
    assert_eq!(ids.iter().collect::<std::collections::HashSet<_>>().len(), 10);

    let mut eleven = ten.clone();
    eleven.push(pacs008(&msg_id(200), &["E99999010202403011200zzzzzzzzzzz"]));
    let r = t
        .icom(Method::POST, &send_path(ISPB))
        .header("content-type", "multipart/mixed; boundary=sep42")
        .body(multipart("sep42", &eleven))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert!(r.text().await.unwrap().contains("/error/tooManyParts"));
    let audit = t.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["refused_sends"].as_u64()), (Some(10), Some(1)));
    // Ten replies wait on the stream, in order.
    let replies = read(t.open()).await;
    assert_eq!(replies.messages.len(), 10);
    for (n, (_, xml)) in replies.messages.iter().enumerate() {
        assert!(xml.contains(&format!("<OrgnlEndToEndId>E99999010202403011200{n:011}</OrgnlEndToEndId>")));
    }
}

#[tokio::test]
async fn a_header_outside_the_whitelist_is_a_400_problem() {
    let t = start(|_| {}).await;
    let r = t.send_xml(pacs008(&msg_id(3), &[])).header("traceparent", "00-abc-def-01").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/problem+xml"));
    let body = r.text().await.unwrap();
    assert!(body.contains("<problem xmlns=\"urn:ietf:rfc:7807\"><type>"), "{body}");
    assert!(body.contains("/error/invalidHeader</type>"), "{body}");
    assert!(body.contains("traceparent"));
    // The stream endpoint applies the same whitelist.
    let r = t.open().header("x-request-id", "1").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(t.audit().await["received_outbound"], 0);
}

#[tokio::test]
async fn a_host_with_a_port_is_refused_unless_strict_mode_is_off() {
    let t = start(|_| {}).await;
    let url = format!("{}{}", t.primary, send_path(ISPB));
    let with_port = t
        .http
        .post(&url)
        .header("content-type", "application/xml; charset=utf-8")
        .body(pacs008(&msg_id(4), &[]))
        .send()
        .await
        .unwrap();
    assert_eq!(with_port.status(), 400, "reqwest puts the port in Host");
    assert!(with_port.text().await.unwrap().contains("/error/invalidHost"));

    let lenient = start(|c| c.strict_host = false).await;
    let url = format!("{}{}", lenient.primary, send_path(ISPB));
    let r = lenient
        .http
        .post(&url)
        .header("content-type", "application/xml; charset=utf-8")
        .body(pacs008(&msg_id(5), &[]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[tokio::test]
async fn content_type_length_and_encoding_rules() {
    let t = start(|c| c.max_body_bytes = 64 * 1024).await;
    let xml = pacs008(&msg_id(6), &["E99999010202403011200ccccccccccc"]);
    let post =
        |ct: &'static str, body: Vec<u8>| t.icom(Method::POST, &send_path(ISPB)).header("content-type", ct).body(body);

    assert_eq!(post("application/xml", xml.clone().into_bytes()).send().await.unwrap().status(), 400, "no charset");
    assert_eq!(post("text/plain; charset=utf-8", xml.clone().into_bytes()).send().await.unwrap().status(), 415);
    assert_eq!(post("multipart/mixed", xml.clone().into_bytes()).send().await.unwrap().status(), 400, "no boundary");
    let r = post("application/xml; charset=utf-8", xml.clone().into_bytes())
        .header("content-encoding", "br")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let big = vec![b'x'; 65 * 1024];
    assert_eq!(post("application/xml; charset=utf-8", big).send().await.unwrap().status(), 413);

    // Whole-body gzip is fine; a gzip bomb is stopped at the limit.
    let r = post("application/xml; charset=utf-8", gzip(xml.as_bytes()))
        .header("content-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let bomb = gzip(&vec![b' '; 10 * 1024 * 1024]);
    assert!(bomb.len() < 64 * 1024);
    let r = post("application/xml; charset=utf-8", bomb).header("content-encoding", "gzip").send().await.unwrap();
    assert_eq!(r.status(), 413);
    let r = post("application/xml; charset=utf-8", b"not gzip".to_vec())
        .header("content-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // A gzipped part (instead of the whole body) is refused.
    let part = format!(
        "--b\r\nContent-Type: application/xml; charset=utf-8\r\nContent-Encoding: gzip\r\n\r\n{xml}\r\n--b--\r\n"
    );
    assert_eq!(post("multipart/mixed; boundary=b", part.into_bytes()).send().await.unwrap().status(), 400);

    // No Content-Length and no Transfer-Encoding: 411.
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: icom\r\nContent-Type: application/xml; charset=utf-8\r\nConnection: close\r\n\r\n",
        send_path(ISPB)
    );
    let (status, _, body) = raw(t.sim.primary, head.as_bytes()).await;
    assert_eq!(status, 411);
    assert!(String::from_utf8_lossy(&body).contains("/error/lengthRequired"));
    // Chunked is fine.
    let seventh = pacs008(&msg_id(7), &[]);
    let chunked = format!(
        "POST {} HTTP/1.1\r\nHost: icom\r\nContent-Type: application/xml; charset=utf-8\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        send_path(ISPB),
        seventh.len(),
        seventh
    );
    let (status, head, _) = raw(t.sim.primary, chunked.as_bytes()).await;
    assert_eq!(status, 201, "{head}");
    assert!(head.to_ascii_lowercase().contains("pi-resourceid: "));
    assert_eq!(t.audit().await["received_outbound"], 2);
}

#[tokio::test]
async fn the_token_bucket_answers_429_with_retry_after_then_recovers() {
    let clock = Arc::new(ManualClock::at(SystemTime::now()));
    let c = clock.clone();
    let t = start(move |cfg| {
        cfg.buckets.primary = BucketRate::new(5.0, 2.0);
        cfg.clock = c;
    })
    .await;
    for n in 0..5 {
        assert_eq!(t.send_xml(pacs008(&msg_id(300 + n), &[])).send().await.unwrap().status(), 201);
    }
    let r = t.send_xml(pacs008(&msg_id(305), &[])).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert!(r.text().await.unwrap().contains("/error/rateLimited"));
    // pacs.002 costs 0.2: still refused with no tokens at all.
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        t.send_xml(pacs008(&msg_id(306), &[])).send().await.unwrap().status(),
        201,
        "one token back after 0.5 s"
    );
    assert_eq!(t.send_xml(pacs008(&msg_id(307), &[])).send().await.unwrap().status(), 429);
    clock.advance(Duration::from_secs(10));
    for n in 0..5 {
        assert_eq!(
            t.send_xml(pacs008(&msg_id(310 + n), &[])).send().await.unwrap().status(),
            201,
            "refilled to capacity"
        );
    }
    let audit = t.audit().await;
    assert_eq!((audit["rejected_rate"].as_u64(), audit["rejected_429"].as_u64()), (Some(2), Some(2)));
    assert_eq!(audit["received_outbound"], 11);
}

#[tokio::test]
async fn the_secondary_bucket_follows_the_brasilia_clock() {
    // 2024-03-01 10:00 UTC = 07:00 in Brasília (night rate), then 11:00 UTC = 08:00 (day rate).
    let night = UNIX_EPOCH + Duration::from_secs(1_709_287_200);
    let clock = Arc::new(ManualClock::at(night));
    let c = clock.clone();
    let t = start(move |cfg| {
        cfg.buckets.secondary_day = BucketRate::new(2.0, 0.001);
        cfg.buckets.secondary_night = BucketRate::new(4.0, 0.001);
        cfg.clock = c;
    })
    .await;
    let send = |n: u64| {
        t.http
            .post(format!("{}{}", t.secondary, send_path(ISPB)))
            .header("host", "icom")
            .header("content-type", "application/xml; charset=utf-8")
            .body(pacs008(&msg_id(400 + n), &[]))
            .send()
    };
    let statuses = |v: Vec<reqwest::Response>| v.iter().map(|r| r.status().as_u16()).collect::<Vec<_>>();
    let mut night_results = Vec::new();
    for n in 0..5 {
        night_results.push(send(n).await.unwrap());
    }
    assert_eq!(statuses(night_results), [201, 201, 201, 201, 429]);
    clock.set(night + Duration::from_secs(3_600));
    t.control_get("/sim/audit").await;
    let r = t.http.post(format!("{}/sim/reset", t.control)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut day_results = Vec::new();
    for n in 10..13 {
        day_results.push(send(n).await.unwrap());
    }
    assert_eq!(statuses(day_results), [201, 201, 429]);
    let audit: Value = t.audit_of(ISPB, "csm").await;
    assert_eq!(audit["rejected_rate"], 1);
}

#[tokio::test]
async fn a_participant_that_is_not_served_is_forbidden() {
    let t = start(|_| {}).await;
    let r = t
        .icom(Method::POST, &send_path("12345678"))
        .header("content-type", "application/xml; charset=utf-8")
        .body(pacs008(&msg_id(8), &[]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("/error/forbidden"));
}
