//! The outbound side's adapters: the Postgres outbound store (with its
//! history, which doubles as the outbox of result events), the result-event
//! publisher, the ingress from the bus, the confirmations (inbound status
//! reports applied to what we sent), and the reading of the few XML fields
//! it needs (MsgId, type, EndToEndIds; the SPI's verdicts on what we sent).

pub mod confirm;
pub mod correlate;
pub mod fields;
pub mod gates;
pub mod hints;
pub mod ingress;
pub mod results;
mod rows;
pub mod store;
mod transition;
pub mod xml_fields;

pub use confirm::PgConfirmations;
pub use gates::PgSendGates;
pub use store::{OutboundPolicy, PgOutboundStore};
