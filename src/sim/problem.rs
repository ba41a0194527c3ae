//! RFC 7807 problem documents in XML, as the ICOM answers every refusal:
//! `<problem xmlns="urn:ietf:rfc:7807"><type>…/error/invalidHeader</type>…`.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// Prefix of every problem `type`.
pub const TYPE_BASE: &str = "https://www.bcb.gov.br/pi/icom/error/";

/// The kinds of refusal, each a `type` suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    InvalidHeader,
    HostWithPort,
    MissingCharset,
    InvalidContentType,
    UnsupportedMediaType,
    UnsupportedEncoding,
    LengthRequired,
    PayloadTooLarge,
    TooManyParts,
    InvalidMultipart,
    InvalidGzip,
    EmptyMessage,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    StreamNotFound,
    StreamGone,
    TooManyStreams,
    TooManyRequests,
    RateLimited,
    ServiceUnavailable,
    ServerError,
}

impl Problem {
    pub fn slug(self) -> &'static str {
        match self {
            Problem::InvalidHeader => "invalidHeader",
            Problem::HostWithPort => "invalidHost",
            Problem::MissingCharset => "invalidCharset",
            Problem::InvalidContentType => "invalidContentType",
            Problem::UnsupportedMediaType => "unsupportedMediaType",
            Problem::UnsupportedEncoding => "unsupportedContentEncoding",
            Problem::LengthRequired => "lengthRequired",
            Problem::PayloadTooLarge => "payloadTooLarge",
            Problem::TooManyParts => "tooManyParts",
            Problem::InvalidMultipart => "invalidMultipart",
            Problem::InvalidGzip => "invalidGzip",
            Problem::EmptyMessage => "emptyMessage",
            Problem::Forbidden => "forbidden",
            Problem::NotFound => "notFound",
            Problem::MethodNotAllowed => "methodNotAllowed",
            Problem::StreamNotFound => "streamNotFound",
            Problem::StreamGone => "streamGone",
            Problem::TooManyStreams => "tooManyStreams",
            Problem::TooManyRequests => "tooManyRequests",
            Problem::RateLimited => "rateLimited",
            Problem::ServiceUnavailable => "serviceUnavailable",
            Problem::ServerError => "internalError",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::InvalidHeader => "Header not allowed",
            Problem::HostWithPort => "Host must not carry a port",
            Problem::MissingCharset => "A single XML body must declare charset=utf-8",
            Problem::InvalidContentType => "Invalid Content-Type",
            Problem::UnsupportedMediaType => "Unsupported media type",
            Problem::UnsupportedEncoding => "Unsupported Content-Encoding",
            Problem::LengthRequired => "Content-Length required",
            Problem::PayloadTooLarge => "Payload too large",
            Problem::TooManyParts => "Too many messages in one request",
            Problem::InvalidMultipart => "Invalid multipart body",
            Problem::InvalidGzip => "Invalid gzip body",
            Problem::EmptyMessage => "Empty message",
            Problem::Forbidden => "Forbidden",
            Problem::NotFound => "Not found",
            Problem::MethodNotAllowed => "Method not allowed",
            Problem::StreamNotFound => "Unknown stream",
            Problem::StreamGone => "Stream already closed",
            Problem::TooManyStreams => "Too many open streams",
            Problem::TooManyRequests => "Too many simultaneous requests",
            Problem::RateLimited => "Operation rate exceeded",
            Problem::ServiceUnavailable => "Service unavailable",
            Problem::ServerError => "Internal error",
        }
    }
}

/// A response carrying the problem document.
pub fn respond(status: StatusCode, problem: Problem, detail: &str) -> Response<Full<Bytes>> {
    let body = document(status, problem, detail);
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+xml; charset=utf-8"));
    response
}

/// The XML text of a problem.
pub fn document(status: StatusCode, problem: Problem, detail: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<problem xmlns=\"urn:ietf:rfc:7807\"><type>{TYPE_BASE}{}</type><title>{}</title><status>{}</status><detail>{}</detail></problem>",
        problem.slug(),
        escape(problem.title()),
        status.as_u16(),
        escape(detail)
    )
}

/// Escapes text for an XML element.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_names_its_type_and_escapes_the_detail() {
        let xml = document(StatusCode::BAD_REQUEST, Problem::InvalidHeader, "header <x-b3> & co");
        assert!(xml.contains(
            "<problem xmlns=\"urn:ietf:rfc:7807\"><type>https://www.bcb.gov.br/pi/icom/error/invalidHeader</type>"
        ));
        assert!(xml.contains("<status>400</status>"));
        assert!(xml.contains("header &lt;x-b3&gt; &amp; co"));
    }
}
