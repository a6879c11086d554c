//! kjob-worker: leases keys from kjob-queue and syncs them against the API server.
//!
//! Read top to bottom, each module uses only those below it:
//! * [`worker`]: the [`Worker`], which wires the lease loop to the syncs.
//! * [`lease`]: the lease loop (batches, concurrency, renewals, one Done per lease, drain); it
//!   parses each key once and runs a sync it is given.
//! * [`orphan`]: the `orphan-pod` queue (tracking-finalizer cleanup of orphan pods).
//! * [`sync`]: syncJob — consistent reads, adoption, shared expectations, then the
//!   `kjob-reconcile` plan executed step by step; a leased Job in, a [`SyncResult`] out.
//! * [`context`]: what a sync is given and hands back.
//! * [`events`], [`kube_api`], [`metrics`]: events, every API server call (rate limited, timed
//!   out, retried and counted), upstream `job_controller_*` metrics plus worker metrics.

pub mod budget;
pub mod config;
pub mod context;
pub mod events;
pub mod kube_api;
pub mod kube_proto;
pub mod lease;
pub mod metrics;
pub mod orphan;
pub mod ratelimit;
pub mod sync;
pub mod view_cache;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::FutureExt;
use kjob_queue_client::{QueueClient, RetryPolicy};
use kjob_svc::{AdminServer, AdminState, Shutdown, Vital};
use prometheus_client::registry::Registry;

pub use config::{Args, WorkerConfig};
pub use context::{LeasedJob, SyncError, SyncOutcome, SyncResult};
pub use worker::Worker;

/// The User-Agent of the worker's API requests.
pub const USER_AGENT: &str = concat!("kjob-worker/", env!("CARGO_PKG_VERSION"));

/// How often `/readyz` re-checks that the queue service answers.
const READY_PROBE_PERIOD: Duration = Duration::from_secs(5);
/// How long the event writer may take to flush queued events at shutdown.
const EVENT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The queues a worker serves, with the share of `--concurrency` each gets (upstream runs one
/// orphan worker per Job worker).
const SERVED_QUEUES: [&str; 2] = [kjob_core::JOB_QUEUE, kjob_core::ORPHAN_POD_QUEUE];

/// The per-Job records a Job key's view brings along: a sync needs the pod-failure backoff.
const JOB_VIEW_RECORDS: &[&str] = &[sync::BACKOFF_RECORD];

/// The sockets a worker serves on (its admin port only), bound by the caller.
pub type Listeners = kjob_svc::AdminListeners;

/// Runs the worker until `shutdown`, then drains: stops leasing, lets in-flight syncs finish
/// within the shutdown grace and hands the rest back. The admin port answers until the end.
///
/// The lease loops, the readiness probe and the admin server are vital: if one ends before
/// shutdown, the worker goes not ready, drains and returns an error naming it.
pub async fn run(
    listeners: Listeners,
    config: WorkerConfig,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let WorkerConfig {
        queue_url,
        queue_tls,
        view_key,
        concurrency,
        view_cache_pods,
        lease_duration,
        kube_qps,
        kube_burst,
        api_qps_total,
        api_burst_total,
        controller_name,
        manage_all_jobs,
        shutdown_grace,
        worker_id,
        kube,
    } = config;
    let worker_id = kjob_svc::identity_or_default(worker_id, "kjob-worker");
    let view_key = view_key.key(queue_tls.insecure_no_auth)?;
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    kjob_svc::with_admin(listeners.admin, registry, async move |admin: &mut AdminServer| {
        let ready = admin.state().clone();
        let client = kube_client(&kube).await.context("building the kube client")?;
        // Bounded retries: a sync must fail (and be requeued) rather than hang on a dead queue,
        // and a renewal that waits too long is as good as lost.
        let queue = queue_tls.connect_lazy(&queue_url)?.with_retry_policy(RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            max_retries: Some(3),
        });
        let mut api = kube_api::KubeApi::new(client, kube_qps, kube_burst, metrics.clone());
        if let Some(qps) = api_qps_total {
            let burst = api_burst_total.unwrap_or_else(|| budget::default_burst(qps));
            let config = budget::BudgetConfig { qps, burst };
            tracing::info!(qps, burst, "sharing the workers' API budget");
            api = api.with_budget(budget::ApiBudget::new(queue.clone(), config, metrics.clone()));
        }
        let (events, writer) =
            events::EventSink::new(api.clone(), &controller_name, &worker_id, metrics.clone());
        let writer = writer.with_shared_gate(queue.clone());
        let worker = Arc::new(
            Worker::new(api, queue.clone(), events, metrics, controller_name, manage_all_jobs)
                .with_stale_expectations_after(lease_duration + sync::STALE_EXPECTATIONS_MARGIN)
                .with_view_key(view_key)
                .with_view_cache(view_cache_pods),
        );
        let writer_task = tokio::spawn(writer.run());

        let mut vital = Vital::new(&shutdown).readiness(&ready);
        for q in SERVED_QUEUES {
            let settings = lease::LeaseSettings {
                queue: q,
                concurrency,
                lease: lease_duration,
                worker_id: worker_id.clone(),
                shutdown_grace,
                view_records: (q == kjob_core::JOB_QUEUE).then_some(JOB_VIEW_RECORDS),
                view_cache: (q == kjob_core::JOB_QUEUE).then(|| worker.view_cache().clone()),
            };
            let lease_loop =
                lease::lease_loop(worker.clone(), queue.clone(), settings, shutdown.clone());
            // A task of its own per queue: neither queue's loop waits on the other's polling.
            vital.spawn("lease loop", lease_loop.map(Ok));
        }
        // Every sink is in the lease loops now: once they end, the event writer flushes and ends.
        drop(worker);
        vital.task("readiness probe", probe_readiness(&queue, &ready, &shutdown).map(Ok));
        vital.guard("admin server", admin.watch());
        tracing::info!(%worker_id, concurrency, ?lease_duration, "worker started");
        let supervised = vital.run().await;
        if tokio::time::timeout(EVENT_FLUSH_TIMEOUT, writer_task).await.is_err() {
            tracing::warn!("event writer did not flush in time; dropping queued events");
        }
        Ok(supervised?)
    })
    .await?;
    tracing::info!("worker stopped");
    Ok(())
}

/// A client as [`kjob_svc::KubeClientArgs::client`] builds it, but without kube's own retry
/// layer: [`kube_api::KubeApi`] retries throttled and failed calls itself, so it can count
/// every refused attempt by result, honour the server's `retryAfterSeconds` (kube's layer
/// reads only a `Retry-After` header) and bound a call's retries by the sync's needs (kube's
/// default allows 15 retries with delays growing to 1000 s).
async fn kube_client(args: &kjob_svc::KubeClientArgs) -> anyhow::Result<kube::Client> {
    let mut config = args.config().await?;
    config.default_retry = false;
    // Named as upstream's controllers name themselves (`kube-controller-manager/…`): the API
    // server's audit log, its field managers and a fake server's counters tell the workers'
    // requests apart (kube-rs sends no User-Agent of its own).
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    kjob_svc::kube_client::client(config, args.kube_http1_only)
}

/// Keeps `/readyz` in step with whether the queue service answers.
async fn probe_readiness(queue: &QueueClient, ready: &AdminState, shutdown: &Shutdown) {
    kjob_svc::probe_readiness(ready, "queue", READY_PROBE_PERIOD, shutdown, || queue.answers())
        .await;
}
