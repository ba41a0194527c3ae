//! `cabine bench dict`: the Central Bank's homologation capacity test for DICT
//! lookups — at least 20,000 distinct keys in 10 minutes, sustained without
//! peaks — run through P real pods (`GET /v1/dict/entries/{key}`) against the
//! simulated DICT, the participant's category set so its bucket allows the
//! pace. Distinct keys of every type, one new payer per lookup (each payer has
//! a bucket of its own), requests paced in 10 ms steps. The line: distinct keys
//! looked up, lookups per second (the achieved rate and the highest one-second
//! count: no peak above the sustained rate), latency p50/p99, the DICT's 429s
//! (must be 0), cache hits (0: every key is new), errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::time::Instant;

use crate::harness::{ClusterSpec, LocalCluster, cluster};

#[derive(Debug, Clone, clap::Args)]
pub struct DictBenchArgs {
    /// Child `cabine run` pods the lookups are spread over.
    #[arg(long, default_value_t = 3)]
    pub pods: usize,
    /// Distinct keys looked up (default 2,000; `--full`: 20,000).
    #[arg(long)]
    pub keys: Option<usize>,
    /// Over this long (default 60 s; `--full`: 600 s): the pace is keys / seconds.
    #[arg(long)]
    pub seconds: Option<u64>,
    /// The homologation test itself: 20,000 distinct keys over 10 minutes.
    #[arg(long)]
    pub full: bool,
    /// The participant's DICT category at the simulator and in the pods.
    #[arg(long, default_value = "A")]
    pub category: String,
}

/// Keys of each type the simulator knows.
const PER_TYPE: usize = crate::sim::dict::KEYS_PER_TYPE;

#[derive(Debug, Serialize)]
pub struct DictReport {
    pub bench: &'static str,
    pub pods: usize,
    pub category: String,
    pub distinct_keys: usize,
    pub seconds: f64,
    /// The pace asked for: keys / seconds.
    pub target_per_s: f64,
    /// Answers (found or not) over the run's length.
    pub lookups_per_s: f64,
    /// The highest count of answers within one wall-clock second.
    pub max_in_one_second: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub found: u64,
    pub not_found: u64,
    pub cache_hits: u64,
    pub refused_429: u64,
    pub errors: u64,
    /// From the simulator's audit.
    pub sim_lookups: u64,
    pub sim_429: u64,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    per_second: BTreeMap<u64, u64>,
    found: u64,
    not_found: u64,
    cache_hits: u64,
    refused: u64,
    errors: u64,
}

pub async fn run(args: &DictBenchArgs, exe: &Path) -> anyhow::Result<DictReport> {
    let keys = args.keys.unwrap_or(if args.full { 20_000 } else { 2_000 });
    let seconds = args.seconds.unwrap_or(if args.full { 600 } else { 60 });
    if keys == 0 || keys > PER_TYPE * 5 || seconds == 0 || args.pods == 0 {
        bail!("--keys within 1..={}, --seconds and --pods > 0", PER_TYPE * 5);
    }
    crate::install_crypto_provider();
    let sim_args = ["--hold", "1s", "--seed", "1", "--dict-category", &args.category].map(str::to_owned).to_vec();
    let mut env = super::inbound::bench_env();
    env.extend(cluster::pairs(&[("CABINE__DICT__ENABLED", "true"), ("CABINE__DICT__CATEGORY", &args.category)]));
    let spec = ClusterSpec { tag: "bench_dict".into(), pods: args.pods, env, sim_args };
    let c = LocalCluster::start(exe, spec).await.context("starting the local cluster")?;
    let outcome = measure(&c, args, keys, Duration::from_secs(seconds)).await;
    c.cleanup().await;
    outcome
}

async fn measure(c: &LocalCluster, args: &DictBenchArgs, n: usize, length: Duration) -> anyhow::Result<DictReport> {
    let keys = distinct_keys(c, n).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let step = Duration::from_millis(10);
    let (started, mut sent, mut tasks) = (Instant::now(), 0usize, Vec::with_capacity(n));
    while sent < n {
        let due = ((started.elapsed().as_secs_f64() / length.as_secs_f64()) * n as f64).ceil() as usize;
        let due = due.clamp(sent, n);
        for (i, key) in keys.iter().enumerate().take(due).skip(sent) {
            let pod = c.pods[i % c.pods.len()].operator;
            let payer = crate::sim::dict::directory::cpf(i as u64 + 1);
            let url = format!("http://{pod}/v1/dict/entries/{key}?payer_id={payer}&end_to_end_id=E99999010{i:023}");
            tasks.push(tokio::spawn(one(http.clone(), url, started, tally.clone())));
        }
        sent = due;
        tokio::time::sleep(step).await;
    }
    for t in tasks {
        t.await.context("a lookup task")?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let audit: serde_json::Value =
        reqwest::get(format!("{}/sim/dict/audit", c.sim.control.base())).await?.json().await?;
    let t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    let (p50, p99, max) = percentiles(&t.latencies_us)?;
    let n64 = |k: &str| audit[k].as_u64().unwrap_or(0);
    Ok(DictReport {
        bench: "dict",
        pods: args.pods,
        category: args.category.clone(),
        distinct_keys: n,
        seconds: elapsed,
        target_per_s: n as f64 / length.as_secs_f64(),
        lookups_per_s: (t.found + t.not_found) as f64 / elapsed,
        max_in_one_second: t.per_second.values().copied().max().unwrap_or(0),
        p50_ms: p50,
        p99_ms: p99,
        max_ms: max,
        found: t.found,
        not_found: t.not_found,
        cache_hits: t.cache_hits,
        refused_429: t.refused,
        errors: t.errors,
        sim_lookups: n64("dict_lookups"),
        sim_429: n64("dict_429_participant") + n64("dict_429_user"),
    })
}

/// `n` distinct keys, as many of each type as the simulator's directory allows, in turn.
async fn distinct_keys(c: &LocalCluster, n: usize) -> anyhow::Result<Vec<String>> {
    let per_type = n.div_ceil(5);
    let mut by_type = Vec::new();
    for kind in ["CPF", "CNPJ", "PHONE", "EMAIL", "EVP"] {
        let url = format!("{}/sim/dict/keys?type={kind}&count={per_type}", c.sim.control.base());
        let keys: Vec<String> = reqwest::get(url).await?.json().await?;
        by_type.push(keys);
    }
    let mut keys = Vec::with_capacity(n);
    for i in 0..per_type {
        keys.extend(by_type.iter().filter_map(|k| k.get(i).cloned()));
    }
    keys.truncate(n);
    Ok(keys.into_iter().map(|k| k.replace('+', "%2B").replace('@', "%40")).collect())
}

async fn one(http: reqwest::Client, url: String, started: Instant, tally: Arc<Mutex<Tally>>) {
    let at = Instant::now();
    let answer = match http.get(&url).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            Some((status, body["source"] == "cache"))
        }
        Err(_) => None,
    };
    let took = at.elapsed();
    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
    match answer {
        Some((status @ (200 | 404), cached)) => {
            if status == 200 {
                t.found += 1
            } else {
                t.not_found += 1
            }
            t.cache_hits += u64::from(cached);
            t.latencies_us.push(took.as_micros() as u64);
            *t.per_second.entry(started.elapsed().as_secs()).or_default() += 1;
        }
        Some((429, _)) => t.refused += 1,
        _ => t.errors += 1,
    }
}

fn percentiles(us: &[u64]) -> anyhow::Result<(f64, f64, f64)> {
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for v in us {
        h.record((*v).clamp(1, 60_000_000))?;
    }
    let ms = |v: u64| v as f64 / 1000.0;
    Ok((ms(h.value_at_quantile(0.5)), ms(h.value_at_quantile(0.99)), ms(h.max())))
}
