//! Operability on the real binary and services: `postgres.migrate_on_start`
//! creates the JetStream streams; a missing stream is one clear error in
//! `/health/ready` and `/cluster`; every metric has HELP text — in the sources
//! of both crates, and on a live pod's `/metrics` as `promtool check metrics`
//! judges it (Debian's `prometheus` package, installed by `ops/deps.sh`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cabine::config::{DEFAULT_TOML, Settings};
use cabine::harness::{Pod, cluster, http_client, isolated_env, unique_name};
use cabine::sim::{SimConfig, Simulator};
use regex::Regex;

const EXE: &str = env!("CARGO_BIN_EXE_cabine");

fn settings_of(env: &[(String, String)]) -> Settings {
    let map = env.iter().cloned().collect();
    Settings::from_sources(DEFAULT_TOML, None, &map).unwrap()
}

async fn jetstream(settings: &Settings) -> async_nats::jetstream::Context {
    let nats = tokio::time::timeout(Duration::from_secs(10), async_nats::connect(&settings.nats.url)).await;
    async_nats::jetstream::new(nats.expect("NATS answers").expect("NATS connects"))
}

async fn cleanup(settings: &Settings) {
    let pool = cabine::db::pool(&settings.postgres).unwrap();
    if let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(5), pool.get()).await {
        let _ = conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", settings.postgres.schema)).await;
    }
    let js = jetstream(settings).await;
    let n = &settings.nats;
    for stream in [&n.inbound_stream, &n.outbound_stream, &n.results_stream] {
        let _ = js.delete_stream(stream).await;
    }
}

#[tokio::test]
async fn migrate_on_start_creates_the_jetstream_streams() {
    let name = unique_name("mos");
    let mut env = isolated_env(&name);
    env.push(("CABINE__POSTGRES__MIGRATE_ON_START".into(), "true".into()));
    let settings = settings_of(&env);
    let js = jetstream(&settings).await;
    assert!(js.get_stream(&settings.nats.inbound_stream).await.is_err(), "a unique stream name, not there yet");
    let mut pod = Pod::spawn(Path::new(EXE), &env).await.unwrap();
    let ready = pod.wait_ready(Duration::from_secs(30)).await;
    let n = &settings.nats;
    let mut found = BTreeMap::new();
    for stream in [&n.inbound_stream, &n.outbound_stream, &n.results_stream] {
        found.insert(stream.clone(), js.get_stream(stream).await.is_ok());
    }
    pod.terminate(Duration::from_secs(15)).await.unwrap();
    cleanup(&settings).await;
    ready.unwrap();
    assert!(found.values().all(|f| *f), "every stream created at start: {found:?}");
}

#[tokio::test]
async fn a_missing_stream_is_one_clear_error_in_readiness_and_cluster() {
    let name = unique_name("nostream");
    let env = isolated_env(&name);
    let settings = settings_of(&env);
    let pool = cabine::db::pool(&settings.postgres).unwrap();
    cabine::db::migrate(&pool, &settings.postgres.schema).await.expect("postgres migrated, streams not created");
    let mut pod = Pod::spawn(Path::new(EXE), &env).await.unwrap();
    let http = http_client();
    let mut ready = (0, serde_json::Value::Null);
    for _ in 0..100 {
        let r = http.get(format!("http://{}/health/ready", pod.http)).send().await.unwrap();
        ready = (r.status().as_u16(), r.json().await.unwrap());
        let checked = ["redis", "postgres", "migrations", "nats"].iter().all(|c| ready.1["checks"][c]["ok"] == true);
        if checked {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let view: serde_json::Value =
        http.get(format!("http://{}/cluster", pod.operator)).send().await.unwrap().json().await.unwrap();
    pod.terminate(Duration::from_secs(15)).await.unwrap();
    cleanup(&settings).await;

    let (status, body) = ready;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["failing"], serde_json::json!(["jetstream"]), "only the streams fail: {body}");
    let detail = body["checks"]["jetstream"]["detail"].as_str().unwrap_or_default();
    let n = &settings.nats;
    for stream in [&n.inbound_stream, &n.outbound_stream, &n.results_stream] {
        assert!(detail.contains(stream.as_str()), "names {stream}: {detail}");
    }
    assert!(detail.contains("cabine migrate") && detail.contains("migrate_on_start"), "says what to do: {detail}");
    let errors: Vec<&str> = view["errors"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
    let about_streams: Vec<&&str> = errors.iter().filter(|e| e.contains(n.inbound_stream.as_str())).collect();
    assert_eq!(about_streams.len(), 1, "one error line in /cluster: {errors:?}");
    assert!(about_streams[0].starts_with("jetstream: missing stream"), "{errors:?}");
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_metric_recorded_in_either_crate_is_described() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("actors/src"), &mut files);
    let texts: Vec<(PathBuf, String)> =
        files.into_iter().map(|f| (f.clone(), std::fs::read_to_string(f).unwrap())).collect();
    let constant = Regex::new(r#"const ([A-Z_][A-Z0-9_]*): &str = "(cabine_[a-z0-9_]+)""#).unwrap();
    let constants: BTreeMap<String, String> = texts
        .iter()
        .flat_map(|(_, t)| constant.captures_iter(t).map(|c| (c[1].to_owned(), c[2].to_owned())).collect::<Vec<_>>())
        .collect();
    let call = Regex::new(
        r#"(describe_)?(?:counter|gauge|histogram)!\(\s*(?:"(cabine_[a-z0-9_]+)"|(?:[a-z_]+::)*([A-Z_][A-Z0-9_]*))"#,
    )
    .unwrap();
    let (mut recorded, mut described) = (BTreeMap::new(), BTreeSet::new());
    for (file, text) in &texts {
        for c in call.captures_iter(text) {
            let name = c.get(2).map(|m| m.as_str().to_owned()).or_else(|| constants.get(&c[3]).cloned());
            let name = name.unwrap_or_else(|| panic!("{}: a metric name I cannot read: {}", file.display(), &c[0]));
            if c.get(1).is_some() {
                described.insert(name);
            } else {
                recorded.entry(name).or_insert_with(|| file.display().to_string());
            }
        }
    }
    assert!(recorded.len() > 50, "the scan finds the metrics: {recorded:?}");
    let undescribed: Vec<_> = recorded.iter().filter(|(n, _)| !described.contains(*n)).collect();
    assert!(undescribed.is_empty(), "metrics without HELP text (name, where recorded): {undescribed:?}");
}

#[tokio::test]
async fn promtool_finds_nothing_to_say_about_a_live_pods_metrics() {
    let Ok(promtool) = which("promtool") else {
        eprintln!("SKIPPED: promtool is not installed (ops/deps.sh installs Debian's prometheus package)");
        return;
    };
    cabine::install_crypto_provider();
    let mut cfg = SimConfig::new(vec!["99999010".parse().unwrap()]);
    cfg.hold = Duration::from_millis(200);
    let sim = Simulator::start(cfg).await.unwrap();
    let name = unique_name("prom");
    let mut env = isolated_env(&name);
    env.extend(cluster::test_timings());
    env.push(("CABINE__POSTGRES__MIGRATE_ON_START".into(), "true".into()));
    env.push(("CABINE__ICOM__CHANNELS__CPM__BASE_URL".into(), format!("http://{}", sim.primary)));
    let settings = settings_of(&env);
    let mut pod = Pod::spawn(Path::new(EXE), &env).await.unwrap();
    pod.wait_ready(Duration::from_secs(30)).await.unwrap();
    let http = http_client();
    let inject = serde_json::json!({ "count": 20, "kind": "pacs008" });
    http.post(format!("http://{}/sim/inject", sim.control)).json(&inject).send().await.unwrap();
    let metrics_url = format!("http://{}/metrics", pod.http);
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        if metrics.contains("cabine_inbound_messages_total{channel=\"cpm\",stage=\"persisted\"} 20") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pod.terminate(Duration::from_secs(15)).await.unwrap();
    sim.shutdown().await;
    cleanup(&settings).await;
    assert!(metrics.contains("stage=\"persisted\"} 20"), "the pod delivered the messages:\n{metrics}");
    let judged = promtool_check(&promtool, &metrics);
    assert!(judged.is_empty(), "promtool check metrics:\n{judged}");
    let families = metrics.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let helps = metrics.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(families, helps, "every family has HELP text");
}

/// What `promtool check metrics` prints about `text` (empty: nothing to say).
fn promtool_check(promtool: &Path, text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn which(command: &str) -> Result<PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path).map(|d| d.join(command)).find(|p| p.is_file()).ok_or(())
}
