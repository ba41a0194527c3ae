//! Ingress parsing: subjects, headers, deadlines, envelopes, and what makes a
//! request invalid (kept, never an error).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cabine_actors::ports::outbound::{DeadlineBudgets, Priority};
use cabine_actors::ports::outbound_bus::OutboundRequest;

use super::*;

const PACS008: &str = include_str!("../../../tests/data/spi/pacs.008_END_1_msg.xml");
const PACS008_10: &str = include_str!("../../../tests/data/spi/pacs.008_END_10_msg.xml");
const SUBJECT: &str = "icom.out.99999010.cpm";

fn rules() -> IngressRules {
    IngressRules {
        ispb: "99999010".parse().unwrap(),
        channels: vec![ChannelId::Cpm],
        budgets: DeadlineBudgets::default(),
        max_message_bytes: 16 * 1024,
    }
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_200_000)
}

fn parse(subject: &str, headers: &[(&str, &str)], body: &str) -> OutboundRequest {
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let header = move |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let req = RawRequest {
        channel: channel_of_subject(subject, &rules()),
        header: &header,
        body: Bytes::from(body.to_owned()),
        ingress_ref: Some("S:1:0".into()),
        published: t0(),
    };
    parse_request(req, &rules())
}

fn valid(r: OutboundRequest) -> NewOutbound {
    match r {
        OutboundRequest::Valid(v) => v,
        OutboundRequest::Invalid(i) => panic!("expected valid, got invalid: {}", i.reason),
    }
}

fn invalid(r: OutboundRequest) -> InvalidOutbound {
    match r {
        OutboundRequest::Invalid(i) => i,
        OutboundRequest::Valid(v) => panic!("expected invalid, got {v:?}"),
    }
}

#[test]
fn a_plain_pacs_008_is_normal_priority_with_the_standard_deadline() {
    let m = valid(parse(SUBJECT, &[], PACS008));
    assert_eq!(m.msg_id, "M0003816612345678901234567890123");
    assert_eq!(m.msg_type, "pacs.008");
    assert_eq!(m.channel, ChannelId::Cpm);
    assert_eq!(m.priority, Priority::Normal);
    assert_eq!(m.deadline, t0() + Duration::from_secs(300));
    assert_eq!(m.end_to_end_ids, vec!["E9999901012341234123412345678900".to_owned()]);
    assert_eq!(m.ingress_ref.as_deref(), Some("S:1:0"));
}

#[test]
fn headers_set_priority_and_deadline_case_insensitively() {
    let m =
        valid(parse(SUBJECT, &[("cabine-priority", "critical"), ("CABINE-DEADLINE-CLASS", "saque_troco")], PACS008));
    assert_eq!((m.priority, m.deadline), (Priority::Critical, t0() + Duration::from_secs(30)));
    let m = valid(parse(SUBJECT, &[(DEADLINE_HEADER, "2024-01-02T10:00:00-03:00")], PACS008));
    assert_eq!(m.deadline, SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_200_400));
}

#[test]
fn ten_transactions_give_ten_end_to_end_ids() {
    let mut r = rules();
    r.max_message_bytes = 64 * 1024;
    let header = |_: &str| None;
    let req = RawRequest {
        channel: enabled_channel("cpm", &r),
        header: &header,
        body: Bytes::from(PACS008_10),
        ingress_ref: None,
        published: t0(),
    };
    let OutboundRequest::Valid(m) = parse_request(req, &r) else { panic!("valid") };
    assert_eq!(m.end_to_end_ids.len(), 10);
}

#[test]
fn an_outbound_status_report_is_about_its_original_end_to_end_id() {
    let pacs002 = include_str!("../../../tests/data/spi/pacs.002_PSP_1_msg.xml");
    let m = valid(parse(SUBJECT, &[], pacs002));
    assert_eq!(m.msg_type, "pacs.002");
    assert_eq!(m.end_to_end_ids, vec!["E9999901012341234123412345678900".to_owned()]);
}

#[test]
fn bad_headers_are_invalid_but_keep_what_was_read() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[(PRIORITY_HEADER, "urgent")], PRIORITY_HEADER),
        (&[(DEADLINE_HEADER, "tomorrow")], DEADLINE_HEADER),
        (&[(DEADLINE_CLASS_HEADER, "express")], DEADLINE_CLASS_HEADER),
        (&[(DEADLINE_HEADER, "2024-01-02T10:00:00Z"), (DEADLINE_CLASS_HEADER, "standard")], "both"),
    ];
    for (headers, why) in cases {
        let i = invalid(parse(SUBJECT, headers, PACS008));
        assert!(i.reason.contains(why), "{headers:?}: {}", i.reason);
        assert_eq!(i.claimed_msg_id.as_deref(), Some("M0003816612345678901234567890123"));
        assert_eq!((i.channel, i.raw.len()), (Some(ChannelId::Cpm), PACS008.len()), "kept whole");
    }
}

#[test]
fn malformed_or_incomplete_xml_is_invalid_and_kept() {
    let truncated = &PACS008[..PACS008.len() / 2];
    let no_type = PACS008.replace("<MsgDefIdr>pacs.008.spi.1.16</MsgDefIdr>", "");
    let no_id = PACS008.replace("M0003816612345678901234567890123", "");
    let odd_id = PACS008.replace("M0003816612345678901234567890123", "M-1 2");
    let nul_id = PACS008.replace("M0003816612345678901234567890123", "M00038166\0X");
    let huge_e2e = PACS008.replace("E9999901012341234123412345678900", &"E".repeat(4096));
    let nul_e2e = PACS008.replace("E9999901012341234123412345678900", "E99\09");
    let nul_type = PACS008.replace("pacs.008.spi.1.16", "pac\0s.008.spi.1.16");
    for (body, why) in [
        ("<Envelope><AppHdr></Envelope>", "malformed"),
        (truncated, "ends inside"),
        ("", "no XML"),
        (no_type.as_str(), "MsgDefIdr"),
        (no_id.as_str(), "MsgId"),
        (odd_id.as_str(), "letters and digits"),
        (nul_id.as_str(), "letters and digits"),
        (huge_e2e.as_str(), "(4096 bytes)"),
        (nul_e2e.as_str(), "EndToEndId \"E99\\09\""),
        (nul_type.as_str(), "message type"),
    ] {
        let i = invalid(parse(SUBJECT, &[], body));
        assert!(i.reason.contains(why), "{why}: {}", i.reason);
        assert_eq!(i.raw, Bytes::from(body.to_owned()));
        assert_eq!(i.ingress_ref.as_deref(), Some("S:1:0"));
    }
}

#[test]
fn subjects_must_name_our_ispb_and_an_enabled_channel() {
    for (subject, why) in [
        ("icom.out.12345678.cpm", "is not"),
        ("icom.out.99999010.csm", "not enabled"),
        ("icom.out.99999010.xyz", "a channel is"),
        ("icom.in.99999010.cpm", "is not"),
    ] {
        let i = invalid(parse(subject, &[], PACS008));
        assert!(i.reason.contains(why), "{subject}: {}", i.reason);
    }
}

#[test]
fn an_oversized_body_is_invalid() {
    let big = format!("{PACS008}<!--{}-->", "x".repeat(20 * 1024));
    assert!(invalid(parse(SUBJECT, &[], &big)).reason.contains("max_message_bytes"));
}
