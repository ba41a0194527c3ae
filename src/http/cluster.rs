//! `GET /cluster`: the cluster as Redis and Postgres see it — live pods (pid,
//! version, uptime, held slots, failover cooldowns), the holders of every pool
//! with their TTL, the leader, a lease quarantine if one runs (and why), per
//! slot the fence, cursor age and gate busy window from the inbox's cursor
//! rows, the age of the oldest inbox row not yet on the bus (publication lag),
//! and this pod's watchdog alerts. A source that cannot be read is named
//! in `errors`; the rest is still shown.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cabine_actors::Alert;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{Holder, InboundPublisher, InboxStore, LeaseStore, PodBeat, PodRegistry, Pool, Quarantine};
use serde::Serialize;

use super::AppState;

/// Where `/cluster` reads from.
pub struct ClusterSource {
    pub leases: Arc<dyn LeaseStore>,
    pub pods: Arc<dyn PodRegistry>,
    /// The cursor rows (fence, stream, gate) are the inbox's: read through it.
    pub inbox: Arc<dyn InboxStore>,
    /// The oldest row not on the bus yet (publication lag).
    pub publisher: Arc<dyn InboundPublisher>,
    pub ispb: String,
    pub channels: Vec<ChannelId>,
    /// Bound on each read.
    pub timeout: Duration,
}

#[derive(Debug, Default, Serialize)]
pub struct ClusterView {
    pub ispb: String,
    pub pods: Vec<PodBeat>,
    pub leader: Option<Holder>,
    /// No pool grants anything while it runs (Redis amnesia, a server change, partial amnesia).
    pub quarantine: Option<Quarantine>,
    /// Per channel and pool (`stream`, `send`): the held slots.
    pub holders: Vec<PoolHolders>,
    pub slots: Vec<SlotRow>,
    /// Age of the oldest inbox row not yet published (0: none waiting); `None` when unreadable.
    pub oldest_unpublished_ms: Option<u64>,
    /// The active alerts (zero_active, stale_slot, lag, cap, reconcile), most severe first, each with its `level`.
    pub alerts: Vec<LeveledAlert>,
    /// Sources that could not be read.
    pub errors: Vec<String>,
}

/// An alert with its level (EMERGENCY, CRITICAL, WARNING, INFO).
#[derive(Debug, Serialize)]
pub struct LeveledAlert {
    pub level: &'static str,
    #[serde(flatten)]
    pub alert: Alert,
}

/// The alerts, most severe first (then as raised).
pub fn by_level(alerts: Vec<Alert>) -> Vec<LeveledAlert> {
    let mut leveled: Vec<(cabine_actors::watchdog::alert::Level, Alert)> =
        alerts.into_iter().map(|a| (a.kind.level(), a)).collect();
    leveled.sort_by_key(|(level, _)| std::cmp::Reverse(*level));
    leveled.into_iter().map(|(level, alert)| LeveledAlert { level: level.label(), alert }).collect()
}

#[derive(Debug, Serialize)]
pub struct PoolHolders {
    pub channel: ChannelId,
    pub pool: &'static str,
    pub holders: Vec<Holder>,
}

/// One stream slot's cursor row.
#[derive(Debug, Serialize)]
pub struct SlotRow {
    pub channel: String,
    pub slot: u8,
    pub fence: i64,
    pub holder: Option<String>,
    /// A stream is open for this slot (a pull-next is stored).
    pub stream_open: bool,
    /// Since the cursor (or the fence) last moved.
    pub cursor_age_ms: u64,
    /// What is left of the gate's busy window: a new holder sends nothing before it ends.
    pub busy_ms: Option<u64>,
}

impl ClusterSource {
    pub async fn read(&self) -> ClusterView {
        let mut view = ClusterView { ispb: self.ispb.clone(), ..Default::default() };
        match self.bounded(self.pods.live_pods()).await {
            Some(Ok(pods)) => view.pods = pods,
            Some(Err(e)) => view.errors.push(format!("pods: {e}")),
            None => view.errors.push(format!("pods: no answer within {:?}", self.timeout)),
        }
        match self.holders(Pool::Leader).await {
            Ok(mut leader) => view.leader = leader.pop(),
            Err(e) => view.errors.push(format!("leader: {e}")),
        }
        for channel in &self.channels {
            for (name, pool) in [("stream", Pool::Stream(*channel)), ("send", Pool::Send(*channel))] {
                match self.holders(pool).await {
                    Ok(holders) => view.holders.push(PoolHolders { channel: *channel, pool: name, holders }),
                    Err(e) => view.errors.push(format!("{pool} holders: {e}")),
                }
            }
        }
        match self.bounded(self.leases.quarantine()).await {
            Some(Ok(q)) => view.quarantine = q,
            Some(Err(e)) => view.errors.push(format!("quarantine: {e}")),
            None => view.errors.push(format!("quarantine: no answer within {:?}", self.timeout)),
        }
        match self.slots().await {
            Ok(slots) => view.slots = slots,
            Err(e) => view.errors.push(format!("slot_cursor: {e}")),
        }
        match self.bounded(self.publisher.oldest_unpublished()).await {
            Some(Ok(age)) => view.oldest_unpublished_ms = Some(age.as_millis() as u64),
            Some(Err(e)) => view.errors.push(format!("publication lag: {e}")),
            None => view.errors.push(format!("publication lag: no answer within {:?}", self.timeout)),
        }
        view.errors = view.errors.iter().map(|e| crate::config::mask_credentials(e)).collect();
        view
    }

    async fn bounded<T>(&self, f: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(self.timeout, f).await.ok()
    }

    async fn holders(&self, pool: Pool) -> Result<Vec<Holder>, String> {
        match self.bounded(self.leases.holders(pool)).await {
            Some(r) => r.map_err(|e| e.to_string()),
            None => Err(format!("no answer within {:?}", self.timeout)),
        }
    }

    async fn slots(&self) -> Result<Vec<SlotRow>, String> {
        let cursors = match self.bounded(self.inbox.cursors()).await {
            Some(r) => r.map_err(|e| e.to_string())?,
            None => return Err(format!("no answer within {:?}", self.timeout)),
        };
        Ok(cursors
            .into_iter()
            .map(|c| SlotRow {
                channel: c.slot.channel.as_str().to_owned(),
                slot: c.slot.n,
                fence: c.fence,
                holder: c.holder,
                stream_open: c.pull_next.is_some(),
                cursor_age_ms: c.age.as_millis() as u64,
                busy_ms: c.busy_for.map(|d| d.as_millis() as u64),
            })
            .collect())
    }
}

pub async fn view(State(state): State<AppState>) -> Response {
    match state.operator {
        Some(o) => {
            let mut view = o.cluster.read().await;
            view.alerts = by_level(o.tree.alerts());
            // A missing stream is one line here, as readiness words it.
            if let Some(check) = state.readiness.report().checks.get("jetstream").filter(|c| !c.ok) {
                view.errors.push(format!("jetstream: {}", check.detail));
            }
            Json(view).into_response()
        }
        None => (StatusCode::SERVICE_UNAVAILABLE, "the pod is not running its tree\n").into_response(),
    }
}
