//! `kubectl-kjob`: found by kubectl's plugin discovery on PATH, run as `kubectl kjob ...`.

use clap::Parser as _;

#[tokio::main]
async fn main() {
    let args = kubectl_kjob::Args::parse();
    if let Err(e) = kubectl_kjob::run(args).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
