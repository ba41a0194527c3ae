//! cabine-actors: the supervision tree and the port traits it drives.
//!
//! Architecture invariant: this crate opens no sockets and depends on no
//! client library (fred, tokio-postgres, async-nats, reqwest). Everything that
//! touches the world is behind a port trait implemented in the `cabine` crate.
#![forbid(unsafe_code)]

pub mod status;

pub use status::ActorStatus;
