//! The durable request gate of one slot as its holder sees it (DESIGN §2.5:
//! "Redis decides who should, Postgres decides who may").
//!
//! The slot's Postgres row carries `busy_until` (Postgres's clock). Every
//! fenced write the holder makes sets it to `max(busy_until, now() +
//! busy_for)`, `busy_for` = the request timeout + `margin`. A write arms ONE
//! request, which must leave within `margin` of the moment the write was SENT
//! (monotonic clock): then it ends, timeout included, before `busy_until`.
//! A new holder's claim takes the next fence and tells how long the previous
//! holder's window still runs (`wait`): nothing leaves before it has passed.
//! A release clears `busy_until` only when none of the holder's requests can
//! still be in flight; an aborted or unanswered request leaves it standing.
//! The holder itself does not send again before the busy window of a request
//! that timed out has passed: the server may hold it past our timeout (found
//! by the model check, `docs/model.md`).
//! So even when Redis grants a slot twice (eviction, a snapshot rollback, a
//! lease released right after an aborted request), two holders never have a
//! request in flight at once, and a stale holder's write is refused by the fence.
//!
//! Architecture invariant: no ICOM request leaves without [`Gate::ready`]
//! answering [`Ready::Go`] just before it, followed by [`Gate::spend`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The holder's side of one slot's gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// Our fence: every write is conditioned on it.
    pub fence: i64,
    /// Request timeout + margin: the busy window each write opens.
    busy_for: Duration,
    /// How soon after a write was sent its request must leave.
    margin: Duration,
    /// Before this the previous holder's last request may still be in flight.
    opens_at: Instant,
    /// The latest moment the armed (written, unspent) request may leave; `None`: arm first.
    armed_until: Option<Instant>,
    /// A request of ours left and has not been answered (in flight, aborted,
    /// timed out): a release must leave `busy_until` standing.
    in_doubt: bool,
    /// Until then the unanswered request may still be at the server (the end
    /// of the busy window its write opened): nothing more is sent before.
    doubt_until: Option<Instant>,
}

/// What the holder may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// Send the request now (then [`Gate::spend`]).
    Go,
    /// The previous holder's window still runs: wait this long.
    Wait(Duration),
    /// No unspent write within the margin: write (arm) first.
    Arm,
}

/// Why a request could not pass the gate.
#[derive(Debug, PartialEq, Eq)]
pub enum Blocked<E> {
    /// The store refused or failed the write.
    Store(E),
    /// Writes keep taking longer than the margin: Postgres too slow to gate on.
    Slow(Duration),
}

/// Arm attempts before [`pass`] gives up on a slow store.
const MAX_ARMS: u32 = 3;

impl Gate {
    /// A claim sent at `sent`, answered at `answered`, said to `wait`. With
    /// nothing to wait for, its own window arms the first request (which leaves
    /// by `sent + margin`); else nothing leaves before `answered + wait`, and
    /// then only after a fresh write.
    pub fn claimed(
        fence: i64,
        sent: Instant,
        answered: Instant,
        wait: Duration,
        timeout: Duration,
        margin: Duration,
    ) -> Gate {
        Gate {
            fence,
            busy_for: timeout + margin,
            margin,
            opens_at: answered + wait,
            armed_until: wait.is_zero().then_some(sent + margin),
            in_doubt: false,
            doubt_until: None,
        }
    }

    /// The busy window every write of this holder asks for.
    pub fn busy_for(&self) -> Duration {
        self.busy_for
    }

    /// A fenced write sent at `sent` succeeded: it arms the next request.
    pub fn written(&mut self, sent: Instant) {
        self.armed_until = Some(sent + self.margin);
    }

    pub fn ready(&self, now: Instant) -> Ready {
        if now < self.opens_at {
            return Ready::Wait(self.opens_at - now);
        }
        if let Some(until) = self.doubt_until.filter(|u| now < *u) {
            return Ready::Wait(until - now);
        }
        match self.armed_until {
            Some(until) if now <= until => Ready::Go,
            _ => Ready::Arm,
        }
    }

    /// The request leaves now: its arming is used up and it is in doubt until
    /// answered — at most until the busy window its write opened ends.
    pub fn spend(&mut self) {
        let timeout = self.busy_for.saturating_sub(self.margin);
        self.doubt_until = self.armed_until.map(|until| until + timeout);
        self.armed_until = None;
        self.in_doubt = true;
    }

    /// The server answered the request (whatever it said): it is no longer in flight.
    pub fn answered(&mut self) {
        self.in_doubt = false;
        self.doubt_until = None;
    }

    /// A request left and was not answered: it may still be in flight at the server.
    pub fn in_doubt(&self) -> bool {
        self.in_doubt
    }

    /// May a release clear `busy_until` now? Only with nothing of ours in flight
    /// and the previous holder's window over.
    pub fn may_clear(&self, now: Instant) -> bool {
        !self.in_doubt && now >= self.opens_at
    }

    /// The gate as an owner knows it after aborting, at `now`, the task that
    /// held the live one: any request that task sent is in doubt until the busy
    /// window of any write it made has passed (at most `busy_for` from now).
    pub fn aborted(mut self, now: Instant) -> Gate {
        self.in_doubt = true;
        self.armed_until = None;
        self.doubt_until = Some(now + self.busy_for);
        self
    }
}

/// Waits and arms (with `arm`, a fenced write of `busy_until`) until a request
/// may leave; the caller sends it at once and calls [`Gate::spend`].
pub async fn pass<E, F, Fut>(gate: &mut Gate, mut arm: F) -> Result<(), Blocked<E>>
where
    F: FnMut(i64, Duration) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut arms = 0;
    loop {
        match gate.ready(Instant::now()) {
            Ready::Go => return Ok(()),
            Ready::Wait(left) => tokio::time::sleep(left).await,
            Ready::Arm if arms >= MAX_ARMS => return Err(Blocked::Slow(gate.margin)),
            Ready::Arm => {
                arms += 1;
                let sent = Instant::now();
                arm(gate.fence, gate.busy_for).await.map_err(Blocked::Store)?;
                gate.written(sent);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_arms_one_request_within_the_margin() {
        let t = Instant::now();
        let mut gate = Gate::claimed(3, t, t + ms(5), Duration::ZERO, ms(1000), ms(100));
        assert_eq!(gate.busy_for(), ms(1100));
        assert_eq!(gate.ready(t + ms(5)), Ready::Go);
        assert_eq!(gate.ready(t + ms(101)), Ready::Arm, "past the margin of the claim");
        gate.spend();
        assert!(gate.in_doubt());
        assert_eq!(gate.ready(t + ms(6)), Ready::Wait(ms(1094)), "unanswered: its window first");
        gate.answered();
        assert_eq!(gate.ready(t + ms(6)), Ready::Arm, "one write, one request");
        gate.written(t + ms(500));
        assert_eq!(gate.ready(t + ms(550)), Ready::Go);
        assert!(gate.may_clear(t + ms(550)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_holder_waits_out_the_previous_window_and_never_clears_it_early() {
        let t = Instant::now();
        let gate = Gate::claimed(4, t, t + ms(10), ms(700), ms(1000), ms(100));
        assert_eq!(gate.ready(t + ms(10)), Ready::Wait(ms(700)));
        assert!(!gate.may_clear(t + ms(500)), "the previous holder's request may be in flight");
        assert_eq!(gate.ready(t + ms(710)), Ready::Arm, "after a wait, a fresh write arms the first request");
        let aborted = gate.aborted(t + ms(900));
        assert!(
            aborted.in_doubt() && !aborted.may_clear(t + ms(5000)),
            "an aborted request leaves busy_until standing"
        );
        assert_eq!(aborted.ready(t + ms(900)), Ready::Wait(ms(1100)), "and is waited out before another request");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_timed_out_is_waited_out_before_the_next_one_leaves() {
        let t = Instant::now();
        let mut gate = Gate::claimed(2, t, t, Duration::ZERO, ms(1000), ms(100));
        gate.spend();
        // Our timeout fired at t + 1000, but the server may hold the GET a little longer.
        let after_timeout = t + ms(1000);
        gate.written(after_timeout);
        assert_eq!(gate.ready(after_timeout), Ready::Wait(ms(100)), "until the write's window (t + 1100) ends");
        assert_eq!(gate.ready(t + ms(1100)), Ready::Go);
        gate.spend();
        gate.answered();
        gate.written(t + ms(1200));
        assert_eq!(gate.ready(t + ms(1200)), Ready::Go, "an answered request leaves no doubt");
    }

    #[tokio::test(start_paused = true)]
    async fn pass_waits_arms_and_gives_up_on_a_store_slower_than_the_margin() {
        let t = Instant::now();
        let mut gate = Gate::claimed(1, t, t, ms(300), ms(1000), ms(100));
        tokio::time::sleep(ms(200)).await;
        let mut writes = 0;
        let passed = pass(&mut gate, |fence, busy_for| {
            writes += 1;
            assert_eq!((fence, busy_for), (1, ms(1100)));
            async { Ok::<(), ()>(()) }
        })
        .await;
        assert_eq!((passed, writes), (Ok(()), 1), "waited out the previous window, then one write");
        assert!(Instant::now() >= t + ms(300));
        gate.spend();
        let refused = pass(&mut gate, |_, _| async { Err::<(), &str>("fence lost") }).await;
        assert_eq!(refused, Err(Blocked::Store("fence lost")));
        let slow = pass(&mut gate, |_, _| async {
            tokio::time::sleep(ms(150)).await;
            Ok::<(), ()>(())
        })
        .await;
        assert_eq!(slow, Err(Blocked::Slow(ms(100))));
    }
}
