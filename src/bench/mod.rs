//! Benchmarks: programs that print ONE JSON line of figures (never timed tests).
//! `bench lease` measures the cluster-wide connection budget (leased slots);
//! `bench sim` the ICOM simulator's throughput through the real client;
//! `bench inbound` the whole inbound pipeline of a local cluster;
//! `bench outbound` the whole outbound pipeline of a local cluster (both
//! write their time series with `--series FILE`); `bench dict` the DICT lookups'
//! homologation capacity test through real pods; `bench report` draws a set
//! of runs into a Markdown report with SVG plots.

pub mod dict;
pub mod fates;
pub mod floor;
pub mod inbound;
pub mod judge;
pub mod latency;
pub mod lease;
pub mod lease_worker;
pub mod outbound;
pub mod report;
pub mod series;
pub mod sim;
pub mod stages;

use std::process::ExitCode;

use anyhow::Context;

use crate::cli::BenchCommand;
use crate::config::Settings;

/// Dispatches `cabine bench …`.
pub async fn run(command: BenchCommand, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Lease(args) => {
            let exe = std::env::current_exe().context("locating the cabine binary")?;
            let report = lease::run(&lease::LeaseBench::from_args(&args), &exe, &settings).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        BenchCommand::Inbound(args) => {
            let exe = std::env::current_exe().context("locating the cabine binary")?;
            let report = inbound::run(&args, &exe).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        BenchCommand::Outbound(args) => {
            let exe = std::env::current_exe().context("locating the cabine binary")?;
            let report = outbound::run(&args, &exe).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        BenchCommand::Dict(args) => {
            let exe = std::env::current_exe().context("locating the cabine binary")?;
            let report = dict::run(&args, &exe).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
        BenchCommand::Report { dir } => println!("{}", report::render(&dir)?.display()),
        BenchCommand::LeaseWorker(args) => lease_worker::run(args, &settings).await?,
        BenchCommand::Sim(args) => {
            let report = sim::run(&args, &settings).await?;
            println!("{}", serde_json::to_string(&report)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
