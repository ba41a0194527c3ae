//! The Reconciler against the simulator's settlement record (child simulator,
//! real Redis, Postgres and NATS): every discrepancy created through the
//! simulator's controls is found with its kind and evidence; a send stored by
//! the SPI behind a 5xx whose pacs.002 was lost is settled `confirmed` with
//! exactly one final event to the core; a send the SPI never stored becomes
//! `timeout`; re-running a window changes nothing; the scheduled windows of
//! clean traffic reconcile with no discrepancy.

mod cluster_support;
mod ops_support;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use anyhow::{Context, ensure};
use bytes::Bytes;
use cabine::harness::outbound::{OutboundFeed, Request, msg_id_of, pacs008_bodies};
use cabine::harness::{BusReader, LocalCluster};
use ops_support::{Call, Desk, TOKEN, actor, cli, run, start, until};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The Reconciler on, its camt.060 on the secondary channel.
fn reconciling(interval: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("CABINE__RECONCILE__ENABLED", "true"),
        ("CABINE__RECONCILE__INTERVAL", interval),
        ("CABINE__RECONCILE__SETTLE_MARGIN", "1s"),
        ("CABINE__RECONCILE__REPORT_TIMEOUT", "10s"),
        ("CABINE__RECONCILE__RETRY_AFTER", "500ms"),
        ("CABINE__RECONCILE__LOOKBACK", "1s"),
        ("CABINE__RECONCILE__MAX_WINDOWS", "50"),
        ("CABINE__ICOM__CHANNELS__CSM__ENABLED", "true"),
        // The 5xx of the in-doubt sends must not open the breaker: each must reach the SPI.
        ("CABINE__OUTBOUND__BREAKER__CONSECUTIVE_FAILURES", "1000"),
        ("CABINE__OUTBOUND__BREAKER__MIN_CALLS", "1000"),
        ("CABINE__OUTBOUND__BREAKER__DEGRADED_MIN_CALLS", "1000"),
        // ...and retried until their deadline, never poisoned first.
        ("CABINE__TIMING__POISON_ATTEMPTS", "1000"),
    ]
}

fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Injects one credit transfer on `cpm` as `settlement` says; its EndToEndId.
async fn credit(c: &LocalCluster, settlement: &str) -> anyhow::Result<String> {
    let v = c.sim.control.inject_answer(json!({ "kind": "pacs008", "settlement": settlement })).await?;
    v["end_to_end_ids"][0].as_str().map(str::to_owned).with_context(|| format!("inject answered {v}"))
}

fn e2e_of(body: &Bytes) -> String {
    cabine::icom::envelope::read(body).expect("an envelope").end_to_end_ids[0].clone()
}

/// Posts `body` on cpm with a deadline `after` from now; its MsgId.
async fn send_until(desk: &Desk, body: &Bytes, after: Duration) -> anyhow::Result<String> {
    let deadline = stamp(SystemTime::now() + after);
    let call =
        Call { token: Some(TOKEN), headers: &[("Cabine-Deadline", deadline.as_str())], body: Some(body.clone()) };
    let (status, v) = desk.post("/v1/outbound?channel=cpm", call).await?;
    ensure!(status == StatusCode::ACCEPTED, "{status} {v}");
    msg_id_of(body).context("a MsgId")
}

/// (kind, EndToEndId, action) of every discrepancy found, sorted.
async fn found(c: &LocalCluster) -> anyhow::Result<BTreeSet<(String, String, String)>> {
    let rows = c.query("SELECT kind, end_to_end_id, COALESCE(action, '') FROM reconciliation_discrepancy").await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

/// One credit through, so the pod's streams are up before the traffic a test judges.
async fn streaming(c: &LocalCluster) -> anyhow::Result<()> {
    c.sim.control.inject(1, "pacs008").await?;
    let n = until(Duration::from_secs(20), async || {
        let n = c.inbox_count("msg_def LIKE 'pacs.008%'").await?;
        Ok((n == 1, n))
    })
    .await?;
    ensure!(n == 1, "the first credit arrives: {n}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_discrepancy_is_found_and_in_doubt_sends_are_settled_once() {
    let c = start("rec_found", 1, &reconciling("1h")).await;
    run(c, async |c| {
        streaming(c).await?;
        let desk = Desk::of(c, 0);
        let subject = cabine::bus::Subjects::new(&c.settings.nats, &c.settings.cluster.ispb).results();
        let results = BusReader::start(c.nats.clone(), &c.settings.nats.results_stream, &subject)
            .await
            .map_err(anyhow::Error::msg)?;
        let from = SystemTime::now();
        c.sim.control.inject(5, "pacs008").await?;
        let missing = credit(c, "undelivered").await?;
        let unknown = credit(c, "unrecorded").await?;
        let misstated = credit(c, "misstated").await?;
        let twice = credit(c, "twice").await?;
        let bodies = pacs008_bodies(&c.settings.cluster.ispb, 4);
        OutboundFeed::of(c).publish_all(&bodies[..2], Request::default()).await.map_err(anyhow::Error::msg)?;
        let confirmed = until(Duration::from_secs(20), async || {
            let n: i64 = c.query("SELECT count(*) FROM outbound WHERE status = 'confirmed'").await?[0].get(0);
            Ok((n == 2, n))
        })
        .await?;
        ensure!(confirmed == 2, "the clean sends are confirmed first: {confirmed}");

        // Stored by the SPI, answered 5xx, its pacs.002 lost: in doubt at its deadline.
        let faults = json!({"channel": "cpm", "error_5xx_ratio": 1.0, "store_before_5xx": true, "lose_replies": true});
        c.sim.control.faults(faults).await?;
        let stored = send_until(&desk, &bodies[2], Duration::from_secs(3)).await?;
        desk.until_status(&stored, "in_doubt", Duration::from_secs(15)).await?;
        // Answered 5xx without storing: in doubt too, and never settled.
        c.sim.control.faults(json!({"channel": "cpm", "store_before_5xx": false, "lose_replies": false})).await?;
        let never = send_until(&desk, &bodies[3], Duration::from_secs(3)).await?;
        let v = desk.until_status(&never, "in_doubt", Duration::from_secs(15)).await?;
        ensure!(v["status"] == "in_doubt", "{v}");
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 0.0})).await?;
        let delivered = until(Duration::from_secs(20), async || {
            let n = c.inbox_count("msg_def LIKE 'pacs.008%'").await?;
            Ok((n == 10, n))
        })
        .await?;
        ensure!(delivered == 10, "the first, 5 clean, unrecorded, misstated and twice twice: {delivered}");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let to = SystemTime::now() - Duration::from_millis(1100);

        let window = format!("/v1/reconciliations?from={}&to={}", stamp(from), stamp(to));
        let (status, v) = desk.post(&window, Call::default()).await?;
        ensure!(status == StatusCode::UNAUTHORIZED, "running one takes the admin token: {status} {v}");
        let (status, first) = desk.post(&window, Call::authorized()).await?;
        ensure!(status == StatusCode::OK, "{status} {first}");
        ensure!(first["reconciliation"]["status"] == "done", "{first}");
        ensure!(first["reconciliation"]["statement_entries"] == 8 + 2 + 1, "8 credits, 3 debits: {first}");
        let want: BTreeSet<(String, String, String)> = [
            ("missing_inbound", missing.as_str(), ""),
            ("unknown_inbound", unknown.as_str(), ""),
            ("mismatch", misstated.as_str(), ""),
            ("duplicate_inbound", twice.as_str(), ""),
            ("settled_unconfirmed", &e2e_of(&bodies[2]), "confirmed"),
            ("not_settled", &e2e_of(&bodies[3]), "timeout"),
        ]
        .into_iter()
        .map(|(k, e, a)| (k.to_owned(), e.to_owned(), a.to_owned()))
        .collect();
        ensure!(found(c).await? == want, "found {:?}", found(c).await?);
        let d = first["discrepancies"].as_array().context("discrepancies")?;
        let missed = d.iter().find(|x| x["kind"] == "missing_inbound").context("missing_inbound")?;
        ensure!(missed["level"] == "CRITICAL" && missed["evidence"]["statement"]["direction"] == "credit", "{missed}");
        let wrong = d.iter().find(|x| x["kind"] == "mismatch").context("mismatch")?;
        ensure!(wrong["evidence"]["statement"]["amount"] != wrong["evidence"]["ours"]["amount"], "{wrong}");

        let v = desk.until_status(&stored, "confirmed", Duration::from_secs(5)).await?;
        ensure!(v["status"] == "confirmed", "the statement settles the stored send: {v}");
        let v = desk.until_status(&never, "timeout", Duration::from_secs(5)).await?;
        ensure!(v["status"] == "timeout", "the core may pay again under a new MsgId: {v}");
        let finals = until(Duration::from_secs(10), async || {
            let ids: Vec<String> =
                results.with(|a| a.first.keys().filter(|k| k.starts_with(&stored)).cloned().collect());
            let finals: Vec<String> = ids
                .into_iter()
                .filter(|k| [":confirmed:", ":timeout:", ":rejected", ":dead:"].iter().any(|f| k.contains(f)))
                .collect();
            Ok((finals.len() == 1, finals))
        })
        .await?;
        ensure!(finals.len() == 1 && finals[0].contains(":confirmed:"), "exactly one final event: {finals:?}");

        // Again: the same window finds the same, and changes nothing.
        let (status, again) = desk.post(&window, Call::authorized()).await?;
        ensure!(status == StatusCode::OK && again["reconciliation"]["id"] == first["reconciliation"]["id"], "{again}");
        ensure!(again["reconciliation"]["attempts"] == 2, "{again}");
        ensure!(found(c).await? == want, "a re-run adds nothing: {:?}", found(c).await?);
        ensure!(again["discrepancies"] == first["discrepancies"], "{again}");
        operator_reads(c, &desk, &first).await?;
        incident_report(c, &desk, (from, to), (&stored, &never)).await?;
        Ok(())
    })
    .await;
}

/// The list, one run, the CLI, the metrics and the `/cluster` alert.
async fn operator_reads(c: &LocalCluster, desk: &Desk, run: &Value) -> anyhow::Result<()> {
    let id = run["reconciliation"]["id"].as_i64().context("id")?;
    let (status, list) = desk.get("/v1/reconciliations").await?;
    ensure!(status == StatusCode::OK, "{status} {list}");
    let runs = list["reconciliations"].as_array().context("list")?;
    ensure!(runs.iter().any(|r| r["id"] == id && r["discrepancies"]["missing_inbound"] == 1), "{list}");
    let (status, one) = desk.get(&format!("/v1/reconciliations/{id}")).await?;
    ensure!(status == StatusCode::OK && one["discrepancies"].as_array().map(Vec::len) == Some(6), "{one}");
    let (status, _) = desk.get("/v1/reconciliations/999999").await?;
    ensure!(status == StatusCode::NOT_FOUND, "{status}");
    let (status, v) = desk.get("/v1/reconciliations?from=yesterday").await?;
    ensure!(status == StatusCode::BAD_REQUEST && v["error"].as_str().is_some_and(|e| e.contains("from")), "{v}");

    let pod = format!("http://{}", c.pods[0].operator);
    let (code, out, err) = cli(&["reconcile", "show", &id.to_string(), "--pod", &pod, "--token", TOKEN], &[]).await?;
    ensure!(code == 0 && out.contains("missing_inbound"), "{code} {out} {err}");
    let (code, _, err) = cli(&["reconcile", "--pod", &pod], &[]).await?;
    ensure!(code != 0 && err.contains("--from"), "{code} {err}");

    let url = format!("http://{}/metrics", c.pods[0].http);
    let metrics = cabine::harness::http_client().get(url).send().await?.text().await?;
    ensure!(metrics.contains("cabine_reconcile_windows_total"), "metrics");
    ensure!(
        metrics.contains("cabine_reconcile_discrepancies_total{kind=\"missing_inbound\",level=\"CRITICAL\"}"),
        "{metrics}"
    );
    let view = c.pod_json(0, "/cluster").await?;
    let alerts = view["alerts"].as_array().context("alerts")?;
    ensure!(
        alerts.iter().any(|a| a["kind"] == "reconcile" && a["level"] == "CRITICAL"),
        "a CRITICAL discrepancy raises the alert: {view}"
    );
    Ok(())
}

/// The incident report of the window: the two sends in doubt and how each was resolved, the
/// retries, the timeout, the discrepancies; in Markdown through the CLI.
async fn incident_report(
    c: &LocalCluster,
    desk: &Desk,
    (from, to): (SystemTime, SystemTime),
    (stored, never): (&str, &str),
) -> anyhow::Result<()> {
    let window = format!("from={}&to={}", stamp(from), stamp(to + Duration::from_secs(30)));
    let (status, r) = desk.get(&format!("/v1/incidents/report?{window}")).await?;
    ensure!(status == StatusCode::OK, "{status} {r}");
    let doubt = r["outbound_in_doubt"]["items"].as_array().context("in doubt")?;
    let resolved = |id: &str| doubt.iter().find(|d| d["msg_id"] == id).map(|d| d["resolved"]["to"].clone());
    ensure!(r["outbound_in_doubt"]["count"] == 2, "{r}");
    ensure!(resolved(stored) == Some(json!("confirmed")) && resolved(never) == Some(json!("timeout")), "{r}");
    ensure!(r["outbound_retried"]["count"].as_i64().unwrap_or(0) >= 2, "both were retried: {r}");
    // The stored one reached the SPI in time (its first attempt); the other never did.
    ensure!(r["outbound_timed_out"]["count"] == 1 && r["outbound_past_deadline"]["count"] == 1, "{r}");
    ensure!(r["reconciliation"]["count"] == 6 && r["breaker_openings"]["count"] == 0, "{r}");
    let (status, _) = desk.get(&format!("/v1/incidents/report?{window}&lag=fast")).await?;
    ensure!(status == StatusCode::BAD_REQUEST, "{status}");
    let pod = format!("http://{}", c.pods[0].operator);
    let args =
        ["report", "incident", "--from", &stamp(from), "--to", &stamp(to + Duration::from_secs(30)), "--pod", &pod];
    let (code, out, err) = cli(&args, &[]).await?;
    ensure!(code == 0 && out.starts_with("# Incident report"), "{code} {out} {err}");
    ensure!(out.contains("| Outbound in doubt, and how each was resolved | 2 |") && out.contains(never), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduled_windows_of_clean_traffic_reconcile_with_nothing_found() {
    let c = start("rec_clean", 1, &reconciling("2s")).await;
    run(c, async |c| {
        streaming(c).await?;
        let started = SystemTime::now();
        c.sim.control.inject_json(json!({ "count": 40, "kind": "pacs008", "rate_per_s": 20.0 })).await?;
        let bodies = pacs008_bodies(&c.settings.cluster.ispb, 20);
        OutboundFeed::of(c).publish_all(&bodies, Request::default()).await.map_err(anyhow::Error::msg)?;
        // Every window from the first message to well after the last, reconciled.
        let covered_until = started + Duration::from_secs(5);
        let done = until(Duration::from_secs(30), async || {
            let rows = c
                .query("SELECT count(*), COALESCE(sum(statement_entries), 0)::bigint, max(window_to) FROM reconciliation WHERE status = 'done'")
                .await?;
            let (n, entries, last): (i64, i64, Option<SystemTime>) = (rows[0].get(0), rows[0].get(1), rows[0].get(2));
            Ok((last.is_some_and(|l| l >= covered_until) && entries >= 61, (n, entries)))
        })
        .await?;
        let errors = c.query("SELECT status, attempts, COALESCE(error, '') FROM reconciliation ORDER BY id DESC LIMIT 3").await?;
        let errors: Vec<(String, i32, String)> = errors.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let tree = c.pod_json(0, "/actors").await?;
        let node = actor(&tree, "reconciler").cloned();
        ensure!(done.1 >= 61, "41 credits and 20 debits on the statements: {done:?}, last runs {errors:?}, {node:?}");
        let found = found(c).await?;
        ensure!(found.is_empty(), "clean traffic, nothing found: {found:?}");
        let gaps = c
            .query(
                "SELECT count(*) FROM reconciliation a WHERE status = 'done' AND NOT EXISTS
                   (SELECT 1 FROM reconciliation b WHERE b.window_from = a.window_to)
                 AND a.window_to < (SELECT max(window_to) FROM reconciliation)",
            )
            .await?;
        ensure!(gaps[0].get::<_, i64>(0) == 0, "consecutive windows, none skipped");
        let tree = c.pod_json(0, "/actors").await?;
        let node = actor(&tree, "reconciler").context("a reconciler node")?;
        ensure!(node["details"]["windows"].as_u64().unwrap_or(0) >= 3, "{node}");
        // One camt.060 per window: those done, and the next one's perhaps on its way.
        let lane = c.sim.control.audit("csm").await?;
        let requests: i64 = c.query("SELECT count(*) FROM reconciliation").await?[0].get(0);
        let sent = lane["received_outbound"].as_i64().unwrap_or(-1);
        ensure!(sent >= done.0 && sent <= requests + 1, "{sent} camt.060 for {} windows done, {requests} opened", done.0);
        Ok(())
    })
    .await;
}
