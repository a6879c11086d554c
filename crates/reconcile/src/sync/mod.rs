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
//!
//! This module holds the plan types and the step/report machine; the stages of the pass are its
//! submodules, in upstream order: `prepare` (counts and finish criteria), `manage` (the finishing
//! deletes or `manageJob`), `status` (conditions and status writes) and `track`
//! (`trackJobStatusAndRemoveFinalizers`), with `policy` the engine's view of the policy modules.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};

use crate::backoff::BackoffRecord;
use crate::conditions as cond;
use crate::events::{self, Event};
use crate::metrics::{self as m, MetricDeltas};
use crate::summary::{PodSlice, PodSummary};
use crate::{job, pod};

mod manage;
mod policy;
mod prepare;
mod status;
mod track;

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
    /// Owned or shared ([`PodSlice`]: `(&pods).into()`, or [`crate::SummarizedPods::as_slice`]).
    pub pods: PodSlice<'a>,
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

impl Step {
    /// The report of this step when every call in it succeeds, the `i`-th created pod named
    /// `created(i)`; `None` for a step that takes no report ([`Step::Expectations`],
    /// [`Step::Done`]). For drivers that play the API server's part (benchmarks, simulations).
    pub fn all_succeeded(&self, created: impl Fn(usize) -> String) -> Option<Report> {
        Some(match self {
            Step::Expectations(_) | Step::Done(_) => return None,
            Step::CreatePods { pods } => {
                Report::PodsCreated((0..pods.len()).map(|i| Ok(created(i))).collect())
            }
            Step::DeletePods { pods, .. } => Report::PodsDeleted(vec![Ok(()); pods.len()]),
            Step::RemoveFinalizers { pods } => Report::FinalizersRemoved(vec![Ok(()); pods.len()]),
            Step::UpdateStatus { .. } => Report::StatusUpdated(Ok(())),
        })
    }
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
}
