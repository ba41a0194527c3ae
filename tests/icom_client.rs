//! The ICOM client on the wire: the exact header set of every operation
//! (Host without its port, nothing outside the whitelist), one TCP connection
//! per client, and the typed outcome of each kind of response, against a raw
//! scripted HTTP server.

mod support;

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;

use cabine::icom::headers::is_whitelisted;
use cabine::icom::multipart::{self, Part};
use cabine::icom::{EndpointSettings, IcomEndpoint, SendOutcome, WireError, WireLimits, gzip, tls};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{CloseOutcome, PollOutcome};
use support::raw_http::{Step, response, serve};

const PULL: &str = "/api/v1/out/99999010/stream/s1";

fn example(name: &str) -> Bytes {
    Bytes::from(std::fs::read(format!("{}/tests/data/spi/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap())
}

fn endpoint(base_url: String, limits: WireLimits, timeout: Duration) -> Arc<IcomEndpoint> {
    cabine::install_crypto_provider();
    let settings = EndpointSettings {
        channel: ChannelId::Cpm,
        ispb: "99999010".parse().unwrap(),
        base_url,
        limits,
        long_poll_timeout: timeout,
        send_timeout: timeout,
        host_without_port: true,
    };
    Arc::new(IcomEndpoint::new(settings, tls::plain_config().unwrap()).unwrap())
}

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    (listener, url)
}

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut out).unwrap();
    out
}

fn multer_bodies(body: Vec<u8>, boundary: &str) -> Vec<Bytes> {
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(body)) });
    let mut parts = multer::Multipart::new(stream, boundary);
    futures::executor::block_on(async {
        let mut out = Vec::new();
        while let Some(field) = parts.next_field().await.unwrap() {
            assert_eq!(field.headers().get("content-type").unwrap(), "application/xml; charset=utf-8");
            out.push(field.bytes().await.unwrap());
        }
        out
    })
}

fn expected(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let ua = format!("cabine/{}", cabine::VERSION);
    let mut all: Vec<(String, String)> = [
        ("accept", "multipart/mixed"),
        ("accept-encoding", "gzip"),
        ("host", "127.0.0.1"),
        ("user-agent", ua.as_str()),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    all.sort();
    all
}

#[tokio::test]
async fn exact_headers_on_the_wire_for_every_operation() {
    let (listener, base) = listener().await;
    let batch = [example("pacs.008_END_1_msg.xml"), example("pacs.008_CONTA_1_msg.xml")];
    let parts: Vec<Part> = batch
        .iter()
        .enumerate()
        .map(|(i, b)| Part { resource_id: Some(format!("R{i}")), content_type: None, body: b.clone() })
        .collect();
    let (boundary, body) = multipart::build_fresh(&parts, &WireLimits::ICOM).unwrap();
    let ct = multipart::content_type(&boundary);
    let script = vec![
        response("204 No Content", &[("PI-Pull-Next", PULL)], b""),
        response(
            "200 OK",
            &[("PI-Pull-Next", PULL), ("Content-Type", &ct), ("Content-Encoding", "gzip")],
            &gzip::compress(&body).unwrap(),
        ),
        response("201 Created", &[("PI-ResourceId", "X1")], b""),
        response("201 Created", &[("PI-ResourceId", "X2,X3,X4")], b""),
        response("200 OK", &[], b""),
    ];
    let server = tokio::spawn(serve(listener, script));
    let mut client = endpoint(base, WireLimits::ICOM, Duration::from_secs(5)).connect().unwrap();

    assert_eq!(client.start().await, PollOutcome::Empty { pull_next: PULL.into() });
    let PollOutcome::Messages { batch: got, pull_next } = client.next(PULL).await else { panic!("a batch") };
    assert_eq!(pull_next, PULL);
    assert_eq!(got.iter().map(|m| m.resource_id.as_str()).collect::<Vec<_>>(), ["R0", "R1"]);
    assert_eq!(got[1].raw, batch[1]);
    assert_eq!(client.send(&batch[..1]).await.unwrap(), SendOutcome::Accepted { resource_ids: vec!["X1".into()] });
    let three = [batch[0].clone(), batch[1].clone(), example("pacs.002_PSP_1_msg.xml")];
    let ids = vec!["X2".to_owned(), "X3".into(), "X4".into()];
    assert_eq!(client.send(&three).await.unwrap(), SendOutcome::Accepted { resource_ids: ids });
    assert_eq!(client.close(PULL).await, CloseOutcome::Closed);

    let (requests, connections) = server.await.unwrap();
    assert_eq!(connections, 1, "one client value, one TCP connection");
    let lines: Vec<&str> = requests.iter().map(|r| r.request_line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "GET /api/v1/out/99999010/stream/start HTTP/1.1",
            "GET /api/v1/out/99999010/stream/s1 HTTP/1.1",
            "POST /api/v1/in/99999010/msgs HTTP/1.1",
            "POST /api/v1/in/99999010/msgs HTTP/1.1",
            "DELETE /api/v1/out/99999010/stream/s1 HTTP/1.1",
        ]
    );
    for r in &requests {
        assert!(r.headers.iter().all(|(n, _)| is_whitelisted(n)), "{:?}", r.headers);
    }
    let sorted = |i: usize| requests[i].header_map().into_iter().collect::<Vec<_>>();
    assert_eq!(sorted(0), expected(&[]));
    assert_eq!(sorted(1), expected(&[]));
    assert_eq!(sorted(4), expected(&[]));

    let single = &requests[2];
    let len = single.body.len().to_string();
    assert_eq!(
        sorted(2),
        expected(&[
            ("content-encoding", "gzip"),
            ("content-length", &len),
            ("content-type", "application/xml; charset=utf-8")
        ])
    );
    assert_eq!(gunzip(&single.body), batch[0], "the whole single body is gzipped");

    let multi = &requests[3];
    let content_type = multi.header_map()["content-type"].clone();
    let boundary = content_type.strip_prefix("multipart/mixed; boundary=").expect("a multipart content type");
    let len = multi.body.len().to_string();
    assert_eq!(
        sorted(3),
        expected(&[("content-encoding", "gzip"), ("content-length", &len), ("content-type", &content_type)])
    );
    assert_eq!(multer_bodies(gunzip(&multi.body), boundary), three.to_vec(), "multer reads our multipart");
}

async fn one_poll(steps: Vec<Step>, limits: WireLimits, timeout: Duration) -> PollOutcome {
    let (listener, base) = listener().await;
    let server = tokio::spawn(serve(listener, steps));
    let outcome = endpoint(base, limits, timeout).connect().unwrap().next(PULL).await;
    server.abort();
    outcome
}

#[tokio::test]
async fn typed_outcomes_of_stream_reads() {
    let l = WireLimits::ICOM;
    let t = Duration::from_secs(5);
    let xml = example("pacs.002_SPI_1_msg.xml");
    let single = response(
        "200 OK",
        &[("PI-Pull-Next", PULL), ("PI-ResourceId", "RS1"), ("Content-Type", "application/xml; charset=utf-8")],
        &xml,
    );
    let PollOutcome::Messages { batch, .. } = one_poll(vec![single], l, t).await else { panic!("one message") };
    assert_eq!((batch.len(), batch[0].resource_id.as_str()), (1, "RS1"));
    assert_eq!(batch[0].meta.msg_def.as_deref(), Some("pacs.002.spi.1.17"));

    let retry = response("429 Too Many Requests", &[("Retry-After", "3")], b"");
    assert_eq!(
        one_poll(vec![retry], l, t).await,
        PollOutcome::RateLimited { retry_after: Some(Duration::from_secs(3)) }
    );
    assert_eq!(one_poll(vec![response("410 Gone", &[], b"")], l, t).await, PollOutcome::UnknownStream);
    assert_eq!(
        one_poll(vec![response("503 Service Unavailable", &[], b"")], l, t).await,
        PollOutcome::ServerError { status: 503 }
    );
    let problem =
        br#"<problem xmlns="urn:ietf:rfc:7807"><type>x/error/invalidHeader</type><status>400</status></problem>"#;
    let PollOutcome::Rejected { status: 400, problem: Some(p) } =
        one_poll(vec![response("400 Bad Request", &[], problem)], l, t).await
    else {
        panic!("a rejection with its problem")
    };
    assert!(p.contains("invalidHeader"));
}

#[tokio::test]
async fn oversized_bodies_and_silence_are_bounded() {
    let small = WireLimits { max_body_bytes: 4096, ..WireLimits::ICOM };
    let big = response("200 OK", &[("PI-Pull-Next", PULL), ("PI-ResourceId", "R")], &vec![b'x'; 64 * 1024]);
    // Framing fine, body over the limit: one malformed message with the bytes read (bounded), acknowledged later.
    let outcome = one_poll(vec![big], small, Duration::from_secs(5)).await;
    let PollOutcome::Messages { batch, pull_next } = outcome else { panic!("{outcome:?}") };
    assert_eq!((batch.len(), batch[0].resource_id.as_str(), pull_next.as_str()), (1, "R", PULL));
    assert_eq!(batch[0].raw.len(), small.max_wire_bytes(), "reading stopped at the cap");
    assert!(batch[0].malformed.as_deref().is_some_and(|r| r.contains("max_body_bytes")));

    let bomb = gzip::compress(&vec![b'<'; 1024 * 1024]).unwrap();
    let gz = response("200 OK", &[("PI-Pull-Next", PULL), ("PI-ResourceId", "R"), ("Content-Encoding", "gzip")], &bomb);
    let outcome = one_poll(vec![gz], small, Duration::from_secs(5)).await;
    let PollOutcome::Messages { batch, .. } = outcome else { panic!("{outcome:?}") };
    assert_eq!(batch[0].raw, Bytes::from(bomb), "the gzip bytes as received");
    let reason = batch[0].malformed.as_deref().unwrap_or_default();
    assert!(reason.starts_with(&WireError::BodyTooLarge { max: 4096 }.to_string()), "{reason}");

    let started = std::time::Instant::now();
    assert_eq!(one_poll(vec![Step::Hang], small, Duration::from_millis(300)).await, PollOutcome::Timeout);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn transport_failures_and_foreign_pull_next() {
    let (listener, base) = listener().await;
    drop(listener);
    let endpoint = endpoint(base, WireLimits::ICOM, Duration::from_secs(2));
    let mut client = endpoint.connect().unwrap();
    assert!(matches!(client.start().await, PollOutcome::Transport(_)), "connection refused");
    let foreign = client.next("http://elsewhere.example/api/v1/out/99999010/stream/x").await;
    assert!(matches!(&foreign, PollOutcome::Transport(t) if t.contains("leaves")), "{foreign:?}");
    assert!(matches!(client.close(PULL).await, CloseOutcome::Failed(_)));
    assert!(matches!(client.send(&[Bytes::from_static(b"<x/>")]).await, Ok(SendOutcome::Transport(_))));
}

#[tokio::test]
async fn unusable_batches_are_refused_before_sending() {
    let (listener, base) = listener().await;
    let server = tokio::spawn(serve(listener, vec![response("201 Created", &[], b"")]));
    let mut client = endpoint(base, WireLimits::ICOM, Duration::from_secs(2)).connect().unwrap();
    let eleven: Vec<Bytes> = (0..11).map(|i| Bytes::from(format!("<m{i}/>"))).collect();
    assert_eq!(client.send(&eleven).await, Err(WireError::BatchSize { len: 11, max: 10 }));
    assert_eq!(client.send(&[]).await, Err(WireError::BatchSize { len: 0, max: 10 }));
    let huge = Bytes::from(vec![b'x'; WireLimits::ICOM.max_body_bytes + 1]);
    assert_eq!(client.send(&[huge]).await, Err(WireError::BodyTooLarge { max: WireLimits::ICOM.max_body_bytes }));
    assert_eq!(client.send(&eleven[..10]).await, Ok(SendOutcome::Accepted { resource_ids: vec![] }));
    let (requests, _) = server.await.unwrap();
    assert_eq!(requests.len(), 1, "only the valid batch reached the wire");
}

#[tokio::test]
async fn send_outcomes() {
    let (listener, base) = listener().await;
    let problem = br#"<problem xmlns="urn:ietf:rfc:7807"><type>x/error/invalidHeader</type></problem>"#;
    let script = vec![
        response("429 Too Many Requests", &[("Retry-After", "1")], b""),
        response("400 Bad Request", &[("Content-Type", "application/problem+xml")], problem),
        response("500 Internal Server Error", &[], b""),
        Step::Hang,
    ];
    let server = tokio::spawn(serve(listener, script));
    let endpoint = endpoint(base, WireLimits::ICOM, Duration::from_millis(500));
    let mut client = endpoint.connect().unwrap();
    let msg = [example("pacs.008_END_1_msg.xml")];
    assert_eq!(
        client.send(&msg).await.unwrap(),
        SendOutcome::RateLimited { retry_after: Some(Duration::from_secs(1)) }
    );
    let SendOutcome::Rejected { status: 400, problem: Some(p) } = client.send(&msg).await.unwrap() else {
        panic!("a rejection")
    };
    assert_eq!(p.kind.as_deref(), Some("x/error/invalidHeader"));
    assert_eq!(client.send(&msg).await.unwrap(), SendOutcome::ServerError { status: 500 });
    assert_eq!(client.send(&msg).await.unwrap(), SendOutcome::Timeout);
    server.abort();
}

#[test]
fn requests_and_limit_hits_are_counted() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let (listener, base) = listener().await;
            let oversized = vec![b'x'; 8192];
            let script = vec![
                response("204 No Content", &[("PI-Pull-Next", PULL)], b""),
                response("200 OK", &[("PI-Pull-Next", PULL), ("PI-ResourceId", "R")], &oversized),
            ];
            let server = tokio::spawn(serve(listener, script));
            let small = WireLimits { max_body_bytes: 4096, ..WireLimits::ICOM };
            let mut client = endpoint(base, small, Duration::from_secs(5)).connect().unwrap();
            assert!(matches!(client.start().await, PollOutcome::Empty { .. }));
            assert!(matches!(client.next(PULL).await, PollOutcome::Messages { .. }));
            server.abort();
        })
    });
    let text = handle.render();
    for line in [
        r#"cabine_icom_requests_total{channel="cpm",op="start",outcome="empty"} 1"#,
        r#"cabine_icom_requests_total{channel="cpm",op="next",outcome="messages"} 1"#,
        r#"cabine_icom_wire_limit_total{limit="max_body_bytes"} 1"#,
        r#"cabine_icom_request_seconds_count{channel="cpm",op="start"} 1"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}
