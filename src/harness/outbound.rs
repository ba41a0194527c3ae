//! The bank's core, as tests and `cabine bench outbound` play it: outbound
//! pacs.008 bodies with unique ids, published on the outbound work-queue
//! stream with the priority and deadline headers, and the outbound table read
//! back to judge what happened to each MsgId.

use std::collections::BTreeMap;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::Bytes;
use cabine_actors::domain::Ispb;

use super::LocalCluster;
use crate::outbound::ingress::{DEADLINE_CLASS_HEADER, PRIORITY_HEADER};

/// A catalog pacs.008 (4 KB) whose ids are replaced per message.
const PACS008: &str = include_str!("../sim/templates/pacs.008_END_1_msg.xml");
const TEMPLATE_MSG_ID: &str = "M0003816612345678901234567890123";
const TEMPLATE_E2E: &str = "E9999901012341234123412345678900";
const TEMPLATE_TO: &str = "99999010";
const SPI_ISPB: &str = "00038166";

/// `n` pacs.008 from `ispb` to the SPI, each with its own MsgId and EndToEndId.
pub fn pacs008_bodies(ispb: &Ispb, n: usize) -> Vec<Bytes> {
    let maker = Pacs008Maker::new(ispb);
    (0..n).map(|i| maker.body(i)).collect()
}

/// Makes pacs.008 bodies one at a time: body `i` has MsgId `M{ispb}B{run}{i}` (unique
/// for every `i` of one maker) and an EndToEndId unique for a million `i`s.
pub struct Pacs008Maker {
    template: String,
    ispb: String,
    /// Random per maker: two makers rarely share MsgIds (1 in 10,000).
    run: u32,
}

impl Pacs008Maker {
    pub fn new(ispb: &Ispb) -> Pacs008Maker {
        // The participant sends to the SPI: AppHdr's Fr becomes the ISPB, its To the SPI.
        let template = PACS008
            .replacen(&format!("<Id>{SPI_ISPB}</Id>"), "<Id>{FROM}</Id>", 1)
            .replacen(&format!("<Id>{TEMPLATE_TO}</Id>"), &format!("<Id>{SPI_ISPB}</Id>"), 1)
            .replacen("<Id>{FROM}</Id>", &format!("<Id>{ispb}</Id>"), 1);
        Pacs008Maker { template, ispb: ispb.to_string(), run: rand::random::<u32>() % 10_000 }
    }

    pub fn body(&self, i: usize) -> Bytes {
        let (ispb, run) = (&self.ispb, self.run);
        let msg_id = format!("M{ispb}B{run:04}{i:018}");
        let e2e = format!("E{ispb}202401011200B{run:04}{:06}", i % 1_000_000);
        Bytes::from(self.template.replace(TEMPLATE_MSG_ID, &msg_id).replace(TEMPLATE_E2E, &e2e))
    }
}

/// The MsgId [`pacs008_bodies`] gave body `body`.
pub fn msg_id_of(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<MsgId>")? + "<MsgId>".len();
    let len = text[start..].find("</MsgId>")?;
    Some(text[start..start + len].to_owned())
}

/// Publishes outbound requests as the bank's core does.
#[derive(Clone)]
pub struct OutboundFeed {
    js: jetstream::Context,
    subject: String,
}

/// Headers of one request: priority (`critical`, `high`, `normal`, `low`) and deadline class.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub priority: &'a str,
    pub class: &'a str,
}

impl Default for Request<'_> {
    fn default() -> Self {
        Request { priority: "normal", class: "standard" }
    }
}

impl OutboundFeed {
    pub fn of(cluster: &LocalCluster) -> OutboundFeed {
        let subjects = crate::bus::Subjects::new(&cluster.settings.nats, &cluster.settings.cluster.ispb);
        OutboundFeed { js: jetstream::new(cluster.nats.clone()), subject: subjects.outbound("cpm") }
    }

    /// Sends one request; await the returned future for its PubAck.
    pub async fn send(&self, body: Bytes, request: Request<'_>) -> Result<PublishAckFuture, String> {
        let mut headers = HeaderMap::new();
        headers.insert(PRIORITY_HEADER, request.priority);
        headers.insert(DEADLINE_CLASS_HEADER, request.class);
        self.js.publish_with_headers(self.subject.clone(), headers, body).await.map_err(|e| e.to_string())
    }

    /// Publishes every body (in rounds of 256: send all, then await every
    /// PubAck, so that acknowledgements never wait behind a long queue) and
    /// returns their MsgIds.
    pub async fn publish_all(&self, bodies: &[Bytes], request: Request<'_>) -> Result<Vec<String>, String> {
        for round in bodies.chunks(256) {
            let mut acks = Vec::with_capacity(round.len());
            for body in round {
                acks.push(self.send(body.clone(), request).await?);
            }
            for ack in acks {
                ack.await.map_err(|e| e.to_string())?;
            }
        }
        Ok(bodies.iter().filter_map(|b| msg_id_of(b)).collect())
    }
}

impl LocalCluster {
    /// Outbound rows by status.
    pub async fn outbound_by_status(&self) -> Result<BTreeMap<String, i64>, super::ClusterError> {
        let rows = self.query("SELECT status::text, count(*) FROM outbound GROUP BY 1").await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}
