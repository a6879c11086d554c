//! The API server's Job status validation (`pkg/apis/batch/validation` with the options of
//! `pkg/registry/batch/job/strategy.go`, JobManagedBy GA): which status updates it rejects.
//! kjob uses it to check that every status the sync engine writes would be accepted; kjob-sim
//! can use it to reject bad writes the way a real API server does.

use std::collections::HashSet;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};

use crate::conditions as cond;
use crate::job;

fn true_cond(conds: &[JobCondition], type_: &str) -> bool {
    cond::has_true(conds, type_)
}

/// Strict parse of an interval list: ascending, non-overlapping, non-adjacent-merged is not
/// required, every index in `[0, completions)`. Returns the indexes or an error message.
fn parse_strict(s: &str, completions: i32) -> Result<Vec<(i32, i32)>, String> {
    let mut out: Vec<(i32, i32)> = Vec::new();
    if s.is_empty() {
        return Ok(out);
    }
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) else {
            return Err(format!("cannot parse interval {part:?}"));
        };
        if a < 0 || b < a || b >= completions {
            return Err(format!("interval {part:?} out of range [0, {completions})"));
        }
        if let Some(&(_, last)) = out.last()
            && a <= last
        {
            return Err(format!("interval {part:?} is not ordered after the previous one"));
        }
        out.push((a, b));
    }
    Ok(out)
}

fn overlaps(a: &[(i32, i32)], b: &[(i32, i32)]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].1 < b[j].0 {
            i += 1;
        } else if b[j].1 < a[i].0 {
            j += 1;
        } else {
            return true;
        }
    }
    false
}

/// Every reason the API server would reject replacing `old.status` with `new` (empty when the
/// update is accepted). `old` carries the spec the update is validated against. As in
/// `getStatusValidationOptions`, most rules only apply when a field they look at changed, so a
/// status that was already stored is never rejected for what it already said.
pub fn status_update_errors(old: &Job, new: &JobStatus) -> Vec<String> {
    let mut errs = Vec::new();
    let old_status = old.status.clone().unwrap_or_default();
    let old_conds = old_status.conditions.as_deref().unwrap_or(&[]);
    let new_conds = new.conditions.as_deref().unwrap_or(&[]);
    let n = |v: Option<i32>| v.unwrap_or(0);
    let uncounted_len = |s: &JobStatus| {
        s.uncounted_terminated_pods.as_ref().map_or(0, |u| {
            u.succeeded.as_ref().map_or(0, Vec::len) + u.failed.as_ref().map_or(0, Vec::len)
        })
    };

    for (name, v) in [
        ("active", new.active),
        ("succeeded", new.succeeded),
        ("failed", new.failed),
        ("ready", new.ready),
        ("terminating", new.terminating),
    ] {
        if n(v) < 0 {
            errs.push(format!("status.{name}: must be greater than or equal to 0"));
        }
    }
    let mut seen = HashSet::new();
    if let Some(u) = &new.uncounted_terminated_pods {
        for uid in u.succeeded.iter().flatten().chain(u.failed.iter().flatten()) {
            if uid.is_empty() {
                errs.push("status.uncountedTerminatedPods: empty UID".into());
            } else if !seen.insert(uid.as_str()) {
                errs.push(format!("status.uncountedTerminatedPods: duplicate UID {uid}"));
            }
        }
    }

    // What changed decides which rules apply (upstream `getStatusValidationOptions`).
    let old_complete = true_cond(old_conds, cond::COMPLETE);
    let old_failed = true_cond(old_conds, cond::FAILED);
    let complete = true_cond(new_conds, cond::COMPLETE);
    let failed = true_cond(new_conds, cond::FAILED);
    let failure_target = true_cond(new_conds, cond::FAILURE_TARGET);
    let success_met = true_cond(new_conds, cond::SUCCESS_CRITERIA_MET);
    let finished = complete || failed;
    let finished_changed = finished != (old_complete || old_failed);
    let complete_changed = complete != old_complete;
    let failed_changed = failed != old_failed;
    let failure_target_changed = failure_target != true_cond(old_conds, cond::FAILURE_TARGET);
    let active_changed = n(new.active) != n(old_status.active);
    let start_changed = new.start_time != old_status.start_time;
    let completion_changed = new.completion_time != old_status.completion_time;
    let uncounted_changed = new.uncounted_terminated_pods != old_status.uncounted_terminated_pods;
    let completed_changed = new.completed_indexes.as_deref().unwrap_or("")
        != old_status.completed_indexes.as_deref().unwrap_or("");
    let failed_indexes_changed = new.failed_indexes != old_status.failed_indexes;

    for t in [cond::COMPLETE, cond::FAILED, cond::FAILURE_TARGET, cond::SUCCESS_CRITERIA_MET] {
        if true_cond(old_conds, t) && !true_cond(new_conds, t) {
            errs.push(format!("status.conditions: cannot disable the {t}=True condition"));
        }
    }
    if n(new.failed) < n(old_status.failed) {
        errs.push("status.failed: cannot decrease".into());
    }
    let elastic_indexed =
        job::is_indexed(old) && job::completions(old) == Some(job::parallelism(old));
    if n(new.succeeded) < n(old_status.succeeded) && !elastic_indexed {
        errs.push("status.succeeded: cannot decrease".into());
    }

    if complete && failed && (complete_changed || failed_changed) {
        errs.push("status.conditions: Complete and Failed are mutually exclusive".into());
    }
    if complete && failure_target && (complete_changed || failure_target_changed) {
        errs.push("status.conditions: Complete and FailureTarget are mutually exclusive".into());
    }
    if success_met && (failed || failure_target) {
        errs.push("status.conditions: SuccessCriteriaMet with Failed or FailureTarget".into());
    }
    if success_met && !true_cond(old_conds, cond::SUCCESS_CRITERIA_MET) && old_complete {
        errs.push("status.conditions: cannot add SuccessCriteriaMet after Complete".into());
    }
    if complete && !success_met {
        errs.push("status.conditions: Complete=True requires SuccessCriteriaMet=True".into());
    }
    if failed && !failure_target {
        errs.push("status.conditions: Failed=True requires FailureTarget=True".into());
    }

    if finished && (finished_changed || active_changed) && n(new.active) != 0 {
        errs.push("status.active: must be 0 for a finished job".into());
    }
    if finished && finished_changed && n(new.terminating) != 0 {
        errs.push("status.terminating: must be 0 for a finished job".into());
    }
    if finished && (finished_changed || start_changed) && new.start_time.is_none() {
        errs.push("status.startTime: required for a finished job".into());
    }
    if finished && (finished_changed || uncounted_changed) && uncounted_len(new) > 0 {
        errs.push("status.uncountedTerminatedPods: must be empty for a finished job".into());
    }
    if n(new.ready) > n(new.active) {
        errs.push("status.ready: cannot set more ready pods than active".into());
    }
    if complete_changed || completion_changed {
        match (&new.completion_time, complete) {
            (Some(_), false) => {
                errs.push("status.completionTime: only allowed with Complete=True".into())
            }
            (None, true) => errs.push("status.completionTime: required with Complete=True".into()),
            _ => {}
        }
    }
    if let (Some(old_ct), Some(new_ct)) = (&old_status.completion_time, &new.completion_time)
        && old_ct != new_ct
    {
        errs.push("status.completionTime: field is immutable".into());
    }
    if (start_changed || completion_changed)
        && let (Some(ct), Some(st)) = (&new.completion_time, &new.start_time)
        && ct.0 < st.0
    {
        errs.push("status.completionTime: must be greater than or equal to startTime".into());
    }
    // Resuming a Job suspended by an older controller (start time kept) must be able to reset
    // it, as newer API servers allow; a Job that never was suspended may not move it.
    let was_suspended = true_cond(old_conds, cond::SUSPENDED);
    if start_changed && !job::is_suspended(old) && !was_suspended && old_status.start_time.is_some()
    {
        errs.push("status.startTime: cannot be changed for an unsuspended job".into());
    }

    let completions = job::completions(old).unwrap_or(0);
    let completed = if completed_changed || failed_indexes_changed {
        match new.completed_indexes.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => {
                if completed_changed && !job::is_indexed(old) {
                    errs.push("status.completedIndexes: only for Indexed jobs".into());
                }
                match parse_strict(s, completions) {
                    Ok(v) => v,
                    Err(e) => {
                        if completed_changed {
                            errs.push(format!("status.completedIndexes: {e}"));
                        }
                        Vec::new()
                    }
                }
            }
            None => Vec::new(),
        }
    } else {
        Vec::new()
    };
    if let Some(s) = new.failed_indexes.as_deref()
        && (failed_indexes_changed || completed_changed)
    {
        if failed_indexes_changed && !job::has_backoff_limit_per_index(old) {
            errs.push("status.failedIndexes: only with backoffLimitPerIndex".into());
        }
        match parse_strict(s, completions) {
            Ok(v) if overlaps(&v, &completed) => {
                errs.push("status.failedIndexes: overlaps completedIndexes".into());
            }
            Ok(_) => {}
            Err(e) if failed_indexes_changed => errs.push(format!("status.failedIndexes: {e}")),
            Err(_) => {}
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, mk_job};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn accepts_the_two_step_success() {
        let job = mk_job("j").start_time(at(0)).build();
        let mut st = job.status.clone().unwrap();
        st.succeeded = Some(1);
        st.conditions = Some(vec![
            cond::new_condition(
                cond::SUCCESS_CRITERIA_MET,
                cond::TRUE,
                "CompletionsReached",
                "m",
                at(5),
            ),
            cond::new_condition(cond::COMPLETE, cond::TRUE, "CompletionsReached", "m", at(5)),
        ]);
        st.completion_time = Some(Time(at(5)));
        assert_eq!(status_update_errors(&job, &st), Vec::<String>::new());
    }

    #[test]
    fn rejects_what_the_api_server_rejects() {
        let job = mk_job("j").start_time(at(10)).counted(3, 2).build();
        let mut st = job.status.clone().unwrap();
        st.failed = Some(1);
        st.active = Some(1);
        st.ready = Some(2);
        st.conditions = Some(vec![cond::new_condition(cond::COMPLETE, cond::TRUE, "", "", at(5))]);
        st.completion_time = Some(Time(at(5)));
        let errs = status_update_errors(&job, &st).join("\n");
        for want in [
            "failed: cannot decrease",
            "Complete=True requires SuccessCriteriaMet",
            "active: must be 0",
            "more ready pods than active",
            "greater than or equal to startTime",
        ] {
            assert!(errs.contains(want), "missing {want:?} in {errs}");
        }
    }

    #[test]
    fn unchanged_fields_are_not_judged_again() {
        // A finished Job already stored with a (now) invalid value: an update that does not
        // touch that field is accepted, as the API server only checks what changes.
        let job = mk_job("j")
            .start_time(at(0))
            .active(1, 0, 0)
            .condition(cond::FAILURE_TARGET, cond::TRUE, "r", "m", at(1))
            .condition(cond::FAILED, cond::TRUE, "r", "m", at(1))
            .build();
        let mut st = job.status.clone().unwrap();
        st.ready = Some(0);
        assert!(status_update_errors(&job, &st).is_empty());
        st.active = Some(2);
        assert!(status_update_errors(&job, &st).join(" ").contains("active: must be 0"));
    }

    #[test]
    fn index_lists_must_be_ordered_and_disjoint() {
        let job = mk_job("j").indexed().completions(Some(10)).backoff_limit_per_index(1).build();
        let mut st = job.status.clone().unwrap_or_default();
        st.completed_indexes = Some("1-3,7".into());
        st.failed_indexes = Some("3".into());
        assert!(status_update_errors(&job, &st).join(" ").contains("overlaps"));
        st.failed_indexes = Some("5,4".into());
        assert!(status_update_errors(&job, &st).join(" ").contains("not ordered"));
        st.failed_indexes = Some("4,10".into());
        assert!(status_update_errors(&job, &st).join(" ").contains("out of range"));
        st.failed_indexes = Some("0,4-5".into());
        assert!(status_update_errors(&job, &st).is_empty());
    }
}
