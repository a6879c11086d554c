//! Upstream `trackJobStatusAndRemoveFinalizers`: record finished pods in
//! `uncountedTerminatedPods` (or the completed indexes), remove their tracking finalizers, then
//! move them into the counters (`cleanUncountedPodsWithoutFinalizers`).

use std::collections::HashSet;

use k8s_openapi::api::batch::v1::JobStatus;
use k8s_openapi::api::core::v1::Pod;

use super::policy::{self, IndexSet};
use super::status::{failed_from_target, message, reason};
use super::{
    Awaiting, CallError, Expectations, JobSync, MAX_UNCOUNTED_PODS, Phase, PodFacts, Step,
    SyncError, WriteKind, pod_ref,
};
use crate::conditions as cond;
use crate::{job, pod};

impl<'a> JobSync<'a> {
    /// Upstream `trackJobStatusAndRemoveFinalizers` up to write #1.
    pub(super) fn track(&mut self) {
        let job = self.job();
        let all = self.input.pods;
        let mut order: Vec<usize> = (0..all.len()).collect();
        if self.indexed {
            // Completed indexes are introduced in order (stable, so ties keep list order).
            order.sort_by_key(|&i| self.index_of(i).unwrap_or(-1));
        }
        // Only uncounted UIDs are ever looked up here, so only those are collected: the set stays
        // small however many pods the Job has.
        let mut with_finalizer = HashSet::with_capacity(
            self.uncounted_succeeded.len() + self.uncounted_failed.len() + MAX_UNCOUNTED_PODS,
        );
        if !self.uncounted_succeeded.is_empty() || !self.uncounted_failed.is_empty() {
            for (p, f) in all.iter().zip(&self.facts) {
                if !f.tracked {
                    continue;
                }
                let uid = pod::uid(p);
                if self.uncounted_succeeded.contains(uid) || self.uncounted_failed.contains(uid) {
                    with_finalizer.insert(uid);
                }
            }
        }
        self.uids_with_finalizer = with_finalizer;
        if clean_uncounted(&mut self.status, &self.uids_with_finalizer) {
            self.needs_flush = true;
        }
        let finishing_with_failure =
            self.finished_condition.as_ref().is_some_and(|c| c.type_ != cond::SUCCESS_CRITERIA_MET);
        let mut new_indexes: Vec<i32> = Vec::new();
        let mut new_succeeded_uids: Vec<String> = Vec::new();
        let mut new_failed_uids: Vec<String> = Vec::new();
        let uncounted = self.status.uncounted_terminated_pods.clone().unwrap_or_default();
        let base_succeeded = uncounted.succeeded.as_ref().map_or(0, Vec::len);
        let base_failed = uncounted.failed.as_ref().map_or(0, Vec::len);
        for i in order {
            let pod = all.pod(i);
            let f = self.facts[i];
            if !f.tracked {
                continue;
            }
            let consider_failed = f.failed;
            if !self.can_remove_finalizer(pod, &f) {
                continue;
            }
            self.pods_to_remove_finalizer.push(pod);
            let uid = pod::uid(pod);
            if f.succeeded && !self.uncounted_failed.contains(uid) {
                if self.indexed {
                    // The index alone prevents double counting; no UID bookkeeping.
                    if let Some(ix) = self.index_of(i)
                        && ix < self.completions()
                        && !self.prev_succeeded_indexes.contains(ix)
                    {
                        new_indexes.push(ix);
                        self.needs_flush = true;
                    }
                } else if !self.uncounted_succeeded.contains(uid) {
                    self.needs_flush = true;
                    self.uids_with_finalizer.insert(uid);
                    new_succeeded_uids.push(uid.to_string());
                }
            } else if (consider_failed || finishing_with_failure)
                && !self.uncounted_failed.contains(uid)
                && self.countable_index(i)
            {
                // When the Job is failing, every unfinished tracked pod counts as failed.
                let (counts, action) = policy::failure_policy_outcome(job, pod);
                if let Some(action) = action {
                    *self.metrics.pod_failures_by_policy_action.entry(action).or_insert(0) += 1;
                }
                if counts {
                    self.needs_flush = true;
                    self.uids_with_finalizer.insert(uid);
                    new_failed_uids.push(uid.to_string());
                }
            }
            let total = new_indexes.len()
                + base_succeeded
                + new_succeeded_uids.len()
                + base_failed
                + new_failed_uids.len();
            if total >= MAX_UNCOUNTED_PODS {
                // Keep status small and let smaller Jobs have their turn; the writes requeue us.
                self.reached_max_uncounted = true;
                break;
            }
        }
        let list = self.status.uncounted_terminated_pods.get_or_insert_with(Default::default);
        if !new_succeeded_uids.is_empty() {
            list.succeeded.get_or_insert_with(Vec::new).extend(new_succeeded_uids);
        }
        if !new_failed_uids.is_empty() {
            list.failed.get_or_insert_with(Vec::new).extend(new_failed_uids);
        }
        if self.indexed {
            self.succeeded_indexes =
                self.succeeded_indexes.with_indexes(new_indexes.iter().copied());
            let completed = self.succeeded_indexes.to_string();
            if completed != self.status.completed_indexes.as_deref().unwrap_or("") {
                self.needs_flush = true;
            }
            self.status.succeeded = Some(self.succeeded_indexes.total() as i32);
            self.status.completed_indexes = Some(completed);
            let failed = self.failed_indexes.as_ref().map(IndexSet::to_string);
            if self.status.failed_indexes != failed {
                self.status.failed_indexes = failed;
                self.needs_flush = true;
            }
        }
        let now = self.input.now;
        if let Some(fc) = self.finished_condition.take() {
            let conditions = self.status.conditions.get_or_insert_with(Vec::new);
            let next = if fc.type_ == cond::FAILURE_TARGET {
                // Record the verdict before any finalizer goes, so a crash cannot lose it.
                conditions.push(fc.clone());
                self.needs_flush = true;
                failed_from_target(&fc, now)
            } else if fc.type_ == cond::SUCCESS_CRITERIA_MET {
                if !cond::has_true(conditions, cond::SUCCESS_CRITERIA_MET) {
                    conditions.push(fc.clone());
                    self.needs_flush = true;
                }
                cond::new_condition(cond::COMPLETE, cond::TRUE, reason(&fc), message(&fc), now)
            } else {
                fc
            };
            self.finished_condition = Some(next);
        }
        self.phase = Phase::RemoveFinalizers;
        if self.needs_flush {
            self.queue_write(WriteKind::Flush);
        }
    }

    /// Upstream `canRemoveFinalizer`.
    fn can_remove_finalizer(&self, pod: &Pod, f: &PodFacts) -> bool {
        if job::is_job_deleting(self.job()) || self.finished_condition.is_some() || f.succeeded {
            return true;
        }
        if !f.failed {
            return false;
        }
        if job::has_backoff_limit_per_index(self.job())
            && let Some(ix) = f.index
            && let Some(held) = self.delayed_deletion.get(&ix)
            && pod::uid(held) == pod::uid(pod)
        {
            // Kept until its replacement exists, so the failure count can be copied over.
            return false;
        }
        true
    }

    pub(super) fn remove_finalizers(&mut self) {
        self.phase = Phase::AfterRemoval;
        if self.pods_to_remove_finalizer.is_empty() {
            return;
        }
        let pods = std::mem::take(&mut self.pods_to_remove_finalizer);
        let uids = pods.iter().map(|p| pod::uid(p).to_string()).collect();
        self.queue.push_back(Step::Expectations(Expectations::ExpectFinalizerRemovals {
            pod_uids: uids,
        }));
        let refs = pods.iter().map(|p| pod_ref(p)).collect();
        self.push_io(Step::RemoveFinalizers { pods: refs }, Awaiting::Finalizers(pods));
    }

    pub(super) fn on_finalizers_removed(
        &mut self,
        pods: &[&'a Pod],
        results: Vec<Result<(), CallError>>,
    ) {
        let mut failed_uids = Vec::new();
        for (pod, result) in pods.iter().zip(results) {
            let uid = pod::uid(pod);
            match result {
                Ok(()) => {
                    self.uids_with_finalizer.remove(uid);
                }
                Err(e) => {
                    // No pod update will ever show this removal.
                    failed_uids.push(uid.to_string());
                    if matches!(e, CallError::NotFound) {
                        self.uids_with_finalizer.remove(uid);
                    } else {
                        self.removal_error
                            .get_or_insert(SyncError::RemoveFinalizers(e.to_string()));
                    }
                }
            }
        }
        if !failed_uids.is_empty() {
            self.queue.push_back(Step::Expectations(Expectations::FinalizerRemovalsFailed {
                pod_uids: failed_uids,
            }));
        }
    }

    pub(super) fn after_removal(&mut self) {
        if clean_uncounted(&mut self.status, &self.uids_with_finalizer) {
            self.needs_flush = true;
        }
        if self.removal_error.is_some() {
            if self.needs_flush {
                self.phase = Phase::Over;
                self.queue_write(WriteKind::AfterRemovalError);
            } else {
                let err = self.removal_error.take();
                self.done(err);
            }
            return;
        }
        self.phase = Phase::Enact;
    }
}

/// Upstream `cleanUncountedPodsWithoutFinalizers`: UIDs whose finalizer is provably gone move
/// from the uncounted lists into the counters. Returns whether anything moved.
fn clean_uncounted(status: &mut JobStatus, with_finalizer: &HashSet<&str>) -> bool {
    let Some(list) = status.uncounted_terminated_pods.as_mut() else { return false };
    let mut moved = false;
    for (uids, counter) in
        [(&mut list.succeeded, &mut status.succeeded), (&mut list.failed, &mut status.failed)]
    {
        let Some(v) = uids.as_mut() else { continue };
        let before = v.len();
        v.retain(|uid| with_finalizer.contains(uid.as_str()));
        let gone = before - v.len();
        if gone > 0 {
            moved = true;
            *counter = Some(counter.unwrap_or(0) + gone as i32);
        }
        if v.is_empty() {
            *uids = None;
        }
    }
    moved
}
