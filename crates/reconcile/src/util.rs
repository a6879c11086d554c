//! Job and pod helpers with upstream parity.
//!
//! Job side: spec defaults as the API server applies them, suspension, the deadline and
//! `onlyReplaceFailedPods` (upstream `pkg/controller/job/util.go` and `job_controller.go`).
//! Pod side: `controller.IsPodActive` / `IsPodTerminating` / `ActivePods` from
//! `pkg/controller/controller_utils.go`, and `isPodFailed`, `activePodsForRemoval`,
//! `pastBackoffLimitOnFailure`, `getFinishedTime` and the `ClaimPods` decision from
//! `pkg/controller/job`.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kjob_core::JOB_TRACKING_FINALIZER;

use crate::indexes::{completion_index, split_duplicated_indexes};
use crate::selector::Selector;

/// Pod phase `Pending`.
pub const PHASE_PENDING: &str = "Pending";
/// Pod phase `Running`.
pub const PHASE_RUNNING: &str = "Running";
/// Pod phase `Succeeded`.
pub const PHASE_SUCCEEDED: &str = "Succeeded";
/// Pod phase `Failed`.
pub const PHASE_FAILED: &str = "Failed";
/// Pod phase `Unknown`.
pub const PHASE_UNKNOWN: &str = "Unknown";

/// `spec.podReplacementPolicy` value that waits for pods to be fully terminal.
pub const POD_REPLACEMENT_POLICY_FAILED: &str = "Failed";
/// `spec.completionMode` value of Indexed Jobs.
pub const INDEXED: &str = "Indexed";
/// `spec.completionMode` value of NonIndexed Jobs (also the default).
pub const NON_INDEXED: &str = "NonIndexed";
/// API-server default of `spec.backoffLimit` without backoffLimitPerIndex.
pub const DEFAULT_BACKOFF_LIMIT: i32 = 6;

fn spec(job: &Job) -> Option<&JobSpec> {
    job.spec.as_ref()
}

/// Whether the Job is Indexed (upstream `isIndexedJob`).
pub fn is_indexed(job: &Job) -> bool {
    spec(job).and_then(|s| s.completion_mode.as_deref()) == Some(INDEXED)
}

/// `Indexed` or `NonIndexed`, the `completion_mode` metric label (upstream `getCompletionMode`).
pub fn completion_mode_label(job: &Job) -> &'static str {
    if is_indexed(job) { INDEXED } else { NON_INDEXED }
}

/// Whether `spec.completionMode` is set to something neither NonIndexed nor Indexed.
pub fn has_unknown_completion_mode(job: &Job) -> bool {
    matches!(spec(job).and_then(|s| s.completion_mode.as_deref()), Some(m) if m != INDEXED && m != NON_INDEXED)
}

/// `spec.completions`; `None` means a work-queue Job (Indexed Jobs always set it).
pub fn completions(job: &Job) -> Option<i32> {
    spec(job).and_then(|s| s.completions)
}

/// `spec.parallelism` as defaulted by the API server (1).
pub fn parallelism(job: &Job) -> i32 {
    spec(job).and_then(|s| s.parallelism).unwrap_or(1)
}

/// Whether `spec.backoffLimitPerIndex` is set (upstream `hasBackoffLimitPerIndex`).
pub fn has_backoff_limit_per_index(job: &Job) -> bool {
    spec(job).is_some_and(|s| s.backoff_limit_per_index.is_some())
}

/// `spec.backoffLimit` as defaulted by the API server (6, or MaxInt32 with backoffLimitPerIndex).
pub fn backoff_limit(job: &Job) -> i32 {
    let default = if has_backoff_limit_per_index(job) { i32::MAX } else { DEFAULT_BACKOFF_LIMIT };
    spec(job).and_then(|s| s.backoff_limit).unwrap_or(default)
}

/// Whether `spec.suspend` is true (upstream `jobSuspended`).
pub fn is_suspended(job: &Job) -> bool {
    spec(job).and_then(|s| s.suspend).unwrap_or(false)
}

/// Whether the Job is being deleted.
pub fn is_job_deleting(job: &Job) -> bool {
    job.metadata.deletion_timestamp.is_some()
}

/// Terminating pods are neither failures nor replaced until terminal: podReplacementPolicy=Failed,
/// or any podFailurePolicy (upstream `onlyReplaceFailedPods`).
pub fn only_replace_failed_pods(job: &Job) -> bool {
    let Some(spec) = spec(job) else { return false };
    spec.pod_replacement_policy.as_deref() == Some(POD_REPLACEMENT_POLICY_FAILED)
        || spec.pod_failure_policy.is_some()
}

/// `spec.activeDeadlineSeconds` as a duration (negative values read as zero).
pub fn active_deadline(job: &Job) -> Option<Duration> {
    spec(job)
        .and_then(|s| s.active_deadline_seconds)
        .map(|s| Duration::from_secs(s.max(0).unsigned_abs()))
}

/// Time since `start` (zero if `start` is in the future).
pub fn elapsed_since(start: Timestamp, now: Timestamp) -> Duration {
    let d = now.duration_since(start);
    if d.is_negative() { Duration::ZERO } else { d.unsigned_abs() }
}

/// Whether the Job ran longer than `activeDeadlineSeconds` since `start_time` (upstream
/// `pastActiveDeadline`: never while suspended, `>=` comparison).
pub fn past_active_deadline(job: &Job, start_time: Option<Timestamp>, now: Timestamp) -> bool {
    match (active_deadline(job), start_time) {
        (Some(ads), Some(start)) if !is_suspended(job) => elapsed_since(start, now) >= ads,
        _ => false,
    }
}

/// The pod's phase, `""` when unset.
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// The pod's UID, `""` when unset.
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// The pod's name, `""` when unset.
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// Phase is Succeeded.
pub fn is_succeeded(pod: &Pod) -> bool {
    phase(pod) == PHASE_SUCCEEDED
}

/// Phase is Succeeded or Failed (upstream `podutil.IsPodTerminal`).
pub fn is_finished(pod: &Pod) -> bool {
    matches!(phase(pod), PHASE_SUCCEEDED | PHASE_FAILED)
}

/// The pod has a deletionTimestamp.
pub fn is_deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Not terminal and not being deleted (upstream `controller.IsPodActive`).
pub fn is_active(pod: &Pod) -> bool {
    !is_finished(pod) && !is_deleting(pod)
}

/// Being deleted but not yet terminal (upstream `controller.IsPodTerminating`).
pub fn is_terminating(pod: &Pod) -> bool {
    !is_finished(pod) && is_deleting(pod)
}

/// Condition Ready=True (upstream `podutil.IsPodReady`).
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|(status, _)| status == "True")
}

/// When the pod became Ready, if it is Ready and the transition time is known.
pub fn ready_since(pod: &Pod) -> Option<Timestamp> {
    match ready_condition(pod) {
        Some(("True", t)) => t,
        _ => None,
    }
}

fn ready_condition(pod: &Pod) -> Option<(&str, Option<Timestamp>)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.as_str(), c.last_transition_time.as_ref().map(|t| t.0)))
}

/// The pod carries the `batch.kubernetes.io/job-tracking` finalizer (upstream `hasJobTrackingFinalizer`).
pub fn has_tracking_finalizer(pod: &Pod) -> bool {
    pod.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == JOB_TRACKING_FINALIZER))
}

/// Phase Failed; or, unless [`only_replace_failed_pods`], being deleted and not Succeeded, so
/// orphaned pods that never reach a terminal phase still count (upstream `isPodFailed`).
pub fn is_pod_failed(pod: &Pod, job: &Job) -> bool {
    if phase(pod) == PHASE_FAILED {
        return true;
    }
    if only_replace_failed_pods(job) {
        return false;
    }
    is_deleting(pod) && phase(pod) != PHASE_SUCCEEDED
}

/// The pod's controller ownerReference, if any (upstream `metav1.GetControllerOf`).
pub fn controller_ref(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata.owner_references.as_ref()?.iter().find(|r| r.controller == Some(true))
}

/// What `ClaimPods` would do with one pod for a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Owned by the Job and still matching its selector: part of the Job.
    Owned,
    /// Orphan matching the selector: patch in the controllerRef (and the tracking finalizer).
    Adopt,
    /// Owned by the Job but no longer matching the selector: remove the ownerReference.
    Release,
    /// Owned by someone else, or an orphan that does not match (or is being deleted).
    Ignore,
}

/// How a pod's controllerRef relates to one Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// No controllerRef: an orphan.
    Nobody,
    /// The controllerRef carries the Job's UID (upstream compares the UID only).
    ThisJob,
    /// Controlled by something else.
    Other,
}

/// What upstream `BaseControllerRefManager.ClaimObject` reads of a pod and a Job, so callers
/// that hold other shapes of the two (the watcher's cache) reach the same [`Claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimFacts {
    /// The pod's controllerRef against the Job.
    pub owner: Owner,
    /// The Job's selector matches the pod's labels.
    pub matches: bool,
    /// The Job has a deletionTimestamp.
    pub job_deleting: bool,
    /// The pod has a deletionTimestamp.
    pub pod_deleting: bool,
}

impl ClaimFacts {
    /// The claim decision; adoption additionally needs the caller to confirm with a fresh read
    /// that the Job still exists and is not being deleted (upstream `RecheckDeletionTimestamp`).
    pub fn decide(self) -> Claim {
        match self.owner {
            Owner::Other => Claim::Ignore,
            Owner::ThisJob if self.matches => Claim::Owned,
            // A Job being deleted neither releases nor keeps pods that stopped matching.
            Owner::ThisJob if self.job_deleting => Claim::Ignore,
            Owner::ThisJob => Claim::Release,
            Owner::Nobody if !self.matches || self.job_deleting || self.pod_deleting => {
                Claim::Ignore
            }
            Owner::Nobody => Claim::Adopt,
        }
    }
}

/// Classifies a pod for a Job with the Job's compiled selector, as upstream
/// `PodControllerRefManager.ClaimPods` does (orphans of other namespaces are never adopted).
pub fn claim(job: &Job, selector: &Selector, pod: &Pod) -> Claim {
    let owner = match controller_ref(pod) {
        None => Owner::Nobody,
        Some(r) if Some(r.uid.as_str()) == job.metadata.uid.as_deref() => Owner::ThisJob,
        Some(_) => Owner::Other,
    };
    if owner == Owner::Nobody && pod.metadata.namespace != job.metadata.namespace {
        return Claim::Ignore;
    }
    ClaimFacts {
        owner,
        matches: selector.matches_pod(pod),
        job_deleting: is_job_deleting(job),
        pod_deleting: is_deleting(pod),
    }
    .decide()
}

/// Terminating pods (upstream `controller.FilterTerminatingPods`).
pub fn terminating_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<&'a Pod> {
    pods.into_iter().filter(|p| is_terminating(p)).collect()
}

/// Highest restart count over the regular containers (upstream `maxContainerRestarts`).
pub fn max_container_restarts(pod: &Pod) -> i32 {
    container_statuses(pod).iter().map(|c| c.restart_count).max().unwrap_or(0)
}

fn container_statuses(pod: &Pod) -> &[ContainerStatus] {
    pod.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or(&[])
}

fn init_container_statuses(pod: &Pod) -> &[ContainerStatus] {
    pod.status.as_ref().and_then(|s| s.init_container_statuses.as_deref()).unwrap_or(&[])
}

pub(crate) fn node_name(p: &Pod) -> &str {
    // Borrowed, not cloned: this runs O(n log n) times when sorting thousands of pods.
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

pub(crate) fn phase_rank(pod: &Pod) -> u8 {
    // Upstream uses a map lookup, so any other phase ranks like Pending (0).
    match phase(pod) {
        PHASE_UNKNOWN => 1,
        PHASE_RUNNING => 2,
        _ => 0,
    }
}

/// The deletion order of upstream `controller.ActivePods` (`Less`) of one pod as a plain value: comparing two keys gives exactly what
/// comparing the two pods gives (`Equal` included), so sorts and selections over keys pick the
/// same pods in the same order, without re-reading conditions and container statuses of the
/// Pod objects at every comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RemovalKey {
    /// Scheduled: unassigned pods go first; two different nodes are not ordered.
    assigned: bool,
    phase: u8,
    ready: bool,
    /// When Ready, for Ready pods only: no time first, then the most recent first.
    ready_since: Option<Reverse<Timestamp>>,
    /// More restarts first.
    restarts: Reverse<i32>,
    /// No creationTimestamp first, then the newest first.
    created: Option<Reverse<Timestamp>>,
}

impl RemovalKey {
    /// Condition Ready=True (the same answer as [`is_ready`]).
    pub fn is_ready(&self) -> bool {
        self.ready
    }
}

/// The pod's [`RemovalKey`].
pub fn removal_key(pod: &Pod) -> RemovalKey {
    let ready = ready_condition(pod);
    let is_ready = matches!(ready, Some(("True", _)));
    RemovalKey {
        assigned: !node_name(pod).is_empty(),
        phase: phase_rank(pod),
        ready: is_ready,
        ready_since: if is_ready { ready.and_then(|(_, t)| t).map(Reverse) } else { None },
        restarts: Reverse(max_container_restarts(pod)),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| Reverse(t.0)),
    }
}

/// [`active_pods_for_removal`] over positions `0..len` in the active pod list, with each pod's
/// [`RemovalKey`] (`key(position)`) and (exactly for Indexed Jobs) completion index already
/// computed.
pub(crate) fn active_pods_for_removal_with(
    job: &Job,
    len: usize,
    key: impl Fn(usize) -> RemovalKey,
    indexes: Option<&[Option<i32>]>,
    rm_at_least: usize,
) -> Vec<usize> {
    let (mut rm, left) = match indexes {
        Some(indexes) => split_duplicated_indexes(indexes, completions(job).unwrap_or(0), &key),
        None => (Vec::new(), (0..len).collect()),
    };
    if rm.len() < rm_at_least {
        let need = (rm_at_least - rm.len()).min(left.len());
        // A comparison reads two small keys instead of walking both Pods' conditions and
        // container statuses. Equal pods keep their order in `left` (completion-index order for
        // Indexed Jobs): upstream's sort.Sort is an insertion sort, a stable one, on up to 12
        // pods, so of two running pods alike the lower index goes first.
        let mut keyed: Vec<(RemovalKey, usize, usize)> =
            left.into_iter().enumerate().map(|(rank, i)| (key(i), rank, i)).collect();
        let order = |a: &(RemovalKey, usize, usize), b: &(RemovalKey, usize, usize)| {
            (a.0, a.1).cmp(&(b.0, b.1))
        };
        if need < keyed.len() {
            // Only the first `need` are taken, so a partial selection keeps this O(n) on average.
            keyed.select_nth_unstable_by(need, order);
            keyed.truncate(need);
        }
        keyed.sort_by(order);
        rm.extend(keyed.into_iter().map(|(_, _, i)| i));
    }
    rm
}

/// Tracked (finalizer present), not awaiting finalizer removal, and, for Indexed Jobs, with an
/// index in `[0, completions)` — the common filter of upstream `getValidPodsWithFilter`.
pub fn is_valid_tracked_pod(
    job: &Job,
    pod: &Pod,
    finalizer_removals_in_flight: &BTreeSet<String>,
) -> bool {
    if !has_tracking_finalizer(pod) || finalizer_removals_in_flight.contains(uid(pod)) {
        return false;
    }
    if is_indexed(job) {
        return completion_index(pod).is_some_and(|ix| ix < completions(job).unwrap_or(0));
    }
    true
}

/// Whether `total` restarts of Running/Pending pods reach the Job's backoffLimit (> 0 when the
/// limit is 0): the test of upstream `pastBackoffLimitOnFailure`.
pub(crate) fn restarts_past_backoff_limit(job: &Job, total: i64) -> bool {
    let limit = i64::from(backoff_limit(job));
    if limit == 0 { total > 0 } else { total >= limit }
}

/// Whether the Job's pod template has restartPolicy OnFailure (the only case where container
/// restarts count toward backoffLimit).
pub(crate) fn restarts_on_failure(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure")
}

/// Restarts of all the pod's init containers and containers.
pub fn total_restarts(pod: &Pod) -> i64 {
    init_container_statuses(pod)
        .iter()
        .chain(container_statuses(pod))
        .map(|c| i64::from(c.restart_count))
        .sum()
}

/// When the pod finished: latest container `finishedAt` if every container (and every sidecar
/// init container) terminated; else when Ready turned False; else deletionTimestamp minus the
/// grace period; else creationTimestamp (upstream `getFinishedTime`).
pub fn finished_time(pod: &Pod) -> Timestamp {
    if let Some(t) = finish_time_from_containers(pod) {
        return t;
    }
    if let Some(("False", Some(t))) = ready_condition(pod) {
        return t;
    }
    if let Some(del) = pod.metadata.deletion_timestamp.as_ref() {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        return del.0 - SignedDuration::from_secs(grace);
    }
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn finish_time_from_containers(pod: &Pod) -> Option<Timestamp> {
    let mut latest: Option<Timestamp> = None;
    let mut fold = |cs: &ContainerStatus| -> bool {
        let Some(t) = cs
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
        else {
            return false;
        };
        latest = Some(latest.map_or(t.0, |l| l.max(t.0)));
        true
    };
    for cs in container_statuses(pod) {
        if !fold(cs) {
            return None;
        }
    }
    // Sidecars (restartable init containers) outlive the main containers, so they count too.
    let sidecars: BTreeSet<&str> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map(|ics| {
            ics.iter()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .map(|c| c.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    for cs in init_container_statuses(pod) {
        if sidecars.contains(cs.name.as_str()) && !fold(cs) {
            return None;
        }
    }
    latest
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::testutil::{
        active_pods_for_removal, active_pods_order, at, count_ready, mk_job, mk_pod,
        new_finished_pods, past_backoff_limit_on_failure, pods_for_job, sort_for_removal,
    };

    #[test]
    fn deadline_is_inclusive_and_off_while_suspended() {
        let job = mk_job("j").active_deadline_seconds(10).build();
        assert!(!past_active_deadline(&job, Some(at(0)), at(9)));
        assert!(past_active_deadline(&job, Some(at(0)), at(10)));
        assert!(!past_active_deadline(&job, None, at(100)));
        let suspended = mk_job("j").active_deadline_seconds(10).suspend(true).build();
        assert!(!past_active_deadline(&suspended, Some(at(0)), at(100)));
    }

    #[test]
    fn defaults() {
        let job = mk_job("j")
            .backoff_limit_per_index(1)
            .with(|j| j.spec.as_mut().unwrap().backoff_limit = None)
            .build();
        assert_eq!(backoff_limit(&job), i32::MAX);
        let unknown = mk_job("j").completion_mode("Weird").build();
        assert!(has_unknown_completion_mode(&unknown));
        assert!(!has_unknown_completion_mode(&mk_job("j").indexed().build()));
    }

    #[test]
    fn classification_table() {
        let job = mk_job("j").build();
        let pfp_job = mk_job("j").pod_failure_policy(vec![]).build();
        // (pod, active, terminating, finished, failed(default), failed(only-failed))
        let cases = [
            (mk_pod(&job, "run").build(), true, false, false, false, false),
            (mk_pod(&job, "pend").pending().build(), true, false, false, false, false),
            (mk_pod(&job, "ok").succeeded(at(1)).build(), false, false, true, false, false),
            (mk_pod(&job, "bad").failed(1, at(1)).build(), false, false, true, true, true),
            (mk_pod(&job, "del").deleting(at(1)).build(), false, true, false, true, false),
            (
                mk_pod(&job, "del-ok").succeeded(at(1)).deleting(at(2)).build(),
                false,
                false,
                true,
                false,
                false,
            ),
            (
                mk_pod(&job, "del-bad").failed(2, at(1)).deleting(at(2)).build(),
                false,
                false,
                true,
                true,
                true,
            ),
        ];
        for (pod, active, terminating, finished, failed, failed_strict) in cases {
            let n = name(&pod).to_string();
            assert_eq!(is_active(&pod), active, "{n} active");
            assert_eq!(is_terminating(&pod), terminating, "{n} terminating");
            assert_eq!(is_finished(&pod), finished, "{n} finished");
            assert_eq!(is_pod_failed(&pod, &job), failed, "{n} failed");
            assert_eq!(is_pod_failed(&pod, &pfp_job), failed_strict, "{n} failed with pfp");
        }
    }

    #[test]
    fn only_replace_failed_table() {
        assert!(!only_replace_failed_pods(&mk_job("j").build()));
        assert!(only_replace_failed_pods(&mk_job("j").pod_replacement_policy("Failed").build()));
        let pfp = mk_job("j")
            .pod_failure_policy(vec![])
            .pod_replacement_policy("TerminatingOrFailed")
            .build();
        assert!(only_replace_failed_pods(&pfp));
    }

    #[test]
    fn ready_and_finalizer() {
        let job = mk_job("j").build();
        let ready = mk_pod(&job, "a").ready(at(3)).build();
        assert!(is_ready(&ready));
        assert_eq!(ready_since(&ready), Some(at(3)));
        let not_ready = mk_pod(&job, "b").condition("Ready", "False", at(3)).build();
        assert!(!is_ready(&not_ready));
        assert_eq!(ready_since(&not_ready), None);
        assert!(has_tracking_finalizer(&ready));
        assert!(!has_tracking_finalizer(&mk_pod(&job, "c").no_finalizer().build()));
        assert_eq!(count_ready([&ready, &not_ready]), 1);
    }

    /// Re-derived from upstream's TestSortingActivePods: each list is in expected deletion order.
    #[test]
    fn active_pods_sort_order() {
        let job = mk_job("j").build();
        let expected: Vec<Pod> = vec![
            mk_pod(&job, "unscheduled").pending().build(),
            mk_pod(&job, "scheduled-pending").pending().node(Some("n")).build(),
            mk_pod(&job, "unknown").phase("Unknown").build(),
            mk_pod(&job, "running-not-ready").build(),
            mk_pod(&job, "ready-no-time")
                .ready(at(0))
                .with(|p| {
                    p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0]
                        .last_transition_time = None;
                })
                .build(),
            mk_pod(&job, "ready-recent").ready(at(100)).build(),
            mk_pod(&job, "ready-older-restarts").ready(at(50)).restarts(5).build(),
            mk_pod(&job, "ready-older-no-created")
                .ready(at(50))
                .with(|p| p.metadata.creation_timestamp = None)
                .build(),
            mk_pod(&job, "ready-older-newer").ready(at(50)).created(at(10)).build(),
            mk_pod(&job, "ready-older-oldest").ready(at(50)).created(at(1)).build(),
        ];
        // Shuffle deterministically (reverse + rotate) and sort back.
        let mut shuffled: Vec<&Pod> = expected.iter().rev().collect();
        shuffled.rotate_left(3);
        sort_for_removal(&mut shuffled);
        let got: Vec<&str> = shuffled.iter().map(|p| name(p)).collect();
        let want: Vec<&str> = expected.iter().map(name).collect();
        assert_eq!(got, want);
    }

    /// Re-derived from upstream's TestActivePodsForRemoval equivalents.
    #[test]
    fn pods_for_removal_table() {
        let nonidx = mk_job("j").parallelism(3).completions(Some(5)).build();
        let a = mk_pod(&nonidx, "a").ready(at(10)).build();
        let b = mk_pod(&nonidx, "b").build();
        let c = mk_pod(&nonidx, "c").pending().build();
        let active = [&a, &b, &c];
        let names = |v: Vec<&Pod>| v.into_iter().map(|p| name(p).to_string()).collect::<Vec<_>>();
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 0)), Vec::<String>::new());
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 1)), vec!["c"]);
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 2)), vec!["c", "b"]);
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 5)), vec!["c", "b", "a"]);

        let idx = mk_job("j").indexed().parallelism(4).completions(Some(4)).build();
        let p0 = mk_pod(&idx, "p0").index(0).ready(at(1)).build();
        let p0dup = mk_pod(&idx, "p0dup").index(0).build();
        let p1 = mk_pod(&idx, "p1").index(1).build();
        let p7 = mk_pod(&idx, "p7").index(7).build();
        let none = mk_pod(&idx, "none").build();
        let bad =
            mk_pod(&idx, "bad").annotation(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION, "x").build();
        let active = [&p1, &p7, &p0, &none, &p0dup, &bad];
        let mut got = names(active_pods_for_removal(&idx, &active, 0));
        got.sort();
        assert_eq!(got, vec!["bad", "none", "p0dup", "p7"]);
        let got = names(active_pods_for_removal(&idx, &active, 5));
        assert_eq!(got.len(), 5);
        assert_eq!(got[4], "p1", "the extra removal comes from the remaining pods");
    }

    /// Random active pods: every field the deletion order or the index grouping reads, with
    /// few values each so ties, duplicates and bad indexes are common.
    mod removal_props {
        use super::*;
        use kjob_core::JOB_COMPLETION_INDEX_ANNOTATION;
        use proptest::prelude::*;

        type Shape = (u8, u8, u8, u8, u8, u8);

        fn pod(job: &Job, n: usize, (node, phase, ready, restarts, created, ix): Shape) -> Pod {
            let mut b = mk_pod(job, &format!("p{n}"))
                .node([None, Some("a"), Some("b")][node as usize % 3])
                .phase(["Pending", "Running", "Unknown", ""][phase as usize % 4])
                .restarts(i32::from(restarts % 3));
            b = match ready % 4 {
                0 => b,
                1 => b.condition("Ready", "False", at(1)),
                2 => b.ready(at(i64::from(restarts % 2))),
                _ => b.ready(at(0)).with(|p| {
                    let conds = p.status.as_mut().unwrap().conditions.as_mut().unwrap();
                    conds[0].last_transition_time = None;
                }),
            };
            b = match created % 3 {
                0 => b.with(|p| p.metadata.creation_timestamp = None),
                c => b.created(at(i64::from(c))),
            };
            match ix % 9 {
                0 => b.build(),
                1 => b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, "x").build(),
                2 => b.label(JOB_COMPLETION_INDEX_ANNOTATION, "1").build(),
                k => b.index(i32::from(k) - 3).build(),
            }
        }

        /// The selection as it was before deletion keys and sorted grouping: a map of per-index
        /// vectors and the Pod comparator at every comparison.
        fn reference<'a>(job: &Job, active: &[&'a Pod], rm_at_least: usize) -> Vec<&'a Pod> {
            let (mut rm, mut left) = if is_indexed(job) {
                let mut rm = Vec::new();
                let mut by_index: BTreeMap<i32, Vec<&'a Pod>> = BTreeMap::new();
                for &p in active {
                    match completion_index(p) {
                        Some(ix) if ix < completions(job).unwrap_or(0) => {
                            by_index.entry(ix).or_default().push(p)
                        }
                        _ => rm.push(p),
                    }
                }
                let mut left = Vec::new();
                for (_, mut group) in by_index {
                    group.sort_by(|a, b| active_pods_order(a, b));
                    left.push(group.pop().unwrap());
                    rm.extend(group);
                }
                (rm, left)
            } else {
                (Vec::new(), active.to_vec())
            };
            if rm.len() < rm_at_least {
                let need = (rm_at_least - rm.len()).min(left.len());
                // Stable, as upstream's insertion sort of a few pods.
                left.sort_by(|a, b| active_pods_order(a, b));
                left.truncate(need);
                rm.extend(left);
            }
            rm
        }

        proptest! {
            /// Comparing keys is comparing pods, ties included.
            #[test]
            fn removal_key_orders_like_the_comparator(a in any::<Shape>(), b in any::<Shape>()) {
                let job = mk_job("j").build();
                let (pa, pb) = (pod(&job, 0, a), pod(&job, 1, b));
                prop_assert_eq!(removal_key(&pa).cmp(&removal_key(&pb)), active_pods_order(&pa, &pb));
            }

            /// Which pods are deleted, and in which order, is exactly what the plain
            /// implementation picks, for Indexed and NonIndexed Jobs.
            #[test]
            fn removal_choice_matches_reference(
                shapes in proptest::collection::vec(any::<Shape>(), 0..40),
                rm_at_least in 0usize..45,
                indexed in any::<bool>(),
            ) {
                let b = mk_job("j").completions(Some(5));
                let job = if indexed { b.indexed().build() } else { b.build() };
                let pods: Vec<Pod> = shapes.iter().enumerate().map(|(n, s)| pod(&job, n, *s)).collect();
                let refs: Vec<&Pod> = pods.iter().collect();
                let names = |v: Vec<&Pod>| v.into_iter().map(|p| name(p).to_string()).collect::<Vec<_>>();
                prop_assert_eq!(
                    names(active_pods_for_removal(&job, &refs, rm_at_least)),
                    names(reference(&job, &refs, rm_at_least))
                );
            }
        }
    }

    #[test]
    fn alike_pods_of_an_indexed_job_are_removed_lowest_index_first() {
        // Listed in name order (index 10 before index 2); alike in every removal criterion.
        let job = mk_job("j").completions(Some(12)).parallelism(3).indexed().build();
        let pods: Vec<Pod> = [("j-10-a", 10), ("j-2-b", 2), ("j-7-c", 7)]
            .into_iter()
            .map(|(n, i)| mk_pod(&job, n).index(i).ready(at(1)).build())
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        let names = |v: Vec<&Pod>| v.into_iter().map(|p| name(p).to_string()).collect::<Vec<_>>();
        assert_eq!(names(active_pods_for_removal(&job, &refs, 1)), ["j-2-b"]);
        assert_eq!(names(active_pods_for_removal(&job, &refs, 2)), ["j-2-b", "j-7-c"]);
        // A NonIndexed Job keeps the input order among alike pods.
        let plain = mk_job("p").completions(Some(3)).parallelism(3).build();
        let pods: Vec<Pod> = ["p-c", "p-a", "p-b"]
            .into_iter()
            .map(|n| mk_pod(&plain, n).ready(at(1)).build())
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(names(active_pods_for_removal(&plain, &refs, 2)), ["p-c", "p-a"]);
    }

    #[test]
    fn new_finished_pods_filters() {
        let job = mk_job("j").completions(Some(3)).build();
        let ok = mk_pod(&job, "ok").succeeded(at(1)).build();
        let ok_counted = mk_pod(&job, "okc").succeeded(at(1)).build();
        let bad = mk_pod(&job, "bad").failed(1, at(1)).build();
        let bad_no_fin = mk_pod(&job, "badnf").failed(1, at(1)).no_finalizer().build();
        let bad_inflight = mk_pod(&job, "badif").failed(1, at(1)).build();
        let deleting = mk_pod(&job, "del").deleting(at(2)).build();
        let running = mk_pod(&job, "run").build();
        let uncounted_s = BTreeSet::from(["okc-uid".to_string()]);
        let in_flight = BTreeSet::from(["badif-uid".to_string()]);
        let pods = [&ok, &ok_counted, &bad, &bad_no_fin, &bad_inflight, &deleting, &running];
        let (s, f) = new_finished_pods(&job, pods, &uncounted_s, &BTreeSet::new(), &in_flight);
        assert_eq!(s.iter().map(|p| name(p)).collect::<Vec<_>>(), vec!["ok"]);
        assert_eq!(f.iter().map(|p| name(p)).collect::<Vec<_>>(), vec!["bad", "del"]);

        let idx = mk_job("i").indexed().completions(Some(2)).build();
        let in_range = mk_pod(&idx, "in").index(1).succeeded(at(1)).build();
        let out = mk_pod(&idx, "out").index(2).succeeded(at(1)).build();
        let no_ix = mk_pod(&idx, "noix").succeeded(at(1)).build();
        let (s, _) = new_finished_pods(
            &idx,
            [&in_range, &out, &no_ix],
            &BTreeSet::new(),
            &BTreeSet::new(),
            &BTreeSet::new(),
        );
        assert_eq!(s.iter().map(|p| name(p)).collect::<Vec<_>>(), vec!["in"]);
    }

    #[test]
    fn backoff_limit_on_failure() {
        let job = mk_job("j").restart_policy("OnFailure").backoff_limit(3).build();
        let p1 = mk_pod(&job, "a").restarts(1).build();
        let p2 = mk_pod(&job, "b").restarts(2).build();
        let done = mk_pod(&job, "c").restarts(9).succeeded(at(1)).build();
        assert!(!past_backoff_limit_on_failure(&job, [&p1, &done]));
        assert!(past_backoff_limit_on_failure(&job, [&p1, &p2]));
        let zero = mk_job("j").restart_policy("OnFailure").backoff_limit(0).build();
        assert!(past_backoff_limit_on_failure(&zero, [&p1]));
        assert!(!past_backoff_limit_on_failure(&zero, [&mk_pod(&zero, "z").build()]));
        let never = mk_job("j").backoff_limit(0).build();
        assert!(!past_backoff_limit_on_failure(&never, [&p2]));
    }

    #[test]
    fn finished_time_lookups() {
        let job = mk_job("j").build();
        let from_containers =
            mk_pod(&job, "a").failed(1, at(30)).terminated("side", 0, at(40)).build();
        assert_eq!(finished_time(&from_containers), at(40));
        // A running container blocks (1.), Ready=False is used instead.
        let from_ready = mk_pod(&job, "b").condition("Ready", "False", at(20)).build();
        assert_eq!(finished_time(&from_ready), at(20));
        // A terminated container without finishedAt does not count as a finish time.
        let no_finished_at = mk_pod(&job, "e")
            .failed(1, at(30))
            .with(|p| {
                let cs = &mut p.status.as_mut().unwrap().container_statuses.as_mut().unwrap()[0];
                cs.state.as_mut().unwrap().terminated.as_mut().unwrap().finished_at = None;
            })
            .condition("Ready", "False", at(25))
            .build();
        assert_eq!(finished_time(&no_finished_at), at(25));
        // Ready=True is not a finish time: fall through to the deletion timestamp.
        let ready_true = mk_pod(&job, "f").ready(at(1)).deleting(at(60)).build();
        assert_eq!(finished_time(&ready_true), at(30));
        let from_deletion = mk_pod(&job, "c").deleting(at(100)).build();
        assert_eq!(finished_time(&from_deletion), at(70));
        let from_creation = mk_pod(&job, "d").created(at(5)).build();
        assert_eq!(finished_time(&from_creation), at(5));
    }

    #[test]
    fn claim_table() {
        let job = mk_job("j").build();
        let sel = |j: &Job| Selector::compile(j.spec.as_ref().unwrap().selector.as_ref()).unwrap();
        let selector = sel(&job);
        let other = mk_job("k").build();
        let owned = mk_pod(&job, "owned").build();
        let orphan = mk_pod(&job, "orphan").orphan().build();
        let foreign = mk_pod(&other, "foreign").build();
        let relabelled = mk_pod(&job, "rl").with(|p| p.metadata.labels = None).build();
        let deleting_job = mk_job("j").deleting(at(1)).build();
        let cases = [
            ("owned", &job, &owned, Claim::Owned),
            ("orphan", &job, &orphan, Claim::Adopt),
            (
                "deleting orphan",
                &job,
                &mk_pod(&job, "o").orphan().deleting(at(1)).build(),
                Claim::Ignore,
            ),
            (
                "orphan of another namespace",
                &job,
                &mk_pod(&job, "o")
                    .orphan()
                    .with(|p| p.metadata.namespace = Some("x".into()))
                    .build(),
                Claim::Ignore,
            ),
            ("foreign", &job, &foreign, Claim::Ignore),
            ("relabelled", &job, &relabelled, Claim::Release),
            ("owned, Job deleting", &deleting_job, &owned, Claim::Owned),
            ("relabelled, Job deleting", &deleting_job, &relabelled, Claim::Ignore),
            ("orphan, Job deleting", &deleting_job, &orphan, Claim::Ignore),
        ];
        for (what, job, pod, want) in cases {
            assert_eq!(claim(job, &sel(job), pod), want, "{what}");
        }
        assert_eq!(pods_for_job(&job, [&owned, &orphan, &foreign]).len(), 1);
        // `selector: {}` claims every pod of the namespace; a nil selector none.
        let every = Selector::compile(Some(&Default::default())).unwrap();
        assert_eq!(claim(&job, &every, &relabelled), Claim::Owned);
        assert_eq!(claim(&job, &Selector::nothing(), &owned), Claim::Release);
        assert_eq!(claim(&job, &Selector::nothing(), &orphan), Claim::Ignore);
        assert_eq!(claim(&job, &selector, &owned), Claim::Owned);
    }
}
