//! What the sync engine asks of the policy and index modules (`pod_failure_policy`,
//! `success_policy`, `backoff`, `indexes`, `pod`), through a narrow interface, so the engine
//! reads as the upstream `syncJob` does. Each function names the upstream function it matches.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::backoff::{self, BackoffRecord};
use crate::pod_failure_policy::match_pod_failure_policy;
use crate::{indexes, pod, success_policy};

/// Ordered set of completion indexes (upstream `orderedIntervals`).
pub type IndexSet = indexes::OrderedIntervals;

/// Number of valid indexes in an interval string (upstream `indexesCount`).
pub fn count_indexes(s: &str, completions: i32) -> usize {
    IndexSet::parse(s, completions).total()
}

pub use pod::is_ready;

pub(crate) use crate::removal::active_pods_for_removal_with;
pub use indexes::is_index_failed;
pub(crate) use indexes::{delayed_deletion_among, first_pending_outside};

fn policy(job: &Job) -> Option<&k8s_openapi::api::batch::v1::PodFailurePolicy> {
    job.spec.as_ref().and_then(|s| s.pod_failure_policy.as_ref())
}

/// Whether a failed pod counts toward `status.failed` under the pod failure policy (upstream
/// `nonIgnoredFailedPodsCount`'s test).
pub fn policy_counts_failure(job: &Job, pod: &Pod) -> bool {
    match_pod_failure_policy(policy(job), pod).count_failed
}

/// `(counts as failure, matched action label)` for a pod being counted as failed; the action is
/// only reported when the Job has a policy (upstream `trackJobStatusAndRemoveFinalizers`).
pub fn failure_policy_outcome(job: &Job, pod: &Pod) -> (bool, Option<String>) {
    let m = match_pod_failure_policy(policy(job), pod);
    (m.count_failed, m.action.map(|a| a.as_str().to_string()))
}

/// The FailJob message of the first failed pod matching a FailJob rule (upstream
/// `getFailJobMessage`).
pub fn fail_job_message<'a>(job: &Job, pods: impl IntoIterator<Item = &'a Pod>) -> Option<String> {
    crate::pod_failure_policy::fail_job_message(job, pods)
}

/// The success-policy message when a rule matches (upstream `matchSuccessPolicy`).
pub fn success_policy_message(job: &Job, succeeded: &IndexSet) -> Option<String> {
    let spec = job.spec.as_ref()?;
    success_policy::match_success_policy(
        spec.success_policy.as_ref(),
        spec.completions.unwrap_or(0),
        succeeded,
    )
}

/// Indexes whose per-index backoff is over, and otherwise the shortest wait (upstream
/// `getPodCreationInfoForIndependentIndexes`).
pub fn indexes_ready_to_create(
    ixs: &[i32],
    delayed: &BTreeMap<i32, &Pod>,
    now: Timestamp,
) -> (Vec<i32>, Duration) {
    backoff::indexes_ready_to_create(ixs, delayed, now)
}

/// The backoff record after this sync's newly finished pods, given their finish times
/// (upstream `newBackoffRecord`).
pub fn new_backoff_record(
    prev: Option<&BackoffRecord>,
    new_succeeded: impl Iterator<Item = Timestamp>,
    new_failed: impl Iterator<Item = Timestamp>,
) -> BackoffRecord {
    let (succeeded, failed): (Vec<_>, Vec<_>) = (new_succeeded.collect(), new_failed.collect());
    prev.cloned().unwrap_or_default().updated_at(&succeeded, &failed)
}

/// Time left before pods may be created again (upstream `backoffRecord.getRemainingTime`).
pub fn backoff_remaining(record: &BackoffRecord, now: Timestamp) -> Duration {
    record.remaining_time(
        now,
        backoff::DEFAULT_POD_FAILURE_BACKOFF,
        backoff::MAX_POD_FAILURE_BACKOFF,
    )
}
