//! A batch of inbound messages as the column arrays of the one-statement commit
//! (`UNNEST`), with the repairs that keep every message storable, so that no
//! message can make Postgres refuse the batch (and the slot fail on it, again
//! and again, on every pod that takes the slot):
//! - a ResourceId the unique index cannot hold, or that is not plain visible
//!   ASCII (a few KB passes the header limit; the btree's is ~2.7 KB), keys
//!   its message by a hash of it (`resource-id:{sha256}`), marked malformed;
//! - a part without a ResourceId is keyed by its content and position;
//! - text fields lose their NUL bytes, and a message that had one is malformed.

use cabine_actors::ports::{InboundMessage, MessageMeta};
use sha2::{Digest, Sha256};

/// At most this many messages per commit: one ICOM read (multipart, 10 parts).
pub const MAX_BATCH: usize = 10;

/// A ResourceId is stored as it is when it has 1..=256 visible ASCII characters.
pub const MAX_RESOURCE_ID: usize = 256;

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

/// The row key and the malformed reason (the message's own, then what the
/// inbox found). Keys are stable when the same batch is redelivered:
/// - a usable ResourceId is the key;
/// - an unusable one keys by its SHA-256 (`resource-id:{hex}`): distinct
///   values never collide into one row (a collision would drop a message as a
///   duplicate), the same value is the same message;
/// - a part without one keys by its content and position (`missing:{fnv64}:{n}`).
fn storable_key(m: &InboundMessage, position: usize) -> (String, Option<String>) {
    let id = m.resource_id.as_str();
    let mut reasons: Vec<String> = m.malformed.iter().map(|r| clean(r)).collect();
    let key = if id.trim().is_empty() {
        reasons.push(NO_RESOURCE_ID.to_owned());
        format!("missing:{:016x}:{position}", fnv64(&m.raw))
    } else if usable_resource_id(id) {
        id.to_owned()
    } else {
        let key = format!("resource-id:{}", sha256_hex(id.as_bytes()));
        reasons.push(format!(
            "PI-ResourceId of {} bytes is not 1..={MAX_RESOURCE_ID} visible ASCII characters: kept under {key} (it began {})",
            id.len(),
            shown(id)
        ));
        key
    };
    reasons.extend(nul_fields(&m.meta).map(|f| format!("NUL byte in {f} (replaced)")));
    (key, (!reasons.is_empty()).then(|| reasons.join("; ")))
}

/// 1..=256 visible ASCII characters: what the unique index and a `Nats-Msg-Id` take as they are.
pub fn usable_resource_id(id: &str) -> bool {
    (1..=MAX_RESOURCE_ID).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The envelope fields that hold a NUL byte.
fn nul_fields(meta: &MessageMeta) -> impl Iterator<Item = &'static str> + '_ {
    [
        ("MsgDefIdr", &meta.msg_def),
        ("BizMsgIdr", &meta.biz_msg_id),
        ("MsgId", &meta.msg_id),
        ("EndToEndId", &meta.end_to_end_id),
        ("Fr", &meta.from),
        ("To", &meta.to),
    ]
    .into_iter()
    .filter(|(_, v)| v.as_deref().is_some_and(|v| v.contains('\0')))
    .map(|(name, _)| name)
}

/// The first 64 characters of `id`, control characters escaped.
fn shown(id: &str) -> String {
    let head: String = id.chars().take(64).flat_map(char::escape_debug).collect();
    format!("\"{head}\"")
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
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
    fn nul_bytes_in_text_are_replaced_the_message_is_malformed_and_good_messages_are_untouched() {
        let mut m = msg("R1", b"\0raw");
        m.meta.msg_id = Some("M\0".into());
        m.meta.end_to_end_id = Some("E\0".into());
        let cols = BatchColumns::from_messages(&[m, msg("R2", b"ok")]);
        assert_eq!(cols.resource_id, vec!["R1".to_owned(), "R2".to_owned()]);
        assert_eq!(cols.msg_id[0].as_deref(), Some("M\u{FFFD}"));
        assert_eq!(cols.raw[0], b"\0raw", "raw bytes are kept exactly");
        let reason = cols.reason[0].as_deref().unwrap_or_default();
        assert!(reason.contains("NUL byte in MsgId") && reason.contains("NUL byte in EndToEndId"), "{reason}");
        assert_eq!(cols.reason[1], None);
    }

    #[test]
    fn an_unusable_resource_id_keys_its_message_by_its_hash() {
        let long = "R".repeat(4096);
        let a = as_stored(&msg(&long, b"<x/>"), 0);
        assert_eq!(a, as_stored(&msg(&long, b"<x/>"), 5), "the same value, the same key (position aside)");
        assert!(a.resource_id.starts_with("resource-id:") && a.resource_id.len() == "resource-id:".len() + 64);
        assert_ne!(a.resource_id, as_stored(&msg(&"R".repeat(4097), b"<x/>"), 0).resource_id);
        let reason = a.malformed.unwrap_or_default();
        assert!(reason.contains("4096 bytes") && reason.len() < 400, "{reason}");
        let nul = as_stored(&msg("R\0", b"<x/>"), 0);
        assert!(nul.resource_id.starts_with("resource-id:"), "{}", nul.resource_id);
        assert!(nul.malformed.is_some_and(|r| r.contains("R\\0")));
        assert_eq!(as_stored(&msg(&"R".repeat(256), b"<x/>"), 0).resource_id, "R".repeat(256), "256 is usable");
        let kept = as_stored(&InboundMessage { malformed: Some("bad XML".into()), ..msg(&long, b"<x") }, 0);
        assert!(kept.malformed.is_some_and(|r| r.starts_with("bad XML; PI-ResourceId")));
    }
}
