//! The status board: every actor writes its node here on each transition, so
//! `/actors` reads the whole tree without touching a single mailbox. Lease
//! remaining and cursor age are computed at read time.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::ledger::LeaseLedger;
use crate::status::ActorStatus;

struct Node {
    parent: Option<String>,
    kind: &'static str,
    state: String,
    since_ms: u64,
    restarts: u32,
    last_error: Option<String>,
    details: Map<String, Value>,
    /// When the slot's stored stream cursor last moved (cursor age).
    cursor_at: Option<Instant>,
}

/// Shared, cheap to clone; written by actors, read by HTTP.
#[derive(Clone)]
pub struct StatusBoard {
    nodes: Arc<RwLock<BTreeMap<String, Node>>>,
    ledger: Arc<LeaseLedger>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl StatusBoard {
    pub fn new(ledger: Arc<LeaseLedger>) -> Self {
        StatusBoard { nodes: Arc::default(), ledger }
    }

    fn write(&self, id: &str, f: impl FnOnce(&mut Node)) {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(node) = nodes.get_mut(id) {
            f(node);
        }
    }

    /// Adds an actor's node (kept across its restarts, so `restarts` accumulates).
    pub fn register(&self, id: &str, parent: Option<&str>, kind: &'static str) {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let node = nodes.entry(id.to_owned()).or_insert_with(|| Node {
            parent: parent.map(str::to_owned),
            kind,
            state: String::new(),
            since_ms: now_ms(),
            restarts: 0,
            last_error: None,
            details: Map::new(),
            cursor_at: None,
        });
        node.state = "starting".into();
        node.since_ms = now_ms();
    }

    /// Enters `state` (its `since` moves only on a change).
    pub fn set_state(&self, id: &str, state: &str) {
        self.write(id, |n| {
            if n.state != state {
                n.state = state.to_owned();
                n.since_ms = now_ms();
            }
        });
    }

    pub fn set_error(&self, id: &str, error: impl Into<String>) {
        let error = error.into();
        self.write(id, |n| n.last_error = Some(error));
    }

    pub fn count_restart(&self, id: &str) {
        self.write(id, |n| n.restarts += 1);
    }

    pub fn set_detail(&self, id: &str, key: &str, value: impl Into<Value>) {
        let value = value.into();
        self.write(id, |n| _ = n.details.insert(key.to_owned(), value));
    }

    /// Adds `by` to a numeric detail (messages received, ...).
    pub fn add_detail(&self, id: &str, key: &str, by: u64) {
        self.write(id, |n| {
            let old = n.details.get(key).and_then(Value::as_u64).unwrap_or(0);
            n.details.insert(key.to_owned(), Value::from(old + by));
        });
    }

    pub fn remove_detail(&self, id: &str, key: &str) {
        self.write(id, |n| _ = n.details.remove(key));
    }

    /// The stored cursor moved now (or `None`: the slot holds no cursor).
    pub fn mark_cursor(&self, id: &str, at: Option<Instant>) {
        self.write(id, |n| n.cursor_at = at);
    }

    /// One actor's node without children.
    pub fn node(&self, id: &str) -> Option<ActorStatus> {
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        nodes.get(id).map(|n| self.render(id, n))
    }

    /// The whole tree from `root`.
    pub fn snapshot(&self) -> ActorStatus {
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        let Some(root) = nodes.get("root") else { return ActorStatus::empty_root() };
        let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, n) in nodes.iter() {
            if let Some(p) = &n.parent {
                children.entry(p.as_str()).or_default().push(id.as_str());
            }
        }
        self.assemble("root", root, &nodes, &children)
    }

    fn assemble(
        &self,
        id: &str,
        node: &Node,
        nodes: &BTreeMap<String, Node>,
        children: &BTreeMap<&str, Vec<&str>>,
    ) -> ActorStatus {
        let mut status = self.render(id, node);
        for child in children.get(id).into_iter().flatten() {
            if let Some(n) = nodes.get(*child) {
                status.children.push(self.assemble(child, n, nodes, children));
            }
        }
        status
    }

    fn render(&self, id: &str, n: &Node) -> ActorStatus {
        let mut details = n.details.clone();
        if let Some(lease) = self.ledger.lease_of(id) {
            details.insert("lease_remaining_ms".into(), Value::from(lease.remaining().as_millis() as u64));
        }
        if let Some(at) = n.cursor_at {
            details.insert("cursor_age_ms".into(), Value::from(at.elapsed().as_millis() as u64));
        }
        ActorStatus {
            id: id.to_owned(),
            kind: n.kind.to_owned(),
            state: n.state.clone(),
            since_ms: n.since_ms,
            restarts: n.restarts,
            last_error: n.last_error.clone(),
            details,
            children: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_nests_children_and_keeps_restarts_across_registrations() {
        let board = StatusBoard::new(Arc::default());
        board.register("root", None, "root");
        board.register("channel/cpm", Some("root"), "channel");
        board.register("slot/cpm/1", Some("channel/cpm"), "slot");
        board.set_state("slot/cpm/1", "polling");
        board.count_restart("slot/cpm/1");
        board.register("slot/cpm/1", Some("channel/cpm"), "slot");
        board.add_detail("slot/cpm/1", "messages_received", 3);
        board.add_detail("slot/cpm/1", "messages_received", 2);
        let tree = board.snapshot();
        let slot = &tree.children[0].children[0];
        assert_eq!((slot.id.as_str(), slot.state.as_str(), slot.restarts), ("slot/cpm/1", "starting", 1));
        assert_eq!(slot.details["messages_received"], 5);
    }
}
