//! cabine-actors: the supervision tree and the port traits it drives.
//!
//! Architecture invariant: this crate opens no sockets and depends on no
//! client library (fred, tokio-postgres, async-nats, reqwest). Everything that
//! touches the world is behind a port trait in [`ports`], implemented in the
//! `cabine` crate and by in-memory fakes in [`testkit`] (feature `testkit`).
//!
//! The wiring's entry point is [`Tree::start`] with a [`TreeConfig`] and the
//! [`Ports`]; see [`tree`].
#![forbid(unsafe_code)]

pub mod backoff;
pub mod board;
pub mod config;
pub mod domain;
pub mod failover;
pub mod fair;
pub mod gate;
pub mod lease;
pub mod ledger;
pub mod metrics;
pub mod orphans;
pub mod outbound;
pub mod ports;
pub mod slot;
pub mod status;
pub mod supervision;
pub mod task;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod timers;
pub mod tree;
pub mod watchdog;

pub use board::StatusBoard;
pub use config::{PollMode, Ports, RestartPolicy, TreeConfig, TreeTiming};
pub use failover::FailoverConfig;
pub use outbound::{OutboundConfig, OutboundPorts};
pub use status::ActorStatus;
pub use tree::{DrainReport, RestartError, Tree, TreeError, TreeExit};
pub use watchdog::{Alert, AlertKind, WatchdogConfig};
