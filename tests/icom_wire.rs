//! The ICOM wire format against real catalog messages and an independent
//! parser: multer reads what `cabine::icom::multipart` builds; envelope
//! extraction is checked on every example of the Central Bank's catalog; limit
//! violations give their typed error; the fuzz entry point survives thousands
//! of arbitrary and mutated bodies.

use std::io::Read;

use bytes::Bytes;
use proptest::prelude::*;

use cabine::icom::inbound::{BodyHead, decode_batch};
use cabine::icom::multipart::{self, Part};
use cabine::icom::{WireError, WireLimits, envelope, fuzz_entry, gzip};

fn example(name: &str) -> Bytes {
    let path = format!("{}/tests/data/spi/{name}", env!("CARGO_MANIFEST_DIR"));
    Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

const EXAMPLES: [&str; 6] = [
    "pacs.008_END_1_msg.xml",
    "pacs.008_CONTA_1_msg.xml",
    "pacs.008_END_10_msg.xml",
    "pacs.002_PSP_1_msg.xml",
    "pacs.002_SPI_1_msg.xml",
    "pacs.002_ERRO_1_msg.xml",
];

const SPI_BIZ: &str = "M0003816612345678901234567890123";
const PSP_BIZ: &str = "M9999901012345678901234567890123";
const E2E: &str = "E9999901012341234123412345678900";

#[test]
fn envelopes_of_every_catalog_example() {
    for name in EXAMPLES {
        let env = envelope::read(&example(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(env.created.as_deref(), Some("2020-01-01T08:30:12.000Z"), "{name}");
        let (def, biz, from, to) = match name {
            n if n.starts_with("pacs.008") => ("pacs.008.spi.1.16", SPI_BIZ, "00038166", "99999010"),
            "pacs.002_PSP_1_msg.xml" => ("pacs.002.spi.1.17", PSP_BIZ, "99999010", "00038166"),
            _ => ("pacs.002.spi.1.17", SPI_BIZ, "00038166", "99999010"),
        };
        assert_eq!(env.msg_def, def, "{name}");
        assert_eq!(env.biz_msg_id, biz, "{name}");
        assert_eq!(env.msg_id.as_deref(), Some(biz), "{name}: GrpHdr/MsgId");
        assert_eq!((env.from.as_deref(), env.to.as_deref()), (Some(from), Some(to)), "{name}");
        let expected_e2e: Vec<String> = if name == "pacs.008_END_10_msg.xml" {
            (0..10).map(|i| format!("E999990101234123412341234567890{i}")).collect()
        } else {
            vec![E2E.to_owned()]
        };
        assert_eq!(env.end_to_end_ids, expected_e2e, "{name}");
    }
}

#[test]
fn a_nul_or_control_character_in_a_stored_field_makes_the_message_malformed() {
    let good = String::from_utf8(example("pacs.008_END_1_msg.xml").to_vec()).unwrap();
    for (from, to, field) in [
        (SPI_BIZ, "M00038166\x001234", "AppHdr/BizMsgIdr"),
        (E2E, "E99999010\u{1}", "EndToEndId"),
        ("pacs.008.spi.1.16", "pacs.008\0", "AppHdr/MsgDefIdr"),
    ] {
        let bad = good.replacen(from, to, 1);
        match envelope::read(bad.as_bytes()) {
            Err(envelope::EnvelopeError::ForbiddenChar { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let tab = good.replacen(E2E, &format!("\t{E2E}\n"), 1);
    assert_eq!(envelope::read(tab.as_bytes()).unwrap().end_to_end_ids, [E2E], "whitespace is fine, trimmed");
}

#[test]
fn a_multipart_batch_of_the_catalog_maps_into_inbound_messages() {
    let parts: Vec<Part> = EXAMPLES
        .iter()
        .enumerate()
        .map(|(i, n)| Part { resource_id: Some(format!("R{i}")), content_type: None, body: example(n) })
        .collect();
    let (boundary, body) = multipart::build_fresh(&parts, &WireLimits::ICOM).unwrap();
    let gz = gzip::compress(&body).unwrap();
    let ct = multipart::content_type(&boundary);
    let head = BodyHead { content_type: Some(&ct), content_encoding: Some("gzip"), resource_id: None };
    let batch = decode_batch(head, Bytes::from(gz), &WireLimits::ICOM).unwrap();
    assert_eq!(batch.len(), 6);
    for (i, (m, name)) in batch.iter().zip(EXAMPLES).enumerate() {
        assert_eq!(m.resource_id, format!("R{i}"));
        assert_eq!(m.raw, example(name), "raw bytes are kept exactly");
        assert_eq!(m.malformed, None, "{name}");
        assert_eq!(m.meta.end_to_end_id.as_deref(), Some(E2E), "{name}");
    }
    assert_eq!(batch[0].meta.msg_type(), "pacs.008");
    assert_eq!(batch[3].meta.msg_type(), "pacs.002");
    assert_eq!(batch[3].meta.from.as_deref(), Some("99999010"));
}

#[test]
fn malformed_xml_is_a_message_marked_malformed_with_raw_kept() {
    let cut = example("pacs.008_END_1_msg.xml").slice(..500);
    let wrong_root = Bytes::from_static(b"<Document><GrpHdr><MsgId>M1</MsgId></GrpHdr></Document>");
    let no_def = Bytes::from_static(b"<Envelope><AppHdr><BizMsgIdr>M1</BizMsgIdr></AppHdr></Envelope>");
    let latin1 = Bytes::from_static(b"<Envelope>\xe7\xe3o</Envelope>");
    let mismatched = Bytes::from_static(b"<Envelope><AppHdr></Document></Envelope>");
    let bodies = [cut, wrong_root, no_def, latin1, mismatched, example("pacs.002_SPI_1_msg.xml")];
    let parts: Vec<Part> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| Part { resource_id: Some(format!("R{i}")), content_type: None, body: b.clone() })
        .collect();
    let (boundary, body) = multipart::build_fresh(&parts, &WireLimits::ICOM).unwrap();
    let ct = multipart::content_type(&boundary);
    let head = BodyHead { content_type: Some(&ct), ..Default::default() };
    let batch = decode_batch(head, Bytes::from(body), &WireLimits::ICOM).unwrap();
    let reasons: Vec<Option<&str>> = batch.iter().map(|m| m.malformed.as_deref()).collect();
    assert!(reasons[0].unwrap().contains("unexpected end") || reasons[0].unwrap().contains("XML"), "{reasons:?}");
    assert_eq!(reasons[1], Some("root element is <Document>, not <Envelope>"));
    assert_eq!(reasons[2], Some("missing AppHdr/MsgDefIdr"));
    assert_eq!(reasons[3], Some("not UTF-8 at byte 10"));
    assert!(reasons[4].unwrap().starts_with("XML error"), "{reasons:?}");
    assert_eq!(reasons[5], None);
    for (m, raw) in batch.iter().zip(&bodies) {
        assert_eq!(&m.raw, raw);
    }
    assert_eq!(batch[1].meta, Default::default(), "no half-read metadata from a malformed message");
}

#[test]
fn each_limit_violation_has_its_own_error() {
    let limits = WireLimits::ICOM;
    let decode = |ct: &str, enc: Option<&str>, body: Vec<u8>| {
        decode_batch(
            BodyHead { content_type: Some(ct), content_encoding: enc, resource_id: Some("R") },
            body.into(),
            &limits,
        )
    };
    let loose = WireLimits { max_parts: 11, ..limits };
    let eleven: Vec<Part> = (0..11).map(|i| Part::xml(Bytes::from(format!("<m{i}/>")))).collect();
    let body = multipart::build(&eleven, "b11", &loose).unwrap();
    assert_eq!(decode("multipart/mixed; boundary=b11", None, body).unwrap_err(), WireError::TooManyParts { max: 10 });

    let bomb = gzip::compress(&vec![b'<'; 6 * 1024 * 1024]).unwrap();
    assert!(bomb.len() < 64 * 1024);
    assert_eq!(
        decode("application/xml", Some("gzip"), bomb).unwrap_err(),
        WireError::BodyTooLarge { max: limits.max_body_bytes }
    );
    assert_eq!(
        decode("application/xml", None, vec![b' '; limits.max_body_bytes + 1]).unwrap_err(),
        WireError::BodyTooLarge { max: limits.max_body_bytes }
    );

    let long = format!("multipart/mixed; boundary={}", "b".repeat(71));
    assert_eq!(decode(&long, None, b"--x".to_vec()).unwrap_err(), WireError::BoundaryTooLong { len: 71, max: 70 });

    let header = format!("--b\r\nPI-ResourceId: {}\r\n\r\n<m/>\r\n--b--\r\n", "r".repeat(9000));
    assert_eq!(
        decode("multipart/mixed; boundary=b", None, header.into_bytes()).unwrap_err(),
        WireError::HeaderTooLong { max: 8192 }
    );
    assert_eq!(
        decode("application/xml", Some("br"), b"x".to_vec()).unwrap_err(),
        WireError::ContentEncoding("br".into())
    );
    let no_id = b"--b\r\n\r\n<m/>\r\n--b--\r\n".to_vec();
    assert_eq!(
        decode("multipart/mixed; boundary=b", None, no_id).unwrap_err(),
        WireError::MissingResourceId { index: 0 }
    );
}

/// Parses a multipart body with multer, the independent parser.
fn multer_parts(body: Vec<u8>, boundary: &str) -> Vec<(Option<String>, Option<String>, Bytes)> {
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(body)) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    futures::executor::block_on(async {
        let mut out = Vec::new();
        while let Some(field) = multipart.next_field().await.expect("multer reads the body") {
            let header = |n: &str| field.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
            let (id, ct) = (header("pi-resourceid"), header("content-type"));
            out.push((id, ct, field.bytes().await.expect("multer reads the part")));
        }
        out
    })
}

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut out).unwrap();
    out
}

fn part_strategy() -> impl Strategy<Value = Part> {
    let body = prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..2048).prop_map(Bytes::from),
        1 => proptest::sample::select(EXAMPLES.to_vec()).prop_map(example),
    ];
    (proptest::option::of("[A-Za-z0-9_.-]{1,64}"), body).prop_map(|(resource_id, body)| Part {
        resource_id,
        content_type: Some("application/xml".into()),
        body,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn multipart_gzip_round_trips_through_multer_and_our_parser(parts in proptest::collection::vec(part_strategy(), 1..=10)) {
        let limits = WireLimits::ICOM;
        let (boundary, body) = multipart::build_fresh(&parts, &limits).unwrap();
        let gz = gzip::compress(&body).unwrap();

        let theirs = multer_parts(gunzip(&gz), &boundary);
        prop_assert_eq!(theirs.len(), parts.len());
        for ((id, ct, bytes), part) in theirs.iter().zip(&parts) {
            prop_assert_eq!(id, &part.resource_id);
            prop_assert_eq!(ct, &part.content_type);
            prop_assert_eq!(bytes, &part.body);
        }

        let ours = multipart::parse(&Bytes::from(gzip::decompress(&gz, limits.max_body_bytes).unwrap()), &boundary, &limits).unwrap();
        prop_assert_eq!(&ours, &parts);

        if parts.iter().all(|p| p.resource_id.is_some()) {
            let ct = multipart::content_type(&boundary);
            let head = BodyHead { content_type: Some(&ct), content_encoding: Some("gzip"), resource_id: None };
            let batch = decode_batch(head, Bytes::from(gz), &limits).unwrap();
            for (m, p) in batch.iter().zip(&parts) {
                prop_assert_eq!(Some(&m.resource_id), p.resource_id.as_ref());
                prop_assert_eq!(&m.raw, &p.body);
            }
        }
    }

    #[test]
    fn a_single_gzipped_message_round_trips(body in proptest::collection::vec(any::<u8>(), 0..8192), id in "[A-Za-z0-9]{1,40}") {
        let gz = gzip::compress(&body).unwrap();
        let head = BodyHead { content_type: Some("application/xml; charset=utf-8"), content_encoding: Some("gzip"), resource_id: Some(&id) };
        let batch = decode_batch(head, Bytes::from(gz), &WireLimits::ICOM).unwrap();
        prop_assert_eq!(batch.len(), 1);
        prop_assert_eq!(&batch[0].resource_id, &id);
        prop_assert_eq!(&batch[0].raw[..], &body[..]);
    }
}

/// Bytes made of the tokens a multipart ICOM body is built from, in any order.
fn token_soup() -> impl Strategy<Value = Vec<u8>> {
    let tokens: Vec<&'static [u8]> = vec![
        b"--b",
        b"--b--",
        b"\r\n",
        b"\n",
        b"\r\n\r\n",
        b"PI-ResourceId: R1",
        b"PI-ResourceId:",
        b"Content-Type: x",
        b": ",
        b" ",
        b"<Envelope>",
        b"</Envelope>",
        b"<AppHdr>",
        b"</AppHdr>",
        b"<MsgDefIdr>pacs.008</MsgDefIdr>",
        b"<BizMsgIdr>M1</BizMsgIdr>",
        b"&amp;",
        b"&#x0;",
        b"&bogus;",
        b"<![CDATA[x]]>",
        b"<!--",
        b"\xff",
    ];
    proptest::collection::vec(proptest::sample::select(tokens), 0..64).prop_map(|ts| ts.concat())
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Repeat(usize, usize),
}

fn mutate(mut data: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if data.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(at, bits) => {
                let i = at % data.len();
                data[i] ^= bits;
            }
            Mutation::Truncate(at) => data.truncate(at % data.len()),
            Mutation::Insert(at, bytes) => {
                let i = at % data.len();
                data.splice(i..i, bytes.iter().copied());
            }
            Mutation::Repeat(at, len) => {
                let i = at % data.len();
                let end = (i + len % 64).min(data.len());
                let copy = data[i..end].to_vec();
                data.splice(i..i, copy);
            }
        }
    }
    data
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(a, b)| Mutation::Flip(a, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(a, b)| Mutation::Insert(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, l)| Mutation::Repeat(a, l)),
    ]
}

/// A real response body (1..=3 catalog messages, multipart or not, gzip or not) as fuzz input.
fn real_input(names: &[&str], multipart: bool, gzipped: bool) -> Vec<u8> {
    let (ct, body) = if multipart {
        let parts: Vec<Part> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Part { resource_id: Some(format!("R{i}")), content_type: None, body: example(n) })
            .collect();
        let body = multipart::build(&parts, "b", &WireLimits::ICOM).unwrap();
        ("multipart/mixed; boundary=b".to_owned(), body)
    } else {
        ("application/xml; charset=utf-8".to_owned(), example(names[0]).to_vec())
    };
    let body = if gzipped { gzip::compress(&body).unwrap() } else { body };
    [ct.into_bytes(), b"\n".to_vec(), body].concat()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_entry_survives_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        fuzz_entry(&data);
    }

    #[test]
    fn fuzz_entry_survives_token_soup(soup in token_soup(), gzipped in any::<bool>()) {
        let body = if gzipped { gzip::compress(&soup).unwrap() } else { soup };
        fuzz_entry(&[b"multipart/mixed; boundary=b\n".to_vec(), body].concat());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_entry_survives_mutated_real_messages(
        names in proptest::collection::vec(proptest::sample::select(vec![EXAMPLES[0], EXAMPLES[1], EXAMPLES[3], EXAMPLES[5]]), 1..=3),
        multipart in any::<bool>(),
        gzipped in any::<bool>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        fuzz_entry(&mutate(real_input(&names, multipart, gzipped), &mutations));
    }
}

#[test]
fn the_unmutated_real_inputs_decode() {
    for (multipart, gzipped) in [(false, false), (false, true), (true, false), (true, true)] {
        let input = real_input(&EXAMPLES[..3], multipart, gzipped);
        let split = input.iter().position(|b| *b == b'\n').unwrap();
        let ct = std::str::from_utf8(&input[..split]).unwrap();
        let head =
            BodyHead { content_type: Some(ct), content_encoding: gzipped.then_some("gzip"), resource_id: Some("R0") };
        let batch = decode_batch(head, Bytes::copy_from_slice(&input[split + 1..]), &WireLimits::ICOM).unwrap();
        assert_eq!(batch.len(), if multipart { 3 } else { 1 });
        assert!(batch.iter().all(|m| m.malformed.is_none()));
        fuzz_entry(&input);
    }
}
