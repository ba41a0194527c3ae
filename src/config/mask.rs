//! `mask_credentials`: the one function that takes credentials out of a text
//! before it is shown — `check-config`, every log line, connect errors, the
//! readiness details and `/cluster` errors all go through it.
//!
//! It masks, wherever they appear in the text: the password of a URL's
//! userinfo (`scheme://user:PASSWORD@host`), a userinfo without a colon where
//! the scheme makes it a token (`nats://TOKEN@host`, `https://TOKEN@host`; a
//! Postgres or Redis URL's lone userinfo is a user name and stays), and the value
//! of a secret-looking `key=value` pair (`?password=…`, `&token=…`, a libpq
//! `password=… ` string, `api_key`, `secret`, `jwt`, `nkey`, …).

use std::sync::LazyLock;

use regex::{Captures, Regex};

/// What stands where a credential was.
const MASK: &str = "[redacted]";

/// Schemes whose lone userinfo (no colon) is a user name, not a token.
const USER_NAME_SCHEMES: &[&str] = &["postgres", "postgresql", "redis", "rediss", "valkey", "valkeys"];

/// A secret-looking `key=value`, the key starting the text or after a separator.
static SECRET_PAIR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)(^|[?&\s;,("'{])([a-z0-9_.\-]*(?:password|passwd|pwd|token|secret|apikey|api_key|nkey|jwt|credential|signature)[a-z0-9_.\-]*|pass|auth|sig)=([^&\s"'<>;,]+)"#,
    )
    .expect("a valid pattern")
});

/// `text` with every credential it carries replaced by `[redacted]`.
pub fn mask_credentials(text: &str) -> String {
    let urls = mask_userinfo(text);
    let masked = SECRET_PAIR.replace_all(&urls, |c: &Captures<'_>| {
        if c[3].eq_ignore_ascii_case(MASK) { c[0].to_owned() } else { format!("{}{}={MASK}", &c[1], &c[2]) }
    });
    masked.into_owned()
}

/// Every `scheme://authority` of `text` with its userinfo's secret part masked.
/// The authority runs to a path, query, fragment, quote or space — or to the
/// `,` before the next URL of a list (`nats://a@h1,nats://b@h2`); its userinfo
/// is everything before its LAST `@`, so a raw `@` in a password leaves no tail.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    while let Some(found) = text[pos..].find("://") {
        let sep = pos + found;
        let scheme = scheme_before(&text[pos..sep]);
        let start = sep + 3;
        let end = authority_end(text, start);
        out.push_str(&text[pos..start]);
        out.push_str(&masked_authority(scheme, &text[start..end]));
        pos = end;
    }
    out.push_str(&text[pos..]);
    out
}

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-')
}

/// The scheme that ends `before` (empty when none).
fn scheme_before(before: &str) -> &str {
    let start = before.rfind(|c: char| !is_scheme_char(c)).map_or(0, |i| i + 1);
    &before[start..]
}

/// Where the authority starting at `start` ends.
fn authority_end(text: &str, start: usize) -> usize {
    let rest = &text[start..];
    let end = rest.find(|c: char| c.is_whitespace() || matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>'));
    let end = end.unwrap_or(rest.len());
    // `…@h1,nats:` then `//`: the authority ends at the comma, the next URL begins after it.
    if rest[end..].starts_with("//")
        && let Some(comma) = rest[..end].rfind(',')
        && let Some(scheme) = rest[comma + 1..end].strip_suffix(':')
        && !scheme.is_empty()
        && scheme.chars().all(is_scheme_char)
    {
        return start + comma;
    }
    start + end
}

/// An authority with its userinfo's secret part masked.
fn masked_authority(scheme: &str, authority: &str) -> String {
    let Some(at) = authority.rfind('@') else { return authority.to_owned() };
    let (userinfo, host) = (&authority[..at], &authority[at..]);
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:{MASK}"),
        None if USER_NAME_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)) => userinfo.to_owned(),
        None if userinfo.is_empty() => String::new(),
        None => MASK.to_owned(),
    };
    format!("{shown}{host}")
}

#[cfg(test)]
mod tests {
    use super::mask_credentials as mask;

    #[test]
    fn url_passwords_and_tokens_are_masked_user_names_stay() {
        let cases = [
            ("postgres://u:pw@h/db", "postgres://u:[redacted]@h/db"),
            ("postgres://root@127.0.0.1:5432/test", "postgres://root@127.0.0.1:5432/test"),
            ("redis://:s3cret@h:6379/0", "redis://:[redacted]@h:6379/0"),
            ("rediss://default:s3cret@h:6380", "rediss://default:[redacted]@h:6380"),
            ("nats://T0KEN@127.0.0.1:4222", "nats://[redacted]@127.0.0.1:4222"),
            ("tls://user:pass@nats:4222", "tls://user:[redacted]@nats:4222"),
            ("https://T0KEN@icom.example/x", "https://[redacted]@icom.example/x"),
            ("nats://a@h1:4222,nats://b:c@h2:4222", "nats://[redacted]@h1:4222,nats://b:[redacted]@h2:4222"),
            ("redis://h:6379", "redis://h:6379"),
            ("redis://:p,w@h:6379", "redis://:[redacted]@h:6379"),
            ("nats://h1:4222,nats://h2:4222", "nats://h1:4222,nats://h2:4222"),
            ("postgres://u:p@ss@h/db", "postgres://u:[redacted]@h/db"),
        ];
        for (given, shown) in cases {
            assert_eq!(mask(given), shown, "{given}");
        }
    }

    #[test]
    fn secret_parameters_are_masked_wherever_they_are() {
        let cases = [
            (
                "postgres://h/db?user=u&password=pw&sslmode=disable",
                "postgres://h/db?user=u&password=[redacted]&sslmode=disable",
            ),
            ("nats://h:4222?token=t0k", "nats://h:4222?token=[redacted]"),
            ("host=h user=u password=pw dbname=test", "host=h user=u password=[redacted] dbname=test"),
            (
                "https://h/x?access_token=a&X-Amz-Signature=s",
                "https://h/x?access_token=[redacted]&X-Amz-Signature=[redacted]",
            ),
            (
                "https://h/x?sig=s&api_key=k&client_secret=c",
                "https://h/x?sig=[redacted]&api_key=[redacted]&client_secret=[redacted]",
            ),
            ("?PASSWORD=P&Token=T", "?PASSWORD=[redacted]&Token=[redacted]"),
            ("token=[redacted]", "token=[redacted]"),
        ];
        for (given, shown) in cases {
            assert_eq!(mask(given), shown, "{given}");
        }
    }

    #[test]
    fn a_credential_inside_an_error_text_is_masked_and_the_rest_kept() {
        let text = "connecting to NATS at nats://T0KEN@127.0.0.1:1: IO error: Connection refused (os error 111)";
        assert_eq!(
            mask(text),
            "connecting to NATS at nats://[redacted]@127.0.0.1:1: IO error: Connection refused (os error 111)"
        );
        let quoted = r#"url: "redis://:pw@h:1" and 'nats://tok@h'"#;
        assert_eq!(mask(quoted), r#"url: "redis://:[redacted]@h:1" and 'nats://[redacted]@h'"#);
        let plain = "slot cpm/3 granted, fence 7, key_file = /etc/cabine/key.pem";
        assert_eq!(mask(plain), plain);
    }
}
