//! The fuzzing entry point of the simulator's send parser (`POST
//! /api/v1/in/{ispb}/msgs`): framing headers, gunzip, multipart split and
//! envelope reading. Whatever the bytes, the simulator answers with a problem
//! or a bounded list of messages — it never panics, as the SPI never would.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, header};

use super::body::{self, BodyLimits};
use super::bucket::cost_of;
use super::envelope;

/// `data` is the Content-Type on its first line, the Content-Encoding on the
/// second (empty: none), then the body.
pub fn fuzz_entry(data: &[u8]) {
    let limits = BodyLimits { max_body_bytes: 256 * 1024, max_parts: 10 };
    let (content_type, rest) = line(data);
    let (encoding, body) = line(rest);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    for (name, value) in [(header::CONTENT_TYPE, content_type), (header::CONTENT_ENCODING, encoding)] {
        if !value.is_empty()
            && let Ok(v) = HeaderValue::from_bytes(value)
        {
            headers.insert(name, v);
        }
    }
    let parts = body::framing(&headers, limits).and_then(|framing| {
        futures::executor::block_on(body::messages(Bytes::copy_from_slice(body), &framing, limits))
    });
    match parts {
        Err(e) => {
            let _ = (e.status(), e.problem(), e.to_string());
        }
        Ok(parts) => {
            assert!((1..=limits.max_parts).contains(&parts.len()), "1..=max_parts messages");
            for part in &parts {
                assert!(!part.is_empty() && part.len() <= limits.max_body_bytes, "a message is 1..=limit bytes");
                let env = envelope::read(part);
                let _ = cost_of(env.as_ref().ok().map(|e| e.msg_def.as_str()));
                if let Ok(env) = env {
                    let _ = (env.is_credit_transfer(), env.dedup_id());
                }
            }
        }
    }
}

fn line(data: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b'\n', data) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}
