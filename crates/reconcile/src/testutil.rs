//! Test builders for Jobs and Pods, shaped like what the API server and kubelet produce.
//!
//! `mk_job` returns a Job with the API server's defaults applied (parallelism 1, completions 1,
//! backoffLimit 6, NonIndexed, generated selector and template labels), and `mk_pod` a Pod owned
//! by that Job, carrying the tracking finalizer, in phase Running. Chain the setters to change
//! anything; every setter takes `self` and returns it so tables stay one line per case.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use crate::job::{is_indexed, restarts_on_failure, restarts_past_backoff_limit};
use crate::pod::{
    PHASE_PENDING, PHASE_RUNNING, RemovalKey, completion_index, controller_ref, is_active,
    is_pod_failed, is_ready, is_succeeded, is_valid_tracked_pod, max_container_restarts, node_name,
    phase, phase_rank, ready_since, removal_key, total_restarts, uid,
};
use crate::removal::active_pods_for_removal_with;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, JobStatus, PodFailurePolicy, PodFailurePolicyRule, SuccessPolicy,
    SuccessPolicyRule, UncountedTerminatedPods,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kjob_core::{
    CONTROLLER_UID_LABEL, JOB_COMPLETION_INDEX_ANNOTATION, JOB_INDEX_FAILURE_COUNT_ANNOTATION,
    JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION, JOB_NAME_LABEL, JOB_TRACKING_FINALIZER,
    LEGACY_CONTROLLER_UID_LABEL, LEGACY_JOB_NAME_LABEL,
};

/// Fixed reference instant for tests (2026-01-01T00:00:00Z), so expected values never drift.
pub fn t0() -> Timestamp {
    Timestamp::from_second(1_767_225_600).expect("valid constant timestamp")
}

/// The instant `secs` seconds after [`t0`] (negative goes before it).
pub fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

/// Namespace every builder uses unless told otherwise.
pub const TEST_NAMESPACE: &str = "default";

/// Name of the single container in the default template.
pub const MAIN_CONTAINER: &str = "main";

/// Starts a Job named `name` in [`TEST_NAMESPACE`] with the API server's defaults applied.
pub fn mk_job(name: &str) -> JobBuilder {
    let uid = format!("uid-{name}");
    let labels = BTreeMap::from([
        (CONTROLLER_UID_LABEL.to_string(), uid.clone()),
        (LEGACY_CONTROLLER_UID_LABEL.to_string(), uid.clone()),
        (JOB_NAME_LABEL.to_string(), name.to_string()),
        (LEGACY_JOB_NAME_LABEL.to_string(), name.to_string()),
    ]);
    let job = Job {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(TEST_NAMESPACE.to_string()),
            uid: Some(uid.clone()),
            resource_version: Some("1".to_string()),
            generation: Some(1),
            creation_timestamp: Some(Time(t0())),
            ..Default::default()
        },
        spec: Some(JobSpec {
            parallelism: Some(1),
            completions: Some(1),
            backoff_limit: Some(6),
            completion_mode: Some("NonIndexed".to_string()),
            suspend: Some(false),
            manual_selector: None,
            pod_replacement_policy: Some("TerminatingOrFailed".to_string()),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(CONTROLLER_UID_LABEL.to_string(), uid)])),
                ..Default::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: MAIN_CONTAINER.to_string(),
                        image: Some("busybox".to_string()),
                        ..Default::default()
                    }],
                    restart_policy: Some("Never".to_string()),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: Some(JobStatus::default()),
    };
    JobBuilder(job)
}

/// An Indexed Job of `n` indexes that all run at once, with no Job-wide backoff limit, started
/// at [`t0`]: the busy Job the planner bench and its golden transcripts share.
pub fn busy_indexed_job(name: &str, n: i32) -> JobBuilder {
    mk_job(name)
        .indexed()
        .completions(Some(n))
        .parallelism(n)
        .backoff_limit(i32::MAX)
        .start_time(at(0))
}

/// A busy Indexed Job's steady state, one pod per index named `<prefix>-<i>`: 10% succeeded
/// (still tracked), 5% failed, the rest running (half of them ready).
pub fn steady_pods(job: &Job, prefix: &str, n: i32) -> Vec<Pod> {
    (0..n)
        .map(|i| {
            let b = mk_pod(job, &format!("{prefix}-{i}")).index(i);
            match i % 20 {
                0 | 1 => b.succeeded(at(50)),
                2 => b.failed(1, at(50)),
                k if k % 2 == 0 => b.ready(at(10)),
                _ => b,
            }
            .build()
        })
        .collect()
}

/// Chainable Job builder; see [`mk_job`].
#[derive(Debug, Clone)]
pub struct JobBuilder(pub Job);

impl JobBuilder {
    fn spec(&mut self) -> &mut JobSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    fn status_mut(&mut self) -> &mut JobStatus {
        self.0.status.get_or_insert_with(Default::default)
    }

    /// Sets `spec.parallelism`.
    pub fn parallelism(mut self, n: i32) -> Self {
        self.spec().parallelism = Some(n);
        self
    }

    /// Sets `spec.completions` (`None` makes a work-queue Job).
    pub fn completions(mut self, n: Option<i32>) -> Self {
        self.spec().completions = n;
        self
    }

    /// Sets `spec.completionMode` to Indexed.
    pub fn indexed(mut self) -> Self {
        self.spec().completion_mode = Some("Indexed".to_string());
        self
    }

    /// Sets `spec.completionMode` to any string (for the unknown-mode path).
    pub fn completion_mode(mut self, mode: &str) -> Self {
        self.spec().completion_mode = Some(mode.to_string());
        self
    }

    /// Sets `spec.backoffLimit`.
    pub fn backoff_limit(mut self, n: i32) -> Self {
        self.spec().backoff_limit = Some(n);
        self
    }

    /// Sets `spec.backoffLimitPerIndex` (and backoffLimit to MaxInt32, as the API server does).
    pub fn backoff_limit_per_index(mut self, n: i32) -> Self {
        self.spec().backoff_limit_per_index = Some(n);
        self.spec().backoff_limit = Some(i32::MAX);
        self
    }

    /// Sets `spec.maxFailedIndexes`.
    pub fn max_failed_indexes(mut self, n: i32) -> Self {
        self.spec().max_failed_indexes = Some(n);
        self
    }

    /// Sets `spec.activeDeadlineSeconds`.
    pub fn active_deadline_seconds(mut self, s: i64) -> Self {
        self.spec().active_deadline_seconds = Some(s);
        self
    }

    /// Sets `spec.suspend`.
    pub fn suspend(mut self, s: bool) -> Self {
        self.spec().suspend = Some(s);
        self
    }

    /// Sets `spec.managedBy`.
    pub fn managed_by(mut self, m: &str) -> Self {
        self.spec().managed_by = Some(m.to_string());
        self
    }

    /// Sets `spec.podReplacementPolicy` ("TerminatingOrFailed" or "Failed").
    pub fn pod_replacement_policy(mut self, p: &str) -> Self {
        self.spec().pod_replacement_policy = Some(p.to_string());
        self
    }

    /// Sets `spec.podFailurePolicy` (and podReplacementPolicy=Failed, as the API server does).
    pub fn pod_failure_policy(mut self, rules: Vec<PodFailurePolicyRule>) -> Self {
        self.spec().pod_failure_policy = Some(PodFailurePolicy { rules });
        self.spec().pod_replacement_policy = Some("Failed".to_string());
        self
    }

    /// Sets `spec.successPolicy` from `(succeededIndexes, succeededCount)` pairs.
    pub fn success_policy(mut self, rules: &[(Option<&str>, Option<i32>)]) -> Self {
        let rules = rules
            .iter()
            .map(|(idx, count)| SuccessPolicyRule {
                succeeded_indexes: idx.map(str::to_string),
                succeeded_count: *count,
            })
            .collect();
        self.spec().success_policy = Some(SuccessPolicy { rules });
        self
    }

    /// Sets the template's `restartPolicy` ("Never" or "OnFailure").
    pub fn restart_policy(mut self, p: &str) -> Self {
        if let Some(spec) = self.spec().template.spec.as_mut() {
            spec.restart_policy = Some(p.to_string());
        }
        self
    }

    /// Marks the Job as being deleted at `when`.
    pub fn deleting(mut self, when: Timestamp) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(when));
        self
    }

    /// Sets `status.startTime`.
    pub fn start_time(mut self, when: Timestamp) -> Self {
        self.status_mut().start_time = Some(Time(when));
        self
    }

    /// Sets `status.active`, `status.ready` and `status.terminating`.
    pub fn active(mut self, active: i32, ready: i32, terminating: i32) -> Self {
        let s = self.status_mut();
        s.active = Some(active);
        s.ready = Some(ready);
        s.terminating = Some(terminating);
        self
    }

    /// Sets `status.succeeded` and `status.failed`.
    pub fn counted(mut self, succeeded: i32, failed: i32) -> Self {
        let s = self.status_mut();
        s.succeeded = Some(succeeded);
        s.failed = Some(failed);
        self
    }

    /// Sets `status.completedIndexes`.
    pub fn completed_indexes(mut self, s: &str) -> Self {
        self.status_mut().completed_indexes = Some(s.to_string());
        self
    }

    /// Sets `status.failedIndexes`.
    pub fn failed_indexes(mut self, s: &str) -> Self {
        self.status_mut().failed_indexes = Some(s.to_string());
        self
    }

    /// Sets `status.uncountedTerminatedPods` from UID lists.
    pub fn uncounted(mut self, succeeded: &[&str], failed: &[&str]) -> Self {
        let to_vec = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect());
        self.status_mut().uncounted_terminated_pods =
            Some(UncountedTerminatedPods { succeeded: to_vec(succeeded), failed: to_vec(failed) });
        self
    }

    /// Appends a status condition with `lastTransitionTime = lastProbeTime = when`.
    pub fn condition(
        mut self,
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
        when: Timestamp,
    ) -> Self {
        self.status_mut()
            .conditions
            .get_or_insert_with(Vec::new)
            .push(crate::conditions::new_condition(type_, status, reason, message, when));
        self
    }

    /// Applies an arbitrary change to the Job.
    pub fn with(mut self, f: impl FnOnce(&mut Job)) -> Self {
        f(&mut self.0);
        self
    }

    /// Returns the built Job.
    pub fn build(self) -> Job {
        self.0
    }
}

impl From<JobBuilder> for Job {
    fn from(b: JobBuilder) -> Job {
        b.0
    }
}

/// Starts a Pod named `name` owned by `job`: template labels, controller ownerReference,
/// tracking finalizer, UID `<name>-uid`, created at [`t0`], scheduled on `node-1`, Running.
pub fn mk_pod(job: &Job, name: &str) -> PodBuilder {
    let labels =
        job.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone());
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: job.metadata.namespace.clone(),
            uid: Some(format!("{name}-uid")),
            resource_version: Some("1".to_string()),
            creation_timestamp: Some(Time(t0())),
            labels,
            finalizers: Some(vec![JOB_TRACKING_FINALIZER.to_string()]),
            owner_references: Some(vec![crate::template::controller_ref(job)]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: MAIN_CONTAINER.to_string(),
                image: Some("busybox".to_string()),
                ..Default::default()
            }],
            node_name: Some("node-1".to_string()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_string()),
            container_statuses: Some(vec![ContainerStatus {
                name: MAIN_CONTAINER.to_string(),
                image: "busybox".to_string(),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning { started_at: Some(Time(t0())) }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    PodBuilder(pod)
}

/// Chainable Pod builder; see [`mk_pod`].
#[derive(Debug, Clone)]
pub struct PodBuilder(pub Pod);

impl PodBuilder {
    fn status(&mut self) -> &mut PodStatus {
        self.0.status.get_or_insert_with(Default::default)
    }

    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    /// Sets `status.phase`.
    pub fn phase(mut self, phase: &str) -> Self {
        self.status().phase = Some(phase.to_string());
        self
    }

    /// Phase Pending, not scheduled, no container statuses.
    pub fn pending(mut self) -> Self {
        self.status().phase = Some("Pending".to_string());
        self.status().container_statuses = None;
        self.spec().node_name = None;
        self
    }

    /// Phase Succeeded; every container terminated with exit code 0 at `when`.
    pub fn succeeded(self, when: Timestamp) -> Self {
        self.phase("Succeeded").terminated(MAIN_CONTAINER, 0, when)
    }

    /// Phase Failed; the main container terminated with `exit_code` at `when`.
    pub fn failed(self, exit_code: i32, when: Timestamp) -> Self {
        self.phase("Failed").terminated(MAIN_CONTAINER, exit_code, when)
    }

    /// Sets (or replaces) a container status to terminated with `exit_code` at `when`.
    pub fn terminated(mut self, container: &str, exit_code: i32, when: Timestamp) -> Self {
        let state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                finished_at: Some(Time(when)),
                started_at: Some(Time(t0())),
                ..Default::default()
            }),
            ..Default::default()
        };
        upsert_container_status(
            self.status().container_statuses.get_or_insert_with(Vec::new),
            container,
            state,
        );
        self
    }

    /// Sets (or replaces) an init container status to terminated with `exit_code` at `when`.
    pub fn init_terminated(mut self, container: &str, exit_code: i32, when: Timestamp) -> Self {
        let state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                finished_at: Some(Time(when)),
                ..Default::default()
            }),
            ..Default::default()
        };
        upsert_container_status(
            self.status().init_container_statuses.get_or_insert_with(Vec::new),
            container,
            state,
        );
        self
    }

    /// Sets the restart count of the main container.
    pub fn restarts(mut self, n: i32) -> Self {
        let statuses = self.status().container_statuses.get_or_insert_with(Vec::new);
        if let Some(cs) = statuses.iter_mut().find(|c| c.name == MAIN_CONTAINER) {
            cs.restart_count = n;
        } else {
            statuses.push(ContainerStatus {
                name: MAIN_CONTAINER.to_string(),
                restart_count: n,
                ..Default::default()
            });
        }
        self
    }

    /// Adds or replaces a pod condition (`type`, `status`) transitioned at `when`.
    pub fn condition(mut self, type_: &str, status: &str, when: Timestamp) -> Self {
        let conds = self.status().conditions.get_or_insert_with(Vec::new);
        conds.retain(|c| c.type_ != type_);
        conds.push(PodCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            last_transition_time: Some(Time(when)),
            ..Default::default()
        });
        self
    }

    /// Condition Ready=True since `when`.
    pub fn ready(self, when: Timestamp) -> Self {
        self.condition("Ready", "True", when)
    }

    /// Sets `spec.nodeName` (`None` = unscheduled).
    pub fn node(mut self, node: Option<&str>) -> Self {
        self.spec().node_name = node.map(str::to_string);
        self
    }

    /// Sets the completion index annotation and label.
    pub fn index(self, i: i32) -> Self {
        let v = i.to_string();
        self.annotation(JOB_COMPLETION_INDEX_ANNOTATION, &v)
            .label(JOB_COMPLETION_INDEX_ANNOTATION, &v)
    }

    /// Sets the per-index failure-count annotations (ignored count omitted when `None`).
    pub fn failure_counts(self, failures: i32, ignored: Option<i32>) -> Self {
        let s = self.annotation(JOB_INDEX_FAILURE_COUNT_ANNOTATION, &failures.to_string());
        match ignored {
            Some(n) => s.annotation(JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION, &n.to_string()),
            None => s,
        }
    }

    /// Sets an annotation.
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }

    /// Sets a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.labels.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }

    /// Removes the tracking finalizer (the pod was already counted).
    pub fn no_finalizer(mut self) -> Self {
        if let Some(f) = self.0.metadata.finalizers.as_mut() {
            f.retain(|f| f != JOB_TRACKING_FINALIZER);
        }
        self
    }

    /// Marks the pod as being deleted at `when` (grace period 30 s, as `kubectl delete`).
    pub fn deleting(mut self, when: Timestamp) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(when));
        self.0.metadata.deletion_grace_period_seconds = Some(30);
        self
    }

    /// Sets `metadata.creationTimestamp`.
    pub fn created(mut self, when: Timestamp) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(when));
        self
    }

    /// Sets `metadata.uid`.
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_string());
        self
    }

    /// Removes the ownerReferences (an orphan pod).
    pub fn orphan(mut self) -> Self {
        self.0.metadata.owner_references = None;
        self
    }

    /// Applies an arbitrary change to the Pod.
    pub fn with(mut self, f: impl FnOnce(&mut Pod)) -> Self {
        f(&mut self.0);
        self
    }

    /// Returns the built Pod.
    pub fn build(self) -> Pod {
        self.0
    }
}

impl From<PodBuilder> for Pod {
    fn from(b: PodBuilder) -> Pod {
        b.0
    }
}

fn upsert_container_status(statuses: &mut Vec<ContainerStatus>, name: &str, state: ContainerState) {
    if let Some(cs) = statuses.iter_mut().find(|c| c.name == name) {
        cs.state = Some(state);
    } else {
        statuses.push(ContainerStatus {
            name: name.to_string(),
            image: "busybox".to_string(),
            state: Some(state),
            ..Default::default()
        });
    }
}

/// Builds a pod-failure-policy rule: `action` on exit codes (`container`, `operator`, `values`).
pub fn exit_code_rule(
    action: &str,
    container: Option<&str>,
    operator: &str,
    values: &[i32],
) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.to_string(),
        on_exit_codes: Some(k8s_openapi::api::batch::v1::PodFailurePolicyOnExitCodesRequirement {
            container_name: container.map(str::to_string),
            operator: operator.to_string(),
            values: values.to_vec(),
        }),
        on_pod_conditions: None,
    }
}

/// Builds a pod-failure-policy rule: `action` on pod conditions `(type, status)`.
pub fn condition_rule(action: &str, patterns: &[(&str, &str)]) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.to_string(),
        on_exit_codes: None,
        on_pod_conditions: Some(
            patterns
                .iter()
                .map(|(t, s)| k8s_openapi::api::batch::v1::PodFailurePolicyOnPodConditionsPattern {
                    type_: t.to_string(),
                    status: Some(s.to_string()),
                })
                .collect(),
        ),
    }
}

/// A sync of `job` over `pods` at `now` with expectations satisfied, no backoff record, kjob's
/// default controller name and every Job managed; change the other fields on the result.
pub fn sync_input<'a>(
    job: &'a Job,
    pods: impl Into<crate::PodSlice<'a>>,
    now: Timestamp,
    finalizer_removals_in_flight: &'a BTreeSet<String>,
) -> crate::SyncInput<'a> {
    crate::SyncInput {
        job,
        pods: pods.into(),
        now,
        expectations_satisfied: true,
        finalizer_removals_in_flight,
        backoff: None,
        controller_name: kjob_core::DEFAULT_CONTROLLER_NAME,
        manage_all: true,
    }
}

/// A sync of [`sync_input`] at `now` that plans from `summaries` when given (the worker's way,
/// [`crate::JobSync::with_summaries`]), else from the Pods alone.
pub fn start_sync<'a>(
    job: &'a Job,
    pods: impl Into<crate::PodSlice<'a>>,
    now: Timestamp,
    finalizer_removals_in_flight: &'a BTreeSet<String>,
    summaries: Option<&'a [crate::PodSummary]>,
) -> crate::JobSync<'a> {
    let input = sync_input(job, pods, now, finalizer_removals_in_flight);
    match summaries {
        Some(s) => crate::JobSync::with_summaries(input, s),
        None => crate::JobSync::new(input),
    }
}

// Upstream helpers the engine does not call (it works over pod summaries and positions), kept
// as the plain Pod-level references the unit tests check the engine's pieces against.

/// `afterOrZero`: a missing time sorts first, otherwise the later time sorts first.
fn after_or_zero(a: Option<Timestamp>, b: Option<Timestamp>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(&a),
    }
}

/// The pod's controller is this Job (kind Job, group batch, same UID).
pub fn is_controlled_by(pod: &Pod, job: &Job) -> bool {
    let Some(job_uid) = job.metadata.uid.as_deref() else { return false };
    controller_ref(pod)
        .is_some_and(|r| r.uid == job_uid && r.kind == "Job" && r.api_version.starts_with("batch/"))
}

/// Pods whose controllerRef is this Job (the ones `getPodsForJob` keeps without adopting).
pub fn pods_for_job<'a>(job: &Job, pods: impl IntoIterator<Item = &'a Pod>) -> Vec<&'a Pod> {
    pods.into_iter().filter(|p| is_controlled_by(p, job)).collect()
}

/// Active pods (upstream `controller.FilterActivePods`).
pub fn active_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<&'a Pod> {
    pods.into_iter().filter(|p| is_active(p)).collect()
}

/// Number of Ready pods (upstream `countReadyPods`).
pub fn count_ready<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> i32 {
    pods.into_iter().filter(|p| is_ready(p)).count() as i32
}

/// Deletion preference order of upstream `controller.ActivePods` (`Less`): `Less` means "delete
/// first". Unassigned < assigned; Pending < Unknown < Running; not Ready < Ready; Ready for less
/// time first; more restarts first; newer (or no creationTimestamp) first.
pub fn active_pods_order(a: &Pod, b: &Pod) -> Ordering {
    let (na, nb) = (node_name(a), node_name(b));
    if na != nb && (na.is_empty() || nb.is_empty()) {
        return if na.is_empty() { Ordering::Less } else { Ordering::Greater };
    }
    let by_phase = phase_rank(a).cmp(&phase_rank(b));
    if by_phase != Ordering::Equal {
        return by_phase;
    }
    let (ra, rb) = (is_ready(a), is_ready(b));
    if ra != rb {
        return if ra { Ordering::Greater } else { Ordering::Less };
    }
    if ra && rb {
        let (ta, tb) = (ready_since(a), ready_since(b));
        if ta != tb {
            return after_or_zero(ta, tb);
        }
    }
    let by_restarts = max_container_restarts(b).cmp(&max_container_restarts(a));
    if by_restarts != Ordering::Equal {
        return by_restarts;
    }
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    after_or_zero(created(a), created(b))
}

/// Sorts pods so the ones to delete first come first (upstream `sort.Sort(controller.ActivePods)`).
/// Stable: pods that compare equal keep their order.
pub fn sort_for_removal(pods: &mut [&Pod]) {
    let mut keyed: Vec<(RemovalKey, &Pod)> = pods.iter().map(|p| (removal_key(p), *p)).collect();
    keyed.sort_by_key(|k| k.0);
    for (slot, (_, p)) in pods.iter_mut().zip(keyed) {
        *slot = p;
    }
}

/// Active pods to delete, first to last: for Indexed Jobs every pod with a missing or
/// out-of-range index and all but the most advanced pod of each duplicated index, then, if fewer
/// than `rm_at_least`, the first pods in [`active_pods_order`] (upstream `activePodsForRemoval`).
pub fn active_pods_for_removal<'a>(
    job: &Job,
    active: &[&'a Pod],
    rm_at_least: usize,
) -> Vec<&'a Pod> {
    let indexes: Option<Vec<Option<i32>>> =
        is_indexed(job).then(|| active.iter().map(|p| completion_index(p)).collect());
    let keys: Vec<RemovalKey> = active.iter().map(|p| removal_key(p)).collect();
    active_pods_for_removal_with(job, keys.len(), |i| keys[i], indexes.as_deref(), rm_at_least)
        .into_iter()
        .map(|i| active[i])
        .collect()
}

/// Finished pods not yet accounted for: tracked (finalizer), not in `uncounted`, not awaiting a
/// finalizer removal, with a valid index for Indexed Jobs; split into (succeeded, failed) where
/// failed follows [`is_pod_failed`](crate::pod::is_pod_failed) (upstream `getNewFinishedPods` / `getValidPodsWithFilter`).
pub fn new_finished_pods<'a>(
    job: &Job,
    pods: impl IntoIterator<Item = &'a Pod>,
    uncounted_succeeded: &BTreeSet<String>,
    uncounted_failed: &BTreeSet<String>,
    finalizer_removals_in_flight: &BTreeSet<String>,
) -> (Vec<&'a Pod>, Vec<&'a Pod>) {
    let mut succeeded = Vec::new();
    let mut failed = Vec::new();
    for p in pods {
        if !is_valid_tracked_pod(job, p, finalizer_removals_in_flight) {
            continue;
        }
        let uid = uid(p);
        if is_succeeded(p) && !uncounted_succeeded.contains(uid) {
            succeeded.push(p);
        }
        if is_pod_failed(p, job) && !uncounted_failed.contains(uid) {
            failed.push(p);
        }
    }
    (succeeded, failed)
}

/// With restartPolicy OnFailure, the summed restart counts of Running/Pending pods reached
/// backoffLimit (> 0 when the limit is 0) (upstream `pastBackoffLimitOnFailure`).
pub fn past_backoff_limit_on_failure<'a>(
    job: &Job,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> bool {
    if !restarts_on_failure(job) {
        return false;
    }
    let total: i64 = pods
        .into_iter()
        .filter(|p| matches!(phase(p), PHASE_RUNNING | PHASE_PENDING))
        .map(total_restarts)
        .sum();
    restarts_past_backoff_limit(job, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_defaults_match_api_server() {
        let job = mk_job("pi").indexed().completions(Some(5)).build();
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!(spec.completions, Some(5));
        assert_eq!(spec.backoff_limit, Some(6));
        let sel = spec.selector.as_ref().unwrap().match_labels.as_ref().unwrap();
        assert_eq!(sel.get(CONTROLLER_UID_LABEL).map(String::as_str), Some("uid-pi"));
    }

    #[test]
    fn pod_is_owned_and_tracked() {
        let job = mk_job("pi").build();
        let pod = mk_pod(&job, "pi-a").index(3).failed(1, at(5)).build();
        let meta = &pod.metadata;
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, "uid-pi");
        assert_eq!(meta.finalizers.as_ref().unwrap(), &vec![JOB_TRACKING_FINALIZER.to_string()]);
        assert_eq!(
            meta.annotations.as_ref().unwrap().get(JOB_COMPLETION_INDEX_ANNOTATION).unwrap(),
            "3"
        );
        let status = pod.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let term = status.container_statuses.unwrap()[0].state.clone().unwrap().terminated.unwrap();
        assert_eq!((term.exit_code, term.finished_at.unwrap().0), (1, at(5)));
    }
}
