//! kjob-sim: serve the simulated API server on a listener, print its URL, write a kubeconfig.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kjob_sim::{KubeletMode, SimConfig};

/// Simulated Kubernetes API server (and kubelet) for kjob's tests, demos and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "kjob-sim", version)]
struct Args {
    /// Address to serve on; port 0 picks a free one (the URL is printed on stdout).
    #[arg(long, env = "KJOB_SIM_LISTEN", default_value = "127.0.0.1:0")]
    listen: String,
    /// Where to write a kubeconfig pointing at the server.
    #[arg(long, env = "KJOB_SIM_KUBECONFIG_OUT")]
    kubeconfig_out: Option<PathBuf>,
    /// Run the simulated kubelet (auto) or let clients write pod status (off).
    #[arg(long, value_enum, env = "KJOB_SIM_KUBELET", default_value = "auto")]
    kubelet: KubeletMode,
    /// Latency added before every write.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "0ms")]
    write_latency: Duration,
    /// Latency added before every read.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "0ms")]
    read_latency: Duration,
    /// Period of watch bookmarks.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "60s")]
    bookmark_interval: Duration,
    /// Watch events kept for resuming watches (older revisions get 410).
    #[arg(long, default_value_t = 10_000)]
    history_window: usize,
}

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::PerCpu, serve)
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let url = kjob_sim::url_for(listener.local_addr()?);
    if let Some(path) = &args.kubeconfig_out {
        kjob_sim::kubeconfig::write(path, &url)?;
    }
    // The URL is the first stdout line: scripts and tests read it to find the port.
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{url}")?;
        out.flush()?;
    }
    let config = SimConfig {
        kubelet: args.kubelet,
        write_latency: args.write_latency,
        read_latency: args.read_latency,
        bookmark_interval: args.bookmark_interval,
        history_window: args.history_window,
        kubelet_settings: Default::default(),
    };
    kjob_sim::run(listener, config, kjob_svc::shutdown_on_signals()).await
}
