//! Actor tests against the in-memory fakes: one binary, several trees (pods)
//! sharing one fake world, tokio's paused clock so leases and long-polls cost
//! no real time.

mod cluster;
mod common;
mod failover;
mod gate;
mod inbound;
mod outbound;
mod realtime;
mod scheduled;
mod supervision;
mod watchdog;
