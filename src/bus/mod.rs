//! NATS JetStream: the connection (retrying in the background, so a NATS that
//! is down makes cabine not-ready rather than dead; over rustls with a `tls://`
//! URL, `nats.ca_file` and an optional client certificate) and the streams
//! `cabine migrate` creates.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::config::{ConfigError, Ispb, NatsSettings};
use crate::store_tls::StoreTlsError;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("nats connect: {0}")]
    Connect(#[from] async_nats::ConnectError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] StoreTlsError),
    #[error("jetstream stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
}

/// Subjects of one deployment (one ISPB), derived from `nats.subject_prefix`.
#[derive(Clone, Debug)]
pub struct Subjects {
    prefix: String,
    ispb: String,
}

impl Subjects {
    pub fn new(settings: &NatsSettings, ispb: &Ispb) -> Self {
        Subjects { prefix: settings.subject_prefix.clone(), ispb: ispb.to_string() }
    }

    /// `{prefix}.in.{ispb}.{msg type}`: one inbound message.
    pub fn inbound(&self, msg_type: &str) -> String {
        format!("{}.in.{}.{}", self.prefix, self.ispb, msg_type)
    }

    /// Everything inbound for this ISPB.
    pub fn inbound_all(&self) -> String {
        format!("{}.in.{}.>", self.prefix, self.ispb)
    }

    /// `{prefix}.out.{ispb}.{channel}`: outbound requests from the bank's core.
    pub fn outbound(&self, channel: &str) -> String {
        format!("{}.out.{}.{}", self.prefix, self.ispb, channel)
    }

    /// `{prefix}.hint.{ispb}.out`: "rows stored on this channel", between pods (core NATS, no stream).
    pub fn work_hints(&self) -> String {
        format!("{}.hint.{}.out", self.prefix, self.ispb)
    }

    /// `{prefix}.out.result.{ispb}`: outbound state changes back to the core.
    pub fn results(&self) -> String {
        format!("{}.out.result.{}", self.prefix, self.ispb)
    }
}

/// Connects in the background; the client reconnects forever with its own backoff.
pub async fn connect(settings: &NatsSettings) -> Result<async_nats::Client, BusError> {
    let opts = options(settings)?
        .retry_on_initial_connect()
        .reconnect_delay_callback(|attempt| Duration::from_millis((100u64 << attempt.min(5)).min(2_000)));
    Ok(opts.connect(&settings.url).await?)
}

/// Connects now or fails, naming why (`cabine migrate`, tests): a refused certificate is a `Tls` connect error.
pub async fn connect_now(settings: &NatsSettings) -> Result<async_nats::Client, BusError> {
    Ok(options(settings)?.connect(&settings.url).await?)
}

/// Name, timeouts, token and TLS: what every connection of cabine shares.
pub fn options(settings: &NatsSettings) -> Result<async_nats::ConnectOptions, BusError> {
    let mut opts = async_nats::ConnectOptions::new()
        .name("cabine")
        .connection_timeout(settings.connect_timeout)
        .request_timeout(Some(settings.request_timeout));
    if let Some(token) = &settings.token {
        opts = opts.token(token.expose().to_owned());
    }
    if let Some(tls) = settings.tls()? {
        opts = opts.tls_client_config(tls.client_config()?).require_tls(true);
    }
    Ok(opts)
}

/// The streams a pod of `settings` uses: the inbound one, and with
/// `outbound.enabled` the outbound work queue and the results stream.
pub fn stream_names(settings: &crate::config::Settings) -> Vec<String> {
    let n = &settings.nats;
    let mut names = vec![n.inbound_stream.clone()];
    if settings.outbound.enabled {
        names.extend([n.outbound_stream.clone(), n.results_stream.clone()]);
    }
    names
}

/// Creates (or updates) the JetStream streams of this deployment. Idempotent.
pub async fn ensure_streams(
    client: &async_nats::Client,
    settings: &NatsSettings,
    subjects: &Subjects,
    channels: &[&str],
) -> Result<(), BusError> {
    let js = jetstream::new(client.clone());
    let specs = [
        stream::Config {
            name: settings.inbound_stream.clone(),
            subjects: vec![subjects.inbound_all()],
            duplicate_window: settings.duplicate_window,
            storage: stream::StorageType::File,
            ..Default::default()
        },
        stream::Config {
            name: settings.outbound_stream.clone(),
            subjects: channels.iter().map(|c| subjects.outbound(c)).collect(),
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: settings.duplicate_window,
            storage: stream::StorageType::File,
            ..Default::default()
        },
        stream::Config {
            name: settings.results_stream.clone(),
            subjects: vec![subjects.results()],
            duplicate_window: settings.duplicate_window,
            storage: stream::StorageType::File,
            ..Default::default()
        },
    ];
    for spec in specs {
        let name = spec.name.clone();
        js.create_or_update_stream(spec).await.map_err(|e| BusError::Stream { stream: name, reason: e.to_string() })?;
    }
    Ok(())
}
