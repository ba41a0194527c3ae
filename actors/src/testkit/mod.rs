//! In-memory fakes of every port, faithful enough to judge the actors: a
//! lease store with TTL, grants and amnesia; an inbox enforcing fences and
//! uniqueness; an ICOM server with real stream semantics and caps; a
//! publisher; a pod registry with TTL. Several pods of one test share a
//! [`FakeWorld`]. The `cabine` crate's integration tests use the real adapters.

pub mod cluster;
pub mod icom;
mod icom_conn;
pub mod inbox;
pub mod lease;
pub mod publish;

use std::sync::Arc;
use std::time::Duration;

pub use cluster::FakePodRegistry;
pub use icom::{FakeIcom, FakeIcomSettings, IcomAudit, RequestKind, RequestRecord, malformed, message};
pub use inbox::{FakeInbox, InboxRow};
pub use lease::{FakeLeaseSettings, FakeLeaseStore};
pub use publish::FakePublisher;

use crate::config::Ports;

/// Settings of a fake world.
#[derive(Clone, Debug)]
pub struct FakeSettings {
    pub lease: FakeLeaseSettings,
    pub icom: FakeIcomSettings,
    /// Heartbeat key TTL (3 × the pods' heartbeat).
    pub pod_ttl: Duration,
}

/// The shared stores and servers of one simulated cluster.
#[derive(Clone)]
pub struct FakeWorld {
    pub leases: Arc<FakeLeaseStore>,
    pub pods: Arc<FakePodRegistry>,
    pub inbox: Arc<FakeInbox>,
    pub icom: Arc<FakeIcom>,
    pub publisher: Arc<FakePublisher>,
}

impl FakeWorld {
    /// The ICOM server judges every acknowledgement against the inbox.
    pub fn new(settings: FakeSettings) -> Self {
        let inbox = FakeInbox::new();
        let icom = FakeIcom::new(settings.icom);
        let judge_inbox = inbox.clone();
        icom.set_ack_judge(Box::new(move |channel, rid| judge_inbox.contains(channel, rid)));
        FakeWorld {
            leases: FakeLeaseStore::new(settings.lease),
            pods: FakePodRegistry::new(settings.pod_ttl),
            publisher: FakePublisher::new(inbox.clone()),
            inbox,
            icom,
        }
    }

    /// The ports of one pod of this world.
    pub fn ports(&self, pod_id: &str) -> Ports {
        Ports {
            leases: self.leases.for_pod(pod_id),
            pods: self.pods.clone(),
            inbox: self.inbox.clone(),
            icom: self.icom.connector(),
            publisher: self.publisher.clone(),
        }
    }
}
