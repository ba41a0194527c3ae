//! Port traits: everything the actors need from the world, implemented by the
//! `cabine` crate (Redis, Postgres, NATS, ICOM) and by in-memory fakes in tests.
//!
//! Each port has its own error enum, split by what the caller does:
//! transient (retry with backoff, fail closed), lost (stop using the resource
//! now), fatal (escalate).

pub mod breaker;
pub mod cluster;
pub mod confirm;
pub mod dict;
pub mod gate;
pub mod icom;
pub mod icom_send;
pub mod inbox;
pub mod incident;
pub mod lease;
pub mod outbound;
pub mod outbound_bus;
pub mod publish;
pub mod ratelimit;
pub mod reconcile;

pub use cluster::{ClusterError, PodBeat, PodRegistry};
pub use confirm::{ConfirmError, Confirmations, Correlated};
pub use dict::{DictLevel, DictPolicies, DictSyncError};
pub use gate::{GateClaim, GateError, SendGates};
pub use icom::{CloseOutcome, IcomConnector, IcomStream, InboundMessage, MessageMeta, PollOutcome};
pub use icom_send::{IcomSender, SendConnector, SendRefused, SendReply};
pub use inbox::{Claim, CommitSummary, CommittedRow, InboxError, InboxStore, SlotCursor};
pub use lease::{Acquired, GrantId, Holder, Lease, LeaseError, LeaseStore, LostCause, Pool, Quarantine};
pub use publish::{InboundPublisher, PublishError};
