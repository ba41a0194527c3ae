//! The boot invariants of DESIGN §3: timing and pool rules that, if broken,
//! would let a request outlive its lease or the cluster exceed the Central
//! Bank's cap. A violation names the key(s) and the rule; the binary exits 64.

use super::{ConfigError, Settings};

/// Checks every cross-field rule; the first violation is returned.
pub fn check_boot_invariants(s: &Settings) -> Result<(), ConfigError> {
    check_timing(s)?;
    check_pools(s)?;
    check_channels(s)?;
    check_limits(s)?;
    check_publication(s)?;
    super::tls::check_store_tls(s)?;
    super::access::check_access(s)?;
    super::tree::check_tree(s)?;
    super::reconcile::check_reconcile(s)?;
    super::dict::check_dict(s)?;
    super::outbound::check_outbound(s)
}

fn fail(key: &str, rule: String) -> Result<(), ConfigError> {
    Err(ConfigError::invalid(key, rule))
}

fn check_timing(s: &Settings) -> Result<(), ConfigError> {
    let t = &s.timing;
    let longest = t.longest_request();
    if t.heartbeat.is_zero() {
        return fail("timing.heartbeat", "must be greater than zero".into());
    }
    if longest + t.heartbeat + t.drift_margin > t.lease {
        return fail(
            "timing.long_poll_timeout, timing.send_timeout, timing.heartbeat, timing.drift_margin, timing.lease",
            format!(
                "longest request timeout ({longest:?}) + heartbeat ({:?}) + drift_margin ({:?}) must be <= lease ({:?}), \
                 so that a fresh renewal always leaves room for a whole request",
                t.heartbeat, t.drift_margin, t.lease
            ),
        );
    }
    if t.lease < t.heartbeat * 3 {
        return fail(
            "timing.lease, timing.heartbeat",
            format!("lease ({:?}) must be >= 3 x heartbeat ({:?})", t.lease, t.heartbeat),
        );
    }
    if t.long_poll_timeout <= s.icom.server_hold {
        return fail(
            "timing.long_poll_timeout, icom.server_hold",
            format!(
                "long_poll_timeout ({:?}) must exceed the server's hold ({:?}): a GET we abandon lives on at the \
                 server until then, and the gate's busy window (timeout + gate_margin) must cover it",
                t.long_poll_timeout, s.icom.server_hold
            ),
        );
    }
    if t.lock_delay < longest {
        return fail(
            "timing.lock_delay",
            format!("lock_delay ({:?}) must be >= the longest request timeout ({longest:?})", t.lock_delay),
        );
    }
    if t.stop_timeout <= t.drain_time {
        return fail(
            "timing.stop_timeout, timing.drain_time",
            format!("stop_timeout ({:?}) must be > drain_time ({:?})", t.stop_timeout, t.drain_time),
        );
    }
    if t.backoff_base.is_zero() || t.backoff_base > t.backoff_max {
        return fail(
            "timing.backoff_base, timing.backoff_max",
            format!("0 < backoff_base ({:?}) <= backoff_max ({:?})", t.backoff_base, t.backoff_max),
        );
    }
    if t.poison_attempts == 0 {
        return fail("timing.poison_attempts", "must be at least 1".into());
    }
    Ok(())
}

fn check_pools(s: &Settings) -> Result<(), ConfigError> {
    let (stream, send, cap) = (s.pools.stream.get(), s.pools.send.get(), s.icom.max_in_flight.get());
    if !s.icom.sends_counted_separately && stream + send > cap {
        return fail(
            "pools.stream, pools.send, icom.max_in_flight",
            format!(
                "stream ({stream}) + send ({send}) must be <= max_in_flight ({cap}) \
                 unless icom.sends_counted_separately = true"
            ),
        );
    }
    if stream > cap {
        return fail("pools.stream, icom.max_in_flight", format!("stream ({stream}) must be <= max_in_flight ({cap})"));
    }
    Ok(())
}

fn check_channels(s: &Settings) -> Result<(), ConfigError> {
    if s.enabled_channels().next().is_none() {
        return fail("icom.channels", "at least one channel must be enabled".into());
    }
    for (id, c) in s.enabled_channels() {
        let key = |k: &str| format!("icom.channels.{id}.{k}");
        let uri: http::Uri = match c.base_url.parse() {
            Ok(u) => u,
            Err(e) => return fail(&key("base_url"), format!("not a URL: {e}")),
        };
        match uri.scheme_str() {
            Some("https") => {
                for (name, path) in [("ca_file", &c.ca_file), ("cert_file", &c.cert_file), ("key_file", &c.key_file)] {
                    if path.as_os_str().is_empty() {
                        return fail(&key(name), "required when base_url is https (mTLS)".into());
                    }
                }
            }
            Some("http") => {}
            _ => return fail(&key("base_url"), "scheme must be https (or http for a local simulator)".into()),
        }
        if uri.host().is_none() {
            return fail(&key("base_url"), "has no host".into());
        }
    }
    Ok(())
}

fn check_limits(s: &Settings) -> Result<(), ConfigError> {
    let l = &s.icom.limits;
    if !(1..=10).contains(&l.max_parts) {
        return fail("icom.limits.max_parts", format!("must be in 1..=10 (ICOM's batch), got {}", l.max_parts));
    }
    if l.max_body_bytes == 0 || l.max_header_bytes == 0 {
        return fail("icom.limits.max_body_bytes, icom.limits.max_header_bytes", "must be greater than zero".into());
    }
    if !(1..=70).contains(&l.max_boundary_len) {
        return fail("icom.limits.max_boundary_len", "must be in 1..=70 (RFC 2046)".into());
    }
    if s.postgres.pool_size == 0 {
        return fail("postgres.pool_size", "must be at least 1".into());
    }
    Ok(())
}

/// The republish sweep relies on JetStream's duplicate window: a row whose PubAck
/// was lost is republished after `republish_after` and must still be deduplicated.
fn check_publication(s: &Settings) -> Result<(), ConfigError> {
    let (window, after) = (s.nats.duplicate_window, s.timing.republish_after);
    if after.is_zero() || window < after * 2 {
        return fail(
            "nats.duplicate_window, timing.republish_after",
            format!("0 < 2 x republish_after ({after:?}) must be <= duplicate_window ({window:?})"),
        );
    }
    if s.nats.publish_queue == 0 || s.nats.publish_batch == 0 || s.nats.publish_batch > s.nats.publish_queue {
        return fail(
            "nats.publish_queue, nats.publish_batch",
            format!("1 <= publish_batch ({}) <= publish_queue ({})", s.nats.publish_batch, s.nats.publish_queue),
        );
    }
    if s.postgres.query_timeout.is_zero() || s.nats.lag_probe_interval.is_zero() {
        return fail("postgres.query_timeout, nats.lag_probe_interval", "must be greater than zero".into());
    }
    Ok(())
}
