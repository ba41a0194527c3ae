//! Boot rules of the operator endpoints' tokens: beyond loopback, where anyone
//! on the network may call them, `http.admin_token` (sends payments, reprocess,
//! breaker reset, actor restart) and `http.read_token` (reads of payment data)
//! must each be a real secret — set, not the shipped default, long enough, and
//! not each other. On loopback an empty token only closes (admin) or opens
//! (read) its endpoints. A violation names the key; the binary exits 64.

use super::{ConfigError, HttpSettings, Settings};

/// The placeholder `config/default.toml` ships; never accepted beyond loopback.
pub const DEFAULT_ADMIN_TOKEN: &str = "change-me";

/// Shortest token accepted beyond loopback.
pub const MIN_TOKEN_LEN: usize = 16;

pub(super) fn check_access(s: &Settings) -> Result<(), ConfigError> {
    let http = &s.http;
    let (admin, read) = (http.admin_token.expose(), http.read_token.expose());
    if !read.is_empty() && read == admin {
        return Err(ConfigError::invalid(
            "http.read_token",
            "must differ from http.admin_token: a read token must not authorize sending payments",
        ));
    }
    let addr = http.operator_addr();
    if addr.ip().is_loopback() {
        return Ok(());
    }
    check_token("http.admin_token", admin, http)?;
    check_token("http.read_token", read, http)
}

fn check_token(key: &str, token: &str, http: &HttpSettings) -> Result<(), ConfigError> {
    let listener = match http.operator_bind {
        Some(addr) => format!("http.operator_bind = {addr}"),
        None => format!("http.bind = {}", http.bind),
    };
    let why = if token.is_empty() {
        "is empty"
    } else if token == DEFAULT_ADMIN_TOKEN {
        "is the shipped default \"change-me\""
    } else if token.len() < MIN_TOKEN_LEN {
        "is shorter than 16 characters"
    } else {
        return Ok(());
    };
    Err(ConfigError::invalid(
        key,
        format!(
            "{why}, and the operator endpoints listen beyond loopback ({listener}): set a secret of its own \
             (at least {MIN_TOKEN_LEN} characters), or bind them to loopback (http.operator_bind = \"127.0.0.1:8090\")"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use crate::config::ConfigError;
    use crate::config::load_with_env as load;

    fn refused_key(env: &[(&str, &str)]) -> String {
        match load(env) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{env:?}: expected a refusal, got {other:?}"),
        }
    }

    const ADMIN: (&str, &str) = ("CABINE__HTTP__ADMIN_TOKEN", "admin-token-0123456789");
    const READ: (&str, &str) = ("CABINE__HTTP__READ_TOKEN", "read-token-0123456789");
    const WIDE: (&str, &str) = ("CABINE__HTTP__BIND", "0.0.0.0:8080");

    #[test]
    fn the_defaults_run_on_loopback_only() {
        load(&[]).expect("the shipped defaults bind loopback");
        assert_eq!(refused_key(&[WIDE]), "http.admin_token");
        assert_eq!(refused_key(&[WIDE, ("CABINE__HTTP__ADMIN_TOKEN", "")]), "http.admin_token");
        assert_eq!(refused_key(&[WIDE, ("CABINE__HTTP__ADMIN_TOKEN", "short")]), "http.admin_token");
        assert_eq!(refused_key(&[WIDE, ADMIN]), "http.read_token");
        assert_eq!(refused_key(&[WIDE, ADMIN, ("CABINE__HTTP__READ_TOKEN", "change-me")]), "http.read_token");
        load(&[WIDE, ADMIN, READ]).expect("both tokens set");
        load(&[("CABINE__HTTP__BIND", "[::1]:8080")]).expect("IPv6 loopback");
    }

    #[test]
    fn the_operator_listener_decides_not_the_metrics_one() {
        load(&[WIDE, ("CABINE__HTTP__OPERATOR_BIND", "127.0.0.1:8090")]).expect("operator endpoints on loopback");
        let wide_operator = [("CABINE__HTTP__OPERATOR_BIND", "10.0.0.7:8090")];
        assert_eq!(refused_key(&wide_operator), "http.admin_token");
    }

    #[test]
    fn the_read_token_is_never_the_admin_token() {
        let same = [ADMIN, ("CABINE__HTTP__READ_TOKEN", ADMIN.1)];
        assert_eq!(refused_key(&same), "http.read_token");
    }
}
