//! Flags of `kjob-watcher` (clap derive, each with an `env` twin).

use std::time::Duration;

use kjob_queue_client::QueueTlsArgs;
use kjob_svc::{AdminArgs, KubeClientArgs, ViewKeyArgs, parse_duration};

use crate::leader::LeaseConfig;
use crate::{Listeners, WatcherConfig};

/// Turns Job and Pod events into kjob-queue enqueues, as the upstream Job controller does.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kjob-watcher", version)]
pub struct Args {
    /// kjob-queue gRPC URL.
    #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
    pub queue_url: String,
    /// How to reach kjob-queue (mTLS as the `kjob-watcher` role).
    #[command(flatten)]
    pub queue_tls: QueueTlsArgs,
    /// The key that seals the shared Job view.
    #[command(flatten)]
    pub view_key: ViewKeyArgs,
    /// The spec.managedBy value this controller answers to.
    #[arg(long, env = "KJOB_CONTROLLER_NAME", default_value = kjob_core::DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// Also reconcile Jobs without spec.managedBy (when the built-in Job controller is off).
    #[arg(long, env = "KJOB_MANAGE_ALL_JOBS")]
    pub manage_all_jobs: bool,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "KJOB_NAMESPACE")]
    pub namespace: Option<String>,
    /// Name of the coordination.k8s.io Lease used for leader election.
    #[arg(long, env = "KJOB_LEASE_NAME", default_value = "kjob-watcher")]
    pub lease_name: String,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kjob-system")]
    pub lease_namespace: String,
    /// Identity in the Lease (default: `<hostname>_<pid>`).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long an unrenewed Lease stays with its holder.
    #[arg(long, env = "KJOB_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long the leader retries renewing before it steps down.
    #[arg(long, env = "KJOB_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// Interval between acquire/renew attempts.
    #[arg(long, env = "KJOB_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// Interval of the full resync (every managed Job enqueued).
    #[arg(long, env = "KJOB_RESYNC_PERIOD", default_value = "10m", value_parser = parse_duration)]
    pub resync_period: Duration,
    /// How pods are listed and watched: `protobuf` (kube-apiserver's protobuf encoding, as
    /// kube-controller-manager's informers; a server that answers JSON is read all the same) or
    /// `json` (kube-runtime's JSON watcher).
    #[arg(long, env = "KJOB_WATCH_ENCODING", value_enum, default_value_t = WatchEncoding::Protobuf)]
    pub watch_encoding: WatchEncoding,
    /// Kube client flags.
    #[command(flatten)]
    pub kube: KubeClientArgs,
    /// Admin port flags.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// The encoding of the pod list and watch (`--watch-encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchEncoding {
    /// kube-apiserver's protobuf encoding ([`crate::pod_watch`]).
    Protobuf,
    /// JSON, through kube-runtime's watcher.
    Json,
}

impl Args {
    /// Binds the listeners the flags name and splits off the configuration; unusable queue
    /// security settings fail first, in one line, before anything is bound.
    pub async fn bind(self) -> anyhow::Result<(Listeners, WatcherConfig)> {
        self.queue_tls.security(&self.queue_url)?;
        self.view_key.check(self.queue_tls.insecure_no_auth)?;
        let admin = self.admin.bind().await?;
        Ok((Listeners { admin: Some(admin) }, self.into_config()))
    }

    /// The watcher configuration the flags describe (the admin flags aside).
    pub fn into_config(self) -> WatcherConfig {
        let Args {
            queue_url,
            queue_tls,
            view_key,
            controller_name,
            manage_all_jobs,
            namespace,
            lease_name,
            lease_namespace,
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
            resync_period,
            watch_encoding,
            kube,
            admin: _,
        } = self;
        WatcherConfig {
            queue_url,
            queue_tls,
            view_key,
            controller_name,
            manage_all: manage_all_jobs,
            namespace,
            lease: LeaseConfig {
                name: lease_name,
                namespace: lease_namespace,
                identity: kjob_svc::identity_or_default(identity, "kjob-watcher"),
                lease_duration,
                renew_deadline,
                retry_period,
            },
            resync_period,
            watch_encoding,
            kube,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_and_flags() {
        let c = Args::try_parse_from(["kjob-watcher"]).unwrap().into_config();
        assert_eq!(c.lease.lease_duration, Duration::from_secs(15));
        assert_eq!(c.resync_period, Duration::from_secs(600));
        assert_eq!(c.watch_encoding, WatchEncoding::Protobuf);
        assert!(c.lease.identity.ends_with(&format!("_{}", std::process::id())));
        let c = Args::try_parse_from([
            "kjob-watcher",
            "--identity",
            "w-0",
            "--manage-all-jobs",
            "--retry-period",
            "500ms",
            "--watch-encoding",
            "json",
        ])
        .unwrap()
        .into_config();
        assert_eq!(c.lease.identity, "w-0");
        assert!(c.manage_all);
        assert_eq!(c.lease.retry_period, Duration::from_millis(500));
        assert_eq!(c.watch_encoding, WatchEncoding::Json);
    }
}
