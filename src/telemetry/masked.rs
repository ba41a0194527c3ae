//! The log writer: every formatted line goes to stderr through
//! [`mask_credentials`], so a URL with a password or token — in our own
//! messages, in an error's text, in a client library's log — never reaches the
//! logs.

use std::io::{self, Write};

use crate::config::mask_credentials;

/// Stderr, each write masked. The fmt layer writes one whole event per `write`.
pub struct MaskedStderr;

impl Write for MaskedStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        io::stderr().lock().write_all(mask_credentials(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
