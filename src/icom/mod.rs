//! ICOM, the Central Bank's SPI interface: the only module that knows its wire
//! format (headers, whole-body gzip, `multipart/mixed` with `PI-ResourceId`,
//! ISO 20022 envelopes, RFC 7807 problems) and the mTLS client that speaks it.

pub mod client;
pub mod endpoint;
pub mod envelope;
pub mod gzip;
pub mod headers;
pub mod inbound;
pub mod limits;
pub mod multipart;
pub mod outcome;
pub mod problem;
pub mod sender;
pub mod tls;

pub use client::IcomClient;
pub use endpoint::{ClientError, EndpointSettings, IcomChannels, IcomEndpoint};
pub use envelope::{Envelope, EnvelopeError};
pub use inbound::fuzz_entry;
pub use limits::{WireError, WireLimits};
pub use outcome::SendOutcome;
pub use problem::Problem;
