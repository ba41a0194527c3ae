//! `cabine outbound …`, `cabine breaker reset` and `cabine reconcile …`: the
//! operator endpoints of a running pod, called over HTTP. The pod is `--pod URL`
//! (default: `http.operator_bind`, else `http.bind`), the bearer token `--token` (default:
//! `http.admin_token`). The JSON answer goes to stdout and the exit code is 0
//! on a 2xx; otherwise the answer goes to stderr and the exit code is 1.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reqwest::{Method, RequestBuilder, Url};

use crate::config::Settings;
use crate::outbound::ingress::{DEADLINE_CLASS_HEADER, DEADLINE_HEADER, PRIORITY_HEADER};

/// Which pod to ask, and with which token.
#[derive(Debug, Clone, Args)]
pub struct PodArgs {
    /// Base URL of a pod's status server, e.g. `http://10.0.0.7:8080` (default: from `http.operator_bind`, else `http.bind`).
    #[arg(long, global = true)]
    pub pod: Option<String>,
    /// Bearer token of the changing endpoints (default: `http.admin_token`).
    #[arg(long, global = true)]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct OutboundArgs {
    #[command(flatten)]
    pub pod: PodArgs,
    #[command(subcommand)]
    pub command: OutboundCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum OutboundCommand {
    /// State and history of one message (`GET /v1/outbound/{msg_id}`).
    Get { msg_id: String },
    /// A page of the messages of one status, oldest first (`GET /v1/outbound?status=…`).
    List {
        /// queued, sending, sent, confirmed, rejected, rejected_by_spi, rejected_invalid, timeout, dead.
        #[arg(long)]
        status: String,
        /// Continue after this row id (the `next` of the previous page).
        #[arg(long)]
        after: Option<i64>,
        /// Rows per page, 1..=500 (100).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Queue a dead or rejected message again (`POST /v1/outbound/{msg_id}/reprocess`).
    Reprocess { msg_id: String },
    /// Requests parked past `outbound.max_deliver`, oldest first (`GET /v1/parked`); with a
    /// reference, that one with its body (`GET /v1/parked/{ingress_ref}`).
    Parked {
        /// The ingress reference (`{stream}:{sequence}:{published ns}`) of one parked request.
        ingress_ref: Option<String>,
        /// Continue after this row id (the `next` of the previous page).
        #[arg(long)]
        after: Option<i64>,
        /// Rows per page, 1..=500 (100).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Parse a parked request again and store it like a fresh one (`POST /v1/parked/{ingress_ref}/reprocess`).
    Unpark { ingress_ref: String },
    /// Send one ISO 20022 message: checked by the pod, then published on the outbound bus (`POST /v1/outbound`).
    Send {
        #[arg(long, default_value = "cpm")]
        channel: String,
        /// critical, high, normal (default), low.
        #[arg(long)]
        priority: Option<String>,
        /// Deadline class: standard (default) or saque_troco.
        #[arg(long, conflicts_with = "deadline")]
        class: Option<String>,
        /// Deadline as an RFC 3339 instant.
        #[arg(long)]
        deadline: Option<String>,
        /// The XML message.
        file: PathBuf,
    },
}

#[derive(Debug, Clone, Args)]
pub struct BreakerArgs {
    #[command(flatten)]
    pub pod: PodArgs,
    #[command(subcommand)]
    pub command: BreakerCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BreakerCommand {
    /// Close the breaker every pod shares for a channel (`POST /v1/breakers/{ispb}/{channel}/reset`).
    Reset {
        #[arg(long)]
        channel: String,
        /// Default: `cluster.ispb`.
        #[arg(long)]
        ispb: Option<String>,
    },
}

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub pod: PodArgs,
    /// Reconcile the window from this instant (RFC 3339) now (`POST /v1/reconciliations`).
    #[arg(long, requires = "to")]
    pub from: Option<String>,
    /// ...to this one (at least `reconcile.settle_margin` ago).
    #[arg(long, requires = "from")]
    pub to: Option<String>,
    #[command(subcommand)]
    pub command: Option<ReconcileCommand>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ReconcileCommand {
    /// Runs whose window overlaps `[from, to)`, newest first (`GET /v1/reconciliations`; default the last 24 h).
    List {
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
    },
    /// One run and its discrepancies with their evidence (`GET /v1/reconciliations/{id}`).
    Show { id: i64 },
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub pod: PodArgs,
    #[command(subcommand)]
    pub command: ReportCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ReportCommand {
    /// What a window's faults touched (`GET /v1/incidents/report`), as Markdown (`--json` for JSON).
    Incident {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        /// Received → published delay past which an inbound message counts as delayed (default 5s).
        #[arg(long)]
        lag: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Per channel and stage p50 / p95 / p99 / max (`GET /v1/reports/timings`): `md` (default) or `json`;
    /// `csv`: every message's stage timestamps, streamed.
    Timings {
        #[arg(long)]
        from: String,
        /// Default: now.
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value = "md", value_parser = ["md", "json", "csv"])]
        format: String,
    },
}

/// One pod's status server.
pub struct PodClient {
    base: Url,
    token: String,
    http: reqwest::Client,
}

impl PodClient {
    pub fn new(args: &PodArgs, settings: &Settings) -> anyhow::Result<PodClient> {
        let base = args.pod.clone().unwrap_or_else(|| default_pod(settings.http.operator_addr()));
        let base = Url::parse(&base).with_context(|| format!("--pod {base:?} is not a URL"))?;
        if base.cannot_be_a_base() {
            bail!("--pod {base} cannot be a base URL");
        }
        let token = args.token.clone().unwrap_or_else(|| settings.http.admin_token.expose().to_owned());
        crate::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().context("an HTTP client")?;
        Ok(PodClient { base, token, http })
    }

    /// `{base}/{segments…}`, each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("checked in new").pop_if_empty().extend(segments);
        url
    }

    fn request(&self, method: Method, url: Url) -> RequestBuilder {
        self.http.request(method, url).bearer_auth(&self.token)
    }

    /// The pod's base URL, as given.
    pub fn base(&self) -> &str {
        self.base.as_str()
    }

    /// `GET {base}/{segments…}` answered 2xx with JSON.
    pub async fn get_json(&self, segments: &[&str]) -> anyhow::Result<serde_json::Value> {
        let response = self.request(Method::GET, self.url(segments)).send().await.context("asking the pod")?;
        let status = response.status();
        anyhow::ensure!(status.is_success(), "HTTP {status}");
        response.json().await.context("reading the pod's JSON answer")
    }
}

/// `http://{bind}`, a wildcard bind asked on loopback.
pub(crate) fn default_pod(bind: SocketAddr) -> String {
    let ip = match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, bind.port()))
}

pub async fn outbound(args: OutboundArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pod = PodClient::new(&args.pod, settings)?;
    let request = match args.command {
        OutboundCommand::Get { msg_id } => pod.request(Method::GET, pod.url(&["v1", "outbound", &msg_id])),
        OutboundCommand::List { status, after, limit } => {
            let mut url = pod.url(&["v1", "outbound"]);
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("status", &status);
                after.map(|a| q.append_pair("after", &a.to_string()));
                limit.map(|l| q.append_pair("limit", &l.to_string()));
            }
            pod.request(Method::GET, url)
        }
        OutboundCommand::Reprocess { msg_id } => {
            pod.request(Method::POST, pod.url(&["v1", "outbound", &msg_id, "reprocess"]))
        }
        OutboundCommand::Parked { ingress_ref: Some(r), .. } => {
            pod.request(Method::GET, pod.url(&["v1", "parked", &r]))
        }
        OutboundCommand::Parked { ingress_ref: None, after, limit } => {
            let mut url = pod.url(&["v1", "parked"]);
            {
                let mut q = url.query_pairs_mut();
                after.map(|a| q.append_pair("after", &a.to_string()));
                limit.map(|l| q.append_pair("limit", &l.to_string()));
            }
            pod.request(Method::GET, url)
        }
        OutboundCommand::Unpark { ingress_ref } => {
            pod.request(Method::POST, pod.url(&["v1", "parked", &ingress_ref, "reprocess"]))
        }
        OutboundCommand::Send { channel, priority, class, deadline, file } => {
            let body = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let mut url = pod.url(&["v1", "outbound"]);
            url.query_pairs_mut().append_pair("channel", &channel);
            let mut request = pod.request(Method::POST, url).header("content-type", "application/xml").body(body);
            for (name, value) in
                [(PRIORITY_HEADER, priority), (DEADLINE_CLASS_HEADER, class), (DEADLINE_HEADER, deadline)]
            {
                if let Some(v) = value {
                    request = request.header(name, v);
                }
            }
            request
        }
    };
    report(request).await
}

/// `cabine dict get KEY --payer-id ID [--end-to-end-id E2E]`: one DICT lookup through a pod.
#[derive(Debug, Clone, Args)]
pub struct DictArgs {
    #[command(flatten)]
    pub pod: PodArgs,
    #[command(subcommand)]
    pub command: DictCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DictCommand {
    /// Looks KEY up (`GET /v1/dict/entries/{key}`): the entry, its source (dict, cache, stale_cache) and age.
    Get {
        key: String,
        /// The payer's CPF (11 digits) or CNPJ (14 digits): `PI-PayerId`.
        #[arg(long)]
        payer_id: String,
        /// The payment's EndToEndId (`PI-EndToEndId`); default: one made up for this lookup.
        #[arg(long)]
        end_to_end_id: Option<String>,
    },
}

pub async fn dict(args: DictArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pod = PodClient::new(&args.pod, settings)?;
    let DictCommand::Get { key, payer_id, end_to_end_id } = args.command;
    let e2e =
        end_to_end_id.unwrap_or_else(|| format!("E{}{:024x}", settings.cluster.ispb, rand::random::<u128>() >> 32));
    let mut url = pod.url(&["v1", "dict", "entries", &key]);
    url.query_pairs_mut().append_pair("payer_id", &payer_id).append_pair("end_to_end_id", &e2e[..e2e.len().min(32)]);
    report(pod.request(Method::GET, url)).await
}

pub async fn breaker(args: BreakerArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pod = PodClient::new(&args.pod, settings)?;
    let BreakerCommand::Reset { channel, ispb } = args.command;
    let ispb = ispb.unwrap_or_else(|| settings.cluster.ispb.to_string());
    report(pod.request(Method::POST, pod.url(&["v1", "breakers", &ispb, &channel, "reset"]))).await
}

pub async fn reconcile(args: ReconcileArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pod = PodClient::new(&args.pod, settings)?;
    let window = |method: Method, from: Option<String>, to: Option<String>| {
        let mut url = pod.url(&["v1", "reconciliations"]);
        {
            let mut q = url.query_pairs_mut();
            from.map(|f| q.append_pair("from", &f));
            to.map(|t| q.append_pair("to", &t));
        }
        pod.request(method, url)
    };
    let request = match args.command {
        Some(ReconcileCommand::Show { id }) => {
            pod.request(Method::GET, pod.url(&["v1", "reconciliations", &id.to_string()]))
        }
        Some(ReconcileCommand::List { from, to }) => window(Method::GET, from, to),
        None if args.from.is_some() => window(Method::POST, args.from, args.to),
        None => bail!("cabine reconcile --from T --to T (run one now), or: list, show ID"),
    };
    report(request).await
}

pub async fn report_command(args: ReportArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pod = PodClient::new(&args.pod, settings)?;
    match args.command {
        ReportCommand::Incident { from, to, lag, json } => {
            let mut url = pod.url(&["v1", "incidents", "report"]);
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("from", &from).append_pair("to", &to);
                lag.map(|l| q.append_pair("lag", &l));
                q.append_pair("format", if json { "json" } else { "markdown" });
            }
            report(pod.request(Method::GET, url)).await
        }
        ReportCommand::Timings { from, to, format } => {
            let mut url = pod.url(&["v1", "reports", "timings"]);
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("from", &from);
                to.map(|t| q.append_pair("to", &t));
                q.append_pair("format", &format);
            }
            if format == "csv" {
                stream_out(pod.request(Method::GET, url)).await
            } else {
                report(pod.request(Method::GET, url)).await
            }
        }
    }
}

/// Copies a 2xx answer to stdout as it arrives (a CSV of a whole window); else as [`report`].
async fn stream_out(request: RequestBuilder) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut response = request.send().await.context("asking the pod")?;
    if !response.status().is_success() {
        let status = response.status();
        eprintln!("HTTP {status}: {}", response.text().await.unwrap_or_default());
        return Ok(ExitCode::FAILURE);
    }
    let mut out = std::io::stdout().lock();
    let mut tail = Vec::new();
    while let Some(chunk) = response.chunk().await.context("reading the pod's answer")? {
        out.write_all(&chunk)?;
        tail = [&tail[tail.len().saturating_sub(512)..], &chunk[..]].concat();
    }
    out.flush()?;
    // A page that failed after the answer started ends the body with `# error: …`.
    let tail = String::from_utf8_lossy(&tail);
    match tail.rfind("# error:") {
        Some(at) => {
            eprintln!("{}", tail[at..].trim_end());
            Ok(ExitCode::FAILURE)
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Sends the request; prints the answer on stdout (2xx, exit 0) or stderr (exit 1).
async fn report(request: RequestBuilder) -> anyhow::Result<ExitCode> {
    let response = request.send().await.context("asking the pod")?;
    let status = response.status();
    let text = response.text().await.context("reading the pod's answer")?;
    let shown = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text);
    if status.is_success() {
        println!("{shown}");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("HTTP {status}: {shown}");
        Ok(ExitCode::FAILURE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_bind_is_asked_on_loopback() {
        assert_eq!(default_pod("0.0.0.0:8080".parse().unwrap()), "http://127.0.0.1:8080");
        assert_eq!(default_pod("[::]:9000".parse().unwrap()), "http://[::1]:9000");
        assert_eq!(default_pod("10.1.2.3:8081".parse().unwrap()), "http://10.1.2.3:8081");
    }
}
