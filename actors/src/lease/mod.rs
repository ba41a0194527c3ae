//! Leases as the actors use them: one way to acquire a slot of a pool
//! ([`acquire`]), shared by Slot, Sender and Leader. What a holder adds on
//! top (the slot's fenced claim of its cursor row, the sender's claim of its
//! send row) is theirs; getting, recording and giving back the lease is here.

mod acquire;

pub use acquire::{Acquisition, Held, acquire, lost_notice, release_leftover};
