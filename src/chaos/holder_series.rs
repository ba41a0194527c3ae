//! Stream slots held per pod over a chaos run (`--holders FILE`), sampled from
//! the pods' `/cluster` (the lease store) between the faults, with the faults
//! marked: what `bench report` draws as "slots held per pod through a failover".

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::holders::stream_holders;
use crate::harness::LocalCluster;

/// Time between two samples.
pub const EVERY: Duration = Duration::from_millis(250);

/// The primary channel's stream slots per pod over one run.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct HolderSeries {
    pub scenario: String,
    /// Stream slots of the pool (`pools.stream`).
    pub slots: u8,
    /// Seconds since the traffic started, per sample.
    pub t_s: Vec<f64>,
    /// Per pod (short id, `p3`), slots held at each sample; a pod that did not exist yet held 0.
    pub pods: Vec<(String, Vec<f64>)>,
    /// Slots nobody held, per sample.
    pub free: Vec<f64>,
    /// Each fault: seconds since the traffic started, and which pod it hit (short id) or what.
    pub faults: Vec<(f64, String)>,
}

impl HolderSeries {
    pub fn new(scenario: &str, slots: u8) -> HolderSeries {
        HolderSeries { scenario: scenario.to_owned(), slots, ..HolderSeries::default() }
    }

    /// One sample: slot → holding pod id.
    pub fn record(&mut self, t_s: f64, holders: &BTreeMap<u8, String>) {
        let at = self.t_s.len();
        self.t_s.push(t_s);
        let mut held: BTreeMap<String, f64> = BTreeMap::new();
        for pod in holders.values() {
            *held.entry(short(pod).to_owned()).or_default() += 1.0;
        }
        for pod in held.keys() {
            if !self.pods.iter().any(|(p, _)| p == pod) {
                self.pods.push((pod.clone(), Vec::new()));
                self.pods.sort_by(|a, b| a.0.cmp(&b.0));
            }
        }
        for (pod, values) in &mut self.pods {
            values.resize(at, 0.0);
            values.push(held.get(pod).copied().unwrap_or(0.0));
        }
        self.free.push(f64::from(self.slots) - holders.len() as f64);
    }

    pub fn fault(&mut self, t_s: f64, target: &str) {
        self.faults.push((t_s, short(target).to_owned()));
    }
}

/// Until `until`: samples every [`EVERY`] into `series` when there is one, else just waits.
pub async fn sample_until(c: &LocalCluster, series: Option<&mut HolderSeries>, started: Instant, until: Instant) {
    let Some(series) = series else {
        tokio::time::sleep_until(until).await;
        return;
    };
    while Instant::now() < until {
        let next = (Instant::now() + EVERY).min(until);
        // No pod answered (all paused or dead): no sample; the plot holds the previous one, never a zero.
        if let Ok(holders) = stream_holders(c).await {
            series.record(started.elapsed().as_secs_f64(), &holders);
        }
        tokio::time::sleep_until(next).await;
    }
}

/// `chaos_123_0_ab12-p3` → `p3`.
pub fn short(pod: &str) -> &str {
    pod.rsplit_once('-').map_or(pod, |(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_that_appears_later_held_nothing_before() {
        let mut s = HolderSeries::new("kill", 4);
        s.record(0.0, &BTreeMap::from([(1, "x-p1".into()), (2, "x-p1".into()), (3, "x-p2".into())]));
        s.fault(0.1, "x-p1");
        s.record(0.25, &BTreeMap::from([(3, "x-p2".into())]));
        s.record(
            0.5,
            &BTreeMap::from([(1, "x-p3".into()), (2, "x-p2".into()), (3, "x-p2".into()), (4, "x-p3".into())]),
        );
        let pods: Vec<(&str, &[f64])> = s.pods.iter().map(|(p, v)| (p.as_str(), v.as_slice())).collect();
        assert_eq!(
            pods,
            vec![("p1", &[2.0, 0.0, 0.0][..]), ("p2", &[1.0, 1.0, 2.0][..]), ("p3", &[0.0, 0.0, 2.0][..])]
        );
        assert_eq!(s.free, vec![1.0, 3.0, 0.0]);
        assert_eq!(s.faults, vec![(0.1, "p1".to_owned())]);
    }
}
