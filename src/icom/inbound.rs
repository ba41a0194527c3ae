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

/// Like [`decode_batch`] for a stream read whose framing was fine, but never
/// fails: every message is kept. A part without a usable `PI-ResourceId` comes
/// with an empty id (the inbox keys it by content and marks it malformed); a
/// body that breaks a limit or cannot be split becomes ONE malformed message
/// (see [`unreadable`]).
pub fn read_batch(head: BodyHead<'_>, body: Bytes, limits: &WireLimits) -> Vec<InboundMessage> {
    let split = || -> Result<Vec<InboundMessage>, WireError> {
        let inflated = inflate(head.content_encoding, body.clone(), limits)?;
        let Some(ct) = head.content_type.filter(|ct| multipart::is_multipart_mixed(ct)) else {
            return Ok(vec![keyed(resource_id(head.resource_id, 0, limits), inflated)]);
        };
        let boundary = multipart::boundary_of(ct, limits)?;
        let parts = multipart::parse(&inflated, &boundary, limits)?;
        if parts.is_empty() {
            return Err(WireError::Multipart("no parts".into()));
        }
        Ok(parts
            .into_iter()
            .enumerate()
            .map(|(index, p)| keyed(resource_id(p.resource_id.as_deref(), index, limits), p.body))
            .collect())
    };
    split().unwrap_or_else(|e| vec![unreadable(head, body, &e, limits)])
}

/// A message whose resource id may be unusable: then it is kept with an empty
/// id and the reason, for the inbox to key by content.
fn keyed(id: Result<String, WireError>, raw: Bytes) -> InboundMessage {
    match id {
        Ok(id) => message(id, raw),
        Err(e) => {
            let mut m = message(String::new(), raw);
            let reason = match m.malformed.take() {
                Some(xml) => format!("{e}; {xml}"),
                None => e.to_string(),
            };
            m.malformed = Some(reason);
            m
        }
    }
}

/// A whole body that could not be split into messages (a broken limit, bad
/// gzip or multipart): one malformed message holding the bytes as received
/// (bounded by the read), keyed by the response's `PI-ResourceId`, else by the
/// part ids found in the body's first `max_body_bytes` (stable when the same
/// batch is redelivered), else by a fingerprint of the bytes.
pub fn unreadable(head: BodyHead<'_>, raw: Bytes, error: &WireError, limits: &WireLimits) -> InboundMessage {
    let gzip = head.content_encoding.is_some_and(|e| e.trim().eq_ignore_ascii_case("gzip"));
    let id = match resource_id(head.resource_id, 0, limits) {
        Ok(id) => id,
        Err(_) => {
            let text = if gzip { gzip::inflate_prefix(&raw, limits.max_body_bytes) } else { raw.to_vec() };
            let ids = part_ids(&text[..text.len().min(limits.max_body_bytes)]);
            let fingerprint = if ids.is_empty() { fnv64(&raw) } else { fnv64(ids.join(",").as_bytes()) };
            format!("unreadable:{fingerprint:016x}:{}", ids.len())
        }
    };
    let encoding = if gzip { "gzip" } else { "as received" };
    let reason = format!("{error} ({} bytes kept, {encoding})", raw.len());
    InboundMessage { resource_id: id, raw, meta: MessageMeta::default(), malformed: Some(reason) }
}

/// `PI-ResourceId` values of part header lines, at most 100.
fn part_ids(body: &[u8]) -> Vec<String> {
    const NAME: &[u8] = b"pi-resourceid:";
    body.split(|b| *b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let head = line.get(..NAME.len())?;
            head.eq_ignore_ascii_case(NAME).then(|| String::from_utf8_lossy(&line[NAME.len()..]).trim().to_owned())
        })
        .filter(|id| !id.is_empty() && id.len() <= 256)
        .take(100)
        .collect()
}

/// FNV-1a, 64 bits: a stable fingerprint (same on every build).
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
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
    let kept = read_batch(head, Bytes::copy_from_slice(body), &limits);
    assert!(!kept.is_empty() && kept.len() <= limits.max_parts, "a read always keeps 1..=max_parts messages");
}

#[cfg(test)]
mod tests {
    use super::*;

    const MP: &str = "multipart/mixed; boundary=b";

    fn head(ct: &'static str, enc: Option<&'static str>, id: Option<&'static str>) -> BodyHead<'static> {
        BodyHead { content_type: Some(ct), content_encoding: enc, resource_id: id }
    }

    #[test]
    fn a_part_without_resource_id_is_kept_beside_the_others() {
        let body = b"--b\r\nPI-ResourceId: R1\r\n\r\n<a/>\r\n--b\r\n\r\n<b/>\r\n--b--\r\n";
        let batch = read_batch(head(MP, None, None), Bytes::from_static(body), &WireLimits::ICOM);
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].resource_id, "R1");
        assert_eq!((batch[1].resource_id.as_str(), &batch[1].raw[..]), ("", &b"<b/>"[..]));
        assert!(batch[1].malformed.as_deref().is_some_and(|r| r.contains("PI-ResourceId")));
    }

    #[test]
    fn an_unsplittable_body_is_one_message_keyed_stably() {
        let small = WireLimits { max_body_bytes: 40, ..WireLimits::ICOM };
        let body = b"--b\r\nPI-ResourceId: R1\r\n\r\n<a>long enough to break the limit</a>\r\n--b--\r\n";
        let gz = Bytes::from(gzip::compress(body).unwrap());
        let one = read_batch(head(MP, Some("gzip"), None), gz.clone(), &small);
        let again = read_batch(head(MP, Some("gzip"), None), gz.clone(), &small);
        assert_eq!(one, again, "a redelivery maps to the same key");
        assert_eq!(one.len(), 1);
        assert!(one[0].resource_id.starts_with("unreadable:") && one[0].resource_id.ends_with(":1"));
        assert_eq!(one[0].raw, gz, "the bytes as received");
        assert!(one[0].malformed.as_deref().is_some_and(|r| r.contains("max_body_bytes")));
        let bad = read_batch(head(MP, None, Some("R9")), Bytes::from_static(b"--x\r\n"), &WireLimits::ICOM);
        assert_eq!((bad.len(), bad[0].resource_id.as_str()), (1, "R9"));
        assert!(bad[0].malformed.is_some());
    }
}
