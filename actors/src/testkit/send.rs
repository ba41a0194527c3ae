//! The fake ICOM's "in" endpoint (sends), judged like the simulator judges:
//! concurrent POSTs per channel (429 beyond `max_in_flight`), connections,
//! every MsgId stored and how often (a second 201 for one MsgId is a
//! duplicate), and — through a judge wired to the lease store — any POST
//! started while its pod held no valid send lease. Faults: a window of 5xx,
//! poison MsgIds (5xx), refused MsgIds (4xx), scripted replies.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::ports::{IcomSender, SendConnector, SendRefused, SendReply};

#[derive(Clone, Debug)]
pub struct FakeSendSettings {
    pub max_in_flight: usize,
    /// Time each POST takes.
    pub latency: Duration,
}

/// Per channel, what the "simulator" saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendAudit {
    pub posts: u64,
    /// Distinct MsgIds stored (answered 201).
    pub stored: u64,
    /// 201s for a MsgId already stored.
    pub duplicates: u64,
    pub max_in_flight: usize,
    /// 429s for exceeding the concurrent-request cap.
    pub over_cap: u64,
    pub server_errors: u64,
    pub rejected: u64,
    pub connections: usize,
    pub max_connections: usize,
    /// POSTs started while the pod held no valid send lease of the channel.
    pub without_lease: u64,
}

/// One POST as it arrived.
#[derive(Clone, Debug)]
pub struct SendRecord {
    pub pod: String,
    pub channel: ChannelId,
    pub msg_ids: Vec<String>,
    pub at: Instant,
    pub reply: &'static str,
}

/// Says whether `pod` holds a valid send lease of `channel` now.
pub type LeaseJudge = Box<dyn Fn(ChannelId, &str) -> bool + Send + Sync>;

#[derive(Default)]
struct Table {
    in_flight: HashMap<ChannelId, usize>,
    audit: HashMap<ChannelId, SendAudit>,
    stored: HashMap<String, u32>,
    script: VecDeque<SendReply>,
    failing: Option<u16>,
    poison: HashMap<String, u16>,
    refuse: HashMap<String, u16>,
    log: Vec<SendRecord>,
    next_id: u64,
}

pub struct FakeIcomOut {
    settings: FakeSendSettings,
    table: Mutex<Table>,
    judge: Mutex<Option<LeaseJudge>>,
}

impl FakeIcomOut {
    pub fn new(settings: FakeSendSettings) -> Arc<Self> {
        Arc::new(FakeIcomOut { settings, table: Mutex::default(), judge: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_lease_judge(&self, judge: LeaseJudge) {
        *self.judge.lock().unwrap_or_else(|p| p.into_inner()) = Some(judge);
    }

    /// Every POST answers `status` (5xx) until `None`.
    pub fn set_failing(&self, status: Option<u16>) {
        self.lock().failing = status;
    }

    /// A POST carrying `msg_id` answers `status` (5xx: a poison message).
    pub fn poison(&self, msg_id: &str, status: u16) {
        self.lock().poison.insert(msg_id.to_owned(), status);
    }

    /// A POST carrying `msg_id` is refused with `status` (4xx).
    pub fn refuse(&self, msg_id: &str, status: u16) {
        self.lock().refuse.insert(msg_id.to_owned(), status);
    }

    /// Clears every injected fault (5xx window, poison, refusals, scripted replies).
    pub fn clear_faults(&self) {
        let mut t = self.lock();
        (t.failing, t.poison, t.refuse, t.script) = (None, HashMap::new(), HashMap::new(), VecDeque::new());
    }

    /// The next POSTs get these replies.
    pub fn script(&self, replies: impl IntoIterator<Item = SendReply>) {
        self.lock().script.extend(replies);
    }

    pub fn audit(&self, channel: ChannelId) -> SendAudit {
        self.lock().audit.get(&channel).cloned().unwrap_or_default()
    }

    /// How many times `msg_id` was stored (answered 201).
    pub fn stored(&self, msg_id: &str) -> u32 {
        self.lock().stored.get(msg_id).copied().unwrap_or(0)
    }

    pub fn log(&self) -> Vec<SendRecord> {
        self.lock().log.clone()
    }

    /// The send connector of one pod.
    pub fn connector(self: &Arc<Self>, pod: &str) -> Arc<dyn SendConnector> {
        Arc::new(FakeSendConnector { icom: self.clone(), pod: pod.to_owned() })
    }

    fn answer(&self, channel: ChannelId, msg_ids: &[String]) -> SendReply {
        let mut t = self.lock();
        let reply = if let Some(scripted) = t.script.pop_front() {
            scripted
        } else if let Some(status) = t.failing {
            SendReply::ServerError { status }
        } else if let Some(status) = msg_ids.iter().find_map(|m| t.poison.get(m).copied()) {
            SendReply::ServerError { status }
        } else if let Some(status) = msg_ids.iter().find_map(|m| t.refuse.get(m).copied()) {
            SendReply::Rejected { status, reason: "refused by the fake".into() }
        } else {
            SendReply::Accepted { resource_ids: msg_ids.iter().map(|m| format!("R-{m}")).collect() }
        };
        if let SendReply::Accepted { .. } = reply {
            for m in msg_ids {
                let times = {
                    let times = t.stored.entry(m.clone()).or_default();
                    *times += 1;
                    *times
                };
                let audit = t.audit.entry(channel).or_default();
                if times == 1 { audit.stored += 1 } else { audit.duplicates += 1 }
            }
        }
        let audit = t.audit.entry(channel).or_default();
        match reply {
            SendReply::ServerError { .. } => audit.server_errors += 1,
            SendReply::Rejected { .. } => audit.rejected += 1,
            _ => {}
        }
        reply
    }
}

struct FakeSendConnector {
    icom: Arc<FakeIcomOut>,
    pod: String,
}

impl SendConnector for FakeSendConnector {
    fn sender(&self, channel: ChannelId) -> Box<dyn IcomSender> {
        let mut t = self.icom.lock();
        let audit = t.audit.entry(channel).or_default();
        audit.connections += 1;
        audit.max_connections = audit.max_connections.max(audit.connections);
        Box::new(FakeSendConn { icom: self.icom.clone(), pod: self.pod.clone(), channel })
    }
}

struct FakeSendConn {
    icom: Arc<FakeIcomOut>,
    pod: String,
    channel: ChannelId,
}

impl Drop for FakeSendConn {
    fn drop(&mut self) {
        self.icom.lock().audit.entry(self.channel).or_default().connections -= 1;
    }
}

/// One POST in flight; dropping it (answered, or the client gone) frees its place.
struct Flight {
    icom: Arc<FakeIcomOut>,
    channel: ChannelId,
}

impl Drop for Flight {
    fn drop(&mut self) {
        *self.icom.lock().in_flight.entry(self.channel).or_default() -= 1;
    }
}

/// The MsgId of a raw message: the text of its first `<MsgId>` (or `<BizMsgIdr>`).
pub fn msg_id_of(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    for tag in ["MsgId", "BizMsgIdr"] {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        if let Some(start) = text.find(&open).map(|i| i + open.len())
            && let Some(len) = text[start..].find(&close)
        {
            return text[start..start + len].to_owned();
        }
    }
    String::new()
}

#[async_trait::async_trait]
impl IcomSender for FakeSendConn {
    async fn send(&mut self, batch: &[Bytes]) -> Result<SendReply, SendRefused> {
        if batch.is_empty() || batch.len() > 10 {
            return Err(SendRefused::Unusable(format!("{} messages", batch.len())));
        }
        let msg_ids: Vec<String> = batch.iter().map(|b| msg_id_of(b)).collect();
        let leased = self
            .icom
            .judge
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|j| j(self.channel, &self.pod));
        let flight = {
            let mut t = self.icom.lock();
            t.next_id += 1;
            let in_flight = t.in_flight.entry(self.channel).or_default();
            *in_flight += 1;
            let now = *in_flight;
            let audit = t.audit.entry(self.channel).or_default();
            audit.posts += 1;
            audit.max_in_flight = audit.max_in_flight.max(now);
            audit.without_lease += u64::from(!leased);
            let flight = Flight { icom: self.icom.clone(), channel: self.channel };
            if now > self.icom.settings.max_in_flight {
                audit.over_cap += 1;
                drop(t);
                drop(flight);
                return Ok(SendReply::RateLimited { retry_after: Some(Duration::from_secs(1)) });
            }
            flight
        };
        // Like a real server, the POST is handled to its end even if the client goes away.
        let (icom, pod, channel) = (self.icom.clone(), self.pod.clone(), self.channel);
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            tokio::time::sleep(icom.settings.latency).await;
            let reply = icom.answer(channel, &msg_ids);
            drop(flight);
            let record = SendRecord { pod, channel, msg_ids, at: Instant::now(), reply: reply.label() };
            icom.lock().log.push(record);
            let _ = tx.send(reply);
        });
        Ok(rx.await.unwrap_or_else(|_| SendReply::Transport("fake server gone".into())))
    }
}
