//! The image users deploy, checked for real on machines that have neither a
//! registry nor a container runtime (no cgroups): `ops/container/pack` builds it
//! with buildah from the binary under test (`FROM scratch`,
//! `ops/container/Containerfile.local`), exports its OCI config and root
//! filesystem, and the binary runs from that filesystem under `chroot`, as the
//! image's non-root user, on a read-only root (a private bind mount): the chroot
//! run IS the container test. `--version`, `check-config`, a bad key's exit 64,
//! and one pod that becomes ready against the local Redis, Postgres and NATS and
//! the simulator, stores a message, answers `cabine health --ready` from inside
//! the image and stops cleanly on the image's stop signal.

mod cluster_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, ensure};
use cabine::harness::Pod;
use serde_json::Value;
use tokio::process::Command;

use cluster_support::{exe, until};

/// The image's non-root user (distroless's `nonroot`), as `chroot --userspec` takes it.
const USER: &str = "65532:65532";

/// An image packed from the binary under test and exported: its OCI config and root filesystem.
struct Image {
    _dir: tempfile::TempDir,
    config: Value,
    rootfs: PathBuf,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `ops/container/pack` into a private buildah store, exported.
fn pack() -> Image {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = std::process::Command::new("bash")
        .arg(root().join("ops/container/pack"))
        .args(["--binary".as_ref(), exe().as_os_str()])
        .args(["--tag", "localhost/cabine:test"])
        .args(["--storage".as_ref(), dir.path().join("store").as_os_str()])
        .args(["--export".as_ref(), dir.path().join("image").as_os_str()])
        .output()
        .expect("bash runs ops/container/pack");
    assert!(out.status.success(), "pack failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let config = std::fs::read(dir.path().join("image/config.json")).expect("the exported OCI config");
    let config = serde_json::from_slice(&config).expect("the OCI config is JSON");
    let rootfs = dir.path().join("image/rootfs");
    Image { _dir: dir, config, rootfs }
}

impl Image {
    /// The image's own environment (`Env` of its config): what a runtime starts the entrypoint with.
    fn env(&self) -> Vec<(String, String)> {
        let env = self.config["config"]["Env"].as_array().cloned().unwrap_or_default();
        env.iter().filter_map(|e| e.as_str()?.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect()
    }

    /// `cabine ARGS` from the image: a private mount namespace where the root filesystem is
    /// bind-mounted read-only, then `chroot` as the image's user, with only the image's
    /// environment plus `env`.
    fn command(&self, args: &[&str], env: &[(String, String)]) -> Command {
        let script = r#"mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec /usr/sbin/chroot --userspec="$1" "$0" cabine "${@:2}""#;
        let mut cmd = Command::new("/usr/bin/unshare");
        cmd.args(["--mount", "--propagation", "private", "/bin/bash", "-c", script])
            .arg(&self.rootfs)
            .arg(USER)
            .args(args)
            .env_clear()
            .envs(self.env())
            .envs(env.iter().cloned());
        cmd
    }

    async fn output(&self, args: &[&str], env: &[(String, String)]) -> Output {
        self.command(args, env).output().await.expect("unshare + chroot start")
    }
}

#[test]
fn the_image_config_is_the_runtime_contract_of_both_recipes() {
    let image = pack();
    let config = &image.config["config"];
    assert_eq!(config["User"], USER);
    assert_eq!(config["Entrypoint"], serde_json::json!(["cabine"]));
    assert_eq!(config["Cmd"], serde_json::json!(["run"]));
    assert_eq!(config["StopSignal"], "SIGTERM");
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap_or_default();
    assert!(revision.len() >= 7 && revision != "unknown", "revision label {revision:?}");
    assert!(image.env().contains(&("CABINE_CONFIG_DIR".into(), "/etc/cabine/config".into())));
    // No shell, no package manager: the binary, its libraries, CA bundle, passwd.
    assert!(!image.rootfs.join("bin/sh").exists(), "the image carries a shell");
    assert!(image.rootfs.join("etc/ssl/certs/ca-certificates.crt").is_file());
    let passwd = std::fs::read_to_string(image.rootfs.join("etc/passwd")).expect("etc/passwd");
    assert!(passwd.contains(":65532:65532:"), "{passwd}");
    // The users' recipe declares the same contract as the one tested here.
    assert_eq!(contract("Containerfile"), contract("Containerfile.local"));
}

/// The runtime-facing instructions of a recipe's final stage (USER, ENTRYPOINT, CMD,
/// STOPSIGNAL, EXPOSE, ENV and the LABEL keys), continuation lines joined.
fn contract(recipe: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("ops/container").join(recipe)).expect("the recipe");
    let joined = text.replace("\\\n", " ");
    let last_stage = joined.rsplit("\nFROM ").next().unwrap_or_default();
    let mut found = BTreeMap::new();
    for line in last_stage.lines().map(str::trim) {
        let Some((word, rest)) = line.split_once(' ') else { continue };
        if ["USER", "ENTRYPOINT", "CMD", "STOPSIGNAL", "EXPOSE", "ENV", "LABEL"].contains(&word) {
            let rest = rest.split_whitespace().collect::<Vec<_>>().join(" ");
            found.insert(word.to_owned(), rest);
        }
    }
    assert_eq!(found.len(), 7, "{recipe}: {found:?}");
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_runs_from_the_image_as_its_user_on_a_read_only_root() {
    let image = pack();
    let version = image.output(&["--version"], &[]).await;
    assert!(version.status.success(), "{version:?}");
    let printed = String::from_utf8_lossy(&version.stdout);
    assert!(printed.starts_with(&format!("cabine {}", env!("CARGO_PKG_VERSION"))), "{printed}");

    let config = image.output(&["check-config"], &[]).await;
    assert!(config.status.success(), "{config:?}");
    assert!(String::from_utf8_lossy(&config.stdout).contains("[cluster]"));

    let bad = image.output(&["check-config"], &[("CABINE__TIMING__LEASE".into(), "soon".into())]).await;
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lease"), "{bad:?}");

    let nobody = image.output(&["health", "--pod", "http://127.0.0.1:9", "--timeout", "1s"], &[]).await;
    assert_eq!(nobody.status.code(), Some(1), "health with no pod to ask: {nobody:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_from_the_image_becomes_ready_and_stores_what_the_simulator_sends() {
    let image = pack();
    let cluster = cluster_support::start("image", 0, &[]).await;
    cluster_support::run(cluster, async |c| {
        let mut env = c.env.clone();
        env.push(("CABINE__CLUSTER__POD_ID".into(), format!("{}-image", c.name)));
        let pod = Pod::spawn_command(image.command(&["run"], &env)).await.context("the pod from the image")?;
        let pid = pod.child.id().context("the pod's pid")?;
        c.pods.push(pod);
        c.pods[0].wait_ready(Duration::from_secs(20)).await?;
        ensure!(runs_as(pid, "65532")?, "the pod does not run as uid 65532");

        let url = format!("http://{}", c.pods[0].http);
        let probe = image.output(&["health", "--ready", "--pod", &url], &[]).await;
        ensure!(probe.status.success(), "cabine health --ready from the image: {probe:?}");
        ensure!(String::from_utf8_lossy(&probe.stdout).starts_with("200 "), "{probe:?}");
        // Without --pod it asks http.bind, as ECS's health check does (a wildcard bind on loopback).
        let bind = vec![
            ("CABINE__HTTP__BIND".to_owned(), format!("0.0.0.0:{}", c.pods[0].http.port())),
            ("CABINE__HTTP__OPERATOR_BIND".to_owned(), "127.0.0.1:8090".to_owned()),
        ];
        let by_config = image.output(&["health"], &bind).await;
        ensure!(by_config.status.success(), "cabine health on http.bind from the image: {by_config:?}");
        ensure!(String::from_utf8_lossy(&by_config.stdout).starts_with("200 live"), "{by_config:?}");

        c.sim.control.inject(20, "pacs008").await?;
        let stored = until(Duration::from_secs(20), || async {
            let n = c.inbox_count("true").await?;
            Ok((n == 20, n))
        })
        .await?;
        ensure!(stored == 20, "the image's pod stored {stored} of 20 injected messages");

        let status = c.pods[0].terminate(Duration::from_secs(10)).await?;
        ensure!(status.is_some_and(|s| s.success()), "SIGTERM: the pod exits 0 after its drain, got {status:?}");
        Ok(())
    })
    .await;
}

/// Whether process `pid` runs with real and effective uid `uid` (`/proc/PID/status`).
fn runs_as(pid: u32, uid: &str) -> anyhow::Result<bool> {
    let status = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"))?;
    let line = status.lines().find(|l| l.starts_with("Uid:")).context("a Uid line")?;
    let ids: Vec<&str> = line.split_whitespace().skip(1).collect();
    Ok(ids.len() == 4 && ids.iter().all(|id| *id == uid))
}
