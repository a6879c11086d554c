//! What a sync is given and what it gives back, below both the lease loop and the syncs so
//! that neither needs the other: the per-process [`SyncContext`], the [`LeasedJob`] a lease
//! hands a sync, and the [`SyncResult`] the lease's Done is made from.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kjob_core::ObjectKey;
use kjob_core::seal::ViewKey;
use kjob_queue_client::{
    ClientError, FinalizerRemovals, JobView, QueueClient, SetExpectations, ViewWriteBack,
};

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

/// Everything a sync reads besides its key; one per process, shared by all syncs.
pub struct SyncContext {
    /// API server access.
    pub api: KubeApi,
    /// Queue service (expectations and records).
    pub queue: QueueClient,
    /// Event sink.
    pub events: EventSink,
    /// Metrics.
    pub metrics: Metrics,
    /// `spec.managedBy` value this worker answers to.
    pub controller_name: String,
    /// Also take Jobs without managedBy (or naming the built-in controller).
    pub manage_all: bool,
    /// Age after which unsatisfied expectations count as satisfied.
    pub stale_expectations_after: Duration,
    /// Opens the sealed entries of the shared view and seals this worker's write-backs.
    pub view_key: ViewKey,
    /// Decoded views of the Jobs this worker synced last (`--view-cache-pods`).
    pub view_cache: std::sync::Arc<crate::view_cache::ViewCache>,
}

/// The shared view a Lease reply brought with a key (`None`: the sync reads it itself).
pub type View = Option<JobView>;

/// A leased key, parsed once where the lease hands it over, with the view that came with it.
#[derive(Debug)]
pub struct LeasedJob {
    /// The leased object (a Job, or a pod of the orphan queue).
    pub key: ObjectKey,
    /// The Job's shared view as the Lease reply brought it.
    pub view: View,
    /// What the sync owes so far (see [`Journal`]).
    journal: Journal,
}

impl LeasedJob {
    /// A key whose lease ends with a Done: the expectations of creations and of
    /// tracking-finalizer removals go with it, after the calls are made.
    pub fn new(key: ObjectKey, view: View) -> Self {
        Self { key, view, journal: Journal::new(true) }
    }

    /// A key synced without a Done to hand expectations to: the caller raises the record of
    /// creations itself afterwards, and removals are expected before they are made (as
    /// upstream).
    pub fn without_done(key: ObjectKey, view: View) -> Self {
        Self { key, view, journal: Journal::new(false) }
    }

    /// The journal of what this sync owes, shared with whoever holds the returned handle.
    pub fn journal(&self) -> Journal {
        self.journal.clone()
    }
}

/// What a sync hands back for its lease's Done.
#[derive(Debug)]
pub struct SyncResult {
    /// How the sync ended.
    pub outcome: Result<SyncOutcome, SyncError>,
    /// The Job object the sync wrote last, for the shared view.
    pub write_back: Option<ViewWriteBack>,
    /// The expectations the sync made calls for but did not raise (see [`Journal`]).
    pub owed: Owed,
}

impl SyncResult {
    /// A result that hands back nothing but `outcome`.
    pub fn only(outcome: Result<SyncOutcome, SyncError>) -> Self {
        Self { outcome, write_back: None, owed: Owed::default() }
    }
}

/// Expectations a sync leaves to its lease's Done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Owed {
    /// The record of pods it created.
    pub expectations: Option<SetExpectations>,
    /// The tracking-finalizer removals it made.
    pub removals: Option<FinalizerRemovals>,
}

/// The running account of what a sync owes its Done, written as the sync goes. A finished
/// sync hands it back in its [`SyncResult`]; the lease loop keeps a handle too, because a sync
/// dropped at the wind-down limit returns nothing, yet the pods it created (or removed the
/// finalizers of) still need their expectations (`sync::JobRun::drive` explains why they are
/// raised after the calls).
#[derive(Debug, Clone)]
pub struct Journal {
    /// The record owed.
    owed: Arc<Mutex<Option<SetExpectations>>>,
    /// The finalizer removals owed.
    removals: Arc<Mutex<Option<FinalizerRemovals>>>,
    /// Whether removals may be owed at all (otherwise syncs expect them before removing).
    pub removals_deferrable: bool,
}

impl Journal {
    /// A journal syncs leave the record of their creations in, and finalizer removals too
    /// when `removals_deferrable`.
    fn new(removals_deferrable: bool) -> Self {
        Self { owed: Arc::default(), removals: Arc::default(), removals_deferrable }
    }

    /// The finalizer removals owed, to read or change.
    fn owed_removals(&self) -> MutexGuard<'_, Option<FinalizerRemovals>> {
        self.removals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Owes the Done the expectation of removing the finalizers of `pod_uids` (Job `key`,
    /// UID `job_uid`).
    pub fn owe_removals(&self, key: &str, job_uid: &str, pod_uids: Vec<String>) {
        let mut owed = self.owed_removals();
        let r = owed.get_or_insert_with(|| FinalizerRemovals {
            key: key.to_string(),
            job_uid: job_uid.to_string(),
            pod_uids: Vec::new(),
        });
        r.pod_uids.extend(pod_uids);
    }

    /// Drops `pod_uids` (removals that failed) from the removals owed; returns those that were
    /// not owed (expected already, so the queue service must forget them).
    pub fn forgive_removals(&self, pod_uids: Vec<String>) -> Vec<String> {
        let mut owed = self.owed_removals();
        let Some(r) = owed.as_mut() else { return pod_uids };
        let (forgiven, rest): (Vec<String>, Vec<String>) =
            pod_uids.into_iter().partition(|p| r.pod_uids.contains(p));
        r.pod_uids.retain(|p| !forgiven.contains(p));
        if r.pod_uids.is_empty() {
            *owed = None;
        }
        rest
    }

    /// The record owed, to read or change.
    pub fn owed(&self) -> MutexGuard<'_, Option<SetExpectations>> {
        self.owed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes everything owed.
    pub fn take(&self) -> Owed {
        Owed { expectations: self.owed().take(), removals: self.owed_removals().take() }
    }
}
