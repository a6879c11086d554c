//! The Job's conditions and status writes: completion and suspension after manageJob, the three
//! upstream status writes, `enactJobFinished`, and the events and metrics owed once a write lands.

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::policy;
use super::{Awaiting, BackoffUpdate, JobSync, Phase, Step, SyncError, WriteKind};
use crate::conditions as cond;
use crate::events::{self, Event};
use crate::job;
use crate::metrics as m;

impl<'a> JobSync<'a> {
    /// Rest of step 17 and step 18 of upstream `syncJob`.
    pub(super) fn after_manage(&mut self) {
        let job = self.job();
        let now = self.input.now;
        // Upstream evaluates completion and suspension only on the manageJob branch, even when
        // the finishing branch had to drop its verdict.
        if self.finished_condition.is_none() && !self.finishing {
            let complete = match job::completions(job) {
                None => self.succeeded > 0 && self.active == 0,
                Some(c) => self.succeeded >= c && self.active == 0,
            };
            if complete {
                self.finished_condition = Some(cond::new_condition(
                    cond::SUCCESS_CRITERIA_MET,
                    cond::TRUE,
                    cond::REASON_COMPLETIONS_REACHED,
                    cond::MSG_COMPLETIONS_REACHED,
                    now,
                ));
            } else if self.manage_called {
                let conditions = self.status.conditions.get_or_insert_with(Vec::new);
                // Scheduling directives may change while suspended, so the deadline restarts
                // on resume; activeDeadlineSeconds counts continuous active time.
                let (status, reason, message, event, start_time) = if job::is_suspended(job) {
                    let (r, m) = (cond::REASON_JOB_SUSPENDED, cond::MSG_JOB_SUSPENDED);
                    (cond::TRUE, r, m, events::suspended as fn() -> Event, None)
                } else {
                    let (r, m) = (cond::REASON_JOB_RESUMED, cond::MSG_JOB_RESUMED);
                    (cond::FALSE, r, m, events::resumed as fn() -> Event, Some(Time(now)))
                };
                if cond::ensure_status(conditions, cond::SUSPENDED, status, reason, message, now) {
                    self.suspend_changed = true;
                    self.outcome.events.push(event());
                    self.status.start_time = start_time;
                }
                if self.status.conditions.as_ref().is_some_and(Vec::is_empty) {
                    self.status.conditions = None;
                }
            }
        }
        let st = &self.status;
        self.needs_flush = self.suspend_changed
            || self.active != st.active.unwrap_or(0)
            || Some(self.ready) != st.ready
            || Some(self.terminating) != st.terminating;
        self.status.active = Some(self.active);
        self.status.ready = Some(self.ready);
        self.status.terminating = Some(self.terminating);
        self.phase = Phase::Track;
    }

    pub(super) fn queue_write(&mut self, kind: WriteKind) {
        let status = Box::new(self.status.clone());
        self.push_io(Step::UpdateStatus { status }, Awaiting::Write(kind));
    }

    pub(super) fn on_write(&mut self, kind: WriteKind, result: Result<(), String>) {
        if let Err(e) = result {
            self.done(Some(SyncError::StatusUpdate(e)));
            return;
        }
        self.outcome.status_written = Some(Box::new(self.status.clone()));
        match kind {
            WriteKind::Flush => {
                // Upstream keeps its records in memory and stores every one; kjob's live in
                // kjob-queue, so a record equal to the one this sync started from (an absent
                // record reads as the default: no failures since the last success) is not
                // written again: a Job whose pods all succeed never writes one.
                if let Some(record) = self.new_backoff.take()
                    && record != self.input.backoff.cloned().unwrap_or_default()
                {
                    self.outcome.backoff = BackoffUpdate::Put(record);
                }
                self.record_pods_finished();
                self.needs_flush = false;
            }
            WriteKind::AfterRemovalError => {
                let err = self.removal_error.take();
                self.done(err);
            }
            WriteKind::Final => {
                if self.job_finished {
                    self.record_job_finished();
                }
                self.record_pods_finished();
                let err = self.manage_error.take();
                self.done(err);
            }
        }
    }

    /// Upstream `enactJobFinished` and the last write.
    pub(super) fn enact(&mut self) {
        self.phase = Phase::Over;
        if !self.reached_max_uncounted && self.enact_job_finished() {
            self.job_finished = true;
            self.needs_flush = true;
        }
        if self.needs_flush {
            self.queue_write(WriteKind::Final);
        } else {
            let err = self.manage_error.take();
            self.done(err);
        }
    }

    fn enact_job_finished(&mut self) -> bool {
        let Some(fc) = self.finished_condition.clone() else { return false };
        let uncounted = self.status.uncounted_terminated_pods.as_ref();
        let pending = uncounted.map_or(0, |u| {
            u.succeeded.as_ref().map_or(0, Vec::len) + u.failed.as_ref().map_or(0, Vec::len)
        });
        if pending > 0 || self.terminating > 0 {
            return false;
        }
        if self.status.start_time.is_none() {
            // A Job suspended (start time cleared) whose last tracked pods finish anyway would
            // otherwise be written finished without a start time, which the API server rejects
            // forever. kjob deviation from upstream: stamp the start time at the finish.
            self.status.start_time = Some(Time(self.input.now));
        }
        let conditions = self.status.conditions.get_or_insert_with(Vec::new);
        cond::ensure_status(
            conditions,
            &fc.type_,
            &fc.status,
            reason(&fc),
            message(&fc),
            self.input.now,
        );
        if fc.type_ == cond::COMPLETE {
            self.status.completion_time = fc.last_transition_time.clone();
        }
        true
    }

    /// Upstream `recordJobFinished`: events and `jobs_finished_total`.
    fn record_job_finished(&mut self) {
        let Some(fc) = self.finished_condition.as_ref() else { return };
        self.outcome.finished = true;
        if fc.type_ == cond::COMPLETE {
            if let Some(c) = job::completions(self.job())
                && self.status.succeeded.unwrap_or(0) > c
            {
                self.outcome.events.push(events::too_many_succeeded_pods());
            }
            self.outcome.events.push(events::completed());
            self.metrics.job_finished =
                Some(m::JobFinished { result: m::SUCCEEDED, reason: reason(fc).to_string() });
        } else {
            self.outcome.events.push(events::job_failed(reason(fc), message(fc)));
            self.metrics.job_finished =
                Some(m::JobFinished { result: m::FAILED, reason: reason(fc).to_string() });
        }
    }

    /// Upstream `recordJobPodFinished`: counter increments since the last recorded write.
    fn record_pods_finished(&mut self) {
        let st = &self.status;
        let succeeded_diff: i64;
        if self.indexed {
            let completions = self.completions();
            let now_completed = st.completed_indexes.clone().unwrap_or_default();
            succeeded_diff = if now_completed != self.old_completed_indexes {
                policy::count_indexes(&now_completed, completions) as i64
                    - policy::count_indexes(&self.old_completed_indexes, completions) as i64
            } else {
                0
            };
            self.metrics.finished_indexes_succeeded += succeeded_diff.max(0) as u64;
            if job::has_backoff_limit_per_index(self.job())
                && st.failed_indexes != self.old_failed_indexes
            {
                let new = st
                    .failed_indexes
                    .as_deref()
                    .map_or(0, |s| policy::count_indexes(s, completions))
                    as i64;
                let old = self
                    .old_failed_indexes
                    .as_deref()
                    .map_or(0, |s| policy::count_indexes(s, completions))
                    as i64;
                self.metrics.finished_indexes_failed += (new - old).max(0) as u64;
            }
        } else {
            succeeded_diff = i64::from(st.succeeded.unwrap_or(0)) - i64::from(self.old_succeeded);
        }
        self.metrics.pods_finished_succeeded += succeeded_diff.max(0) as u64;
        let failed_diff = i64::from(st.failed.unwrap_or(0)) - i64::from(self.old_failed);
        self.metrics.pods_finished_failed += failed_diff.max(0) as u64;
        self.old_succeeded = st.succeeded.unwrap_or(0);
        self.old_failed = st.failed.unwrap_or(0);
        self.old_completed_indexes = st.completed_indexes.clone().unwrap_or_default();
        self.old_failed_indexes = st.failed_indexes.clone();
    }
}

pub(super) fn reason(c: &JobCondition) -> &str {
    c.reason.as_deref().unwrap_or("")
}

pub(super) fn message(c: &JobCondition) -> &str {
    c.message.as_deref().unwrap_or("")
}

pub(super) fn failure_target(reason: &str, message: &str, now: Timestamp) -> JobCondition {
    cond::new_condition(cond::FAILURE_TARGET, cond::TRUE, reason, message, now)
}

/// Upstream `newFailedConditionForFailureTarget`.
pub(super) fn failed_from_target(target: &JobCondition, now: Timestamp) -> JobCondition {
    cond::new_condition(cond::FAILED, cond::TRUE, reason(target), message(target), now)
}
