//! Port of the incident log: the few events the incident report cannot read
//! back from the inbox and outbound tables (a slot failed over, the lease
//! store in quarantine, a circuit breaker opened), recorded durably by the
//! adapter in the background. Recording never blocks an actor.

use crate::domain::ChannelId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IncidentKind {
    /// A slot's poll cycles kept failing on this pod: it handed the slot over.
    Failover,
    /// An acquire was refused because the lease store is in quarantine (amnesia).
    Quarantine,
    /// A channel's shared circuit breaker opened.
    BreakerOpened,
}

impl IncidentKind {
    pub fn label(self) -> &'static str {
        match self {
            IncidentKind::Failover => "failover",
            IncidentKind::Quarantine => "quarantine",
            IncidentKind::BreakerOpened => "breaker_opened",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    pub kind: IncidentKind,
    pub channel: Option<ChannelId>,
    pub slot: Option<u8>,
    pub detail: String,
}

pub trait IncidentLog: Send + Sync + 'static {
    /// Records `incident` in the background; a full queue drops it (and counts the drop).
    fn record(&self, incident: Incident);
}
