//! The `cabine` binary: install the TLS provider, parse the command line, load
//! configuration (exit 64 when unusable) and hand over to the chosen command.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use cabine::cli::{Cli, Command};
use cabine::config::{Settings, mask_credentials};

fn main() -> ExitCode {
    // Once, before anything can build a TLS config (reqwest, async-nats, the simulator).
    cabine::install_crypto_provider();
    let cli = Cli::parse();
    let settings = match Settings::load(&cli.config_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}", mask_credentials(&e.to_string()));
            return ExitCode::from(cabine::EXIT_CONFIG);
        }
    };
    match cli.command {
        Command::CheckConfig => {
            print!("{}", settings.to_redacted_toml());
            ExitCode::SUCCESS
        }
        command => {
            // The operator's client commands print their answer and nothing else; chaos keeps
            // stderr for its progress lines and the pods' errors (RUST_LOG still wins).
            match command {
                Command::Outbound(_)
                | Command::Breaker(_)
                | Command::Dict(_)
                | Command::Reconcile(_)
                | Command::Report(_)
                | Command::Status(_)
                | Command::Health(_) => {}
                Command::Chaos(_) => {
                    let quiet = cabine::config::LogSettings { filter: "warn".into(), ..settings.log.clone() };
                    cabine::telemetry::init_tracing(&quiet);
                }
                _ => cabine::telemetry::init_tracing(&settings.log),
            }
            let outcome = runtime().and_then(|rt| {
                let outcome = rt.block_on(dispatch(command, settings));
                // Whatever is still running (probes, client reconnects) must not delay the exit.
                rt.shutdown_background();
                outcome
            });
            match outcome {
                Ok(code) => code,
                Err(e) => {
                    let error = mask_credentials(&format!("{e:#}"));
                    tracing::error!(%error, "cabine stopped on an error");
                    eprintln!("error: {error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")
}

async fn dispatch(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run => cabine::run::run(settings).await,
        Command::Migrate => cabine::run::migrate(settings).await.map(|()| ExitCode::SUCCESS),
        Command::Sim(args) => cabine::sim::run(*args).await,
        Command::Bench { bench } => cabine::bench::run(bench, settings).await,
        Command::Chaos(args) => cabine::chaos::run(args).await,
        Command::Outbound(args) => cabine::outbound_cli::outbound(args, &settings).await,
        Command::Breaker(args) => cabine::outbound_cli::breaker(args, &settings).await,
        Command::Dict(args) => cabine::outbound_cli::dict(args, &settings).await,
        Command::Reconcile(args) => cabine::outbound_cli::reconcile(args, &settings).await,
        Command::Report(args) => cabine::outbound_cli::report_command(args, &settings).await,
        Command::Status(args) => cabine::status_cli::status(args, &settings).await,
        Command::Health(args) => cabine::health_cli::health(args, &settings).await,
        Command::CheckConfig => unreachable!("handled before the runtime starts"),
    }
}
