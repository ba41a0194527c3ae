//! `cabine sim`: the ICOM simulator — the Central Bank in every test, demo and
//! benchmark. Strict (DESIGN §1: every (C) rule, the (I) ones configurable),
//! observable (audit, ledger, outbound log) and fast. Its wire code is its own
//! (multer, flate2, quick-xml), independent of `crate::icom`, so one bug cannot
//! hide on both sides.
//!
//! One listener per channel (primary = `cpm`, secondary = `csm`) serves every
//! configured ISPB; state lives per (ispb, channel) in a [`lane`]. A control
//! listener (JSON) injects messages, sets faults and reports.

mod args;
mod audit;
mod body;
mod bucket;
mod clock;
mod control;
mod der;
pub mod dict;
mod envelope;
mod faults;
mod fuzz;
mod generator;
mod headers;
mod lane;
mod listener;
mod problem;
mod routes;
mod sends;
mod settlement;
mod state;
mod streams;
mod template;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cabine_actors::domain::{ChannelId, Ispb};
use http::StatusCode;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use args::{SimArgs, run};
pub use audit::{AuditReport, LaneAudit};
pub use bucket::{BucketRate, BucketRates};
pub use clock::{ManualClock, SimClock, SystemClock};
pub use control::{InjectKind, MAX_INJECT};
pub use faults::Faults;
pub use fuzz::fuzz_entry;
pub use problem::TYPE_BASE as PROBLEM_TYPE_BASE;
pub use settlement::{Direction as SettlementDirection, SettlementMode};
pub use tls::{ClientFiles, ServerKeyKind, TlsError, TlsFiles, TlsOptions, provision};

/// Everything the simulator is told at start. [`SimConfig::new`] gives the defaults on loopback port 0.
#[derive(Clone)]
pub struct SimConfig {
    pub ispbs: Vec<Ispb>,
    pub primary: SocketAddr,
    pub secondary: SocketAddr,
    pub control: SocketAddr,
    /// The simulated DICT's listener (mTLS like ICOM when `tls` is set).
    pub dict: SocketAddr,
    /// The participants' DICT category (A–F): the size of their lookup bucket.
    pub dict_category: String,
    /// mTLS on both ICOM listeners, with a PKI generated into a directory.
    pub tls: Option<TlsOptions>,
    /// Seed of the message generator (random when absent; the audit reports it).
    pub seed: Option<u64>,
    /// Long-poll hold of an empty read before 204 (0 allowed). Changeable at run time (faults).
    pub hold: Duration,
    /// A stream without requests for this long is expired. Changeable at run time (faults).
    pub stream_idle: Duration,
    /// Open streams per (ispb, channel); one more → 429 on start.
    pub max_streams: usize,
    /// Messages per read with `Accept: multipart/mixed` (1 without it).
    pub max_messages_per_read: usize,
    /// Simultaneous requests per (ispb, channel); one more → `over_in_flight_status`.
    pub max_in_flight: usize,
    /// 429 (default) or 503.
    pub over_in_flight_status: StatusCode,
    /// When true the in and out endpoints have a cap each; else one cap over both.
    pub sends_counted_separately: bool,
    /// Refuse (400) a Host header that carries a port.
    pub strict_host: bool,
    /// Request body limit, on the wire and inflated.
    pub max_body_bytes: usize,
    /// Messages per POST.
    pub max_parts: usize,
    pub buckets: BucketRates,
    /// Messages queued per (ispb, channel).
    pub max_queue: usize,
    /// Acknowledgements kept by the ledger (oldest forgotten first).
    pub ledger_cap: usize,
    /// Received messages kept by the outbound log.
    pub outbound_cap: usize,
    /// MsgIds remembered per simulator for duplicate detection.
    pub dedup_cap: usize,
    pub clock: Arc<dyn SimClock>,
}

impl SimConfig {
    /// The defaults of DESIGN §1 for `ispbs`, every listener on 127.0.0.1 port 0.
    pub fn new(ispbs: Vec<Ispb>) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        SimConfig {
            ispbs,
            primary: any,
            secondary: any,
            control: any,
            dict: any,
            dict_category: "A".into(),
            tls: None,
            seed: None,
            hold: Duration::from_secs(5),
            stream_idle: Duration::from_secs(60),
            max_streams: 6,
            max_messages_per_read: 10,
            max_in_flight: 6,
            over_in_flight_status: StatusCode::TOO_MANY_REQUESTS,
            sends_counted_separately: false,
            strict_host: true,
            max_body_bytes: 5 * 1024 * 1024,
            max_parts: 10,
            buckets: BucketRates::default(),
            max_queue: 1_000_000,
            ledger_cap: 1_000_000,
            outbound_cap: 20_000,
            dedup_cap: 1_000_000,
            clock: Arc::new(SystemClock),
        }
    }

    fn validate(&self) -> Result<(), SimError> {
        let bad = |what: &str| Err(SimError::Config(what.to_owned()));
        if self.ispbs.is_empty() {
            return bad("at least one ISPB");
        }
        if self.max_streams == 0 || self.max_in_flight == 0 || self.max_parts == 0 {
            return bad("max_streams, max_in_flight and max_parts must be positive");
        }
        if !(1..=10).contains(&self.max_messages_per_read) {
            return bad("max_messages_per_read must be within 1..=10");
        }
        if self.over_in_flight_status != StatusCode::TOO_MANY_REQUESTS
            && self.over_in_flight_status != StatusCode::SERVICE_UNAVAILABLE
        {
            return bad("over_in_flight_status must be 429 or 503");
        }
        if self.stream_idle.is_zero() {
            return bad("stream_idle must be positive");
        }
        if dict::policies::category(&self.dict_category).is_none() {
            return bad("dict_category must be one of A..=F");
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulator configuration: {0}")]
    Config(String),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Template(#[from] template::TemplateError),
}

/// The simulator.
pub struct Simulator;

/// A running simulator: its addresses, and `shutdown`.
pub struct RunningSim {
    pub primary: SocketAddr,
    pub secondary: SocketAddr,
    pub control: SocketAddr,
    pub dict: SocketAddr,
    /// The PKI files when started with TLS.
    pub tls: Option<TlsFiles>,
    /// The generator's seed.
    pub seed: u64,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// Requests being handled (they outlive their connections, not the simulator).
    requests: TaskTracker,
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), SimError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(|source| SimError::Bind { addr, source })?;
    Ok((listener, local))
}

impl Simulator {
    /// Binds the three listeners and serves until [`RunningSim::shutdown`].
    pub async fn start(cfg: SimConfig) -> Result<RunningSim, SimError> {
        cfg.validate()?;
        let tls = match &cfg.tls {
            Some(opts) => Some(tls::provision(opts, &cfg.ispbs)?),
            None => None,
        };
        let (primary, primary_addr) = bind(cfg.primary).await?;
        let (secondary, secondary_addr) = bind(cfg.secondary).await?;
        let (control, control_addr) = bind(cfg.control).await?;
        let (dict, dict_addr) = bind(cfg.dict).await?;
        let shared = Arc::new(state::Shared::new(cfg, tls.is_some())?);
        let cancel = CancellationToken::new();
        let (files, acceptor) = tls.map(|(f, a)| (Some(f), Some(a))).unwrap_or((None, None));
        let mut tasks = Vec::new();
        for (listener, channel) in [(primary, ChannelId::Cpm), (secondary, ChannelId::Csm)] {
            let (shared, acceptor, cancel) = (shared.clone(), acceptor.clone(), cancel.clone());
            tasks.push(tokio::spawn(listener::serve(listener, channel, shared, acceptor, cancel)));
        }
        let app = control::router(control::ControlState { shared: shared.clone(), cancel: cancel.clone() });
        let stop = cancel.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(control, app).with_graceful_shutdown(stop.cancelled_owned()).await {
                tracing::error!(error = %e, "simulator control API stopped");
            }
        }));
        tasks.push(tokio::spawn(sweep_idle_streams(shared.clone(), cancel.clone())));
        tasks.push(tokio::spawn(dict::serve(dict, shared.dict.clone(), acceptor.clone(), cancel.clone())));
        tracing::info!(primary = %primary_addr, secondary = %secondary_addr, control = %control_addr, seed = shared.seed, "ICOM simulator listening");
        Ok(RunningSim {
            primary: primary_addr,
            secondary: secondary_addr,
            control: control_addr,
            dict: dict_addr,
            tls: files,
            seed: shared.seed,
            cancel,
            tasks,
            requests: shared.requests.clone(),
        })
    }
}

/// Expires idle streams, checking several times per idle period (at least every 250 ms, so a
/// stream idle shortened at run time takes effect promptly).
async fn sweep_idle_streams(shared: Arc<state::Shared>, cancel: CancellationToken) {
    loop {
        let idle = [ChannelId::Cpm, ChannelId::Csm].map(|c| shared.faults(c).stream_idle());
        let every = (idle[0].min(idle[1]) / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for lane in shared.lanes() {
            lane.expire_idle(idle[state::slot(lane.channel)]);
        }
    }
}

impl RunningSim {
    /// The listener of a channel.
    pub fn addr(&self, channel: ChannelId) -> SocketAddr {
        match channel {
            ChannelId::Cpm => self.primary,
            ChannelId::Csm => self.secondary,
        }
    }

    /// `{"primary":"127.0.0.1:P","secondary":"127.0.0.1:S","control":"127.0.0.1:C","dict":"127.0.0.1:D"}`
    pub fn addresses_json(&self) -> String {
        format!(
            r#"{{"primary":"{}","secondary":"{}","control":"{}","dict":"{}"}}"#,
            self.primary, self.secondary, self.control, self.dict
        )
    }

    /// Stops accepting, drops every connection, ends every request being handled and waits for
    /// all of them.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        self.requests.close();
        self.requests.wait().await;
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
