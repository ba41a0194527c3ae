//! Conformance, what the client reads: a batch read independently first (raw
//! reqwest with the client's own Accept / Accept-Encoding, gunzipped with
//! flate2, split with multer) and then, after the stream expired and the batch
//! was re-queued, through the REAL client — the same ResourceIds and the same
//! bytes; a malformed message arrives as a malformed `InboundMessage` with its
//! raw bytes intact; gzip responses decode.

mod conformance_support;
mod sim_support;

use std::time::Duration;

use bytes::Bytes;
use cabine_actors::ports::CloseOutcome;
use conformance_support::{messages, rig, wait_audit};

/// (PI-ResourceId, bytes) of each part of a multipart/mixed body, with multer.
async fn parts(body: Bytes, content_type: &str) -> Vec<(String, Bytes)> {
    let boundary = content_type.split("boundary=").nth(1).expect("boundary").trim_matches('"').to_owned();
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut out = Vec::new();
    while let Some(field) = multipart.next_field().await.expect("well-formed multipart") {
        let id = field.headers().get("pi-resourceid").expect("PI-ResourceId per part").to_str().unwrap().to_owned();
        out.push((id, field.bytes().await.unwrap()));
    }
    out
}

#[tokio::test]
async fn a_malformed_message_keeps_its_raw_bytes_and_gzip_responses_decode() {
    let r = rig(|c| c.stream_idle = Duration::from_millis(300)).await;
    let mut injected = r.inject(2, "pacs008").await.0;
    injected.extend(r.inject(1, "malformed").await.0);
    injected.extend(r.inject(2, "pacs002").await.0);

    // Independently, with the very headers the client sends on a read.
    let raw = r.t.open().header("accept-encoding", "gzip").send().await.unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(raw.headers()["content-encoding"], "gzip", "Accept-Encoding: gzip gets a gzipped body");
    let content_type = raw.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("multipart/mixed; boundary="), "{content_type}");
    let reference = parts(sim_support::gunzip(&raw.bytes().await.unwrap()), &content_type).await;
    assert_eq!(reference.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), injected);

    // Left unacknowledged, the stream expires and the batch is re-queued: now the client reads it.
    wait_audit(&r, Duration::from_secs(3), "the raw stream expires", |a| a["expired_streams"] == 1).await;
    let mut client = r.client();
    let (batch, pull_next) = messages(client.start().await);
    assert_eq!(batch.len(), 5);
    for (m, (id, bytes)) in batch.iter().zip(&reference) {
        assert_eq!((&m.resource_id, &m.raw), (id, bytes), "same ResourceId, same bytes");
    }
    let malformed = &batch[2];
    let reason = malformed.malformed.as_deref().expect("the cut message is marked malformed");
    assert!(!reason.is_empty());
    assert_eq!(malformed.meta, Default::default(), "no envelope fields from a message that cannot be read");
    assert!(malformed.raw.starts_with(b"<?xml") && !malformed.raw.ends_with(b"</Envelope>"));
    for m in batch.iter().take(2).chain(&batch[3..]) {
        assert_eq!(m.malformed, None, "{m:?}");
    }
    assert_eq!(batch[3].meta.msg_type(), "pacs.002");

    assert_eq!(client.close(&pull_next).await, CloseOutcome::Closed, "a malformed message is acknowledged too");
    let audit = r.audit().await;
    assert_eq!((audit["acknowledged"].as_u64(), audit["redelivered"].as_u64()), (Some(5), Some(5)));
}
