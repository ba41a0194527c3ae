//! In-memory work queue with JetStream's durable pull consumer semantics, shared
//! by every pod of a test: a pull hands out messages nobody holds, each is
//! held for `ack_wait` and then redelivered unless acknowledged; an ack removes
//! it for good. Requests get an ingress ref `OUT:{sequence}` like the real one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::ports::outbound_bus::{Arrival, IngressAck, IngressError, OutboundIngress, OutboundRequest, Pulled};

struct Entry {
    request: OutboundRequest,
    held_until: Option<Instant>,
    deliveries: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngressAudit {
    pub published: u64,
    pub delivered: u64,
    pub redelivered: u64,
    pub acked: u64,
}

#[derive(Default)]
struct Queue {
    next_seq: u64,
    entries: BTreeMap<u64, Entry>,
    audit: IngressAudit,
}

pub struct FakeIngress {
    ack_wait: Duration,
    queue: Mutex<Queue>,
    arrivals: Notify,
    down: AtomicBool,
}

impl FakeIngress {
    pub fn new(ack_wait: Duration) -> Arc<Self> {
        Arc::new(FakeIngress {
            ack_wait,
            queue: Mutex::default(),
            arrivals: Notify::new(),
            down: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes a request; returns its sequence.
    pub fn publish(&self, mut request: OutboundRequest) -> u64 {
        let mut q = self.lock();
        q.next_seq += 1;
        let seq = q.next_seq;
        let reference = Some(format!("OUT:{seq}"));
        match &mut request {
            OutboundRequest::Valid(m) => m.ingress_ref = reference,
            OutboundRequest::Invalid(m) => m.ingress_ref = reference,
        }
        q.entries.insert(seq, Entry { request, held_until: None, deliveries: 0 });
        q.audit.published += 1;
        drop(q);
        self.arrivals.notify_waiters();
        seq
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Messages not acknowledged yet.
    pub fn pending(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn audit(&self) -> IngressAudit {
        self.lock().audit.clone()
    }

    fn take(self: &Arc<Self>, max: usize) -> Vec<Pulled> {
        let now = Instant::now();
        let mut q = self.lock();
        let Queue { entries, audit, .. } = &mut *q;
        let mut out = Vec::new();
        for (seq, e) in entries.iter_mut() {
            if out.len() >= max {
                break;
            }
            if e.held_until.is_some_and(|t| t > now) {
                continue;
            }
            e.held_until = Some(now + self.ack_wait);
            e.deliveries += 1;
            audit.delivered += 1;
            if e.deliveries > 1 {
                audit.redelivered += 1;
            }
            let ack = Box::new(FakeAck { ingress: self.clone(), seq: *seq });
            out.push(Pulled { request: e.request.clone(), arrival: arrival(*seq, &e.request, e.deliveries), ack });
        }
        out
    }
}

/// The bus message a request came as: subject `out.{channel}`, no headers.
fn arrival(seq: u64, request: &OutboundRequest, deliveries: u32) -> Arrival {
    let (raw, channel) = match request {
        OutboundRequest::Valid(m) => (m.raw.clone(), Some(m.channel)),
        OutboundRequest::Invalid(m) => (m.raw.clone(), m.channel),
    };
    let channel = channel.map_or("unknown", |c| c.as_str());
    Arrival {
        ingress_ref: Some(format!("OUT:{seq}")),
        subject: format!("out.{channel}"),
        headers: vec![],
        raw,
        deliveries,
    }
}

struct FakeAck {
    ingress: Arc<FakeIngress>,
    seq: u64,
}

#[async_trait::async_trait]
impl IngressAck for FakeAck {
    async fn ack(self: Box<Self>) -> Result<(), IngressError> {
        if self.ingress.down.load(Ordering::SeqCst) {
            return Err(IngressError::Unavailable("fake bus down".into()));
        }
        let mut q = self.ingress.lock();
        if q.entries.remove(&self.seq).is_some() {
            q.audit.acked += 1;
        }
        Ok(())
    }
}

impl FakeIngress {
    /// The consumer port of one pod (acks point back at this queue).
    pub fn port(self: &Arc<Self>) -> Arc<dyn OutboundIngress> {
        Arc::new(IngressPort(self.clone()))
    }
}

struct IngressPort(Arc<FakeIngress>);

#[async_trait::async_trait]
impl OutboundIngress for IngressPort {
    async fn pull(&self, max: usize, wait: Duration) -> Result<Vec<Pulled>, IngressError> {
        let deadline = Instant::now() + wait;
        loop {
            if self.0.down.load(Ordering::SeqCst) {
                return Err(IngressError::Unavailable("fake bus down".into()));
            }
            let arrival = self.0.arrivals.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            let pulled = self.0.take(max);
            if !pulled.is_empty() || Instant::now() >= deadline {
                return Ok(pulled);
            }
            // Held messages come back after ack_wait: look again at least that often.
            let next = deadline.min(Instant::now() + self.0.ack_wait);
            tokio::select! {
                _ = arrival => {}
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }
}
