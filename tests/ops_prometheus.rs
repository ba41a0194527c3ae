//! The alert rules an operator deploys (`ops/prometheus/rules.yml`): valid for
//! `promtool check rules`, passing their unit tests (`promtool test rules`:
//! series that fire each alert and series that must not), every metric they
//! name exported by cabine's code, and every alert's runbook page present and
//! listed in `docs/runbooks/README.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(root().join("ops/prometheus"))
        .output()
        .expect("promtool (ops/deps.sh installs the prometheus package)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

fn rules() -> String {
    std::fs::read_to_string(root().join("ops/prometheus/rules.yml")).expect("rules.yml")
}

#[test]
fn the_rules_are_valid_and_their_unit_tests_pass() {
    assert!(promtool(&["check", "rules", "rules.yml"]).contains("SUCCESS: 12 rules found"));
    assert!(promtool(&["test", "rules", "rules_test.yml"]).contains("SUCCESS"));
}

/// Every `"cabine_…"` string literal of the Rust sources under `dir`.
fn exported(dir: &Path, into: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("a source dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            exported(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for piece in text.split('"').skip(1).step_by(2) {
                if piece.starts_with("cabine_") && piece.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    into.insert(piece.to_owned());
                }
            }
        }
    }
}

#[test]
fn every_metric_the_rules_name_is_one_cabine_exports() {
    let mut known = BTreeSet::new();
    exported(&root().join("src"), &mut known);
    exported(&root().join("actors/src"), &mut known);
    let text = rules();
    let named: BTreeSet<&str> =
        text.split(|c: char| !(c.is_ascii_lowercase() || c == '_')).filter(|w| w.starts_with("cabine_")).collect();
    assert!(named.len() >= 8, "{named:?}");
    let unknown: Vec<&&str> = named.iter().filter(|m| !known.contains(**m)).collect();
    assert!(unknown.is_empty(), "metrics no code exports: {unknown:?}");
}

#[test]
fn every_alert_has_its_runbook_page_listed_in_the_index() {
    let text = rules();
    let index = std::fs::read_to_string(root().join("docs/runbooks/README.md")).expect("the runbook index");
    let urls: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("runbook_url: ")).map(str::trim).collect();
    assert_eq!(urls.len(), 12, "one runbook_url per alert");
    for url in urls {
        let page = root().join(url);
        let body = std::fs::read_to_string(&page).unwrap_or_else(|_| panic!("{url}: no such page"));
        for part in ["**Means.**", "**Confirm.**", "**Do.**", "**Recovered when**"] {
            assert!(body.contains(part), "{url} lacks {part}");
        }
        let name = Path::new(url).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert!(index.contains(&format!("]({name})")), "{name} not in docs/runbooks/README.md");
    }
}
