//! The slot rows and the inbox, as the statements of `src/inbox/sql.rs` change them. Postgres is
//! durable: no fault of the model touches it. Each statement is atomic and runs at the instant
//! the pod sends it (a statement that runs later only sets `busy_until` later: safer).

use crate::config::Config;
use crate::state::{MAX, Token};

/// One slot's row (`slot_cursor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Row {
    /// Taken by every claim; every other write is conditioned on it (DESIGN §2.4).
    pub fence: u8,
    /// The stream's cursor: where the next holder resumes.
    pub pull_next: Token,
    /// Ticks left until `busy_until` (Postgres's clock); 0 also stands for NULL.
    pub busy: u8,
}

/// What a claim returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub fence: u8,
    pub pull_next: Token,
    /// `max(busy_until - now, 0)`: the new holder sends nothing before it has passed.
    pub wait: u8,
}

/// The database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Postgres {
    pub rows: [Row; MAX],
    /// Bit mask of the messages committed to the inbox.
    pub inbox: u8,
}

impl Postgres {
    /// `CLAIM` (`InboxStore::claim`): the next fence, the cursor and the wait (what is left of
    /// `busy_until`); opens a window (`busy_until := max(busy_until, now + budget)`), which arms
    /// the new holder's first request only when the wait is 0.
    pub fn claim(&mut self, cfg: &Config, slot: usize) -> Claimed {
        let wait = if cfg.safeguards.gate { self.rows[slot].busy } else { 0 };
        self.rows[slot].fence += 1;
        self.arm_row(cfg, slot);
        let row = &self.rows[slot];
        Claimed { fence: row.fence, pull_next: row.pull_next, wait }
    }

    fn fenced(&self, cfg: &Config, slot: usize, fence: u8) -> bool {
        !cfg.safeguards.fence || self.rows[slot].fence == fence
    }

    /// The `busy_until := max(busy_until, now + budget)` every fenced write carries.
    fn arm_row(&mut self, cfg: &Config, slot: usize) {
        if cfg.safeguards.gate {
            let row = &mut self.rows[slot];
            row.busy = row.busy.max(cfg.timing.budget());
        }
    }

    /// `COMMIT` (`InboxStore::commit`): the batch, the cursor and `busy_until`, if the fence holds.
    pub fn commit(&mut self, cfg: &Config, slot: usize, fence: u8, batch: u8, pull_next: Token) -> bool {
        if !self.fenced(cfg, slot, fence) {
            return false;
        }
        self.inbox |= batch;
        self.rows[slot].pull_next = pull_next;
        self.arm_row(cfg, slot);
        true
    }

    /// `STORE_CURSOR`: the cursor and `busy_until` after a 204, if the fence holds.
    pub fn store_cursor(&mut self, cfg: &Config, slot: usize, fence: u8, pull_next: Token) -> bool {
        self.commit(cfg, slot, fence, 0, pull_next)
    }

    /// `ARM` (`InboxStore::arm`): only `busy_until`, if the fence holds.
    pub fn arm(&mut self, cfg: &Config, slot: usize, fence: u8) -> bool {
        if !self.fenced(cfg, slot, fence) {
            return false;
        }
        self.arm_row(cfg, slot);
        true
    }

    /// `RELEASE` (`InboxStore::release`): clears `busy_until` when the holder says nothing of
    /// its can still be in flight.
    pub fn release(&mut self, cfg: &Config, slot: usize, fence: u8, clear: bool) {
        if clear && self.fenced(cfg, slot, fence) {
            self.rows[slot].busy = 0;
        }
    }

    pub fn tick(&mut self) {
        for row in &mut self.rows {
            row.busy = row.busy.saturating_sub(1);
        }
    }
}
