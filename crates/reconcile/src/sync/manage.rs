//! Steps 16–17 of upstream `syncJob`: delete every active pod when the Job is finishing, else
//! `manageJob`: delete surplus pods, or create missing ones in slow-start batches.

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::policy::{self, IndexSet};
use super::{
    Awaiting, CallError, Creation, Expectations, JobSync, MAX_POD_CREATE_DELETE_PER_SYNC, Phase,
    SLOW_START_INITIAL_BATCH_SIZE, SYNC_JOB_BATCH_PERIOD, Step, SyncError, min_requeue, pod_ref,
};
use crate::events;
use crate::metrics as m;
use crate::{job, pod};

impl<'a> JobSync<'a> {
    /// Step 16/17 of upstream `syncJob`: delete everything when finishing, else manageJob.
    pub(super) fn start(&mut self) {
        if self.finished_condition.is_some() {
            self.phase = Phase::AfterManage;
            self.finishing = true;
            if self.active_pods.is_empty() {
                self.on_finishing_deletes(&[], Vec::new());
            } else {
                let pods = self.active_pods.clone();
                let refs = pods.iter().map(|p| pod_ref(p)).collect();
                self.push_io(
                    Step::DeletePods { pods: refs, remove_finalizer: false },
                    Awaiting::FinishingDeletes(pods),
                );
            }
            return;
        }
        self.phase = Phase::AfterManage;
        if self.input.expectations_satisfied && !job::is_job_deleting(self.job()) {
            self.manage_called = true;
            self.manage_job();
        }
    }

    pub(super) fn on_finishing_deletes(
        &mut self,
        pods: &[&'a Pod],
        results: Vec<Result<(), CallError>>,
    ) {
        let mut deleted = 0;
        let mut deleted_ready = 0;
        for (pod, result) in pods.iter().zip(results) {
            match result {
                Ok(()) => {
                    deleted += 1;
                    self.outcome.events.push(events::deleted(pod::name(pod)));
                }
                Err(CallError::NotFound) => deleted += 1,
                Err(e) => {
                    self.outcome.events.push(events::failed_delete(&e.to_string()));
                    self.manage_error.get_or_insert(SyncError::DeletePods(e.to_string()));
                }
            }
            // Upstream counts a ready pod as removed even when its delete failed.
            if policy::is_ready(pod) {
                deleted_ready += 1;
            }
        }
        if deleted != self.active || !self.input.expectations_satisfied {
            // Pods or finalizers may remain that we have not seen: decide again next sync.
            self.finished_condition = None;
        }
        self.active -= deleted;
        self.terminating += deleted;
        self.ready -= deleted_ready;
    }

    /// Upstream `manageJob`: queue deletes or creates (never both).
    fn manage_job(&mut self) {
        let job = self.job();
        if job::is_suspended(job) {
            let pods = self.active_pods_for_removal(self.active_pods.len());
            self.metrics.action = m::ACTION_PODS_DELETED;
            self.queue_manage_deletes(pods);
            return;
        }
        let parallelism = job::parallelism(job);
        let want = match job::completions(job) {
            None if self.succeeded > 0 => self.active,
            None => parallelism,
            Some(c) => (c - self.succeeded).min(parallelism).max(0),
        };
        let rm_at_least = (self.active - want).max(0) as usize;
        let mut to_delete = if rm_at_least == 0 && !self.active_needs_dedup {
            Vec::new()
        } else {
            self.active_pods_for_removal(rm_at_least)
        };
        to_delete.truncate(MAX_POD_CREATE_DELETE_PER_SYNC);
        if !to_delete.is_empty() {
            self.metrics.action = m::ACTION_PODS_DELETED;
            self.queue_manage_deletes(to_delete);
            return;
        }
        let terminating = if job::only_replace_failed_pods(job) { self.terminating } else { 0 };
        let diff = want - terminating - self.active;
        if diff <= 0 {
            self.metrics.action = m::ACTION_TRACKING;
            return;
        }
        self.metrics.action = m::ACTION_PODS_CREATED;
        let now = self.input.now;
        if !job::has_backoff_limit_per_index(job) {
            let left = self
                .new_backoff
                .as_ref()
                .map_or(Duration::ZERO, |r| policy::backoff_remaining(r, now));
            if !left.is_zero() {
                self.outcome.requeue_after =
                    min_requeue(self.outcome.requeue_after, left.max(SYNC_JOB_BATCH_PERIOD));
                return;
            }
        }
        let diff = (diff as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
        let mut templates = VecDeque::new();
        if self.indexed {
            // firstPendingIndexes over the indexes gathered in `prepare`.
            let mut non_pending =
                self.succeeded_indexes.merge(&IndexSet::from_sorted(&self.active_valid_indexes));
            if job::only_replace_failed_pods(job) {
                non_pending = non_pending.merge(&IndexSet::from_sorted(&self.terminating_indexes));
            }
            if let Some(failed) = self.failed_indexes.as_ref() {
                non_pending = non_pending.merge(failed);
            }
            let mut indexes = policy::first_pending_outside(&non_pending, self.completions(), diff);
            if job::has_backoff_limit_per_index(job) {
                let (now_ready, left) =
                    policy::indexes_ready_to_create(&indexes, &self.delayed_deletion, now);
                if now_ready.is_empty() && !left.is_zero() {
                    self.outcome.requeue_after =
                        min_requeue(self.outcome.requeue_after, left.max(SYNC_JOB_BATCH_PERIOD));
                    return;
                }
                indexes = now_ready;
            }
            for ix in indexes {
                templates.push_back((Some(ix), self.delayed_deletion.get(&ix).copied()));
            }
        } else {
            templates.extend(std::iter::repeat_n((None, None), diff));
        }
        if templates.is_empty() {
            return;
        }
        let n = templates.len();
        self.queue.push_back(Step::Expectations(Expectations::Set { add: n as u32, del: 0 }));
        self.active += n as i32;
        self.creation = Creation {
            // The base template (env var, finalizer) is built once, as upstream does.
            base: crate::template::base_pod_template(job),
            pods: templates,
            batch: n.min(SLOW_START_INITIAL_BATCH_SIZE),
            metric_succeeded: 0,
            metric_failed: 0,
            reason: self.creation_reason(),
        };
        self.phase = Phase::Creating;
    }

    /// Upstream `activePodsForRemoval` over the keys and indexes gathered in `prepare`.
    fn active_pods_for_removal(&self, rm_at_least: usize) -> Vec<&'a Pod> {
        let indexes = self.indexed.then_some(self.active_index.as_slice());
        let summaries = &self.summaries;
        let key = |i: usize| summaries[self.active_positions[i] as usize].key;
        policy::active_pods_for_removal_with(
            self.job(),
            self.active_positions.len(),
            key,
            indexes,
            rm_at_least,
        )
        .into_iter()
        .map(|i| self.active_pods[i])
        .collect()
    }

    /// `reason` label of `job_pods_creation_total` (upstream `recordJobPodsCreationTotal`).
    fn creation_reason(&self) -> &'static str {
        if job::only_replace_failed_pods(self.job()) && self.failed > 0 {
            m::POD_RECREATE_FAILED
        } else if self.failed > 0 || self.terminating > 0 {
            m::POD_RECREATE_TERMINATING_OR_FAILED
        } else {
            m::POD_CREATE_NEW
        }
    }

    fn queue_manage_deletes(&mut self, pods: Vec<&'a Pod>) {
        if pods.is_empty() {
            return;
        }
        self.queue
            .push_back(Step::Expectations(Expectations::Set { add: 0, del: pods.len() as u32 }));
        let refs = pods.iter().map(|p| pod_ref(p)).collect();
        self.push_io(
            Step::DeletePods { pods: refs, remove_finalizer: true },
            Awaiting::ManageDeletes(pods),
        );
    }

    pub(super) fn on_manage_deletes(
        &mut self,
        pods: &[&'a Pod],
        results: Vec<Result<(), CallError>>,
    ) {
        let mut removed = 0;
        let mut removed_ready = 0;
        let mut unobserved = 0u32;
        for (pod, result) in pods.iter().zip(results) {
            let patched = !matches!(result, Err(CallError::FinalizerPatch(_)));
            match result {
                Ok(()) => {
                    removed += 1;
                    self.outcome.events.push(events::deleted(pod::name(pod)));
                }
                Err(CallError::NotFound) => {
                    // Gone already: counts as removed, but no delete event will be observed.
                    removed += 1;
                    unobserved += 1;
                }
                Err(e @ CallError::FinalizerPatch(_)) => {
                    unobserved += 1;
                    self.manage_error.get_or_insert(SyncError::DeletePods(e.to_string()));
                }
                Err(e) => {
                    unobserved += 1;
                    self.outcome.events.push(events::failed_delete(&e.to_string()));
                    self.manage_error.get_or_insert(SyncError::DeletePods(e.to_string()));
                }
            }
            // Upstream counts a ready pod as removed once its finalizer patch passed, even if
            // the delete then failed.
            if patched && policy::is_ready(pod) {
                removed_ready += 1;
            }
        }
        if unobserved > 0 {
            self.queue
                .push_back(Step::Expectations(Expectations::Lower { add: 0, del: unobserved }));
        }
        self.active -= removed;
        self.terminating += removed;
        self.ready -= removed_ready;
    }

    pub(super) fn next_create_batch(&mut self) {
        let n = self.creation.batch.min(self.creation.pods.len());
        if n == 0 {
            self.end_creation();
            return;
        }
        let job = self.job();
        let base = &self.creation.base;
        let batch: Vec<Pod> = self
            .creation
            .pods
            .drain(..n)
            .map(|(ix, replaced)| crate::template::pod_from_template(job, base, ix, replaced))
            .collect();
        self.push_io(Step::CreatePods { pods: batch }, Awaiting::Creates(n));
    }

    pub(super) fn on_creates(&mut self, results: Vec<Result<String, CallError>>) {
        let mut failures = 0u32;
        for result in results {
            match result {
                Ok(name) => {
                    self.creation.metric_succeeded += 1;
                    self.outcome.events.push(events::created(&name));
                }
                // All further creates would fail the same way; nothing to count or report.
                Err(CallError::NamespaceTerminating(_)) => {}
                Err(e) => {
                    failures += 1;
                    self.active -= 1;
                    self.creation.metric_failed += 1;
                    // Upstream increments the "succeeded" series for failed creates as well.
                    self.creation.metric_succeeded += 1;
                    self.outcome.events.push(events::failed_create(&e.to_string()));
                    self.manage_error.get_or_insert(SyncError::CreatePods(e.to_string()));
                }
            }
        }
        let skipped = self.creation.pods.len() as u32;
        if failures > 0 && skipped > 0 {
            // Slow start: one failing batch means the rest would likely fail too.
            self.active -= skipped as i32;
            self.creation.pods.clear();
        }
        let lower = if failures > 0 { failures + skipped } else { 0 };
        if lower > 0 {
            self.queue.push_back(Step::Expectations(Expectations::Lower { add: lower, del: 0 }));
        }
        self.creation.batch = (self.creation.batch * 2).min(self.creation.pods.len());
        if self.creation.pods.is_empty() {
            self.end_creation();
        }
    }

    fn end_creation(&mut self) {
        let c = &self.creation;
        if c.metric_succeeded > 0 || c.metric_failed > 0 {
            self.metrics.pods_creation = Some(m::PodsCreation {
                reason: c.reason,
                succeeded: c.metric_succeeded,
                failed: c.metric_failed,
            });
        }
        self.phase = Phase::AfterManage;
    }
}
