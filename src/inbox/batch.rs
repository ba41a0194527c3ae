//! A batch of inbound messages as the column arrays of the one-statement commit
//! (`UNNEST`), with the two repairs that keep every message storable: text
//! without NUL bytes, and a deterministic key for a part that has no ResourceId.

use cabine_actors::ports::InboundMessage;

/// At most this many messages per commit: one ICOM read (multipart, 10 parts).
pub const MAX_BATCH: usize = 10;

/// Reason recorded when a part came without a `PI-ResourceId`.
const NO_RESOURCE_ID: &str = "no PI-ResourceId";

/// The batch, column by column, in message order.
#[derive(Debug, Default)]
pub struct BatchColumns {
    pub resource_id: Vec<String>,
    pub msg_id: Vec<Option<String>>,
    pub msg_def: Vec<Option<String>>,
    pub biz_msg_id: Vec<Option<String>>,
    pub end_to_end_id: Vec<Option<String>>,
    pub from_ispb: Vec<Option<String>>,
    pub to_ispb: Vec<Option<String>>,
    pub raw: Vec<Vec<u8>>,
    /// `Some` makes the row `malformed`.
    pub reason: Vec<Option<String>>,
}

impl BatchColumns {
    pub fn from_messages(batch: &[InboundMessage]) -> Self {
        let mut cols = BatchColumns::default();
        for (position, m) in batch.iter().enumerate() {
            let (resource_id, reason) = storable_key(m, position);
            cols.resource_id.push(resource_id);
            cols.reason.push(reason);
            cols.msg_id.push(clean_opt(&m.meta.msg_id));
            cols.msg_def.push(clean_opt(&m.meta.msg_def));
            cols.biz_msg_id.push(clean_opt(&m.meta.biz_msg_id));
            cols.end_to_end_id.push(clean_opt(&m.meta.end_to_end_id));
            cols.from_ispb.push(clean_opt(&m.meta.from));
            cols.to_ispb.push(clean_opt(&m.meta.to));
            cols.raw.push(m.raw.to_vec());
        }
        cols
    }
}

/// The message as it was stored: the key and malformed reason the row got.
pub fn as_stored(m: &InboundMessage, position: usize) -> InboundMessage {
    let (resource_id, malformed) = storable_key(m, position);
    InboundMessage { resource_id, malformed, ..m.clone() }
}

/// The row key and the malformed reason. A part without a ResourceId is keyed by
/// its content and position (`missing:{fnv64 of raw}:{position}`): stable when
/// the same batch is redelivered, distinct for different parts, never dropped.
fn storable_key(m: &InboundMessage, position: usize) -> (String, Option<String>) {
    let key = clean(&m.resource_id);
    if !key.trim().is_empty() {
        return (key, m.malformed.as_deref().map(clean));
    }
    let synthetic = format!("missing:{:016x}:{position}", fnv64(&m.raw));
    let reason = match &m.malformed {
        Some(r) => format!("{}; {NO_RESOURCE_ID}", clean(r)),
        None => NO_RESOURCE_ID.to_owned(),
    };
    (synthetic, Some(reason))
}

/// Postgres `text` cannot hold NUL: replace it rather than fail the whole batch.
fn clean(s: &str) -> String {
    if s.contains('\0') { s.replace('\0', "\u{FFFD}") } else { s.to_owned() }
}

fn clean_opt(s: &Option<String>) -> Option<String> {
    s.as_deref().map(clean)
}

/// FNV-1a, 64 bits: a stable content fingerprint (no crate, same on every build).
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use cabine_actors::ports::MessageMeta;

    use super::*;

    fn msg(resource_id: &str, raw: &'static [u8]) -> InboundMessage {
        InboundMessage {
            resource_id: resource_id.into(),
            raw: Bytes::from_static(raw),
            meta: MessageMeta::default(),
            malformed: None,
        }
    }

    #[test]
    fn a_part_without_resource_id_gets_a_stable_distinct_key_and_is_malformed() {
        let a = as_stored(&msg("", b"<x/>"), 3);
        assert_eq!(a, as_stored(&msg("", b"<x/>"), 3), "redelivery maps to the same key");
        assert_ne!(a.resource_id, as_stored(&msg(" ", b"<y/>"), 3).resource_id);
        assert_ne!(a.resource_id, as_stored(&msg("", b"<x/>"), 4).resource_id);
        assert!(a.resource_id.starts_with("missing:"));
        assert_eq!(a.malformed.as_deref(), Some(NO_RESOURCE_ID));
    }

    #[test]
    fn nul_bytes_in_text_are_replaced_and_good_messages_are_untouched() {
        let mut m = msg("R\0", b"\0raw");
        m.meta.msg_id = Some("M\0".into());
        let cols = BatchColumns::from_messages(&[m, msg("R2", b"ok")]);
        assert_eq!(cols.resource_id, vec!["R\u{FFFD}".to_owned(), "R2".to_owned()]);
        assert_eq!(cols.msg_id[0].as_deref(), Some("M\u{FFFD}"));
        assert_eq!(cols.raw[0], b"\0raw", "raw bytes are kept exactly");
        assert_eq!(cols.reason, vec![None, None]);
    }
}
