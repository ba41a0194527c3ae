//! Measures the inbound data path on this machine against the real Postgres and
//! NATS: commits of 10-message batches with their cursor (one task per slot),
//! publication of committed rows to JetStream, and both together. Prints one
//! JSON line. A measurement to run by hand, never a test:
//! `cargo run --release --example inbox_rate -- [messages] [slots]`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cabine::config::{DEFAULT_TOML, Settings};
use cabine::inbox::PgInbox;
use cabine::publish::JetStreamPublisher;
use cabine_actors::domain::{ChannelId, SlotId};
use cabine_actors::ports::{CommittedRow, InboundMessage, InboundPublisher, InboxStore, MessageMeta};
use hdrhistogram::Histogram;

/// The busy window every gate write asks for here (DESIGN §2.5).
const BUSY: std::time::Duration = std::time::Duration::from_millis(1500);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (messages, slots) = (args.first().copied().unwrap_or(20_000), args.get(1).copied().unwrap_or(4));
    let name = cabine::harness::unique_name("inbox_rate");
    let env: HashMap<String, String> = cabine::harness::isolated_env(&name).into_iter().collect();
    let settings = Settings::from_sources(DEFAULT_TOML, None, &env)?;
    let pool = cabine::db::pool(&settings.postgres)?;
    cabine::db::migrate(&pool, &settings.postgres.schema).await?;
    let client = async_nats::connect(&settings.nats.url).await?;
    let subjects = cabine::bus::Subjects::new(&settings.nats, &settings.cluster.ispb);
    cabine::bus::ensure_streams(&client, &settings.nats, &subjects, &["cpm"]).await?;
    let inbox = Arc::new(PgInbox::new(pool.clone(), &settings.cluster.ispb, settings.postgres.query_timeout));

    let outcome = async {
        let (commit_s, latency, rows) = commit_phase(&inbox, "c", messages, slots, None).await?;
        let publisher = Arc::new(JetStreamPublisher::start(client.clone(), pool.clone(), &settings));
        let started = Instant::now();
        for chunk in rows.chunks(10) {
            publisher.committed(chunk.to_vec()).await;
        }
        wait_published(&pool).await?;
        let publish_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        commit_phase(&inbox, "p", messages, slots, Some(publisher.clone())).await?;
        wait_published(&pool).await?;
        let pipeline_s = started.elapsed().as_secs_f64();
        let per_s = |secs: f64| (messages as f64 / secs).round();
        Ok::<_, anyhow::Error>(serde_json::json!({
            "messages": messages, "slots": slots, "batch": 10,
            "commit_msgs_per_s": per_s(commit_s),
            "commit_p50_ms": latency.value_at_quantile(0.5) as f64 / 1000.0,
            "commit_p99_ms": latency.value_at_quantile(0.99) as f64 / 1000.0,
            "publish_msgs_per_s": per_s(publish_s),
            "commit_and_publish_msgs_per_s": per_s(pipeline_s),
        }))
    }
    .await;

    let conn = pool.get().await?;
    conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", settings.postgres.schema)).await?;
    let js = async_nats::jetstream::new(client);
    for stream in [&settings.nats.inbound_stream, &settings.nats.outbound_stream, &settings.nats.results_stream] {
        js.delete_stream(stream).await.ok();
    }
    println!("{}", outcome?);
    Ok(())
}

/// `slots` tasks commit `messages` in batches of 10, handing rows to `publisher` if given.
async fn commit_phase(
    inbox: &Arc<PgInbox>,
    tag: &str,
    messages: usize,
    slots: usize,
    publisher: Option<Arc<JetStreamPublisher>>,
) -> anyhow::Result<(f64, Histogram<u64>, Vec<CommittedRow>)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 1..=slots {
        let (inbox, publisher, tag) = (inbox.clone(), publisher.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let slot = SlotId { channel: ChannelId::Cpm, n: n as u8 };
            let fence = inbox.claim(slot, "bench", BUSY).await?.fence;
            let mut latency = Histogram::<u64>::new(3)?;
            let mut rows = Vec::new();
            for b in 0..messages / slots / 10 {
                let batch: Vec<InboundMessage> = (0..10).map(|i| message(&format!("{tag}{n}-{b}-{i}"))).collect();
                let t = Instant::now();
                let summary = inbox.commit(slot, fence, &batch, &format!("/stream/{n}/{b}"), BUSY).await?;
                latency.record(t.elapsed().as_micros() as u64)?;
                match &publisher {
                    Some(p) => p.committed(summary.inserted).await,
                    None => rows.extend(summary.inserted),
                }
            }
            Ok::<_, anyhow::Error>((latency, rows))
        }));
    }
    let mut latency = Histogram::<u64>::new(3)?;
    let mut rows = Vec::new();
    for task in tasks {
        let (h, r) = task.await??;
        latency.add(h)?;
        rows.extend(r);
    }
    Ok((started.elapsed().as_secs_f64(), latency, rows))
}

async fn wait_published(pool: &deadpool_postgres::Pool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let conn = pool.get().await?;
        let left: i64 = conn.query_one("SELECT count(*) FROM inbox WHERE published_at IS NULL", &[]).await?.get(0);
        if left == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{left} rows still unpublished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A pacs.008-sized message (~2.5 KB, like a signed ICOM envelope).
fn message(resource_id: &str) -> InboundMessage {
    let body = format!(
        "<Envelope><AppHdr><Fr>00038166</Fr><To>99999010</To><BizMsgIdr>M00038166{resource_id}</BizMsgIdr>\
         <MsgDefIdr>pacs.008.spi.1.16</MsgDefIdr><Sgntr>{}</Sgntr></AppHdr><Document>{}</Document></Envelope>",
        "s".repeat(1200),
        "d".repeat(1200)
    );
    InboundMessage {
        resource_id: resource_id.to_owned(),
        raw: Bytes::from(body),
        meta: MessageMeta {
            msg_def: Some("pacs.008.spi.1.16".into()),
            biz_msg_id: Some(format!("M00038166{resource_id}")),
            msg_id: Some(resource_id.to_owned()),
            end_to_end_id: Some(format!("E00038166{resource_id}")),
            from: Some("00038166".into()),
            to: Some("99999010".into()),
        },
        malformed: None,
    }
}
