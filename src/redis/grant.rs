//! Grant ids: `{pod_id}#{epoch}#{nonce}`. The pod id says who holds a slot, the
//! epoch says in which life of Redis's memory it was granted (a lease from an
//! older epoch is lost), the nonce makes every grant unique.

use std::sync::atomic::{AtomicU64, Ordering};

/// The parts of a grant id this adapter wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantParts<'a> {
    pub pod: &'a str,
    pub epoch: &'a str,
}

/// Splits a grant from the right, so a pod id may itself contain `#`.
pub fn parse(grant: &str) -> Option<GrantParts<'_>> {
    let mut parts = grant.rsplitn(3, '#');
    let _nonce = parts.next()?;
    let epoch = parts.next()?;
    let pod = parts.next()?;
    (!epoch.is_empty()).then_some(GrantParts { pod, epoch })
}

/// A nonce never produced before by this process (sequence) nor, with
/// overwhelming probability, by any other (64 random bits).
pub fn nonce() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!("{:x}.{:016x}", SEQ.fetch_add(1, Ordering::Relaxed), rand::random::<u64>())
}

/// A new epoch value, written by whoever detects amnesia.
pub fn fresh_epoch() -> String {
    format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pod_and_epoch_from_the_right() {
        let p = parse("host#7-12#abcd#3.ff").unwrap();
        assert_eq!(p, GrantParts { pod: "host#7-12", epoch: "abcd" });
        assert_eq!(parse("no-separators"), None);
        assert_eq!(parse("pod##n"), None);
    }

    #[test]
    fn nonces_do_not_repeat() {
        let all: std::collections::HashSet<String> = (0..10_000).map(|_| nonce()).collect();
        assert_eq!(all.len(), 10_000);
    }
}
