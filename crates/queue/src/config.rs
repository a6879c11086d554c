//! Flags of `kjob-queue` (clap derive, each with an `env` twin).

use std::net::SocketAddr;

use clap::Subcommand;
use kjob_svc::AdminArgs;

use crate::{Listeners, QueueConfig};

/// The kjob queue service: a distributed rate-limiting workqueue over Redis.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kjob-queue", version)]
pub struct Args {
    /// A subcommand instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// gRPC listen address.
    #[arg(long, env = "KJOB_QUEUE_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    /// Redis URL: redis://host:port for one server, redis+cluster://host:port,host:port for a Cluster.
    #[arg(long, env = "KJOB_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Admin port flags.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// The subcommands of `kjob-queue`.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
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

impl Args {
    /// Binds the listeners the flags name and splits off the configuration.
    pub async fn bind(self) -> anyhow::Result<(Listeners, QueueConfig)> {
        let grpc = kjob_svc::bind(self.listen, "the gRPC port").await?;
        let admin = self.admin.bind().await?;
        Ok((Listeners { grpc, admin: Some(admin) }, self.into_config()))
    }

    /// The service configuration the flags describe (the listen and admin flags aside).
    pub fn into_config(self) -> QueueConfig {
        let Args { command: _, listen: _, redis_url, admin: _ } = self;
        QueueConfig { redis_url, store: Default::default() }
    }
}
