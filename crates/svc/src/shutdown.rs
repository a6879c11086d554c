//! One shutdown tree: the first SIGINT/SIGTERM asks every task to drain; the second aborts.

use tokio_util::sync::CancellationToken;

/// A cloneable shutdown signal; child tokens let a subsystem drain on its own.
pub type Shutdown = CancellationToken;

/// Returns a token cancelled on the first SIGINT or SIGTERM. A second signal exits the process
/// at once with status 130, for operators who do not want to wait for a drain.
pub fn shutdown_on_signals() -> Shutdown {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested; draining (send the signal again to abort)");
        trigger.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: aborting");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
