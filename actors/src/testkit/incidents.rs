//! In-memory [`IncidentLog`]: remembers every incident, in order, so an actor
//! test can check a failover or a quarantine was recorded.

use std::sync::{Arc, Mutex};

use crate::ports::incident::{Incident, IncidentLog};

#[derive(Default)]
pub struct FakeIncidents {
    seen: Mutex<Vec<Incident>>,
}

impl FakeIncidents {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Every incident so far, in order.
    pub fn seen(&self) -> Vec<Incident> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl IncidentLog for FakeIncidents {
    fn record(&self, incident: Incident) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).push(incident);
    }
}
