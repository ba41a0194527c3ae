//! The properties checked on every reachable state (DESIGN §2.1, §2.2, §2.4) and the liveness
//! property checked on every run that ends.

use stateright::Property;

use crate::model::SlotProtocol;
use crate::state::World;

pub const ONE_REQUEST_PER_STREAM: &str = "at most one request in flight per stream";
pub const WITHIN_CAP: &str = "in-flight requests within the cap";
pub const NO_LOSS: &str = "nothing acknowledged that is not committed";
pub const FENCES_INCREASE: &str = "fences strictly increase per slot";
pub const TOKENS_KNOWN: &str = "no GET on a pull-next the server no longer knows";
pub const PERSISTED: &str = "once faults stop, every received message is persisted";
pub const TAKEOVER: &str = "a slot changes holder";
pub const ALL_PERSISTED: &str = "every message is persisted";

/// Safety properties (stateright `always`).
pub const SAFETY: &[&str] = &[ONE_REQUEST_PER_STREAM, WITHIN_CAP, NO_LOSS, FENCES_INCREASE, TOKENS_KNOWN];

fn one_request_per_stream(m: &SlotProtocol, w: &World) -> bool {
    (0..m.cfg.slots).all(|s| w.server.in_flight(Some(s)) <= 1)
}

/// The cap is the number of slots: any overlap on one slot goes over it.
fn within_cap(m: &SlotProtocol, w: &World) -> bool {
    w.server.in_flight(None) <= m.cfg.slots
}

fn no_loss(_: &SlotProtocol, w: &World) -> bool {
    w.server.acked & !w.pg.inbox == 0
}

fn fences_increase(_: &SlotProtocol, w: &World) -> bool {
    !w.ghost.fence_regressed
}

fn tokens_known(_: &SlotProtocol, w: &World) -> bool {
    !w.ghost.unknown_token
}

/// Holds from the moment faults stop and everything received is in the inbox; the run ends
/// `recovery` ticks after faults stop, so a run that ends without it is a counterexample.
fn persisted(_: &SlotProtocol, w: &World) -> bool {
    w.ghost.stopped && w.all_persisted()
}

fn takeover(_: &SlotProtocol, w: &World) -> bool {
    w.ghost.takeover
}

fn all_persisted(m: &SlotProtocol, w: &World) -> bool {
    w.server.arrived == m.cfg.messages && w.all_persisted()
}

pub fn properties() -> Vec<Property<SlotProtocol>> {
    vec![
        Property::always(ONE_REQUEST_PER_STREAM, one_request_per_stream),
        Property::always(WITHIN_CAP, within_cap),
        Property::always(NO_LOSS, no_loss),
        Property::always(FENCES_INCREASE, fences_increase),
        Property::always(TOKENS_KNOWN, tokens_known),
        Property::eventually(PERSISTED, persisted),
        Property::sometimes(TAKEOVER, takeover),
        Property::sometimes(ALL_PERSISTED, all_persisted),
    ]
}
