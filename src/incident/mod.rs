//! What happened in a bad hour: the pods' incident log ([`log`]: failovers,
//! quarantines, breaker openings, written in the background) and the incident
//! report of a window ([`report`]), read back from Postgres.

pub mod log;
pub mod report;

pub use log::{IncidentSink, PgIncidentLog};
pub use report::{IncidentReport, IncidentReports};
