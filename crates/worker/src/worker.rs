//! The per-process worker context shared by every sync, and the dispatch from queue name to
//! sync function.

use std::time::Duration;

use kjob_core::{JOB_QUEUE, ORPHAN_POD_QUEUE, ObjectKey};
use kjob_queue_client::{ClientError, QueueClient, v1};
use tokio_util::sync::CancellationToken;

use crate::events::EventSink;
use crate::kube_api::{ApiError, KubeApi};
use crate::metrics::Metrics;

/// How a successful sync ends its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Nothing more to do until something changes (Done with Forget).
    Done,
    /// Sync again after this delay (deadlines, pod-failure backoff).
    RequeueAfter(Duration),
}

/// Why a sync failed; every variant ends the lease with a rate-limited requeue.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// An API server call failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A queue service call (expectations, records) failed.
    #[error("queue service: {0}")]
    Queue(#[from] ClientError),
    /// The reconcile plan ended with an error (a write failed or conflicted); what could be
    /// saved was saved.
    #[error(transparent)]
    Plan(#[from] kjob_reconcile::SyncError),
    /// The Job cannot be synced as it is (e.g. an invalid selector).
    #[error("invalid job: {0}")]
    InvalidJob(String),
}

/// Everything a sync needs; one per process, shared by all syncs.
pub struct Worker {
    /// API server access.
    pub(crate) api: KubeApi,
    /// Queue service (expectations and records).
    pub(crate) queue: QueueClient,
    /// Event sink.
    pub(crate) events: EventSink,
    /// Metrics.
    pub(crate) metrics: Metrics,
    /// `spec.managedBy` value this worker answers to.
    pub(crate) controller_name: String,
    /// Also take Jobs without managedBy (or naming the built-in controller).
    pub(crate) manage_all: bool,
    /// Age after which unsatisfied expectations count as satisfied (see [`Worker::with_stale_expectations_after`]).
    pub(crate) stale_expectations_after: Duration,
}

impl Worker {
    /// Builds the context.
    pub fn new(
        api: KubeApi,
        queue: QueueClient,
        events: EventSink,
        metrics: Metrics,
        controller_name: String,
        manage_all: bool,
    ) -> Self {
        Self {
            api,
            queue,
            events,
            metrics,
            controller_name,
            manage_all,
            stale_expectations_after: crate::sync::DEFAULT_STALE_EXPECTATIONS_AFTER,
        }
    }

    /// Sets the age after which unsatisfied expectations count as satisfied. Workers read the
    /// Job and its pods consistently and leases are fenced, so once a record is older than one
    /// lease (plus the time for a request already sent to land) whoever raised it has stopped
    /// writing and a fresh LIST shows everything it did; waiting for upstream's 5-minute
    /// timeout would only stall the Job (a crashed worker, or observations lost in a watcher
    /// failover).
    pub fn with_stale_expectations_after(mut self, after: Duration) -> Self {
        self.stale_expectations_after = after;
        self
    }

    /// The queue service client (expectations and records).
    pub fn queue(&self) -> &QueueClient {
        &self.queue
    }

    /// The event sink.
    pub fn events(&self) -> &EventSink {
        &self.events
    }

    /// Runs the sync of `key` leased from `queue`. Keys that cannot be parsed are dropped
    /// (retrying cannot fix them). Once `wind_down` is cancelled the sync issues no more pod
    /// calls: it reports them as failed to the plan (which lowers the expectations it had
    /// raised for them), saves its status and ends quickly.
    pub async fn sync(
        &self,
        queue: &str,
        key: &str,
        wind_down: &CancellationToken,
    ) -> Result<SyncOutcome, SyncError> {
        let mut write_back = None;
        // Removals are expected before they are made here: this Done carries nothing.
        let raised = crate::lease::Raised::new(true, false);
        let result = self.sync_leased(queue, key, None, wind_down, &mut write_back, &raised).await;
        if let Some(e) = raised.take() {
            let (k, uid, uids) = (&e.key, &e.job_uid, &e.created_pod_uids);
            self.queue.set_expectations_created(k, uid, e.add, e.del, uids).await?;
        }
        if let Some(w) = write_back {
            let stored =
                self.queue.put_job_view(key, &w.job_uid, w.job, &w.resource_version, 0).await;
            if let Err(e) = stored {
                tracing::debug!(job = key, error = %e, "could not write the Job back to the shared view");
            }
        }
        result
    }

    /// [`Self::sync`] with the Job's shared view as the Lease reply brought it (`None`: the
    /// sync reads it itself). The Job object the sync wrote last lands in `write_back`, and the
    /// expectations it raised after creating pods in `raised`, for the lease's Done to write
    /// (which `sync` does itself).
    pub async fn sync_leased(
        &self,
        queue: &str,
        key: &str,
        view: Option<v1::GetJobViewResponse>,
        wind_down: &CancellationToken,
        write_back: &mut Option<v1::PutJobViewRequest>,
        raised: &crate::lease::Raised,
    ) -> Result<SyncOutcome, SyncError> {
        let key = match ObjectKey::parse(key) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(key, error = %e, "dropping malformed key");
                return Ok(SyncOutcome::Done);
            }
        };
        match queue {
            JOB_QUEUE => self.sync_job(&key, view, wind_down, write_back, raised).await,
            ORPHAN_POD_QUEUE => self.sync_orphan_pod(&key).await,
            other => {
                tracing::error!(queue = other, "no sync for this queue; dropping key");
                Ok(SyncOutcome::Done)
            }
        }
    }
}
