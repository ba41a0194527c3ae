//! Request header rules of the ICOM: the whitelist (anything else → 400
//! `invalidHeader`) and the Host without a port (strict mode).

use http::HeaderMap;

/// The only request headers the Central Bank accepts (DESIGN §1, confirmed).
pub const ALLOWED: [&str; 12] = [
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

/// The first header outside the whitelist, if any (lowercase name).
pub fn first_forbidden(headers: &HeaderMap) -> Option<&str> {
    headers.keys().map(|k| k.as_str()).find(|name| !ALLOWED.contains(name))
}

/// What the Host header says about ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCheck {
    Bare,
    WithPort,
    Missing,
}

pub fn check_host(headers: &HeaderMap) -> HostCheck {
    let Some(host) = headers.get(http::header::HOST).and_then(|h| h.to_str().ok()) else {
        return HostCheck::Missing;
    };
    let after_literal = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(_, rest)| rest).unwrap_or(""),
        None => host,
    };
    if after_literal.contains(':') { HostCheck::WithPort } else { HostCheck::Bare }
}

/// True when a comma-separated header value lists `token` (case-insensitive, parameters ignored).
pub fn lists(headers: &HeaderMap, name: http::header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|item| {
        let media = item.split(';').next().unwrap_or("").trim();
        media.eq_ignore_ascii_case(token)
    })
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, header};

    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn the_whitelist_refuses_tracing_headers() {
        assert_eq!(first_forbidden(&map(&[("host", "a"), ("accept", "*/*"), ("user-agent", "x")])), None);
        assert_eq!(first_forbidden(&map(&[("host", "a"), ("traceparent", "00-1")])), Some("traceparent"));
    }

    #[test]
    fn a_host_with_a_port_is_told_apart() {
        assert_eq!(check_host(&map(&[("host", "icom.pi.rsfn.net.br")])), HostCheck::Bare);
        assert_eq!(check_host(&map(&[("host", "127.0.0.1:16422")])), HostCheck::WithPort);
        assert_eq!(check_host(&map(&[("host", "[::1]")])), HostCheck::Bare);
        assert_eq!(check_host(&map(&[("host", "[::1]:8080")])), HostCheck::WithPort);
        assert_eq!(check_host(&HeaderMap::new()), HostCheck::Missing);
    }

    #[test]
    fn accept_lists_are_read_item_by_item() {
        let m = map(&[("accept", "application/xml, multipart/mixed;q=0.9"), ("accept-encoding", "br, GZIP")]);
        assert!(lists(&m, header::ACCEPT, "multipart/mixed"));
        assert!(lists(&m, header::ACCEPT_ENCODING, "gzip"));
        assert!(!lists(&m, header::ACCEPT_ENCODING, "deflate"));
    }
}
