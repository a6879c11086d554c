//! The queue vocabulary every service speaks, defined once: what the watcher observes about a
//! Job's pods, what a lease brings (the Job's shared view and expectations) and how it ends. The wire forms are in `kjob-proto` (`kjob_proto::convert`),
//! the Redis forms in `kjob-workqueue`; both are conversions of these types.

use std::time::Duration;

/// The kind of an expectation observation (client-go `CreationObserved`, `DeletionObserved`,
/// the Job controller's `finalizerRemovalObserved`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObservationKind {
    /// A pod of the Job was seen created: lowers expected creations by one.
    Creation,
    /// A pod of the Job was seen deleted or deleting: lowers expected deletions by one.
    Deletion,
    /// A pod's tracking finalizer was seen gone: drops the pod from the in-flight set.
    FinalizerRemoval,
}

impl ObservationKind {
    /// The metric label of the kind.
    pub const fn label(self) -> &'static str {
        match self {
            ObservationKind::Creation => "creation",
            ObservationKind::Deletion => "deletion",
            ObservationKind::FinalizerRemoval => "finalizer_removal",
        }
    }
}

/// One expectation observation for a Job, made by the watcher and applied by the queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Observation {
    /// What was observed.
    pub kind: ObservationKind,
    /// UID of the Job, from the pod's controllerRef (empty matches any record).
    pub job_uid: String,
    /// UID of the pod; when given, a repeated observation is applied once (required for
    /// [`ObservationKind::FinalizerRemoval`]).
    pub pod_uid: String,
}

impl Observation {
    /// An observation of `kind` for pod `pod_uid` of Job `job_uid`.
    pub fn new(
        kind: ObservationKind,
        job_uid: impl Into<String>,
        pod_uid: impl Into<String>,
    ) -> Self {
        Self { kind, job_uid: job_uid.into(), pod_uid: pod_uid.into() }
    }
}

/// How a lease ends (client-go's Forget / AddRateLimited / Forget + AddAfter after Done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// Success: reset the key's failure count.
    Forget,
    /// Error: requeue after the per-item exponential backoff.
    RateLimited,
    /// Success asking for another sync after the delay (zero = now).
    RequeueAfter(Duration),
}

impl LeaseOutcome {
    /// The metric label of the outcome.
    pub const fn label(self) -> &'static str {
        match self {
            LeaseOutcome::Forget => "forget",
            LeaseOutcome::RateLimited => "rate_limited",
            LeaseOutcome::RequeueAfter(_) => "requeue_after",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let kinds = [
            ObservationKind::Creation,
            ObservationKind::Deletion,
            ObservationKind::FinalizerRemoval,
        ];
        let labels: Vec<_> = kinds.iter().map(|k| k.label()).collect();
        assert_eq!(labels, ["creation", "deletion", "finalizer_removal"]);
        let o = Observation::new(ObservationKind::Deletion, "j", "p");
        assert_eq!((o.job_uid.as_str(), o.pod_uid.as_str()), ("j", "p"));
        assert_eq!(LeaseOutcome::RequeueAfter(Duration::ZERO).label(), "requeue_after");
        assert_eq!(LeaseOutcome::RateLimited.label(), "rate_limited");
    }
}

/// One write to a Job's shared view, as the leading watcher makes it and the queue stores it
/// (the wire form is `kjob.queue.v1.CacheOp`). `B` holds the trimmed JSON: `Arc<[u8]>` in the
/// watcher, which shares it between its cache and its sends, `Vec<u8>` in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewOp<B> {
    /// Store the Job object; kept only when `resource_version` is newer than the cached one
    /// (a worker may have written back a newer one). Another UID replaces the view, untrusted.
    Job {
        /// The Job's UID.
        uid: String,
        /// The object as JSON.
        object: B,
        /// Its resourceVersion.
        resource_version: String,
    },
    /// The Job is gone: drop its object, pods and record.
    DeleteJob,
    /// Store a pod under its name.
    Pod {
        /// Pod name.
        name: String,
        /// The pod as JSON.
        object: B,
    },
    /// Drop a pod (gone, or no longer the Job's).
    DeletePod {
        /// Pod name.
        name: String,
    },
    /// Start a snapshot: drop every pod, distrust the view until [`ViewOp::Trust`].
    Reset {
        /// The Job's UID.
        uid: String,
    },
    /// End a snapshot: trust the view in the writing session.
    Trust,
    /// Orphans matching the Job's selector were seen; the next sync lists pods to adopt them.
    Orphans,
}

impl<B: AsRef<[u8]>> ViewOp<B> {
    /// Bytes this write carries on the wire, roughly (batch sizing): its object plus a fixed
    /// allowance for the names and framing.
    pub fn size(&self) -> usize {
        match self {
            ViewOp::Job { object, .. } | ViewOp::Pod { object, .. } => object.as_ref().len() + 64,
            _ => 64,
        }
    }
}

/// A lease as kjob-queue grants it (wire `LeasedItem`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leased {
    /// The leased key, `namespace/name`.
    pub key: String,
    /// The lease's fencing id.
    pub lease_id: String,
    /// Rate-limited requeues of the key so far.
    pub requeues: u32,
    /// Lease deadline (Unix ms, on the Redis clock).
    pub deadline_unix_ms: i64,
    /// When the key was last enqueued (Unix ms).
    pub enqueued_unix_ms: i64,
    /// Leases of this key that expired since it was last finished.
    pub lease_expiries: u32,
    /// The Job's shared view, when the lease asked for views.
    pub view: Option<JobView>,
}

/// A Job's expectations as kjob-queue reads them (wire `GetExpectationsResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobExpectations {
    /// Nothing expected is still outstanding (or there is no record).
    pub satisfied: bool,
    /// A record exists for the Job's UID.
    pub exists: bool,
    /// Creations still expected.
    pub add: i64,
    /// Deletions still expected.
    pub del: i64,
    /// Age of the record.
    pub age_ms: u64,
    /// Pod UIDs whose tracking-finalizer removal is in flight.
    pub finalizer_removals: Vec<String>,
}

/// One per-Job record read with a view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewRecord {
    /// Record name.
    pub name: String,
    /// Its value.
    pub value: Vec<u8>,
}

/// A Job's shared view (wire `GetJobViewResponse`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobView {
    /// Written in full by the current watcher session; when false the rest is empty.
    pub trusted: bool,
    /// The Job object (JSON).
    pub job: Vec<u8>,
    /// The Job's pods (JSON each), in no particular order.
    pub pods: Vec<Vec<u8>>,
    /// Orphan notices seen.
    pub orphans_seen: u64,
    /// Orphan notices acknowledged.
    pub orphans_handled: u64,
    /// The expectations of the view's Job UID, read with the view.
    pub expectations: Option<JobExpectations>,
    /// The UID of the Job the view holds.
    pub job_uid: String,
    /// The records asked for that exist.
    pub records: Vec<ViewRecord>,
    /// Paged reads: where the next page begins (empty on the last page, and from a server
    /// that does not page).
    pub next_page: String,
    /// Paged reads: the view's version this page was read at (every page of one read must
    /// have the same).
    pub version: u64,
    /// The number of pods the view holds at `version`; `None` from a server that does not
    /// page (its one reply is the whole view).
    pub pod_count: Option<u64>,
    /// The view changed since the page this one continues: the read must begin again.
    pub moved: bool,
    /// First page or delta: the token of the session the view is trusted in (a later delta
    /// read names it with `version`).
    pub epoch: String,
    /// The view's name of each of `pods`, in the same order, when asked for (a caching
    /// reader) or in a delta; empty otherwise.
    pub pod_names: Vec<String>,
    /// A delta: `pods` (named by `pod_names`) were written and `removed` removed since the
    /// base version the read named; `version` and `pod_count` are the view's now.
    pub delta: bool,
    /// In a delta: pods removed since the base.
    pub removed: Vec<String>,
    /// In a delta: the version it is from; a holder of another one must not apply it.
    pub delta_base: u64,
}

/// A view a worker holds decoded (wire `CachedView`), named in a Lease so that the view of a
/// leased key among them comes as a delta.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedView {
    /// The Job's key.
    pub key: String,
    /// The version held.
    pub version: u64,
    /// The epoch token of the read that gave it.
    pub epoch: String,
}

/// A Job object written back into its shared view (wire `PutJobViewRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewWriteBack {
    /// The Job's key.
    pub key: String,
    /// The Job's UID.
    pub job_uid: String,
    /// The object (JSON).
    pub job: Vec<u8>,
    /// Its resourceVersion.
    pub resource_version: String,
}

/// The expectations a sync raises after creating pods (wire `SetExpectationsRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetExpectations {
    /// The Job's key.
    pub key: String,
    /// The Job's UID.
    pub job_uid: String,
    /// Creations expected.
    pub add: i64,
    /// Deletions expected.
    pub del: i64,
    /// UIDs of the pods created (the ones the watcher observed already are not expected).
    pub created_pod_uids: Vec<String>,
}

/// Tracking-finalizer removals a sync made (wire `ExpectFinalizerRemovalsRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalizerRemovals {
    /// The Job's key.
    pub key: String,
    /// The Job's UID.
    pub job_uid: String,
    /// The pods whose finalizers were removed.
    pub pod_uids: Vec<String>,
}

/// The Done that ends a lease, with what it writes first (wire `DoneRequest`).
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// Queue name.
    pub queue: String,
    /// The leased key.
    pub key: String,
    /// The lease's fencing id.
    pub lease_id: String,
    /// How the lease ends.
    pub outcome: LeaseOutcome,
    /// Job queue only: a Job object for the shared view.
    pub view_write_back: Option<ViewWriteBack>,
    /// Job queue only: expectations raised after creates.
    pub expectations: Option<SetExpectations>,
    /// Job queue only: finalizer removals made.
    pub finalizer_removals: Option<FinalizerRemovals>,
    /// Why the sync failed (empty when it did not): kept, truncated, in the key's history.
    pub error: String,
}

impl Done {
    /// The Done ending lease `lease_id` of `key` with `outcome`, writing nothing first.
    pub fn new(queue: &str, key: &str, lease_id: &str, outcome: LeaseOutcome) -> Self {
        Self {
            queue: queue.to_string(),
            key: key.to_string(),
            lease_id: lease_id.to_string(),
            outcome,
            view_write_back: None,
            expectations: None,
            finalizer_removals: None,
            error: String::new(),
        }
    }
}

/// What kjob-queue answers to a Done (wire `DoneResponse`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DoneAnswer {
    /// The key went back to the queue (it was dirty, or a requeue was asked for).
    pub requeued: bool,
    /// When it is ready again (Unix ms), if requeued.
    pub ready_unix_ms: i64,
}

impl<B: AsRef<[u8]>> ViewOp<B> {
    /// The same write holding its object as owned bytes (what [`AddItem`] carries).
    pub fn to_owned_bytes(&self) -> ViewOp<Vec<u8>> {
        match self {
            ViewOp::Job { uid, object, resource_version } => ViewOp::Job {
                uid: uid.clone(),
                object: object.as_ref().to_vec(),
                resource_version: resource_version.clone(),
            },
            ViewOp::DeleteJob => ViewOp::DeleteJob,
            ViewOp::Pod { name, object } => {
                ViewOp::Pod { name: name.clone(), object: object.as_ref().to_vec() }
            }
            ViewOp::DeletePod { name } => ViewOp::DeletePod { name: name.clone() },
            ViewOp::Reset { uid } => ViewOp::Reset { uid: uid.clone() },
            ViewOp::Trust => ViewOp::Trust,
            ViewOp::Orphans => ViewOp::Orphans,
        }
    }
}

/// One key to enqueue, with the observations and view writes that ride with it (wire
/// `AddItem`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AddItem {
    /// Queue name.
    pub queue: String,
    /// `namespace/name`.
    pub key: String,
    /// Ready after this delay (an earlier ready time already asked for wins).
    pub delay: Duration,
    /// Expectation observations to apply first.
    pub observations: Vec<Observation>,
    /// Apply the observations and view writes only; enqueue nothing.
    pub observe_only: bool,
    /// Writes to the Job's shared view.
    pub cache: Vec<ViewOp<Vec<u8>>>,
    /// The view session the writes belong to.
    pub cache_session: String,
    /// The Job's pod priority (orders its key within its namespace); `None` keeps the one
    /// kjob-queue holds for the key (0 when none).
    pub priority: Option<i32>,
}

/// What kjob-queue answers to an Add (wire `AddResponse`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddAnswer {
    /// Items enqueued.
    pub added: u32,
    /// The view session the writes named is gone from Redis: the watcher begins a new one.
    pub view_session_lost: bool,
}
