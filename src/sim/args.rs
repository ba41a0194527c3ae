//! The `cabine sim` command line and its run: start the simulator, print the
//! bound addresses as the first stdout line (one JSON object), serve until
//! SIGTERM / Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cabine_actors::domain::Ispb;
use http::StatusCode;

use super::bucket::{BucketRate, BucketRates};
use super::clock::SystemClock;
use super::tls::{ServerKeyKind, TlsOptions};
use super::{SimConfig, Simulator};

#[derive(Clone, Debug, clap::Args)]
pub struct SimArgs {
    /// ISPB of a simulated participant (repeat for several).
    #[arg(long = "ispb", value_name = "ISPB", required = true)]
    pub ispbs: Vec<Ispb>,
    /// Primary channel (cpm) listener.
    #[arg(long, default_value = "127.0.0.1:16422")]
    pub primary: SocketAddr,
    /// Secondary channel (csm) listener.
    #[arg(long, default_value = "127.0.0.1:17422")]
    pub secondary: SocketAddr,
    /// Control API listener (JSON).
    #[arg(long, default_value = "127.0.0.1:16400")]
    pub control: SocketAddr,
    /// Require mTLS; generate the CA, server and client certificates into DIR.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// Key of the server certificate.
    #[arg(long, value_enum, default_value_t = ServerKeyKind::Auto)]
    pub tls_server_key: ServerKeyKind,
    /// Seed of the message generator (random when absent).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Long-poll hold of an empty read before 204 (0s allowed).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub hold: Duration,
    /// Idle time after which a stream is expired and its batch re-queued.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub stream_idle: Duration,
    /// Open streams per (ispb, channel); one more is refused with 429.
    #[arg(long, default_value_t = 6)]
    pub max_streams: usize,
    /// Messages per read with Accept: multipart/mixed (1..=10).
    #[arg(long, default_value_t = 10)]
    pub max_batch: usize,
    /// Simultaneous requests per (ispb, channel).
    #[arg(long, default_value_t = 6)]
    pub max_in_flight: usize,
    /// Status for a request over max-in-flight: 429 or 503.
    #[arg(long, default_value_t = 429, value_parser = over_in_flight_status)]
    pub over_in_flight_status: u16,
    /// Give the in (send) and out (stream) endpoints a max-in-flight cap each.
    #[arg(long)]
    pub sends_counted_separately: bool,
    /// Accept a Host header with a port (strict mode refuses it with 400).
    #[arg(long)]
    pub allow_host_port: bool,
    /// Request body limit in bytes, on the wire and inflated.
    #[arg(long, default_value_t = 5 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Messages per POST.
    #[arg(long, default_value_t = 10)]
    pub max_parts: usize,
    /// Primary token bucket, capacity/refill-per-second.
    #[arg(long, default_value = "3750/750")]
    pub bucket_primary: BucketRate,
    /// Secondary token bucket 08:00-23:59 (Brasília).
    #[arg(long, default_value = "350/35")]
    pub bucket_secondary_day: BucketRate,
    /// Secondary token bucket 00:00-07:59 (Brasília).
    #[arg(long, default_value = "5000/350")]
    pub bucket_secondary_night: BucketRate,
    /// Messages queued per (ispb, channel).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_queue: usize,
    /// Acknowledgements kept by the ledger.
    #[arg(long, default_value_t = 1_000_000)]
    pub ledger_cap: usize,
    /// Received messages (with their bodies) kept by the outbound log.
    #[arg(long, default_value_t = 20_000)]
    pub outbound_cap: usize,
    /// The simulated DICT's listener (`/api/v1/entries/{Key}`, `/api/v1/policies/`).
    #[arg(long, default_value = "127.0.0.1:16522")]
    pub dict: SocketAddr,
    /// The participants' DICT category, A–F: the size and refill of their lookup bucket.
    #[arg(long, default_value = "A")]
    pub dict_category: String,
}

fn over_in_flight_status(s: &str) -> Result<u16, String> {
    match s {
        "429" => Ok(429),
        "503" => Ok(503),
        other => Err(format!("429 or 503, not {other:?}")),
    }
}

impl SimArgs {
    pub fn into_config(self) -> SimConfig {
        let mut cfg = SimConfig::new(self.ispbs);
        cfg.primary = self.primary;
        cfg.secondary = self.secondary;
        cfg.control = self.control;
        cfg.dict = self.dict;
        cfg.dict_category = self.dict_category;
        cfg.tls = self.tls.map(|dir| TlsOptions { dir, server_key: self.tls_server_key });
        cfg.seed = self.seed;
        cfg.hold = self.hold;
        cfg.stream_idle = self.stream_idle;
        cfg.max_streams = self.max_streams;
        cfg.max_messages_per_read = self.max_batch;
        cfg.max_in_flight = self.max_in_flight;
        cfg.over_in_flight_status =
            StatusCode::from_u16(self.over_in_flight_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
        cfg.sends_counted_separately = self.sends_counted_separately;
        cfg.strict_host = !self.allow_host_port;
        cfg.max_body_bytes = self.max_body_bytes;
        cfg.max_parts = self.max_parts;
        cfg.buckets = BucketRates {
            primary: self.bucket_primary,
            secondary_day: self.bucket_secondary_day,
            secondary_night: self.bucket_secondary_night,
        };
        cfg.max_queue = self.max_queue;
        cfg.ledger_cap = self.ledger_cap;
        cfg.outbound_cap = self.outbound_cap;
        cfg.clock = Arc::new(SystemClock);
        cfg
    }
}

/// `cabine sim`: serve until a stop signal.
pub async fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    let sim = Simulator::start(args.into_config()).await.context("starting the ICOM simulator")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", sim.addresses_json()).context("writing the addresses")?;
        out.flush().context("writing the addresses")?;
    }
    if let Some(files) = &sim.tls {
        tracing::info!(dir = %files.dir.display(), server_key = files.server_key_algorithm, "simulator PKI written");
    }
    crate::run::shutdown_signal().await;
    sim.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
