//! Flags of `kjob-queue` (clap derive, each with an `env` twin).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use kjob_svc::AdminArgs;
use kjob_workqueue::{RedisOptions, RedisTls};

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
    /// Redis URL: redis://host:port for one server, redis+cluster://host:port,host:port for a Cluster; rediss:// and rediss+cluster:// for TLS. It may hold user:password@ (logged redacted).
    #[arg(
        long,
        env = "KJOB_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,
    /// Redis ACL username (overrides the URL's).
    #[arg(long, env = "KJOB_REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// Redis password (overrides the URL's); give it through the environment from a Secret, not on the command line.
    #[arg(long, env = "KJOB_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// File holding the Redis password (a mounted Secret; surrounding whitespace is ignored).
    #[arg(long, env = "KJOB_REDIS_PASSWORD_FILE", conflicts_with = "redis_password")]
    pub redis_password_file: Option<PathBuf>,
    /// CA bundle (PEM) that verifies the Redis server's certificate (rediss://); default: the system's roots.
    #[arg(long, env = "KJOB_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for a Redis that verifies clients (tls-auth-clients yes).
    #[arg(long, env = "KJOB_REDIS_CERT_FILE", requires = "redis_key_file")]
    pub redis_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --redis-cert-file.
    #[arg(long, env = "KJOB_REDIS_KEY_FILE", requires = "redis_cert_file")]
    pub redis_key_file: Option<PathBuf>,
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
    /// Print the aclfile line of kjob's Redis user: exactly the commands and keys kjob-queue needs.
    RedisAcl {
        /// The ACL username.
        #[arg(long, default_value = "kjob")]
        username: String,
        /// The password part of the line (`>password`, or `#<sha256 hex>` to store only a hash).
        #[arg(long, default_value = ">CHANGE-ME")]
        password: String,
    },
}

impl Args {
    /// Binds the listeners the flags name and splits off the configuration.
    pub async fn bind(self) -> anyhow::Result<(Listeners, QueueConfig)> {
        let grpc = kjob_svc::bind(self.listen, "the gRPC port").await?;
        let admin = self.admin.bind().await?;
        Ok((Listeners { grpc, admin: Some(admin) }, self.into_config()?))
    }

    /// The service configuration the flags describe (the listen and admin flags aside); reads
    /// the password file.
    pub fn into_config(self) -> anyhow::Result<QueueConfig> {
        let Args {
            command: _,
            listen: _,
            redis_url,
            redis_username,
            redis_password,
            redis_password_file,
            redis_ca_file,
            redis_cert_file,
            redis_key_file,
            admin: _,
        } = self;
        let password = match redis_password_file {
            Some(p) => Some(
                std::fs::read_to_string(&p)
                    .with_context(|| format!("reading --redis-password-file {}", p.display()))?
                    .trim()
                    .to_string(),
            ),
            None => redis_password,
        };
        let redis = RedisOptions {
            username: redis_username,
            password,
            tls: RedisTls {
                ca_file: redis_ca_file,
                cert_file: redis_cert_file,
                key_file: redis_key_file,
            },
        };
        Ok(QueueConfig { redis_url, redis, store: Default::default() })
    }
}
