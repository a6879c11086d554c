//! kjob-worker: leases keys from kjob-queue and syncs them against the API server.
//!
//! * [`lease`]: the lease loop (batches, concurrency, renewals, one Done per lease, drain).
//! * [`kube_api`]: every API server call, rate limited, timed out, retried and counted.
//! * [`orphan`]: the `orphan-pod` queue (tracking-finalizer cleanup of orphan pods).
//! * [`sync`]: syncJob — consistent reads, adoption, shared expectations, then the
//!   `kjob-reconcile` plan executed step by step.
//! * [`metrics`]: upstream `job_controller_*` metrics plus worker metrics.

pub mod config;
pub mod events;
pub mod kube_api;
pub mod lease;
pub mod metrics;
pub mod orphan;
pub mod ratelimit;
pub mod sync;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kjob_queue_client::{QueueClient, RetryPolicy};
use kjob_svc::{AdminState, Shutdown};
use prometheus_client::registry::Registry;

pub use config::{Args, WorkerConfig};
pub use worker::{SyncError, SyncOutcome, Worker};

/// How often `/readyz` re-checks that the queue service answers.
const READY_PROBE_PERIOD: Duration = Duration::from_secs(5);
/// How long the event writer may take to flush queued events at shutdown.
const EVENT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The queues a worker serves, with the share of `--concurrency` each gets (upstream runs one
/// orphan worker per Job worker).
const SERVED_QUEUES: [&str; 2] = [kjob_core::JOB_QUEUE, kjob_core::ORPHAN_POD_QUEUE];

/// Runs the worker until `shutdown`, then drains: stops leasing, lets in-flight syncs finish
/// within the shutdown grace and hands the rest back.
pub async fn run(config: WorkerConfig, shutdown: Shutdown) -> anyhow::Result<()> {
    let WorkerConfig {
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
    } = config;
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let admin_state = AdminState::new(registry);
    let admin_listener = tokio::net::TcpListener::bind(admin.admin_listen)
        .await
        .with_context(|| format!("binding the admin port {}", admin.admin_listen))?;
    tracing::info!(addr = %admin_listener.local_addr()?, "admin port listening");

    let client = kube_client(&kube).await.context("building the kube client")?;
    // Bounded retries: a sync must fail (and be requeued) rather than hang on a dead queue, and
    // a renewal that waits too long is as good as lost.
    let queue = QueueClient::connect_lazy(&queue_url)?.with_retry_policy(RetryPolicy {
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(2),
        max_retries: Some(3),
    });
    let api = kube_api::KubeApi::new(client, kube_qps, kube_burst, metrics.clone());
    let (events, writer) =
        events::EventSink::new(api.clone(), &controller_name, &worker_id, metrics.clone());
    let writer = writer.with_shared_gate(queue.clone());
    let worker = Arc::new(
        Worker::new(api, queue.clone(), events, metrics, controller_name, manage_all_jobs)
            .with_stale_expectations_after(lease_duration + sync::STALE_EXPECTATIONS_MARGIN),
    );

    // The admin port outlives the drain so probes and metrics answer until the very end.
    let admin_stop = Shutdown::new();
    let admin_task = tokio::spawn(kjob_svc::serve_admin(
        admin_listener,
        admin_state.clone(),
        admin_stop.clone(),
    ));
    let ready_task = tokio::spawn(probe_readiness(queue.clone(), admin_state, shutdown.clone()));
    let writer_task = tokio::spawn(writer.run());

    let loops: Vec<_> = SERVED_QUEUES
        .iter()
        .map(|q| {
            let settings = lease::LeaseSettings {
                queue: q,
                concurrency,
                lease: lease_duration,
                worker_id: worker_id.clone(),
                shutdown_grace,
            };
            tokio::spawn(lease::lease_loop(
                worker.clone(),
                queue.clone(),
                settings,
                shutdown.clone(),
            ))
        })
        .collect();
    tracing::info!(%worker_id, concurrency, ?lease_duration, "worker started");
    for l in loops {
        if let Err(e) = l.await {
            tracing::error!(error = %e, "lease loop failed");
        }
    }
    // Every sync is over: dropping the last sink ends the event writer once it has flushed.
    drop(worker);
    if tokio::time::timeout(EVENT_FLUSH_TIMEOUT, writer_task).await.is_err() {
        tracing::warn!("event writer did not flush in time; dropping queued events");
    }
    let _ = ready_task.await;
    admin_stop.cancel();
    admin_task.await.context("admin task")?.context("admin server")?;
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
    Ok(kube::Client::try_from(config)?)
}

/// Keeps `/readyz` in step with whether the queue service answers.
async fn probe_readiness(queue: QueueClient, state: AdminState, shutdown: Shutdown) {
    let probe = queue.with_retry_policy(RetryPolicy::no_retries());
    loop {
        let ok = probe.stats(kjob_core::JOB_QUEUE).await.is_ok();
        if ok != state.is_ready() {
            tracing::info!(ready = ok, "queue reachability changed");
        }
        state.set_ready(ok && !shutdown.is_cancelled());
        tokio::select! {
            _ = shutdown.cancelled() => { state.set_ready(false); return; }
            _ = tokio::time::sleep(READY_PROBE_PERIOD) => {}
        }
    }
}
