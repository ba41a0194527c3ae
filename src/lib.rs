//! cabine: everything that touches the world — configuration, Redis, Postgres,
//! NATS, the ICOM wire format and client, the simulator, the HTTP status
//! server — wired to the supervision tree of `cabine-actors`.
#![forbid(unsafe_code)]

pub mod bench;
pub mod bus;
pub mod chaos;
pub mod cli;
pub mod config;
pub mod db;
pub mod dict;
pub mod harness;
pub mod health_cli;
pub mod http;
pub mod icom;
pub mod inbox;
pub mod incident;
pub mod outbound;
pub mod outbound_cli;
pub mod publish;
pub mod readiness;
pub mod reconcile;
pub mod redis;
pub mod run;
pub mod sim;
pub mod status_cli;
pub mod store_tls;
pub mod telemetry;
pub mod timings;

/// This build's version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// This build's git commit (short), or `unknown` outside a checkout.
pub const GIT_COMMIT: &str = env!("CABINE_GIT_COMMIT");

/// Exit code for unusable configuration (sysexits EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;

/// Installs rustls' ring provider as the process default. `main` calls it first
/// thing; tests and harness code that build TLS clients call it too. Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
