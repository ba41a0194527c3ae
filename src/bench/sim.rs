//! `cabine bench sim`: how fast the ICOM simulator serves the REAL client
//! (`IcomClient`), so that it is never what bounds a cabine benchmark. Each
//! phase gets a fresh in-process simulator (loopback, port 0, hold 0, the
//! token bucket lifted so it does not bound the figures):
//! reads — N messages injected, then one stream (or 6 concurrent streams)
//! reading 10-message multipart+gzip batches, timed from `start` until the
//! last batch is acknowledged (DELETE); sends — N pacs.008 (catalog example,
//! unique MsgId / EndToEndId) in 10-message gzipped multipart POSTs from one
//! client, or 6. The simulator's audit must agree with what the client saw.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use cabine_actors::domain::{ChannelId, Ispb};
use cabine_actors::ports::{CloseOutcome, PollOutcome};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::latency::Latency;
use crate::cli::SimBenchArgs;
use crate::config::Settings;
use crate::harness::outbound::pacs008_bodies;
use crate::icom::{EndpointSettings, IcomEndpoint, SendOutcome, WireLimits, tls};
use crate::sim::{BucketRate, MAX_INJECT, RunningSim, SimConfig, Simulator};

/// Messages per read and per POST.
pub const BATCH: usize = 10;
/// Concurrent streams / clients of the "6" figures (the Central Bank's cap).
pub const CONCURRENCY: usize = 6;
/// The one JSON line.
#[derive(Debug, Serialize)]
pub struct SimBenchReport {
    pub read_1_stream_msgs_per_s: f64,
    pub read_6_streams_msgs_per_s: f64,
    pub send_1_client_msgs_per_s: f64,
    pub send_6_clients_msgs_per_s: f64,
    pub messages: usize,
    pub batch: usize,
    /// `lifted`: the simulator's token bucket is set far above what the run can spend.
    pub bucket: &'static str,
    /// Latency of one read / one POST (whole response), one client.
    pub read_1_stream_p50_us: u64,
    pub read_1_stream_p99_us: u64,
    pub send_1_client_p50_us: u64,
    pub send_1_client_p99_us: u64,
}

/// What one phase measured.
struct Phase {
    per_s: f64,
    latency: Latency,
}

/// Runs the four phases with `args.messages` messages each.
pub async fn run(args: &SimBenchArgs, settings: &Settings) -> anyhow::Result<SimBenchReport> {
    let n = args.messages.max(BATCH);
    let ispb = settings.cluster.ispb.clone();
    let read_1 = read_phase(&ispb, settings, n, 1).await.context("read, 1 stream")?;
    let read_6 = read_phase(&ispb, settings, n, CONCURRENCY).await.context("read, 6 streams")?;
    let bodies = pacs008_bodies(&ispb, n);
    let send_1 = send_phase(&ispb, settings, &bodies, 1).await.context("send, 1 client")?;
    let send_6 = send_phase(&ispb, settings, &bodies, CONCURRENCY).await.context("send, 6 clients")?;
    Ok(SimBenchReport {
        read_1_stream_msgs_per_s: round(read_1.per_s),
        read_6_streams_msgs_per_s: round(read_6.per_s),
        send_1_client_msgs_per_s: round(send_1.per_s),
        send_6_clients_msgs_per_s: round(send_6.per_s),
        messages: n,
        batch: BATCH,
        bucket: "lifted",
        read_1_stream_p50_us: read_1.latency.quantile_us(0.5),
        read_1_stream_p99_us: read_1.latency.quantile_us(0.99),
        send_1_client_p50_us: send_1.latency.quantile_us(0.5),
        send_1_client_p99_us: send_1.latency.quantile_us(0.99),
    })
}

fn round(x: f64) -> f64 {
    x.round()
}

/// A fresh simulator for one phase: hold 0, bucket lifted, queue sized for the run.
async fn simulator(ispb: &Ispb, messages: usize) -> anyhow::Result<RunningSim> {
    let mut cfg = SimConfig::new(vec![ispb.clone()]);
    cfg.hold = Duration::ZERO;
    cfg.buckets.primary = BucketRate::new(1e12, 1e12);
    cfg.max_queue = cfg.max_queue.max(messages * 2);
    cfg.dedup_cap = cfg.dedup_cap.max(messages);
    Simulator::start(cfg).await.context("starting the simulator")
}

/// The real client's endpoint for the simulator's primary listener (plain http).
fn endpoint(ispb: &Ispb, settings: &Settings, addr: SocketAddr) -> anyhow::Result<Arc<IcomEndpoint>> {
    let endpoint = EndpointSettings {
        channel: ChannelId::Cpm,
        ispb: ispb.clone(),
        base_url: format!("http://{addr}"),
        limits: WireLimits::from(&settings.icom.limits),
        long_poll_timeout: settings.timing.long_poll_timeout,
        send_timeout: settings.timing.send_timeout,
        host_without_port: settings.icom.host_without_port,
    };
    Ok(Arc::new(IcomEndpoint::new(endpoint, tls::plain_config()?)?))
}

/// The control API of a running simulator.
struct Control {
    http: reqwest::Client,
    base: String,
}

impl Control {
    fn new(sim: &RunningSim) -> anyhow::Result<Control> {
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build()?;
        Ok(Control { http, base: format!("http://{}", sim.control) })
    }

    async fn inject(&self, ispb: &Ispb, mut count: usize) -> anyhow::Result<()> {
        while count > 0 {
            let chunk = count.min(MAX_INJECT);
            let body = json!({ "ispb": ispb.as_str(), "channel": "cpm", "count": chunk, "kind": "pacs008" });
            let r = self.http.post(format!("{}/sim/inject", self.base)).json(&body).send().await?;
            ensure!(r.status().is_success(), "inject answered {}", r.status());
            count -= chunk;
        }
        Ok(())
    }

    /// The audit of (ispb, cpm).
    async fn audit(&self, ispb: &Ispb) -> anyhow::Result<Value> {
        let all: Value = self.http.get(format!("{}/sim/audit", self.base)).send().await?.json().await?;
        all["lanes"]
            .as_array()
            .and_then(|lanes| lanes.iter().find(|l| l["ispb"] == ispb.as_str() && l["channel"] == "cpm"))
            .cloned()
            .context("the audit has no (ispb, cpm) lane")
    }
}

/// N messages queued, then `streams` clients each reading until the queue is empty.
async fn read_phase(ispb: &Ispb, settings: &Settings, n: usize, streams: usize) -> anyhow::Result<Phase> {
    let sim = simulator(ispb, n).await?;
    let control = Control::new(&sim)?;
    control.inject(ispb, n).await?;
    let endpoint = endpoint(ispb, settings, sim.primary)?;
    let began = Instant::now();
    let mut readers = JoinSet::new();
    for _ in 0..streams {
        let endpoint = endpoint.clone();
        readers.spawn(async move { read_until_empty(&endpoint).await });
    }
    let (mut read, mut latency) = (0usize, Latency::default());
    while let Some(done) = readers.join_next().await {
        let (count, lat) = done.context("a reader panicked")??;
        read += count;
        latency.add(&lat);
    }
    let elapsed = began.elapsed();
    let audit = control.audit(ispb).await?;
    sim.shutdown().await;
    ensure!(read == n, "the clients read {read} messages of {n}");
    let acked = audit["acknowledged"].as_u64().unwrap_or(0);
    ensure!(acked == n as u64 && audit["redelivered"] == 0, "the simulator disagrees: {audit}");
    Ok(Phase { per_s: n as f64 / elapsed.as_secs_f64(), latency })
}

/// One stream: start, follow the pull-next until a read is empty, then DELETE (acknowledges the last batch).
async fn read_until_empty(endpoint: &Arc<IcomEndpoint>) -> anyhow::Result<(usize, Latency)> {
    let mut client = endpoint.connect()?;
    let (mut read, mut latency) = (0usize, Latency::default());
    let mut asked = Instant::now();
    let mut outcome = client.start().await;
    loop {
        latency.record(asked.elapsed());
        let pull_next = match outcome {
            PollOutcome::Messages { batch, pull_next } => {
                read += batch.len();
                pull_next
            }
            PollOutcome::Empty { pull_next } => match client.close(&pull_next).await {
                CloseOutcome::Closed => return Ok((read, latency)),
                CloseOutcome::Failed(why) => bail!("closing the stream: {why}"),
            },
            other => bail!("a read answered {other:?}"),
        };
        asked = Instant::now();
        outcome = client.next(&pull_next).await;
    }
}

/// The bodies spread over `clients` clients in 10-message POSTs.
async fn send_phase(ispb: &Ispb, settings: &Settings, bodies: &[Bytes], clients: usize) -> anyhow::Result<Phase> {
    let sim = simulator(ispb, bodies.len()).await?;
    let control = Control::new(&sim)?;
    let endpoint = endpoint(ispb, settings, sim.primary)?;
    let batches: Vec<Vec<Bytes>> = bodies.chunks(BATCH).map(<[Bytes]>::to_vec).collect();
    let mut shares: Vec<Vec<Vec<Bytes>>> = vec![Vec::new(); clients];
    for (i, batch) in batches.into_iter().enumerate() {
        shares[i % clients].push(batch);
    }
    let began = Instant::now();
    let mut senders = JoinSet::new();
    for share in shares {
        let endpoint = endpoint.clone();
        senders.spawn(async move { send_all(&endpoint, share).await });
    }
    let (mut accepted, mut latency) = (0usize, Latency::default());
    while let Some(done) = senders.join_next().await {
        let (count, lat) = done.context("a sender panicked")??;
        accepted += count;
        latency.add(&lat);
    }
    let elapsed = began.elapsed();
    let audit = control.audit(ispb).await?;
    sim.shutdown().await;
    ensure!(accepted == bodies.len(), "{accepted} of {} messages accepted", bodies.len());
    let received = audit["received_outbound"].as_u64().unwrap_or(0);
    let clean = audit["duplicates_outbound"] == 0 && audit["malformed_outbound"] == 0;
    ensure!(received == bodies.len() as u64 && clean, "the simulator disagrees: {audit}");
    Ok(Phase { per_s: bodies.len() as f64 / elapsed.as_secs_f64(), latency })
}

async fn send_all(endpoint: &Arc<IcomEndpoint>, batches: Vec<Vec<Bytes>>) -> anyhow::Result<(usize, Latency)> {
    let mut client = endpoint.connect()?;
    let (mut accepted, mut latency) = (0usize, Latency::default());
    for batch in batches {
        let asked = Instant::now();
        match client.send(&batch).await? {
            SendOutcome::Accepted { resource_ids } if resource_ids.len() == batch.len() => {
                accepted += resource_ids.len();
            }
            other => bail!("a send of {} answered {other:?}", batch.len()),
        }
        latency.record(asked.elapsed());
    }
    Ok((accepted, latency))
}
