//! Shared by the integration tests: a raw HTTP server (ICOM client tests), an
//! isolated schema (dropped at the end, even when the test fails), isolated
//! JetStream streams, inbound messages that look like ICOM's, and a private
//! nats-server that a test may kill.
#![allow(dead_code)]

pub mod raw_http;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use cabine::config::{DEFAULT_TOML, Settings};
use cabine::db::Db;
use cabine_actors::domain::{ChannelId, SlotId};
use cabine_actors::ports::{InboundMessage, MessageMeta};

/// Settings of one test: its own schema, subjects, streams and ISPB, plus `extra` overrides.
pub fn settings(name: &str, extra: &[(&str, &str)]) -> Settings {
    let mut env: std::collections::HashMap<String, String> = cabine::harness::isolated_env(name).into_iter().collect();
    env.insert("CABINE__CLUSTER__ISPB".into(), ispb_for(name));
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    Settings::from_sources(DEFAULT_TOML, None, &env).expect("test settings are valid")
}

/// A distinct 8-digit ISPB per test, so per-ISPB gauges never mix between tests.
fn ispb_for(name: &str) -> String {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{:08}", h % 100_000_000)
}

/// Runs `cleanup` when dropped, on its own runtime, so a failing test still cleans up.
pub struct Cleanup(Option<Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>>);

impl Cleanup {
    pub fn new(f: impl FnOnce() -> futures::future::BoxFuture<'static, ()> + Send + 'static) -> Self {
        Cleanup(Some(Box::new(f)))
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), f()).await.ok() });
            })
            .join();
        }
    }
}

/// A migrated schema of its own.
pub struct TestDb {
    pub pool: Db,
    pub settings: Settings,
    _drop: Cleanup,
}

impl TestDb {
    pub async fn new(tag: &str, extra: &[(&str, &str)]) -> TestDb {
        let name = cabine::harness::unique_name(tag);
        let settings = settings(&name, extra);
        let pool = cabine::db::pool(&settings.postgres).unwrap();
        cabine::db::migrate(&pool, &settings.postgres.schema).await.expect("migrations apply");
        let (url, schema) = (settings.postgres.url.clone(), settings.postgres.schema.clone());
        let drop = Cleanup::new(move || {
            Box::pin(async move {
                if let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    tokio::spawn(conn);
                    let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
                }
            })
        });
        TestDb { pool, settings, _drop: drop }
    }

    pub fn inbox(&self) -> cabine::inbox::PgInbox {
        cabine::inbox::PgInbox::new(
            self.pool.clone(),
            &self.settings.cluster.ispb,
            self.settings.postgres.query_timeout,
        )
    }

    pub fn ispb(&self) -> String {
        self.settings.cluster.ispb.to_string()
    }

    pub async fn count(&self, sql_where: &str) -> i64 {
        let conn = self.pool.get().await.unwrap();
        conn.query_one(&format!("SELECT count(*) FROM inbox WHERE {sql_where}"), &[]).await.unwrap().get(0)
    }

    /// (fence, pull_next, holder) of a slot row.
    pub async fn cursor(&self, slot: SlotId) -> (i64, Option<String>, Option<String>) {
        let conn = self.pool.get().await.unwrap();
        let row = conn
            .query_one(
                "SELECT fence, pull_next, holder FROM slot_cursor WHERE channel = $1 AND slot = $2",
                &[&slot.channel.as_str(), &i16::from(slot.n)],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }
}

/// The JetStream streams `cabine migrate` would create for `settings`, deleted when dropped.
pub struct TestStreams {
    pub js: async_nats::jetstream::Context,
    pub inbound: String,
    _drop: Cleanup,
}

impl TestStreams {
    pub async fn create(client: &async_nats::Client, settings: &Settings) -> TestStreams {
        let subjects = cabine::bus::Subjects::new(&settings.nats, &settings.cluster.ispb);
        cabine::bus::ensure_streams(client, &settings.nats, &subjects, &["cpm", "csm"]).await.expect("streams");
        let url = settings.nats.url.clone();
        let names = [&settings.nats.inbound_stream, &settings.nats.outbound_stream, &settings.nats.results_stream]
            .map(|s| s.clone());
        let drop = Cleanup::new(move || {
            Box::pin(async move {
                if let Ok(client) = async_nats::connect(&url).await {
                    let js = async_nats::jetstream::new(client);
                    for name in names {
                        let _ = js.delete_stream(&name).await;
                    }
                }
            })
        });
        TestStreams {
            js: async_nats::jetstream::new(client.clone()),
            inbound: settings.nats.inbound_stream.clone(),
            _drop: drop,
        }
    }

    /// Every message of the inbound stream: (subject, Nats-Msg-Id, payload).
    pub async fn inbound_messages(&self) -> Vec<(String, String, Bytes)> {
        let stream = self.js.get_stream(&self.inbound).await.expect("inbound stream");
        let info = stream.get_info().await.unwrap();
        let mut out = Vec::new();
        for seq in info.state.first_sequence..=info.state.last_sequence {
            if info.state.messages == 0 {
                break;
            }
            let m = stream.get_raw_message(seq).await.expect("stored message");
            let id = m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned()).unwrap_or_default();
            out.push((m.subject.to_string(), id, m.payload));
        }
        out
    }
}

pub fn slot(n: u8) -> SlotId {
    SlotId { channel: ChannelId::Cpm, n }
}

/// A well-formed inbound message of type `msg_def` (pacs.008 by default).
pub fn message(resource_id: &str, msg_def: Option<&str>) -> InboundMessage {
    let def = msg_def.unwrap_or("pacs.008.spi.1.16");
    let raw = format!(
        "<Envelope><AppHdr><Fr>00038166</Fr><To>99999010</To><BizMsgIdr>M0003816600000000000{resource_id}</BizMsgIdr>\
         <MsgDefIdr>{def}</MsgDefIdr></AppHdr><Document><GrpHdr><MsgId>{resource_id}</MsgId></GrpHdr>\
         <EndToEndId>E00038166202501011200{resource_id}</EndToEndId></Document></Envelope>"
    );
    InboundMessage {
        resource_id: resource_id.to_owned(),
        raw: Bytes::from(raw),
        meta: MessageMeta {
            msg_def: msg_def.map(str::to_owned).or(Some(def.to_owned())),
            biz_msg_id: Some(format!("M0003816600000000000{resource_id}")),
            msg_id: Some(resource_id.to_owned()),
            end_to_end_id: Some(format!("E00038166202501011200{resource_id}")),
            from: Some("00038166".into()),
            to: Some("99999010".into()),
        },
        malformed: None,
    }
}

/// `n` well-formed messages `{prefix}-0 .. {prefix}-{n-1}`.
pub fn batch(prefix: &str, n: usize) -> Vec<InboundMessage> {
    (0..n).map(|i| message(&format!("{prefix}-{i}"), None)).collect()
}

/// A nats-server with JetStream on a port of its own, storing under `dir`; killed on drop.
pub struct PrivateNats {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl PrivateNats {
    pub fn start(dir: PathBuf) -> PrivateNats {
        let port = cabine::harness::free_port().unwrap();
        let mut nats = PrivateNats { port, dir, child: None };
        nats.restart();
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port and store, and waits until it accepts connections.
    pub fn restart(&mut self) {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("private nats-server did not listen on {}", self.port);
    }

    /// SIGKILL: the server vanishes without a goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `check` every 50 ms for up to `within`.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
