//! The fault drivers: one planned fault applied to the world. Pod faults aim at
//! a pod that holds stream slots at that moment (the plan's `pick` chooses among
//! them, by pod id); store faults act on the private servers. Every wait is
//! bounded: a pod that does not exit within its stop budget, or a replacement
//! that is not ready in time, is an error the verdict counts.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::holders::{self, HoldersError};
use super::plan::PlannedFault;
use super::scenario::Scenario;
use super::world::{READY_WITHIN, World};
use crate::harness::{ClusterError, NatsServerError, PodError, PostgresServerError, RedisServerError};

#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("finding a victim: {0}")]
    Holders(#[from] HoldersError),
    #[error("no pod to aim at")]
    NoPod,
    #[error("pod {pod} still running {within:?} after {signal}; killed")]
    NoExit { pod: String, signal: &'static str, within: Duration },
    #[error("replacement pod: {0}")]
    Replacement(#[from] ClusterError),
    #[error("replacement pod not ready: {0}")]
    NotReady(#[from] PodError),
    #[error("replacement pod did not report its address within {0:?}")]
    NoAddress(Duration),
    #[error("redis: {0}")]
    Redis(#[from] RedisServerError),
    #[error("postgres: {0}")]
    Postgres(#[from] PostgresServerError),
    #[error("nats: {0}")]
    Nats(#[from] NatsServerError),
    #[error("{0} has no private server in this run")]
    NoServer(&'static str),
}

/// What a fault did, for the progress lines and the report.
#[derive(Clone, Debug)]
pub struct Applied {
    /// Pod id, or `redis` / `postgres` / `nats`.
    pub target: String,
    /// Stream slots the victim held when it was hit (pod faults).
    pub slots: Vec<u8>,
    /// What else is worth knowing (keys evicted, exit status, …).
    pub note: String,
}

/// Applies `fault` of `scenario` and returns once it is over (the pod back or replaced, the server up again).
pub async fn apply(world: &mut World, scenario: Scenario, fault: &PlannedFault) -> Result<Applied, FaultError> {
    let hold = fault.hold;
    match scenario {
        Scenario::Kill => kill(world, fault).await,
        Scenario::Pause => pause(world, fault).await,
        Scenario::Term => term(world, fault).await,
        Scenario::RedisRestart => {
            world.redis.restart_after(hold).await?;
            Ok(store("redis", format!("down {} ms, every key gone", hold.as_millis())))
        }
        Scenario::RedisEvict => {
            let n = world.redis.evict_volatile().await?;
            Ok(store("redis", format!("{n} keys with a TTL deleted")))
        }
        Scenario::RedisRollback => {
            world.redis.save().await?;
            tokio::time::sleep(hold).await;
            world.redis.restart().await?;
            Ok(store("redis", format!("restarted from a snapshot {} ms old", hold.as_millis())))
        }
        Scenario::PgRestart => {
            world.postgres.as_mut().ok_or(FaultError::NoServer("postgres"))?.restart_after(hold).await?;
            Ok(store("postgres", format!("crash-stopped, down {} ms", hold.as_millis())))
        }
        Scenario::NatsRestart => {
            world.nats.as_mut().ok_or(FaultError::NoServer("nats"))?.restart_after(hold).await?;
            Ok(store("nats", format!("stopped, down {} ms", hold.as_millis())))
        }
    }
}

fn store(target: &str, note: String) -> Applied {
    Applied { target: target.to_owned(), slots: Vec::new(), note }
}

/// The victim: `pick` modulo the pods holding stream slots; any pod when none holds one.
async fn victim(world: &World, pick: u64) -> Result<(usize, Vec<u8>), FaultError> {
    let c = &world.cluster;
    let held = holders::stream_holders(c).await?;
    let pods = holders::holding_pods(c, &held);
    if let Some(v) = pods.get((pick % pods.len().max(1) as u64) as usize) {
        return Ok(v.clone());
    }
    if c.pods.is_empty() {
        return Err(FaultError::NoPod);
    }
    Ok(((pick % c.pods.len() as u64) as usize, Vec::new()))
}

async fn kill(world: &mut World, fault: &PlannedFault) -> Result<Applied, FaultError> {
    let (i, slots) = victim(world, fault.pick).await?;
    let mut pod = world.cluster.pods.remove(i);
    pod.signal(Signal::SIGKILL);
    let status = tokio::time::timeout(Duration::from_secs(5), pod.child.wait()).await;
    let note = format!("SIGKILL ({}), replacement after {} ms", exit_note(status), fault.hold.as_millis());
    let applied = pod_fault(&pod.pod_id, slots, note);
    drop(pod);
    tokio::time::sleep(fault.hold).await;
    replace(world).await?;
    Ok(applied)
}

async fn pause(world: &mut World, fault: &PlannedFault) -> Result<Applied, FaultError> {
    let (i, slots) = victim(world, fault.pick).await?;
    let pod = &world.cluster.pods[i];
    pod.signal(Signal::SIGSTOP);
    tokio::time::sleep(fault.hold).await;
    pod.signal(Signal::SIGCONT);
    let note = format!("SIGSTOP for {} ms, then SIGCONT", fault.hold.as_millis());
    Ok(pod_fault(&pod.pod_id, slots, note))
}

async fn term(world: &mut World, fault: &PlannedFault) -> Result<Applied, FaultError> {
    let (i, slots) = victim(world, fault.pick).await?;
    let budget = world.cluster.settings.timing.stop_timeout + Duration::from_secs(2);
    let mut pod = world.cluster.pods.remove(i);
    pod.signal(Signal::SIGTERM);
    let status = tokio::time::timeout(budget, pod.child.wait()).await;
    if status.is_err() {
        pod.signal(Signal::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(5), pod.child.wait()).await;
        let _ = replace_after(world, fault.hold).await;
        return Err(FaultError::NoExit { pod: pod.pod_id.clone(), signal: "SIGTERM", within: budget });
    }
    let note = format!("SIGTERM ({}), replacement after {} ms", exit_note(status), fault.hold.as_millis());
    let applied = pod_fault(&pod.pod_id, slots, note);
    drop(pod);
    replace_after(world, fault.hold).await?;
    Ok(applied)
}

async fn replace_after(world: &mut World, delay: Duration) -> Result<(), FaultError> {
    tokio::time::sleep(delay).await;
    replace(world).await
}

/// A new pod (new pod id, as a replaced Kubernetes pod), waited for until ready.
async fn replace(world: &mut World) -> Result<(), FaultError> {
    // A pod that never reports its address is dropped with the timed-out future (and killed).
    let spawned = tokio::time::timeout(READY_WITHIN, world.cluster.spawn_pod()).await;
    let pod = spawned.map_err(|_| FaultError::NoAddress(READY_WITHIN))??;
    pod.wait_ready(READY_WITHIN).await?;
    Ok(())
}

fn pod_fault(pod_id: &str, slots: Vec<u8>, note: String) -> Applied {
    Applied { target: pod_id.to_owned(), slots, note }
}

fn exit_note<E>(status: Result<std::io::Result<std::process::ExitStatus>, E>) -> String {
    match status {
        Ok(Ok(s)) => s.to_string(),
        Ok(Err(e)) => format!("wait failed: {e}"),
        Err(_) => "no exit seen".to_owned(),
    }
}
