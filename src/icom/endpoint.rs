//! Where and how one channel's ICOM is reached: base URL, ISPB, TLS material
//! (read once), limits and timeouts. [`IcomChannels`] is the `IcomConnector`
//! the slots get: every call opens a fresh client that owns its connection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use reqwest::Url;

use cabine_actors::domain::{ChannelId, Ispb};
use cabine_actors::ports::{CloseOutcome, IcomConnector, IcomStream, PollOutcome};

use super::client::IcomClient;
use super::headers;
use super::limits::WireLimits;
use super::tls::{self, PemFiles, TlsError};
use crate::config::Settings;

/// A channel that cannot be reached as configured: fatal, fix the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("icom.channels.{channel}.base_url: {reason}")]
    BaseUrl { channel: ChannelId, reason: String },
    #[error("icom.channels.{channel}: {source}")]
    Tls { channel: ChannelId, source: TlsError },
    #[error("icom.channels.{0}: not configured or not enabled")]
    UnknownChannel(ChannelId),
    #[error("icom.channels.{channel}: cannot build the HTTP client: {reason}")]
    Build { channel: ChannelId, reason: String },
}

/// The plain facts of one endpoint.
#[derive(Clone, Debug)]
pub struct EndpointSettings {
    pub channel: ChannelId,
    pub ispb: Ispb,
    /// `https://icom.pi.rsfn.net.br:16422`, or `http://…` for a local simulator.
    pub base_url: String,
    pub limits: WireLimits,
    /// Bound of start / next / close (a long poll is held ~5 s by the server).
    pub long_poll_timeout: Duration,
    /// Bound of a send.
    pub send_timeout: Duration,
    /// Send `Host` without the port even when the URL has one (the Central Bank's rule,
    /// `icom.host_without_port`); false sends `host:port` as HTTP normally does.
    pub host_without_port: bool,
}

/// One channel's ICOM, ready to open connections.
#[derive(Debug)]
pub struct IcomEndpoint {
    pub(super) settings: EndpointSettings,
    pub(super) base: Url,
    pub(super) host: HeaderValue,
    pub(super) user_agent: HeaderValue,
    tls: rustls::ClientConfig,
}

impl IcomEndpoint {
    /// An endpoint with an explicit TLS config (tests hand in their own).
    pub fn new(settings: EndpointSettings, tls: rustls::ClientConfig) -> Result<IcomEndpoint, ClientError> {
        let channel = settings.channel;
        let bad = |reason: String| ClientError::BaseUrl { channel, reason };
        let base = Url::parse(&settings.base_url).map_err(|e| bad(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.query().is_some() || base.fragment().is_some() {
            return Err(bad("must be http(s)://host[:port][/path]".into()));
        }
        let host = headers::host_header(&base, settings.host_without_port).ok_or_else(|| bad("no host".into()))?;
        let user_agent = HeaderValue::from_str(&headers::user_agent())
            .map_err(|e| ClientError::Build { channel, reason: e.to_string() })?;
        Ok(IcomEndpoint { settings, base, host, user_agent, tls })
    }

    /// The endpoint of `channel` as configured: mTLS files for https, none for http.
    pub fn from_settings(settings: &Settings, channel: ChannelId) -> Result<IcomEndpoint, ClientError> {
        let ch = settings.icom.channels.get(&channel).ok_or(ClientError::UnknownChannel(channel))?;
        let tls = if ch.base_url.starts_with("https://") {
            tls::mtls_config(PemFiles { ca: &ch.ca_file, cert: &ch.cert_file, key: &ch.key_file })
        } else {
            tls::plain_config()
        }
        .map_err(|source| ClientError::Tls { channel, source })?;
        let endpoint = EndpointSettings {
            channel,
            ispb: settings.cluster.ispb.clone(),
            base_url: ch.base_url.clone(),
            limits: WireLimits::from(&settings.icom.limits),
            long_poll_timeout: settings.timing.long_poll_timeout,
            send_timeout: settings.timing.send_timeout,
            host_without_port: settings.icom.host_without_port,
        };
        IcomEndpoint::new(endpoint, tls)
    }

    pub fn settings(&self) -> &EndpointSettings {
        &self.settings
    }

    /// A fresh client: its own pool of at most one idle connection, never shared.
    pub fn connect(self: &Arc<Self>) -> Result<IcomClient, ClientError> {
        let channel = self.settings.channel;
        let mut defaults = http::HeaderMap::new();
        defaults.insert(http::header::ACCEPT, HeaderValue::from_static("multipart/mixed"));
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(self.tls.clone())
            .http1_only()
            .pool_max_idle_per_host(1)
            .retry(reqwest::retry::never())
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .no_proxy()
            .default_headers(defaults)
            .tcp_nodelay(true)
            .connect_timeout(self.settings.long_poll_timeout.min(self.settings.send_timeout))
            .build()
            .map_err(|e| ClientError::Build { channel, reason: e.to_string() })?;
        Ok(IcomClient::new(Arc::clone(self), http))
    }

    /// `{base}/api/v1/out/{ispb}/stream/start`.
    pub(super) fn start_url(&self) -> Url {
        self.under_base(&format!("api/v1/out/{}/stream/start", self.settings.ispb))
    }

    /// `{base}/api/v1/in/{ispb}/msgs`.
    pub(super) fn send_url(&self) -> Url {
        self.under_base(&format!("api/v1/in/{}/msgs", self.settings.ispb))
    }

    fn under_base(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        let joined = format!("{}/{path}", url.path().trim_end_matches('/'));
        url.set_path(&joined);
        url
    }

    /// A pull-next path from the server, on our own origin only.
    pub(super) fn pull_next_url(&self, pull_next: &str) -> Result<Url, String> {
        if pull_next.len() > self.settings.limits.max_header_bytes {
            return Err(format!("pull-next longer than {} bytes", self.settings.limits.max_header_bytes));
        }
        let url = self.base.join(pull_next).map_err(|e| format!("bad pull-next {pull_next:?}: {e}"))?;
        if url.origin() != self.base.origin() {
            return Err(format!("pull-next {pull_next:?} leaves {}", self.base.origin().ascii_serialization()));
        }
        Ok(url)
    }
}

/// The [`IcomConnector`] of the enabled channels.
#[derive(Clone, Debug)]
pub struct IcomChannels {
    endpoints: BTreeMap<ChannelId, Arc<IcomEndpoint>>,
}

impl IcomChannels {
    /// Reads every enabled channel's TLS material once.
    pub fn from_settings(settings: &Settings) -> Result<IcomChannels, ClientError> {
        super::client::describe_metrics();
        let endpoints = settings
            .enabled_channels()
            .map(|(id, _)| Ok((id, Arc::new(IcomEndpoint::from_settings(settings, id)?))))
            .collect::<Result<_, ClientError>>()?;
        Ok(IcomChannels { endpoints })
    }

    pub fn from_endpoints(endpoints: impl IntoIterator<Item = IcomEndpoint>) -> IcomChannels {
        IcomChannels { endpoints: endpoints.into_iter().map(|e| (e.settings.channel, Arc::new(e))).collect() }
    }

    /// A client for `channel` (for sends and for stream slots alike).
    pub fn client(&self, channel: ChannelId) -> Result<IcomClient, ClientError> {
        self.endpoints.get(&channel).ok_or(ClientError::UnknownChannel(channel))?.connect()
    }
}

impl IcomConnector for IcomChannels {
    fn stream(&self, channel: ChannelId) -> Box<dyn IcomStream> {
        match self.client(channel) {
            Ok(client) => Box::new(client),
            Err(e) => Box::new(Unreachable(e.to_string())),
        }
    }
}

/// The stream of a channel whose client could not be built: every request
/// fails as `Transport`, with the reason, so the slot backs off and reports it.
struct Unreachable(String);

#[async_trait::async_trait]
impl IcomStream for Unreachable {
    async fn start(&mut self) -> PollOutcome {
        PollOutcome::Transport(self.0.clone())
    }
    async fn next(&mut self, _pull_next: &str) -> PollOutcome {
        PollOutcome::Transport(self.0.clone())
    }
    async fn close(&mut self, _pull_next: &str) -> CloseOutcome {
        CloseOutcome::Failed(self.0.clone())
    }
}
