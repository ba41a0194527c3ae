//! A pod refuses a Redis whose eviction policy can evict the lease epoch
//! (`allkeys-*`: exit 64 naming the key and the policy) and starts on
//! `volatile-*` (lease keys may go: detected and survived) — against a private
//! redis-server whose policy the test sets.

use std::process::Stdio;
use std::time::Duration;

use cabine::harness::{RedisServer, isolated_env, unique_name};
use fred::interfaces::ConfigInterface;
use fred::prelude::ClientLike;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_cabine");

async fn with_policy(policy: &str) -> RedisServer {
    let server = RedisServer::start().await.expect("private redis-server");
    let client =
        fred::prelude::Builder::from_config(fred::prelude::Config::from_url(&server.url()).unwrap()).build().unwrap();
    client.init().await.unwrap();
    let _: () = client.config_set("maxmemory-policy", policy).await.unwrap();
    server
}

fn pod(server: &RedisServer) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.arg("run")
        .envs(isolated_env(&unique_name("policy")))
        .env("CABINE__REDIS__URL", server.url())
        .env("CABINE__OUTBOUND__ENABLED", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn allkeys_eviction_is_refused_at_boot_with_exit_64_naming_the_key() {
    let server = with_policy("allkeys-lru").await;
    let out = tokio::time::timeout(Duration::from_secs(20), pod(&server).output()).await.expect("exits").unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("redis.url") && stderr.contains("allkeys-lru"), "{stderr}");
}

#[tokio::test]
async fn volatile_eviction_starts_with_a_warning() {
    let server = with_policy("volatile-lru").await;
    let mut child = pod(&server).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.expect("listening").unwrap();
    assert!(first.is_some_and(|l| l.contains("\"listening\"")), "the pod started");
    child.kill().await.unwrap();
}
