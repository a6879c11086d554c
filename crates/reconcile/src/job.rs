//! Job spec helpers with upstream parity: spec defaults as the API server applies them,
//! completion mode, suspension, the active deadline and `onlyReplaceFailedPods` (upstream
//! `pkg/controller/job/util.go` and `job_controller.go`).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobSpec};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, mk_job};

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
    fn only_replace_failed_table() {
        assert!(!only_replace_failed_pods(&mk_job("j").build()));
        assert!(only_replace_failed_pods(&mk_job("j").pod_replacement_policy("Failed").build()));
        let pfp = mk_job("j")
            .pod_failure_policy(vec![])
            .pod_replacement_policy("TerminatingOrFailed")
            .build();
        assert!(only_replace_failed_pods(&pfp));
    }
}
