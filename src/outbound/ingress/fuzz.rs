//! The fuzzing entry point of the outbound request parser (bus and HTTP
//! intake): whatever the subject, headers and body, a request is either valid
//! and storable as it is, or invalid with a reason — never a panic, never a
//! row Postgres would refuse.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cabine_actors::ports::outbound::DeadlineBudgets;
use cabine_actors::ports::outbound_bus::OutboundRequest;

use super::{IngressRules, RawRequest, channel_of_subject, parse_request};
use crate::config::ChannelId;
use crate::outbound::fields;

/// `data` is the subject on its first line, then `Name: value` header lines up
/// to an empty line, then the body. True when the request is valid.
pub fn fuzz_entry(data: &[u8]) -> bool {
    let rules = IngressRules {
        ispb: "99999010".parse().expect("a valid ISPB"),
        channels: vec![ChannelId::Cpm],
        budgets: DeadlineBudgets::default(),
        max_message_bytes: 64 * 1024,
    };
    let (subject, rest) = line(data);
    let mut headers = Vec::new();
    let mut rest = rest;
    while !rest.is_empty() {
        let (l, after) = line(rest);
        rest = after;
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            headers.push((name.trim().to_owned(), value.to_owned()));
        }
    }
    let header = |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let request = RawRequest {
        channel: channel_of_subject(&subject, &rules),
        header: &header,
        body: Bytes::copy_from_slice(rest),
        ingress_ref: Some("OUTBOUND:1:0".to_owned()),
        published: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    };
    match parse_request(request, &rules) {
        OutboundRequest::Valid(m) => {
            assert!(fields::check_storable(&m).is_ok(), "a valid request is storable as it is");
            assert!(m.raw.len() <= rules.max_message_bytes, "a valid request fits the size limit");
            true
        }
        OutboundRequest::Invalid(bad) => {
            assert!(!bad.reason.is_empty(), "an invalid request says why");
            let kept = fields::text(&bad.reason);
            assert!(!kept.contains('\0') && kept.chars().count() <= fields::MAX_TEXT + 1, "the stored reason is clean");
            false
        }
    }
}

fn line(data: &[u8]) -> (String, &[u8]) {
    match memchr::memchr(b'\n', data) {
        Some(i) => (String::from_utf8_lossy(&data[..i]).into_owned(), &data[i + 1..]),
        None => (String::from_utf8_lossy(data).into_owned(), &[]),
    }
}
