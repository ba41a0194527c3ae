//! Redis's eviction policy, read at boot (DESIGN §3). `allkeys-*` may evict
//! keys without a TTL — the epoch and the server mark that amnesia detection
//! rests on — so a pod refuses to start on it (exit 64); `volatile-*` may
//! evict lease keys (partial amnesia, which the heartbeat detects and the
//! gate survives), so it is allowed with a warning. A server that does not
//! answer `CONFIG GET` (managed Redis) cannot be judged: a warning says so.

use std::time::Duration;

use fred::interfaces::ConfigInterface;
use fred::prelude::{Client, ClientLike};

/// What the policy means for cabine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyVerdict {
    /// `noeviction`: nothing of ours is ever evicted.
    Safe,
    /// `volatile-*`: lease keys may be evicted (detected, survived).
    EvictsLeases(String),
    /// `allkeys-*`: the epoch itself may be evicted: refuse to start.
    EvictsEverything(String),
    /// Not readable (CONFIG disabled, Redis unreachable within the bound).
    Unknown(String),
}

/// Judges a `maxmemory-policy` value.
pub fn judge(policy: &str) -> PolicyVerdict {
    match policy {
        "noeviction" => PolicyVerdict::Safe,
        p if p.starts_with("allkeys-") => PolicyVerdict::EvictsEverything(p.to_owned()),
        p => PolicyVerdict::EvictsLeases(p.to_owned()),
    }
}

/// Reads the server's policy, waiting at most `within` for the connection.
pub async fn read(client: &Client, within: Duration) -> PolicyVerdict {
    let read = async {
        client.wait_for_connect().await?;
        let pair: Vec<String> = client.config_get("maxmemory-policy").await?;
        Ok::<_, fred::error::Error>(pair)
    };
    match tokio::time::timeout(within, read).await {
        Ok(Ok(pair)) => match pair.get(1) {
            Some(policy) => judge(policy),
            None => PolicyVerdict::Unknown("CONFIG GET maxmemory-policy answered nothing".into()),
        },
        Ok(Err(e)) => PolicyVerdict::Unknown(format!("CONFIG GET maxmemory-policy: {e}")),
        Err(_) => PolicyVerdict::Unknown(format!("Redis not reachable within {within:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_judged_by_what_they_may_evict() {
        assert_eq!(judge("noeviction"), PolicyVerdict::Safe);
        assert_eq!(judge("volatile-lru"), PolicyVerdict::EvictsLeases("volatile-lru".into()));
        assert_eq!(judge("volatile-ttl"), PolicyVerdict::EvictsLeases("volatile-ttl".into()));
        assert_eq!(judge("allkeys-lfu"), PolicyVerdict::EvictsEverything("allkeys-lfu".into()));
        assert_eq!(judge("allkeys-random"), PolicyVerdict::EvictsEverything("allkeys-random".into()));
    }
}
