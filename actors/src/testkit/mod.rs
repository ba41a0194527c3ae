//! In-memory fakes of every port, faithful enough to judge the actors: a
//! lease store with TTL, grants and amnesia; an inbox enforcing fences and
//! uniqueness; an ICOM server with real stream semantics and caps; a
//! publisher; a pod registry with TTL; and on the outbound side an outbound
//! store enforcing MsgId uniqueness and claims, a work-queue consumer, a
//! results outbox, a token bucket, a circuit breaker and an ICOM send endpoint
//! that counts concurrency and duplicates; and a pod's own ICOM link that a
//! test can cut. Several pods of one test share a [`FakeWorld`]. The `cabine`
//! crate's integration tests use the real adapters.

pub mod breaker;
pub mod bucket;
pub mod cluster;
pub mod confirm;
pub mod gate;
pub mod hints;
pub mod icom;
mod icom_conn;
pub mod inbox;
pub mod incidents;
pub mod ingress;
pub mod lease;
pub mod link;
pub mod outbound;
pub mod publish;
pub mod results;
pub mod send;

use std::sync::Arc;
use std::time::Duration;

pub use cluster::FakePodRegistry;
pub use icom::{FakeIcom, FakeIcomSettings, IcomAudit, RequestKind, RequestRecord, malformed, message};
pub use inbox::{FakeInbox, InboxRow};
pub use lease::{FakeLeaseSettings, FakeLeaseStore};
pub use link::LinkFault;
pub use publish::FakePublisher;

pub use breaker::{FakeBreaker, FakeBreakerSettings};
pub use bucket::{FakeBucket, FakeBucketSettings};
pub use confirm::{FakeConfirmations, outbound, outbound_xml, status_report};
pub use gate::FakeSendGates;
pub use hints::FakeHints;
pub use incidents::FakeIncidents;
pub use ingress::FakeIngress;
pub use outbound::{FakeOutboundPolicy, FakeOutboundStore};
pub use results::FakeResults;
pub use send::{FakeIcomOut, FakeSendSettings};

use crate::config::Ports;
use crate::outbound::OutboundPorts;
use crate::ports::Pool;

/// Settings of a fake world.
#[derive(Clone, Debug)]
pub struct FakeSettings {
    pub lease: FakeLeaseSettings,
    pub icom: FakeIcomSettings,
    /// Heartbeat key TTL (3 × the pods' heartbeat).
    pub pod_ttl: Duration,
    pub outbound: FakeOutboundSettings,
}

/// Settings of the outbound fakes.
#[derive(Clone, Debug)]
pub struct FakeOutboundSettings {
    pub policy: FakeOutboundPolicy,
    /// The bus redelivers a request not acknowledged within this.
    pub ack_wait: Duration,
    pub bucket: FakeBucketSettings,
    pub breaker: FakeBreakerSettings,
    pub send: FakeSendSettings,
}

impl Default for FakeOutboundSettings {
    /// Short timings; a bucket and breaker that stay out of the way unless a test tightens them.
    fn default() -> Self {
        FakeOutboundSettings {
            policy: FakeOutboundPolicy::default(),
            ack_wait: Duration::from_secs(2),
            bucket: FakeBucketSettings { capacity_milli: 3_750_000, refill_per_s: 750 },
            breaker: FakeBreakerSettings {
                window: Duration::from_secs(30),
                window_buckets: 10,
                min_calls: 20,
                open_failure_rate: 50,
                consecutive_failures: 5,
                degraded_min_calls: 10,
                degraded_failure_rate: 20,
                degraded_slow_rate: 50,
                break_time: Duration::from_secs(2),
                probes: 1,
                probe_timeout: Duration::from_secs(2),
            },
            send: FakeSendSettings { max_in_flight: 6, latency: Duration::from_millis(20) },
        }
    }
}

/// The shared stores and servers of one simulated cluster.
#[derive(Clone)]
pub struct FakeWorld {
    pub leases: Arc<FakeLeaseStore>,
    pub pods: Arc<FakePodRegistry>,
    pub inbox: Arc<FakeInbox>,
    pub icom: Arc<FakeIcom>,
    pub publisher: Arc<FakePublisher>,
    pub outbound: Arc<FakeOutboundStore>,
    pub ingress: Arc<FakeIngress>,
    pub results: Arc<FakeResults>,
    pub bucket: Arc<FakeBucket>,
    pub breaker: Arc<FakeBreaker>,
    pub icom_out: Arc<FakeIcomOut>,
    pub gates: Arc<FakeSendGates>,
    pub confirmations: Arc<FakeConfirmations>,
    pub hints: Arc<FakeHints>,
    pub incidents: Arc<FakeIncidents>,
}

impl FakeWorld {
    /// The ICOM server judges every acknowledgement against the inbox.
    pub fn new(settings: FakeSettings) -> Self {
        let inbox = FakeInbox::new();
        let icom = FakeIcom::new(settings.icom);
        let judge_inbox = inbox.clone();
        icom.set_ack_judge(Box::new(move |channel, rid| judge_inbox.contains(channel, rid)));
        let leases = FakeLeaseStore::new(settings.lease);
        let o = settings.outbound;
        let outbound = FakeOutboundStore::new(o.policy);
        let icom_out = FakeIcomOut::new(o.send);
        let judge_leases = leases.clone();
        icom_out.set_lease_judge(Box::new(move |channel, pod| judge_leases.holds_valid(Pool::Send(channel), pod)));
        FakeWorld {
            leases,
            pods: FakePodRegistry::new(settings.pod_ttl),
            publisher: FakePublisher::new(inbox.clone()),
            confirmations: FakeConfirmations::new(inbox.clone(), outbound.clone()),
            inbox,
            icom,
            ingress: FakeIngress::new(o.ack_wait),
            results: FakeResults::new(outbound.clone()),
            bucket: FakeBucket::new(o.bucket),
            breaker: FakeBreaker::new(o.breaker),
            icom_out,
            gates: FakeSendGates::new(),
            hints: FakeHints::new(),
            incidents: FakeIncidents::new(),
            outbound,
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
            outbound: Some(OutboundPorts {
                store: self.outbound.clone(),
                ingress: self.ingress.port(),
                results: self.results.clone(),
                bucket: self.bucket.clone(),
                breaker: self.breaker.clone(),
                sends: self.icom_out.connector(pod_id),
                gates: self.gates.clone(),
                confirmations: self.confirmations.clone(),
                hints: self.hints.clone(),
            }),
            reconciler: None,
            incidents: self.incidents.clone(),
            dict: None,
        }
    }
}
