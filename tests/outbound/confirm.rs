//! The Postgres confirmations: inbound status reports in the inbox move the
//! messages they reference to confirmed / rejected_by_spi, once, durably (a
//! pass that fails leaves the rows for the next), pods splitting the rows.

use std::sync::Arc;
use std::time::Duration;

use cabine::outbound::PgConfirmations;
use cabine_actors::ports::outbound::{OutboundStatus, OutboundStore, Priority, SendResult};
use cabine_actors::ports::outbound_bus::ResultStatus;
use cabine_actors::ports::{ConfirmError, Confirmations};

use crate::store::{Rig, minutes, msg, policy};

const ACCEPTED: &str = include_str!("../data/spi/pacs.002_SPI_1_msg.xml");
const REFUSED: &str = include_str!("../data/spi/pacs.002_ERRO_1_msg.xml");
const PACS008: &str = include_str!("../data/spi/pacs.008_END_1_msg.xml");
const TEMPLATE_E2E: &str = "E9999901012341234123412345678900";

impl Rig {
    /// Commits an inbox row as a slot would.
    async fn inbox(&self, resource_id: &str, msg_def: &str, raw: &str) {
        let conn = self.pool.get().await.unwrap();
        conn.execute(
            "INSERT INTO inbox (ispb, channel, resource_id, msg_def, raw, slot, fence) VALUES ($1, 'cpm', $2, $3, $4, 1, 1)",
            &[&self.ispb.to_string(), &resource_id, &msg_def, &raw.as_bytes()],
        )
        .await
        .unwrap();
    }

    async fn uncorrelated(&self) -> Vec<String> {
        let conn = self.pool.get().await.unwrap();
        let rows =
            conn.query("SELECT resource_id FROM inbox WHERE correlated_at IS NULL ORDER BY id", &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    fn confirmer(&self, timeout: Duration) -> PgConfirmations {
        PgConfirmations::new(self.pool.clone(), &self.ispb, policy(), timeout)
    }
}

fn e2e(n: u32) -> String {
    format!("E99999010{n:023}")
}

#[tokio::test]
async fn status_reports_confirm_or_reject_what_was_sent_once_and_durably() {
    let rig = Rig::new().await;
    let (a, b, c) = (
        msg(1, Priority::Normal, minutes(5)),
        msg(2, Priority::Normal, minutes(5)),
        msg(3, Priority::Normal, minutes(5)),
    );
    for m in [&a, &b, &c] {
        rig.store.insert(m).await.unwrap();
    }
    let batch = rig.store.take_ready(a.channel, cabine_actors::ports::outbound::BatchSize::MAX).await.unwrap();
    let sent: Vec<_> = batch
        .messages
        .iter()
        .map(|m| (m.msg_id.clone(), SendResult::Sent { resource_id: format!("R{}", m.id) }))
        .collect();
    rig.store.record(&batch.claim, &sent).await.unwrap();

    rig.inbox("r1", "pacs.002.spi.1.17", &ACCEPTED.replace(TEMPLATE_E2E, &e2e(1))).await;
    rig.inbox("r2", "pacs.002.spi.1.17", &REFUSED.replace(TEMPLATE_E2E, &e2e(2))).await;
    rig.inbox("r3", "pacs.008.spi.1.16", PACS008).await;
    rig.inbox("r4", "pacs.002.spi.1.17", &ACCEPTED.replace(TEMPLATE_E2E, "E00000000000000000000000000000000")).await;
    rig.inbox("r5", "pacs.002.spi.1.17", "<Envelope><AppHdr>").await;

    // A pass that cannot finish in time changes nothing: the rows wait for the next.
    assert!(matches!(rig.confirmer(Duration::ZERO).correlate(10).await, Err(ConfirmError::Unavailable(_))));
    assert_eq!(rig.status(&a.msg_id).await, OutboundStatus::Sent);
    assert_eq!(rig.uncorrelated().await, ["r1", "r2", "r3", "r4", "r5"]);

    let pods = [Arc::new(rig.confirmer(Duration::from_secs(5))), Arc::new(rig.confirmer(Duration::from_secs(5)))];
    let mut passes = Vec::new();
    for pod in &pods {
        let pod = pod.clone();
        passes.push(tokio::spawn(async move { pod.correlate(2).await.unwrap() }));
    }
    let mut done = Vec::new();
    for p in passes {
        done.push(p.await.unwrap());
    }
    done.push(pods[0].correlate(10).await.unwrap());
    let rows: usize = done.iter().map(|d| d.rows).sum();
    let applied: Vec<ResultStatus> = done.iter().flat_map(|d| d.applied.iter().map(|e| e.status)).collect();
    assert_eq!(rows, 4, "each report once, the pacs.008 never");
    assert_eq!(applied.len(), 2);
    assert!(applied.contains(&ResultStatus::Confirmed) && applied.contains(&ResultStatus::RejectedBySpi));
    assert_eq!(done.iter().map(|d| (d.unknown, d.unreadable)).fold((0, 0), |s, x| (s.0 + x.0, s.1 + x.1)), (1, 1));
    assert_eq!(rig.status(&a.msg_id).await, OutboundStatus::Confirmed);
    assert_eq!(rig.status(&b.msg_id).await, OutboundStatus::RejectedBySpi);
    assert_eq!(rig.status(&c.msg_id).await, OutboundStatus::Sent);
    assert_eq!(rig.uncorrelated().await, ["r3"], "only the pacs.008 stays uncorrelated");

    // A second report about the same message finds it final.
    rig.inbox("r6", "pacs.002.spi.1.17", &ACCEPTED.replace(TEMPLATE_E2E, &e2e(1))).await;
    let again = pods[1].correlate(10).await.unwrap();
    assert_eq!((again.rows, again.applied.len(), again.already_final), (1, 0, 1));
    rig.drop_schema().await;
}

/// An admi.002 refusing what `reference` names (a MsgId, or the ResourceId its POST returned).
fn admi002(reference: &str, reason: &str) -> String {
    format!(
        "<Envelope><AppHdr><MsgDefIdr>admi.002.spi.1.3</MsgDefIdr></AppHdr><Document><admi.002.001.01>\
         <RltdRef><Ref>{reference}</Ref></RltdRef><Rsn><RjctgPtyRsn>{reason}</RjctgPtyRsn>\
         <RsnDesc>refused</RsnDesc></Rsn></admi.002.001.01></Document></Envelope>"
    )
}

#[tokio::test]
async fn an_admi_002_naming_the_resource_id_rejects_the_message_even_before_its_201_is_recorded() {
    let rig = Rig::new().await;
    let (a, b) = (msg(1, Priority::Normal, minutes(5)), msg(2, Priority::Normal, minutes(5)));
    for m in [&a, &b] {
        rig.store.insert(m).await.unwrap();
    }
    let batch = rig.store.take_ready(a.channel, cabine_actors::ports::outbound::BatchSize::MAX).await.unwrap();
    let confirmer = rig.confirmer(Duration::from_secs(5));
    // The SPI refuses b by the ResourceId of its POST before the sender has recorded the 201.
    rig.inbox("r1", "admi.002.spi.1.3", &admi002("R-b", "FF01")).await;
    let early = confirmer.correlate(10).await.unwrap();
    assert_eq!((early.rows, early.applied.len()), (1, 0));
    assert_eq!(rig.uncorrelated().await, ["r1"], "matched nothing yet: kept for a later pass");
    let sent = |m: &cabine_actors::ports::outbound::NewOutbound, rid: &str| {
        (m.msg_id.clone(), SendResult::Sent { resource_id: rid.into() })
    };
    rig.store.record(&batch.claim, &[sent(&a, "R-a"), sent(&b, "R-b")]).await.unwrap();
    // One naming a ResourceId already recorded applies at once.
    rig.inbox("r2", "admi.002.spi.1.3", &admi002("R-a", "FF01")).await;
    let now = confirmer.correlate(10).await.unwrap();
    assert_eq!(now.applied.iter().map(|e| e.status).collect::<Vec<_>>(), [ResultStatus::RejectedBySpi]);
    assert_eq!(rig.status(&a.msg_id).await, OutboundStatus::RejectedBySpi);
    // The early one, retried after its pause, finds b now.
    let mut applied = Vec::new();
    for _ in 0..50 {
        applied.extend(confirmer.correlate(10).await.unwrap().applied);
        if !applied.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(applied.iter().filter_map(|e| e.msg_id.as_deref()).collect::<Vec<_>>(), [b.msg_id.as_str()]);
    assert_eq!(rig.status(&b.msg_id).await, OutboundStatus::RejectedBySpi);
    assert!(rig.uncorrelated().await.is_empty());
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_report_that_never_matches_is_given_up_after_the_processing_timeout_not_at_once() {
    let rig = Rig::new().await;
    rig.inbox("r1", "admi.002.spi.1.3", &admi002("R-nobody", "FF01")).await;
    let confirmer = rig.confirmer(Duration::from_secs(5));
    let first = confirmer.correlate(10).await.unwrap();
    assert_eq!((first.rows, first.unknown), (1, 1));
    assert_eq!(rig.uncorrelated().await, ["r1"], "retried, not dropped");
    let mut passes = 0;
    while !rig.uncorrelated().await.is_empty() {
        passes += 1;
        assert!(passes < 100, "never given up");
        confirmer.correlate(10).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let conn = rig.pool.get().await.unwrap();
    let row = conn.query_one("SELECT correlate_tries, unmatched_at IS NOT NULL FROM inbox", &[]).await.unwrap();
    assert!(row.get::<_, i32>(0) >= 2 && row.get::<_, bool>(1), "kept in the inbox, marked unmatched");
    rig.drop_schema().await;
}
