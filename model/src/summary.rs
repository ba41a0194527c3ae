//! A one-line account of a world, for counterexample paths.

use std::fmt::Write as _;

use crate::config::Config;
use crate::pod::{Lease, Stage};
use crate::server::{Reading, Stage as Wire};
use crate::state::World;

fn bits(mask: u8) -> String {
    if mask == 0 {
        return "-".into();
    }
    (0..8).filter(|i| mask & (1 << i) != 0).map(|i| format!("m{i}")).collect::<Vec<_>>().join("+")
}

impl World {
    /// Redis keys, rows, inbox, server and pods, each in a few characters.
    pub fn summary(&self, cfg: &Config) -> String {
        let mut s = String::new();
        let d = &self.redis.data;
        s.push_str("redis[");
        for (i, k) in d.keys.iter().take(cfg.slots).enumerate() {
            match k {
                Some(k) => write!(s, "s{i}=p{}#{} ttl{} ", k.grant.pod, k.grant.nonce, k.ttl),
                None => write!(s, "s{i}=- "),
            }
            .ok();
        }
        write!(s, "epoch{:?} q{}] rows[", d.epoch, d.quarantine).ok();
        for (i, r) in self.pg.rows.iter().take(cfg.slots).enumerate() {
            write!(s, "s{i}=fence{} pn{} busy{} ", r.fence, r.pull_next.0, r.busy).ok();
        }
        write!(
            s,
            "] inbox={} | server: queue={} acked={}",
            bits(self.pg.inbox),
            bits(self.server.queue),
            bits(self.server.acked)
        )
        .ok();
        for (i, p) in self.server.pending.iter().take(cfg.slots).enumerate() {
            if *p != 0 {
                write!(s, " pending{i}={}", bits(*p)).ok();
            }
        }
        for r in self.server.requests.iter() {
            let owner = r.owner.map_or("orphan".to_string(), |p| format!("p{p}"));
            match r.stage {
                Wire::Transit { token, left } => write!(s, " [s{} {owner} transit tok{} ≤{left}]", r.stream, token.0),
                Wire::Admitted { reading: Reading::Hold { left }, .. } => {
                    write!(s, " [s{} {owner} holding {left}]", r.stream)
                }
                Wire::Admitted { reading, .. } => write!(s, " [s{} {owner} {reading:?}]", r.stream),
            }
            .ok();
        }
        s.push_str(" | pods:");
        for (p, pod) in self.pods.iter().take(cfg.pods).enumerate() {
            write!(s, " p{p}{}(", if pod.paused { " PAUSED" } else { "" }).ok();
            for (i, l) in pod.slots.iter().take(cfg.slots).enumerate() {
                match l {
                    Lease::Standby => write!(s, "s{i}=standby "),
                    Lease::Held(h) => {
                        write!(s, "s{i}=#{} valid{} ", h.grant.nonce, h.valid).ok();
                        match h.stage {
                            Stage::Claim => write!(s, "claiming "),
                            Stage::Ready(r) => write!(
                                s,
                                "ready fence{} tok{} wait{} window{}{} ",
                                r.fence,
                                r.token.0,
                                r.wait,
                                r.window,
                                if r.aborted { " aborted" } else { "" }
                            ),
                            Stage::Polling(q) => {
                                write!(s, "polling fence{} tok{} answer={:?} ", q.fence, q.token.0, q.answer)
                            }
                        }
                    }
                }
                .ok();
            }
            s.push(')');
        }
        s
    }
}
