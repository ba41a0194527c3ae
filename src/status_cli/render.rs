//! The text of one `cabine status` frame from the `/cluster` and `/actors`
//! answers: pure, so what an operator reads is tested without a terminal.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

/// How emphasis is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paint {
    Plain,
    Ansi,
}

impl Paint {
    fn red(self, s: &str) -> String {
        self.wrap("31;1", s)
    }
    fn yellow(self, s: &str) -> String {
        self.wrap("33;1", s)
    }
    fn green(self, s: &str) -> String {
        self.wrap("32", s)
    }
    fn bold(self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn dim(self, s: &str) -> String {
        self.wrap("2", s)
    }
    fn wrap(self, code: &str, s: &str) -> String {
        match self {
            Paint::Plain => s.to_owned(),
            Paint::Ansi => format!("\x1b[{code}m{s}\x1b[0m"),
        }
    }
}

pub fn render(cluster: &Value, actors: &Value, pod: &str, at: &str, p: Paint) -> String {
    // What the pod says (error texts from remote services among it) never reaches the terminal as control codes.
    let (mut cluster, mut actors) = (cluster.clone(), actors.clone());
    scrub(&mut cluster);
    scrub(&mut actors);
    let (cluster, actors) = (&cluster, &actors);
    let mut out = String::new();
    let ispb = cluster["ispb"].as_str().unwrap_or("?");
    let _ = writeln!(out, "{} · ISPB {ispb} · {pod} · {at}", p.bold("cabine"));
    if let Some(q) = cluster["quarantine"].as_object() {
        let left = ms(q.get("remaining_ms").and_then(Value::as_u64));
        let why = q.get("reason").and_then(Value::as_str).unwrap_or("");
        let _ = writeln!(out, "{}", p.yellow(&format!("QUARANTINE: no slot granted for {left} — {why}")));
    }
    for e in cluster["errors"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "{}", p.red(&format!("DEGRADED: {}", e.as_str().unwrap_or(""))));
    }
    slots(&mut out, cluster, p);
    pods(&mut out, cluster);
    alerts(&mut out, cluster, p);
    unwell(&mut out, actors, p);
    out
}

/// Control characters in every string of `v` become spaces.
fn scrub(v: &mut Value) {
    match v {
        Value::String(s) if s.chars().any(char::is_control) => {
            *s = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        }
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::Object(fields) => fields.values_mut().for_each(scrub),
        _ => {}
    }
}

fn ms(n: Option<u64>) -> String {
    match n {
        None => "–".into(),
        Some(n) if n < 1000 => format!("{n}ms"),
        Some(n) if n < 120_000 => format!("{:.1}s", n as f64 / 1000.0),
        Some(n) => format!("{}min", n / 60_000),
    }
}

/// Pool (`cpm stream`) → its size as far as the view tells.
fn pool_sizes(cluster: &Value) -> BTreeMap<(String, String), u64> {
    let mut sizes: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut grow = |ch: &str, pool: &str, n: u64| {
        let size = sizes.entry((ch.to_owned(), pool.to_owned())).or_default();
        *size = (*size).max(n);
    };
    for pod in cluster["pods"].as_array().into_iter().flatten() {
        for (ch, n) in pod["streams"].as_object().into_iter().flatten() {
            grow(ch, "stream", n.as_u64().unwrap_or(0));
        }
    }
    for row in cluster["slots"].as_array().into_iter().flatten() {
        grow(row["channel"].as_str().unwrap_or("?"), "stream", row["slot"].as_u64().unwrap_or(0));
    }
    for pool in cluster["holders"].as_array().into_iter().flatten() {
        let (ch, name) = (pool["channel"].as_str().unwrap_or("?"), pool["pool"].as_str().unwrap_or("?"));
        let top = pool["holders"].as_array().into_iter().flatten().filter_map(|h| h["slot"].as_u64()).max();
        grow(ch, name, top.unwrap_or(0).max(if name == "send" { 2 } else { 0 }));
    }
    sizes
}

fn slots(out: &mut String, cluster: &Value, p: Paint) {
    let _ = writeln!(out, "\n{}", p.bold("SLOTS"));
    let quarantined = cluster["quarantine"].is_object();
    let cooling: Vec<&str> = cluster["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|pod| pod["cooldown"].as_array().into_iter().flatten().filter_map(Value::as_str))
        .collect();
    for ((ch, pool), size) in pool_sizes(cluster) {
        let holders =
            cluster["holders"].as_array().into_iter().flatten().find(|h| h["channel"] == *ch && h["pool"] == *pool);
        for n in 1..=size {
            let holder = holders.and_then(|h| h["holders"].as_array()?.iter().find(|x| x["slot"] == n));
            let row = cluster["slots"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| pool == "stream" && r["channel"] == *ch && r["slot"] == n);
            let state = match holder {
                Some(h) => p.green(&format!("{} lease {}", h["pod"].as_str().unwrap_or("?"), ms(h["ttl_ms"].as_u64()))),
                None if quarantined => p.yellow("quarantined"),
                None if cooling.contains(&format!("{ch}:{pool}/{n}").as_str()) => "cooling".into(),
                None => p.dim("free"),
            };
            let cursor = row.map_or(String::new(), |r| {
                let busy = r["busy_ms"].as_u64().map_or("idle".into(), |b| format!("busy {}", ms(Some(b))));
                let open = if r["stream_open"] == true { "open" } else { "no stream" };
                format!("  fence {} {open} cursor {} {busy}", r["fence"], ms(r["cursor_age_ms"].as_u64()))
            });
            let _ = writeln!(out, "  {ch:<4} {pool:<6} {n}  {state}{cursor}");
        }
    }
}

fn pods(out: &mut String, cluster: &Value) {
    let leader = cluster["leader"]["pod"].as_str();
    let _ = writeln!(out, "\nPODS");
    for pod in cluster["pods"].as_array().into_iter().flatten() {
        let id = pod["pod_id"].as_str().unwrap_or("?");
        let role = if Some(id) == leader { " leader" } else { "" };
        let held: Vec<&str> = pod["held"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let _ = writeln!(
            out,
            "  {id}  pid {}  v{}  up {}{role}  holds {}",
            pod["pid"],
            pod["version"].as_str().unwrap_or("?"),
            ms(pod["uptime_s"].as_u64().map(|s| s * 1000)),
            if held.is_empty() { "–".into() } else { held.join(" ") }
        );
    }
}

fn alerts(out: &mut String, cluster: &Value, p: Paint) {
    let lag = match cluster["oldest_unpublished_ms"].as_u64() {
        None => "unknown".to_owned(),
        Some(0) => "none waiting".to_owned(),
        Some(n) => format!("oldest inbound not on the bus {}", ms(Some(n))),
    };
    let _ = writeln!(out, "\nPUBLICATION LAG: {lag}");
    let list = cluster["alerts"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "ALERTS{}", if list.is_empty() { ": none" } else { "" });
    for a in &list {
        let level = a["level"].as_str().unwrap_or("?");
        let shown = if matches!(level, "EMERGENCY" | "CRITICAL") { p.red(level) } else { p.yellow(level) };
        let place = [a["channel"].as_str().map(str::to_owned), a["slot"].as_u64().map(|s| format!("slot {s}"))]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        let _ = writeln!(
            out,
            "  {shown} {} {place} — {}",
            a["kind"].as_str().unwrap_or("?"),
            a["detail"].as_str().unwrap_or("")
        );
    }
}

/// The actors of this pod by state, and those with a last error.
fn unwell(out: &mut String, actors: &Value, p: Paint) {
    let mut all = Vec::new();
    walk(actors, &mut all);
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &all {
        *states.entry(a["state"].as_str().unwrap_or("?")).or_default() += 1;
    }
    let counts: Vec<String> = states.iter().map(|(s, n)| format!("{s} {n}")).collect();
    let _ = writeln!(out, "\nACTORS (this pod): {}", counts.join(" · "));
    for a in all.iter().filter(|a| a["last_error"].is_string()) {
        let restarts = a["restarts"].as_u64().unwrap_or(0);
        let line = format!(
            "  {} {} restarts {restarts}: {}",
            a["id"].as_str().unwrap_or("?"),
            a["state"].as_str().unwrap_or("?"),
            a["last_error"].as_str().unwrap_or("")
        );
        let _ = writeln!(out, "{}", p.red(&line));
    }
}

fn walk<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    out.push(node);
    for child in node["children"].as_array().into_iter().flatten() {
        walk(child, out);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cluster() -> Value {
        json!({
            "ispb": "99999010",
            "pods": [{"pod_id": "p1", "pid": 7, "version": "0.1.0", "uptime_s": 65, "held": ["cpm:stream/1"],
                      "streams": {"cpm": 4}, "cooldown": ["cpm:stream/3"]}],
            "leader": {"pool": "leader", "slot": 1, "grant": "g", "pod": "p1", "ttl_ms": 1500},
            "quarantine": null,
            "holders": [{"channel": "cpm", "pool": "stream", "holders": [{"pool": "cpm:stream", "slot": 1, "grant": "g", "pod": "p1", "ttl_ms": 2500}]},
                        {"channel": "cpm", "pool": "send", "holders": []}],
            "slots": [{"channel": "cpm", "slot": 1, "fence": 4, "holder": "p1", "stream_open": true, "cursor_age_ms": 30, "busy_ms": 900}],
            "oldest_unpublished_ms": 1500,
            "alerts": [{"level": "CRITICAL", "kind": "stale_slot", "channel": "cpm", "slot": 2, "since_ms": 1, "detail": "unheld 40 s"}],
            "errors": []
        })
    }

    #[test]
    fn a_frame_names_every_slot_its_holder_or_why_it_is_not_held() {
        let actors = json!({"id": "root", "state": "running", "children": [
            {"id": "slot/cpm/2", "state": "standby", "restarts": 3, "last_error": "lease store unavailable", "children": []}]});
        let text = render(&cluster(), &actors, "http://pod", "now", Paint::Plain);
        assert!(text.contains("cpm  stream 1  p1 lease 2.5s  fence 4 open cursor 30ms busy 900ms"), "{text}");
        assert!(text.contains("cpm  stream 2  free"), "{text}");
        assert!(text.contains("cpm  stream 3  cooling"), "{text}");
        assert!(text.contains("cpm  send   2  free"), "{text}");
        assert!(text.contains("p1  pid 7  v0.1.0  up 65.0s leader  holds cpm:stream/1"), "{text}");
        assert!(text.contains("CRITICAL stale_slot cpm slot 2 — unheld 40 s"), "{text}");
        assert!(text.contains("PUBLICATION LAG: oldest inbound not on the bus 1.5s"), "{text}");
        assert!(text.contains("ACTORS (this pod): running 1 · standby 1"), "{text}");
        assert!(text.contains("slot/cpm/2 standby restarts 3: lease store unavailable"), "{text}");
        assert!(!text.contains('\x1b'), "no colour when plain");
    }

    #[test]
    fn quarantine_and_unreadable_sources_lead_the_frame_in_colour_on_a_terminal() {
        let mut c = cluster();
        c["quarantine"] = json!({"remaining_ms": 2500, "reason": "amnesia"});
        c["errors"] = json!(["pods: redis unavailable\u{1b}[2J"]);
        let text = render(&c, &json!({"id": "root", "state": "running"}), "http://pod", "now", Paint::Ansi);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "\x1b[33;1mQUARANTINE: no slot granted for 2.5s — amnesia\x1b[0m");
        assert_eq!(lines[2], "\x1b[31;1mDEGRADED: pods: redis unavailable [2J\x1b[0m", "the pod's text is scrubbed");
        assert!(text.contains("cpm  stream 2  \x1b[33;1mquarantined\x1b[0m"), "{text}");
    }
}
