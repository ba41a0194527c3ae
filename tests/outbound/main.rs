//! The outbound data and coordination layer against the real services: the
//! Postgres outbound store and confirmations, the Redis rate bucket and circuit
//! breaker, and the NATS ingress and result events. Each test isolates itself (schema, key
//! prefix, subjects and streams of its own) and cleans up.

mod batch;
mod breaker;
mod bucket;
mod bus;
mod common;
mod confirm;
mod doubt;
mod outcomes;
mod poison;
mod store;
