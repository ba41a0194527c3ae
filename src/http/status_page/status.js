// cabine status page: reads /cluster and /actors every 2 s and draws them.
// Every value goes into the DOM as text (never as HTML). The token is kept in
// this tab's sessionStorage only and sent as a bearer token.
"use strict";

const REFRESH_MS = 2000;
const INCIDENTS_MS = 10000;
// A pod that cannot reach a store may answer slowly: past this a panel says so instead of waiting.
const FETCH_TIMEOUT_MS = 8000;
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function table(head, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function token() {
  try { return sessionStorage.getItem("cabine-token") || ""; } catch (e) { return memoryToken; }
}
function keepToken(value) {
  memoryToken = value;
  try { sessionStorage.setItem("cabine-token", value); } catch (e) { /* storage blocked: this page only */ }
}
let memoryToken = "";
function authHeaders() { return token() ? { Authorization: "Bearer " + token() } : {}; }

function ms(n) {
  if (n === null || n === undefined) return "–";
  if (n < 1000) return n + " ms";
  if (n < 120000) return (n / 1000).toFixed(1) + " s";
  return Math.round(n / 60000) + " min";
}
function ago(epochMs) { return epochMs ? ms(Math.max(0, Date.now() - epochMs)) + " ago" : "–"; }
function compact(obj) {
  return Object.entries(obj || {}).map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join("  ");
}

async function getJson(path, headers) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const r = await fetch(path, { headers: headers || {}, cache: "no-store", signal: abort.signal });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return await r.json();
  } catch (e) {
    throw e.name === "AbortError" ? new Error(path + ": no answer within " + FETCH_TIMEOUT_MS / 1000 + " s") : e;
  } finally {
    clearTimeout(timer);
  }
}

// Runs `f`, then again `ms` after it finished: a slow pod never has two of its refreshes pending.
function every(ms, f) {
  const loop = async () => {
    try { await f(); } finally { setTimeout(loop, ms); }
  };
  loop();
}

function drawBanners(cluster, failures) {
  const box = $("banners");
  box.replaceChildren();
  for (const f of failures) box.append(el("p", { class: "banner bad", "data-banner": "unreachable" }, f));
  if (!cluster) return;
  if (cluster.errors && cluster.errors.length) {
    box.append(el("p", { class: "banner bad", "data-banner": "degraded" },
      "This pod cannot read part of the cluster state — " + cluster.errors.join("; ")));
  }
  if (cluster.quarantine) {
    box.append(el("p", { class: "banner warn", "data-banner": "quarantine" },
      "Lease quarantine: no slot is granted for " + ms(cluster.quarantine.remaining_ms) + " — " + cluster.quarantine.reason));
  }
}

function slotCell(channel, pool, n, holder, row, cooling, quarantined) {
  const state = quarantined ? "quarantined" : holder ? "held" : cooling ? "cooling" : "free";
  const lines = [el("b", {}, pool + " " + n), holder ? holder.pod : state];
  if (holder) lines.push(el("div", {}, "lease " + ms(holder.ttl_ms)));
  if (row) {
    lines.push(el("div", {}, "fence " + row.fence + " · " + (row.stream_open ? "stream open" : "no stream")));
    lines.push(el("div", {}, "cursor " + ms(row.cursor_age_ms) + (row.busy_ms ? " · busy " + ms(row.busy_ms) : " · idle")));
  }
  return el("span", { class: "cell " + state, "data-slot": channel + ":" + pool + "/" + n,
    "data-state": state, "data-holder": holder ? holder.pod : "" }, lines);
}

function drawSlots(cluster) {
  const box = $("slots");
  box.replaceChildren();
  const channels = new Map();
  const size = (ch, pool) => channels.get(ch + ":" + pool) || 0;
  for (const p of cluster.pods || []) {
    for (const [ch, n] of Object.entries(p.streams || {})) channels.set(ch + ":stream", Math.max(size(ch, "stream"), n));
  }
  for (const s of cluster.slots || []) channels.set(s.channel + ":stream", Math.max(size(s.channel, "stream"), s.slot));
  for (const h of cluster.holders || []) {
    const top = Math.max(0, ...(h.holders || []).map((x) => x.slot));
    channels.set(h.channel + ":" + h.pool, Math.max(size(h.channel, h.pool), top, h.pool === "send" ? 2 : 0));
  }
  const cooling = new Set((cluster.pods || []).flatMap((p) => p.cooldown || []));
  for (const key of [...channels.keys()].sort()) {
    const [channel, pool] = key.split(":");
    const held = (cluster.holders || []).find((h) => h.channel === channel && h.pool === pool);
    const cells = [];
    for (let n = 1; n <= channels.get(key); n++) {
      const holder = held && (held.holders || []).find((x) => x.slot === n);
      const row = (cluster.slots || []).find((s) => s.channel === channel && s.slot === n && pool === "stream");
      cells.push(slotCell(channel, pool, n, holder, row, cooling.has(channel + ":" + pool + "/" + n), !!cluster.quarantine && !holder));
    }
    box.append(el("h3", {}, channel + " · " + pool + " slots"), el("div", { class: "grid" }, cells));
  }
  if (!channels.size) box.append(el("p", { class: "muted" }, "no slot known yet"));
}

function drawLag(cluster) {
  const lag = cluster.oldest_unpublished_ms;
  $("lag").replaceChildren(el("span", { "data-lag": lag === null || lag === undefined ? "unknown" : String(lag) },
    lag === null || lag === undefined ? "publication lag unknown"
      : lag === 0 ? "every inbound message is on the bus" : "oldest inbound message not on the bus yet: " + ms(lag)));
}

function drawAlerts(cluster) {
  const alerts = cluster.alerts || [];
  $("alerts").replaceChildren(alerts.length
    ? table(["level", "alert", "channel", "slot", "since", "detail"], alerts.map((a) =>
      el("tr", { "data-alert": a.kind }, el("td", { class: "level-" + a.level }, a.level), el("td", {}, a.kind),
        el("td", {}, a.channel || "–"), el("td", {}, a.slot || "–"), el("td", {}, ago(a.since_ms)), el("td", {}, a.detail))))
    : el("p", { class: "muted", "data-alerts": "none" }, "no active alert"));
}

function drawPods(cluster) {
  const leader = cluster.leader ? cluster.leader.pod : null;
  $("pods").replaceChildren(table(["pod", "version", "uptime", "role", "held slots", "cooling"],
    (cluster.pods || []).map((p) => el("tr", { "data-pod": p.pod_id },
      el("td", {}, p.pod_id + " (pid " + p.pid + ")"), el("td", {}, p.version), el("td", {}, ms(p.uptime_s * 1000)),
      el("td", {}, p.pod_id === leader ? "leader" : ""), el("td", {}, (p.held || []).join(" ") || "–"),
      el("td", {}, (p.cooldown || []).join(" ") || "–")))));
}

function walk(node, out) {
  out.push(node);
  for (const c of node.children || []) walk(c, out);
  return out;
}

function drawChannels(tree) {
  const nodes = walk(tree, []);
  const rows = [];
  for (const n of nodes) {
    const d = n.details || {};
    if (d.breaker !== undefined || d.bucket !== undefined) {
      rows.push(el("tr", { "data-channel-node": n.id }, el("td", {}, n.id),
        el("td", {}, "breaker " + compact(d.breaker)), el("td", {}, "bucket " + compact(d.bucket))));
    }
    if (d.queue_depth !== undefined) {
      rows.push(el("tr", { "data-queue-node": n.id }, el("td", {}, n.id),
        el("td", {}, "queue " + compact(d.queue_depth)), el("td", {}, compact({ backpressure: d.backpressure, parked_waiting: d.parked_waiting }))));
    }
  }
  $("channels").replaceChildren(rows.length ? table(["actor", "", ""], rows)
    : el("p", { class: "muted" }, "this pod runs no outbound side"));
}

async function restart(id) {
  if (!token()) { alert("enter the admin token first"); return; }
  try {
    const r = await fetch("/actors/" + id + "/restart", { method: "POST", headers: authHeaders() });
    const body = await r.text();
    alert(r.ok ? "restarted " + id : "restart of " + id + " refused: HTTP " + r.status + " " + body);
  } catch (e) {
    alert("restart of " + id + " not sent: " + e.message);
  }
}

function treeNode(n) {
  const failed = n.last_error ? " failed" : "";
  const head = el("span", {},
    el("span", { class: "state" + failed }, n.id), " · " + n.state + " for " + ms(Date.now() - n.since_ms),
    n.restarts ? " · restarts " + n.restarts : "", n.last_error ? el("span", { class: "failed" }, " · " + n.last_error) : null,
    n.kind !== "root" ? el("button", { onclick: () => restart(n.id), title: "restart only this actor (admin token)" }, "restart") : null);
  const kv = Object.keys(n.details || {}).length ? el("div", { class: "kv" }, compact(n.details)) : null;
  return el("li", { "data-actor": n.id, "data-actor-state": n.state }, head, kv,
    (n.children || []).length ? el("ul", { class: "tree" }, n.children.map(treeNode)) : null);
}

function drawTree(tree) {
  $("tree").replaceChildren(el("ul", { class: "tree" }, treeNode(tree)));
}

async function drawIncidents() {
  const from = new Date(Date.now() - 3600 * 1000).toISOString();
  try {
    const r = await getJson("/v1/incidents/report?from=" + encodeURIComponent(from), authHeaders());
    const items = (name) => (r[name] && r[name].items || []).slice(-5).map((i) =>
      el("tr", { "data-incident": name }, el("td", {}, name), el("td", {}, compact(i))));
    const rows = [...items("failovers"), ...items("quarantines")];
    $("incidents").replaceChildren(el("p", {}, "failovers " + r.failovers.count + " · quarantines " + r.quarantines.count),
      rows.length ? table(["kind", "what"], rows) : el("p", { class: "muted" }, "none in the last hour"));
  } catch (e) {
    $("incidents").replaceChildren(el("p", { class: "muted" }, "needs the read token (" + e.message + ")"));
  }
}

async function refresh() {
  const failures = [];
  const [cluster, tree] = await Promise.all([
    getJson("/cluster").catch((e) => { failures.push("cannot read /cluster from this pod: " + e.message); return null; }),
    getJson("/actors").catch((e) => { failures.push("cannot read /actors from this pod: " + e.message); return null; }),
  ]);
  // One panel that cannot be drawn (an answer of an unexpected shape) leaves the others drawn, and says so.
  const draw = (what, f, data) => {
    if (!data) return;
    try { f(data); } catch (e) { failures.push("cannot draw " + what + ": " + e.message); }
  };
  if (cluster) $("ispb").textContent = "· ISPB " + cluster.ispb;
  draw("the slot map", drawSlots, cluster);
  draw("the publication lag", drawLag, cluster);
  draw("the alerts", drawAlerts, cluster);
  draw("the pods", drawPods, cluster);
  draw("the channels", drawChannels, tree);
  draw("the supervision tree", drawTree, tree);
  drawBanners(cluster, failures);
  $("refreshed").textContent = "refreshed " + new Date().toLocaleTimeString();
  document.body.dataset.refreshed = String(Date.now());
}

function start() {
  const input = $("token");
  input.value = token();
  input.addEventListener("change", () => { keepToken(input.value); drawIncidents(); });
  every(REFRESH_MS, refresh);
  every(INCIDENTS_MS, drawIncidents);
}

document.addEventListener("DOMContentLoaded", start);
