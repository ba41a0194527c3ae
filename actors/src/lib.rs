//! cabine-actors: the supervision tree and the port traits it drives.
//!
//! Architecture invariant: this crate opens no sockets and depends on no
//! client library (fred, tokio-postgres, async-nats, reqwest). Everything that
//! touches the world is behind a port trait in [`ports`], implemented in the
//! `cabine` crate and by in-memory fakes in tests.
#![forbid(unsafe_code)]

pub mod domain;
pub mod ports;
pub mod status;

pub use status::ActorStatus;
