//! Flags of `kjob-worker` (clap derive, each with an `env` twin).

use std::time::Duration;

use kjob_svc::{AdminArgs, KubeClientArgs, LogArgs, parse_duration};

/// `kjob-worker`: leases Job keys from kjob-queue and runs syncJob against the API server.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kjob-worker", version, about)]
pub struct Args {
    /// URL of the kjob-queue gRPC service.
    #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
    pub queue_url: String,
    /// Syncs in flight at once in this process, per queue (upstream --concurrent-job-syncs).
    #[arg(long, env = "KJOB_CONCURRENCY", default_value_t = 5)]
    pub concurrency: usize,
    /// Lease duration asked from the queue; long syncs are renewed every third of it.
    #[arg(long, env = "KJOB_LEASE_DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Client-side API request rate (upstream kube-controller-manager defaults to 20).
    #[arg(long, env = "KJOB_KUBE_QPS", default_value_t = 100.0)]
    pub kube_qps: f64,
    /// Client-side API request burst (upstream kube-controller-manager defaults to 30).
    #[arg(long, env = "KJOB_KUBE_BURST", default_value_t = 200)]
    pub kube_burst: u32,
    /// `spec.managedBy` value this controller reconciles.
    #[arg(long, env = "KJOB_CONTROLLER_NAME", default_value = kjob_core::DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// Also reconcile Jobs without managedBy (or naming the built-in controller).
    #[arg(long, env = "KJOB_MANAGE_ALL_JOBS")]
    pub manage_all_jobs: bool,
    /// How long in-flight syncs may run after SIGTERM before their keys are handed back.
    #[arg(long, env = "KJOB_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Identity of this worker (lease holder, logs); defaults to the hostname.
    #[arg(long, env = "POD_NAME")]
    pub worker_id: Option<String>,
    /// Log flags.
    #[command(flatten)]
    pub log: LogArgs,
    /// Admin port flags.
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Kube client flags.
    #[command(flatten)]
    pub kube: KubeClientArgs,
}

/// Everything [`crate::run`] needs (the flags minus logging, which the binary sets up).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// URL of the kjob-queue gRPC service.
    pub queue_url: String,
    /// Syncs in flight at once, per queue.
    pub concurrency: usize,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Client-side API request rate.
    pub kube_qps: f64,
    /// Client-side API request burst.
    pub kube_burst: u32,
    /// `spec.managedBy` value answered to.
    pub controller_name: String,
    /// Take unmanaged Jobs too.
    pub manage_all_jobs: bool,
    /// Drain time on shutdown.
    pub shutdown_grace: Duration,
    /// Worker identity.
    pub worker_id: String,
    /// Admin listen address.
    pub admin: AdminArgs,
    /// Kube client flags.
    pub kube: KubeClientArgs,
}

impl Args {
    /// Splits the flags into the log flags and the worker configuration.
    pub fn into_config(self) -> (LogArgs, WorkerConfig) {
        let Args {
            queue_url,
            concurrency,
            lease_duration,
            kube_qps,
            kube_burst,
            controller_name,
            manage_all_jobs,
            shutdown_grace,
            worker_id,
            log,
            admin,
            kube,
        } = self;
        let worker_id = worker_id.filter(|s| !s.is_empty()).unwrap_or_else(default_worker_id);
        let config = WorkerConfig {
            queue_url,
            concurrency,
            lease_duration,
            kube_qps,
            kube_burst,
            controller_name,
            manage_all_jobs,
            shutdown_grace,
            worker_id,
            admin,
            kube,
        };
        (log, config)
    }
}

/// The hostname (the pod name in a Deployment), or a random id when it cannot be read.
pub fn default_worker_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("kjob-worker-{}", uuid::Uuid::new_v4().simple()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_and_flags() {
        let a = Args::try_parse_from(["kjob-worker"]).unwrap();
        assert_eq!(a.concurrency, 5);
        assert_eq!(a.lease_duration, Duration::from_secs(30));
        assert_eq!(a.kube_burst, 200);
        assert_eq!(a.controller_name, "kjob.io/job-controller");
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
        let (_, c) = a.into_config();
        assert_eq!(c.concurrency, 8);
        assert_eq!(c.lease_duration, Duration::from_secs(2));
        assert_eq!(c.shutdown_grace, Duration::from_millis(500));
        assert!(c.manage_all_jobs);
        assert_eq!(c.worker_id, "w1");
        assert_eq!(c.kube.kubeconfig.as_deref(), Some(std::path::Path::new("/tmp/kc")));
        assert!(Args::try_parse_from(["kjob-worker", "--lease-duration", "soon"]).is_err());
    }
}
