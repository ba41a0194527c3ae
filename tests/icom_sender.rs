//! The send port on the real client, against a raw scripted server: the
//! connector opens one connection per sender, every ICOM answer maps to the
//! port's reply, an oversized batch is refused before the wire, and an
//! unconfigured channel fails as transport.

mod support;

use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;

use cabine::icom::{EndpointSettings, IcomChannels, IcomEndpoint, WireLimits, tls};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{SendConnector, SendRefused, SendReply};
use support::raw_http::{Step, response, serve};

fn channels(base_url: String, limits: WireLimits) -> IcomChannels {
    cabine::install_crypto_provider();
    let settings = EndpointSettings {
        channel: ChannelId::Cpm,
        ispb: "99999010".parse().unwrap(),
        base_url,
        limits,
        long_poll_timeout: Duration::from_secs(2),
        send_timeout: Duration::from_millis(500),
        host_without_port: true,
    };
    IcomChannels::from_endpoints([IcomEndpoint::new(settings, tls::plain_config().unwrap()).unwrap()])
}

fn xml(id: &str) -> Bytes {
    Bytes::from(format!("<Envelope><Document><GrpHdr><MsgId>{id}</MsgId></GrpHdr></Document></Envelope>"))
}

#[tokio::test]
async fn every_icom_answer_maps_to_the_send_port_on_one_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let problem = br#"<problem xmlns="urn:ietf:rfc:7807"><type>x/error/schema</type><title>bad</title></problem>"#;
    let script = vec![
        response("201 Created", &[("PI-ResourceId", "R1,R2")], b""),
        response("429 Too Many Requests", &[("Retry-After", "2")], b""),
        response("400 Bad Request", &[], problem),
        response("403 Forbidden", &[], b""),
        response("503 Service Unavailable", &[], b""),
        Step::Hang,
    ];
    let server = tokio::spawn(serve(listener, script));
    let limits = WireLimits { max_body_bytes: 4096, ..WireLimits::ICOM };
    let mut sender = channels(base, limits).sender(ChannelId::Cpm);
    let two = [xml("M1"), xml("M2")];
    let accepted = SendReply::Accepted { resource_ids: vec!["R1".into(), "R2".into()] };
    assert_eq!(sender.send(&two).await, Ok(accepted));
    let limited = SendReply::RateLimited { retry_after: Some(Duration::from_secs(2)) };
    assert_eq!(sender.send(&two[..1]).await, Ok(limited));
    let rejected = SendReply::Rejected { status: 400, reason: "x/error/schema: bad".into() };
    assert_eq!(sender.send(&two[..1]).await, Ok(rejected));
    let forbidden = SendReply::Rejected { status: 403, reason: "HTTP 403".into() };
    assert_eq!(sender.send(&two[..1]).await, Ok(forbidden));
    assert_eq!(sender.send(&two[..1]).await, Ok(SendReply::ServerError { status: 503 }));
    let big = Bytes::from(vec![b'x'; 8192]);
    assert!(matches!(sender.send(&[big]).await, Err(SendRefused::TooLarge(_))), "refused before the wire");
    assert!(matches!(sender.send(&[]).await, Err(SendRefused::Unusable(_))));
    assert_eq!(sender.send(&two[..1]).await, Ok(SendReply::Timeout));
    drop(sender);
    let (requests, connections) = server.await.unwrap();
    assert_eq!((requests.len(), connections), (6, 1), "one connection, one request at a time");
    assert!(requests[0].request_line.starts_with("POST /api/v1/in/99999010/msgs"));
}

#[tokio::test]
async fn a_channel_without_an_endpoint_fails_as_transport() {
    let mut sender = channels("http://127.0.0.1:9".into(), WireLimits::ICOM).sender(ChannelId::Csm);
    let reply = sender.send(&[xml("M1")]).await.unwrap();
    assert!(matches!(&reply, SendReply::Transport(e) if e.contains("csm")), "{reply:?}");
}
