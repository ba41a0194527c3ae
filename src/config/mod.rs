//! Typed configuration: `config/default.toml` (compiled in) + optional
//! `config/{CABINE_ENV}.toml` + `CABINE__SECTION__KEY` environment overrides,
//! deserialized into [`Settings`] and checked against the boot invariants.
//!
//! Loading is a pure function of (file texts, environment map) — [`Settings::from_sources`] —
//! so tests pass a map instead of touching the process environment.

mod access;
mod dict;
mod invariants;
mod mask;
mod outbound;
mod reconcile;
mod secret;
mod tls;
mod tree;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use access::{DEFAULT_ADMIN_TOKEN, MIN_TOKEN_LEN};
pub use cabine_actors::domain::{ChannelId, Ispb, PoolSize};
pub use dict::DictSettings;
pub use invariants::check_boot_invariants;
pub use mask::mask_credentials;
pub use outbound::{
    BreakerSettings, BucketChannelSettings, BucketSettings, DeadlineSettings, OutboundSettings, minutes_of_day,
};
pub use reconcile::ReconcileSettings;
pub use secret::Secret;
pub use tls::SslMode;
pub use tree::{PollModeName, PollingSettings, RestartSettings};
pub use watch::{FailoverSettings, WatchdogSettings};

/// The defaults, compiled in so the binary runs from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// A configuration that cannot be used. Every variant names the key(s) at fault;
/// the binary turns any of them into exit code 64.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key's value is malformed or violates a rule (one key or several, comma-separated).
    #[error("config: {key}: {rule}")]
    Invalid { key: String, rule: String },
    /// A configuration file could not be read or parsed.
    #[error("config: {file}: {reason}")]
    Source { file: String, reason: String },
}

impl ConfigError {
    pub(crate) fn invalid(key: impl Into<String>, rule: impl Into<String>) -> Self {
        ConfigError::Invalid { key: key.into(), rule: rule.into() }
    }
}

/// Everything cabine is told at start. Read-only after load.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub cluster: ClusterSettings,
    pub log: LogSettings,
    pub http: HttpSettings,
    pub redis: RedisSettings,
    pub postgres: PostgresSettings,
    pub nats: NatsSettings,
    pub icom: IcomSettings,
    pub pools: PoolSettings,
    pub timing: TimingSettings,
    pub polling: PollingSettings,
    pub restart: RestartSettings,
    pub outbound: OutboundSettings,
    pub failover: FailoverSettings,
    pub watchdog: WatchdogSettings,
    pub reconcile: ReconcileSettings,
    pub dict: DictSettings,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// Redis key segment shared by all pods of one deployment.
    pub name: String,
    pub ispb: Ispb,
    /// Empty means "derive from hostname and pid" (see [`Settings::pod_id`]).
    pub pod_id: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub filter: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Health, readiness and `/metrics` — and the operator endpoints too unless `operator_bind` is set.
    pub bind: SocketAddr,
    /// Bearer token of the endpoints that change things (send, reprocess, breaker reset, actor
    /// restart); it also reads. Off loopback it must be set, not the default (exit 64).
    pub admin_token: Secret,
    /// Bearer token of the endpoints that read payment data (`GET /v1/outbound…`). Empty: those
    /// reads are open, which only a loopback operator listener allows (exit 64 otherwise).
    #[serde(default)]
    pub read_token: Secret,
    /// The operator endpoints' own listener (`/actors`, `/cluster`, `/v1/…`), apart from health
    /// and metrics on `bind`; unset: everything on `bind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_bind: Option<SocketAddr>,
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    #[serde(default)]
    pub password: Option<Secret>,
    pub prefix: String,
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub reconnect_max_delay: Duration,
    pub max_command_queue: usize,
    /// PEM CA the server's certificate must chain to; required with `rediss://`, refused without.
    #[serde(default)]
    pub ca_file: PathBuf,
    /// Client certificate and key (PEM) for a server with `tls-auth-clients yes`; the key is never printed.
    #[serde(default)]
    pub cert_file: PathBuf,
    #[serde(default)]
    pub key_file: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSettings {
    pub url: String,
    #[serde(default)]
    pub password: Option<Secret>,
    /// Every table lives in this schema (tests use one each).
    pub schema: String,
    pub pool_size: usize,
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub create_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub recycle_timeout: Duration,
    /// Bound on one statement (inbox, send gates, outbound store and outbox, a confirmation pass),
    /// pool wait included; beyond it the statement is cancelled on the server and the outcome is `Unavailable`.
    #[serde(with = "humantime_serde")]
    pub query_timeout: Duration,
    pub migrate_on_start: bool,
    /// TLS to the server (`disable`, `require`, `verify-ca`, `verify-full`); never in the URL.
    #[serde(default)]
    pub sslmode: SslMode,
    /// PEM CA the server's certificate must chain to; required by `verify-ca` / `verify-full`.
    #[serde(default)]
    pub ca_file: PathBuf,
    /// Client certificate and key (PEM) for `clientcert` authentication; the key is never printed.
    #[serde(default)]
    pub cert_file: PathBuf,
    #[serde(default)]
    pub key_file: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSettings {
    pub url: String,
    #[serde(default)]
    pub token: Option<Secret>,
    /// First token of every subject (`{prefix}.in.{ispb}.{type}`, ...).
    pub subject_prefix: String,
    pub inbound_stream: String,
    pub outbound_stream: String,
    pub results_stream: String,
    #[serde(with = "humantime_serde")]
    pub duplicate_window: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Committed rows waiting for the publisher; a full queue makes slots wait (back-pressure).
    pub publish_queue: usize,
    /// Rows published concurrently per round (all sent, then all PubAcks awaited) and per sweep page.
    pub publish_batch: usize,
    /// How often the oldest-unpublished gauge is refreshed from Postgres.
    #[serde(with = "humantime_serde")]
    pub lag_probe_interval: Duration,
    /// PEM CA the server's certificate must chain to; required with `tls://`, refused without.
    #[serde(default)]
    pub ca_file: PathBuf,
    /// Client certificate and key (PEM) for a server whose `tls { verify: true }`; the key is never printed.
    #[serde(default)]
    pub cert_file: PathBuf,
    #[serde(default)]
    pub key_file: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcomSettings {
    /// The longest the Central Bank holds an empty GET before its 204 (DESIGN §1: ~5 s).
    /// A request we abandon lives on at the server that long: `timing.long_poll_timeout`
    /// must exceed it, so the gate's busy window covers it.
    #[serde(with = "humantime_serde")]
    pub server_hold: Duration,
    pub max_in_flight: PoolSize,
    pub sends_counted_separately: bool,
    pub host_without_port: bool,
    pub limits: WireLimitSettings,
    pub channels: BTreeMap<ChannelId, ChannelSettings>,
}

/// Limits on what ICOM may send us, enforced before allocation.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireLimitSettings {
    pub max_parts: usize,
    pub max_body_bytes: usize,
    pub max_header_bytes: usize,
    pub max_boundary_len: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelSettings {
    pub enabled: bool,
    pub base_url: String,
    /// PEM files for mTLS; required when `base_url` is https.
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    /// The private key's path; its content is never printed or logged.
    pub key_file: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    pub stream: PoolSize,
    pub send: PoolSize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingSettings {
    /// How long a granted slot is ours (DESIGN §3); renewed every `heartbeat`.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// LeaseHeartbeat period: renews every lease of the pod, beats, reads the live pods.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Clock drift allowed between this pod and Redis: a lease is used until `t0 + lease − drift_margin`.
    #[serde(with = "humantime_serde")]
    pub drift_margin: Duration,
    /// Redis keeps a slot `lease + lock_delay`: a vanished holder's slot frees only after every request it could have started has ended.
    #[serde(with = "humantime_serde")]
    pub lock_delay: Duration,
    /// The longest a GET (the server holds ~5 s) or a stream start may take.
    #[serde(with = "humantime_serde")]
    pub long_poll_timeout: Duration,
    /// The longest a POST may take.
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// Errors back off exponentially with full jitter from `backoff_base`...
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// ...up to `backoff_max`.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Time a stopping pod gives its slots and senders to hand over.
    #[serde(with = "humantime_serde")]
    pub drain_time: Duration,
    /// The whole stop budget after SIGTERM (drain included); then the process exits.
    #[serde(with = "humantime_serde")]
    pub stop_timeout: Duration,
    /// Inbox rows unpublished for longer than this are published again (JetStream dedups).
    #[serde(with = "humantime_serde")]
    pub republish_after: Duration,
    /// An outbound row claimed (`sending`) for longer than this returns to the queue.
    #[serde(with = "humantime_serde")]
    pub processing_timeout: Duration,
    /// An outbound row is `dead` after this many failed sends.
    pub poison_attempts: u32,
    /// A stream request starts only while the lease is valid for `long_poll_timeout + request_margin`.
    #[serde(with = "humantime_serde")]
    pub request_margin: Duration,
    /// The durable gate (DESIGN §2.5): a request leaves within this of the fenced
    /// write of `busy_until` that armed it, else the write is made again; each write
    /// keeps the slot busy for the request's timeout + this (Postgres's clock).
    #[serde(with = "humantime_serde")]
    pub gate_margin: Duration,
    /// How often a standby slot (and the leader campaign) tries to acquire.
    #[serde(with = "humantime_serde")]
    pub acquire_interval: Duration,
    /// Long-poll mode: least time between two polls after an immediate 204.
    #[serde(with = "humantime_serde")]
    pub empty_poll_floor: Duration,
    /// Period of the leader's republish sweep.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
}

impl HttpSettings {
    /// Where the operator endpoints listen: `operator_bind`, else `bind`.
    pub fn operator_addr(&self) -> SocketAddr {
        self.operator_bind.unwrap_or(self.bind)
    }
}

impl TimingSettings {
    /// The longest any single ICOM request may take.
    pub fn longest_request(&self) -> Duration {
        self.long_poll_timeout.max(self.send_timeout)
    }
}

impl Settings {
    /// Loads from the process: compiled-in defaults, `{dir}/{CABINE_ENV}.toml`, the environment.
    pub fn load(dir: &Path) -> Result<Settings, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Settings::load_with(dir, &env)
    }

    /// Like [`Settings::load`] with an explicit environment map.
    pub fn load_with(dir: &Path, env: &HashMap<String, String>) -> Result<Settings, ConfigError> {
        let overlay = match env.get("CABINE_ENV").filter(|e| !e.is_empty()) {
            None => None,
            Some(name) => {
                let path = dir.join(format!("{name}.toml"));
                let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Source {
                    file: path.display().to_string(),
                    reason: format!("CABINE_ENV={name} names this file: {e}"),
                })?;
                Some((path.display().to_string(), text))
            }
        };
        let overlay = overlay.as_ref().map(|(f, t)| (f.as_str(), t.as_str()));
        Settings::from_sources(DEFAULT_TOML, overlay, env)
    }

    /// The pure loader: defaults text, optional (file name, text) overlay, environment map.
    pub fn from_sources(
        defaults: &str,
        overlay: Option<(&str, &str)>,
        env: &HashMap<String, String>,
    ) -> Result<Settings, ConfigError> {
        let mut builder =
            config::Config::builder().add_source(config::File::from_str(defaults, config::FileFormat::Toml));
        if let Some((_, text)) = overlay {
            builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
        }
        let env_source = config::Environment::with_prefix("CABINE")
            .prefix_separator("__")
            .separator("__")
            .source(Some(env.clone().into_iter().collect()));
        let merged = builder.add_source(env_source).build().map_err(|e| ConfigError::Source {
            file: overlay.map_or("config/default.toml", |(f, _)| f).to_owned(),
            reason: e.to_string(),
        })?;
        let settings: Settings = serde_path_to_error::deserialize(merged)
            .map_err(|e| ConfigError::invalid(e.path().to_string(), e.inner().to_string()))?;
        check_boot_invariants(&settings)?;
        Ok(settings)
    }

    /// This pod's id: the configured one, else `{hostname}-{pid}`.
    pub fn pod_id(&self) -> String {
        if !self.cluster.pod_id.is_empty() {
            return self.cluster.pod_id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "pod".to_owned());
        format!("{host}-{}", std::process::id())
    }

    /// The channels this pod serves, in a stable order.
    pub fn enabled_channels(&self) -> impl Iterator<Item = (ChannelId, &ChannelSettings)> {
        self.icom.channels.iter().filter(|(_, c)| c.enabled).map(|(id, c)| (*id, c))
    }

    /// The effective configuration as TOML, secrets redacted.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(&Redacted::from(self)).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// A rendering of [`Settings`] whose URLs show no credential ([`mask_credentials`]).
#[derive(Serialize)]
struct Redacted {
    #[serde(flatten)]
    settings: Settings,
}

impl From<&Settings> for Redacted {
    fn from(s: &Settings) -> Self {
        let mut settings = s.clone();
        for url in [&mut settings.redis.url, &mut settings.postgres.url, &mut settings.nats.url] {
            *url = mask_credentials(url);
        }
        for channel in settings.icom.channels.values_mut() {
            channel.base_url = mask_credentials(&channel.base_url);
        }
        Redacted { settings }
    }
}

/// Settings from the defaults and `env` (`CABINE__…` pairs): the config tests' loader.
#[cfg(test)]
pub(crate) fn load_with_env(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Settings::from_sources(DEFAULT_TOML, None, &env)
}

#[cfg(test)]
mod load_tests {
    use super::*;

    use crate::config::load_with_env as load;

    #[test]
    fn defaults_are_valid() {
        let s = load(&[]).unwrap();
        assert_eq!(s.pools.stream.get() + s.pools.send.get(), 6);
        assert_eq!(s.timing.lease, Duration::from_secs(12));
    }

    #[test]
    fn environment_overrides_nested_keys() {
        let s = load(&[
            ("CABINE__TIMING__LEASE", "2s"),
            ("CABINE__TIMING__HEARTBEAT", "500ms"),
            ("CABINE__TIMING__LONG_POLL_TIMEOUT", "1s"),
            ("CABINE__TIMING__SEND_TIMEOUT", "1s"),
            ("CABINE__TIMING__LOCK_DELAY", "1s"),
            ("CABINE__TIMING__DRIFT_MARGIN", "100ms"),
            ("CABINE__ICOM__SERVER_HOLD", "500ms"),
            ("CABINE__ICOM__CHANNELS__CSM__ENABLED", "true"),
            ("CABINE__POOLS__STREAM", "3"),
        ])
        .unwrap();
        assert_eq!(s.timing.lease, Duration::from_secs(2));
        assert_eq!(s.pools.stream.get(), 3);
        assert_eq!(s.enabled_channels().count(), 2);
    }

    #[test]
    fn overlay_file_sits_between_defaults_and_environment() {
        let env = [("CABINE__POOLS__SEND".to_string(), "1".to_string())].into_iter().collect();
        let overlay = "[pools]\nstream = 2\nsend = 2\n";
        let s = Settings::from_sources(DEFAULT_TOML, Some(("x.toml", overlay)), &env).unwrap();
        assert_eq!((s.pools.stream.get(), s.pools.send.get()), (2, 1));
    }

    fn violation(env: &[(&str, &str)]) -> String {
        match load(env) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a violation, got {other:?}"),
        }
    }

    #[test]
    fn every_boot_invariant_names_its_keys() {
        assert!(violation(&[("CABINE__TIMING__LEASE", "10s")]).contains("timing.lease"));
        assert!(
            violation(&[
                ("CABINE__TIMING__LEASE", "8s"),
                ("CABINE__TIMING__LONG_POLL_TIMEOUT", "2s"),
                ("CABINE__TIMING__SEND_TIMEOUT", "2s")
            ])
            .contains("timing.heartbeat")
        );
        assert_eq!(violation(&[("CABINE__TIMING__LOCK_DELAY", "7s")]), "timing.lock_delay");
        assert_eq!(violation(&[("CABINE__POOLS__STREAM", "0")]), "pools.stream");
        assert_eq!(violation(&[("CABINE__POOLS__SEND", "7")]), "pools.send");
        assert!(violation(&[("CABINE__POOLS__SEND", "3")]).contains("icom.max_in_flight"));
        assert!(violation(&[("CABINE__TIMING__DRAIN_TIME", "10s")]).contains("timing.stop_timeout"));
        assert_eq!(violation(&[("CABINE__CLUSTER__ISPB", "1234567")]), "cluster.ispb");
        assert_eq!(
            violation(&[("CABINE__ICOM__CHANNELS__CPM__BASE_URL", "https://icom:16422")]),
            "icom.channels.cpm.ca_file"
        );
        assert_eq!(violation(&[("CABINE__ICOM__MAX_IN_FLIGHT", "9")]), "icom.max_in_flight");
    }

    #[test]
    fn sends_counted_separately_lifts_the_sum_rule() {
        let s = load(&[("CABINE__POOLS__SEND", "6"), ("CABINE__ICOM__SENDS_COUNTED_SEPARATELY", "true")]).unwrap();
        assert_eq!(s.pools.send.get(), 6);
    }
}
