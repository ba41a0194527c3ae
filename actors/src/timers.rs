//! Generation stamps for an actor's continuations. Every timer an actor arms
//! and every task it spawns comes back as `Stamped(generation, step)`; arming
//! anew moves the generation on, so a stale tick or task result is recognised
//! by the shape of the message and dropped in one place, never by a guard
//! repeated per variant. A spawned task that panics fails its actor (through
//! [`Stamped::panicked`]) instead of leaving it waiting forever with a lease
//! the heartbeat keeps renewing.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use ractor::{ActorRef, Message};

use crate::task::OwnedTask;

/// A message enum whose continuations are stamped with a generation.
pub trait Stamped: Message {
    /// What a timer or task brings back.
    type Step: Send + 'static;
    fn stamped(generation: u64, step: Self::Step) -> Self;
    /// A task of this actor panicked: handling this message fails the actor.
    fn panicked(why: String) -> Self;
}

/// The current generation of one actor's continuations.
#[derive(Debug, Default)]
pub struct Timers {
    generation: u64,
}

impl Timers {
    /// True when a continuation stamped `generation` is still wanted.
    pub fn is_current(&self, generation: u64) -> bool {
        generation == self.generation
    }

    /// Drops every continuation armed so far; returns the new stamp.
    pub fn invalidate(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Sends `step` to `me` after `after` (at once when zero), dropping what was armed before.
    pub fn arm<M: Stamped>(&mut self, me: &ActorRef<M>, after: Duration, step: M::Step) {
        let generation = self.invalidate();
        if after.is_zero() {
            let _ = me.send_message(M::stamped(generation, step));
        } else {
            me.send_after(after, move || M::stamped(generation, step));
        }
    }

    /// Runs `work` in a task owned by the caller; its result comes back stamped,
    /// a panic comes back as [`Stamped::panicked`]. Drops what was armed before.
    pub fn spawn<M: Stamped>(
        &mut self,
        me: &ActorRef<M>,
        work: impl Future<Output = M::Step> + Send + 'static,
    ) -> OwnedTask {
        let generation = self.invalidate();
        let me = me.clone();
        OwnedTask::spawn(async move {
            let message = match AssertUnwindSafe(work).catch_unwind().await {
                Ok(step) => M::stamped(generation, step),
                Err(panic) => M::panicked(panic_text(panic.as_ref())),
            };
            let _ = me.send_message(message);
        })
    }
}

/// The panic's message, when it has one.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("task panicked: {text}")
}
