//! The conformance suite's rig: an in-process simulator on port 0 and the REAL
//! ICOM client (`IcomChannels` built from `Settings` whose `cpm` channel points
//! at it), plus the outcome helpers every conformance test uses. Control-API
//! helpers (inject, faults, audit) come from `sim_support`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use cabine::config::{DEFAULT_TOML, Settings};
use cabine::icom::{IcomChannels, IcomClient};
use cabine::sim::SimConfig;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{InboundMessage, PollOutcome};
use serde_json::{Value, json};

use crate::sim_support::{self, ISPB, TestSim};

/// Client request timeout of the rig (both long-poll and send), well above the sim's hold.
pub const CLIENT_TIMEOUT: &str = "2s";

/// A simulator and a client configured for it.
pub struct Rig {
    pub t: TestSim,
    pub settings: Settings,
    pub channels: IcomChannels,
}

/// `Settings` from the compiled-in defaults plus `overrides` (`CABINE__…` keys).
pub fn settings(overrides: &[(&str, String)]) -> Settings {
    let env: HashMap<String, String> = overrides.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    Settings::from_sources(DEFAULT_TOML, None, &env).expect("valid settings")
}

/// The overrides that point the `cpm` channel of participant `ispb` at `base_url`.
pub fn channel_overrides(base_url: &str, ispb: &str, timeout: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CABINE__CLUSTER__ISPB", ispb.to_owned()),
        ("CABINE__ICOM__CHANNELS__CPM__BASE_URL", base_url.to_owned()),
        ("CABINE__TIMING__LONG_POLL_TIMEOUT", timeout.to_owned()),
        ("CABINE__ICOM__SERVER_HOLD", "200ms".to_owned()),
        ("CABINE__TIMING__SEND_TIMEOUT", timeout.to_owned()),
    ]
}

/// A simulator (seed 1, hold 200 ms, after `tweak`) and a client of ISPB over plain http.
pub async fn rig(tweak: impl FnOnce(&mut SimConfig)) -> Rig {
    rig_as(ISPB, CLIENT_TIMEOUT, tweak).await
}

/// Like [`rig`], the client speaking as participant `ispb` with request timeout `timeout`.
pub async fn rig_as(ispb: &str, timeout: &str, tweak: impl FnOnce(&mut SimConfig)) -> Rig {
    let t = sim_support::start(tweak).await;
    let settings = settings(&channel_overrides(&t.primary, ispb, timeout));
    let channels = IcomChannels::from_settings(&settings).expect("client from settings");
    Rig { t, settings, channels }
}

impl Rig {
    /// A fresh client: its own connection.
    pub fn client(&self) -> IcomClient {
        self.channels.client(ChannelId::Cpm).expect("cpm client")
    }

    /// Queues `count` messages of `kind` on (ISPB, cpm): (ResourceIds, BizMsgIdrs).
    pub async fn inject(&self, count: usize, kind: &str) -> (Vec<String>, Vec<Option<String>>) {
        let url = format!("{}/sim/inject", self.t.control);
        let r = self.t.http.post(url).json(&json!({ "count": count, "kind": kind })).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        let ids = v["ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_owned()).collect();
        let msg_ids = v["msg_ids"].as_array().unwrap().iter().map(|i| i.as_str().map(str::to_owned)).collect();
        (ids, msg_ids)
    }

    /// The audit of (ISPB, cpm).
    pub async fn audit(&self) -> Value {
        self.t.audit().await
    }

    /// The messages the simulator received (bodies included).
    pub async fn outbound(&self) -> Vec<Value> {
        let page = self.t.control_get(&format!("/sim/outbound?ispb={ISPB}&channel=cpm&body=true")).await;
        page["entries"].as_array().unwrap().clone()
    }
}

/// The batch and pull-next of a `Messages` outcome; panics on anything else.
pub fn messages(outcome: PollOutcome) -> (Vec<InboundMessage>, String) {
    match outcome {
        PollOutcome::Messages { batch, pull_next } => (batch, pull_next),
        other => panic!("expected Messages, got {other:?}"),
    }
}

/// The pull-next of an `Empty` outcome; panics on anything else.
pub fn empty(outcome: PollOutcome) -> String {
    match outcome {
        PollOutcome::Empty { pull_next } => pull_next,
        other => panic!("expected Empty, got {other:?}"),
    }
}

pub fn ids(batch: &[InboundMessage]) -> Vec<String> {
    batch.iter().map(|m| m.resource_id.clone()).collect()
}

/// Reads with `client` until `want` messages came (each read following the last pull-next):
/// (messages in order, the last pull-next). Bounded by `max_reads`.
pub async fn read_all(
    client: &mut IcomClient,
    first: PollOutcome,
    want: usize,
    max_reads: usize,
) -> (Vec<InboundMessage>, String) {
    let mut got = Vec::new();
    let mut outcome = first;
    for _ in 0..max_reads {
        let pull_next = match outcome {
            PollOutcome::Messages { batch, pull_next } => {
                got.extend(batch);
                pull_next
            }
            PollOutcome::Empty { pull_next } => pull_next,
            other => panic!("reading {want} messages: {other:?}"),
        };
        if got.len() >= want {
            return (got, pull_next);
        }
        outcome = client.next(&pull_next).await;
    }
    panic!("only {} of {want} messages in {max_reads} reads", got.len());
}

/// A pacs.008 from ISPB with `msg_id` and one transaction per EndToEndId, as bytes.
pub fn pacs008(msg_id: &str, e2e: &[&str]) -> Bytes {
    Bytes::from(sim_support::pacs008(msg_id, e2e))
}

/// A unique EndToEndId: `E` + ISPB + yyyyMMddHHmm + 11 characters.
pub fn end_to_end_id(n: u64) -> String {
    format!("E{ISPB}202403011200{:011}", n + std::process::id() as u64 * 10_000)
}

/// Waits (at most `within`) until `check` holds on the audit of (ISPB, cpm).
pub async fn wait_audit(rig: &Rig, within: Duration, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let audit = rig.audit().await;
        if check(&audit) {
            return audit;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {audit}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
