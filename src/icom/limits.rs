//! Typed wire limits (from `config::WireLimitSettings`) and the typed error
//! each violation gives. Every parser checks them before it allocates.

use crate::config::WireLimitSettings;

/// What a body from or to ICOM may be at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireLimits {
    /// Parts of one `multipart/mixed` body (the Central Bank: 10).
    pub max_parts: usize,
    /// Uncompressed body size (5 MiB); inflating stops past it.
    pub max_body_bytes: usize,
    /// The header block of one part, and one `PI-*` response header.
    pub max_header_bytes: usize,
    /// Characters of a multipart boundary (RFC 2046: 70).
    pub max_boundary_len: usize,
}

impl WireLimits {
    /// The Central Bank's limits, the defaults of `config/default.toml`.
    pub const ICOM: WireLimits =
        WireLimits { max_parts: 10, max_body_bytes: 5 * 1024 * 1024, max_header_bytes: 8192, max_boundary_len: 70 };

    /// Bytes read off the wire before decompression: the body limit plus
    /// gzip's worst-case growth on incompressible data (about 0.03 % + headers).
    pub fn max_wire_bytes(&self) -> usize {
        self.max_body_bytes.saturating_add(self.max_body_bytes / 256).saturating_add(1024)
    }
}

impl From<&WireLimitSettings> for WireLimits {
    fn from(s: &WireLimitSettings) -> Self {
        WireLimits {
            max_parts: s.max_parts,
            max_body_bytes: s.max_body_bytes,
            max_header_bytes: s.max_header_bytes,
            max_boundary_len: s.max_boundary_len,
        }
    }
}

/// A body that breaks the wire format or one of its limits. Nothing of it is
/// acknowledged; the caller treats it like a transport failure of that request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("limit max_parts: more than {max} parts")]
    TooManyParts { max: usize },
    #[error("limit max_body_bytes: body larger than {max} bytes")]
    BodyTooLarge { max: usize },
    #[error("limit max_header_bytes: header longer than {max} bytes")]
    HeaderTooLong { max: usize },
    #[error("limit max_boundary_len: boundary of {len} characters, at most {max}")]
    BoundaryTooLong { len: usize, max: usize },
    #[error("a batch to send needs 1..={max} messages, got {len}")]
    BatchSize { len: usize, max: usize },
    #[error("bad gzip body: {0}")]
    Gzip(String),
    #[error("unsupported content-encoding {0:?}")]
    ContentEncoding(String),
    #[error("bad content-type: {0}")]
    ContentType(String),
    #[error("bad multipart body: {0}")]
    Multipart(String),
    #[error("message {index} has no usable PI-ResourceId")]
    MissingResourceId { index: usize },
}

impl WireError {
    /// The configured limit this error is about, for the `cabine_icom_wire_limit_total` metric.
    pub fn limit(&self) -> Option<&'static str> {
        match self {
            WireError::TooManyParts { .. } | WireError::BatchSize { .. } => Some("max_parts"),
            WireError::BodyTooLarge { .. } => Some("max_body_bytes"),
            WireError::HeaderTooLong { .. } => Some("max_header_bytes"),
            WireError::BoundaryTooLong { .. } => Some("max_boundary_len"),
            _ => None,
        }
    }

    /// Counts a limit hit on the metric; returns the error for chaining.
    pub fn counted(self) -> Self {
        if let Some(limit) = self.limit() {
            metrics::counter!("cabine_icom_wire_limit_total", "limit" => limit).increment(1);
        }
        self
    }
}
