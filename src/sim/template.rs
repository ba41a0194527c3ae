//! Message templates compiled from the Central Bank's catalog examples (copied
//! into `templates/`): the example text stays byte for byte, except the texts
//! of the elements a generated message fills in ("slots"), found by path with
//! quick-xml once at start. Rendering is a concatenation, cheap per message.

use bytes::{BufMut, Bytes, BytesMut};
use quick_xml::Reader;
use quick_xml::events::Event;

/// What a template leaves open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    From,
    To,
    BizMsgId,
    Created,
    MsgId,
    EndToEndId,
    Amount,
    AcceptedAt,
    PayerIspb,
    PayeeIspb,
    Status,
    SettledAt,
    SettlementDate,
    Note,
    RelatedRef,
    Reason,
    RejectedAt,
    Description,
}

#[derive(Debug)]
enum Piece {
    Literal(&'static str),
    Slot(Slot),
}

/// A compiled template.
#[derive(Debug)]
pub struct Template {
    pieces: Vec<Piece>,
    literal_len: usize,
}

/// A template does not fit its slot list (a bug in the catalog copy or the paths).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template {name}: XML error at byte {at}: {reason}")]
    Xml { name: &'static str, at: u64, reason: String },
    #[error("template {name}: no element text at {path}")]
    MissingSlot { name: &'static str, path: &'static str },
}

impl Template {
    /// Compiles `xml`, opening every element text whose path (below the root, `/`-separated
    /// local names) is listed. Each listed path must occur at least once.
    pub fn compile(
        name: &'static str,
        xml: &'static str,
        slots: &[(&'static str, Slot)],
    ) -> Result<Template, TemplateError> {
        let mut reader = Reader::from_str(xml);
        let mut path: Vec<String> = Vec::new();
        let mut cuts: Vec<(usize, usize, Slot)> = Vec::new();
        let mut seen = vec![false; slots.len()];
        loop {
            let before = reader.buffer_position() as usize;
            let event = reader.read_event().map_err(|e| TemplateError::Xml {
                name,
                at: reader.error_position(),
                reason: e.to_string(),
            })?;
            match event {
                Event::Start(start) => path.push(start.local_name().as_ref().to_owned()),
                Event::End(_) => {
                    path.pop();
                }
                Event::Text(text) if !text.xml10_content().trim().is_empty() => {
                    let after = reader.buffer_position() as usize;
                    if let Some(i) = slots.iter().position(|(p, _)| path_is(&path, p)) {
                        seen[i] = true;
                        cuts.push((before, after, slots[i].1));
                    }
                }
                Event::Eof => break,
                _ => {}
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(TemplateError::MissingSlot { name, path: slots[i].0 });
        }
        let mut pieces = Vec::with_capacity(cuts.len() * 2 + 1);
        let mut at = 0;
        for (start, end, slot) in cuts {
            pieces.push(Piece::Literal(&xml[at..start]));
            pieces.push(Piece::Slot(slot));
            at = end;
        }
        pieces.push(Piece::Literal(&xml[at..]));
        let literal_len = xml.len();
        Ok(Template { pieces, literal_len })
    }

    /// Renders with `fill` giving the text of each slot (already XML-safe).
    pub fn render<'a>(&self, fill: impl Fn(Slot) -> &'a str) -> Bytes {
        let mut out = BytesMut::with_capacity(self.literal_len + 64);
        for piece in &self.pieces {
            match piece {
                Piece::Literal(s) => out.put_slice(s.as_bytes()),
                Piece::Slot(slot) => out.put_slice(fill(*slot).as_bytes()),
            }
        }
        out.freeze()
    }
}

/// `path` (from the root) minus the root element equals `wanted`.
fn path_is(path: &[String], wanted: &str) -> bool {
    let mut below_root = path.iter().skip(1);
    let mut parts = wanted.split('/');
    loop {
        match (below_root.next(), parts.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if *a == b => continue,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = "<?xml version=\"1.0\"?>\n<Envelope xmlns=\"x\">\n  <A><B>old</B><C k=\"v\">keep</C></A>\n  <B>other</B>\n</Envelope>";

    #[test]
    fn slots_are_replaced_and_the_rest_is_kept_byte_for_byte() {
        let t = Template::compile("t", XML, &[("A/B", Slot::BizMsgId), ("B", Slot::To)]).unwrap();
        let out = t.render(|s| match s {
            Slot::BizMsgId => "new",
            _ => "there",
        });
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<?xml version=\"1.0\"?>\n<Envelope xmlns=\"x\">\n  <A><B>new</B><C k=\"v\">keep</C></A>\n  <B>there</B>\n</Envelope>"
        );
    }

    #[test]
    fn a_missing_path_is_an_error() {
        let err = Template::compile("t", XML, &[("A/Z", Slot::To)]).unwrap_err();
        assert!(matches!(err, TemplateError::MissingSlot { path: "A/Z", .. }));
    }
}
