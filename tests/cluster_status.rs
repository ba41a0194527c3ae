//! What an operator looks at: `cabine status --watch` under `tmux`,
//! `cabine report timings` (JSON and CSV) after 50 inbound messages, the
//! Grafana dashboard and the alert rules naming only series a live pod
//! exports (after inbound and outbound traffic), and the
//! live status page (`GET /`) in a real browser: Debian's `chromium`,
//! headless, against a local cluster (child simulator, 3 pods, a private Redis
//! so the test may stop it). The assertions read the DOM the page's script
//! rendered (`--dump-dom`), not the HTML the server sent: slot cells with their
//! holders, pods, the tree; after a pod is killed, its slots held elsewhere;
//! with Redis down, the degraded banner; after Redis comes back empty, the
//! quarantine banner. Screenshots of each moment are written beside the test
//! binary's temporary files and their paths printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod cluster_support;

use anyhow::{Context, ensure};
use cabine::harness::{LocalCluster, RedisServer};
use cluster_support::{TOKEN, eventually, exe, run, stream_holders};
use nix::sys::signal::Signal;

/// What chromium rendered at `url` after the page's script ran, and a screenshot of it.
fn render(url: &str, shot: &Path) -> anyhow::Result<String> {
    let dom = chromium(url, "--dump-dom".into())?;
    chromium(url, format!("--screenshot={}", shot.display()))?;
    ensure!(shot.exists(), "chromium wrote no screenshot at {}", shot.display());
    println!("screenshot: {}", shot.display());
    Ok(String::from_utf8(dom)?)
}

/// One headless Chromium run on `url` with `action` (its stdout), bounded by
/// [`CHROMIUM_BOUND`] and tried up to three times: Chromium's virtual time can
/// stall on a page whose fetches hang (the pod's Redis is down), and then it
/// never exits by itself.
fn chromium(url: &str, action: String) -> anyhow::Result<Vec<u8>> {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let profile = tempfile::tempdir()?;
        let out = Command::new("timeout")
            .args(["--kill-after=5", &CHROMIUM_BOUND.as_secs().to_string(), "chromium"])
            .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1400"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--virtual-time-budget=3000")
            .arg(&action)
            .arg(url)
            .output()
            .context("chromium under timeout (ops/deps.sh installs it)")?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        failures.push(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")));
    }
    anyhow::bail!("chromium {action} {url} failed three times: {failures:?}")
}

/// Wall-clock bound on one Chromium run (a page renders in a few seconds).
const CHROMIUM_BOUND: Duration = Duration::from_secs(20);

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// The `data-holder` of slot cell `slot` of the cpm stream pool in `dom`.
fn holder_in(dom: &str, slot: u64) -> Option<String> {
    let at = dom.find(&format!("data-slot=\"cpm:stream/{slot}\""))?;
    let cell = &dom[at..dom[at..].find('>').map_or(dom.len(), |e| at + e)];
    let h = cell.find("data-holder=\"")? + "data-holder=\"".len();
    Some(cell[h..h + cell[h..].find('"')?].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_slot_map_through_a_failover_a_redis_outage_and_a_quarantine() {
    let mut redis = RedisServer::start().await.expect("a private redis");
    let url = redis.url();
    let c = cluster_support::start(
        "cpage",
        3,
        &[&[("CABINE__REDIS__URL", url.as_str()), ("CABINE__DICT__ENABLED", "true")]],
    )
    .await;
    run(c, async |c: &mut LocalCluster| {
        let held =
            eventually(Duration::from_secs(20), || async { stream_holders(c, 0).await.is_ok_and(|h| h.len() == 4) })
                .await;
        ensure!(held, "every stream slot held");
        let page = cabine::harness::http_client().get(format!("http://{}/", c.pods[0].http)).send().await?;
        let policy = page.headers().get("content-security-policy").context("a CSP")?.to_str()?.to_owned();
        ensure!(policy.contains("script-src 'self'"), "{policy}");
        let dir = shots();

        // Normal operation: every cell shows the holder /cluster names.
        let holders = stream_holders(c, 0).await?;
        let dom = render(&format!("http://{}/", c.pods[0].http), &dir.join("1-normal.png"))?;
        for (slot, pod) in &holders {
            ensure!(
                holder_in(&dom, *slot).as_deref() == Some(pod.as_str()),
                "slot {slot}: {:?} ≠ {pod}",
                holder_in(&dom, *slot)
            );
        }
        for pod in &c.pods {
            ensure!(dom.contains(&format!("data-pod=\"{}\"", pod.pod_id)), "pod {} listed", pod.pod_id);
        }
        ensure!(dom.contains("data-actor=\"root\"") && dom.contains("data-alerts=\"none\""), "tree and no alert");
        ensure!(
            dom.contains("data-actor=\"dict\"") && dom.contains("participant_tokens"),
            "the DICT's node and its bucket"
        );
        ensure!(!dom.contains("data-banner"), "no banner in normal operation");
        ensure!(dom.contains("data-lag=\"0\""), "nothing waiting for the bus");

        // Failover: the victim's slots go to the survivors.
        let victim = c.pods.iter().position(|p| holders.values().any(|h| *h == p.pod_id)).context("a holder")?;
        let victim_id = c.pods[victim].pod_id.clone();
        let survivor = (0..c.pods.len()).find(|i| *i != victim).context("a survivor")?;
        c.pods[victim].signal(Signal::SIGKILL);
        let at = format!("http://{}/", c.pods[survivor].http);
        let dom = render(&at, &dir.join("2-failover-killed.png"))?;
        ensure!(dom.contains(&format!("data-holder=\"{victim_id}\"")), "right after the kill its leases still run");
        let moved = eventually(Duration::from_secs(10), || async {
            stream_holders(c, survivor).await.is_ok_and(|h| h.len() == 4 && h.values().all(|p| *p != victim_id))
        })
        .await;
        ensure!(moved, "the victim's slots held elsewhere");
        let dom = render(&at, &dir.join("3-failover-resumed.png"))?;
        ensure!(!dom.contains(&format!("data-holder=\"{victim_id}\"")), "no cell held by the dead pod");
        ensure!((1..=4).all(|s| holder_in(&dom, s).is_some_and(|h| !h.is_empty())), "every cell held again");

        // Redis down: the page says what this pod cannot read.
        redis.stop();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let dom = render(&at, &dir.join("4-redis-down.png"))?;
        ensure!(dom.contains("data-banner=\"degraded\""), "the degraded banner");

        // Redis back without its keys: amnesia, the lease quarantine.
        redis.restart().await?;
        let quarantined = eventually(Duration::from_secs(10), || async {
            c.pod_json(survivor, "/cluster").await.is_ok_and(|v| !v["quarantine"].is_null())
        })
        .await;
        ensure!(quarantined, "a quarantine after Redis came back empty");
        let dom = render(&at, &dir.join("5-quarantine.png"))?;
        ensure!(dom.contains("data-banner=\"quarantine\""), "the quarantine banner");
        ensure!(dom.contains("data-state=\"quarantined\""), "cells drawn quarantined");
        Ok(())
    })
    .await;
}

/// 50 inbound messages, then `cabine report timings` as JSON and as CSV through a pod.
async fn timing_report(c: &LocalCluster) -> anyhow::Result<()> {
    let from = humantime::format_rfc3339_seconds(std::time::SystemTime::now() - Duration::from_secs(60)).to_string();
    c.sim.control.inject_json(serde_json::json!({ "count": 50, "kind": "pacs008", "rate_per_s": 500.0 })).await?;
    let published = eventually(Duration::from_secs(20), || async {
        c.inbox_count("published_at IS NOT NULL").await.unwrap_or(0) >= 50
    })
    .await;
    ensure!(published, "50 messages persisted and published");
    let pod = format!("http://{}", c.pods[0].http);
    let ask = |format: &str| {
        Command::new(exe())
            .args(["report", "--pod", &pod, "--token", TOKEN, "timings", "--from", &from, "--format", format])
            .output()
    };
    let json = ask("json")?;
    ensure!(json.status.success(), "report timings: {}", String::from_utf8_lossy(&json.stderr));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    let inbound = report["stages"].as_array().and_then(|s| s.iter().find(|s| s["stage"] == "persisted_to_published"));
    ensure!(inbound.is_some_and(|s| s["count"] == 50 && s["p99_ms"].as_f64() > Some(0.0)), "{report}");
    let csv = ask("csv")?;
    ensure!(csv.status.success(), "report timings --format csv: {}", String::from_utf8_lossy(&csv.stderr));
    let text = String::from_utf8(csv.stdout)?;
    ensure!(
        text.starts_with(cabine::timings::CSV_HEADER)
            && text.lines().filter(|l| l.starts_with("inbound,cpm,")).count() == 50,
        "{text}"
    );
    Ok(())
}

/// Metric names in `text` (PromQL or a dashboard): every `cabine_…` word.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|ch: char| !(ch.is_ascii_lowercase() || ch == '_'))
        .filter(|w| w.starts_with("cabine_"))
        .map(str::to_owned)
        .collect()
}

/// 20 outbound messages confirmed, then every series the dashboard and the alert rules name is on some pod's `/metrics`.
async fn dashboards_name_live_series(c: &LocalCluster) -> anyhow::Result<()> {
    use cabine::harness::outbound::{OutboundFeed, Request, pacs008_bodies};
    let ids = OutboundFeed::of(c)
        .publish_all(&pacs008_bodies(&c.settings.cluster.ispb, 20), Request::default())
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(ids.len() == 20);
    let confirmed = eventually(Duration::from_secs(20), || async {
        c.query("SELECT count(*) FROM outbound WHERE status = 'confirmed'")
            .await
            .is_ok_and(|r| r[0].get::<_, i64>(0) == 20)
    })
    .await;
    ensure!(confirmed, "20 outbound messages confirmed");
    let mut live = std::collections::BTreeSet::new();
    for pod in &c.pods {
        let text =
            cabine::harness::http_client().get(format!("http://{}/metrics", pod.http)).send().await?.text().await?;
        live.extend(
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).map(str::to_owned),
        );
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for file in ["ops/grafana/cabine.json", "ops/prometheus/rules.yml"] {
        let named = metric_names(&std::fs::read_to_string(root.join(file))?);
        let missing: Vec<&String> = named.iter().filter(|m| !live.contains(*m)).collect();
        ensure!(missing.is_empty(), "{file} names series no live pod exports: {missing:?}");
    }
    Ok(())
}

/// `tmux` on a socket of its own (a fresh server: this test's environment, nobody else's sessions).
fn tmux(socket: &str, args: &[&str]) -> anyhow::Result<String> {
    let out =
        Command::new("tmux").args(["-L", socket]).args(args).output().context("tmux (ops/deps.sh installs it)")?;
    ensure!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_timing_report_and_dashboards_against_a_running_cluster() {
    let c = cluster_support::start("cstat", 2, &[&[("CABINE__DICT__ENABLED", "true")]]).await;
    run(c, async |c: &mut LocalCluster| {
        let held =
            eventually(Duration::from_secs(20), || async { stream_holders(c, 0).await.is_ok_and(|h| h.len() == 4) })
                .await;
        ensure!(held, "every stream slot held");
        let once =
            Command::new(exe()).args(["status", "--json", "--pod", &format!("http://{}", c.pods[0].http)]).output()?;
        ensure!(once.status.success(), "cabine status --json: {}", String::from_utf8_lossy(&once.stderr));
        let views: serde_json::Value = serde_json::from_slice(&once.stdout)?;
        ensure!(
            views["cluster"]["pods"].as_array().map(Vec::len) == Some(2) && views["actors"]["id"] == "root",
            "{views}"
        );
        timing_report(c).await?;
        dashboards_name_live_series(c).await?;
        let socket = cabine::harness::unique_name("status");
        let watch = format!("{} status --pod http://{} --watch --interval 300ms", exe().display(), c.pods[0].http);
        tmux(&socket, &["new-session", "-d", "-s", "w", "-x", "180", "-y", "60", &watch])?;
        let outcome = async {
            let capture =
                |colours: bool| tmux(&socket, &["capture-pane", "-p", if colours { "-e" } else { "-J" }, "-t", "w"]);
            let (a, b) = (c.pods[0].pod_id.clone(), c.pods[1].pod_id.clone());
            let both = eventually(Duration::from_secs(10), || async {
                capture(false).is_ok_and(|t| t.contains(&format!("{a}  pid")) && t.contains(&format!("{b}  pid")))
            })
            .await;
            let screen = capture(false)?;
            ensure!(both, "both pods listed:\n{screen}");
            ensure!(screen.contains("SLOTS") && screen.contains("cpm  stream 4"), "the slot map:\n{screen}");
            ensure!(capture(true)?.contains("\x1b["), "colours on a terminal");
            // The second pod dies: the same screen, redrawn, ends up with every slot on the first.
            c.pods[1].signal(Signal::SIGKILL);
            let moved = eventually(Duration::from_secs(20), || async {
                capture(false).is_ok_and(|t| {
                    !t.contains(&b) && (1..=4).all(|n| t.contains(&format!("cpm  stream {n}  {a} lease")))
                })
            })
            .await;
            let screen = capture(false)?;
            ensure!(moved, "every slot on {a}, {b} gone:\n{screen}");
            ensure!(screen.matches("SLOTS").count() == 1, "redrawn in place, not scrolled:\n{screen}");
            Ok(())
        }
        .await;
        let _ = tmux(&socket, &["kill-server"]);
        outcome
    })
    .await;
}
