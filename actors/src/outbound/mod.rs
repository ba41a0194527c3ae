//! The outbound side of the tree (every pod): the OutboundDispatcher moves
//! requests from the bus into the outbound table, one SendChannel per enabled
//! channel supervises its Sender slots (each sends under its own send lease),
//! the Confirmer applies the SPI's verdicts, and the leader's OutboundJanitor
//! sweeps deadlines, stale claims, unconfirmed messages and unpublished events.
//!
//! ```text
//! Root ─ outbound-dispatcher        bus → outbound table (back-pressure above max_queued)
//!      ├ senders/cpm ─ sender/cpm/1…K   lease → take ≤10 → breaker → bucket → POST → record
//!      ├ confirmer                  inbox pacs.002/admi.002 → confirmed | rejected_by_spi
//!      └ leader ─ outbound-janitor  expire, recover claims, flag unconfirmed, republish events
//! ```

mod config;
pub mod confirmer;
pub mod dispatcher;
mod intake;
pub mod janitor;
pub mod sender;
pub mod senders;
mod signal;

pub use config::{OutboundConfig, OutboundPorts};
pub use signal::{OutboundSignal, is_status_report};
