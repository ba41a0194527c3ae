//! Secure defaults on the real binary: a pod whose operator endpoints listen
//! beyond loopback refuses to start (exit 64, naming the key) with the shipped,
//! an empty or a short token; payment reads need the read (or admin) token and
//! the operator endpoints can have a listener of their own; no credential (URL
//! password, NATS token, secret query parameter) shows in `check-config`, in a
//! connect error, in the logs, in readiness or in `/cluster`.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cabine::harness::{Pod, free_port, http_client, isolated_env, unique_name};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

const EXE: &str = env!("CARGO_BIN_EXE_cabine");
const ADMIN: &str = "admin-token-0123456789";
const READ: &str = "read-token-0123456789";

fn cabine(command: &str, env: &[(&str, &str)]) -> Output {
    Command::new(EXE).arg(command).envs(env.iter().copied()).output().expect("run cabine")
}

#[test]
fn beyond_loopback_a_default_empty_or_short_token_stops_the_pod_with_64_naming_the_key() {
    let wide = ("CABINE__HTTP__BIND", "0.0.0.0:0");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[wide], "http.admin_token"),
        (&[wide, ("CABINE__HTTP__ADMIN_TOKEN", "")], "http.admin_token"),
        (&[wide, ("CABINE__HTTP__ADMIN_TOKEN", "short")], "http.admin_token"),
        (&[wide, ("CABINE__HTTP__ADMIN_TOKEN", ADMIN)], "http.read_token"),
        (&[("CABINE__HTTP__OPERATOR_BIND", "0.0.0.0:0"), ("CABINE__HTTP__ADMIN_TOKEN", ADMIN)], "http.read_token"),
        (&[("CABINE__HTTP__ADMIN_TOKEN", ADMIN), ("CABINE__HTTP__READ_TOKEN", ADMIN)], "http.read_token"),
    ];
    for (env, key) in cases {
        for command in ["run", "check-config"] {
            let out = cabine(command, env);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{command} {env:?}: {stderr}");
            assert!(stderr.starts_with(&format!("config: {key}:")), "{command} {env:?} names {key}: {stderr}");
            assert!(!stderr.contains(ADMIN), "the refusal never prints a token: {stderr}");
        }
    }
    let out = cabine("check-config", &[wide, ("CABINE__HTTP__ADMIN_TOKEN", ADMIN), ("CABINE__HTTP__READ_TOKEN", READ)]);
    assert!(out.status.success(), "both tokens set: {}", String::from_utf8_lossy(&out.stderr));
    let out = cabine("check-config", &[("CABINE__HTTP__BIND", "[::1]:0")]);
    assert!(out.status.success(), "the default token on loopback: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn payment_reads_take_the_read_token_on_an_operator_listener_of_their_own() {
    let name = unique_name("sec");
    let mut env = isolated_env(&name);
    for (k, v) in [
        ("CABINE__HTTP__OPERATOR_BIND", "127.0.0.1:0"),
        ("CABINE__HTTP__ADMIN_TOKEN", ADMIN),
        ("CABINE__HTTP__READ_TOKEN", READ),
        ("CABINE__POSTGRES__MIGRATE_ON_START", "true"),
    ] {
        env.push((k.into(), v.into()));
    }
    let mut pod = Pod::spawn(Path::new(EXE), &env).await.unwrap();
    assert_ne!(pod.http, pod.operator, "two listeners");
    pod.wait_ready(Duration::from_secs(20)).await.unwrap();
    let http = http_client();
    let get = |addr, path: &str, token: Option<&str>| {
        let mut r = http.get(format!("http://{addr}{path}"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(get(pod.http, "/metrics", None).await, 200);
    assert_eq!(get(pod.http, "/health/ready", None).await, 200);
    assert_eq!(get(pod.http, "/actors", None).await, 404, "operator endpoints are not on http.bind");
    assert_eq!(get(pod.http, "/v1/outbound?status=queued", Some(ADMIN)).await, 404);
    assert_eq!(get(pod.operator, "/metrics", None).await, 404, "nor metrics on the operator listener");
    assert_eq!(get(pod.operator, "/actors", None).await, 200);
    let page = "/v1/outbound?status=queued";
    assert_eq!(get(pod.operator, page, None).await, 401, "payment data without a token");
    assert_eq!(get(pod.operator, page, Some("read-token-wrong")).await, 401);
    assert_eq!(get(pod.operator, page, Some(READ)).await, 200);
    assert_eq!(get(pod.operator, page, Some(ADMIN)).await, 200);
    assert_eq!(get(pod.operator, "/v1/outbound/M-none", Some(READ)).await, 404, "past the check: unknown MsgId");
    let reprocess = http.post(format!("http://{}/v1/outbound/M-none/reprocess", pod.operator)).bearer_auth(READ);
    assert_eq!(reprocess.send().await.unwrap().status(), 401, "the read token changes nothing");
    pod.terminate(Duration::from_secs(15)).await.unwrap();
    cleanup(&env).await;
}

/// Every credential form, each with a value that must never be printed.
fn credentials(closed: u16) -> Vec<(String, String)> {
    [
        ("CABINE__NATS__URL", format!("nats://NATSTOKEN7f3e@127.0.0.1:{closed}")),
        ("CABINE__REDIS__URL", format!("redis://:REDISPASS5b1c@127.0.0.1:{closed}")),
        ("CABINE__POSTGRES__URL", format!("postgres://root:PGPASS9a8d@127.0.0.1:{closed}/test?password=PGQUERY2c4e")),
        ("CABINE__ICOM__CHANNELS__CPM__BASE_URL", format!("http://ICOMTOKEN1d2e@127.0.0.1:{closed}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

const SECRETS: [&str; 5] = ["NATSTOKEN7f3e", "REDISPASS5b1c", "PGPASS9a8d", "PGQUERY2c4e", "ICOMTOKEN1d2e"];

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows {secret}: {text}");
    }
}

#[test]
fn check_config_shows_urls_without_their_credentials() {
    let env = credentials(4222);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = cabine("check-config", &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_no_secret("check-config", &stdout);
    assert!(stdout.contains("nats://[redacted]@127.0.0.1:4222"), "{stdout}");
    assert!(stdout.contains("postgres://root:[redacted]@127.0.0.1:4222/test?password=[redacted]"), "{stdout}");
    assert!(stdout.contains("redis://:[redacted]@127.0.0.1:4222"), "{stdout}");
}

#[tokio::test]
async fn a_connect_error_against_a_closed_port_names_the_server_not_its_credentials() {
    let name = unique_name("mask");
    let closed = free_port().unwrap();
    let mut env = isolated_env(&name);
    env.push(("CABINE__NATS__URL".into(), format!("nats://NATSTOKEN7f3e@127.0.0.1:{closed}")));
    let out = tokio::process::Command::new(EXE).arg("migrate").envs(env.iter().cloned()).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "NATS is closed: {stderr}");
    assert!(stderr.contains(&format!("nats://[redacted]@127.0.0.1:{closed}")), "names the server: {stderr}");
    assert_no_secret("cabine migrate's error", &stderr);
    let pg = [("CABINE__POSTGRES__URL", format!("postgres://root:PGPASS9a8d@127.0.0.1:{closed}/test"))];
    let out = tokio::process::Command::new(EXE).arg("migrate").envs(pg).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "Postgres is closed: {stderr}");
    assert_no_secret("cabine migrate's error", &stderr);
    cleanup(&env).await;
}

#[tokio::test]
async fn a_pod_whose_stores_refuse_it_shows_no_credential_in_logs_readiness_or_cluster() {
    let name = unique_name("mask");
    let mut env = isolated_env(&name);
    env.extend(credentials(free_port().unwrap()));
    env.push(("CABINE__LOG__FILTER".into(), "info".into()));
    let mut child = tokio::process::Command::new(EXE)
        .arg("run")
        .envs(env.iter().cloned())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let logs = tokio::spawn(async move {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text).await;
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
    let listening: serde_json::Value = serde_json::from_str(&line).unwrap();
    let base = format!("http://{}", listening["operator"].as_str().unwrap());
    let http = http_client();
    let mut ready = serde_json::Value::Null;
    for _ in 0..100 {
        ready = http.get(format!("{base}/health/ready")).send().await.unwrap().json().await.unwrap();
        let failing = ready["failing"].as_array().map_or(0, Vec::len);
        if failing >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready["failing"].as_array().is_some_and(|f| f.len() >= 3), "stores refused: {ready}");
    let cluster = http.get(format!("{base}/cluster")).send().await.unwrap().text().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    let stderr = tokio::time::timeout(Duration::from_secs(10), logs).await.unwrap().unwrap();
    assert!(!stderr.is_empty(), "the pod logged its refused stores");
    assert_no_secret("the logs", &stderr);
    assert_no_secret("/health/ready", &ready.to_string());
    assert_no_secret("/cluster", &cluster);
}

async fn cleanup(env: &[(String, String)]) {
    let map = env.iter().cloned().collect();
    let settings = cabine::config::Settings::from_sources(cabine::config::DEFAULT_TOML, None, &map).unwrap();
    if let Ok(pool) = cabine::db::pool(&settings.postgres)
        && let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(5), pool.get()).await
    {
        let schema = &settings.postgres.schema;
        let _ = conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
    }
    if let Ok(Ok(nats)) = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(&settings.nats.url)).await {
        let js = async_nats::jetstream::new(nats);
        for stream in cabine::bus::stream_names(&settings) {
            let _ = js.delete_stream(stream).await;
        }
    }
}
