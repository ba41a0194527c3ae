//! The real adapters of one pod, built from Settings: leased slots and pod
//! heartbeats in Redis, the fenced inbox in Postgres, the JetStream publisher
//! and the ICOM connector — bundled as the tree's [`Ports`].

use std::sync::Arc;

use cabine_actors::Ports;

use super::Dependencies;
use crate::config::Settings;
use crate::http::ClusterSource;
use crate::icom::{ClientError, IcomChannels};
use crate::inbox::PgInbox;
use crate::publish::JetStreamPublisher;
use crate::redis::{KeyLayout, LeaseConfig, RedisLeaseStore, RedisPodRegistry};

pub struct Adapters {
    pub leases: Arc<RedisLeaseStore>,
    pub pods: Arc<RedisPodRegistry>,
    pub inbox: Arc<PgInbox>,
    pub publisher: Arc<JetStreamPublisher>,
    pub icom: Arc<IcomChannels>,
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
        Ok(Adapters { leases, pods, inbox, publisher, icom })
    }

    pub fn ports(&self) -> Ports {
        Ports {
            leases: self.leases.clone(),
            pods: self.pods.clone(),
            inbox: self.inbox.clone(),
            icom: self.icom.clone(),
            publisher: self.publisher.clone(),
            // The outbound side (issue 6) is wired separately.
            outbound: None,
        }
    }

    /// What `/cluster` reads.
    pub fn cluster_source(&self, settings: &Settings, deps: &Dependencies) -> ClusterSource {
        ClusterSource {
            leases: self.leases.clone(),
            pods: self.pods.clone(),
            postgres: deps.postgres.clone(),
            ispb: settings.cluster.ispb.to_string(),
            channels: settings.enabled_channels().map(|(id, _)| id).collect(),
            timeout: settings.http.probe_timeout.max(settings.redis.command_timeout),
        }
    }
}
