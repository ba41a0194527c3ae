//! Canonical forms, so that states that behave alike are stored once.
//!
//! - Fences, grant nonces and epochs are compared only for equality (and a fresh one only has
//!   to differ from every one still around), so they are renumbered: per slot the row's fence
//!   becomes 1 and every older fence 0; nonces and epochs by order of first appearance.
//! - Pods are interchangeable and so are slots: with `symmetry` on, the state is replaced by the
//!   least of its images under every permutation of pods and of slots. Paths then show pods and
//!   slots relabelled along the way, so the negative controls run without it.

use crate::config::Config;
use crate::pod::{Lease, Stage};
use crate::redis::Key;
use crate::state::{MAX, World};

/// Every permutation of `0..n` (n ≤ 3), as arrays mapping old index → new index.
fn permutations(n: usize) -> &'static [[usize; MAX]] {
    const ONE: &[[usize; MAX]] = &[[0, 1, 2]];
    const TWO: &[[usize; MAX]] = &[[0, 1, 2], [1, 0, 2]];
    const THREE: &[[usize; MAX]] = &[[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    match n {
        0 | 1 => ONE,
        2 => TWO,
        _ => THREE,
    }
}

/// Maps values to 1, 2, … in order of first appearance.
#[derive(Default)]
struct Renumbering {
    seen: [u8; 2 * MAX + 2],
    len: usize,
}

impl Renumbering {
    fn map(&mut self, v: &mut u8) {
        let i = self.seen[..self.len].iter().position(|x| x == v).unwrap_or_else(|| {
            self.seen[self.len] = *v;
            self.len += 1;
            self.len - 1
        });
        *v = i as u8 + 1;
    }
}

impl World {
    /// The canonical member of this state's class.
    pub fn canonical(mut self, cfg: &Config) -> World {
        if !cfg.symmetry {
            self.renumber(cfg);
            return self;
        }
        let mut best: Option<World> = None;
        for pods in permutations(cfg.pods) {
            for slots in permutations(cfg.slots) {
                let mut image = self.permuted(cfg, pods, slots);
                image.renumber(cfg);
                if best.as_ref().is_none_or(|b| image < *b) {
                    best = Some(image);
                }
            }
        }
        best.expect("the identity is a permutation")
    }

    fn renumber(&mut self, cfg: &Config) {
        for s in 0..cfg.slots {
            let current = self.pg.rows[s].fence;
            let norm = |f: u8| u8::from(f == current && current > 0);
            let mut nonces = Renumbering::default();
            let mut key = |k: &mut Option<Key>| {
                if let Some(k) = k {
                    nonces.map(&mut k.grant.nonce);
                }
            };
            key(&mut self.redis.data.keys[s]);
            if let Some(snap) = self.redis.snapshot.as_mut() {
                key(&mut snap.keys[s]);
            }
            for pod in self.pods.iter_mut().take(cfg.pods) {
                if let Lease::Held(h) = &mut pod.slots[s] {
                    nonces.map(&mut h.grant.nonce);
                    match &mut h.stage {
                        Stage::Claim => {}
                        Stage::Ready(r) => r.fence = norm(r.fence),
                        Stage::Polling(q) => q.fence = norm(q.fence),
                    }
                }
            }
            self.ghost.nonces[s] = nonces.len as u8;
            self.ghost.claimed[s] = norm(self.ghost.claimed[s]);
            self.pg.rows[s].fence = norm(current);
        }
        let mut epochs = Renumbering::default();
        if let Some(e) = self.redis.data.epoch.as_mut() {
            epochs.map(e);
        }
        if let Some(e) = self.redis.snapshot.as_mut().and_then(|s| s.epoch.as_mut()) {
            epochs.map(e);
        }
        for pod in self.pods.iter_mut().take(cfg.pods) {
            if let Some(e) = pod.epoch.as_mut() {
                epochs.map(e);
            }
        }
        self.ghost.epochs = epochs.len as u8;
    }

    /// The same state with pod p renamed `pods[p]` and slot s renamed `slots[s]`.
    fn permuted(&self, cfg: &Config, pods: &[usize; MAX], slots: &[usize; MAX]) -> World {
        let mut w = self.clone();
        let relabel_key = |k: Option<Key>| {
            k.map(|mut k| {
                k.grant.pod = pods[k.grant.pod as usize] as u8;
                k
            })
        };
        for (s, &t) in slots.iter().enumerate().take(cfg.slots) {
            w.redis.data.keys[t] = relabel_key(self.redis.data.keys[s]);
            if let (Some(to), Some(from)) = (w.redis.snapshot.as_mut(), self.redis.snapshot.as_ref()) {
                to.keys[t] = relabel_key(from.keys[s]);
            }
            w.pg.rows[t] = self.pg.rows[s];
            w.server.pending[t] = self.server.pending[s];
            w.ghost.nonces[t] = self.ghost.nonces[s];
            w.ghost.claimed[t] = self.ghost.claimed[s];
        }
        for (p, &q) in pods.iter().enumerate().take(cfg.pods) {
            let mut pod = self.pods[p];
            for (s, &t) in slots.iter().enumerate().take(cfg.slots) {
                let mut lease = self.pods[p].slots[s];
                if let Lease::Held(h) = &mut lease {
                    h.grant.pod = q as u8;
                }
                pod.slots[t] = lease;
            }
            w.pods[q] = pod;
        }
        for r in w.server.requests.iter_mut() {
            r.stream = slots[r.stream as usize] as u8;
            r.owner = r.owner.map(|p| pods[p as usize] as u8);
        }
        w.server.requests.sort();
        w
    }
}
