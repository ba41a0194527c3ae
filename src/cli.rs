//! The command line (clap): `run`, `migrate`, `check-config`, and the
//! subcommands later capabilities add (`sim`, `bench …`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CABINE_GIT_COMMIT"), ")");

#[derive(Debug, Parser)]
#[command(name = "cabine", version = LONG_VERSION, about = "PIX ICOM connectivity under the Central Bank's connection cap")]
pub struct Cli {
    /// Directory holding `{CABINE_ENV}.toml` overlays (the defaults are compiled in).
    #[arg(long, env = "CABINE_CONFIG_DIR", default_value = "config", global = true)]
    pub config_dir: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one pod: status server, coordination and the actor tree, until SIGTERM / Ctrl-C.
    Run,
    /// Apply the Postgres migrations and create the JetStream streams, then exit.
    Migrate,
    /// Print the effective configuration (secrets redacted); exit 64 if it is unusable.
    CheckConfig,
    /// Run the ICOM simulator (the Central Bank) until SIGTERM / Ctrl-C.
    Sim(Box<crate::sim::SimArgs>),
}
