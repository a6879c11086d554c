//! `kjob-watcher`: watches Jobs and Pods and feeds kjob-queue (see the library docs).

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kjob_svc::{AdminArgs, KubeClientArgs, LogArgs, parse_duration};
use kjob_watcher::WatcherConfig;
use kjob_watcher::leader::LeaseConfig;

/// Turns Job and Pod events into kjob-queue enqueues, as the upstream Job controller does.
#[derive(Debug, Parser)]
#[command(name = "kjob-watcher", version)]
struct Args {
    /// kjob-queue gRPC URL.
    #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
    queue_url: String,
    /// The spec.managedBy value this controller answers to.
    #[arg(long, env = "KJOB_CONTROLLER_NAME", default_value = kjob_core::DEFAULT_CONTROLLER_NAME)]
    controller_name: String,
    /// Also reconcile Jobs without spec.managedBy (when the built-in Job controller is off).
    #[arg(long, env = "KJOB_MANAGE_ALL_JOBS")]
    manage_all_jobs: bool,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "KJOB_NAMESPACE")]
    namespace: Option<String>,
    /// Name of the coordination.k8s.io Lease used for leader election.
    #[arg(long, env = "KJOB_LEASE_NAME", default_value = "kjob-watcher")]
    lease_name: String,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kjob-system")]
    lease_namespace: String,
    /// Identity in the Lease (default: hostname and process id).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long an unrenewed Lease stays with its holder.
    #[arg(long, env = "KJOB_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// How long the leader retries renewing before it steps down.
    #[arg(long, env = "KJOB_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,
    /// Interval between acquire/renew attempts.
    #[arg(long, env = "KJOB_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
    /// Interval of the full resync (every managed Job enqueued).
    #[arg(long, env = "KJOB_RESYNC_PERIOD", default_value = "10m", value_parser = parse_duration)]
    resync_period: Duration,
    #[command(flatten)]
    kube: KubeClientArgs,
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    log: LogArgs,
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "kjob-watcher".into());
    // Two processes on one host must not share an identity, or both would think they lead.
    format!("{host}_{}", std::process::id())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        queue_url,
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
        kube,
        admin,
        log,
    } = Args::parse();
    kjob_svc::init_logging(&log)?;
    let shutdown = kjob_svc::shutdown_on_signals();
    let client = kube.client().await.context("building the kube client")?;
    let listener = tokio::net::TcpListener::bind(admin.admin_listen)
        .await
        .with_context(|| format!("binding the admin port {}", admin.admin_listen))?;
    let identity = identity.unwrap_or_else(default_identity);
    tracing::info!(%identity, admin = %listener.local_addr()?, %queue_url, "kjob-watcher starting");
    let config = WatcherConfig {
        queue_url,
        controller_name,
        manage_all: manage_all_jobs,
        namespace,
        lease: LeaseConfig {
            name: lease_name,
            namespace: lease_namespace,
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
        },
        resync_period,
    };
    kjob_watcher::run(config, client, listener, shutdown).await?;
    tracing::info!("kjob-watcher stopped");
    Ok(())
}
