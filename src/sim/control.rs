//! The control API (its own listener, JSON): inject messages (credit transfers
//! booked on the settlement record as `settlement` says), set faults, reset,
//! and read the audit, the ledger of acknowledged ResourceIds, the settlement
//! record and the log of messages received. Tests, benchmarks and demos drive the simulator here.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cabine_actors::domain::ChannelId;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::audit::{AuditReport, OutboundRecord};
use super::faults::FaultPatch;
use super::generator::Draft;
use super::lane::Lane;
use super::settlement::{Direction, SettlementMode};
use super::state::Shared;
use super::streams::Message;

/// Most messages one inject call may create.
pub const MAX_INJECT: usize = 100_000;
/// Largest page of the ledger / the outbound log.
const MAX_PAGE: usize = 100_000;

#[derive(Clone)]
pub struct ControlState {
    pub shared: Arc<Shared>,
    pub cancel: CancellationToken,
}

pub fn router(state: ControlState) -> Router {
    Router::new()
        .route("/sim/inject", post(inject))
        .route("/sim/faults", get(faults).post(set_faults))
        .route("/sim/reset", post(reset))
        .route("/sim/audit", get(audit))
        .route("/sim/ledger", get(ledger))
        .route("/sim/settlements", get(settlements))
        .route("/sim/outbound", get(outbound))
        .route("/sim/dict/audit", get(dict_audit))
        .route("/sim/dict/faults", get(dict_faults).post(set_dict_faults))
        .route("/sim/dict/keys", get(dict_keys))
        .route("/sim/dict/policies", post(set_dict_policies))
        .with_state(state)
}

async fn dict_audit(State(s): State<ControlState>) -> Json<super::dict::DictAudit> {
    Json(s.shared.dict.audit())
}

async fn dict_faults(State(s): State<ControlState>) -> Json<super::dict::DictFaults> {
    Json(s.shared.dict.faults())
}

async fn set_dict_faults(
    State(s): State<ControlState>,
    Json(faults): Json<super::dict::DictFaults>,
) -> Json<super::dict::DictFaults> {
    s.shared.dict.set_faults(faults);
    Json(faults)
}

#[derive(Debug, Deserialize)]
struct KeysQuery {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    from: usize,
    #[serde(default = "default_key_count")]
    count: usize,
}

fn default_key_count() -> usize {
    100
}

/// Keys the simulated DICT knows, of one type (`CPF`, `CNPJ`, `PHONE`, `EMAIL`, `EVP`).
async fn dict_keys(State(s): State<ControlState>, Query(q): Query<KeysQuery>) -> Json<Vec<String>> {
    Json(s.shared.dict.directory.keys(&q.kind, q.from, q.count))
}

#[derive(Debug, Deserialize)]
struct PoliciesPatch {
    category: Option<String>,
    /// With `ispb`: the participant bucket's available tokens.
    participant_tokens: Option<f64>,
    ispb: Option<String>,
}

async fn set_dict_policies(State(s): State<ControlState>, Json(p): Json<PoliciesPatch>) -> Response {
    if let Some(category) = &p.category
        && !s.shared.dict.set_category(category)
    {
        return ControlError::BadRequest(format!("category {category:?}: one of A..=F")).into_response();
    }
    if let (Some(tokens), Some(ispb)) = (p.participant_tokens, &p.ispb) {
        s.shared.dict.set_participant_tokens(ispb, tokens);
    }
    Json(s.shared.dict.audit()).into_response()
}

/// A control request that cannot be served; the body is `{"error": "..."}`.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    BadRequest(String),
    #[error("ISPB {0:?} is not simulated")]
    UnknownParticipant(String),
    #[error("the queue holds at most {0} messages")]
    QueueFull(usize),
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let status = match self {
            ControlError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ControlError::UnknownParticipant(_) => StatusCode::NOT_FOUND,
            ControlError::QueueFull(_) => StatusCode::INSUFFICIENT_STORAGE,
        };
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

/// `cpm`/`primary` or `csm`/`secondary` (default: primary).
fn channel_of(name: Option<&str>) -> Result<ChannelId, ControlError> {
    match name.unwrap_or("cpm") {
        "cpm" | "primary" => Ok(ChannelId::Cpm),
        "csm" | "secondary" => Ok(ChannelId::Csm),
        other => Err(ControlError::BadRequest(format!("unknown channel {other:?} (cpm or csm)"))),
    }
}

fn lane_of<'a>(shared: &'a Shared, ispb: Option<&str>, channel: Option<&str>) -> Result<&'a Arc<Lane>, ControlError> {
    let channel = channel_of(channel)?;
    let ispb = ispb.unwrap_or_else(|| shared.cfg.ispbs.first().map(|i| i.as_str()).unwrap_or(""));
    shared.lane(ispb, channel).ok_or_else(|| ControlError::UnknownParticipant(ispb.to_owned()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InjectKind {
    Pacs008,
    Pacs002,
    Malformed,
    /// `body` as given, byte for byte (UTF-8 of the JSON string: NUL bytes included).
    Raw,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectRequest {
    pub ispb: Option<String>,
    pub channel: Option<String>,
    #[serde(default = "one")]
    pub count: usize,
    #[serde(default = "pacs008")]
    pub kind: InjectKind,
    pub rate_per_s: Option<f64>,
    /// The `PI-ResourceId` to deliver the message under instead of a fresh one
    /// (any length up to 16 KiB, anything but CR and LF): one message only.
    pub resource_id: Option<String>,
    /// The message of `kind: raw`.
    pub body: Option<String>,
    /// How each credit transfer meets the settlement record (pacs008 only).
    #[serde(default)]
    pub settlement: SettlementMode,
}

/// Longest `resource_id` an inject may give (twice the client's default header limit).
const MAX_INJECTED_RESOURCE_ID: usize = 16 * 1024;

impl InjectRequest {
    fn check(&self) -> Result<(), ControlError> {
        let bad = |why: &str| Err(ControlError::BadRequest(why.to_owned()));
        if self.count == 0 || self.count > MAX_INJECT {
            return bad(&format!("count must be within 1..={MAX_INJECT}"));
        }
        if self.rate_per_s.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
            return bad("rate_per_s must be a positive number");
        }
        if self.settlement != SettlementMode::Settled && self.kind != InjectKind::Pacs008 {
            return bad("settlement goes with kind pacs008");
        }
        if self.settlement == SettlementMode::Twice && (self.resource_id.is_some() || self.rate_per_s.is_some()) {
            return bad("settlement twice takes neither resource_id nor rate_per_s");
        }
        if (self.kind == InjectKind::Raw) != self.body.is_some() {
            return bad("body goes with kind raw, and kind raw needs a body");
        }
        match &self.resource_id {
            Some(_) if self.count != 1 => bad("resource_id names one message: count must be 1"),
            Some(id) if id.is_empty() || id.len() > MAX_INJECTED_RESOURCE_ID || id.contains(['\r', '\n']) => {
                bad(&format!("resource_id must be 1..={MAX_INJECTED_RESOURCE_ID} bytes without CR or LF"))
            }
            _ => Ok(()),
        }
    }
}

fn one() -> usize {
    1
}

fn pacs008() -> InjectKind {
    InjectKind::Pacs008
}

#[derive(Debug, Serialize)]
struct Injected {
    /// PI-ResourceIds, in queue order.
    ids: Vec<String>,
    /// BizMsgIdr of each message made (null for a malformed one).
    msg_ids: Vec<Option<String>>,
    /// EndToEndId of each credit transfer made (delivered or not, as `settlement` says).
    end_to_end_ids: Vec<String>,
}

async fn inject(State(state): State<ControlState>, Json(req): Json<InjectRequest>) -> Result<Response, ControlError> {
    let shared = &state.shared;
    let lane = lane_of(shared, req.ispb.as_deref(), req.channel.as_deref())?.clone();
    req.check()?;
    if lane.queued() + req.count > shared.cfg.max_queue {
        return Err(ControlError::QueueFull(shared.cfg.max_queue));
    }
    let now = shared.now();
    let drafts: Vec<Draft> = {
        let mut generator = shared.generator();
        (0..req.count)
            .map(|_| match req.kind {
                InjectKind::Pacs008 => generator.credit_transfer(&lane.ispb, now),
                InjectKind::Pacs002 => generator.status_report(&lane.ispb, now),
                InjectKind::Malformed => generator.malformed(&lane.ispb, now, &shared.templates),
                InjectKind::Raw => Draft::Raw(req.body.clone().unwrap_or_default().into()),
            })
            .collect()
    };
    book_credits(shared, &lane.ispb, &drafts, req.settlement);
    let msg_ids = drafts.iter().map(|d| d.msg_id().map(str::to_owned)).collect();
    let end_to_end_ids = drafts
        .iter()
        .filter_map(|d| match d {
            Draft::CreditTransfer(c) => Some(c.end_to_end_id.clone()),
            _ => None,
        })
        .collect();
    let drafts: Vec<Draft> = drafts
        .into_iter()
        .flat_map(|d| {
            std::iter::repeat_n(d, if req.kind == InjectKind::Pacs008 { req.settlement.deliveries() } else { 1 })
        })
        .collect();
    let resource_id = || req.resource_id.as_deref().map_or_else(|| shared.next_resource_id(), Arc::from);
    let messages: Vec<Message> = drafts.into_iter().map(|d| Message::new(resource_id(), d)).collect();
    let ids = messages.iter().map(|m| m.resource_id.to_string()).collect();
    match req.rate_per_s {
        None => {
            lane.counters.injected.add(messages.len() as u64);
            lane.enqueue(messages);
        }
        Some(rate) => {
            tokio::spawn(pace(lane, messages, rate, state.cancel.clone()));
        }
    }
    Ok(Json(Injected { ids, msg_ids, end_to_end_ids }).into_response())
}

/// Books the credit transfers among `drafts` on the settlement record of `ispb`, as `mode` says.
fn book_credits(shared: &Shared, ispb: &Arc<str>, drafts: &[Draft], mode: SettlementMode) {
    if !mode.records() {
        return;
    }
    for draft in drafts {
        if let Draft::CreditTransfer(c) = draft {
            shared.settle(ispb, Direction::Credit, &c.end_to_end_id, &c.msg_id, mode.recorded_amount(&c.amount));
        }
    }
}

/// Enqueues `messages` at `rate` per second, in 10 ms steps.
async fn pace(lane: Arc<Lane>, messages: Vec<Message>, rate: f64, cancel: CancellationToken) {
    let started = tokio::time::Instant::now();
    let mut rest = messages.into_iter();
    let mut sent = 0usize;
    let total = rest.len();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while sent < total {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let due = ((started.elapsed().as_secs_f64() * rate).floor() as usize).clamp(1, total);
        if due > sent {
            let batch: Vec<Message> = rest.by_ref().take(due - sent).collect();
            lane.counters.injected.add(batch.len() as u64);
            sent += batch.len();
            lane.enqueue(batch);
        }
    }
}

async fn faults(State(state): State<ControlState>) -> Response {
    let shared = &state.shared;
    Json(json!({ "cpm": shared.faults(ChannelId::Cpm), "csm": shared.faults(ChannelId::Csm) })).into_response()
}

async fn set_faults(
    State(state): State<ControlState>,
    Json(patch): Json<FaultPatch>,
) -> Result<Response, ControlError> {
    let channels = match patch.channel.as_deref() {
        None => vec![ChannelId::Cpm, ChannelId::Csm],
        Some(name) => vec![channel_of(Some(name))?],
    };
    state.shared.update_faults(&channels, &patch).map_err(ControlError::BadRequest)?;
    Ok(faults(State(state)).await)
}

async fn reset(State(state): State<ControlState>) -> Response {
    state.shared.reset();
    Json(json!({ "reset": true })).into_response()
}

async fn audit(State(state): State<ControlState>) -> Response {
    Json(AuditReport { seed: state.shared.seed, lanes: state.shared.audit() }).into_response()
}

#[derive(Debug, Deserialize)]
struct PageQuery {
    ispb: Option<String>,
    channel: Option<String>,
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
    #[serde(default)]
    body: bool,
}

impl PageQuery {
    fn channel(&self) -> Result<Option<&'static str>, ControlError> {
        self.channel.as_deref().map(|c| channel_of(Some(c)).map(ChannelId::as_str)).transpose()
    }

    fn keeps(&self, ispb: &str, channel: &str, wanted: Option<&str>) -> bool {
        self.ispb.as_deref().is_none_or(|i| i == ispb) && wanted.is_none_or(|c| c == channel)
    }
}

async fn ledger(State(state): State<ControlState>, Query(q): Query<PageQuery>) -> Result<Response, ControlError> {
    let channel = q.channel()?;
    let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_PAGE);
    let page =
        state
            .shared
            .ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .page(q.since, limit, |e| q.keeps(&e.ispb, e.channel, channel));
    Ok(Json(page).into_response())
}

/// `GET /sim/settlements?ispb=&since=&limit=`: the settlement record, a page at a time.
async fn settlements(State(state): State<ControlState>, Query(q): Query<PageQuery>) -> Result<Response, ControlError> {
    let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_PAGE);
    let page = state.shared.settlements().page(q.since, limit, |e| q.ispb.as_deref().is_none_or(|i| i == &*e.ispb));
    Ok(Json(page).into_response())
}

#[derive(Serialize)]
struct OutboundWithBody {
    #[serde(flatten)]
    record: OutboundRecord,
    body: String,
}

async fn outbound(State(state): State<ControlState>, Query(q): Query<PageQuery>) -> Result<Response, ControlError> {
    let channel = q.channel()?;
    let limit = q.limit.unwrap_or(1_000).clamp(1, MAX_PAGE);
    let page =
        state
            .shared
            .outbound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .page(q.since, limit, |r| q.keeps(&r.ispb, r.channel, channel));
    if !q.body {
        return Ok(Json(page).into_response());
    }
    let entries: Vec<OutboundWithBody> = page
        .entries
        .into_iter()
        .map(|record| {
            let body = String::from_utf8_lossy(&record.body).into_owned();
            OutboundWithBody { record, body }
        })
        .collect();
    Ok(Json(json!({ "entries": entries, "next_since": page.next_since, "oldest_seq": page.oldest_seq }))
        .into_response())
}
