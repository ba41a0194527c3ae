//! `multipart/mixed` bodies: build (sends, up to 10 messages) and a strict,
//! bounded parse (stream reads, each part with its own `PI-ResourceId`).
//! Part count, header block length and boundary length are checked before
//! anything is allocated; part bodies are zero-copy slices of the input.

use bytes::Bytes;
use memchr::memmem;
use rand::distr::{Alphanumeric, SampleString};

use super::headers::{RESOURCE_ID, XML_CONTENT_TYPE};
use super::limits::{WireError, WireLimits};

/// One part: its body and the two headers ICOM uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub resource_id: Option<String>,
    pub content_type: Option<String>,
    pub body: Bytes,
}

impl Part {
    /// An XML message to send (the server assigns its resource id).
    pub fn xml(body: Bytes) -> Part {
        Part { resource_id: None, content_type: Some(XML_CONTENT_TYPE.to_owned()), body }
    }
}

/// `multipart/mixed; boundary=…` for a body built with `boundary`.
pub fn content_type(boundary: &str) -> String {
    format!("multipart/mixed; boundary={boundary}")
}

/// True when a `Content-Type` value is `multipart/mixed` (any parameters).
pub fn is_multipart_mixed(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("multipart/mixed")
}

/// A fresh random boundary (38 characters, within RFC 2046's 70).
pub fn new_boundary() -> String {
    format!("cabine{}", Alphanumeric.sample_string(&mut rand::rng(), 32))
}

/// Builds a body with a fresh boundary that occurs in no part; returns (boundary, body).
pub fn build_fresh(parts: &[Part], limits: &WireLimits) -> Result<(String, Vec<u8>), WireError> {
    let mut last = WireError::Multipart("no boundary tried".into());
    for _ in 0..4 {
        let boundary = new_boundary();
        match build(parts, &boundary, limits) {
            Ok(body) => return Ok((boundary, body)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Builds a `multipart/mixed` body; fails if the boundary occurs in a part or
/// a limit is broken (count, boundary, header length, total size).
pub fn build(parts: &[Part], boundary: &str, limits: &WireLimits) -> Result<Vec<u8>, WireError> {
    check_boundary(boundary, limits)?;
    if parts.len() > limits.max_parts {
        return Err(WireError::TooManyParts { max: limits.max_parts }.counted());
    }
    let delimiter = format!("\r\n--{boundary}");
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.body.len() + 128).sum::<usize>() + 64);
    for part in parts {
        if part.body.starts_with(&delimiter.as_bytes()[2..]) || memmem::find(&part.body, delimiter.as_bytes()).is_some()
        {
            return Err(WireError::Multipart("the boundary occurs in a part".into()));
        }
        out.extend_from_slice(&delimiter.as_bytes()[if out.is_empty() { 2 } else { 0 }..]);
        out.extend_from_slice(b"\r\n");
        let head = part_head(part)?;
        if head.len() > limits.max_header_bytes {
            return Err(WireError::HeaderTooLong { max: limits.max_header_bytes }.counted());
        }
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&part.body);
    }
    out.extend_from_slice(delimiter.as_bytes());
    out.extend_from_slice(b"--\r\n");
    if out.len() > limits.max_body_bytes {
        return Err(WireError::BodyTooLarge { max: limits.max_body_bytes }.counted());
    }
    Ok(out)
}

/// The header lines of a part, each ending in CRLF.
fn part_head(part: &Part) -> Result<String, WireError> {
    let mut head = String::new();
    for (name, value) in [("Content-Type", &part.content_type), ("PI-ResourceId", &part.resource_id)] {
        let Some(value) = value else { continue };
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(WireError::Multipart(format!("{name} of a part has control characters")));
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    Ok(head)
}

/// The boundary of a `multipart/mixed` Content-Type value, checked against the limits.
pub fn boundary_of(content_type: &str, limits: &WireLimits) -> Result<String, WireError> {
    if content_type.len() > limits.max_header_bytes {
        return Err(WireError::HeaderTooLong { max: limits.max_header_bytes }.counted());
    }
    if !is_multipart_mixed(content_type) {
        return Err(WireError::ContentType(format!("not multipart/mixed: {content_type:?}")));
    }
    let boundary = content_type
        .split(';')
        .skip(1)
        .filter_map(|param| param.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, value)| value.trim())
        .ok_or_else(|| WireError::ContentType("multipart/mixed without a boundary".into()))?;
    let boundary = boundary.strip_prefix('"').and_then(|b| b.strip_suffix('"')).unwrap_or(boundary);
    check_boundary(boundary, limits)?;
    Ok(boundary.to_owned())
}

/// RFC 2046: 1..=70 characters (here: the configured limit) of `bchars`, not ending in a space.
fn check_boundary(boundary: &str, limits: &WireLimits) -> Result<(), WireError> {
    if boundary.len() > limits.max_boundary_len {
        return Err(WireError::BoundaryTooLong { len: boundary.len(), max: limits.max_boundary_len }.counted());
    }
    let bchar = |c: char| c.is_ascii_alphanumeric() || "'()+_,-./:=? ".contains(c);
    if boundary.is_empty() || boundary.ends_with(' ') || !boundary.chars().all(bchar) {
        return Err(WireError::ContentType(format!("invalid boundary {boundary:?}")));
    }
    Ok(())
}

/// Parses a whole `multipart/mixed` body (already inflated and size-checked).
pub fn parse(body: &Bytes, boundary: &str, limits: &WireLimits) -> Result<Vec<Part>, WireError> {
    check_boundary(boundary, limits)?;
    let delimiter = format!("\r\n--{boundary}");
    let (delimiter, dash_boundary) = (delimiter.as_bytes(), &delimiter.as_bytes()[2..]);
    let mut pos = if body.starts_with(dash_boundary) {
        0
    } else {
        memmem::find(body, delimiter).ok_or_else(|| WireError::Multipart("no opening delimiter".into()))? + 2
    };
    let mut parts = Vec::new();
    loop {
        pos += dash_boundary.len();
        if body[pos..].starts_with(b"--") {
            return Ok(parts);
        }
        pos += body[pos..].iter().take_while(|b| **b == b' ' || **b == b'\t').count();
        if !body[pos..].starts_with(b"\r\n") {
            return Err(WireError::Multipart("delimiter not followed by CRLF".into()));
        }
        pos += 2;
        if parts.len() == limits.max_parts {
            return Err(WireError::TooManyParts { max: limits.max_parts }.counted());
        }
        let (head, content_offset) = header_block(&body[pos..], limits.max_header_bytes)?;
        let mut part = parse_head(head)?;
        let start = pos + content_offset;
        let len = memmem::find(&body[start..], delimiter)
            .ok_or_else(|| WireError::Multipart("part without a closing delimiter".into()))?;
        part.body = body.slice(start..start + len);
        parts.push(part);
        pos = start + len + 2;
    }
}

/// Finds the end of a part's header block within `max` bytes; returns (the
/// header lines, each with its CRLF; the body's offset).
fn header_block(rest: &[u8], max: usize) -> Result<(&[u8], usize), WireError> {
    if rest.starts_with(b"\r\n") {
        return Ok((&[], 2));
    }
    let window = &rest[..rest.len().min(max.saturating_add(4))];
    match memmem::find(window, b"\r\n\r\n") {
        Some(end) if end <= max => Ok((&rest[..end + 2], end + 4)),
        Some(_) => Err(WireError::HeaderTooLong { max }.counted()),
        None if rest.len() >= max.saturating_add(4) => Err(WireError::HeaderTooLong { max }.counted()),
        None => Err(WireError::Multipart("unterminated part headers".into())),
    }
}

/// Reads `Name: value` lines; keeps `PI-ResourceId` and `Content-Type`.
fn parse_head(head: &[u8]) -> Result<Part, WireError> {
    let mut part = Part { resource_id: None, content_type: None, body: Bytes::new() };
    for line in head.split_inclusive(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r\n").ok_or_else(|| WireError::Multipart("bare LF in part headers".into()))?;
        let line = std::str::from_utf8(line)
            .ok()
            .filter(|l| !l.bytes().any(|b| b.is_ascii_control() && b != b'\t'))
            .ok_or_else(|| WireError::Multipart("part header is not printable text".into()))?;
        let (name, value) = line
            .split_once(':')
            .filter(|(n, _)| !n.is_empty() && !n.starts_with([' ', '\t']) && !n.ends_with([' ', '\t']))
            .ok_or_else(|| WireError::Multipart(format!("bad part header line {line:?}")))?;
        let value = value.trim_matches([' ', '\t']).to_owned();
        if name.eq_ignore_ascii_case(RESOURCE_ID) {
            part.resource_id = Some(value);
        } else if name.eq_ignore_ascii_case("content-type") {
            part.content_type = Some(value);
        }
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(n: usize) -> Vec<Part> {
        (0..n)
            .map(|i| Part {
                resource_id: Some(format!("R{i}")),
                content_type: Some(XML_CONTENT_TYPE.into()),
                body: Bytes::from(format!("<m>{i}</m>")),
            })
            .collect()
    }

    #[test]
    fn round_trip_keeps_ids_and_bodies() {
        let limits = WireLimits::ICOM;
        let (boundary, body) = build_fresh(&parts(10), &limits).unwrap();
        assert_eq!(parse(&Bytes::from(body), &boundary, &limits).unwrap(), parts(10));
    }

    #[test]
    fn eleven_parts_are_refused_before_the_eleventh_is_read() {
        let loose = WireLimits { max_parts: 20, ..WireLimits::ICOM };
        let body = Bytes::from(build(&parts(11), "b0", &loose).unwrap());
        assert_eq!(parse(&body, "b0", &WireLimits::ICOM), Err(WireError::TooManyParts { max: 10 }));
        assert_eq!(build(&parts(11), "b0", &WireLimits::ICOM), Err(WireError::TooManyParts { max: 10 }));
    }

    #[test]
    fn boundary_limits() {
        let limits = WireLimits::ICOM;
        let long = "x".repeat(71);
        assert_eq!(
            boundary_of(&format!("multipart/mixed; boundary={long}"), &limits),
            Err(WireError::BoundaryTooLong { len: 71, max: 70 })
        );
        assert_eq!(boundary_of("multipart/mixed; charset=x; Boundary=\"a b\"", &limits).unwrap(), "a b");
        assert!(matches!(boundary_of("multipart/mixed", &limits), Err(WireError::ContentType(_))));
        assert!(matches!(boundary_of("application/xml", &limits), Err(WireError::ContentType(_))));
        assert!(matches!(boundary_of("multipart/mixed; boundary=a\u{e9}", &limits), Err(WireError::ContentType(_))));
    }

    #[test]
    fn oversized_part_headers_are_refused() {
        let limits = WireLimits { max_header_bytes: 64, ..WireLimits::ICOM };
        let body = format!("--b\r\nPI-ResourceId: {}\r\n\r\n<m/>\r\n--b--\r\n", "x".repeat(100));
        assert_eq!(parse(&Bytes::from(body), "b", &limits), Err(WireError::HeaderTooLong { max: 64 }));
        let endless = format!("--b\r\nPI-ResourceId: {}", "x".repeat(100));
        assert_eq!(parse(&Bytes::from(endless), "b", &limits), Err(WireError::HeaderTooLong { max: 64 }));
    }

    #[test]
    fn preamble_padding_and_epilogue_are_allowed() {
        let body = "preamble\r\n--b  \r\nPI-ResourceId:  R1 \r\n\r\n<a/>\r\n--b\r\n\r\n<b/>\r\n--b--\r\nepilogue";
        let got = parse(&Bytes::from(body), "b", &WireLimits::ICOM).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].resource_id.as_deref(), &got[0].body[..]), (Some("R1"), &b"<a/>"[..]));
        assert_eq!((got[1].resource_id.as_deref(), &got[1].body[..]), (None, &b"<b/>"[..]));
    }

    #[test]
    fn broken_framing_is_a_multipart_error() {
        let limits = WireLimits::ICOM;
        for body in [
            "no delimiter at all",
            "--b\r\nPI-ResourceId: R1\r\n\r\n<a/>",
            "--bX\r\n\r\n<a/>\r\n--b--",
            "--b\r\nbad header line\r\n\r\n<a/>\r\n--b--",
            "--b\r\nPI-ResourceId: R1\n\r\n<a/>\r\n--b--",
            "--b\r\nPI-ResourceId: R1",
        ] {
            assert!(matches!(parse(&Bytes::from(body), "b", &limits), Err(WireError::Multipart(_))), "{body:?}");
        }
    }

    #[test]
    fn a_boundary_inside_a_body_is_refused_at_build() {
        let part = Part::xml(Bytes::from_static(b"x\r\n--b\r\ny"));
        assert!(matches!(build(&[part], "b", &WireLimits::ICOM), Err(WireError::Multipart(_))));
    }
}
