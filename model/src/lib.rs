//! A model of cabine's slot protocol (leases in Redis, fences and the request gate in Postgres,
//! the ICOM server's token chain), checked over every interleaving with stateright.
//!
//! It mirrors the protocol; it does not link the implementation. `docs/model.md` maps every
//! action to the function that implements it: a change to the protocol must change the model.

mod canon;
pub mod check;
pub mod config;
pub mod faults;
pub mod model;
pub mod pod;
pub mod postgres;
pub mod properties;
pub mod redis;
pub mod server;
pub mod state;
mod steps;
mod summary;

pub use check::{Outcome, check, describe};
pub use config::Config;
pub use model::{Action, SlotProtocol};
pub use state::World;
