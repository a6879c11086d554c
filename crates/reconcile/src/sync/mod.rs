//! The plan API: one upstream `syncJob` pass as a state machine the worker drives step by step.
//!
//! ```text
//! let mut sync = JobSync::new(input);
//! loop {
//!     match sync.next_step() {
//!         Step::Expectations(op)          => apply op to the shared expectations store,
//!         Step::DeletePods { .. }         => issue the calls, then sync.report(Report::PodsDeleted(..)),
//!         Step::CreatePods { .. }         => issue the calls, then sync.report(Report::PodsCreated(..)),
//!         Step::RemoveFinalizers { .. }   => issue the patches, then sync.report(Report::FinalizersRemoved(..)),
//!         Step::UpdateStatus { .. }       => PUT /status, then sync.report(Report::StatusUpdated(..)),
//!         Step::Done(outcome)             => emit outcome.events, add outcome.metrics, persist the
//!                                            backoff record, finish the lease; stop.
//!     }
//! }
//! ```
//!
//! Every I/O step must be followed by exactly one [`JobSync::report`] with one result per pod,
//! in the order the step listed them. Expectation steps need no report. If the worker has to give
//! up mid-way (lease lost, expectations store unreachable), [`JobSync::abort`] returns the outcome
//! so far (events already earned, metrics) with the error.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::backoff::BackoffRecord;
use crate::conditions as cond;
use crate::events::{self, Event};
use crate::metrics::{self as m, MetricDeltas};
use crate::summary::{PodPhase, PodSummary};
use crate::{job, pod};

mod policy;

use policy::IndexSet;

/// Most pods recorded in `uncountedTerminatedPods` (plus new completed indexes) per sync.
pub const MAX_UNCOUNTED_PODS: usize = 500;
/// Most pods created or deleted per sync.
pub const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;
/// First slow-start create batch; each following batch doubles.
pub const SLOW_START_INITIAL_BATCH_SIZE: usize = 1;
pub use kjob_core::SYNC_JOB_BATCH_PERIOD;

/// Everything one sync reads. The pods are those the Job owns after adoption/release (upstream
/// `getPodsForJob`), read after the expectations were checked.
#[derive(Debug, Clone, Copy)]
pub struct SyncInput<'a> {
    /// The Job as read from the API server (GET), with its resourceVersion.
    pub job: &'a Job,
    /// The Job's pods (LIST by selector, claimed by controllerRef). Pods adopted in this sync
    /// must appear with the tracking finalizer added, as upstream assumes after `ClaimPods`.
    pub pods: &'a [Pod],
    /// The time of this sync; every timestamp the sync writes is this one.
    pub now: Timestamp,
    /// Whether the Job's create/delete expectations were satisfied when read (before listing pods).
    pub expectations_satisfied: bool,
    /// UIDs of pods whose tracking-finalizer removal is in flight (not yet observed).
    pub finalizer_removals_in_flight: &'a BTreeSet<String>,
    /// The persisted pod-failure backoff record of this Job, if any.
    pub backoff: Option<&'a BackoffRecord>,
    /// Name this controller answers to in `spec.managedBy`.
    pub controller_name: &'a str,
    /// Also reconcile Jobs without `spec.managedBy` (or naming the built-in controller).
    pub manage_all: bool,
}

/// A pod the worker must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Pod name (namespace is the Job's).
    pub name: String,
    /// Pod UID, to send as a precondition and to key finalizer expectations.
    pub uid: String,
}

/// A change to the Job's shared expectations (upstream `ControllerExpectations` and
/// `uidTrackingExpectations`), to apply before the step that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expectations {
    /// Replace the record with `add` expected creations and `del` expected deletions
    /// (upstream `ExpectCreations` / `ExpectDeletions`).
    Set {
        /// Pods about to be created.
        add: u32,
        /// Pods about to be deleted.
        del: u32,
    },
    /// Lower the record: these creations/deletions failed or were skipped and will never be
    /// observed (upstream `CreationObserved` / `DeletionObserved` on failure).
    Lower {
        /// Creations to forget.
        add: u32,
        /// Deletions to forget.
        del: u32,
    },
    /// Add these pod UIDs to the in-flight finalizer-removal set, before patching them.
    ExpectFinalizerRemovals {
        /// Pod UIDs.
        pod_uids: Vec<String>,
    },
    /// Drop these pod UIDs from the in-flight set: their patch failed, so no update will show it.
    FinalizerRemovalsFailed {
        /// Pod UIDs.
        pod_uids: Vec<String>,
    },
}

/// The next thing the worker must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Apply an expectations change; no report.
    Expectations(Expectations),
    /// Create these pods concurrently (one slow-start batch; `generateName` is set). Report
    /// [`Report::PodsCreated`].
    CreatePods {
        /// Pods to POST, in order.
        pods: Vec<Pod>,
    },
    /// Delete these pods concurrently. With `remove_finalizer`, first PATCH away the tracking
    /// finalizer (strategic merge `$deleteFromPrimitiveList/finalizers`) and skip the DELETE if
    /// that fails. Report [`Report::PodsDeleted`].
    DeletePods {
        /// Pods to delete, in order.
        pods: Vec<PodRef>,
        /// Remove the tracking finalizer before deleting (scale-down, suspend); without it the
        /// pods keep their finalizer and are counted as failed later (Job failing).
        remove_finalizer: bool,
    },
    /// PATCH away the tracking finalizer of these pods concurrently. Report
    /// [`Report::FinalizersRemoved`].
    RemoveFinalizers {
        /// Pods to patch, in order.
        pods: Vec<PodRef>,
    },
    /// Replace the Job's status (PUT `/status` with the latest resourceVersion the worker holds).
    /// Report [`Report::StatusUpdated`].
    UpdateStatus {
        /// The complete new status.
        status: Box<JobStatus>,
    },
    /// The sync is over.
    Done(Box<Outcome>),
}

/// Why one pod call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The pod (or for creates, something it needs) was not found (HTTP 404).
    #[error("not found")]
    NotFound,
    /// Create refused because the namespace is terminating (`NamespaceTerminating` cause).
    #[error("namespace is terminating: {0}")]
    NamespaceTerminating(String),
    /// The finalizer PATCH before a DELETE failed (the DELETE was not sent).
    #[error("removing completion finalizer: {0}")]
    FinalizerPatch(String),
    /// Any other failure (message as the API server or client gave it).
    #[error("{0}")]
    Other(String),
}

/// The results of the last I/O step, one per pod in the step's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Results of [`Step::CreatePods`]: the created pod's name, or the error.
    PodsCreated(Vec<Result<String, CallError>>),
    /// Results of [`Step::DeletePods`].
    PodsDeleted(Vec<Result<(), CallError>>),
    /// Results of [`Step::RemoveFinalizers`].
    FinalizersRemoved(Vec<Result<(), CallError>>),
    /// Result of [`Step::UpdateStatus`] (error message on failure, e.g. a 409 conflict).
    StatusUpdated(Result<(), String>),
}

/// What to do with the persisted pod-failure backoff record.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum BackoffUpdate {
    /// Leave it as it is.
    #[default]
    Keep,
    /// Store this record (written after a successful status write, as upstream).
    Put(BackoffRecord),
    /// Delete it (the Job is finished).
    Remove,
}

/// Why a sync did nothing at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// `spec.managedBy` names another controller.
    ManagedElsewhere,
    /// The Job already has `Complete=True` or `Failed=True`.
    Finished,
    /// `spec.completionMode` is neither NonIndexed nor Indexed (a warning event is emitted).
    UnknownCompletionMode,
}

/// Why a sync failed; the worker requeues the key rate-limited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// A status write failed.
    #[error("tracking status: {0}")]
    StatusUpdate(String),
    /// At least one pod create failed.
    #[error("creating pods: {0}")]
    CreatePods(String),
    /// At least one pod delete (or its finalizer patch) failed.
    #[error("deleting pods: {0}")]
    DeletePods(String),
    /// At least one finalizer removal failed.
    #[error("removing tracking finalizers: {0}")]
    RemoveFinalizers(String),
    /// The worker gave up mid-sync.
    #[error("aborted: {0}")]
    Aborted(String),
    /// The worker broke the step/report protocol (a bug in the caller).
    #[error("protocol misuse: {0}")]
    Protocol(String),
}

/// The result of one sync.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// Set when the sync did nothing at all.
    pub skipped: Option<Skipped>,
    /// Set when the sync failed: requeue rate-limited.
    pub error: Option<SyncError>,
    /// Sync again after this delay (deadline timer, pod-failure backoff); the earliest wins.
    pub requeue_after: Option<Duration>,
    /// Events not yet taken with [`JobSync::take_events`], in order.
    pub events: Vec<Event>,
    /// Metric increments; `None` when the sync returned before upstream starts its sync metrics.
    pub metrics: Option<MetricDeltas>,
    /// What to do with the persisted backoff record.
    pub backoff: BackoffUpdate,
    /// The Job got `Complete=True` or `Failed=True` in this sync.
    pub finished: bool,
    /// The last status successfully written in this sync, if any.
    pub status_written: Option<Box<JobStatus>>,
}

// ------------------------------------------------------------------------------------------------
// The engine.

/// What the engine waits for after handing out an I/O step.
#[derive(Debug)]
enum Awaiting<'a> {
    /// Deletes of active pods because the Job is finishing (finalizers kept).
    FinishingDeletes(Vec<&'a Pod>),
    /// Deletes by manageJob (finalizers removed first).
    ManageDeletes(Vec<&'a Pod>),
    /// One slow-start create batch of this many pods.
    Creates(usize),
    /// A status write.
    Write(WriteKind),
    /// Finalizer removals of these pods.
    Finalizers(Vec<&'a Pod>),
}

/// Which of the three upstream status writes is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// Write #1: new uncounted UIDs, completed indexes, interim conditions, counts.
    Flush,
    /// Write #2: partial progress after some finalizer removals failed.
    AfterRemovalError,
    /// Write #3: counters moved, maybe the terminal condition.
    Final,
}

/// Where the engine is in the upstream sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Decide between the finishing branch and manageJob.
    Start,
    /// Creating pods in slow-start batches.
    Creating,
    /// manageJob (or the finishing deletes) is over: completion and suspend conditions.
    AfterManage,
    /// Recording finished pods (trackJobStatusAndRemoveFinalizers up to write #1).
    Track,
    /// Removing finalizers.
    RemoveFinalizers,
    /// Counting released pods; write #2 on partial failure.
    AfterRemoval,
    /// enactJobFinished and write #3.
    Enact,
    /// `Done` was handed out.
    Over,
}

/// Slow-start state of pod creation.
#[derive(Debug, Default)]
struct Creation<'a> {
    /// The Job's pod template with what every pod gets (built once, as upstream does).
    base: PodTemplateSpec,
    /// Pods still to create, in order: the completion index (Indexed Jobs) and the failed pod
    /// it replaces, if any. Each Pod is built when its batch is handed out, so a 500-pod plan
    /// never holds 500 Pods at once and a batch that fails saves building the rest.
    pods: VecDeque<(Option<i32>, Option<&'a Pod>)>,
    /// Size of the next batch.
    batch: usize,
    /// Successful creates so far (upstream metric quirk: failures count here too).
    metric_succeeded: u64,
    /// Failed creates so far.
    metric_failed: u64,
    /// `job_pods_creation_total` reason label.
    reason: &'static str,
}

/// One upstream `syncJob` pass, driven by the worker step by step. See the module docs.
#[derive(Debug)]
pub struct JobSync<'a> {
    input: SyncInput<'a>,
    /// Working copy of the status, written by `UpdateStatus` steps.
    status: JobStatus,
    indexed: bool,
    /// Active pods, in input order.
    active_pods: Vec<&'a Pod>,
    active: i32,
    ready: i32,
    terminating: i32,
    /// Uncounted UIDs as read at the start of the sync.
    uncounted_succeeded: HashSet<String>,
    uncounted_failed: HashSet<String>,
    succeeded: i32,
    failed: i32,
    new_backoff: Option<BackoffRecord>,
    finished_condition: Option<JobCondition>,
    prev_succeeded_indexes: IndexSet,
    succeeded_indexes: IndexSet,
    failed_indexes: Option<IndexSet>,
    delayed_deletion: BTreeMap<i32, &'a Pod>,
    /// What the engine reads of each input pod (same order as the input), read once.
    summaries: Cow<'a, [PodSummary]>,
    /// What this sync makes of each summary (same order as the input).
    facts: Vec<PodFacts>,
    /// Completion index of each active pod, in `active_pods` order (Indexed Jobs only).
    active_index: Vec<Option<i32>>,
    /// Input position of each active pod, in `active_pods` order: its summary holds the
    /// deletion-order key (4 bytes here instead of a copy of the 56-byte key).
    active_positions: Vec<u32>,
    /// Valid (below completions) indexes of active pods, ascending, duplicates kept.
    active_valid_indexes: Vec<i32>,
    /// Valid indexes of terminating pods, ascending.
    terminating_indexes: Vec<i32>,
    /// Some active pod has an invalid or duplicated index (Indexed Jobs only).
    active_needs_dedup: bool,
    manage_called: bool,
    /// The finishing branch ran (delete all active pods) instead of manageJob.
    finishing: bool,
    suspend_changed: bool,
    manage_error: Option<SyncError>,
    creation: Creation<'a>,
    // trackJobStatusAndRemoveFinalizers state
    needs_flush: bool,
    uids_with_finalizer: HashSet<&'a str>,
    pods_to_remove_finalizer: Vec<&'a Pod>,
    removal_error: Option<SyncError>,
    reached_max_uncounted: bool,
    job_finished: bool,
    old_succeeded: i32,
    old_failed: i32,
    old_completed_indexes: String,
    old_failed_indexes: Option<String>,
    // machine
    phase: Phase,
    queue: VecDeque<Step>,
    awaiting: Option<Awaiting<'a>>,
    outcome: Outcome,
    metrics: MetricDeltas,
}

/// What this sync makes of one input pod, from its [`PodSummary`] and the Job. Gathered in the
/// one pass over the summaries; a `PodFacts` is 12 bytes.
#[derive(Debug, Clone, Copy)]
struct PodFacts {
    /// Completion index (Indexed Jobs only): from the annotation only (upstream `getCompletionIndex`).
    index: Option<i32>,
    /// Carries the tracking finalizer.
    finalizer: bool,
    /// Carries the tracking finalizer and its removal is not in flight.
    tracked: bool,
    /// Phase Succeeded.
    succeeded: bool,
    /// Counts as failed (upstream `isPodFailed`).
    failed: bool,
}

fn uid_set(list: Option<&Vec<String>>) -> HashSet<String> {
    list.map(|l| l.iter().cloned().collect()).unwrap_or_default()
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef { name: pod::name(pod).to_string(), uid: pod::uid(pod).to_string() }
}

fn min_requeue(current: Option<Duration>, new: Duration) -> Option<Duration> {
    Some(current.map_or(new, |c| c.min(new)))
}

impl<'a> JobSync<'a> {
    /// Starts a sync: runs upstream `syncJob` up to its first write (nothing is written yet).
    /// Takes the [`PodSummary`] of every input pod first; a caller that took them as it decoded
    /// the pods calls [`JobSync::with_summaries`] instead.
    pub fn new(input: SyncInput<'a>) -> Self {
        Self::begin(input, Cow::Owned(PodSummary::of_all(input.pods)))
    }

    /// [`JobSync::new`] with the [`PodSummary`] of each input pod already taken, in input order
    /// (e.g. by decoding the pod LIST into [`crate::SummarizedPod`]s). The pass over every pod
    /// then reads only the summaries. Summaries that do not match the pods one to one (another
    /// length) are taken again from the pods.
    pub fn with_summaries(input: SyncInput<'a>, summaries: &'a [PodSummary]) -> Self {
        if summaries.len() == input.pods.len() {
            Self::begin(input, Cow::Borrowed(summaries))
        } else {
            Self::new(input)
        }
    }

    /// Whether this sync, with its expectations unsatisfied (so no manageJob), would find the
    /// Job's success criteria met from the pods it was given: none active and enough succeeded
    /// (upstream decides completion without looking at the expectations). A pod list from a
    /// cache that is known to miss pods this controller created — the very reason the
    /// expectations are unsatisfied — can show a work queue's last running pod as absent, and
    /// the verdict is final; a caller planning from such a cache reads the pods afresh first.
    pub fn succeeds_unmanaged(&self) -> bool {
        if self.phase != Phase::Start
            || self.input.expectations_satisfied
            || self.finished_condition.is_some()
            || self.active > 0
        {
            return false;
        }
        match job::completions(self.job()) {
            None => self.succeeded > 0,
            Some(c) => self.succeeded >= c,
        }
    }

    fn begin(input: SyncInput<'a>, summaries: Cow<'a, [PodSummary]>) -> Self {
        let job = input.job;
        let status = job.status.clone().unwrap_or_default();
        let mut sync = JobSync {
            input,
            indexed: job::is_indexed(job),
            active_pods: Vec::new(),
            active: 0,
            ready: 0,
            terminating: 0,
            uncounted_succeeded: HashSet::new(),
            uncounted_failed: HashSet::new(),
            succeeded: 0,
            failed: 0,
            new_backoff: None,
            finished_condition: None,
            prev_succeeded_indexes: IndexSet::default(),
            succeeded_indexes: IndexSet::default(),
            failed_indexes: None,
            delayed_deletion: BTreeMap::new(),
            summaries,
            facts: Vec::new(),
            active_index: Vec::new(),
            active_positions: Vec::new(),
            active_valid_indexes: Vec::new(),
            terminating_indexes: Vec::new(),
            active_needs_dedup: false,
            manage_called: false,
            finishing: false,
            suspend_changed: false,
            manage_error: None,
            creation: Creation::default(),
            needs_flush: false,
            uids_with_finalizer: HashSet::new(),
            pods_to_remove_finalizer: Vec::new(),
            removal_error: None,
            reached_max_uncounted: false,
            job_finished: false,
            old_succeeded: status.succeeded.unwrap_or(0),
            old_failed: status.failed.unwrap_or(0),
            old_completed_indexes: status.completed_indexes.clone().unwrap_or_default(),
            old_failed_indexes: status.failed_indexes.clone(),
            status,
            phase: Phase::Start,
            queue: VecDeque::new(),
            awaiting: None,
            outcome: Outcome::default(),
            metrics: MetricDeltas::default(),
        };
        let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.as_deref());
        if !kjob_core::manages(managed_by, input.controller_name, input.manage_all) {
            sync.skip(Skipped::ManagedElsewhere);
        } else if cond::is_finished(job) {
            // A finished Job never comes back; its backoff history is useless from now on.
            sync.outcome.backoff = BackoffUpdate::Remove;
            sync.skip(Skipped::Finished);
        } else if job::has_unknown_completion_mode(job) {
            sync.outcome.events.push(events::unknown_completion_mode());
            sync.skip(Skipped::UnknownCompletionMode);
        } else {
            sync.metrics.completion_mode = job::completion_mode_label(job);
            sync.metrics.action = m::ACTION_RECONCILING;
            sync.metrics.backoff_limit_label = if job::has_backoff_limit_per_index(job) {
                m::BACKOFF_LIMIT_PER_INDEX
            } else {
                m::BACKOFF_LIMIT_GLOBAL
            };
            sync.prepare();
        }
        sync
    }

    fn skip(&mut self, why: Skipped) {
        self.outcome.skipped = Some(why);
        self.phase = Phase::Over;
        let outcome = std::mem::take(&mut self.outcome);
        self.queue.push_back(Step::Done(Box::new(outcome)));
    }

    fn job(&self) -> &'a Job {
        self.input.job
    }

    fn completions(&self) -> i32 {
        job::completions(self.job()).unwrap_or(0)
    }

    /// The completion index of the `i`-th input pod.
    fn index_of(&self, i: usize) -> Option<i32> {
        self.facts.get(i).and_then(|f| f.index)
    }

    /// Whether the `i`-th input pod's index is valid for counting (always true for NonIndexed).
    fn countable_index(&self, i: usize) -> bool {
        !self.indexed || self.index_of(i).is_some_and(|ix| ix < self.completions())
    }

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
    fn prepare(&mut self) {
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
            new_failed.iter().filter(|&&i| policy::policy_counts_failure(job, &pods[i])).count();
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

    /// The next step. After an I/O step, call [`JobSync::report`] before calling this again.
    pub fn next_step(&mut self) -> Step {
        loop {
            if let Some(step) = self.queue.pop_front() {
                return step;
            }
            if self.awaiting.is_some() {
                return self.fail_protocol("next_step() called before report() for the last step");
            }
            if self.phase == Phase::Over {
                return self.fail_protocol("next_step() called after Done");
            }
            self.advance();
        }
    }

    /// Feeds back the results of the last I/O step.
    pub fn report(&mut self, report: Report) -> Result<(), SyncError> {
        let Some(awaiting) = self.awaiting.take() else {
            return Err(SyncError::Protocol("report() without a pending I/O step".into()));
        };
        match (awaiting, report) {
            (Awaiting::FinishingDeletes(pods), Report::PodsDeleted(results))
                if results.len() == pods.len() =>
            {
                self.on_finishing_deletes(&pods, results);
            }
            (Awaiting::ManageDeletes(pods), Report::PodsDeleted(results))
                if results.len() == pods.len() =>
            {
                self.on_manage_deletes(&pods, results);
            }
            (Awaiting::Creates(n), Report::PodsCreated(results)) if results.len() == n => {
                self.on_creates(results);
            }
            (Awaiting::Write(kind), Report::StatusUpdated(result)) => self.on_write(kind, result),
            (Awaiting::Finalizers(pods), Report::FinalizersRemoved(results))
                if results.len() == pods.len() =>
            {
                self.on_finalizers_removed(&pods, results);
            }
            (awaiting, report) => {
                let msg = format!("report {report:?} does not answer {awaiting:?}");
                self.awaiting = Some(awaiting);
                return Err(SyncError::Protocol(msg));
            }
        }
        Ok(())
    }

    /// Drains the events earned so far, so the worker can emit them while the sync goes on.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.outcome.events)
    }

    /// Ends the sync early (the worker cannot go on); returns what was earned so far.
    pub fn abort(mut self, reason: impl Into<String>) -> Outcome {
        self.phase = Phase::Over;
        self.outcome.error.get_or_insert(SyncError::Aborted(reason.into()));
        self.finish_outcome()
    }

    fn fail_protocol(&mut self, msg: &str) -> Step {
        self.phase = Phase::Over;
        self.awaiting = None;
        self.outcome.error = Some(SyncError::Protocol(msg.to_string()));
        Step::Done(Box::new(self.finish_outcome()))
    }

    fn finish_outcome(&mut self) -> Outcome {
        let mut outcome = std::mem::take(&mut self.outcome);
        if outcome.skipped.is_none() {
            outcome.metrics = Some(std::mem::take(&mut self.metrics));
        }
        outcome
    }

    fn done(&mut self, error: Option<SyncError>) {
        self.phase = Phase::Over;
        if let Some(e) = error {
            self.outcome.error.get_or_insert(e);
        }
        let outcome = self.finish_outcome();
        self.queue.push_back(Step::Done(Box::new(outcome)));
    }

    fn push_io(&mut self, step: Step, awaiting: Awaiting<'a>) {
        self.queue.push_back(step);
        self.awaiting = Some(awaiting);
    }

    /// Runs the current phase until it queues a step.
    fn advance(&mut self) {
        match self.phase {
            Phase::Start => self.start(),
            Phase::Creating => self.next_create_batch(),
            Phase::AfterManage => self.after_manage(),
            Phase::Track => self.track(),
            Phase::RemoveFinalizers => self.remove_finalizers(),
            Phase::AfterRemoval => self.after_removal(),
            Phase::Enact => self.enact(),
            Phase::Over => {}
        }
    }

    /// Step 16/17 of upstream `syncJob`: delete everything when finishing, else manageJob.
    fn start(&mut self) {
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

    fn on_finishing_deletes(&mut self, pods: &[&'a Pod], results: Vec<Result<(), CallError>>) {
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

    fn on_manage_deletes(&mut self, pods: &[&'a Pod], results: Vec<Result<(), CallError>>) {
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

    fn next_create_batch(&mut self) {
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

    fn on_creates(&mut self, results: Vec<Result<String, CallError>>) {
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

    /// Rest of step 17 and step 18 of upstream `syncJob`.
    fn after_manage(&mut self) {
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

    /// Upstream `trackJobStatusAndRemoveFinalizers` up to write #1.
    fn track(&mut self) {
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
            let pod = &all[i];
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

    fn queue_write(&mut self, kind: WriteKind) {
        let status = Box::new(self.status.clone());
        self.push_io(Step::UpdateStatus { status }, Awaiting::Write(kind));
    }

    fn on_write(&mut self, kind: WriteKind, result: Result<(), String>) {
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

    fn remove_finalizers(&mut self) {
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

    fn on_finalizers_removed(&mut self, pods: &[&'a Pod], results: Vec<Result<(), CallError>>) {
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

    fn after_removal(&mut self) {
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

    /// Upstream `enactJobFinished` and the last write.
    fn enact(&mut self) {
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

fn reason(c: &JobCondition) -> &str {
    c.reason.as_deref().unwrap_or("")
}

fn message(c: &JobCondition) -> &str {
    c.message.as_deref().unwrap_or("")
}

fn failure_target(reason: &str, message: &str, now: Timestamp) -> JobCondition {
    cond::new_condition(cond::FAILURE_TARGET, cond::TRUE, reason, message, now)
}

/// Upstream `newFailedConditionForFailureTarget`.
fn failed_from_target(target: &JobCondition, now: Timestamp) -> JobCondition {
    cond::new_condition(cond::FAILED, cond::TRUE, reason(target), message(target), now)
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
