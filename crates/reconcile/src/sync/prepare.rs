//! Steps 7–15 of upstream `syncJob`, before anything is written: the one pass over the pods
//! (counts, indexes, newly finished pods), the start time, the backoff record, and the finish
//! criteria (failure target, pod failure policy, backoff limit, active deadline, failed indexes,
//! success policy).

use std::collections::{BTreeMap, HashSet};

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::UncountedTerminatedPods;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::policy::{self, IndexSet};
use super::status::{failed_from_target, failure_target};
use super::{JobSync, PodFacts, min_requeue, uid_set};
use crate::conditions as cond;
use crate::summary::PodPhase;
use crate::{job, pod};

impl<'a> JobSync<'a> {
    /// `status.failedIndexes` plus the indexes newly failed by tracked pods (upstream
    /// `calculateFailedIndexes`), reading the Pod objects of failed pods only.
    fn failed_indexes_now(&self) -> IndexSet {
        let job = self.job();
        let completions = self.completions();
        let prev = IndexSet::parse_opt(
            job.status.as_ref().and_then(|s| s.failed_indexes.as_deref()),
            completions,
        );
        let mut new: Vec<i32> = self
            .input
            .pods
            .iter()
            .zip(&self.facts)
            .filter_map(|(pod, f)| {
                let ix = f.index.filter(|ix| *ix < completions)?;
                (f.failed && f.finalizer && policy::is_index_failed(job, pod)).then_some(ix)
            })
            .collect();
        new.sort_unstable();
        prev.merge(&IndexSet::from_sorted(&new))
    }

    /// The last failed pod per pending index whose finalizer removal waits for its replacement
    /// (upstream `getPodsWithDelayedDeletionPerIndex`), reading the Pod objects of failed pods
    /// only.
    fn delayed_deletion_now(&self, failed_indexes: &IndexSet) -> BTreeMap<i32, &'a Pod> {
        let completions = self.completions();
        let candidates = self.input.pods.iter().zip(&self.facts).filter_map(|(pod, f)| {
            let ix = f.index.filter(|ix| *ix < completions)?;
            (f.tracked && f.failed).then_some((ix, pod))
        });
        policy::delayed_deletion_among(
            candidates,
            &self.succeeded_indexes,
            failed_indexes,
            &self.active_valid_indexes,
        )
    }

    /// Steps 7–15 of upstream `syncJob`: counts, start time, backoff record, finish criteria.
    pub(super) fn prepare(&mut self) {
        let job = self.job();
        let pods = self.input.pods;
        let now = self.input.now;
        let uncounted = self
            .status
            .uncounted_terminated_pods
            .get_or_insert_with(UncountedTerminatedPods::default);
        self.uncounted_succeeded = uid_set(uncounted.succeeded.as_ref());
        self.uncounted_failed = uid_set(uncounted.failed.as_ref());

        // The only pass over every pod, and it reads the dense summaries: the Pod objects
        // themselves are only read for the pods a step names (capped per sync) and for UID
        // lookups when some are in flight or uncounted.
        let mut new_succeeded: Vec<usize> = Vec::new();
        let mut new_failed: Vec<usize> = Vec::new();
        let mut active_pods = Vec::with_capacity(pods.len());
        let (mut ready, mut terminating) = (0, 0);
        let completions = self.completions();
        let in_flight = self.input.finalizer_removals_in_flight;
        let mut facts = Vec::with_capacity(pods.len());
        let mut active_index = Vec::new();
        let mut active_positions = Vec::new();
        let mut active_valid = Vec::new();
        let mut terminating_valid = Vec::new();
        let mut new_completed = Vec::new();
        let only_replace_failed = job::only_replace_failed_pods(job);
        let on_failure = job::restarts_on_failure(job);
        let mut restarts: i64 = 0;
        for (i, (pod, s)) in pods.iter().zip(self.summaries.iter()).enumerate() {
            let index = if self.indexed { s.index } else { None };
            let valid = index.filter(|ix| *ix < completions);
            let finalizer = s.finalizer;
            let f = PodFacts {
                index,
                finalizer,
                tracked: finalizer && (in_flight.is_empty() || !in_flight.contains(pod::uid(pod))),
                succeeded: s.phase == PodPhase::Succeeded,
                failed: s.is_failed(only_replace_failed),
            };
            facts.push(f);
            if on_failure && matches!(s.phase, PodPhase::Running | PodPhase::Pending) {
                restarts += s.restarts_total;
            }
            if s.is_active() {
                active_pods.push(pod);
                ready += i32::from(s.key.is_ready());
                active_positions.push(i as u32);
                if self.indexed {
                    active_index.push(index);
                    match valid {
                        Some(ix) => active_valid.push(ix),
                        // Invalid indexes make manageJob delete pods even when the count is
                        // right; duplicates are found once the valid ones are sorted.
                        None => self.active_needs_dedup = true,
                    }
                }
            } else if s.is_terminating() {
                terminating += 1;
                terminating_valid.extend(valid);
            }
            // calculateSucceededIndexes: Succeeded pods still carrying the finalizer.
            if let Some(ix) = valid
                && f.succeeded
                && f.finalizer
            {
                new_completed.push(ix);
            }
            // getNewFinishedPods: tracked pods not yet in the uncounted lists.
            if !f.tracked || (self.indexed && valid.is_none()) {
                continue;
            }
            let uncounted = |set: &HashSet<String>| !set.is_empty() && set.contains(pod::uid(pod));
            if f.succeeded && !uncounted(&self.uncounted_succeeded) {
                new_succeeded.push(i);
            }
            if f.failed && !uncounted(&self.uncounted_failed) {
                new_failed.push(i);
            }
        }
        // Pods come in index order most of the time, which these sorts handle in linear time.
        active_valid.sort_unstable();
        if active_valid.windows(2).any(|w| w[0] == w[1]) {
            self.active_needs_dedup = true;
        }
        terminating_valid.sort_unstable();
        new_completed.sort_unstable();
        self.facts = facts;
        self.active_index = active_index;
        self.active_positions = active_positions;
        self.active_valid_indexes = active_valid;
        self.terminating_indexes = terminating_valid;
        self.active = active_pods.len() as i32;
        self.active_pods = active_pods;
        self.ready = ready;
        self.terminating = terminating;
        let non_ignored =
            new_failed.iter().filter(|&&i| policy::policy_counts_failure(job, pods.pod(i))).count();
        self.succeeded = self.status.succeeded.unwrap_or(0)
            + new_succeeded.len() as i32
            + self.uncounted_succeeded.len() as i32;
        self.failed = self.status.failed.unwrap_or(0)
            + non_ignored as i32
            + self.uncounted_failed.len() as i32;

        if self.status.start_time.is_none() && !job::is_suspended(job) {
            self.status.start_time = Some(Time(now));
        }
        let finished_at =
            |i: &usize| self.summaries[*i].finished_at.unwrap_or(Timestamp::UNIX_EPOCH);
        self.new_backoff = Some(policy::new_backoff_record(
            self.input.backoff,
            new_succeeded.iter().map(finished_at),
            new_failed.iter().map(finished_at),
        ));

        // Finish criteria, in upstream order: earlier verdicts stick.
        let conditions = self.status.conditions.as_deref().unwrap_or(&[]);
        let success_met =
            cond::find(conditions, cond::SUCCESS_CRITERIA_MET).filter(|c| c.status == cond::TRUE);
        self.finished_condition = success_met.cloned();
        if self.finished_condition.is_none() {
            let target =
                cond::find(conditions, cond::FAILURE_TARGET).filter(|c| c.status == cond::TRUE);
            if let Some(target) = target {
                self.finished_condition = Some(failed_from_target(target, now));
            } else if let Some(msg) = policy::fail_job_message(
                job,
                pods.iter().zip(&self.facts).filter(|(_, f)| f.failed).map(|(p, _)| p),
            ) {
                self.finished_condition = Some(cond::new_condition(
                    cond::FAILURE_TARGET,
                    cond::TRUE,
                    cond::REASON_POD_FAILURE_POLICY,
                    &msg,
                    now,
                ));
            }
        }
        if self.finished_condition.is_none() {
            let start = self.status.start_time.as_ref().map(|t| t.0);
            if self.failed > job::backoff_limit(job)
                || (on_failure && job::restarts_past_backoff_limit(job, restarts))
            {
                self.finished_condition = Some(failure_target(
                    cond::REASON_BACKOFF_LIMIT_EXCEEDED,
                    cond::MSG_BACKOFF_LIMIT_EXCEEDED,
                    now,
                ));
            } else if job::past_active_deadline(job, start, now) {
                self.finished_condition = Some(failure_target(
                    cond::REASON_DEADLINE_EXCEEDED,
                    cond::MSG_DEADLINE_EXCEEDED,
                    now,
                ));
            } else if let (Some(ads), Some(start), false) =
                (job::active_deadline(job), start, job::is_suspended(job))
            {
                // Wake up exactly when the deadline passes.
                let left = ads.saturating_sub(job::elapsed_since(start, now));
                self.outcome.requeue_after = min_requeue(self.outcome.requeue_after, left);
            }
        }

        if self.indexed {
            let prev = IndexSet::parse_opt(
                job.status.as_ref().and_then(|s| s.completed_indexes.as_deref()),
                completions,
            );
            self.succeeded_indexes = prev.merge(&IndexSet::from_sorted(&new_completed));
            self.prev_succeeded_indexes = prev;
            self.succeeded = self.succeeded_indexes.total() as i32;
            if job::has_backoff_limit_per_index(job) {
                let failed_indexes = self.failed_indexes_now();
                if self.finished_condition.is_none() {
                    let max_failed = job.spec.as_ref().and_then(|s| s.max_failed_indexes);
                    let nfailed = failed_indexes.total();
                    if max_failed.is_some_and(|mx| nfailed > mx.max(0) as usize) {
                        self.finished_condition = Some(failure_target(
                            cond::REASON_MAX_FAILED_INDEXES_EXCEEDED,
                            cond::MSG_MAX_FAILED_INDEXES_EXCEEDED,
                            now,
                        ));
                    } else if nfailed > 0
                        && nfailed + self.succeeded_indexes.total()
                            >= self.completions().max(0) as usize
                    {
                        self.finished_condition = Some(failure_target(
                            cond::REASON_FAILED_INDEXES,
                            cond::MSG_FAILED_INDEXES,
                            now,
                        ));
                    }
                }
                self.delayed_deletion = self.delayed_deletion_now(&failed_indexes);
                self.failed_indexes = Some(failed_indexes);
            }
            if self.finished_condition.is_none()
                && let Some(msg) = policy::success_policy_message(job, &self.succeeded_indexes)
            {
                self.finished_condition = Some(cond::new_condition(
                    cond::SUCCESS_CRITERIA_MET,
                    cond::TRUE,
                    cond::REASON_SUCCESS_POLICY,
                    &msg,
                    now,
                ));
            }
        }
    }
}
