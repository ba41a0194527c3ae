//! Foundation against the real services: the binary's config errors (exit 64),
//! `check-config` redaction, migrations applied twice, and readiness that
//! follows Postgres, Redis and NATS.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cabine::harness::{Pod, isolated_env, unique_name};

const EXE: &str = env!("CARGO_BIN_EXE_cabine");

fn check_config(env: &[(&str, &str)]) -> std::process::Output {
    Command::new(EXE).arg("check-config").envs(env.iter().copied()).output().expect("run cabine")
}

#[test]
fn a_boot_invariant_violation_exits_64_naming_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("CABINE__TIMING__LEASE", "9s")], "timing.lease"),
        (&[("CABINE__TIMING__HEARTBEAT", "5s"), ("CABINE__TIMING__LEASE", "14s")], "timing.heartbeat"),
        (&[("CABINE__TIMING__LOCK_DELAY", "1s")], "timing.lock_delay"),
        (&[("CABINE__POOLS__STREAM", "7")], "pools.stream"),
        (&[("CABINE__POOLS__SEND", "0")], "pools.send"),
        (&[("CABINE__POOLS__SEND", "3")], "icom.max_in_flight"),
        (&[("CABINE__TIMING__STOP_TIMEOUT", "5s")], "timing.stop_timeout"),
        (&[("CABINE__CLUSTER__ISPB", "x")], "cluster.ispb"),
        (&[("CABINE__TIMING__LEASE", "not-a-duration")], "timing.lease"),
        (&[("CABINE__ICOM__SERVER_HOLD", "8s")], "icom.server_hold"),
    ];
    for (env, key) in cases {
        let out = check_config(env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{env:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(key), "{env:?} should name {key}: {stderr}");
    }
}

#[test]
fn a_missing_env_file_exits_64() {
    let out = check_config(&[("CABINE_ENV", "no-such-env")]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-env.toml"));
}

#[test]
fn check_config_never_prints_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let key_material = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDsecretkeymaterial";
    let key = dir.path().join("client.key");
    std::fs::write(&key, format!("-----BEGIN PRIVATE KEY-----\n{key_material}\n-----END PRIVATE KEY-----\n")).unwrap();
    let key_path = key.display().to_string();
    let out = check_config(&[
        ("CABINE__HTTP__ADMIN_TOKEN", "tok-3f9a8b7c6d5e"),
        ("CABINE__POSTGRES__PASSWORD", "pg-pass-8c7d6e5f"),
        ("CABINE__POSTGRES__URL", "postgres://root:url-pass-1a2b3c@127.0.0.1:5432/test"),
        ("CABINE__REDIS__PASSWORD", "redis-pass-9d8e7f"),
        ("CABINE__NATS__TOKEN", "nats-tok-4e5f6a"),
        ("CABINE__ICOM__CHANNELS__CPM__BASE_URL", "https://icom.example:16422"),
        ("CABINE__ICOM__CHANNELS__CPM__CA_FILE", "/etc/cabine/ca.pem"),
        ("CABINE__ICOM__CHANNELS__CPM__CERT_FILE", "/etc/cabine/client.pem"),
        ("CABINE__ICOM__CHANNELS__CPM__KEY_FILE", &key_path),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for secret in [
        "tok-3f9a8b7c6d5e",
        "pg-pass-8c7d6e5f",
        "url-pass-1a2b3c",
        "redis-pass-9d8e7f",
        "nats-tok-4e5f6a",
        key_material,
        "PRIVATE KEY",
    ] {
        assert!(!stdout.contains(secret), "check-config printed {secret}");
    }
    assert!(stdout.contains("[redacted]"));
    assert!(stdout.contains(&key_path), "the key's path (not its content) is shown");
}

#[tokio::test]
async fn migrations_apply_twice_without_error() {
    let schema = unique_name("mig");
    let env: Vec<(String, String)> = isolated_env(&schema);
    for _ in 0..2 {
        let out = tokio::process::Command::new(EXE).arg("migrate").envs(env.iter().cloned()).output().await.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let settings = settings_with(&env);
    let pool = cabine::db::pool(&settings.postgres).unwrap();
    assert_eq!(cabine::db::applied_version(&pool).await.unwrap(), Some(cabine::db::latest_version()));
    drop_schema(&pool, &schema).await;
    let nats = async_nats::connect(&settings.nats.url).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    for stream in [&settings.nats.inbound_stream, &settings.nats.outbound_stream, &settings.nats.results_stream] {
        js.delete_stream(stream).await.expect("cabine migrate created the stream");
    }
}

#[tokio::test]
async fn readiness_is_503_naming_postgres_when_it_is_unreachable() {
    cabine::install_crypto_provider();
    let name = unique_name("rdy");
    let closed = cabine::harness::free_port().unwrap();
    let mut env = isolated_env(&name);
    env.push(("CABINE__POSTGRES__URL".into(), format!("postgres://root@127.0.0.1:{closed}/test")));
    let mut pod = Pod::spawn(Path::new(EXE), &env).await.unwrap();
    // Wait until Redis and NATS have been found up, so only Postgres can be at fault.
    let (status, body) =
        ready_status(&pod, |b| b["checks"]["redis"]["ok"] == true && b["checks"]["nats"]["ok"] == true).await;
    assert_eq!(status, 503, "{body}");
    let failing: Vec<&str> = body["failing"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(failing.contains(&"postgres"), "{body}");
    assert!(!failing.contains(&"redis") && !failing.contains(&"nats"), "{body}");
    pod.terminate(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn readiness_is_200_when_everything_is_up_and_sigterm_exits_cleanly() {
    cabine::install_crypto_provider();
    let name = unique_name("rdy");
    let mut env = isolated_env(&name);
    env.push(("CABINE__POSTGRES__MIGRATE_ON_START".into(), "true".into()));
    let mut pod = Pod::spawn(Path::new(EXE), &env).await.unwrap();
    pod.wait_ready(Duration::from_secs(20)).await.unwrap();
    let metrics = reqwest::get(format!("http://{}/metrics", pod.http)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("cabine_build_info{"), "{metrics}");
    assert!(metrics.contains("cabine_dependency_up{dependency=\"postgres\"} 1"), "{metrics}");
    let actors: serde_json::Value =
        reqwest::get(format!("http://{}/actors", pod.http)).await.unwrap().json().await.unwrap();
    assert_eq!(actors["id"], "root");
    let live = reqwest::get(format!("http://{}/health/live", pod.http)).await.unwrap();
    assert_eq!(live.status(), 200);
    let status = pod.terminate(Duration::from_secs(15)).await.unwrap().expect("exits within the stop timeout");
    assert!(status.success(), "{status:?}");
    let pool = cabine::db::pool(&settings_with(&env).postgres).unwrap();
    drop_schema(&pool, &name).await;
}

async fn ready_status(pod: &Pod, want: impl Fn(&serde_json::Value) -> bool) -> (u16, serde_json::Value) {
    let url = format!("http://{}/health/ready", pod.http);
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..100 {
        if let Ok(r) = reqwest::get(&url).await {
            last = (r.status().as_u16(), r.json().await.unwrap_or_default());
            if want(&last.1) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

fn settings_with(env: &[(String, String)]) -> cabine::config::Settings {
    let env = env.iter().cloned().collect();
    cabine::config::Settings::from_sources(cabine::config::DEFAULT_TOML, None, &env).unwrap()
}

async fn drop_schema(pool: &deadpool_postgres::Pool, schema: &str) {
    let conn = pool.get().await.unwrap();
    conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await.unwrap();
}
