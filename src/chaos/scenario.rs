//! The scenarios of `cabine chaos`: one kind of fault each, what it needs
//! (private Postgres / NATS), how long one fault lasts and how far apart two
//! faults must be for the cluster to recover in between.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One kind of fault, applied again and again through a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    /// SIGKILL a pod holding stream slots, start a replacement after a short delay.
    Kill,
    /// SIGSTOP a holder for longer than lease + lock_delay, then SIGCONT it.
    Pause,
    /// SIGTERM a holder (a rolling deploy), wait for its exit, start a replacement.
    Term,
    /// Kill the private redis-server and start it empty: every key forgotten, the epoch too.
    RedisRestart,
    /// Delete every key with a TTL at once (leases, quarantine, beats); the epoch stays.
    RedisEvict,
    /// SAVE, keep running, later kill Redis and restart it from that older snapshot.
    RedisRollback,
    /// Crash-stop the private Postgres (immediate), start it again.
    PgRestart,
    /// Stop the private NATS (graceful), start it again on the same store.
    NatsRestart,
}

/// Timings of the pods that the schedule depends on.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease: Duration,
    pub lock_delay: Duration,
}

impl Timing {
    /// How long a vanished holder's slot stays taken: lease + lock_delay.
    pub fn takeover(&self) -> Duration {
        self.lease + self.lock_delay
    }
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::Kill,
        Scenario::Pause,
        Scenario::Term,
        Scenario::RedisRestart,
        Scenario::RedisEvict,
        Scenario::RedisRollback,
        Scenario::PgRestart,
        Scenario::NatsRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill",
            Scenario::Pause => "pause",
            Scenario::Term => "term",
            Scenario::RedisRestart => "redis-restart",
            Scenario::RedisEvict => "redis-evict",
            Scenario::RedisRollback => "redis-rollback",
            Scenario::PgRestart => "pg-restart",
            Scenario::NatsRestart => "nats-restart",
        }
    }

    /// Position in [`Scenario::ALL`]: mixed into the seed, so a scenario's plan is
    /// the same whether it runs alone or within `all`.
    pub fn index(self) -> u64 {
        Scenario::ALL.iter().position(|s| *s == self).unwrap_or(0) as u64
    }

    pub fn needs_private_postgres(self) -> bool {
        self == Scenario::PgRestart
    }

    pub fn needs_private_nats(self) -> bool {
        self == Scenario::NatsRestart
    }

    /// The range of one fault's `hold`: the pause, the delay before a replacement
    /// pod, a server's down time, or the time from SAVE to the restart that loads it.
    pub fn hold_range(self, t: Timing) -> (Duration, Duration) {
        let ms = Duration::from_millis;
        match self {
            // Longer than the lease and its lock delay: the slot is taken over while the pod sleeps.
            Scenario::Pause => (t.takeover() + ms(500), t.takeover() + ms(2500)),
            Scenario::Kill | Scenario::Term => (ms(200), ms(1500)),
            Scenario::RedisRestart => (ms(200), ms(2000)),
            Scenario::RedisEvict => (Duration::ZERO, Duration::ZERO),
            // Below and above the slot keys' TTL: restored grants that are still live, and ones that expired.
            Scenario::RedisRollback => (ms(500), t.takeover() + ms(1500)),
            Scenario::PgRestart | Scenario::NatsRestart => (ms(500), ms(3000)),
        }
    }

    /// Least time from one fault's start to the next: the fault itself and a recovery
    /// (a takeover after lease + lock_delay, a quarantine of the same length, a replacement pod's start).
    pub fn spacing(self, t: Timing) -> Duration {
        let (_, longest) = self.hold_range(t);
        let recovery = match self {
            Scenario::Kill | Scenario::Term => t.takeover() + Duration::from_secs(2),
            Scenario::Pause => t.takeover() + Duration::from_secs(1),
            Scenario::RedisRestart | Scenario::RedisEvict | Scenario::RedisRollback => {
                t.takeover() + Duration::from_secs(3)
            }
            Scenario::PgRestart | Scenario::NatsRestart => Duration::from_secs(5),
        };
        longest + recovery
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `--scenario` names: one scenario, or `all` of them in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    One(Scenario),
    All,
}

impl Choice {
    pub fn scenarios(self) -> Vec<Scenario> {
        match self {
            Choice::One(s) => vec![s],
            Choice::All => Scenario::ALL.to_vec(),
        }
    }
}

impl FromStr for Choice {
    type Err = String;

    fn from_str(s: &str) -> Result<Choice, String> {
        if s == "all" {
            return Ok(Choice::All);
        }
        Scenario::ALL.iter().find(|c| c.name() == s).map(|c| Choice::One(*c)).ok_or_else(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|c| c.name()).collect();
            format!("unknown scenario {s:?}: one of {} or all", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing { lease: Duration::from_secs(2), lock_delay: Duration::from_secs(1) };

    #[test]
    fn every_name_parses_back_and_all_is_every_scenario() {
        for s in Scenario::ALL {
            assert_eq!(s.name().parse::<Choice>(), Ok(Choice::One(s)));
        }
        assert_eq!("all".parse::<Choice>().map(Choice::scenarios), Ok(Scenario::ALL.to_vec()));
        assert!("flood".parse::<Choice>().is_err());
    }

    #[test]
    fn a_pause_outlasts_the_lease_and_its_lock_delay() {
        let (shortest, _) = Scenario::Pause.hold_range(T);
        assert!(shortest > T.takeover());
    }

    #[test]
    fn a_rollback_restores_both_live_and_expired_grants() {
        let (shortest, longest) = Scenario::RedisRollback.hold_range(T);
        assert!(shortest < T.takeover() && longest > T.takeover());
    }

    #[test]
    fn faults_leave_room_for_a_takeover() {
        for s in Scenario::ALL {
            assert!(s.spacing(T) > s.hold_range(T).1, "{s}");
        }
    }
}
