//! The Redis key layout of one cluster (DESIGN §3): slot keys
//! `{prefix}:{cluster}:{ispb}:{channel}:{pool}:{n}`, the leader
//! `{prefix}:{cluster}:{ispb}:leader:1`, the epoch and quarantine keys and the
//! pod heartbeat keys `{prefix}:{cluster}:pod:{pod_id}`.

use cabine_actors::ports::Pool;

/// Builds every key cabine's coordination uses, under `{prefix}:{cluster}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    base: String,
    ispb: String,
}

impl KeyLayout {
    pub fn new(prefix: &str, cluster: &str, ispb: &str) -> Self {
        KeyLayout { base: format!("{prefix}:{cluster}"), ispb: ispb.to_owned() }
    }

    /// Slot `n` (1-based) of `pool`.
    pub fn slot(&self, pool: Pool, n: u8) -> String {
        let (base, ispb) = (&self.base, &self.ispb);
        match pool {
            Pool::Stream(c) => format!("{base}:{ispb}:{c}:stream:{n}"),
            Pool::Send(c) => format!("{base}:{ispb}:{c}:send:{n}"),
            Pool::Leader => format!("{base}:{ispb}:leader:{n}"),
        }
    }

    /// Marks one life of Redis's memory; gone or changed means amnesia.
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.base)
    }

    /// Present (with a TTL of lease + lock_delay) while no pool may grant.
    pub fn quarantine(&self) -> String {
        format!("{}:quarantine", self.base)
    }

    /// The `run_id` of the Redis server that wrote it: another one means a restart or a failover.
    pub fn server(&self) -> String {
        format!("{}:server", self.base)
    }

    /// Prefix of the pod heartbeat keys; the pod id follows.
    pub fn pod_prefix(&self) -> String {
        format!("{}:pod:", self.base)
    }

    pub fn pod(&self, pod_id: &str) -> String {
        format!("{}{pod_id}", self.pod_prefix())
    }

    /// The set of pod ids that have beaten (pruned of expired ones on read).
    pub fn pods(&self) -> String {
        format!("{}:pods", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cabine_actors::domain::ChannelId;

    #[test]
    fn layout_matches_the_design() {
        let k = KeyLayout::new("cabine", "prod", "99999010");
        assert_eq!(k.slot(Pool::Stream(ChannelId::Cpm), 3), "cabine:prod:99999010:cpm:stream:3");
        assert_eq!(k.slot(Pool::Send(ChannelId::Csm), 1), "cabine:prod:99999010:csm:send:1");
        assert_eq!(k.slot(Pool::Leader, 1), "cabine:prod:99999010:leader:1");
        assert_eq!(k.epoch(), "cabine:prod:epoch");
        assert_eq!(k.quarantine(), "cabine:prod:quarantine");
        assert_eq!(k.pod("pod-a"), "cabine:prod:pod:pod-a");
    }
}
