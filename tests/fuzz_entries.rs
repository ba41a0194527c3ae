//! The outbound request parser's and the simulator's send parser's fuzzing
//! entry points on stable: arbitrary bytes, and real catalog messages framed
//! as a request then mutated. The nightly targets (`fuzz/`) run the same
//! entry points for millions of executions.

use std::io::Write;

use proptest::prelude::*;

fn example(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/spi/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const EXAMPLES: [&str; 4] =
    ["pacs.008_END_1_msg.xml", "pacs.008_END_10_msg.xml", "pacs.002_PSP_1_msg.xml", "pacs.002_ERRO_1_msg.xml"];

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A bus request: subject, headers, empty line, body.
fn outbound_input(name: &str, headers: &[&str]) -> Vec<u8> {
    let mut out = b"cabine.out.99999010.cpm\n".to_vec();
    for h in headers {
        out.extend_from_slice(h.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(&example(name));
    out
}

/// A send: Content-Type line, Content-Encoding line, body (one message or a multipart of several).
fn send_input(names: &[&str], multipart: bool, gzipped: bool) -> Vec<u8> {
    let (ct, body) = if multipart {
        let mut body = Vec::new();
        for n in names {
            body.extend_from_slice(b"--b\r\nContent-Type: application/xml; charset=utf-8\r\n\r\n");
            body.extend_from_slice(&example(n));
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"--b--\r\n");
        ("multipart/mixed; boundary=b", body)
    } else {
        ("application/xml; charset=utf-8", example(names[0]))
    };
    let (enc, body) = if gzipped { ("gzip", gzip(&body)) } else { ("", body) };
    [format!("{ct}\n{enc}\n").into_bytes(), body].concat()
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Cut(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let tokens = prop::sample::select(vec![
        b"\0".to_vec(),
        b"<EndToEndId>".to_vec(),
        b"</MsgId>".to_vec(),
        "E".repeat(3000).into_bytes(),
        b"\r\n--b\r\n".to_vec(),
        b"<![CDATA[".to_vec(),
        b"&#0;".to_vec(),
        b"Cabine-Deadline: 2024-13-40T99:00:00Z\n".to_vec(),
    ]);
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Flip(at, b)),
        (any::<usize>(), tokens).prop_map(|(at, t)| Mutation::Insert(at, t)),
        (any::<usize>(), 1usize..64).prop_map(|(at, n)| Mutation::Cut(at, n)),
    ]
}

fn mutate(mut data: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = data.len().max(1);
        match m {
            Mutation::Flip(at, b) if !data.is_empty() => data[at % len] ^= b,
            Mutation::Insert(at, t) => {
                let at = at % (data.len() + 1);
                data.splice(at..at, t.iter().copied());
            }
            Mutation::Cut(at, n) if !data.is_empty() => {
                let at = at % len;
                data.drain(at..(at + n).min(data.len()));
            }
            _ => {}
        }
    }
    data
}

#[test]
fn the_unmutated_inputs_run_through() {
    for name in EXAMPLES {
        let valid = cabine::outbound::ingress::fuzz_entry(&outbound_input(name, &["Cabine-Priority: high"]));
        assert!(valid, "{name} as it is makes a valid request");
        let mut nul = outbound_input(name, &["Cabine-Priority: high"]);
        let at = nul.windows(7).position(|w| w == b"<MsgId>").expect("a GrpHdr/MsgId") + 7;
        nul.insert(at, 0);
        assert!(!cabine::outbound::ingress::fuzz_entry(&nul), "{name} with a NUL in its MsgId is invalid");
        for (multipart, gzipped) in [(false, false), (false, true), (true, false), (true, true)] {
            cabine::sim::fuzz_entry(&send_input(&[name, EXAMPLES[0]], multipart, gzipped));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_outbound_parser_survives_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..1024)) {
        let _ = cabine::outbound::ingress::fuzz_entry(&data);
    }

    #[test]
    fn the_sim_send_parser_survives_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..1024)) {
        cabine::sim::fuzz_entry(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn the_outbound_parser_survives_mutated_real_requests(
        name in prop::sample::select(EXAMPLES.to_vec()),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let _ = cabine::outbound::ingress::fuzz_entry(&mutate(outbound_input(name, &["Cabine-Deadline-Class: saque_troco"]), &mutations));
    }

    #[test]
    fn the_sim_send_parser_survives_mutated_real_sends(
        names in prop::collection::vec(prop::sample::select(EXAMPLES.to_vec()), 1..=3),
        multipart in any::<bool>(),
        gzipped in any::<bool>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        cabine::sim::fuzz_entry(&mutate(send_input(&names, multipart, gzipped), &mutations));
    }
}
