//! `report timings` against real Postgres (a schema of its own): the figures
//! per channel and stage from known timestamps, what is still pending, and
//! the per-message CSV read back page by page across a page boundary; and the
//! bench series (messages per second over time, latency CDF) from the same rows.

use std::time::{Duration, SystemTime};

mod support;

use cabine::timings::{PAGE_ROWS, TimingReports};
use support::TestDb;

/// `n` inbox rows at `base` + i ms, published `i` ms later (1, 2, … n ms); one unpublished.
async fn inbound(db: &TestDb, n: i64, base: SystemTime) {
    let conn = db.pool.get().await.unwrap();
    conn.execute(
        "INSERT INTO inbox (ispb, channel, resource_id, msg_id, end_to_end_id, raw, slot, fence, received_at, published_at)
         SELECT $1, 'cpm', 'R' || i, 'M' || i, 'E' || i, '\\x00', 1, 1,
                $2::timestamptz + i * interval '1 millisecond', $2::timestamptz + 2 * i * interval '1 millisecond'
         FROM generate_series(1, $3::bigint) AS i",
        &[&db.ispb(), &base, &n],
    )
    .await
    .unwrap();
    conn.execute(
        "INSERT INTO inbox (ispb, channel, resource_id, raw, slot, fence, received_at) VALUES ($1, 'cpm', 'RX', '\\x00', 1, 1, $2)",
        &[&db.ispb(), &base],
    )
    .await
    .unwrap();
}

/// Outbound rows: 100 sent 10·i ms after acceptance and confirmed 5 ms later; 1 queued; 1 rejected; 1 invalid.
async fn outbound(db: &TestDb, base: SystemTime) {
    let conn = db.pool.get().await.unwrap();
    conn.execute(
        "INSERT INTO outbound (ispb, msg_id, msg_type, channel, priority, deadline, status, raw, created_at, sent_at, confirmed_at, end_to_end_ids)
         SELECT $1, 'O' || i, 'pacs.008', 'cpm', 2, $2::timestamptz + interval '1 hour', 'confirmed', '\\x00', $2,
                $2::timestamptz + 10 * i * interval '1 millisecond', $2::timestamptz + (10 * i + 5) * interval '1 millisecond',
                ARRAY['E2E' || i, 'F' || i]
         FROM generate_series(1, 100) AS i",
        &[&db.ispb(), &base],
    )
    .await
    .unwrap();
    for (msg_id, status) in [("OQ", "queued"), ("OR", "rejected")] {
        conn.execute(
            "INSERT INTO outbound (ispb, msg_id, msg_type, channel, priority, deadline, status, raw, created_at)
             VALUES ($1, $2, 'pacs.008', 'cpm', 2, $3::timestamptz + interval '1 hour', $4, '\\x00', $3)",
            &[&db.ispb(), &msg_id, &base, &status],
        )
        .await
        .unwrap();
    }
    conn.execute(
        "INSERT INTO outbound (ispb, priority, deadline, status, raw, created_at) VALUES ($1, 2, $2, 'rejected_invalid', '\\x00', $2)",
        &[&db.ispb(), &base],
    )
    .await
    .unwrap();
}

fn reports(db: &TestDb) -> TimingReports {
    TimingReports { db: db.pool.clone(), ispb: db.ispb(), timeout: Duration::from_secs(30) }
}

#[tokio::test]
async fn figures_per_channel_and_stage_from_the_stored_timestamps() {
    let db = TestDb::new("timings", &[]).await;
    let base = SystemTime::now() - Duration::from_secs(600);
    inbound(&db, 1000, base).await;
    outbound(&db, base).await;
    let report = reports(&db).report(base - Duration::from_secs(1), SystemTime::now()).await.unwrap();
    let stage =
        |name: &str| report.stages.iter().find(|s| s.stage == name).unwrap_or_else(|| panic!("{name}: {report:?}"));
    let inbound = stage("persisted_to_published");
    // Delays 1..=1000 ms: p50 500.5, p95 950.05, p99 990.01, max 1000.
    assert_eq!((inbound.count, inbound.p50_ms, inbound.p95_ms, inbound.max_ms), (1000, 500.5, 950.05, 1000.0));
    assert_eq!(inbound.p99_ms, 990.01);
    let sent = stage("accepted_to_sent");
    assert_eq!(
        (sent.direction.as_str(), sent.channel.as_str(), sent.count, sent.p50_ms, sent.max_ms),
        ("outbound", "cpm", 100, 505.0, 1000.0)
    );
    let confirmed = stage("sent_to_confirmed");
    assert_eq!((confirmed.count, confirmed.p50_ms, confirmed.p99_ms), (100, 5.0, 5.0));
    assert_eq!(stage("accepted_to_confirmed").count, 100);
    let pending: Vec<(String, i64)> = report.pending.iter().map(|p| (p.stage.clone(), p.count)).collect();
    // The unpublished inbox row and the queued message; the rejected one never will be sent.
    assert_eq!(pending, [("persisted_to_published".to_owned(), 1), ("accepted_to_sent".to_owned(), 1)]);
    let md = report.markdown();
    assert!(md.contains("| inbound | cpm | persisted_to_published | 1000 | 500.5 | 950.0 | 990.0 | 1000.0 |"), "{md}");
    let empty = reports(&db).report(base - Duration::from_secs(99), base - Duration::from_secs(98)).await.unwrap();
    assert!(empty.stages.is_empty() && empty.markdown().contains("no message in the window"));
}

#[tokio::test]
async fn every_message_comes_once_in_the_csv_across_pages() {
    let db = TestDb::new("timings_csv", &[]).await;
    let base = SystemTime::now() - Duration::from_secs(600);
    inbound(&db, PAGE_ROWS + 7, base).await;
    outbound(&db, base).await;
    let r = reports(&db);
    let (from, to) = (base - Duration::from_secs(1), SystemTime::now());
    let (mut lines, mut next, mut pages) = (Vec::new(), Some((-1, 0)), 0);
    while let Some(after) = next {
        let (page, after) = r.page(from, to, after).await.unwrap();
        lines.extend(page);
        (next, pages) = (after, pages + 1);
    }
    assert_eq!(pages, 2);
    // Inbox rows (published or not), then the outbound messages with a MsgId.
    assert_eq!(lines.len() as i64, PAGE_ROWS + 8 + 102);
    let ids: std::collections::HashSet<&str> = lines.iter().map(|l| l.split(',').nth(2).unwrap()).collect();
    assert_eq!(ids.len(), lines.len(), "each message once");
    let first = lines.iter().find(|l| l.starts_with("outbound,cpm,O1,")).expect("O1");
    let cells: Vec<&str> = first.split(',').collect();
    assert_eq!(cells.len(), 9, "{first}");
    assert_eq!(cells[3], "E2E1 F1");
    assert!(cells[4].is_empty() && cells[5].is_empty() && !cells[6].is_empty() && !cells[8].is_empty(), "{first}");
}

#[tokio::test]
async fn the_bench_series_count_every_message_and_draw_a_cdf() {
    let db = TestDb::new("series", &[]).await;
    let base = SystemTime::now() - Duration::from_secs(600);
    inbound(&db, 1000, base).await;
    let s = cabine::bench::series::inbound(&db.pool).await.unwrap();
    assert_eq!(s.rates.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["persisted", "published"]);
    // 1001 rows persisted over 1 s, 1000 published over 2 s; 250 ms buckets.
    let count = |i: usize| s.rates[i].1.iter().map(|r| r * 0.25).sum::<f64>().round() as i64;
    assert_eq!((count(0), count(1)), (1001, 1000));
    assert_eq!(s.t_s.len(), 9, "{:?}", s.t_s);
    assert_eq!(s.cdf_of, "persisted_to_published");
    let median = s.cdf_quantiles.iter().position(|q| *q == 0.5).map(|i| s.cdf_ms[i]);
    assert_eq!(median, Some(500.5));
}
