//! Conformance, the simulator's strictness where the client cannot go wrong
//! (so raw requests play the misbehaving client): a header outside the
//! whitelist, a Host with its port, a single XML without charset, a gzip bomb
//! and an 11-part body are refused with their RFC 7807 problem and store
//! nothing — while the REAL client's requests, under the same strict checks
//! (Host without port enforced), are accepted; and the Host rule is a setting
//! on both sides (`icom.host_without_port`, the simulator's `strict_host`).

mod conformance_support;
mod sim_support;

use cabine::icom::{IcomChannels, SendOutcome};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::PollOutcome;
use conformance_support::{end_to_end_id, pacs008, rig};
use reqwest::Method;
use sim_support::{ISPB, TestSim, gzip, msg_id, send_path};

/// A POST with exactly the client's header set (Host without port) plus `extra`.
fn client_like_post(t: &TestSim, content_type: &str, body: Vec<u8>, extra: &[(&str, &str)]) -> reqwest::RequestBuilder {
    let mut req = t
        .http
        .request(Method::POST, format!("{}{}", t.primary, send_path(ISPB)))
        .header("host", "127.0.0.1")
        .header("accept", "multipart/mixed")
        .header("accept-encoding", "gzip")
        .header("user-agent", format!("cabine/{}", cabine::VERSION))
        .header("content-type", content_type)
        .header("content-encoding", "gzip")
        .body(body);
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req
}

/// Status and problem `type` of a refusal.
async fn refusal(req: reqwest::RequestBuilder) -> (u16, String) {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert!(body.contains("<problem xmlns=\"urn:ietf:rfc:7807\">"), "{body}");
    let kind = body.split("<type>").nth(1).and_then(|s| s.split("</type>").next()).unwrap_or("").to_owned();
    (status, kind)
}

const XML: &str = "application/xml; charset=utf-8";

#[tokio::test]
async fn the_whitelist_and_the_host_rule_refuse_others_and_pass_the_client() {
    let r = rig(|_| {}).await;
    let t = &r.t;
    assert!(t.sim.tls.is_none());
    let message = || gzip(sim_support::pacs008(&msg_id(800), &[&end_to_end_id(800)]).as_bytes());

    let traced = client_like_post(t, XML, message(), &[("traceparent", "00-0af7651916cd43dd8448eb211c80319c-01")]);
    assert_eq!(refusal(traced).await, (400, format!("{}invalidHeader", cabine::sim::PROBLEM_TYPE_BASE)));
    let read_traced = t.open().header("x-request-id", "abc");
    assert_eq!(refusal(read_traced).await.0, 400, "on stream reads too");

    // Host with the port, written as most HTTP clients would.
    let request = format!(
        "GET /api/v1/out/{ISPB}/stream/start HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
        t.sim.primary.port()
    );
    let (status, _, body) = sim_support::raw(t.sim.primary, request.as_bytes()).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("/error/invalidHost"));

    let no_charset = client_like_post(t, "application/xml", message(), &[]);
    assert_eq!(refusal(no_charset).await.0, 400);
    let audit = r.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["open_streams"].as_u64()), (Some(0), Some(0)));

    // The same message without the extra header is stored; so is the real client's.
    let plain = client_like_post(t, XML, message(), &[]).send().await.unwrap();
    assert_eq!(plain.status(), 201);
    let mut client = r.client();
    let sent = client.send(&[pacs008(&msg_id(801), &[&end_to_end_id(801)])]).await.unwrap();
    assert!(matches!(sent, SendOutcome::Accepted { .. }), "{sent:?}");
    let (answers, pull_next) = conformance_support::messages(client.start().await);
    assert_eq!(answers.iter().map(|m| m.meta.msg_type()).collect::<Vec<_>>(), ["pacs.002", "pacs.002"]);
    assert_eq!(client.close(&pull_next).await, cabine_actors::ports::CloseOutcome::Closed);
}

/// The client with `icom.host_without_port = false` against a simulator with `strict_host`.
async fn client_with_port_against(strict_host: bool) -> (PollOutcome, SendOutcome) {
    let t = sim_support::start(|c| {
        c.hold = std::time::Duration::ZERO;
        c.strict_host = strict_host;
    })
    .await;
    let mut overrides = conformance_support::channel_overrides(&t.primary, ISPB, conformance_support::CLIENT_TIMEOUT);
    overrides.push(("CABINE__ICOM__HOST_WITHOUT_PORT", "false".to_owned()));
    let channels = IcomChannels::from_settings(&conformance_support::settings(&overrides)).unwrap();
    let mut client = channels.client(ChannelId::Cpm).unwrap();
    let read = client.start().await;
    let sent = client.send(&[pacs008(&msg_id(850), &[&end_to_end_id(850)])]).await.unwrap();
    (read, sent)
}

#[tokio::test]
async fn host_with_port_is_a_setting_both_sides_honour() {
    let (read, sent) = client_with_port_against(true).await;
    let PollOutcome::Rejected { status: 400, problem: Some(problem) } = read else { panic!("{read:?}") };
    assert!(problem.contains("/error/invalidHost"), "{problem}");
    let SendOutcome::Rejected { status: 400, problem: Some(p) } = sent else { panic!("{sent:?}") };
    assert!(p.kind.as_deref().is_some_and(|k| k.ends_with("/error/invalidHost")), "{p:?}");

    let (read, sent) = client_with_port_against(false).await;
    assert!(matches!(read, PollOutcome::Empty { .. }), "`--allow-host-port` admits it: {read:?}");
    assert!(matches!(sent, SendOutcome::Accepted { .. }), "{sent:?}");
}

#[tokio::test]
async fn a_gzip_bomb_and_an_eleven_part_body_are_refused() {
    let r = rig(|_| {}).await;
    let t = &r.t;
    // 16 MiB of spaces in ~16 KiB of gzip: refused once inflating passes 5 MiB.
    let bomb = gzip(&vec![b' '; 16 * 1024 * 1024]);
    assert!(bomb.len() < 64 * 1024);
    let (status, kind) = refusal(client_like_post(t, XML, bomb, &[])).await;
    assert_eq!((status, kind.ends_with("/payloadTooLarge")), (413, true), "{kind}");

    let eleven: Vec<String> = (900..911).map(|n| sim_support::pacs008(&msg_id(n), &[&end_to_end_id(n)])).collect();
    let body = gzip(sim_support::multipart("b0undary", &eleven).as_bytes());
    let (status, kind) = refusal(client_like_post(t, "multipart/mixed; boundary=b0undary", body, &[])).await;
    assert_eq!((status, kind.ends_with("/tooManyParts")), (413, true), "{kind}");

    // Gzipped parts inside a plain body: the whole body must be gzipped, not the parts.
    let part = "--b1\r\nContent-Type: application/xml; charset=utf-8\r\nContent-Encoding: gzip\r\n\r\nzz\r\n--b1--\r\n";
    let req = t
        .icom(Method::POST, &send_path(ISPB))
        .header("content-type", "multipart/mixed; boundary=b1")
        .body(part.to_owned());
    assert_eq!(refusal(req).await.0, 400);
    let audit = r.audit().await;
    assert_eq!((audit["received_outbound"].as_u64(), audit["refused_sends"].as_u64()), (Some(0), Some(3)));

    // Ten is the limit, and the sim takes ten.
    let ten = gzip(sim_support::multipart("b0undary", &eleven[..10]).as_bytes());
    let ok = client_like_post(t, "multipart/mixed; boundary=b0undary", ten, &[]).send().await.unwrap();
    assert_eq!(ok.status(), 201);
    assert_eq!(ok.headers()["pi-resourceid"].to_str().unwrap().split(',').count(), 10);
}
