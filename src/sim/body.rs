//! Decoding of `POST …/msgs` bodies with the simulator's own parsers: header
//! level checks first (length, encoding, media type), then the bounded read,
//! whole-body gunzip (flate2, stopping past the limit: gzip-bomb safe) and the
//! multipart split (multer). Every refusal is a typed [`BodyError`].

use std::io::Read;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::problem::Problem;

/// The bounds of one request.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Wire bytes and inflated bytes alike.
    pub max_body_bytes: usize,
    pub max_parts: usize,
}

/// Longest multipart boundary (RFC 2046).
const MAX_BOUNDARY: usize = 70;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("neither Content-Length nor Transfer-Encoding")]
    LengthRequired,
    #[error("{0}")]
    TooLarge(String),
    #[error("more than {0} messages in one request")]
    TooManyParts(usize),
    #[error("Content-Encoding {0:?} is not supported (gzip only, on the whole body)")]
    UnsupportedEncoding(String),
    #[error("Content-Type {0:?} is not supported (application/xml or multipart/mixed)")]
    UnsupportedMediaType(String),
    #[error("a single XML body must declare charset=utf-8, got {0:?}")]
    MissingCharset(String),
    #[error("{0}")]
    InvalidContentType(String),
    #[error("gzip: {0}")]
    InvalidGzip(String),
    #[error("multipart: {0}")]
    InvalidMultipart(String),
    #[error("part {0} is compressed: gzip the whole body, not the parts")]
    EncodedPart(usize),
    #[error("part {index} has Content-Type {found:?}, not application/xml")]
    PartType { index: usize, found: String },
    #[error("empty message")]
    Empty,
}

impl BodyError {
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::LengthRequired => StatusCode::LENGTH_REQUIRED,
            BodyError::TooLarge(_) | BodyError::TooManyParts(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::UnsupportedEncoding(_) | BodyError::UnsupportedMediaType(_) | BodyError::PartType { .. } => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub fn problem(&self) -> Problem {
        match self {
            BodyError::LengthRequired => Problem::LengthRequired,
            BodyError::TooLarge(_) => Problem::PayloadTooLarge,
            BodyError::TooManyParts(_) => Problem::TooManyParts,
            BodyError::UnsupportedEncoding(_) => Problem::UnsupportedEncoding,
            BodyError::UnsupportedMediaType(_) | BodyError::PartType { .. } => Problem::UnsupportedMediaType,
            BodyError::MissingCharset(_) => Problem::MissingCharset,
            BodyError::InvalidContentType(_) => Problem::InvalidContentType,
            BodyError::InvalidGzip(_) => Problem::InvalidGzip,
            BodyError::InvalidMultipart(_) | BodyError::EncodedPart(_) => Problem::InvalidMultipart,
            BodyError::Empty => Problem::EmptyMessage,
        }
    }
}

/// How the body is framed, from the headers alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Framing {
    pub gzip: bool,
    /// `Some(boundary)` for multipart/mixed, `None` for one XML message.
    pub boundary: Option<String>,
}

/// A media type and its parameters, lowercase names, unquoted values.
fn media_type(value: &str) -> (String, Vec<(String, String)>) {
    let mut items = value.split(';');
    let media = items.next().unwrap_or("").trim().to_ascii_lowercase();
    let params = items
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_owned()))
        .collect();
    (media, params)
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Checks length, encoding and media type before reading a byte of the body.
pub fn framing(headers: &HeaderMap, limits: BodyLimits) -> Result<Framing, BodyError> {
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if length.is_none() && !headers.contains_key(header::TRANSFER_ENCODING) {
        return Err(BodyError::LengthRequired);
    }
    if let Some(n) = length.filter(|n| *n > limits.max_body_bytes as u64) {
        return Err(BodyError::TooLarge(format!("{n} bytes exceed the {} byte limit", limits.max_body_bytes)));
    }
    let gzip =
        match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase()) {
            None => false,
            Some(e) if e == "identity" => false,
            Some(e) if e == "gzip" => true,
            Some(other) => return Err(BodyError::UnsupportedEncoding(other)),
        };
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("?").to_owned());
    let Some(content_type) = content_type else {
        return Err(BodyError::UnsupportedMediaType(String::new()));
    };
    let (media, params) = media_type(&content_type);
    let boundary = match media.as_str() {
        "application/xml" => {
            if !param(&params, "charset").is_some_and(|c| c.eq_ignore_ascii_case("utf-8")) {
                return Err(BodyError::MissingCharset(content_type));
            }
            None
        }
        "multipart/mixed" => match param(&params, "boundary") {
            Some(b) if !b.is_empty() && b.len() <= MAX_BOUNDARY => Some(b.to_owned()),
            Some(b) => {
                return Err(BodyError::InvalidContentType(format!(
                    "boundary of {} characters (1..={MAX_BOUNDARY})",
                    b.len()
                )));
            }
            None => return Err(BodyError::InvalidContentType("multipart/mixed without a boundary".to_owned())),
        },
        _ => return Err(BodyError::UnsupportedMediaType(content_type)),
    };
    Ok(Framing { gzip, boundary })
}

/// Reads the whole body, refusing more than the limit.
pub async fn collect(body: Incoming, limits: BodyLimits) -> Result<Bytes, BodyError> {
    match Limited::new(body, limits.max_body_bytes).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(BodyError::TooLarge(format!("the body exceeds the {} byte limit", limits.max_body_bytes)))
        }
        Err(e) => Err(BodyError::InvalidMultipart(format!("the body could not be read: {e}"))),
    }
}

/// Inflates a whole-body gzip, stopping one byte past the limit.
pub fn gunzip(compressed: &[u8], limits: BodyLimits) -> Result<Bytes, BodyError> {
    let mut out = Vec::with_capacity((compressed.len() * 4).min(limits.max_body_bytes + 1));
    flate2::read::GzDecoder::new(compressed)
        .take(limits.max_body_bytes as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| BodyError::InvalidGzip(e.to_string()))?;
    if out.len() > limits.max_body_bytes {
        return Err(BodyError::TooLarge(format!("the inflated body exceeds the {} byte limit", limits.max_body_bytes)));
    }
    Ok(Bytes::from(out))
}

/// The messages of a body: one, or each part of a multipart/mixed.
pub async fn messages(body: Bytes, framing: &Framing, limits: BodyLimits) -> Result<Vec<Bytes>, BodyError> {
    let body = if framing.gzip { gunzip(&body, limits)? } else { body };
    let Some(boundary) = &framing.boundary else {
        return if body.is_empty() { Err(BodyError::Empty) } else { Ok(vec![body]) };
    };
    let whole = body.len() as u64;
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let constraints = multer::Constraints::new().size_limit(multer::SizeLimit::new().whole_stream(whole));
    let mut multipart = multer::Multipart::with_constraints(stream, boundary.clone(), constraints);
    let mut parts = Vec::new();
    while let Some(field) = multipart.next_field().await.map_err(|e| BodyError::InvalidMultipart(e.to_string()))? {
        let index = parts.len() + 1;
        if index > limits.max_parts {
            return Err(BodyError::TooManyParts(limits.max_parts));
        }
        check_part_headers(field.headers(), index)?;
        let bytes = field.bytes().await.map_err(|e| BodyError::InvalidMultipart(e.to_string()))?;
        if bytes.is_empty() {
            return Err(BodyError::Empty);
        }
        parts.push(bytes);
    }
    if parts.is_empty() {
        return Err(BodyError::InvalidMultipart("no parts".to_owned()));
    }
    Ok(parts)
}

fn check_part_headers(headers: &HeaderMap, index: usize) -> Result<(), BodyError> {
    if headers.get(header::CONTENT_ENCODING).is_some_and(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity")) {
        return Err(BodyError::EncodedPart(index));
    }
    let found = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("?").to_owned()).unwrap_or_default();
    let (media, params) = media_type(&found);
    let charset_ok = param(&params, "charset").is_none_or(|c| c.eq_ignore_ascii_case("utf-8"));
    if media != "application/xml" || !charset_ok {
        return Err(BodyError::PartType { index, found });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;
    use http::HeaderValue;

    use super::*;

    const LIMITS: BodyLimits = BodyLimits { max_body_bytes: 1024, max_parts: 3 };

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        m
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn multipart(parts: &[(&str, &str)]) -> Bytes {
        let mut body = String::new();
        for (ct, xml) in parts {
            body.push_str(&format!("--b1\r\nContent-Type: {ct}\r\n\r\n{xml}\r\n"));
        }
        body.push_str("--b1--\r\n");
        Bytes::from(body)
    }

    #[test]
    fn framing_checks_length_encoding_and_media_type() {
        let xml = [("content-length", "10"), ("content-type", "application/xml; charset=UTF-8")];
        assert_eq!(framing(&headers(&xml), LIMITS), Ok(Framing { gzip: false, boundary: None }));
        let cases: Vec<(Vec<(&'static str, &str)>, StatusCode)> = vec![
            (vec![("content-type", "application/xml; charset=utf-8")], StatusCode::LENGTH_REQUIRED),
            (
                vec![("content-length", "2000"), ("content-type", "application/xml; charset=utf-8")],
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (vec![("content-length", "10"), ("content-type", "application/xml")], StatusCode::BAD_REQUEST),
            (
                vec![("content-length", "10"), ("content-type", "application/xml; charset=latin1")],
                StatusCode::BAD_REQUEST,
            ),
            (vec![("content-length", "10"), ("content-type", "text/plain")], StatusCode::UNSUPPORTED_MEDIA_TYPE),
            (vec![("content-length", "10")], StatusCode::UNSUPPORTED_MEDIA_TYPE),
            (vec![("content-length", "10"), ("content-type", "multipart/mixed")], StatusCode::BAD_REQUEST),
            (
                vec![
                    ("content-length", "10"),
                    ("content-type", "application/xml; charset=utf-8"),
                    ("content-encoding", "br"),
                ],
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
        ];
        for (h, status) in cases {
            assert_eq!(framing(&headers(&h), LIMITS).unwrap_err().status(), status, "{h:?}");
        }
        let mp = [
            ("transfer-encoding", "chunked"),
            ("content-type", "multipart/mixed; boundary=\"b1\""),
            ("content-encoding", "gzip"),
        ];
        assert_eq!(framing(&headers(&mp), LIMITS), Ok(Framing { gzip: true, boundary: Some("b1".to_owned()) }));
    }

    #[tokio::test]
    async fn a_multipart_body_splits_into_its_messages() {
        let framing = Framing { gzip: false, boundary: Some("b1".to_owned()) };
        let body = multipart(&[("application/xml; charset=utf-8", "<a/>"), ("application/xml", "<b/>")]);
        let parts = messages(body, &framing, LIMITS).await.unwrap();
        assert_eq!(parts, vec![Bytes::from_static(b"<a/>"), Bytes::from_static(b"<b/>")]);
    }

    #[tokio::test]
    async fn too_many_parts_wrong_parts_and_bombs_are_refused() {
        let framing = Framing { gzip: false, boundary: Some("b1".to_owned()) };
        let four = multipart(&[("application/xml", "<a/>"); 4]);
        assert_eq!(messages(four, &framing, LIMITS).await, Err(BodyError::TooManyParts(3)));
        let json = multipart(&[("application/json", "{}")]);
        assert_eq!(messages(json, &framing, LIMITS).await.unwrap_err().status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let encoded =
            Bytes::from("--b1\r\nContent-Type: application/xml\r\nContent-Encoding: gzip\r\n\r\nzz\r\n--b1--\r\n");
        assert_eq!(messages(encoded, &framing, LIMITS).await, Err(BodyError::EncodedPart(1)));
        let truncated = Bytes::from("--b1\r\nContent-Type: application/xml\r\n\r\n<a/>");
        assert!(matches!(messages(truncated, &framing, LIMITS).await, Err(BodyError::InvalidMultipart(_))));

        let gz = Framing { gzip: true, boundary: None };
        let bomb = Bytes::from(gzip(&vec![b' '; 100_000]));
        assert!(bomb.len() < 1024);
        assert!(matches!(messages(bomb, &gz, LIMITS).await, Err(BodyError::TooLarge(_))));
        let ok = Bytes::from(gzip(b"<a/>"));
        assert_eq!(messages(ok, &gz, LIMITS).await.unwrap(), vec![Bytes::from_static(b"<a/>")]);
        let garbage = Bytes::from_static(b"not gzip at all");
        assert!(matches!(messages(garbage, &gz, LIMITS).await, Err(BodyError::InvalidGzip(_))));
    }
}
