//! The fake ICOM server's client side: a connector handing out one connection
//! per slot grant (counted while open), each request counted in flight (429
//! beyond the cap) and logged, then served by the stream semantics of
//! [`super::icom`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::icom::{FakeIcom, StreamRec, Table};
use crate::domain::ChannelId;
use crate::ports::{CloseOutcome, IcomConnector, IcomStream, PollOutcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    Start,
    Next,
    Close,
}

#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub conn: u64,
    pub channel: ChannelId,
    pub kind: RequestKind,
    pub token: Option<String>,
    pub at: Instant,
}

pub struct FakeConnector {
    icom: Arc<FakeIcom>,
}

impl FakeIcom {
    pub fn connector(self: &Arc<Self>) -> Arc<dyn IcomConnector> {
        Arc::new(FakeConnector { icom: self.clone() })
    }
}

impl IcomConnector for FakeConnector {
    fn stream(&self, channel: ChannelId) -> Box<dyn IcomStream> {
        let mut t = self.icom.lock();
        t.next_id += 1;
        let conn = t.next_id;
        let audit = &mut t.channels.entry(channel).or_default().audit;
        audit.connections += 1;
        audit.max_connections = audit.max_connections.max(audit.connections);
        Box::new(FakeConn { icom: self.icom.clone(), channel, conn })
    }
}

struct FakeConn {
    icom: Arc<FakeIcom>,
    channel: ChannelId,
    conn: u64,
}

impl Drop for FakeConn {
    fn drop(&mut self) {
        self.icom.lock().channels.entry(self.channel).or_default().audit.connections -= 1;
    }
}

/// One request in flight; dropping it (answer sent or client gone) frees its place.
struct Flight {
    icom: Arc<FakeIcom>,
    channel: ChannelId,
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.icom.lock().channels.entry(self.channel).or_default().in_flight -= 1;
    }
}

impl FakeConn {
    /// Serves a read to its end in a task of the server's: a client that goes
    /// away drops only its wait, the request stays in flight and may still be
    /// handed a batch.
    async fn serve(&self, flight: Flight, id: u64, fresh: bool) -> PollOutcome {
        let (icom, channel) = (self.icom.clone(), self.channel);
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let outcome = icom.read(channel, id, fresh).await;
            drop(flight);
            let _ = tx.send(outcome);
        });
        rx.await.unwrap_or_else(|_| PollOutcome::Transport("fake server gone".into()))
    }

    fn begin(&self, kind: RequestKind, token: Option<&str>) -> Result<Flight, PollOutcome> {
        let max = self.icom.settings.max_in_flight;
        let mut t = self.icom.lock();
        let record = RequestRecord {
            conn: self.conn,
            channel: self.channel,
            kind,
            token: token.map(str::to_owned),
            at: Instant::now(),
        };
        t.log.push(record);
        let ch = t.channels.entry(self.channel).or_default();
        if ch.in_flight >= max {
            ch.audit.rate_limited += 1;
            return Err(PollOutcome::RateLimited { retry_after: Some(Duration::from_secs(1)) });
        }
        if let Some(scripted) = ch.scripted.pop_front() {
            return Err(scripted);
        }
        if let Some(outage) = &ch.outage {
            return Err(outage.clone());
        }
        ch.in_flight += 1;
        ch.audit.max_in_flight = ch.audit.max_in_flight.max(ch.in_flight);
        Ok(Flight { icom: self.icom.clone(), channel: self.channel })
    }
}

#[async_trait::async_trait]
impl IcomStream for FakeConn {
    async fn start(&mut self) -> PollOutcome {
        let flight = match self.begin(RequestKind::Start, None) {
            Ok(f) => f,
            Err(answer) => return answer,
        };
        let id = {
            let mut t = self.icom.lock();
            t.next_id += 1;
            let id = t.next_id;
            let ch = t.channels.entry(self.channel).or_default();
            self.icom.expire_idle(ch);
            if ch.streams.len() >= self.icom.settings.max_streams {
                ch.audit.too_many_streams += 1;
                return PollOutcome::TooManyStreams;
            }
            let rec = StreamRec {
                token: String::new(),
                prev: None,
                seq: 0,
                unacked: Vec::new(),
                last_used: Instant::now(),
                active: 0,
            };
            ch.streams.insert(id, rec);
            ch.audit.streams_started += 1;
            ch.audit.max_open_streams = ch.audit.max_open_streams.max(ch.streams.len());
            id
        };
        self.serve(flight, id, true).await
    }

    async fn next(&mut self, pull_next: &str) -> PollOutcome {
        let flight = match self.begin(RequestKind::Next, Some(pull_next)) {
            Ok(f) => f,
            Err(answer) => return answer,
        };
        let (id, fresh) = {
            let mut t = self.icom.lock();
            let Table { channels, acked, .. } = &mut *t;
            let ch = channels.entry(self.channel).or_default();
            self.icom.expire_idle(ch);
            let current = ch.streams.iter().find(|(_, s)| s.token == pull_next).map(|(id, _)| *id);
            let previous = ch.streams.iter().find(|(_, s)| s.prev.as_deref() == Some(pull_next)).map(|(id, _)| *id);
            match (current, previous) {
                (Some(id), _) => {
                    let s = ch.streams.get_mut(&id).expect("found above");
                    let batch = std::mem::take(&mut s.unacked);
                    (s.prev, s.last_used) = (Some(pull_next.to_owned()), Instant::now());
                    self.icom.ack(self.channel, ch, acked, batch);
                    (id, true)
                }
                (None, Some(id)) => {
                    let s = ch.streams.get_mut(&id).expect("found above");
                    s.last_used = Instant::now();
                    if !s.unacked.is_empty() {
                        let (batch, pull_next) = (s.unacked.clone(), s.token.clone());
                        ch.audit.delivered += batch.len() as u64;
                        ch.audit.redelivered += batch.len() as u64;
                        return PollOutcome::Messages { batch, pull_next };
                    }
                    (id, false)
                }
                (None, None) => return PollOutcome::UnknownStream,
            }
        };
        self.serve(flight, id, fresh).await
    }

    async fn close(&mut self, pull_next: &str) -> CloseOutcome {
        let _flight = match self.begin(RequestKind::Close, Some(pull_next)) {
            Ok(f) => f,
            Err(answer) => return CloseOutcome::Failed(format!("{answer:?}")),
        };
        let mut t = self.icom.lock();
        let Table { channels, acked, .. } = &mut *t;
        let ch = channels.entry(self.channel).or_default();
        self.icom.expire_idle(ch);
        let current = ch.streams.iter().find(|(_, s)| s.token == pull_next).map(|(id, _)| *id);
        let previous = ch.streams.iter().find(|(_, s)| s.prev.as_deref() == Some(pull_next)).map(|(id, _)| *id);
        if let Some(s) = current.and_then(|id| ch.streams.remove(&id)) {
            ch.audit.streams_closed += 1;
            self.icom.ack(self.channel, ch, acked, s.unacked);
        } else if let Some(s) = previous.and_then(|id| ch.streams.remove(&id)) {
            ch.audit.streams_closed += 1;
            for m in s.unacked.into_iter().rev() {
                ch.pending.push_front(m);
            }
            self.icom.arrivals.notify_waiters();
        }
        // An unknown stream answers 410: treated as closed.
        CloseOutcome::Closed
    }
}
