//! The worker: the one place that wires the lease loop to the syncs. It holds the
//! [`SyncContext`] every sync reads and sends each leased key to its queue's sync
//! ([`sync::sync_job`] or [`orphan::sync_orphan_pod`]).

use std::sync::Arc;
use std::time::Duration;

use kjob_core::seal::ViewKey;
use kjob_core::{JOB_QUEUE, ORPHAN_POD_QUEUE, ObjectKey};
use kjob_queue_client::QueueClient;
use tokio_util::sync::CancellationToken;

use crate::context::{LeasedJob, SyncContext, SyncError, SyncOutcome, SyncResult};
use crate::events::EventSink;
use crate::kube_api::KubeApi;
use crate::lease::{SyncFuture, Syncer};
use crate::metrics::Metrics;
use crate::view_cache::{DEFAULT_VIEW_CACHE_PODS, ViewCache};
use crate::{orphan, sync};

/// Everything a sync needs; one per process, shared by all syncs.
pub struct Worker {
    /// What every sync reads.
    ctx: SyncContext,
}

impl Worker {
    /// Builds the worker.
    pub fn new(
        api: KubeApi,
        queue: QueueClient,
        events: EventSink,
        metrics: Metrics,
        controller_name: String,
        manage_all: bool,
    ) -> Self {
        let ctx = SyncContext {
            api,
            queue,
            events,
            metrics,
            controller_name,
            manage_all,
            stale_expectations_after: sync::DEFAULT_STALE_EXPECTATIONS_AFTER,
            view_key: ViewKey::insecure_development(),
            view_cache: Arc::new(ViewCache::new(DEFAULT_VIEW_CACHE_PODS)),
        };
        Self { ctx }
    }

    /// Bounds the cache of decoded views to `max_pods` pods over all Jobs (0: no cache; every
    /// sync reads its view whole).
    pub fn with_view_cache(mut self, max_pods: usize) -> Self {
        self.ctx.view_cache = Arc::new(ViewCache::new(max_pods));
        self
    }

    /// The cache of decoded views (a Lease names the views it holds).
    pub fn view_cache(&self) -> &Arc<ViewCache> {
        &self.ctx.view_cache
    }

    /// Sets the key that opens the shared view's sealed entries (the watcher's). Until set, the
    /// public development key of `--insecure-no-auth` is used: `kjob-worker` always sets it.
    pub fn with_view_key(mut self, key: ViewKey) -> Self {
        self.ctx.view_key = key;
        self
    }

    /// Sets the age after which unsatisfied expectations count as satisfied. Workers read the
    /// Job and its pods consistently and leases are fenced, so once a record is older than one
    /// lease (plus the time for a request already sent to land) whoever raised it has stopped
    /// writing and a fresh LIST shows everything it did; waiting for upstream's 5-minute
    /// timeout would only stall the Job (a crashed worker, or observations lost in a watcher
    /// failover).
    pub fn with_stale_expectations_after(mut self, after: Duration) -> Self {
        self.ctx.stale_expectations_after = after;
        self
    }

    /// The queue service client (expectations and records).
    pub fn queue(&self) -> &QueueClient {
        &self.ctx.queue
    }

    /// The event sink.
    pub fn events(&self) -> &EventSink {
        &self.ctx.events
    }

    /// Runs the sync of `key` of `queue` without a lease: what a Done would carry is written
    /// here. Keys that cannot be parsed are dropped (retrying cannot fix them). Once
    /// `wind_down` is cancelled the sync issues no more pod calls: it reports them as failed to
    /// the plan (which lowers the expectations it had raised for them), saves its status and
    /// ends quickly.
    pub async fn sync(
        &self,
        queue: &str,
        key: &str,
        wind_down: &CancellationToken,
    ) -> Result<SyncOutcome, SyncError> {
        let key = match ObjectKey::parse(key) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(key, error = %e, "dropping malformed key");
                return Ok(SyncOutcome::Done);
            }
        };
        let key_str = key.to_string();
        let SyncResult { outcome, write_back, owed } =
            self.sync_leased(queue, LeasedJob::without_done(key, None), wind_down).await;
        if let Some(e) = owed.expectations {
            let (k, uid, uids) = (&e.key, &e.job_uid, &e.created_pod_uids);
            self.ctx.queue.set_expectations_created(k, uid, e.add, e.del, uids).await?;
        }
        if let Some(w) = write_back {
            let stored =
                self.ctx.queue.put_job_view(&key_str, &w.job_uid, w.job, &w.resource_version, 0);
            if let Err(e) = stored.await {
                tracing::debug!(job = key_str, error = %e, "could not write the Job back to the shared view");
            }
        }
        outcome
    }

    /// Runs the sync of `job` leased from `queue`: what its Done hands back.
    pub async fn sync_leased(
        &self,
        queue: &str,
        job: LeasedJob,
        wind_down: &CancellationToken,
    ) -> SyncResult {
        match queue {
            JOB_QUEUE => sync::sync_job(&self.ctx, job, wind_down).await,
            ORPHAN_POD_QUEUE => {
                SyncResult::only(orphan::sync_orphan_pod(&self.ctx, &job.key).await)
            }
            other => {
                tracing::error!(queue = other, "no sync for this queue; dropping key");
                SyncResult::only(Ok(SyncOutcome::Done))
            }
        }
    }
}

impl Syncer for Worker {
    fn run(&self, queue: &str, job: LeasedJob, wind_down: &CancellationToken) -> impl SyncFuture {
        self.sync_leased(queue, job, wind_down)
    }

    fn metrics(&self) -> &Metrics {
        &self.ctx.metrics
    }
}
