//! Job condition types, reasons and messages exactly as upstream writes them, and the helpers
//! that read and update `status.conditions` (`util.IsJobFinished`, `ensureJobConditionStatus`).

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition type `Complete`.
pub const COMPLETE: &str = "Complete";
/// Condition type `Failed`.
pub const FAILED: &str = "Failed";
/// Condition type `FailureTarget` (interim, before `Failed`).
pub const FAILURE_TARGET: &str = "FailureTarget";
/// Condition type `SuccessCriteriaMet` (interim, before `Complete`).
pub const SUCCESS_CRITERIA_MET: &str = "SuccessCriteriaMet";
/// Condition type `Suspended`.
pub const SUSPENDED: &str = "Suspended";

/// Condition status `True`.
pub const TRUE: &str = "True";
/// Condition status `False`.
pub const FALSE: &str = "False";

/// Reason: a FailJob pod-failure-policy rule matched.
pub const REASON_POD_FAILURE_POLICY: &str = "PodFailurePolicy";
/// Reason: too many counted failures (or OnFailure restarts).
pub const REASON_BACKOFF_LIMIT_EXCEEDED: &str = "BackoffLimitExceeded";
/// Reason: activeDeadlineSeconds elapsed.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Reason: more failed indexes than maxFailedIndexes.
pub const REASON_MAX_FAILED_INDEXES_EXCEEDED: &str = "MaxFailedIndexesExceeded";
/// Reason: every index finished and at least one failed.
pub const REASON_FAILED_INDEXES: &str = "FailedIndexes";
/// Reason: a successPolicy rule matched.
pub const REASON_SUCCESS_POLICY: &str = "SuccessPolicy";
/// Reason: enough pods succeeded.
pub const REASON_COMPLETIONS_REACHED: &str = "CompletionsReached";
/// Reason of `Suspended=True`.
pub const REASON_JOB_SUSPENDED: &str = "JobSuspended";
/// Reason of `Suspended=False`.
pub const REASON_JOB_RESUMED: &str = "JobResumed";

/// Message of `BackoffLimitExceeded`.
pub const MSG_BACKOFF_LIMIT_EXCEEDED: &str = "Job has reached the specified backoff limit";
/// Message of `DeadlineExceeded`.
pub const MSG_DEADLINE_EXCEEDED: &str = "Job was active longer than specified deadline";
/// Message of `MaxFailedIndexesExceeded`.
pub const MSG_MAX_FAILED_INDEXES_EXCEEDED: &str =
    "Job has exceeded the specified maximal number of failed indexes";
/// Message of `FailedIndexes`.
pub const MSG_FAILED_INDEXES: &str = "Job has failed indexes";
/// Message of `CompletionsReached`.
pub const MSG_COMPLETIONS_REACHED: &str = "Reached expected number of succeeded pods";
/// Message of `Suspended=True`.
pub const MSG_JOB_SUSPENDED: &str = "Job suspended";
/// Message of `Suspended=False`.
pub const MSG_JOB_RESUMED: &str = "Job resumed";

/// A condition with `lastProbeTime = lastTransitionTime = now` (upstream `newCondition`).
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> JobCondition {
    JobCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The first condition of the given type, if any (upstream `findConditionByType`).
pub fn find<'a>(conditions: &'a [JobCondition], type_: &str) -> Option<&'a JobCondition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the list holds a condition of the given type with status `True`.
pub fn has_true(conditions: &[JobCondition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// The Job's conditions, empty when unset.
pub fn of(job: &Job) -> &[JobCondition] {
    job.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[])
}

/// Whether the Job is finished: `Complete=True` or `Failed=True` (upstream `util.IsJobFinished`).
pub fn is_finished(job: &Job) -> bool {
    let conds = of(job);
    // Upstream scans every condition, so a True terminal condition counts wherever it sits.
    conds.iter().any(|c| (c.type_ == COMPLETE || c.type_ == FAILED) && c.status == TRUE)
}

/// Sets a condition of `type_` to the given status/reason/message, appending it if absent
/// (but never appending a `False` one). Rewrites an existing condition only when its status,
/// reason or message differ. Returns whether the list changed (upstream `ensureJobConditionStatus`).
pub fn ensure_status(
    conditions: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let same = c.status == status
            && c.reason.as_deref().unwrap_or("") == reason
            && c.message.as_deref().unwrap_or("") == message;
        if same {
            return false;
        }
        *c = new_condition(type_, status, reason, message, now);
        return true;
    }
    if status == FALSE {
        // Going from "no condition" to False says nothing, so upstream never appends it.
        return false;
    }
    conditions.push(new_condition(type_, status, reason, message, now));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn ensure_status_appends_true_but_not_false() {
        let mut conds = Vec::new();
        assert!(!ensure_status(
            &mut conds,
            SUSPENDED,
            FALSE,
            REASON_JOB_RESUMED,
            MSG_JOB_RESUMED,
            ts(1)
        ));
        assert!(conds.is_empty());
        assert!(ensure_status(
            &mut conds,
            SUSPENDED,
            TRUE,
            REASON_JOB_SUSPENDED,
            MSG_JOB_SUSPENDED,
            ts(1)
        ));
        assert_eq!(conds.len(), 1);
        // Same content: untouched, timestamps kept.
        assert!(!ensure_status(
            &mut conds,
            SUSPENDED,
            TRUE,
            REASON_JOB_SUSPENDED,
            MSG_JOB_SUSPENDED,
            ts(5)
        ));
        assert_eq!(conds[0].last_transition_time, Some(Time(ts(1))));
        // Flip to False rewrites in place with the new time.
        assert!(ensure_status(
            &mut conds,
            SUSPENDED,
            FALSE,
            REASON_JOB_RESUMED,
            MSG_JOB_RESUMED,
            ts(9)
        ));
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].status, FALSE);
        assert_eq!(conds[0].last_transition_time, Some(Time(ts(9))));
        assert_eq!(conds[0].last_probe_time, Some(Time(ts(9))));
    }

    #[test]
    fn finished_needs_true_terminal_condition() {
        let mut job = Job::default();
        assert!(!is_finished(&job));
        let mut st = k8s_openapi::api::batch::v1::JobStatus {
            conditions: Some(vec![new_condition(FAILURE_TARGET, TRUE, "x", "y", ts(1))]),
            ..Default::default()
        };
        job.status = Some(st.clone());
        assert!(!is_finished(&job));
        st.conditions.as_mut().unwrap().push(new_condition(COMPLETE, FALSE, "", "", ts(1)));
        job.status = Some(st.clone());
        assert!(!is_finished(&job));
        st.conditions.as_mut().unwrap().push(new_condition(FAILED, TRUE, "x", "y", ts(1)));
        job.status = Some(st);
        assert!(is_finished(&job));
    }
}
