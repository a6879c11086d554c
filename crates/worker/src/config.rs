//! Flags of `kjob-worker` (clap derive, each with an `env` twin).

use std::time::Duration;

use kjob_queue_client::QueueTlsArgs;
use kjob_svc::{AdminArgs, KubeClientArgs, ViewKeyArgs, parse_duration};

use crate::Listeners;

/// `kjob-worker`: leases Job keys from kjob-queue and runs syncJob against the API server.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kjob-worker", version, about)]
pub struct Args {
    /// What [`crate::run`] needs.
    #[command(flatten)]
    pub config: WorkerConfig,
    /// Admin port flags.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Everything [`crate::run`] needs besides its listeners: the flags minus the admin address
/// (which the binary binds); the log and runtime flags are every binary's ([`kjob_svc::main`]).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerConfig {
    /// URL of the kjob-queue gRPC service.
    #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
    pub queue_url: String,
    /// How to reach kjob-queue (mTLS as the `kjob-worker` role).
    #[command(flatten)]
    pub queue_tls: QueueTlsArgs,
    /// The key that opens the shared Job view's sealed entries.
    #[command(flatten)]
    pub view_key: ViewKeyArgs,
    /// Syncs in flight at once in this process, per queue (upstream --concurrent-job-syncs).
    #[arg(long, env = "KJOB_CONCURRENCY", default_value_t = 5)]
    pub concurrency: usize,
    /// Most pods, over all Jobs, this worker keeps decoded from the shared views it planned
    /// from, so that its next sync of a Job reads only what changed (least recently synced
    /// Jobs go first; a larger Job is read whole every sync). 0 turns the cache off.
    #[arg(long, env = "KJOB_VIEW_CACHE_PODS",
          default_value_t = crate::view_cache::DEFAULT_VIEW_CACHE_PODS)]
    pub view_cache_pods: usize,
    /// Lease duration asked from the queue; long syncs are renewed every third of it.
    #[arg(long, env = "KJOB_LEASE_DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Client-side API request rate (upstream kube-controller-manager defaults to 20).
    #[arg(long, env = "KJOB_KUBE_QPS", default_value_t = 100.0)]
    pub kube_qps: f64,
    /// Client-side API request burst (upstream kube-controller-manager defaults to 30).
    #[arg(long, env = "KJOB_KUBE_BURST", default_value_t = 200)]
    pub kube_burst: u32,
    /// Cluster-wide API request rate of all workers together: a token bucket in Redis (through
    /// kjob-queue) shared by every worker and split fairly across namespaces with work; 429s
    /// slow it down. Unset: no shared budget (each worker's --kube-qps only).
    #[arg(long, env = "KJOB_API_QPS_TOTAL", value_parser = parse_qps_total)]
    pub api_qps_total: Option<f64>,
    /// Cluster-wide burst of the shared budget (with --api-qps-total; default: the QPS, at
    /// least 1).
    #[arg(long, env = "KJOB_API_BURST_TOTAL", requires = "api_qps_total",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub api_burst_total: Option<u32>,
    /// `spec.managedBy` value this controller reconciles.
    #[arg(long, env = "KJOB_CONTROLLER_NAME", default_value = kjob_core::DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// Also reconcile Jobs without managedBy (or naming the built-in controller).
    #[arg(long, env = "KJOB_MANAGE_ALL_JOBS")]
    pub manage_all_jobs: bool,
    /// How long in-flight syncs may run after SIGTERM before their keys are handed back.
    #[arg(long, env = "KJOB_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Identity of this worker (lease holder, logs); defaults to `<hostname>_<pid>`.
    #[arg(long, env = "POD_NAME")]
    pub worker_id: Option<String>,
    /// Kube client flags.
    #[command(flatten)]
    pub kube: KubeClientArgs,
}

/// A total rate kjob-queue accepts: above 0, at most 100,000 requests per second.
fn parse_qps_total(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if v.is_finite() && v > 0.0 && v <= 100_000.0 {
        Ok(v)
    } else {
        Err(format!("{v} requests per second: above 0 and at most 100000 are allowed"))
    }
}

impl Args {
    /// Binds the listeners the flags name and splits off the configuration; unusable queue
    /// security settings fail first, in one line, before anything is bound.
    pub async fn bind(self) -> anyhow::Result<(Listeners, WorkerConfig)> {
        self.config.queue_tls.security(&self.config.queue_url)?;
        self.config.view_key.check(self.config.queue_tls.insecure_no_auth)?;
        let admin = self.admin.bind().await?;
        Ok((Listeners { admin: Some(admin) }, self.config))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_and_flags() {
        let c = Args::try_parse_from(["kjob-worker"]).unwrap().config;
        assert_eq!(c.concurrency, 5);
        assert_eq!(c.lease_duration, Duration::from_secs(30));
        assert_eq!(c.kube_burst, 200);
        assert_eq!(c.controller_name, "kjob.io/job-controller");
        let a = Args::try_parse_from([
            "kjob-worker",
            "--queue-url",
            "http://127.0.0.1:1",
            "--concurrency",
            "8",
            "--lease-duration",
            "2s",
            "--kube-qps",
            "50",
            "--manage-all-jobs",
            "--shutdown-grace",
            "500ms",
            "--worker-id",
            "w1",
            "--admin-listen",
            "127.0.0.1:0",
            "--kubeconfig",
            "/tmp/kc",
        ])
        .unwrap();
        assert_eq!(a.admin.admin_listen, "127.0.0.1:0".parse().unwrap());
        let c = a.config;
        assert_eq!(c.concurrency, 8);
        assert_eq!(c.lease_duration, Duration::from_secs(2));
        assert_eq!(c.shutdown_grace, Duration::from_millis(500));
        assert!(c.manage_all_jobs);
        assert_eq!(c.worker_id.as_deref(), Some("w1"));
        assert_eq!(c.kube.kubeconfig.as_deref(), Some(std::path::Path::new("/tmp/kc")));
        assert!(Args::try_parse_from(["kjob-worker", "--lease-duration", "soon"]).is_err());
        let c = Args::try_parse_from(["kjob-worker"]).unwrap().config;
        assert_eq!((c.api_qps_total, c.api_burst_total), (None, None), "no budget by default");
        let c = Args::try_parse_from(["kjob-worker", "--api-qps-total=20", "--api-burst-total=30"])
            .unwrap()
            .config;
        assert_eq!((c.api_qps_total, c.api_burst_total), (Some(20.0), Some(30)));
        for bad in [&["--api-qps-total=0"][..], &["--api-qps-total=-1"], &["--api-burst-total=5"]] {
            let args = std::iter::once("kjob-worker").chain(bad.iter().copied());
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}
