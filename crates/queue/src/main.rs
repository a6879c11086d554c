//! `kjob-queue`: the gRPC queue service (and `kjob-queue inspect`).

use std::net::SocketAddr;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kjob_svc::{AdminArgs, LogArgs};

/// The kjob queue service: a distributed rate-limiting workqueue over Redis.
#[derive(Debug, Parser)]
#[command(name = "kjob-queue", version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// gRPC listen address.
    #[arg(long, env = "KJOB_QUEUE_LISTEN", default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Redis URL: redis://host:port for one server, redis+cluster://host:port,host:port for a Cluster.
    #[arg(long, env = "KJOB_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a queue's depths and what it knows about particular keys.
    Inspect {
        /// URL of a kjob-queue server.
        #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
        queue_url: String,
        /// Queue name.
        #[arg(long, default_value = kjob_core::JOB_QUEUE)]
        queue: String,
        /// Keys (namespace/name) to show.
        keys: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args { command, listen, redis_url, admin, log } = Args::parse();
    kjob_svc::init_logging(&log)?;
    if let Some(Command::Inspect { queue_url, queue, keys }) = command {
        return kjob_queue::inspect(&queue_url, &queue, keys, &mut std::io::stdout()).await;
    }
    let shutdown = kjob_svc::shutdown_on_signals();
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let admin_listener = tokio::net::TcpListener::bind(admin.admin_listen)
        .await
        .with_context(|| format!("binding admin port {}", admin.admin_listen))?;
    let config = kjob_queue::Config {
        redis_url,
        admin_listener: Some(admin_listener),
        store: Default::default(),
    };
    kjob_queue::run(listener, config, shutdown).await
}
