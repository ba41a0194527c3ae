//! DICT lookups on 3 real pods against the simulator: one pod's answer is the
//! others' cache hit, the three share one participant bucket (together they are
//! refused locally exactly where one pod alone would be, and the DICT never
//! answers 429), `cabine dict get` and the metrics show the source.

mod cluster_support;

use std::time::Duration;

use anyhow::{Context, ensure};
use cabine::harness::LocalCluster;
use serde_json::{Value, json};

use cluster_support::{TOKEN, exe};

const PAYER: &str = "52998224725";
const E2E: &str = "E99999010202612041200abcdefghijk";

async fn lookup(c: &LocalCluster, pod: usize, key: &str) -> anyhow::Result<(u16, Value)> {
    let url = format!("http://{}/v1/dict/entries/{key}?payer_id={PAYER}&end_to_end_id={E2E}", c.pods[pod].operator);
    let r = reqwest::Client::new().get(url).bearer_auth(TOKEN).send().await?;
    Ok((r.status().as_u16(), r.json().await?))
}

async fn sim_dict(c: &LocalCluster, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let url = format!("{}/sim/dict/{path}", c.sim.control.base());
    let http = reqwest::Client::new();
    let request = match body {
        Some(b) => http.post(url).json(&b),
        None => http.get(url),
    };
    Ok(request.send().await?.json().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_share_the_dict_cache_and_bucket() {
    let dict = [("CABINE__DICT__ENABLED", "true"), ("CABINE__DICT__POLICY_SYNC_INTERVAL", "300ms")];
    let c = cluster_support::start("dict", 3, &[&dict]).await;
    cluster_support::run(c, async |c| {
        let keys: Vec<String> = serde_json::from_value(sim_dict(c, "keys?type=CPF&count=1", None).await?)?;
        let key = &keys[0];
        let (status, first) = lookup(c, 0, key).await?;
        ensure!(status == 200 && first["source"] == "dict", "{status} {first}");
        for pod in [1, 2] {
            let (status, again) = lookup(c, pod, key).await?;
            ensure!(
                status == 200 && again["source"] == "cache" && again["entry"] == first["entry"],
                "pod {pod}: {again}"
            );
        }

        // The DICT down: nothing cached for this key, 503; a bad payer id never reaches it: 400.
        sim_dict(c, "faults", Some(json!({"down": true}))).await?;
        let keys: Vec<String> = serde_json::from_value(sim_dict(c, "keys?type=EVP&from=7&count=1", None).await?)?;
        let (status, body) = lookup(c, 1, &keys[0]).await?;
        ensure!(status == 503, "{status} {body}");
        let url = format!("http://{}/v1/dict/entries/{key}?payer_id=12&end_to_end_id={E2E}", c.pods[1].operator);
        let bad = reqwest::Client::new().get(url).bearer_auth(TOKEN).send().await?.status();
        ensure!(bad == 400, "{bad}");
        sim_dict(c, "faults", Some(json!({}))).await?;

        // Category F (2 tokens a minute: no refill during the test) with ten tokens left at the DICT;
        // the pods take its capacity, refill and tokens from GET /policies/ at their next sync.
        sim_dict(c, "policies", Some(json!({"category": "F"}))).await?;
        sim_dict(c, "policies", Some(json!({"ispb": "99999010", "participant_tokens": 10}))).await?;
        tokio::time::sleep(Duration::from_millis(900)).await;
        let mut statuses = Vec::new();
        for i in 0..9 {
            let (status, body) = lookup(c, i % 3, &format!("ghost{i}@exemplo.com.br")).await?;
            ensure!(status == 404 || status == 429, "{status} {body}");
            statuses.push(status);
        }
        // A miss costs 3: four admitted in all (the fourth on the last token), whichever pod asked.
        ensure!(statuses.iter().filter(|s| **s == 404).count() == 4, "{statuses:?}");
        let audit = sim_dict(c, "audit", None).await?;
        ensure!(audit["dict_429_participant"] == 0 && audit["dict_lookups"] == 5, "{audit}");

        let pod = format!("http://{}", c.pods[2].operator);
        let out = tokio::process::Command::new(exe())
            .args(["dict", "get", key, "--payer-id", PAYER, "--pod", &pod, "--token", TOKEN])
            .output()
            .await?;
        let printed: Value = serde_json::from_slice(&out.stdout).context("the CLI prints JSON")?;
        ensure!(out.status.success() && printed["source"] == "cache", "{printed}");
        // Every pod's tree has its DictSync: the participant bucket as the DICT last reported it.
        for i in 0..3 {
            let actors = c.pod_json(i, "/actors").await?;
            let node = find(&actors, "dict").with_context(|| format!("pod {i}: no dict node in /actors"))?;
            ensure!(
                node["details"]["participant_tokens"].is_u64() && node["details"]["syncs"].as_u64() >= Some(1),
                "{node}"
            );
        }
        // Restarted alone through the operator endpoint, it syncs again.
        let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
        let url = format!("http://{}/actors/dict/restart", c.pods[1].operator);
        let restarted = reqwest::Client::new().post(url).bearer_auth(TOKEN).send().await?.status();
        ensure!(restarted.is_success(), "restart dict: {restarted}");
        let synced = cluster_support::eventually(Duration::from_secs(5), || async {
            let actors = c.pod_json(1, "/actors").await.unwrap_or_default();
            find(&actors, "dict").is_some_and(|n| n["state"] == "idle" && n["since_ms"].as_u64() >= Some(before))
        })
        .await;
        ensure!(synced, "the restarted DictSync synced again");
        let metrics = reqwest::get(format!("http://{}/metrics", c.pods[0].http)).await?.text().await?;
        ensure!(metrics.contains(r#"cabine_dict_lookups_total{source="dict",outcome="found"} 1"#), "metrics");
        Ok(())
    })
    .await;
}

/// The node `id` of an `/actors` tree.
fn find<'a>(node: &'a Value, id: &str) -> Option<&'a Value> {
    if node["id"] == id {
        return Some(node);
    }
    node["children"].as_array()?.iter().find_map(|child| find(child, id))
}
