//! Turns the body of a stream read (200) into the batch the slot persists:
//! inflate (bounded) → single XML or `multipart/mixed` → one
//! [`InboundMessage`] per message, its envelope read when possible and its raw
//! bytes always kept.

use bytes::Bytes;

use cabine_actors::ports::{InboundMessage, MessageMeta};

use super::envelope;
use super::gzip;
use super::limits::{WireError, WireLimits};
use super::multipart;

/// What the response's headers say about its body.
#[derive(Clone, Copy, Debug, Default)]
pub struct BodyHead<'a> {
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    /// The response's own `PI-ResourceId` (a single-message response).
    pub resource_id: Option<&'a str>,
}

/// Inflates a body per its `Content-Encoding`, never past `max_body_bytes`.
pub fn inflate(content_encoding: Option<&str>, body: Bytes, limits: &WireLimits) -> Result<Bytes, WireError> {
    let body = match content_encoding.map(str::trim) {
        None | Some("") => body,
        Some(e) if e.eq_ignore_ascii_case("identity") => body,
        Some(e) if e.eq_ignore_ascii_case("gzip") => gzip::decompress(&body, limits.max_body_bytes)?.into(),
        Some(other) => return Err(WireError::ContentEncoding(other.to_owned())),
    };
    if body.len() > limits.max_body_bytes {
        return Err(WireError::BodyTooLarge { max: limits.max_body_bytes }.counted());
    }
    Ok(body)
}

/// Decodes a whole stream-read body into its batch (1..=max_parts messages).
pub fn decode_batch(head: BodyHead<'_>, body: Bytes, limits: &WireLimits) -> Result<Vec<InboundMessage>, WireError> {
    let body = inflate(head.content_encoding, body, limits)?;
    match head.content_type.filter(|ct| multipart::is_multipart_mixed(ct)) {
        Some(ct) => {
            let boundary = multipart::boundary_of(ct, limits)?;
            let parts = multipart::parse(&body, &boundary, limits)?;
            if parts.is_empty() {
                return Err(WireError::Multipart("no parts".into()));
            }
            parts
                .into_iter()
                .enumerate()
                .map(|(index, p)| Ok(message(resource_id(p.resource_id.as_deref(), index, limits)?, p.body)))
                .collect()
        }
        None => Ok(vec![message(resource_id(head.resource_id, 0, limits)?, body)]),
    }
}

/// A resource id is non-empty visible ASCII within the header limit.
fn resource_id(id: Option<&str>, index: usize, limits: &WireLimits) -> Result<String, WireError> {
    let id = id.map(str::trim).unwrap_or("");
    if id.len() > limits.max_header_bytes {
        return Err(WireError::HeaderTooLong { max: limits.max_header_bytes }.counted());
    }
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(WireError::MissingResourceId { index });
    }
    Ok(id.to_owned())
}

/// One message: envelope when readable, else marked malformed with its raw bytes.
pub fn message(resource_id: String, raw: Bytes) -> InboundMessage {
    match envelope::read(&raw) {
        Ok(env) => InboundMessage { resource_id, meta: MessageMeta::from(&env), raw, malformed: None },
        Err(e) => InboundMessage { resource_id, raw, meta: MessageMeta::default(), malformed: Some(e.to_string()) },
    }
}

/// The fuzzing entry point (and its stand-in test): the first line of `data`
/// is the response's Content-Type, the rest its body, gzip when it starts with
/// the gzip magic. Must never panic, whatever the bytes.
pub fn fuzz_entry(data: &[u8]) {
    let (content_type, body) = match memchr::memchr(b'\n', data) {
        Some(i) => (String::from_utf8_lossy(&data[..i]).into_owned(), &data[i + 1..]),
        None => (String::new(), data),
    };
    let head = BodyHead {
        content_type: Some(content_type.as_str()),
        content_encoding: body.starts_with(&gzip::MAGIC).then_some("gzip"),
        resource_id: Some("R-fuzz"),
    };
    let limits = WireLimits { max_body_bytes: 1024 * 1024, ..WireLimits::ICOM };
    if let Ok(batch) = decode_batch(head, Bytes::copy_from_slice(body), &limits) {
        assert!(!batch.is_empty() && batch.len() <= limits.max_parts, "batch size out of bounds");
        for m in &batch {
            let _ = m.meta.msg_type();
        }
    }
}
