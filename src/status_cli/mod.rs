//! `cabine status`: the cluster at a glance in a terminal — slot map, pods,
//! alerts and the actors that are not well — read from one pod's `/cluster`
//! and `/actors`. `--watch` redraws in place every `--interval`; colours only
//! when stdout is a terminal (and `NO_COLOR` is unset); `--json` prints the two
//! answers as they came. Exit 1 when the pod cannot be asked.

mod render;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};

use crate::config::Settings;
use crate::outbound_cli::{PodArgs, PodClient};
pub use render::{Paint, render};

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub pod: PodArgs,
    /// Redraw in place until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Time between redraws with `--watch`.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// `{"cluster": …, "actors": …}` as the pod answered, one line per view.
    #[arg(long)]
    pub json: bool,
}

pub async fn status(args: StatusArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pod = PodClient::new(&args.pod, settings)?;
    let tty = std::io::stdout().is_terminal();
    let paint = if tty && std::env::var_os("NO_COLOR").is_none() { Paint::Ansi } else { Paint::Plain };
    loop {
        let frame = match views(&pod).await {
            Ok((cluster, actors)) if args.json => json!({ "cluster": cluster, "actors": actors }).to_string(),
            Ok((cluster, actors)) => render(&cluster, &actors, pod.base(), &now(), paint),
            Err(e) if !args.watch => {
                eprintln!("error: {e:#}");
                return Ok(ExitCode::FAILURE);
            }
            Err(e) => format!("cannot ask {}: {e:#}\n", pod.base()),
        };
        let mut out = std::io::stdout().lock();
        if args.watch && tty && !args.json {
            // Home, draw, clear what the last frame left below.
            write!(out, "\x1b[H{}\x1b[J", frame.replace('\n', "\x1b[K\n"))?;
        } else {
            writeln!(out, "{}", frame.trim_end())?;
        }
        out.flush()?;
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(args.interval).await;
    }
}

async fn views(pod: &PodClient) -> anyhow::Result<(Value, Value)> {
    let (cluster, actors) = tokio::join!(pod.get_json(&["cluster"]), pod.get_json(&["actors"]));
    Ok((cluster.context("GET /cluster")?, actors.context("GET /actors")?))
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
