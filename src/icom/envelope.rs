//! Reads what routing and deduplication need from an ISO 20022 ICOM message
//! (`<Envelope><AppHdr>…</AppHdr><Document>…</Document></Envelope>`) with
//! quick-xml, matching local names (namespaces vary by message type).
//! A body that is not such a message is an [`EnvelopeError`], never a
//! transport failure: the caller keeps its raw bytes and marks it malformed.

use quick_xml::Reader;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::Event;

use cabine_actors::ports::MessageMeta;

/// Elements nested deeper than this make the message malformed (no ICOM message comes close).
pub const MAX_DEPTH: usize = 64;

/// The fields read from one message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Envelope {
    /// `AppHdr/MsgDefIdr`, e.g. `pacs.008.spi.1.16`.
    pub msg_def: String,
    /// `AppHdr/BizMsgIdr`.
    pub biz_msg_id: String,
    /// `AppHdr/CreDt`, as written.
    pub created: Option<String>,
    /// `AppHdr/Fr/FIId/FinInstnId/Othr/Id` (an ISPB).
    pub from: Option<String>,
    /// `AppHdr/To/FIId/FinInstnId/Othr/Id`.
    pub to: Option<String>,
    /// `Document/*/GrpHdr/MsgId`.
    pub msg_id: Option<String>,
    /// Every `EndToEndId` (pacs.008) and `OrgnlEndToEndId` (pacs.002) in document order.
    pub end_to_end_ids: Vec<String>,
}

impl From<&Envelope> for MessageMeta {
    fn from(e: &Envelope) -> Self {
        MessageMeta {
            msg_def: Some(e.msg_def.clone()),
            biz_msg_id: Some(e.biz_msg_id.clone()),
            msg_id: e.msg_id.clone(),
            end_to_end_id: e.end_to_end_ids.first().cloned(),
            from: e.from.clone(),
            to: e.to.clone(),
        }
    }
}

/// Why a body is not a readable ICOM message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not UTF-8 at byte {0}")]
    NotUtf8(usize),
    #[error("XML error at byte {position}: {reason}")]
    Xml { position: u64, reason: String },
    #[error("root element is <{0}>, not <Envelope>")]
    NotAnEnvelope(String),
    #[error("elements nested deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("missing {0}")]
    Missing(&'static str),
    /// A NUL or another control character XML 1.0 forbids, in a field cabine stores.
    #[error("{field} holds U+{code:04X}, a character XML 1.0 forbids")]
    ForbiddenChar { field: &'static str, code: u32 },
}

/// Which field a text node belongs to, by its element path below `Envelope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    MsgDef,
    BizMsgId,
    Created,
    From,
    To,
    MsgId,
    EndToEndId,
}

/// Path of a party's ISPB below `Fr` / `To`.
const PARTY_ID: [&str; 4] = ["FIId", "FinInstnId", "Othr", "Id"];

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::MsgDef => "AppHdr/MsgDefIdr",
            Field::BizMsgId => "AppHdr/BizMsgIdr",
            Field::Created => "AppHdr/CreDt",
            Field::From => "AppHdr/Fr",
            Field::To => "AppHdr/To",
            Field::MsgId => "GrpHdr/MsgId",
            Field::EndToEndId => "EndToEndId",
        }
    }
}

/// Characters outside XML 1.0's `Char` production: controls but tab, LF and CR; U+FFFE, U+FFFF.
fn forbidden(c: char) -> bool {
    (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || matches!(c, '\u{FFFE}' | '\u{FFFF}')
}

fn field_at(path: &[String]) -> Option<Field> {
    let names: Vec<&str> = path.iter().map(String::as_str).collect();
    match names.as_slice() {
        ["Envelope", "AppHdr", "MsgDefIdr"] => Some(Field::MsgDef),
        ["Envelope", "AppHdr", "BizMsgIdr"] => Some(Field::BizMsgId),
        ["Envelope", "AppHdr", "CreDt"] => Some(Field::Created),
        ["Envelope", "AppHdr", "Fr", rest @ ..] if *rest == PARTY_ID => Some(Field::From),
        ["Envelope", "AppHdr", "To", rest @ ..] if *rest == PARTY_ID => Some(Field::To),
        ["Envelope", "Document", _, "GrpHdr", "MsgId"] => Some(Field::MsgId),
        ["Envelope", "Document", .., "EndToEndId" | "OrgnlEndToEndId"] => Some(Field::EndToEndId),
        _ => None,
    }
}

/// Reads the envelope of one message.
pub fn read(raw: &[u8]) -> Result<Envelope, EnvelopeError> {
    let text = std::str::from_utf8(raw).map_err(|e| EnvelopeError::NotUtf8(e.valid_up_to()))?;
    let mut reader = Reader::from_str(text);
    let mut path: Vec<String> = Vec::with_capacity(16);
    let mut current: Option<(Field, String)> = None;
    let mut envelope = Envelope::default();
    let mut seen_root = false;
    loop {
        let position = reader.buffer_position();
        let event = reader.read_event().map_err(|e| EnvelopeError::Xml { position, reason: e.to_string() })?;
        match event {
            Event::Start(start) => {
                let name = start.local_name().as_ref().to_owned();
                enter(&mut path, &mut seen_root, name)?;
                current = field_at(&path).map(|f| (f, String::new()));
            }
            Event::Empty(start) => {
                let name = start.local_name().as_ref().to_owned();
                enter(&mut path, &mut seen_root, name)?;
                path.pop();
            }
            Event::Text(t) => append(&mut current, &t.xml10_content()),
            Event::CData(c) => append(&mut current, &c.xml10_content()),
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    _ => resolve_predefined_entity(&r)
                        .map(str::to_owned)
                        .ok_or_else(|| EnvelopeError::Xml { position, reason: format!("unknown entity &{};", &*r) })?,
                };
                append(&mut current, &resolved);
            }
            Event::End(_) => {
                if let Some((field, value)) = current.take() {
                    if let Some(c) = value.chars().find(|c| forbidden(*c)) {
                        return Err(EnvelopeError::ForbiddenChar { field: field.name(), code: u32::from(c) });
                    }
                    store(&mut envelope, field, value.trim());
                }
                path.pop();
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
    if !path.is_empty() || !seen_root {
        return Err(EnvelopeError::Xml { position: reader.buffer_position(), reason: "unexpected end".into() });
    }
    if envelope.msg_def.is_empty() {
        return Err(EnvelopeError::Missing("AppHdr/MsgDefIdr"));
    }
    if envelope.biz_msg_id.is_empty() {
        return Err(EnvelopeError::Missing("AppHdr/BizMsgIdr"));
    }
    Ok(envelope)
}

fn enter(path: &mut Vec<String>, seen_root: &mut bool, name: String) -> Result<(), EnvelopeError> {
    if path.is_empty() {
        if *seen_root {
            return Err(EnvelopeError::Xml { position: 0, reason: "a second root element".into() });
        }
        if name != "Envelope" {
            return Err(EnvelopeError::NotAnEnvelope(name));
        }
        *seen_root = true;
    }
    if path.len() == MAX_DEPTH {
        return Err(EnvelopeError::TooDeep);
    }
    path.push(name);
    Ok(())
}

fn append(current: &mut Option<(Field, String)>, text: &str) {
    if let Some((_, value)) = current {
        value.push_str(text);
    }
}

fn store(envelope: &mut Envelope, field: Field, value: &str) {
    let keep_first = |slot: &mut Option<String>| {
        if slot.is_none() {
            *slot = Some(value.to_owned());
        }
    };
    match field {
        Field::MsgDef if envelope.msg_def.is_empty() => envelope.msg_def = value.to_owned(),
        Field::BizMsgId if envelope.biz_msg_id.is_empty() => envelope.biz_msg_id = value.to_owned(),
        Field::Created => keep_first(&mut envelope.created),
        Field::From => keep_first(&mut envelope.from),
        Field::To => keep_first(&mut envelope.to),
        Field::MsgId => keep_first(&mut envelope.msg_id),
        Field::EndToEndId => envelope.end_to_end_ids.push(value.to_owned()),
        Field::MsgDef | Field::BizMsgId => {}
    }
}
