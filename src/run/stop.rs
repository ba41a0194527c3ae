//! How a pod stops. On SIGTERM / Ctrl-C: readiness 503 at once, the tree drains
//! (aborts un-returned long-polls, finishes persisting, hands slots over and
//! closes streams only when no other live pod runs them), the publisher
//! publishes what is queued, all within `timing.stop_timeout`; a second signal
//! exits at once. When Root escalates, the process exits non-zero.

use std::process::ExitCode;
use std::time::Duration;

use cabine_actors::{Tree, TreeExit};
use tokio::time::Instant;

use crate::publish::JetStreamPublisher;
use crate::readiness::Readiness;

/// Exit code after Root gave up (restart intensity exceeded): sysexits EX_SOFTWARE.
pub const EXIT_ESCALATED: u8 = 70;
/// Exit code of a second stop signal (128 + SIGINT, as shells report it).
pub const EXIT_SECOND_SIGNAL: i32 = 130;

/// Why the pod is stopping.
pub enum StopCause {
    Signal,
    TreeEnded(TreeExit),
}

/// Waits for a stop signal or the tree's own end.
pub async fn wait_for_stop(tree: &Tree) -> StopCause {
    tokio::select! {
        () = shutdown_signal() => StopCause::Signal,
        exit = tree.wait() => StopCause::TreeEnded(exit),
    }
}

/// Stops the pod within `stop_timeout` and says which exit code it ends with.
pub async fn stop(
    cause: StopCause,
    tree: &Tree,
    publisher: &JetStreamPublisher,
    readiness: &Readiness,
    stop_timeout: Duration,
) -> ExitCode {
    readiness.set_stopping();
    let deadline = Instant::now() + stop_timeout;
    let exit = match cause {
        StopCause::Signal => {
            tracing::info!("stop requested: readiness is now 503, draining");
            tokio::spawn(async {
                shutdown_signal().await;
                tracing::warn!("second stop signal: exiting at once");
                std::process::exit(EXIT_SECOND_SIGNAL);
            });
            tree.shutdown().await
        }
        StopCause::TreeEnded(exit) => exit,
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if !publisher.close(left).await {
        tracing::warn!("stop timeout: queued rows left to the republish sweep");
    }
    match exit {
        TreeExit::Normal => {
            tracing::info!("stopped cleanly");
            ExitCode::SUCCESS
        }
        TreeExit::Escalated(why) => {
            tracing::error!(%why, "the actor tree gave up: exiting non-zero so the orchestrator replaces the pod");
            ExitCode::from(EXIT_ESCALATED)
        }
        TreeExit::Killed => {
            tracing::warn!(timeout = ?stop_timeout, "stop timeout elapsed: the tree was killed");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
