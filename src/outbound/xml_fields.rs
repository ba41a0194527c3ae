//! A small, bounded quick-xml reader for the few fields cabine needs from an
//! ISO 20022 envelope: the texts of the elements whose path ends with one of
//! a few suffixes (`AppHdr/BizMsgIdr`, `GrpHdr/MsgId`, `EndToEndId`, ...).
//! Namespaces are ignored (local names); a document that is not well formed
//! (mismatched or unclosed tags, bad UTF-8, no root) is an error.

use quick_xml::Reader;
use quick_xml::events::Event;

/// Deeper than any ISO 20022 message; a bound on hostile input.
const MAX_DEPTH: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XmlError {
    #[error("malformed XML at byte {at}: {reason}")]
    Malformed { at: u64, reason: String },
    #[error("XML nested deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("XML ends inside <{0}>")]
    Truncated(String),
    #[error("no XML element")]
    Empty,
    #[error("more than {0} values")]
    TooMany(usize),
}

/// The text of every element whose path ends with `wanted[i]` (local names
/// joined by `/`), in document order, as `(i, text)`; at most `max` values.
pub fn collect(raw: &[u8], wanted: &[&str], max: usize) -> Result<Vec<(usize, String)>, XmlError> {
    let suffixes: Vec<Vec<&str>> = wanted.iter().map(|w| w.split('/').collect()).collect();
    let mut reader = Reader::from_reader(raw);
    let mut path: Vec<String> = Vec::new();
    let mut open: Option<(usize, usize, String)> = None; // (wanted index, depth, text so far)
    let mut found = Vec::new();
    let mut seen_root = false;
    loop {
        let malformed = |e: &dyn std::fmt::Display, at: u64| XmlError::Malformed { at, reason: e.to_string() };
        let event = reader.read_event().map_err(|e| malformed(&e, reader.error_position()))?;
        let empty = matches!(event, Event::Empty(_));
        match event {
            Event::Start(e) | Event::Empty(e) => {
                let name = AsRef::<str>::as_ref(&e.local_name()).to_owned();
                if path.len() == MAX_DEPTH {
                    return Err(XmlError::TooDeep);
                }
                seen_root = true;
                path.push(name);
                if open.is_none()
                    && let Some(i) = suffixes.iter().position(|s| path.ends_with_names(s))
                {
                    open = Some((i, path.len(), String::new()));
                }
                if empty {
                    close(&mut path, &mut open, &mut found, max)?;
                }
            }
            Event::End(_) => close(&mut path, &mut open, &mut found, max)?,
            Event::Text(t) => append(&mut open, &t.xml10_content()),
            Event::CData(t) => append(&mut open, &t.xml10_content()),
            Event::GeneralRef(r) => {
                let c = match r.resolve_char_ref().map_err(|e| malformed(&e, reader.buffer_position()))? {
                    Some(c) => c,
                    None => predefined(&r.xml10_content()).ok_or_else(|| XmlError::Malformed {
                        at: reader.buffer_position(),
                        reason: format!("unknown entity &{};", r.xml10_content()),
                    })?,
                };
                append(&mut open, c.encode_utf8(&mut [0; 4]));
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
    match path.last() {
        Some(name) => Err(XmlError::Truncated(name.clone())),
        None if !seen_root => Err(XmlError::Empty),
        None => Ok(found),
    }
}

fn close(
    path: &mut Vec<String>,
    open: &mut Option<(usize, usize, String)>,
    found: &mut Vec<(usize, String)>,
    max: usize,
) -> Result<(), XmlError> {
    if let Some((i, depth, text)) = open.take() {
        if depth == path.len() {
            if found.len() == max {
                return Err(XmlError::TooMany(max));
            }
            found.push((i, text.trim().to_owned()));
        } else {
            *open = Some((i, depth, text));
        }
    }
    path.pop();
    Ok(())
}

fn append(open: &mut Option<(usize, usize, String)>, s: &str) {
    if let Some((_, _, text)) = open {
        text.push_str(s);
    }
}

fn predefined(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        _ => return None,
    })
}

trait EndsWithNames {
    fn ends_with_names(&self, suffix: &[&str]) -> bool;
}

impl EndsWithNames for Vec<String> {
    fn ends_with_names(&self, suffix: &[&str]) -> bool {
        self.len() >= suffix.len() && self[self.len() - suffix.len()..].iter().zip(suffix).all(|(a, b)| a == b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
        <Envelope xmlns="urn:x"><AppHdr><BizMsgIdr>M1</BizMsgIdr><Sgntr/></AppHdr>
        <Document><X><GrpHdr><MsgId> M2 </MsgId></GrpHdr>
        <Tx><PmtId><EndToEndId>E1</EndToEndId></PmtId></Tx><Tx><PmtId><EndToEndId>E&amp;2</EndToEndId></PmtId></Tx>
        </X></Document></Envelope>"#;

    #[test]
    fn collects_by_path_suffix_in_order() {
        let got = collect(DOC.as_bytes(), &["AppHdr/BizMsgIdr", "GrpHdr/MsgId", "EndToEndId", "Sgntr"], 10).unwrap();
        let want = [(0, "M1"), (3, ""), (1, "M2"), (2, "E1"), (2, "E&2")];
        assert_eq!(got, want.map(|(i, s)| (i, s.to_owned())).to_vec());
    }

    #[test]
    fn malformed_documents_are_errors() {
        assert!(matches!(collect(b"<a><b></a>", &["b"], 10), Err(XmlError::Malformed { .. })));
        assert!(matches!(collect(b"<a><b>x</b>", &["b"], 10), Err(XmlError::Truncated(n)) if n == "a"));
        assert_eq!(collect(b"   ", &["b"], 10), Err(XmlError::Empty));
        assert_eq!(collect(b"not xml at all", &["b"], 10), Err(XmlError::Empty));
        assert!(matches!(collect(b"<a>&bogus;</a>", &["a"], 10), Err(XmlError::Malformed { .. })));
        assert!(collect(b"<a>\xff</a>", &["a"], 10).is_err());
        let deep = "<a>".repeat(MAX_DEPTH + 1);
        assert_eq!(collect(deep.as_bytes(), &["b"], 10), Err(XmlError::TooDeep));
        assert_eq!(collect(b"<a><b>1</b><b>2</b></a>", &["b"], 1), Err(XmlError::TooMany(1)));
    }
}
