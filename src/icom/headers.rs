//! The HTTP headers ICOM accepts (the Central Bank's whitelist) and the exact
//! set cabine sends. Anything outside the whitelist makes ICOM answer 400, so
//! the client builds every request's headers here and nowhere else.

use http::HeaderMap;
use http::header::{self, HeaderValue};
use reqwest::Url;

/// Request headers ICOM accepts; any other one → 400 `…/error/invalidHeader`.
pub const WHITELIST: [&str; 12] = [
    "accept",
    "accept-encoding",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "cookie",
    "host",
    "max-forwards",
    "transfer-encoding",
    "user-agent",
    "via",
];

/// Response header with the stream's next URL path (every 200/204 of a stream).
pub const PULL_NEXT: &str = "pi-pull-next";
/// Response/part header with the message's resource id(s).
pub const RESOURCE_ID: &str = "pi-resourceid";
/// A single XML body's content type: ICOM requires the charset.
pub const XML_CONTENT_TYPE: &str = "application/xml; charset=utf-8";

/// True when ICOM accepts a request header of this name.
pub fn is_whitelisted(name: &str) -> bool {
    WHITELIST.iter().any(|w| w.eq_ignore_ascii_case(name))
}

/// `cabine/{version}`.
pub fn user_agent() -> String {
    format!("cabine/{}", crate::VERSION)
}

/// The `Host` value ICOM expects: the URL's host WITHOUT its port, even when the URL has one.
pub fn host_without_port(url: &Url) -> Option<HeaderValue> {
    host_header(url, true)
}

/// The `Host` value: the URL's host, followed by its explicit port unless `without_port`.
pub fn host_header(url: &Url, without_port: bool) -> Option<HeaderValue> {
    let host = url.host_str()?;
    match url.port() {
        Some(port) if !without_port => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        _ => HeaderValue::from_str(host).ok(),
    }
}

/// What a request carries as its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestBody<'a> {
    /// GET / DELETE on a stream.
    None,
    /// One XML message, gzipped.
    GzipXml,
    /// Several messages as `multipart/mixed` with this boundary, gzipped.
    GzipMultipart(&'a str),
}

/// Every header of a request except `Content-Length`, which hyper writes from the body.
pub fn request_headers(host: &HeaderValue, user_agent: &HeaderValue, body: RequestBody<'_>) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(6);
    headers.insert(header::HOST, host.clone());
    headers.insert(header::ACCEPT, HeaderValue::from_static("multipart/mixed"));
    headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    headers.insert(header::USER_AGENT, user_agent.clone());
    let content_type = match body {
        RequestBody::None => return headers,
        RequestBody::GzipXml => HeaderValue::from_static(XML_CONTENT_TYPE),
        RequestBody::GzipMultipart(boundary) => HeaderValue::from_str(&super::multipart::content_type(boundary))
            .unwrap_or_else(|_| HeaderValue::from_static("multipart/mixed")),
    };
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_drops_the_port() {
        let host = |u: &str| host_without_port(&Url::parse(u).unwrap()).unwrap();
        assert_eq!(host("https://icom.pi.rsfn.net.br:16422/api"), "icom.pi.rsfn.net.br");
        assert_eq!(host("http://127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(host("http://[::1]:8080/"), "[::1]");
        let with_port = |u: &str| host_header(&Url::parse(u).unwrap(), false).unwrap();
        assert_eq!(with_port("https://icom.pi.rsfn.net.br:16422/api"), "icom.pi.rsfn.net.br:16422");
        assert_eq!(with_port("http://[::1]:8080/"), "[::1]:8080");
        assert_eq!(with_port("https://icom.pi.rsfn.net.br/"), "icom.pi.rsfn.net.br", "no port in the URL");
    }

    #[test]
    fn every_request_header_is_whitelisted() {
        let host = HeaderValue::from_static("icom");
        let ua = HeaderValue::from_str(&user_agent()).unwrap();
        for body in [RequestBody::None, RequestBody::GzipXml, RequestBody::GzipMultipart("b")] {
            let headers = request_headers(&host, &ua, body);
            assert!(headers.keys().all(|k| is_whitelisted(k.as_str())), "{headers:?}");
        }
        assert!(!is_whitelisted("traceparent"));
        assert!(is_whitelisted("Content-Type"));
    }
}
