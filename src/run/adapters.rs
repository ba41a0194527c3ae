//! The real adapters of one pod, built from Settings: leased slots and pod
//! heartbeats in Redis, the fenced inbox in Postgres, the JetStream publisher,
//! the ICOM connector and, with `outbound.enabled`, the outbound side (store,
//! bus ingress and results, rate bucket and breaker in Redis) — bundled as the
//! tree's [`Ports`].

use std::sync::Arc;

use async_nats::jetstream;
use cabine_actors::ports::reconcile::Reconciliation;
use cabine_actors::{OutboundPorts, Ports};

use super::Dependencies;
use crate::config::Settings;
use crate::http::{ClusterSource, OutboundOperator};
use crate::icom::{ClientError, IcomChannels};
use crate::inbox::PgInbox;
use crate::incident::{IncidentSink, PgIncidentLog};
use crate::outbound::hints::NatsWorkHints;
use crate::outbound::ingress::{ConsumerSpec, IngressRules, JetStreamIngress};
use crate::outbound::results::JetStreamResults;
use crate::outbound::{OutboundPolicy, PgConfirmations, PgOutboundStore, PgSendGates};
use crate::publish::JetStreamPublisher;
use crate::reconcile::records::Records;
use crate::reconcile::{PgReconciliation, ReconcilePolicy};
use crate::redis::breaker::RedisBreaker;
use crate::redis::bucket::RedisBucket;
use crate::redis::guard::{GuardKeys, ScriptClock};
use crate::redis::{KeyLayout, LeaseConfig, RedisLeaseStore, RedisPodRegistry};

pub struct Adapters {
    pub leases: Arc<RedisLeaseStore>,
    pub pods: Arc<RedisPodRegistry>,
    pub inbox: Arc<PgInbox>,
    pub publisher: Arc<JetStreamPublisher>,
    pub icom: Arc<IcomChannels>,
    /// `None` when `outbound.enabled` is false.
    pub outbound: Option<OutboundAdapters>,
    /// `None` unless the pod reconciles (`reconcile.enabled` and `outbound.enabled`).
    pub reconciler: Option<Arc<PgReconciliation>>,
    /// Failovers, quarantines and breaker openings, for the incident report.
    pub incidents: Arc<PgIncidentLog>,
}

/// The outbound side's adapters; the store and breaker are also what the
/// operator endpoints (`/v1/outbound…`, breaker reset) drive.
#[derive(Clone)]
pub struct OutboundAdapters {
    pub store: Arc<PgOutboundStore>,
    pub breaker: Arc<RedisBreaker>,
    pub bucket: Arc<RedisBucket>,
    pub ingress: Arc<JetStreamIngress>,
    pub results: Arc<JetStreamResults>,
    pub confirmations: Arc<PgConfirmations>,
    pub gates: Arc<PgSendGates>,
    pub hints: Arc<NatsWorkHints>,
}

impl OutboundAdapters {
    pub fn build(settings: &Settings, deps: &Dependencies, incidents: Arc<PgIncidentLog>) -> OutboundAdapters {
        let ispb = &settings.cluster.ispb;
        let policy = OutboundPolicy::from_settings(settings);
        let guards = GuardKeys::new(&settings.redis.prefix, &settings.cluster.name, ispb);
        let o = &settings.outbound;
        let js = jetstream::new(deps.nats.clone());
        let spec = ConsumerSpec {
            stream: settings.nats.outbound_stream.clone(),
            name: o.consumer.clone(),
            ack_wait: o.ack_wait,
            max_ack_pending: i64::try_from(o.pull_batch * 16).unwrap_or(i64::MAX),
        };
        let subjects = crate::bus::Subjects::new(&settings.nats, ispb);
        OutboundAdapters {
            store: Arc::new(PgOutboundStore::new(deps.postgres.clone(), ispb, policy.clone())),
            breaker: Arc::new(
                RedisBreaker::new(deps.redis.clone(), guards.clone(), &o.breaker, ScriptClock::Server)
                    .with_incidents(incidents),
            ),
            bucket: Arc::new(RedisBucket::new(deps.redis.clone(), guards, &o.bucket, ScriptClock::Server)),
            ingress: Arc::new(JetStreamIngress::new(js.clone(), spec, IngressRules::from_settings(settings))),
            results: Arc::new(JetStreamResults::new(
                js,
                subjects.results(),
                deps.postgres.clone(),
                settings.postgres.query_timeout,
            )),
            confirmations: Arc::new(PgConfirmations::new(
                deps.postgres.clone(),
                ispb,
                policy,
                settings.postgres.query_timeout,
            )),
            gates: Arc::new(PgSendGates::new(deps.postgres.clone(), ispb, settings.postgres.query_timeout)),
            hints: Arc::new(NatsWorkHints::new(deps.nats.clone(), subjects.work_hints())),
        }
    }

    /// What the outbound operator endpoints act through; each call bounded by
    /// the longest of the Postgres, NATS and Redis timeouts.
    pub fn operator(&self, settings: &Settings, deps: &Dependencies) -> OutboundOperator {
        let timeout = (settings.postgres.wait_timeout + settings.postgres.query_timeout)
            .max(settings.nats.request_timeout)
            .max(settings.redis.command_timeout);
        OutboundOperator {
            store: self.store.clone(),
            breaker: self.breaker.clone(),
            results: self.results.clone(),
            bus: jetstream::new(deps.nats.clone()),
            subjects: crate::bus::Subjects::new(&settings.nats, &settings.cluster.ispb),
            rules: IngressRules::from_settings(settings),
            timeout,
        }
    }

    /// The Reconciler's adapter: its statements, and the outbound store it settles sends through.
    pub fn reconciler(&self, settings: &Settings, deps: &Dependencies) -> Arc<PgReconciliation> {
        Arc::new(PgReconciliation {
            records: Records {
                db: deps.postgres.clone(),
                ispb: settings.cluster.ispb.to_string(),
                timeout: settings.postgres.wait_timeout + settings.postgres.query_timeout,
            },
            store: self.store.clone(),
            results: self.results.clone(),
            hints: self.hints.clone(),
            policy: ReconcilePolicy::from_settings(settings),
        })
    }

    fn ports(&self, icom: Arc<IcomChannels>) -> OutboundPorts {
        OutboundPorts {
            store: self.store.clone(),
            ingress: self.ingress.clone(),
            results: self.results.clone(),
            bucket: self.bucket.clone(),
            breaker: self.breaker.clone(),
            sends: icom,
            gates: self.gates.clone(),
            confirmations: self.confirmations.clone(),
            hints: self.hints.clone(),
        }
    }
}

impl Adapters {
    /// Fails only when a channel cannot be reached as configured (TLS files, base URL).
    pub fn build(settings: &Settings, deps: &Dependencies, pod_id: &str) -> Result<Adapters, ClientError> {
        let icom = Arc::new(IcomChannels::from_settings(settings)?);
        let keys = KeyLayout::new(&settings.redis.prefix, &settings.cluster.name, settings.cluster.ispb.as_str());
        let leases = Arc::new(RedisLeaseStore::new(deps.redis.clone(), LeaseConfig::from_settings(settings, pod_id)));
        let pods = Arc::new(RedisPodRegistry::new(
            deps.redis.clone(),
            keys,
            settings.timing.heartbeat,
            settings.redis.command_timeout,
        ));
        let inbox =
            Arc::new(PgInbox::new(deps.postgres.clone(), &settings.cluster.ispb, settings.postgres.query_timeout));
        let publisher = Arc::new(JetStreamPublisher::start(deps.nats.clone(), deps.postgres.clone(), settings));
        let incidents = Arc::new(PgIncidentLog::start(IncidentSink {
            db: deps.postgres.clone(),
            ispb: settings.cluster.ispb.to_string(),
            pod: pod_id.to_owned(),
            timeout: settings.postgres.wait_timeout + settings.postgres.query_timeout,
        }));
        let outbound = settings.outbound.enabled.then(|| OutboundAdapters::build(settings, deps, incidents.clone()));
        let reconciler = outbound.as_ref().filter(|_| settings.reconciles()).map(|o| o.reconciler(settings, deps));
        Ok(Adapters { leases, pods, inbox, publisher, icom, outbound, reconciler, incidents })
    }

    /// The tree's ports; `dict`: the DICT side's lookups, when it is on.
    pub fn ports(&self, dict: Option<Arc<crate::dict::DictLookups>>) -> Ports {
        Ports {
            leases: self.leases.clone(),
            pods: self.pods.clone(),
            inbox: self.inbox.clone(),
            icom: self.icom.clone(),
            publisher: self.publisher.clone(),
            outbound: self.outbound.as_ref().map(|o| o.ports(self.icom.clone())),
            reconciler: self.reconciler.clone().map(|r| r as Arc<dyn Reconciliation>),
            incidents: self.incidents.clone(),
            dict: dict.map(|d| d as Arc<dyn cabine_actors::ports::DictPolicies>),
        }
    }

    /// What `/cluster` reads.
    pub fn cluster_source(&self, settings: &Settings) -> ClusterSource {
        ClusterSource {
            leases: self.leases.clone(),
            pods: self.pods.clone(),
            inbox: self.inbox.clone(),
            publisher: self.publisher.clone(),
            ispb: settings.cluster.ispb.to_string(),
            channels: settings.enabled_channels().map(|(id, _)| id).collect(),
            timeout: settings.http.probe_timeout.max(settings.redis.command_timeout),
        }
    }
}
