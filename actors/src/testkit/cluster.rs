//! In-memory pod registry: heartbeat keys with a TTL (3 × beat in the Redis
//! design), read back as the live pods; `leave` removes a key at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::ports::{ClusterError, PodBeat, PodRegistry};

pub struct FakePodRegistry {
    ttl: Duration,
    beats: Mutex<BTreeMap<String, (PodBeat, Instant)>>,
    down: AtomicBool,
}

impl FakePodRegistry {
    pub fn new(ttl: Duration) -> Arc<Self> {
        Arc::new(FakePodRegistry { ttl, beats: Mutex::default(), down: AtomicBool::new(false) })
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), ClusterError> {
        if self.down.load(Ordering::SeqCst) {
            Err(ClusterError::Unavailable("fake registry down".into()))
        } else {
            Ok(())
        }
    }

    /// Live pod ids now.
    pub fn live_ids(&self) -> Vec<String> {
        let now = Instant::now();
        self.beats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, (_, exp))| *exp > now)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[async_trait::async_trait]
impl PodRegistry for FakePodRegistry {
    async fn beat(&self, beat: &PodBeat) -> Result<(), ClusterError> {
        self.check()?;
        let expires = Instant::now() + self.ttl;
        self.beats.lock().unwrap_or_else(|p| p.into_inner()).insert(beat.pod_id.clone(), (beat.clone(), expires));
        Ok(())
    }

    async fn live_pods(&self) -> Result<Vec<PodBeat>, ClusterError> {
        self.check()?;
        let now = Instant::now();
        let beats = self.beats.lock().unwrap_or_else(|p| p.into_inner());
        Ok(beats.values().filter(|(_, exp)| *exp > now).map(|(b, _)| b.clone()).collect())
    }

    async fn leave(&self, pod_id: &str) -> Result<(), ClusterError> {
        self.check()?;
        self.beats.lock().unwrap_or_else(|p| p.into_inner()).remove(pod_id);
        Ok(())
    }
}
