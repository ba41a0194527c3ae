//! Reads what a participant sent (quick-xml, independent of `crate::icom`): the
//! AppHdr (Fr, To, BizMsgIdr, MsgDefIdr), the GrpHdr MsgId and the EndToEndIds.
//! Anything unreadable is a reason string: the message is still stored and
//! answered with an admi.002, as the Central Bank does.

use quick_xml::Reader;
use quick_xml::events::Event;

/// Deeper nesting than any catalog message is refused.
const MAX_DEPTH: usize = 32;
/// More transactions than any catalog message is refused.
const MAX_END_TO_END_IDS: usize = 100;

/// What the simulator needs from a sent message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Envelope {
    pub msg_def: String,
    pub biz_msg_id: String,
    pub msg_id: Option<String>,
    pub end_to_end_ids: Vec<String>,
    /// `IntrBkSttlmAmt` of each transaction, in the order of `end_to_end_ids`.
    pub amounts: Vec<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

impl Envelope {
    pub fn is_credit_transfer(&self) -> bool {
        self.msg_def.starts_with("pacs.008")
    }

    /// A reporting request (`camt.060`): answered with a statement.
    pub fn is_reporting_request(&self) -> bool {
        self.msg_def.starts_with("camt.060")
    }

    /// The identifier duplicates are judged by: GrpHdr/MsgId, else BizMsgIdr.
    pub fn dedup_id(&self) -> &str {
        self.msg_id.as_deref().unwrap_or(&self.biz_msg_id)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    MsgDef,
    BizMsgId,
    MsgId,
    EndToEndId,
    Amount,
    From,
    To,
}

/// Reads the envelope of one message, or says why it cannot.
pub fn read(xml: &[u8]) -> Result<Envelope, String> {
    let text = std::str::from_utf8(xml).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut reader = Reader::from_str(text);
    let mut path: Vec<String> = Vec::with_capacity(MAX_DEPTH);
    let mut env = Envelope::default();
    let mut field: Option<(Field, String)> = None;
    let (mut msg_def, mut biz, mut document) = (None, None, false);
    loop {
        let event = reader.read_event().map_err(|e| format!("XML error at byte {}: {e}", reader.error_position()))?;
        match event {
            Event::Start(start) => {
                if path.len() >= MAX_DEPTH {
                    return Err(format!("nesting deeper than {MAX_DEPTH}"));
                }
                let name = start.local_name().as_ref().to_owned();
                if path.is_empty() && name != "Envelope" {
                    return Err(format!("root element is {name}, not Envelope"));
                }
                if path.len() == 1 && name == "Document" {
                    document = true;
                }
                path.push(name);
                field = field_at(&path).map(|f| (f, String::new()));
            }
            Event::Text(t) => {
                if let Some((_, buf)) = field.as_mut() {
                    buf.push_str(t.xml10_content().trim());
                }
            }
            Event::End(_) => {
                if let Some((f, value)) = field.take() {
                    match f {
                        Field::MsgDef => msg_def = Some(value),
                        Field::BizMsgId => biz = Some(value),
                        Field::MsgId => env.msg_id = Some(value),
                        Field::From => env.from = Some(value),
                        Field::To => env.to = Some(value),
                        Field::EndToEndId if env.end_to_end_ids.len() < MAX_END_TO_END_IDS => {
                            env.end_to_end_ids.push(value)
                        }
                        Field::Amount if env.amounts.len() < MAX_END_TO_END_IDS => env.amounts.push(value),
                        Field::Amount => return Err(format!("more than {MAX_END_TO_END_IDS} amounts")),
                        Field::EndToEndId => return Err(format!("more than {MAX_END_TO_END_IDS} EndToEndIds")),
                    }
                }
                path.pop();
            }
            Event::Empty(_) if path.is_empty() => return Err("root element is empty".to_owned()),
            Event::DocType(_) => return Err("DOCTYPE is not allowed".to_owned()),
            Event::Eof => break,
            _ => {}
        }
    }
    if !path.is_empty() {
        return Err("document ends inside an element".to_owned());
    }
    env.msg_def = msg_def.filter(|s| !s.is_empty()).ok_or("AppHdr/MsgDefIdr is missing")?;
    env.biz_msg_id = biz.filter(|s| !s.is_empty()).ok_or("AppHdr/BizMsgIdr is missing")?;
    if !document {
        return Err("Document is missing".to_owned());
    }
    Ok(env)
}

fn field_at(path: &[String]) -> Option<Field> {
    let names: Vec<&str> = path.iter().map(String::as_str).collect();
    match names.as_slice() {
        ["Envelope", "AppHdr", "MsgDefIdr"] => Some(Field::MsgDef),
        ["Envelope", "AppHdr", "BizMsgIdr"] => Some(Field::BizMsgId),
        ["Envelope", "AppHdr", "Fr", "FIId", "FinInstnId", "Othr", "Id"] => Some(Field::From),
        ["Envelope", "AppHdr", "To", "FIId", "FinInstnId", "Othr", "Id"] => Some(Field::To),
        ["Envelope", "Document", _, "GrpHdr", "MsgId"] => Some(Field::MsgId),
        ["Envelope", "Document", _, _, "PmtId", "EndToEndId"] => Some(Field::EndToEndId),
        ["Envelope", "Document", _, _, "IntrBkSttlmAmt"] => Some(Field::Amount),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN: &str = include_str!("templates/pacs.008_END_1_msg.xml");

    #[test]
    fn reads_the_catalog_example() {
        let env = read(TEN.as_bytes()).unwrap();
        assert_eq!(env.msg_def, "pacs.008.spi.1.16");
        assert_eq!(env.biz_msg_id, "M0003816612345678901234567890123");
        assert_eq!(env.msg_id.as_deref(), Some("M0003816612345678901234567890123"));
        assert_eq!(env.end_to_end_ids, vec!["E9999901012341234123412345678900".to_owned()]);
        assert_eq!(env.from.as_deref(), Some("00038166"));
        assert_eq!(env.to.as_deref(), Some("99999010"));
        assert!(env.is_credit_transfer());
    }

    #[test]
    fn unreadable_messages_say_why() {
        for (bad, why) in [
            (&b"<Envelope><AppHdr>"[..], "inside"),
            (b"\xff\xfe", "UTF-8"),
            (b"<Other/>", "root"),
            (b"<Envelope><AppHdr><BizMsgIdr>M1</BizMsgIdr></AppHdr><Document/></Envelope>", "MsgDefIdr"),
            (b"<Envelope><AppHdr><MsgDefIdr>x</MsgDefIdr><BizMsgIdr>M1</BizMsgIdr></AppHdr></Envelope>", "Document"),
            (b"<Envelope><a></b></Envelope>", "XML error"),
            (b"", "MsgDefIdr"),
        ] {
            let err = read(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
