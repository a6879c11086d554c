//! Flags of `kjob-queue` (clap derive, each with an `env` twin).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use kjob_queue_client::QueueTlsArgs;
use kjob_svc::AdminArgs;
use kjob_workqueue::{LeaseOrder, RedisOptions, RedisTls, StoreConfig};

use crate::{Listeners, QueueConfig, Security};

/// The one line kjob-queue exits with when it has no security configuration.
pub const NO_SECURITY: &str = "kjob-queue serves only authenticated TLS: give --tls-cert-file, \
     --tls-key-file and --client-ca-file (see `kjob-queue certs`), or --insecure-no-auth for \
     development only";

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
    /// kjob-queue's serving certificate (PEM), signed by the CA its clients trust.
    #[arg(long, env = "KJOB_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, env = "KJOB_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// The kjob CA (PEM) that signs callers' certificates; a caller's role is its certificate's CN.
    #[arg(long, env = "KJOB_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Development only: serve plaintext gRPC and let every caller call everything (logs a warning).
    #[arg(long, env = "KJOB_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
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
    /// Most gRPC calls handled at once across every connection; more are refused with RESOURCE_EXHAUSTED (clients retry with backoff) and counted in kjob_queue_calls_refused_total.
    #[arg(long, env = "KJOB_MAX_CONCURRENT_CALLS", default_value_t = crate::limits::DEFAULT_MAX_CONCURRENT_CALLS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_concurrent_calls: usize,
    /// Shards of a new Redis data set (1 to 1024); default 1 on one server, 24 on a Cluster. A data set keeps the count it was created with.
    #[arg(long, env = "KJOB_QUEUE_SHARDS")]
    pub queue_shards: Option<u32>,
    /// Namespaces whose depths get series of their own in the kjob_queue_namespace_* gauges, the deepest first (0 to 100); the rest are summed as namespace="_other".
    #[arg(long, env = "KJOB_NAMESPACE_METRICS_TOP", default_value_t = crate::tenants::DEFAULT_NAMESPACE_METRICS_TOP, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=crate::tenants::MAX_NAMESPACE_METRICS_TOP as u64))]
    pub namespace_metrics_top: usize,
    /// How leases pick among namespaces with ready Jobs: `fair` (deficit round robin by the namespaces' `kjob.io/queue-weight`) or `fifo` (the oldest ready Job first whatever its namespace, as upstream's workqueue; fairness off, for comparison: costs a read per namespace with work per lease).
    #[arg(long, env = "KJOB_LEASE_ORDER", value_enum, default_value_t = LeaseOrderArg::Fair)]
    pub lease_order: LeaseOrderArg,
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
        /// Namespaces to list, deepest (ready + delayed + leased) first, with their oldest ready age; 0 lists none.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1000))]
        top: u32,
        /// Show one namespace: its depths and its longest waiting ready keys.
        #[arg(long)]
        namespace: Option<String>,
        /// How to reach kjob-queue (as the `kjob-inspector` role over https://).
        #[command(flatten)]
        tls: QueueTlsArgs,
    },
    /// Write a new kjob CA and the certificates of kjob-queue and of each role (watcher,
    /// worker, inspector), and print the kubectl commands that load them as Secrets.
    Certs {
        /// Folder to write into (one sub-folder per Secret).
        #[arg(long)]
        out: PathBuf,
        /// Names (DNS or IP) in kjob-queue's serving certificate [default: the in-cluster
        /// Service names, localhost, 127.0.0.1].
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Namespace in the printed kubectl commands.
        #[arg(long, default_value = "kjob-system")]
        namespace: String,
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
    /// Binds the listeners the flags name and splits off the configuration (checked first:
    /// without security settings nothing is bound).
    pub async fn bind(self) -> anyhow::Result<(Listeners, QueueConfig)> {
        let (listen, admin_args) = (self.listen, self.admin.clone());
        let config = self.into_config()?;
        let grpc = kjob_svc::bind(listen, "the gRPC port").await?;
        let admin = admin_args.bind().await?;
        Ok((Listeners { grpc, admin: Some(admin) }, config))
    }

    /// The service configuration the flags describe (the listen and admin flags aside),
    /// reading the certificate and password files. With neither TLS files nor
    /// `--insecure-no-auth` the error is [`NO_SECURITY`], one line.
    pub fn into_config(self) -> anyhow::Result<QueueConfig> {
        let Args {
            command: _,
            listen: _,
            redis_url,
            tls_cert_file,
            tls_key_file,
            client_ca_file,
            insecure_no_auth,
            redis_username,
            redis_password,
            redis_password_file,
            redis_ca_file,
            redis_cert_file,
            redis_key_file,
            max_concurrent_calls,
            queue_shards,
            namespace_metrics_top,
            lease_order,
            admin: _,
        } = self;
        let security = match (tls_cert_file, tls_key_file, client_ca_file, insecure_no_auth) {
            (Some(cert), Some(key), Some(client_ca), false) => {
                let read = |p: PathBuf| {
                    std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
                };
                Security::Tls { cert: read(cert)?, key: read(key)?, client_ca: read(client_ca)? }
            }
            (None, None, None, true) => Security::InsecureNoAuth,
            (None, None, None, false) => anyhow::bail!(NO_SECURITY),
            (.., true) => anyhow::bail!(
                "--insecure-no-auth turns TLS off: give it without --tls-cert-file, \
                 --tls-key-file and --client-ca-file"
            ),
            _ => anyhow::bail!(
                "kjob-queue's TLS needs all three of --tls-cert-file, --tls-key-file and \
                 --client-ca-file"
            ),
        };
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
        let lease_order = match lease_order {
            LeaseOrderArg::Fair => LeaseOrder::Fair,
            LeaseOrderArg::Fifo => LeaseOrder::Fifo,
        };
        let store = StoreConfig { shards: queue_shards, lease_order, ..StoreConfig::default() };
        Ok(QueueConfig {
            redis_url,
            redis,
            store,
            security,
            max_concurrent_calls,
            namespace_metrics_top,
        })
    }
}

/// `--lease-order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaseOrderArg {
    /// Deficit round robin over namespaces (the default).
    Fair,
    /// Oldest ready first, whatever the namespace (fairness off).
    Fifo,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn refuses_to_serve_without_security_settings() {
        let err = Args::try_parse_from(["kjob-queue"]).unwrap().into_config().unwrap_err();
        assert_eq!(format!("{err:#}"), NO_SECURITY);
        let c = Args::try_parse_from(["kjob-queue", "--insecure-no-auth"]).unwrap();
        assert!(matches!(c.into_config().unwrap().security, Security::InsecureNoAuth));
        let half = Args::try_parse_from(["kjob-queue", "--tls-cert-file=/x"]).unwrap();
        assert!(half.into_config().unwrap_err().to_string().contains("all three"));
        let both = ["kjob-queue", "--insecure-no-auth", "--tls-cert-file=/a"];
        let both = Args::try_parse_from(both).unwrap();
        assert!(both.into_config().is_err());
    }
}
