//! What the outbound table can hold, checked before any insert: the rules an
//! identifier must follow to be stored and indexed (Postgres `text` takes no
//! NUL; a GIN entry of `end_to_end_ids` must stay under ~2.7 KB), and the
//! cleaning of the free text kept beside a refused request. One place, used by
//! the bus ingress (a request that breaks a rule is `rejected_invalid`) and by
//! the store (which checks what it is given again).

use cabine_actors::ports::outbound::NewOutbound;

/// MsgId: 1..=64 ASCII letters and digits (SPI's are 32).
pub const MAX_MSG_ID: usize = 64;
/// EndToEndId: at most 64 visible ASCII characters (SPI's are 32).
pub const MAX_END_TO_END_ID: usize = 64;
/// Message type (`pacs.008`): 1..=32 of letters, digits, `.`, `_`, `-`.
pub const MAX_MSG_TYPE: usize = 32;
/// Free text stored beside a row (reason, error): cut past this many characters.
pub const MAX_TEXT: usize = 2000;
/// A value quoted in a reason is cut past this many characters.
const MAX_QUOTED: usize = 80;

pub fn check_msg_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_MSG_ID || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!("MsgId {} is not 1..={MAX_MSG_ID} letters and digits", quoted(id)));
    }
    Ok(())
}

pub fn check_msg_type(t: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if t.is_empty() || t.len() > MAX_MSG_TYPE || !t.bytes().all(allowed) {
        return Err(format!("message type {} is not 1..={MAX_MSG_TYPE} of [A-Za-z0-9._-]", quoted(t)));
    }
    Ok(())
}

/// Empty is allowed (an element without text); anything else is visible ASCII.
pub fn check_end_to_end_id(id: &str) -> Result<(), String> {
    if id.len() > MAX_END_TO_END_ID || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("EndToEndId {} is not at most {MAX_END_TO_END_ID} visible ASCII characters", quoted(id)));
    }
    Ok(())
}

/// Every rule a valid request must follow to be stored as it is.
pub fn check_storable(m: &NewOutbound) -> Result<(), String> {
    check_msg_id(&m.msg_id)?;
    check_msg_type(&m.msg_type)?;
    m.end_to_end_ids.iter().try_for_each(|e| check_end_to_end_id(e))?;
    match &m.ingress_ref {
        Some(r) if r.len() > 256 || r.contains('\0') => Err(format!("ingress ref {} is unusable", quoted(r))),
        _ => Ok(()),
    }
}

/// A ResourceId from ICOM as the `resource_ids` index can hold it: 1..=256
/// visible ASCII characters as they are, anything else quoted and cut
/// (`unusable:"…"`) — recorded, never a refused statement.
pub fn resource_id(id: &str) -> String {
    if (1..=256).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()) {
        id.to_owned()
    } else {
        format!("unusable:{}", quoted(id))
    }
}

/// `value` for a reason or a log line: control characters escaped, cut past
/// 80 characters with its length in bytes, so any input can be shown and stored.
pub fn quoted(value: &str) -> String {
    let escaped: String = value.chars().take(MAX_QUOTED).flat_map(char::escape_debug).collect();
    if value.chars().count() > MAX_QUOTED {
        format!("\"{escaped}…\" ({} bytes)", value.len())
    } else {
        format!("\"{escaped}\"")
    }
}

/// `value` as it is when it is short visible ASCII, else [`quoted`].
pub fn shown(value: &str) -> String {
    if value.len() <= MAX_QUOTED && value.bytes().all(|b| b.is_ascii_graphic()) {
        value.to_owned()
    } else {
        quoted(value)
    }
}

/// Free text as Postgres `text` takes it: NUL replaced, cut past [`MAX_TEXT`] characters.
pub fn text(s: &str) -> String {
    let mut out: String = s.chars().take(MAX_TEXT).map(|c| if c == '\0' { '\u{FFFD}' } else { c }).collect();
    if s.chars().nth(MAX_TEXT).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_rules_and_bad_ones_are_quoted_safely() {
        assert!(check_msg_id("M9999901012345678901234567890123").is_ok());
        let nul = check_msg_id("M99\0X").unwrap_err();
        assert!(nul.contains("\\0") && !nul.contains('\0'), "{nul}");
        assert!(check_msg_id(&"M".repeat(65)).is_err());
        assert!(check_end_to_end_id("").is_ok());
        assert!(check_end_to_end_id("E9999901202401021000abcdefghijk").is_ok());
        let long = check_end_to_end_id(&"E".repeat(4096)).unwrap_err();
        assert!(long.contains("(4096 bytes)") && long.len() < 300, "{long}");
        assert!(check_end_to_end_id("E1\0").is_err());
        assert!(check_msg_type("pacs.008").is_ok());
        assert!(check_msg_type("pacs\0.008").is_err());
    }

    #[test]
    fn text_has_no_nul_and_is_bounded() {
        assert_eq!(text("a\0b"), "a\u{FFFD}b");
        let long = text(&"x".repeat(MAX_TEXT + 5));
        assert_eq!(long.chars().count(), MAX_TEXT + 1);
        assert!(long.ends_with('…'));
    }
}
