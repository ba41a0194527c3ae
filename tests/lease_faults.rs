//! Leased slots under faults, with real processes and private redis-servers:
//! Redis restarted (keys gone), Redis unreachable, a holder process SIGSTOPped
//! past its lease, and 3 processes with random hold times judged by a server
//! that counts concurrent requests on its side.

mod lease_support;

use std::path::Path;
use std::time::Duration;

use cabine::bench::judge::{Judge, JudgeClient, Sent};
use cabine::bench::lease::{LeaseBench, worker_command};
use cabine::bench::lease_worker::{BENCH_POOL, WorkerReport, lease_config};
use cabine::harness::RedisServer;
use cabine::redis::RedisLeaseStore;
use cabine_actors::ports::{Acquired, Lease, LeaseError, LeaseStore, LostCause, Pool};
use lease_support::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use proptest::prelude::*;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

const EXE: &str = env!("CARGO_BIN_EXE_cabine");

#[tokio::test]
async fn redis_restart_loses_every_lease_within_one_heartbeat_and_nothing_is_granted_for_lease_plus_lock_delay() {
    let mut server = RedisServer::start().await.unwrap();
    let cluster = Cluster::on(&server.url()).await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let mut held = vec![granted(&a, STREAM, None).await, granted(&a, Pool::Leader, None).await];
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.tick().await;

    server.restart().await.unwrap();
    let restarted = Instant::now();
    let (lost_at, outcome) = loop {
        heartbeat.tick().await;
        let out = a.renew_many(&held).await.unwrap();
        if out.iter().any(Result::is_err) {
            break (Instant::now(), out);
        }
        held = out.into_iter().map(Result::unwrap).collect();
    };
    assert!(lost_at - restarted <= HEARTBEAT + COMMAND_TIMEOUT, "lost after {:?}", lost_at - restarted);
    for r in &outcome {
        assert!(matches!(r, Err(LostCause::Amnesia | LostCause::Unreachable)), "{outcome:?}");
    }

    let (_, got_at) = first_grant(&b, STREAM, TTL + Duration::from_secs(2)).await.expect("grants resume");
    assert!(got_at >= restarted + TTL, "granted {:?} after the restart", got_at - restarted);
    assert!(matches!(a.acquire(Pool::Leader, None).await, Ok(Acquired::Granted(_) | Acquired::Full)));
}

#[tokio::test]
async fn unreachable_redis_fails_closed_with_a_typed_error_within_the_command_timeout() {
    let mut server = RedisServer::start().await.unwrap();
    let cluster = Cluster::on(&server.url()).await;
    let a = cluster.pod("a").await;
    boot(&a).await;
    let (one, two) = (granted(&a, STREAM, None).await, granted(&a, STREAM, None).await);
    server.stop();

    let started = Instant::now();
    let (acquired, renewed, renewed_many, released, holders) = tokio::join!(
        a.acquire(Pool::Leader, None),
        a.renew(&one),
        a.renew_many(std::slice::from_ref(&two)),
        a.release(&two),
        a.holders(STREAM),
    );
    let bound = COMMAND_TIMEOUT + Duration::from_millis(200);
    assert!(started.elapsed() <= bound, "took {:?}", started.elapsed());
    assert!(matches!(acquired, Err(LeaseError::Unavailable(_))), "{acquired:?}");
    assert_eq!(renewed, Err(LeaseError::Lost(LostCause::Unreachable)));
    assert_eq!(renewed_many, Ok(vec![Err(LostCause::Unreachable)]));
    assert!(matches!(released, Err(LeaseError::Unavailable(_))), "{released:?}");
    assert!(matches!(holders, Err(LeaseError::Unavailable(_))), "{holders:?}");
    tokio::time::sleep_until(one.valid_until.max(two.valid_until)).await;
    assert!(!one.is_valid() && !two.is_valid(), "holders stop at valid_until");
}

#[tokio::test]
async fn a_redis_that_never_answered_fails_closed_too() {
    let port = cabine::harness::free_port().unwrap();
    let client = cabine::redis::connect(&redis_settings(&format!("redis://127.0.0.1:{port}"))).unwrap();
    let cluster = Cluster::shared().await;
    let store = RedisLeaseStore::new(client, cluster.config("lonely"));
    let started = Instant::now();
    let acquired = store.acquire(Pool::Leader, None).await;
    assert!(matches!(acquired, Err(LeaseError::Unavailable(_))), "{acquired:?}");
    assert!(started.elapsed() <= COMMAND_TIMEOUT + Duration::from_millis(200), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_holder_process_paused_for_two_leases_sends_nothing_on_resume_and_the_judge_never_sees_more_than_the_cap() {
    let cluster = Cluster::shared().await;
    let judge = Judge::start().await.unwrap();
    let plan = bench_plan(1, 1, Duration::from_secs(4));
    let args = plan.worker_args(&cluster.url, &cluster.prefix, judge.addr());
    let b = RedisLeaseStore::new(cluster.client.clone(), lease_config(&args, &settings(), "b"));
    boot_pool(&b).await;

    let mut worker = worker_command(Path::new(EXE), &args).spawn().unwrap();
    let pid = worker.id().unwrap();
    let tag = format!("w{pid}");
    let mut arrivals = judge.arrivals();
    while judge.requests_from(&tag) == 0 {
        tokio::time::timeout(Duration::from_secs(5), arrivals.changed()).await.unwrap().unwrap();
    }
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap(); // mid-request: it holds the only slot
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent_before_pause = judge.requests_from(&tag);

    let (lease, _) = first_grant(&b, BENCH_POOL, LEASE * 2).await.expect("b takes the slot after lease + lock_delay");
    let resume_at = stopped + LEASE * 2;
    assert!(Instant::now() < resume_at, "b holds before the worker resumes");
    let resumer = tokio::spawn(async move {
        tokio::time::sleep_until(resume_at).await;
        kill(Pid::from_raw(pid as i32), Signal::SIGCONT).unwrap();
    });
    let lease = hold_and_request(&b, lease, &judge, resume_at + Duration::from_millis(600)).await;
    resumer.await.unwrap();
    assert_eq!(judge.requests_from(&tag), sent_before_pause, "the resumed worker sent nothing while b held the slot");
    b.release(&lease).await.unwrap();

    let report = worker_report(&mut worker).await;
    assert!(report.expired_before_send >= 1, "the worker found its lease expired: {report:?}");
    assert_eq!(judge.max_concurrent(), 1, "never more than the cap of 1");
    cluster.cleanup().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, failure_persistence: None, ..ProptestConfig::default() })]

    /// 3 processes × T tasks, each request held 1–50 ms at random, one pool of `cap`.
    #[test]
    fn three_processes_with_random_hold_times_never_exceed_the_cap(cap in 1u8..=6, tasks in 2u32..=5) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let report = runtime.block_on(async {
            let plan = LeaseBench { cap, ..bench_plan(3, tasks, Duration::from_secs(2)) };
            cabine::bench::lease::run(&plan, Path::new(EXE), &settings()).await.unwrap()
        });
        prop_assert!(report.max_concurrent_observed <= u64::from(cap), "{report:?}");
        prop_assert!(report.max_concurrent_observed >= 1 && report.grants >= u64::from(cap), "{report:?}");
        prop_assert_eq!(report.errors, 0);
    }
}

fn bench_plan(processes: u32, tasks: u32, run: Duration) -> LeaseBench {
    LeaseBench {
        processes,
        tasks,
        run,
        pause_holder: false,
        restart_redis: false,
        cap: 1,
        lease: LEASE,
        lock_delay: LOCK_DELAY,
        drift_margin: DRIFT,
        request_timeout: Duration::from_millis(150),
    }
}

/// Waits out the brand-new cluster's quarantine on the bench pool.
async fn boot_pool(store: &RedisLeaseStore) {
    let Acquired::Quarantined { remaining } = store.acquire(BENCH_POOL, None).await.unwrap() else {
        panic!("a brand-new cluster starts quarantined");
    };
    tokio::time::sleep(remaining).await;
}

/// Holds `lease` until `until`: requests held 20 ms, renewed every heartbeat.
async fn hold_and_request(store: &RedisLeaseStore, mut lease: Lease, judge: &Judge, until: Instant) -> Lease {
    let mut client = JudgeClient::new(judge.addr(), "b");
    let mut renew_at = Instant::now() + HEARTBEAT;
    while Instant::now() < until {
        let sent = client.request(&lease, Duration::from_millis(20), Duration::from_millis(150)).await.unwrap();
        assert_eq!(sent, Sent::Answered);
        if Instant::now() >= renew_at {
            lease = store.renew(&lease).await.unwrap();
            renew_at = Instant::now() + HEARTBEAT;
        }
    }
    lease
}

async fn worker_report(worker: &mut tokio::process::Child) -> WorkerReport {
    let mut out = String::new();
    worker.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
    assert!(worker.wait().await.unwrap().success());
    serde_json::from_str(out.lines().last().unwrap()).unwrap()
}
