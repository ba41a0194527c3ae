//! Faults set at run time through the control API — latency, 5xx (before or
//! after storing), connection resets (RST), 429s, hold, stream idle, closing
//! after each response — plus `/sim/reset` and determinism with a seed.

mod sim_support;

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use cabine::sim::ManualClock;
use reqwest::Method;
use serde_json::json;
use sim_support::{ISPB, TestSim, msg_id, pacs008, raw, read, start, start_path};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn status_of(t: &TestSim) -> u16 {
    t.open().send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn latency_is_added_and_reported() {
    let t = start(|c| c.hold = Duration::ZERO).await;
    let faults = t.faults(json!({ "latency_ms": 300, "jitter_ms": 50 })).await;
    assert_eq!(faults["cpm"]["latency_ms"], 300);
    assert_eq!(faults["csm"]["jitter_ms"], 50);
    let began = Instant::now();
    assert_eq!(status_of(&t).await, 204);
    let took = began.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    let only_csm = t.faults(json!({ "channel": "csm", "latency_ms": 0 })).await;
    assert_eq!((only_csm["cpm"]["latency_ms"].as_u64(), only_csm["csm"]["latency_ms"].as_u64()), (Some(300), Some(0)));
    let bad =
        t.http.post(format!("{}/sim/faults", t.control)).json(&json!({ "reset_ratio": 2.0 })).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let unknown = t.http.post(format!("{}/sim/faults", t.control)).json(&json!({ "nope": 1 })).send().await.unwrap();
    assert!(unknown.status().is_client_error());
}

#[tokio::test]
async fn server_errors_and_429s_are_injected() {
    let t = start(|c| c.hold = Duration::ZERO).await;
    t.faults(json!({ "error_5xx_ratio": 1.0 })).await;
    assert_eq!(status_of(&t).await, 500);
    t.faults(json!({ "error_status": 503 })).await;
    assert_eq!(status_of(&t).await, 503);
    t.faults(json!({ "error_5xx_ratio": 0.0, "status_429_ratio": 1.0 })).await;
    let r = t.open().send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    t.faults(json!({ "status_429_ratio": 0.0 })).await;
    assert_eq!(status_of(&t).await, 204);
    let audit = t.audit().await;
    assert_eq!((audit["fault_5xx"].as_u64(), audit["fault_429"].as_u64()), (Some(2), Some(1)));
    assert_eq!(audit["rejected_429"], 1);
    assert_eq!(audit["max_open_streams"], 1, "faulted requests opened nothing");
}

#[tokio::test]
async fn a_5xx_after_storing_means_maybe_stored() {
    let t = start(|_| {}).await;
    t.faults(json!({ "error_5xx_ratio": 1.0, "store_before_5xx": true })).await;
    let body = pacs008(&msg_id(900), &["E99999010202403011200ddddddddddd"]);
    assert_eq!(t.send_xml(body.clone()).send().await.unwrap().status(), 500);
    t.faults(json!({ "error_5xx_ratio": 0.0 })).await;
    assert_eq!(t.send_xml(body).send().await.unwrap().status(), 201, "the resend");
    let answers = read(t.open()).await;
    assert_eq!(answers.messages.len(), 2);
    assert!(answers.messages[0].1.contains("<TxSts>ACSP</TxSts>"));
    assert!(answers.messages[1].1.contains("<RjctgPtyRsn>AM05</RjctgPtyRsn>"), "the resend is a duplicate");
    assert_eq!(t.audit().await["duplicates_outbound"], 1);
}

#[tokio::test]
async fn a_reset_fault_drops_the_connection_with_an_rst() {
    let t = start(|c| c.hold = Duration::ZERO).await;
    t.faults(json!({ "reset_ratio": 1.0 })).await;
    let err = t.open().send().await.unwrap_err();
    assert!(err.is_request() || err.is_connect(), "{err:?}");
    let mut tcp = tokio::net::TcpStream::connect(t.sim.primary).await.unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: icom\r\n\r\n", start_path(ISPB));
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await.unwrap();
    assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
    assert!(buf.is_empty());
    let audit = t.audit().await;
    assert_eq!(audit["fault_resets"], 2);
    assert_eq!(audit["in_flight"], 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(t.audit().await["tcp_connections"], 0);
}

#[tokio::test]
async fn close_after_each_response_closes_the_connection() {
    let t = start(|c| c.hold = Duration::ZERO).await;
    t.faults(json!({ "close_after_response": true })).await;
    let req = format!("GET {} HTTP/1.1\r\nHost: icom\r\n\r\n", start_path(ISPB));
    let (status, head, _) = raw(t.sim.primary, req.as_bytes()).await;
    assert_eq!(status, 204);
    assert!(head.to_ascii_lowercase().contains("connection: close"), "{head}");
}

#[tokio::test]
async fn hold_and_stream_idle_change_at_run_time() {
    let t = start(|c| c.hold = Duration::from_secs(5)).await;
    t.faults(json!({ "hold_ms": 0, "stream_idle_ms": 200 })).await;
    let began = Instant::now();
    let r = read(t.open()).await;
    assert_eq!(r.status, 204);
    assert!(began.elapsed() < Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(read(t.next(r.pull_next())).await.status, 404, "expired after 200 ms idle");
    assert_eq!(t.audit().await["expired_streams"], 1);
}

#[tokio::test]
async fn reset_brings_back_a_fresh_simulator() {
    let t = start(|c| c.hold = Duration::ZERO).await;
    t.inject(5, "pacs008").await;
    t.faults(json!({ "latency_ms": 100 })).await;
    let r = read(t.open()).await;
    assert_eq!(r.messages.len(), 5);
    let r = t.http.post(format!("{}/sim/reset", t.control)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let audit = t.audit().await;
    for key in ["open_streams", "max_open_streams", "injected", "delivered", "pending", "unacknowledged"] {
        assert_eq!(audit[key], 0, "{key}");
    }
    assert_eq!(t.control_get("/sim/faults").await["cpm"]["latency_ms"], 0);
    assert_eq!(read(t.next(r_pull(&t).await.as_str())).await.status, 204);
}

async fn r_pull(t: &TestSim) -> String {
    read(t.open()).await.pull_next().to_owned()
}

#[tokio::test]
async fn the_same_seed_and_clock_give_the_same_messages() {
    let clock = Arc::new(ManualClock::at(UNIX_EPOCH + Duration::from_secs(1_709_296_496)));
    let run = |seed: u64| {
        let c = clock.clone();
        async move {
            let t = start(move |cfg| {
                cfg.seed = Some(seed);
                cfg.clock = c;
            })
            .await;
            let ids = t.inject(10, "pacs008").await;
            let batch = read(t.open()).await;
            assert_eq!(batch.ids(), ids);
            batch.messages
        }
    };
    let a = run(7).await;
    let b = run(7).await;
    assert_eq!(a, b, "same ResourceIds and bytes");
    let c = run(8).await;
    assert_ne!(a, c);
    let e2e_of = |xml: &str| xml.split("<EndToEndId>").nth(1).unwrap()[..32].to_owned();
    assert!(e2e_of(&a[0].1)[9..21].eq("202403011234"), "yyyyMMddHHmm from the clock: {}", e2e_of(&a[0].1));
}

#[tokio::test]
async fn unused_methods_on_the_control_api_are_refused() {
    let t = start(|_| {}).await;
    let r = t.http.post(format!("{}/sim/inject", t.control)).json(&json!({ "count": 0 })).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = t.http.post(format!("{}/sim/inject", t.control)).json(&json!({ "ispb": "12345678" })).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = t.http.post(format!("{}/sim/inject", t.control)).json(&json!({ "kind": "camt060" })).send().await.unwrap();
    assert!(r.status().is_client_error());
    let r = t.http.request(Method::DELETE, format!("{}/sim/audit", t.control)).send().await.unwrap();
    assert_eq!(r.status(), 405);
}
