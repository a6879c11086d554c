//! Pod helpers with upstream parity: phase, readiness, the tracking finalizer, the completion
//! index, restarts, finish time and deletion rank (`controller.IsPodActive` / `IsPodTerminating`
//! / `ActivePods` from `pkg/controller/controller_utils.go`; `isPodFailed`, `getCompletionIndex`
//! and `getFinishedTime` from `pkg/controller/job`).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kjob_core::{JOB_COMPLETION_INDEX_ANNOTATION, JOB_TRACKING_FINALIZER};

use crate::job::{completions, is_indexed, only_replace_failed_pods};

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

fn parse_non_negative(v: &str) -> Option<i32> {
    v.parse::<i32>().ok().filter(|i| *i >= 0)
}

/// The pod's completion index, read from the `batch.kubernetes.io/job-completion-index`
/// annotation only; `None` when missing, unparsable or negative (upstream `getCompletionIndex`).
/// The label of the same name is not consulted: a pod whose annotation is gone is index-less,
/// so the Job deletes and replaces it as upstream does.
pub fn completion_index(pod: &Pod) -> Option<i32> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(JOB_COMPLETION_INDEX_ANNOTATION))
        .and_then(|v| parse_non_negative(v))
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
    use super::*;
    use crate::testutil::{
        at, count_ready, mk_job, mk_pod, new_finished_pods, past_backoff_limit_on_failure,
        sort_for_removal,
    };

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

    #[test]
    fn completion_index_sources() {
        let job = mk_job("j").build();
        let p = |f: fn(crate::testutil::PodBuilder) -> crate::testutil::PodBuilder| {
            f(mk_pod(&job, "p")).build()
        };
        assert_eq!(completion_index(&p(|b| b.index(4))), Some(4));
        // The label alone gives no index (upstream reads only the annotation).
        assert_eq!(completion_index(&p(|b| b.label(JOB_COMPLETION_INDEX_ANNOTATION, "6"))), None);
        // The annotation wins over a contradicting label.
        assert_eq!(
            completion_index(&p(|b| b
                .annotation(JOB_COMPLETION_INDEX_ANNOTATION, "2")
                .label(JOB_COMPLETION_INDEX_ANNOTATION, "6"))),
            Some(2)
        );
        assert_eq!(
            completion_index(&p(|b| b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, "-1"))),
            None
        );
        assert_eq!(
            completion_index(&p(|b| b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, "x"))),
            None
        );
        assert_eq!(completion_index(&p(|b| b)), None);
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
}
