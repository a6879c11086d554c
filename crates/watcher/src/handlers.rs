//! The upstream Job controller's event handlers as pure functions: (event, store) → what to
//! enqueue, when, and which expectation observations go with it.
//!
//! Behaviour follows `addJob`, `updateJob`, `deleteJob`, `addPod`, `updatePod`, `deletePod`,
//! `resolveControllerRef`, `getPodJobs` and `cleanupPodFinalizers` of
//! `pkg/controller/job/job_controller.go`, with two kjob rules on top: Jobs managed by another
//! controller (and their pods) are never enqueued, and a pod's deletion is observed once (when its
//! deletionTimestamp first shows up, or at its final delete if it never did), because kjob's
//! expectations are shared and must not be lowered twice for one pod.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kjob_core::{JOB_QUEUE, ORPHAN_POD_QUEUE};
use kjob_reconcile::{Claim, ClaimFacts, Owner};

use crate::cache::{ControllerRef, JobInfo, PodInfo, Store};
use crate::view::ViewWrite;

pub use kjob_core::SYNC_JOB_BATCH_PERIOD;

/// The expectation observations the watcher reports (kjob's one vocabulary of them).
pub use kjob_core::{Observation, ObservationKind};

/// A decision of a handler: enqueue `key` on `queue` after `delay`, applying `observations` first.
/// The informer adds the shared-view writes that go with it (see [`crate::view`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Enqueue {
    /// Queue name ([`JOB_QUEUE`] or [`ORPHAN_POD_QUEUE`]).
    pub queue: &'static str,
    /// `namespace/name` of the Job (or of the pod, on the orphan queue).
    pub key: String,
    /// Delay before the key becomes ready.
    pub delay: Duration,
    /// Observations applied before the enqueue.
    pub observations: Vec<Observation>,
    /// Apply the observations and view writes only; do not enqueue.
    pub observe_only: bool,
    /// Writes to the Job's shared view, applied before the observations.
    pub view: Vec<ViewWrite>,
    /// The view session the writes belong to.
    pub session: Option<Arc<str>>,
    /// The Job's pod priority (job-queue enqueues of a cached Job; `None` elsewhere: the queue
    /// keeps the one it holds), set by the informer from its PriorityClasses.
    pub priority: Option<i32>,
    /// A view session phase instead of an item (queue and key empty), sent in order with the
    /// items around it.
    pub control: Option<SessionControl>,
    /// An orphan entry of the finished-Job backup cleanup: the event loop holds it for
    /// [`ORPHAN_SETTLE`] and sends it only if the cached pod still has the tracking finalizer
    /// then (see [`recheck_settled`]).
    pub settle: bool,
}

/// How long an orphan entry of a Job that just finished waits for its pod's own finalizer
/// removal. The pod watch runs behind the Job watch under load, so the Job's finished update
/// often arrives before the finalizer removal that preceded it; sent at once, each such entry
/// costs the orphan worker two consistent reads for a pod that needs nothing.
pub const ORPHAN_SETTLE: Duration = Duration::from_secs(2);

/// A phase of the watcher's view session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionControl {
    /// The session becomes current (untrusted until committed).
    Begin(Arc<str>),
    /// The session's snapshot is complete.
    Commit(Arc<str>),
    /// The session stops.
    End(Arc<str>),
}

impl Enqueue {
    fn job(job: &JobInfo, delay: Duration, observations: Vec<Observation>) -> Self {
        Self { queue: JOB_QUEUE, key: job.key(), delay, observations, ..Default::default() }
    }

    fn orphan(pod: &PodInfo) -> Self {
        Self { queue: ORPHAN_POD_QUEUE, key: pod.key(), ..Default::default() }
    }

    fn settling_orphan(pod: &PodInfo) -> Self {
        Self { settle: true, ..Self::orphan(pod) }
    }

    /// View writes of `session` on Job `key`, without an enqueue.
    pub fn view_only(key: String, session: Arc<str>, view: Vec<ViewWrite>) -> Self {
        Self {
            queue: JOB_QUEUE,
            key,
            observe_only: true,
            view,
            session: Some(session),
            ..Default::default()
        }
    }

    /// A session phase.
    pub fn session(control: SessionControl) -> Self {
        Self { control: Some(control), ..Default::default() }
    }
}

/// Which Jobs this watcher answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerConfig {
    /// The `spec.managedBy` value this controller owns.
    pub controller_name: String,
    /// Also take Jobs with managedBy unset (or naming the built-in controller).
    pub manage_all: bool,
}

impl HandlerConfig {
    /// Whether this controller reconciles `job`.
    pub fn manages(&self, job: &JobInfo) -> bool {
        kjob_core::manages(job.managed_by.as_deref(), &self.controller_name, self.manage_all)
    }
}

fn observation(kind: ObservationKind, job: &JobInfo, pod: &PodInfo) -> Observation {
    Observation::new(kind, job.uid.clone(), pod.uid.clone())
}

/// The Job a controllerRef points at: same kind, found by name, and with the same UID.
pub fn resolve_controller_ref<'a>(
    store: &'a Store,
    namespace: &str,
    cref: &ControllerRef,
) -> Option<&'a JobInfo> {
    if cref.kind != "Job" {
        return None;
    }
    store.job_by_name(namespace, &cref.name).filter(|j| j.uid == cref.uid)
}

/// Managed Jobs of the pod's namespace whose selector matches the pod's labels (`getPodJobs`).
fn pod_jobs<'a>(
    cfg: &'a HandlerConfig,
    store: &'a Store,
    pod: &'a PodInfo,
) -> impl Iterator<Item = &'a JobInfo> {
    // Upstream refuses pods without labels before looking at any Job.
    let has_labels = !pod.labels.is_empty();
    store
        .jobs_in_namespace(&pod.namespace)
        .filter(move |j| has_labels && cfg.manages(j) && j.selector.matches(&pod.labels))
}

/// Orphan-queue entries for the Job's pods that still carry the tracking finalizer. Upstream
/// lists by the Job's selector and keeps the pods it controls; the controller index finds the
/// same pods plus any controlled pod whose labels stopped matching (which upstream would have
/// released already; the orphan worker re-checks every pod and treats it as an orphan of a
/// finished Job either way).
///
/// With `settle` (the Job just finished) the entries wait for the pods' own finalizer removals
/// first ([`ORPHAN_SETTLE`]); a deleted Job's pods are pointed out at once.
fn cleanup_pod_finalizers(store: &Store, job: &JobInfo, settle: bool, out: &mut Vec<Enqueue>) {
    let mut pods: Vec<&PodInfo> = store
        .pods_controlled_by(&job.uid)
        .filter(|p| p.namespace == job.namespace && p.has_tracking_finalizer)
        .collect();
    // Deterministic order keeps batches and tests stable.
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let entry = if settle { Enqueue::settling_orphan } else { Enqueue::orphan };
    out.extend(pods.into_iter().map(entry));
}

/// A settled orphan entry ([`Enqueue::settle`]) of pod `key` with `uid`, once its wait is over:
/// the orphan entry when the cached pod is still that pod and still has the tracking finalizer,
/// nothing otherwise (its finalizer removal arrived, or its delete did, whose handler decided).
pub fn recheck_settled(store: &Store, key: &str, uid: &str) -> Option<Enqueue> {
    let pod = store.pod(key)?;
    (pod.uid == uid && pod.has_tracking_finalizer).then(|| Enqueue::orphan(pod))
}

/// Orphan-queue entry releasing `pod` when `job`, its controller, would release it (upstream
/// `ClaimPods` releases such pods at the Job's next sync; kjob's workers list pods by selector
/// and would never see it, so the watcher points it out and the orphan worker re-checks and
/// releases it). Finished Jobs no longer claim (upstream's sync stops before `ClaimPods`), and
/// pods being deleted are left alone.
fn release_if_unmatched(job: &JobInfo, pod: &PodInfo, out: &mut Vec<Enqueue>) {
    let facts = ClaimFacts {
        owner: Owner::ThisJob,
        matches: job.selector.matches(&pod.labels),
        job_deleting: job.deleting,
        pod_deleting: pod.deleting,
    };
    if !pod.deleting && !job.finished && facts.decide() == Claim::Release {
        out.push(Enqueue::orphan(pod));
    }
}

/// A Job appeared: sync it now.
pub fn on_job_add(cfg: &HandlerConfig, job: &JobInfo) -> Vec<Enqueue> {
    if !cfg.manages(job) {
        return vec![];
    }
    vec![Enqueue::job(job, Duration::ZERO, vec![])]
}

/// A Job changed from `old` to `new` at `now`.
pub fn on_job_update(
    cfg: &HandlerConfig,
    store: &Store,
    old: &JobInfo,
    new: &JobInfo,
    now: Timestamp,
) -> Vec<Enqueue> {
    if !cfg.manages(new) || old.resource_version == new.resource_version {
        return vec![];
    }
    let delay =
        if new.generation == old.generation { SYNC_JOB_BATCH_PERIOD } else { Duration::ZERO };
    let mut out = vec![Enqueue::job(new, delay, vec![])];
    if new.finished {
        // Backup for finalizers a finished Job left behind; no deadline matters any more.
        cleanup_pod_finalizers(store, new, true, &mut out);
        return out;
    }
    if let (Some(start), Some(ads)) = (new.start_time, new.active_deadline_seconds)
        && old.active_deadline_seconds != Some(ads)
    {
        let total = jiff::SignedDuration::from_secs(ads);
        let passed = now.duration_since(start);
        let left = Duration::try_from(total - passed).unwrap_or(Duration::ZERO);
        out.push(Enqueue::job(new, left, vec![]));
    }
    out
}

/// A Job was deleted (`job` is its last known state): sync it now (the sync sees it gone and
/// drops its state) and clean up its pods' finalizers.
pub fn on_job_delete(cfg: &HandlerConfig, store: &Store, job: &JobInfo) -> Vec<Enqueue> {
    if !cfg.manages(job) {
        return vec![];
    }
    let mut out = vec![Enqueue::job(job, Duration::ZERO, vec![])];
    cleanup_pod_finalizers(store, job, false, &mut out);
    out
}

/// A pod appeared.
pub fn on_pod_add(cfg: &HandlerConfig, store: &Store, pod: &PodInfo) -> Vec<Enqueue> {
    if pod.deleting {
        // Seen for the first time already deleting: a deletion, never a creation.
        return pod_deleted(cfg, store, pod, false, true);
    }
    if let Some(cref) = &pod.controller {
        return match resolve_controller_ref(store, &pod.namespace, cref) {
            Some(job) if cfg.manages(job) => {
                let mut out = vec![Enqueue::job(
                    job,
                    SYNC_JOB_BATCH_PERIOD,
                    vec![observation(ObservationKind::Creation, job, pod)],
                )];
                release_if_unmatched(job, pod, &mut out);
                out
            }
            _ => vec![],
        };
    }
    let mut out = vec![];
    if pod.has_tracking_finalizer {
        out.push(Enqueue::orphan(pod));
    }
    // Wake matching Jobs so they may adopt it; no creation is observed for an orphan.
    out.extend(pod_jobs(cfg, store, pod).map(|j| Enqueue::job(j, SYNC_JOB_BATCH_PERIOD, vec![])));
    out
}

/// A pod changed from `old` to `new`.
pub fn on_pod_update(
    cfg: &HandlerConfig,
    store: &Store,
    old: &PodInfo,
    new: &PodInfo,
) -> Vec<Enqueue> {
    if old.resource_version == new.resource_version {
        return vec![];
    }
    if new.deleting {
        // Graceful deletion: let the Job replace the pod now rather than when it is gone.
        return pod_deleted(cfg, store, new, false, !old.deleting);
    }
    // The latest state wins: finalizer changes may have collapsed into one event.
    let finalizer_removed = !new.has_tracking_finalizer;
    let obs = |job: &JobInfo| {
        if finalizer_removed {
            vec![observation(ObservationKind::FinalizerRemoval, job, new)]
        } else {
            vec![]
        }
    };
    let cref_changed = old.controller != new.controller;
    let mut out = vec![];
    if cref_changed
        && let Some(old_ref) = &old.controller
        && let Some(job) = resolve_controller_ref(store, &old.namespace, old_ref)
        && cfg.manages(job)
    {
        out.push(Enqueue::job(job, SYNC_JOB_BATCH_PERIOD, obs(job)));
    }
    if let Some(cref) = &new.controller {
        if let Some(job) = resolve_controller_ref(store, &new.namespace, cref)
            && cfg.manages(job)
        {
            out.push(Enqueue::job(job, SYNC_JOB_BATCH_PERIOD, obs(job)));
            release_if_unmatched(job, new, &mut out);
        }
        return out;
    }
    if new.has_tracking_finalizer {
        out.push(Enqueue::orphan(new));
    }
    if cref_changed || old.labels != new.labels {
        out.extend(
            pod_jobs(cfg, store, new).map(|j| Enqueue::job(j, SYNC_JOB_BATCH_PERIOD, vec![])),
        );
    }
    out
}

/// A pod is gone. `pod` is its final (or, for a tombstone, last known) state; `was_deleting`
/// says whether an earlier version already showed a deletionTimestamp, in which case the
/// deletion was observed then.
pub fn on_pod_delete(
    cfg: &HandlerConfig,
    store: &Store,
    pod: &PodInfo,
    was_deleting: bool,
) -> Vec<Enqueue> {
    pod_deleted(cfg, store, pod, true, !was_deleting)
}

/// `deletePod`: `is_final` for a real delete (or tombstone), false for a deletionTimestamp.
fn pod_deleted(
    cfg: &HandlerConfig,
    store: &Store,
    pod: &PodInfo,
    is_final: bool,
    observe_deletion: bool,
) -> Vec<Enqueue> {
    let orphan = || if pod.has_tracking_finalizer { vec![Enqueue::orphan(pod)] } else { vec![] };
    let Some(cref) = &pod.controller else {
        // It may have belonged to a Job before the GC removed the reference.
        return orphan();
    };
    let Some(job) = resolve_controller_ref(store, &pod.namespace, cref) else {
        return orphan();
    };
    if !cfg.manages(job) {
        return vec![];
    }
    if job.finished {
        // A finished Job's sync no longer removes finalizers.
        return orphan();
    }
    let mut obs = vec![];
    if observe_deletion {
        obs.push(observation(ObservationKind::Deletion, job, pod));
    }
    if is_final || !pod.has_tracking_finalizer {
        obs.push(observation(ObservationKind::FinalizerRemoval, job, pod));
    }
    vec![Enqueue::job(job, SYNC_JOB_BATCH_PERIOD, obs)]
}

/// The orphan-queue entries the pod add handler gives for every cached pod, for a watcher that
/// starts leading with a synced cache (at start, or taking over from another). Upstream's
/// informer hands every pod of its initial list to `addPod`; kjob's initial lists are no events,
/// so without this a pod whose Job was deleted while no watcher led would keep its tracking
/// finalizer (and stay Terminating) forever.
///
/// Pods of finished Jobs that still have the finalizer are pointed out too: the backup cleanup
/// of a Job's finish waits a moment in the watcher ([`ORPHAN_SETTLE`]), and a watcher that
/// stopped meanwhile never sent it.
///
/// Only the orphan entries of `addPod` are kept: every Job is enqueued by the takeover anyway,
/// and the expectation observations of pods seen only in a list are not replayed, because the
/// shared expectations outlive a watcher (a pod the previous leader observed must not lower its
/// Job's record again). The release of owned pods whose labels stopped matching is left to their
/// next event, as the cache does not keep owned pods' labels.
pub fn orphans_of_cached_pods(cfg: &HandlerConfig, store: &Store) -> Vec<Enqueue> {
    let mut pods: Vec<&PodInfo> = store.pods().collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut out = vec![];
    for pod in pods {
        if pod.deleting {
            // `addPod` of a pod already being deleted is `deletePod`: an orphan when its Job is
            // gone or finished, or when it has no controller.
            let entries = pod_deleted(cfg, store, pod, false, true);
            out.extend(entries.into_iter().filter(|e| e.queue == ORPHAN_POD_QUEUE));
        } else if pod.has_tracking_finalizer {
            match &pod.controller {
                None => out.push(Enqueue::orphan(pod)),
                // A finished Job's pod that kept its finalizer: the entry its Job's finish
                // gave may have been waiting in a watcher that stopped (see ORPHAN_SETTLE).
                Some(cref) => {
                    if resolve_controller_ref(store, &pod.namespace, cref)
                        .is_some_and(|job| job.finished && cfg.manages(job))
                    {
                        out.push(Enqueue::orphan(pod));
                    }
                }
            }
        }
    }
    out
}

/// Every managed Job, to sync now (periodic resync and leadership takeover).
pub fn enqueue_all_jobs(cfg: &HandlerConfig, store: &Store) -> Vec<Enqueue> {
    let mut jobs: Vec<&JobInfo> = store.jobs().filter(|j| cfg.manages(j)).collect();
    jobs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    jobs.into_iter().map(|j| Enqueue::job(j, Duration::ZERO, vec![])).collect()
}

#[cfg(test)]
mod tests;
