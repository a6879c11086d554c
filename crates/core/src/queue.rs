//! The queue vocabulary every service speaks, defined once: what the watcher observes about a
//! Job's pods and how a lease ends. The wire forms are in `kjob-proto` (`kjob_proto::convert`),
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
