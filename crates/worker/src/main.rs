//! `kjob-worker` binary: parse flags, set up logging, run the worker library until a signal.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (log, config) = kjob_worker::Args::parse().into_config();
    kjob_svc::init_logging(&log)?;
    let shutdown = kjob_svc::shutdown_on_signals();
    kjob_worker::run(config, shutdown).await
}
