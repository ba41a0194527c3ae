//! Failures: the shared breaker (open → rows wait, nothing sent; 4xx never
//! trips it), 429 with Retry-After, poison messages, deadlines while open, and
//! rows in doubt (posted with an unknown outcome, then past their deadline).

use cabine_actors::ports::SendReply;
use cabine_actors::ports::breaker::{BreakerState, CircuitBreaker};
use cabine_actors::ports::outbound::{OutboundStatus as S, OutboundStore, Priority, Reprocessed};
use cabine_actors::ports::outbound_bus::ResultStatus;

use super::*;

#[tokio::test(start_paused = true)]
async fn an_open_breaker_sends_nothing_rows_wait_and_flow_after_it_closes() {
    let world = world(1, |_| {});
    world.icom_out.set_failing(Some(503));
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    let all = ids("F", 10);
    publish(&world, &all, Priority::Normal, 120);
    eventually("breaker open", ms(5000), || world.breaker.current(CPM) == BreakerState::Open).await;
    let posts = world.icom_out.audit(CPM).posts;
    assert_eq!(posts, 5, "exactly the consecutive-failure threshold reached ICOM");
    tokio::time::sleep(ms(1800)).await;
    assert_eq!(world.icom_out.audit(CPM).posts, posts, "nothing sent while OPEN");
    assert!(all.iter().all(|id| matches!(status(&world, id), Some(S::Queued))), "rows wait");
    // The first probe still fails: one more call, open again.
    eventually("re-opened after a failed probe", ms(3000), || world.breaker.audit(CPM).opened == 2).await;
    assert_eq!(world.icom_out.audit(CPM).posts, 6, "threshold plus one probe");
    world.icom_out.set_failing(None);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    assert_eq!(world.breaker.current(CPM), BreakerState::Closed);
    let a = world.icom_out.audit(CPM);
    assert_eq!((a.server_errors, a.stored), (6, 10));
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn rows_taken_beside_an_admission_that_fails_go_back_unsent_and_not_as_an_attempt() {
    let world = world(1, |_| {});
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    publish(&world, &["B0".into()], Priority::Normal, 60);
    all_in(&world, &["B0".into()], S::Sent, ms(5000)).await;
    // Last seen closed: the next take runs beside the admission, which now fails.
    world.breaker.set_down(true);
    let all = ids("B", 5);
    publish(&world, &all, Priority::Normal, 60);
    eventually("a take beside the failed admission, given back", ms(5000), || {
        world
            .outbound
            .history()
            .iter()
            .any(|h| h.detail.as_deref().is_some_and(|d| d.contains("breaker did not admit")))
    })
    .await;
    tokio::time::sleep(ms(1500)).await;
    assert_eq!(world.icom_out.audit(CPM).posts, 1, "nothing posted without an admission");
    let churned = world
        .outbound
        .history()
        .iter()
        .filter(|h| h.detail.as_deref().is_some_and(|d| d.contains("breaker did not admit")))
        .count();
    assert_eq!(churned, 5, "taken and given back once; later turns ask the breaker first");
    for id in &all {
        let row = world.outbound.row(id).unwrap();
        assert_eq!((row.status, row.attempts), (S::Queued, 0), "{id}: back unsent, not an attempt");
    }
    world.breaker.set_down(false);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    assert!(all.iter().all(|id| world.outbound.row(id).unwrap().attempts == 1));
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn client_errors_reject_rows_and_never_open_the_breaker() {
    let world = world(1, |_| {});
    let refused = ids("X", 8);
    for id in &refused {
        world.icom_out.refuse(id, 400);
    }
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    publish(&world, &refused, Priority::Normal, 60);
    let good = ids("G", 3);
    publish(&world, &good, Priority::Normal, 60);
    all_in(&world, &refused, S::Rejected, ms(5000)).await;
    all_in(&world, &good, S::Sent, ms(5000)).await;
    assert_eq!(world.breaker.audit(CPM).opened, 0);
    assert_eq!(world.results.count(ResultStatus::Rejected), 8);
    assert!(refused.iter().all(|id| world.outbound.row(id).unwrap().attempts == 1), "never retried");
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_429_waits_retry_after_and_does_not_count_an_attempt() {
    let world = world(1, |_| {});
    let wait = ms(400);
    world.icom_out.script((0..3).map(|_| SendReply::RateLimited { retry_after: Some(wait) }));
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    publish(&world, &["L1".into()], Priority::Normal, 60);
    all_in(&world, &["L1".into()], S::Sent, ms(5000)).await;
    let log = world.icom_out.log();
    assert_eq!(
        log.iter().map(|r| r.reply).collect::<Vec<_>>(),
        ["rate_limited", "rate_limited", "rate_limited", "accepted"]
    );
    for pair in log.windows(2) {
        assert!(pair[1].at - pair[0].at >= wait, "the sender paused for Retry-After: {log:?}");
    }
    assert_eq!(world.outbound.row("L1").unwrap().attempts, 1, "429s are not attempts");
    assert_eq!(world.breaker.audit(CPM).opened, 0);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_poison_message_is_dead_after_n_attempts_while_the_rest_flow() {
    let world = world(1, |s| s.outbound.policy.poison_attempts = 3);
    world.icom_out.poison("P", 500);
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    let good = ids("H", 5);
    publish(&world, &["P".into()], Priority::Normal, 120);
    publish(&world, &good, Priority::Normal, 120);
    all_in(&world, &good, S::Sent, ms(5000)).await;
    eventually("P dead", ms(10_000), || status(&world, "P") == Some(S::Dead)).await;
    assert_eq!(world.outbound.row("P").unwrap().attempts, 3);
    assert_eq!(world.results.statuses("P").last(), Some(&ResultStatus::Dead));
    assert_eq!(world.icom_out.stored("P"), 0);

    // Reprocessed after the fix: queued again with the same MsgId, then sent.
    world.icom_out.clear_faults();
    assert!(matches!(world.outbound.reprocess("P").await.unwrap(), Reprocessed::Queued(_)));
    all_in(&world, &["P".into()], S::Sent, ms(5000)).await;
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passing_while_the_breaker_is_open_times_out_and_is_never_sent() {
    let world = world(1, |s| s.outbound.breaker.break_time = ms(3000));
    world.icom_out.set_failing(Some(503));
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    eventually("leader elected", ms(3000), || state_of(&tree, "leader") == "leading").await;
    publish(&world, &ids("F", 5), Priority::Normal, 120);
    eventually("breaker open", ms(5000), || world.breaker.current(CPM) == BreakerState::Open).await;
    world.icom_out.set_failing(None);
    let saque = "T-saque-troco".to_owned();
    publish(&world, std::slice::from_ref(&saque), Priority::Critical, 1);
    eventually("timed out while open", ms(2500), || status(&world, &saque) == Some(S::Timeout)).await;
    assert_eq!(world.breaker.current(CPM), BreakerState::Open, "expired by the deadline, not sent");
    all_in(&world, &ids("F", 5), S::Sent, ms(10_000)).await;
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(world.icom_out.stored(&saque), 0, "never sent afterwards");
    assert_eq!(status(&world, &saque), Some(S::Timeout));
    assert_eq!(world.results.statuses(&saque), vec![ResultStatus::Accepted, ResultStatus::Timeout]);
    assert!(detail(&tree, "outbound-janitor", "expired") >= 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_row_whose_posts_may_have_been_stored_is_in_doubt_at_its_deadline_until_the_spi_decides() {
    let world = world(1, |s| s.outbound.policy.poison_attempts = 100);
    world.icom_out.poison("D1", 503);
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    eventually("leader elected", ms(3000), || state_of(&tree, "leader") == "leading").await;
    publish(&world, &["D1".into()], Priority::Critical, 2);
    eventually("in doubt", ms(6000), || status(&world, "D1") == Some(S::InDoubt)).await;
    let posts = world.icom_out.audit(CPM).posts;
    assert!(posts >= 1, "it was posted, and a 503 may have stored it");
    assert_eq!(world.results.statuses("D1"), vec![ResultStatus::Accepted, ResultStatus::InDoubt], "not timeout");
    world.icom_out.clear_faults();
    tokio::time::sleep(ms(3000)).await;
    assert_eq!(world.icom_out.audit(CPM).posts, posts, "never sent again by itself");
    assert_eq!(status(&world, "D1"), Some(S::InDoubt));
    // The SPI had stored a copy after all: its pacs.002 settles it.
    eventually("slot polling", ms(3000), || state_of(&tree, "slot/cpm/1") == "polling").await;
    world.icom.inject(CPM, [cabine_actors::testkit::status_report("r1", "ED1", true)]);
    eventually("confirmed", ms(3000), || status(&world, "D1") == Some(S::Confirmed)).await;
    let heard = world.results.statuses("D1");
    assert_eq!(heard, vec![ResultStatus::Accepted, ResultStatus::InDoubt, ResultStatus::Confirmed]);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_reset_breaker_resumes_the_paused_senders_before_the_break_time() {
    let world = world(1, |s| s.outbound.breaker.break_time = ms(60_000));
    world.icom_out.set_failing(Some(503));
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(2))).await;
    let all = ids("R", 4);
    publish(&world, &all, Priority::Normal, 300);
    eventually("breaker open", ms(5000), || world.breaker.current(CPM) == BreakerState::Open).await;
    tokio::time::sleep(ms(1000)).await;
    let posts = world.icom_out.audit(CPM).posts;
    world.icom_out.set_failing(None);
    world.breaker.reset(CPM).await.unwrap();
    // One status probe (200 ms) sees it closed; the senders paused for a minute resume.
    all_in(&world, &all, S::Sent, ms(3000)).await;
    assert_eq!(world.icom_out.audit(CPM).posts, posts + 4, "every row sent once after the reset");
    assert_eq!(world.breaker.audit(CPM).opened, 1);
    tree.shutdown().await;
}
