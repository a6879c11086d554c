//! syncJob: consistent reads, adoption, shared expectations, then the `kjob-reconcile` plan
//! executed step by step against the API server.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::seal::{EntryKind, SealError, ViewKey};
use kjob_core::{JOB_TRACKING_FINALIZER, ObjectKey};
use kjob_queue_client::{
    AddItem, JobExpectations, JobView, SetExpectations, VIEW_READ_ATTEMPTS, ViewPages,
    ViewWriteBack,
};
use kjob_reconcile::backoff::StoredBackoff;
use kjob_reconcile::conditions::is_finished;
use kjob_reconcile::events::EventType as PlanEventType;
use kjob_reconcile::metrics::MetricDeltas;
use kjob_reconcile::selector::Selector;
use kjob_reconcile::view_pod;
use kjob_reconcile::{
    BackoffRecord, BackoffUpdate, CallError, Expectations, JobSync, Outcome, Report, Step,
    SummarizedPods, SyncInput,
};
use kjob_reconcile::{Claim, claim};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;

use crate::context::{Journal, LeasedJob, SyncContext, SyncError, SyncOutcome, SyncResult};
use crate::events::EventType;
use crate::kube_api::ApiError;
use crate::metrics::{
    ActionLabels, CreationLabels, FinishedLabels, IndexesLabels, PodsFinishedLabels, SyncLabels,
};
use crate::view_cache::CachedJob;

/// Name of the per-Job record holding the pod-failure backoff state in the queue service.
pub const BACKOFF_RECORD: &str = "backoff";
/// Default age after which unsatisfied expectations count as satisfied: upstream's 5-minute
/// expectations timeout. `kjob-worker` lowers it to one lease plus [`STALE_EXPECTATIONS_MARGIN`].
pub const DEFAULT_STALE_EXPECTATIONS_AFTER: Duration = kjob_core::EXPECTATIONS_TIMEOUT;
/// Time for a request a previous lease holder had already sent to reach the API server.
pub const STALE_EXPECTATIONS_MARGIN: Duration = Duration::from_secs(15);

/// Serializes `record` as the record of the Job with UID `job_uid` (see [`StoredBackoff`]).
pub fn encode_backoff(record: &BackoffRecord, job_uid: &str) -> Vec<u8> {
    StoredBackoff::encode(record, job_uid)
}

/// The stored record if it belongs to the Job with UID `job_uid`. An empty (removed),
/// unreadable or UID-less record, or one of another Job of the same name, counts as none.
pub fn decode_backoff(bytes: &[u8], job_uid: &str) -> Option<BackoffRecord> {
    if bytes.is_empty() {
        return None;
    }
    match StoredBackoff::decode(bytes) {
        Ok(s) if s.job_uid == job_uid => Some(s.record),
        Ok(s) => {
            tracing::debug!(stored = s.job_uid, job_uid, "ignoring another Job's backoff record");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "ignoring unreadable backoff record");
            None
        }
    }
}

/// The expectations a sync that creates `add` pods before raising them owes its Done.
fn raise_after_creates(key: &str, uid: &str, add: u32) -> SetExpectations {
    SetExpectations {
        key: key.to_string(),
        job_uid: uid.to_string(),
        add: i64::from(add),
        del: 0,
        created_pod_uids: Vec::new(),
    }
}

/// The earlier of two optional requeue delays.
fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Whether a sync may act: the shared record is satisfied, or it is old enough that whoever
/// raised it can no longer be writing (its lease is over), so a consistent LIST shows all it did.
pub fn expectations_usable(
    satisfied: bool,
    exists: bool,
    age: Duration,
    stale_after: Duration,
) -> bool {
    satisfied || (exists && age >= stale_after)
}

/// Syncs one leased Job (upstream `syncJob`): what its lease's Done hands back.
pub async fn sync_job(
    ctx: &SyncContext,
    job: LeasedJob,
    wind_down: &CancellationToken,
) -> SyncResult {
    let journal = job.journal();
    let run =
        JobRun { ctx, key: &job.key, wire_key: job.key.to_string(), wind_down, journal: &journal };
    let (outcome, write_back) = match run.sync(job.view).await {
        Ok(synced) => synced,
        Err(e) => (Err(e), None),
    };
    SyncResult { outcome, write_back, owed: journal.take() }
}

/// How a sync ended, and the Job object it hands back for the shared view.
type Synced = (Result<SyncOutcome, SyncError>, Option<ViewWriteBack>);

/// One sync of one Job: what every step of it reads.
struct JobRun<'a> {
    /// The per-process context.
    ctx: &'a SyncContext,
    /// The Job's key.
    key: &'a ObjectKey,
    /// The key as the queue service names it.
    wire_key: String,
    /// Fires when the worker hands its keys back: no more pod calls.
    wind_down: &'a CancellationToken,
    /// What the sync owes its Done so far.
    journal: &'a Journal,
}

impl JobRun<'_> {
    /// Reads, plans and acts; an error before the plan runs hands nothing back.
    async fn sync(&self, leased_view: Option<JobView>) -> Result<Synced, SyncError> {
        let started = Instant::now();
        let key = self.key;
        let key_str = self.wire_key.clone();
        // The shared view (the leading watcher's informer state) when it can be trusted; else
        // consistent reads, as before the view existed. The Lease reply usually brought it.
        let (job, exp, view_pods, view_backoff) = match self
            .read_view(&key_str, leased_view)
            .await?
        {
            Some(v) => (v.job, v.expectations, Some((v.pods, v.orphans_pending)), Some(v.backoff)),
            None => {
                let Some(job) = self.ctx.api.get_job(&key.namespace, &key.name).await? else {
                    // The Job is gone: its expectations, finalizer-removal set and records go.
                    self.ctx.queue.delete_expectations(&key_str).await?;
                    return Ok((Ok(SyncOutcome::Done), None));
                };
                (job, None, None, None)
            }
        };
        let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.as_deref());
        if !kjob_core::manages(managed_by, &self.ctx.controller_name, self.ctx.manage_all) {
            return Ok((Ok(SyncOutcome::Done), None));
        }
        if is_finished(&job) {
            return Ok((Ok(SyncOutcome::Done), None));
        }
        let uid = job.metadata.uid.clone().unwrap_or_default();
        // Expectations are read before the pods, as upstream: an observation that lands in
        // between can only make the pod list newer than the expectations, never older. The view
        // brings them from the same script as its pods.
        let exp = match exp {
            Some(e) => e,
            None => self.ctx.queue.get_expectations(&key_str, &uid).await?,
        };
        if !exp.satisfied
            && exp.exists
            && exp.age_ms >= self.ctx.stale_expectations_after.as_millis() as u64
        {
            tracing::info!(job = %key_str, add = exp.add, del = exp.del, age_ms = exp.age_ms,
                "expectations outlived every lease that could lower them; syncing from a fresh LIST");
        }
        let in_flight: BTreeSet<String> = exp.finalizer_removals.into_iter().collect();
        let stale = !exp.satisfied
            && exp.exists
            && exp.age_ms >= self.ctx.stale_expectations_after.as_millis() as u64;
        // Pods this sync plans from the view, which misses any pod created but not observed yet.
        let mut from_view = false;
        let pods = match view_pods {
            // Stale expectations mean an observation may be lost, so the view may miss a pod.
            // The read kept the pods the Job claims; a selector that does not compile fails
            // the sync, as it does a LIST.
            Some((pods, None)) if !stale => {
                from_view = true;
                pods?
            }
            Some((_, orphans)) => {
                let pods = self.pods_for_job(&job).await?;
                if let Some(seen) = orphans {
                    self.ack_orphans(&key_str, &uid, seen).await;
                }
                pods
            }
            None => self.pods_for_job(&job).await?,
        };
        let backoff = match view_backoff {
            Some(bytes) => bytes.and_then(|b| decode_backoff(&b, &uid)),
            None => self.read_backoff(&key_str, &uid).await?,
        };
        let age = Duration::from_millis(exp.age_ms);
        let satisfied =
            expectations_usable(exp.satisfied, exp.exists, age, self.ctx.stale_expectations_after);
        // Upstream waits for the observation that satisfies the record to enqueue the Job again.
        // If that observation is lost (a watcher failover, a crashed worker) nothing would, so
        // come back when the record turns stale.
        let recheck = (!satisfied).then(|| self.ctx.stale_expectations_after.saturating_sub(age));
        let input = SyncInput {
            job: &job,
            pods: Default::default(),
            now: jiff::Timestamp::now(),
            expectations_satisfied: satisfied,
            finalizer_removals_in_flight: &in_flight,
            backoff: backoff.as_ref(),
            controller_name: &self.ctx.controller_name,
            manage_all: self.ctx.manage_all,
        };
        // Pods created but not observed yet are missing from the view, so it can show a Job's
        // last running pod as absent; upstream decides success without looking at the
        // expectations, and the verdict is final. Such a verdict is checked against a LIST
        // first (rare: the creating sync ended before the watcher saw its pods, and a pod of
        // the Job finished meanwhile).
        let listed;
        let mut plan =
            JobSync::with_summaries(SyncInput { pods: pods.as_slice(), ..input }, pods.summaries());
        if from_view && exp.add > 0 && plan.succeeds_unmanaged() {
            drop(plan);
            self.ctx.metrics.view_read("unobserved_creations");
            listed = self.pods_for_job(&job).await?;
            plan = JobSync::with_summaries(
                SyncInput { pods: listed.as_slice(), ..input },
                listed.summaries(),
            );
        }
        let (mut outcome, write_back) = self.drive(&job, &uid, plan).await;
        outcome.requeue_after = earliest(outcome.requeue_after, recheck);
        Ok((self.finish_sync(&job, &key_str, outcome, started).await, write_back))
    }

    /// Reads the shared view of `key`: the Job, its pods (in name order, as a LIST returns
    /// them), its expectations, and whether orphans wait for adoption. `None` (consistent
    /// reads instead) when the view is not trusted or does not parse.
    async fn read_view(
        &self,
        key: &str,
        leased: Option<JobView>,
    ) -> Result<Option<ViewRead>, SyncError> {
        // The Lease reply brings a view that fits in it whole (or, for a view this worker
        // holds decoded, what changed since); a larger one is read here, page by page, all of
        // one version (begun again once if it changed under the read). A delta that does not
        // fit what is held is read again whole, once.
        let cache = &self.ctx.view_cache;
        let mut first = leased;
        let mut base = cache.base(key);
        let (mut attempts, mut gap_read) = (0, false);
        let records = &[BACKOFF_RECORD];
        let decoded = loop {
            attempts += 1;
            let b = base.as_ref().map(|(v, e)| (*v, e.as_str()));
            let q = &self.ctx.queue;
            let pages = if cache.enabled() {
                q.read_job_view_cached(key, records, first.take(), b).await?
            } else {
                q.read_job_view(key, records, first.take()).await?
            };
            let v = match pages {
                ViewPages::Trusted(v) => *v,
                ViewPages::Untrusted => {
                    cache.forget(key);
                    self.ctx.metrics.view_read("untrusted");
                    return Ok(None);
                }
                ViewPages::Moved if attempts < VIEW_READ_ATTEMPTS => continue,
                ViewPages::Moved => {
                    cache.forget(key);
                    tracing::debug!(
                        job = key,
                        attempts,
                        "the shared view changed during every paged read; reading the API server"
                    );
                    self.ctx.metrics.view_read("moved");
                    return Ok(None);
                }
            };
            let delta = v.delta;
            // What is held leaves the cache while it is checked: any doubt drops it.
            let held = cache.take(key);
            match decode_cached(v, key, &self.ctx.view_key, held) {
                Err(ViewProblem::Gap(why)) if !gap_read => {
                    tracing::debug!(job = key, why = %why, "a view delta did not fit; reading it whole");
                    self.ctx.metrics.view_cache("gap");
                    (base, gap_read) = (None, true);
                    attempts -= 1;
                }
                Err(ViewProblem::Gap(why)) => {
                    tracing::debug!(job = key, why = %why, "a view delta did not fit; reading the API server");
                    self.ctx.metrics.view_read("moved");
                    return Ok(None);
                }
                Ok((read, keep)) => {
                    if let Some(c) = keep {
                        self.ctx.metrics.view_cache(if delta { "delta" } else { "full" });
                        cache.put(key, c);
                    }
                    break Ok(read);
                }
                Err(e) => break Err(e),
            }
        };
        match decoded {
            Ok(read) => {
                let result = if read.orphans_pending.is_some() { "orphans" } else { "trusted" };
                self.ctx.metrics.view_read(result);
                Ok(Some(read))
            }
            Err(ViewProblem::Forged(e)) => {
                // Not written by the watcher or a worker (or moved from another Job): whoever
                // reached kjob-queue or Redis must not choose the pods this sync makes.
                tracing::warn!(job = key, error = %e, "the shared view is not sealed by kjob; reading the API server");
                self.ctx.metrics.view_read("forged");
                Ok(None)
            }
            Err(ViewProblem::Undecodable(e)) => {
                tracing::warn!(job = key, error = %e, "the shared view does not parse; reading the API server");
                self.ctx.metrics.view_read("undecodable");
                Ok(None)
            }
            Err(ViewProblem::Gap(e)) => {
                tracing::debug!(job = key, error = %e, "a view delta did not fit; reading the API server");
                self.ctx.metrics.view_read("moved");
                Ok(None)
            }
        }
    }

    /// Records that orphan notices up to `seen` were handled by a LIST (best effort: a failure
    /// only means the next sync lists again).
    async fn ack_orphans(&self, key: &str, uid: &str, seen: u64) {
        if let Err(e) = self.ctx.queue.put_job_view(key, uid, Vec::new(), "", seen).await {
            tracing::debug!(job = key, error = %e, "could not acknowledge orphan notices");
        }
    }

    /// Writes a Job the API server returned back into the shared view (the view keeps the
    /// newest resourceVersion): once per sync, the last status it wrote, before the lease is
    /// done. The watcher's Job event writes the view too, but a key that became dirty during
    /// the sync is leased again as soon as this one is done, possibly before that event: the
    /// next sync must not plan from a Job older than this sync's own writes (it would act on
    /// a stale status and have its own write refused after acting). After a conflict, the
    /// fresh GET goes in the same way.
    async fn write_back(&self, key: &str, job: &Job) {
        let Some(w) = view_write_back(key, job, &self.ctx.view_key) else { return };
        if let Err(e) =
            self.ctx.queue.put_job_view(key, &w.job_uid, w.job, &w.resource_version, 0).await
        {
            tracing::debug!(job = key, error = %e, "could not write the Job back to the shared view");
        }
    }

    /// Executes the plan's steps until it is done (or a queue call fails, which aborts it).
    ///
    /// Upstream raises the expectations of creations before it creates the pods
    /// (`ExpectCreations`), so that its informer cannot show a pod the record does not expect
    /// yet. Here the record is raised after the creates instead, with the created pods' UIDs,
    /// by the lease's Done (`raised`): the first pod of a Job does not wait for a queue call,
    /// and a sync that creates pods makes one call fewer. Nobody plans from the record before
    /// the Done (the key is leased), the Done lands before the key can be leased again, and
    /// kjob-queue counts out the created pods the watcher observed meanwhile, so the next sync
    /// sees what a record raised first would show. Until the creates answer, `raised` expects
    /// every pod (a sync dropped at the wind-down limit hands that to its Done); creates that
    /// failed lower it as the plan says. A lease that expires instead (its holder died or lost
    /// it) makes the next lessee read the API server.
    ///
    /// Upstream likewise expects tracking-finalizer removals before it patches the pods
    /// (`ExpectFinalizersRemoved`). Here they go with the Done too, after the patches, sparing
    /// every sync that counts finished pods a queue call: kjob-queue leaves out the pods the
    /// watcher has seen without the finalizer meanwhile (each such observation is kept until
    /// the next Done that expects removals), and the view already shows those pods without
    /// it, so the next sync plans from the same facts as with expectations raised first.
    /// Removals that failed are dropped from what the Done expects.
    async fn drive(
        &self,
        job: &Job,
        uid: &str,
        mut plan: JobSync<'_>,
    ) -> (Outcome, Option<ViewWriteBack>) {
        let (key, wind_down, raised) = (self.wire_key.as_str(), self.wind_down, self.journal);
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        // Status writes carry the latest resourceVersion this sync holds (its own last write).
        let mut current = job.clone();
        // The last status this sync wrote, for the shared view (see `write_back`).
        let mut wrote_status = false;
        // A Set of creations not applied yet: it waits for the Done when the next step creates
        // the pods, else it goes now.
        let mut held: Option<u32> = None;
        loop {
            let step = plan.next_step();
            for ev in plan.take_events() {
                self.emit(job, &ev);
            }
            if let Some(add) = held.take() {
                let creates = matches!(step, Step::CreatePods { .. });
                if creates && !wind_down.is_cancelled() {
                    // Until the creates answer, every one of them is expected.
                    *raised.owed() = Some(raise_after_creates(key, uid, add));
                } else if let Err(e) =
                    self.apply_expectations(key, uid, Expectations::Set { add, del: 0 }).await
                {
                    return (plan.abort(format!("expectations: {e}")), None);
                }
            }
            let deferred = raised.owed().is_some();
            let report = match step {
                Step::Done(outcome) => {
                    // Goes with the lease's Done (see `write_back`).
                    let back = if wrote_status {
                        view_write_back(key, &current, &self.ctx.view_key)
                    } else {
                        None
                    };
                    return (*outcome, back);
                }
                Step::Expectations(Expectations::Set { add, del: 0 }) if add > 0 && !deferred => {
                    held = Some(add);
                    continue;
                }
                // Creations that failed lower the record the Done raises.
                Step::Expectations(Expectations::Lower { add, del: 0 }) if deferred => {
                    if let Some(r) = raised.owed().as_mut() {
                        r.add = r.add.saturating_sub(i64::from(add)).max(0);
                    }
                    continue;
                }
                // Removals are expected with the Done, after they are made (see above).
                Step::Expectations(Expectations::ExpectFinalizerRemovals { pod_uids })
                    if raised.removals_deferrable =>
                {
                    raised.owe_removals(key, uid, pod_uids);
                    continue;
                }
                // Removals that failed are not expected; any expected already are forgotten.
                // Neither touches the record, so neither waits for the one the Done raises.
                Step::Expectations(Expectations::FinalizerRemovalsFailed { pod_uids }) => {
                    let rest = raised.forgive_removals(pod_uids);
                    if !rest.is_empty() {
                        let forget = Expectations::FinalizerRemovalsFailed { pod_uids: rest };
                        if let Err(e) = self.apply_expectations(key, uid, forget).await {
                            return (plan.abort(format!("expectations: {e}")), None);
                        }
                    }
                    continue;
                }
                Step::Expectations(op) => {
                    // Anything else about the record goes after the one the Done would raise,
                    // so that one is raised now.
                    let pending = raised.owed().take();
                    let raised_now = match &pending {
                        Some(r) => {
                            let (add, uids) = (r.add, &r.created_pod_uids);
                            self.ctx.queue.set_expectations_created(key, uid, add, 0, uids).await
                        }
                        None => Ok(()),
                    };
                    let applied = match raised_now {
                        Ok(()) => self.apply_expectations(key, uid, op).await,
                        Err(e) => {
                            // Still owed: the Done raises it.
                            *raised.owed() = pending;
                            Err(e)
                        }
                    };
                    if let Err(e) = applied {
                        return (plan.abort(format!("expectations: {e}")), None);
                    }
                    continue;
                }
                Step::CreatePods { pods } if wind_down.is_cancelled() => {
                    Report::PodsCreated(pods.iter().map(|_| Err(winding_down())).collect())
                }
                Step::DeletePods { pods, .. } if wind_down.is_cancelled() => {
                    Report::PodsDeleted(pods.iter().map(|_| Err(winding_down())).collect())
                }
                Step::RemoveFinalizers { pods } if wind_down.is_cancelled() => {
                    Report::FinalizersRemoved(pods.iter().map(|_| Err(winding_down())).collect())
                }
                Step::CreatePods { pods } => {
                    let calls = pods.iter().map(|p| self.ctx.api.create_pod(&ns, p));
                    let results = join_all(calls).await;
                    if deferred && let Some(r) = raised.owed().as_mut() {
                        r.created_pod_uids.extend(
                            results
                                .iter()
                                .flatten()
                                .filter(|p| !p.uid.is_empty())
                                .map(|p| p.uid.clone()),
                        );
                    }
                    Report::PodsCreated(
                        results
                            .into_iter()
                            .map(|r| r.map(|p| p.name).map_err(call_error))
                            .collect(),
                    )
                }
                Step::DeletePods { pods, remove_finalizer } => {
                    let calls = pods.iter().map(|p| async {
                        if remove_finalizer {
                            self.ctx.api.patch_out_tracking_finalizer(&ns, &p.name).await.map_err(
                                |e| match e {
                                    ApiError::NotFound(_) => CallError::NotFound,
                                    e => CallError::FinalizerPatch(e.to_string()),
                                },
                            )?;
                        }
                        self.ctx.api.delete_pod(&ns, &p.name).await.map_err(call_error)
                    });
                    Report::PodsDeleted(join_all(calls).await)
                }
                Step::RemoveFinalizers { pods } => {
                    let calls = pods.iter().map(|p| async {
                        self.ctx
                            .api
                            .patch_out_tracking_finalizer(&ns, &p.name)
                            .await
                            .map_err(call_error)
                    });
                    let results = join_all(calls).await;
                    // Upstream counts finished pods losing the finalizer from pod events; here the
                    // remover counts them (the watcher owns the `add` side).
                    let removed = results.iter().filter(|r| r.is_ok()).count() as u64;
                    self.ctx.metrics.finalizer_removals(removed);
                    Report::FinalizersRemoved(results)
                }
                Step::UpdateStatus { status } => {
                    let before = uncounted_uids(current.status.as_ref());
                    current.status = Some(*status);
                    match self.ctx.api.replace_job_status(&current).await {
                        Ok(version) => {
                            // Upstream counts `add` when its informer first sees a finished pod
                            // with the finalizer; kjob's watcher reads pod metadata only, so the
                            // worker counts each pod as it records it, once per fenced write.
                            let after = uncounted_uids(current.status.as_ref());
                            self.ctx
                                .metrics
                                .finished_with_finalizer(after.difference(&before).count());
                            // An answer without a version (no real server sends one)
                            // keeps the old one: the next write is then refused as stale,
                            // never sent unfenced.
                            if !version.is_empty() {
                                current.metadata.resource_version = Some(version);
                            }
                            wrote_status = true;
                            Report::StatusUpdated(Ok(()))
                        }
                        Err(e) => {
                            if matches!(e, ApiError::Conflict { .. }) {
                                // Planned from an older Job than the server's (a view the
                                // watcher had not caught up on): refresh the view so the retry
                                // plans from the current one.
                                if let Ok(Some(fresh)) =
                                    self.ctx.api.get_job(&ns, job_name(job)).await
                                    && fresh.metadata.uid.as_deref() == Some(uid)
                                {
                                    self.write_back(key, &fresh).await;
                                }
                            }
                            Report::StatusUpdated(Err(e.to_string()))
                        }
                    }
                }
            };
            if let Err(e) = plan.report(report) {
                // Only a bug in this driver gets here; the plan's Done carries the error too.
                tracing::error!(error = %e, "reconcile plan refused a report");
            }
        }
    }

    /// Applies an expectations change to the shared store.
    async fn apply_expectations(
        &self,
        key: &str,
        uid: &str,
        op: Expectations,
    ) -> Result<(), kjob_queue_client::ClientError> {
        match op {
            Expectations::Set { add, del } => {
                self.ctx.queue.set_expectations(key, uid, i64::from(add), i64::from(del)).await
            }
            Expectations::Lower { add, del } => {
                self.ctx.queue.lower_expectations(key, uid, i64::from(add), i64::from(del)).await
            }
            Expectations::ExpectFinalizerRemovals { pod_uids } => {
                self.ctx.queue.expect_finalizer_removals(key, uid, pod_uids).await
            }
            Expectations::FinalizerRemovalsFailed { pod_uids } => {
                self.ctx.queue.forget_finalizer_removals(key, pod_uids).await.map(drop)
            }
        }
    }

    /// Emits, persists and counts what the sync produced, and maps it to a lease outcome.
    async fn finish_sync(
        &self,
        job: &Job,
        key: &str,
        outcome: Outcome,
        started: Instant,
    ) -> Result<SyncOutcome, SyncError> {
        for ev in &outcome.events {
            self.emit(job, ev);
        }
        if let Some(deltas) = &outcome.metrics {
            self.add_metrics(deltas, outcome.error.is_none(), started.elapsed());
        }
        let persisted = self.persist_backoff(job, key, &outcome.backoff).await;
        let failed = match (outcome.error, persisted) {
            (Some(e), _) => Some(SyncError::Plan(e)),
            (None, Err(e)) => Some(e),
            (None, Ok(())) => None,
        };
        if let Some(e) = failed {
            if let Some(after) = outcome.requeue_after {
                self.requeue_no_later_than(key, after).await;
            }
            return Err(e);
        }
        Ok(match outcome.requeue_after {
            Some(d) => SyncOutcome::RequeueAfter(d),
            None => SyncOutcome::Done,
        })
    }

    /// Stores or removes the Job's pod-failure backoff record as the plan says.
    async fn persist_backoff(
        &self,
        job: &Job,
        key: &str,
        update: &BackoffUpdate,
    ) -> Result<(), SyncError> {
        match update {
            BackoffUpdate::Keep => {}
            BackoffUpdate::Put(record) => {
                let uid = job.metadata.uid.as_deref().unwrap_or_default();
                let bytes = encode_backoff(record, uid);
                self.ctx.queue.put_record(key, BACKOFF_RECORD, bytes, None).await?;
            }
            BackoffUpdate::Remove => {
                self.ctx.queue.delete_record(key, BACKOFF_RECORD).await?;
            }
        }
        Ok(())
    }

    /// Makes sure a failed sync's key comes back after `after` at the latest. Upstream's syncJob
    /// calls `AddAfter` for the deadline (and the pod-failure backoff) as it decides them, before
    /// it fails; the rate-limited requeue of the error comes on top, and the earlier of the two
    /// wins. The lease's Done can carry only one of them, so the delayed add goes first (an add
    /// while leased is kept and the Done keeps the earlier ready time). If it fails the key still
    /// comes back, only later, through the rate limiter.
    async fn requeue_no_later_than(&self, key: &str, after: Duration) {
        let item = AddItem {
            queue: kjob_core::JOB_QUEUE.to_string(),
            key: key.to_string(),
            delay: after,
            ..Default::default()
        };
        if let Err(e) = self.ctx.queue.add(vec![item]).await {
            tracing::warn!(error = %e, ?after, "could not keep the requeue of a failed sync");
        }
    }

    /// Reads the persisted pod-failure backoff record of the Job with UID `uid` (see
    /// [`decode_backoff`]).
    async fn read_backoff(&self, key: &str, uid: &str) -> Result<Option<BackoffRecord>, SyncError> {
        let bytes = self.ctx.queue.get_record(key, BACKOFF_RECORD).await?;
        Ok(bytes.and_then(|b| decode_backoff(&b, uid)))
    }

    fn emit(&self, job: &Job, ev: &kjob_reconcile::events::Event) {
        let kind = match ev.type_ {
            PlanEventType::Normal => EventType::Normal,
            PlanEventType::Warning => EventType::Warning,
        };
        self.ctx.events.job_event(job, kind, &ev.reason, &ev.message);
    }

    fn add_metrics(&self, d: &MetricDeltas, success: bool, elapsed: Duration) {
        let m = &self.ctx.metrics;
        let mode = d.completion_mode.to_string();
        let labels = SyncLabels {
            completion_mode: mode.clone(),
            result: if success { "success" } else { "error" }.into(),
            action: d.action.to_string(),
        };
        m.job_syncs.get_or_create(&labels).inc();
        m.job_sync_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
        if let Some(f) = &d.job_finished {
            m.jobs_finished
                .get_or_create(&FinishedLabels {
                    completion_mode: mode.clone(),
                    result: f.result.to_string(),
                    reason: f.reason.clone(),
                })
                .inc();
        }
        let pods = [("succeeded", d.pods_finished_succeeded), ("failed", d.pods_finished_failed)];
        add_counts(&m.job_pods_finished, pods, |result| PodsFinishedLabels {
            completion_mode: mode.clone(),
            result: result.into(),
        });
        for (action, n) in &d.pod_failures_by_policy_action {
            m.pod_failures_handled_by_failure_policy
                .get_or_create(&ActionLabels { action: action.clone() })
                .inc_by(*n);
        }
        let indexes =
            [("succeeded", d.finished_indexes_succeeded), ("failed", d.finished_indexes_failed)];
        add_counts(&m.job_finished_indexes, indexes, |status| IndexesLabels {
            status: status.into(),
            backoffLimit: d.backoff_limit_label.to_string(),
        });
        if let Some(c) = &d.pods_creation {
            let created = [("succeeded", c.succeeded), ("failed", c.failed)];
            add_counts(&m.job_pods_creation, created, |status| CreationLabels {
                reason: c.reason.to_string(),
                status: status.into(),
            });
        }
    }

    /// LISTs the Job's pods by its selector and claims them as upstream `ClaimPods`: owned pods
    /// are kept, matching orphans adopted (ownerReference + tracking finalizer, after a fresh GET
    /// confirms the Job), pods controlled by others ignored. Listed by the selector, no pod
    /// comes up for release: the watcher sends owned pods that stop matching to the orphan
    /// queue, which releases them.
    async fn pods_for_job(&self, job: &Job) -> Result<SummarizedPods, SyncError> {
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let selector = job_selector(job)?;
        // `job_selector` refuses the nil selector, the one no query expresses.
        let query = selector.api_query().unwrap_or_default();
        let listed = self.ctx.api.list_pods(&ns, &query).await?;
        let mut claimed = SummarizedPods::with_capacity(listed.len());
        let mut can_adopt: Option<bool> = None;
        let (listed, summaries) = listed.into_parts();
        for (pod, summary) in listed.into_iter().zip(summaries) {
            match claim(job, &selector, &pod) {
                Claim::Owned => claimed.push_summarized(pod, summary),
                Claim::Release | Claim::Ignore => {}
                Claim::Adopt => {
                    let adopt = match can_adopt {
                        Some(v) => v,
                        None => {
                            let v = self.job_still_adopts(job).await?;
                            can_adopt = Some(v);
                            v
                        }
                    };
                    if !adopt {
                        continue;
                    }
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    match self.ctx.api.patch_pod(&ns, &name, &adoption_patch(job, &pod)).await {
                        Ok(p) => claimed.push(p),
                        Err(ApiError::NotFound(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(claimed)
    }

    /// Fresh GET before adopting (upstream `RecheckDeletionTimestamp`): the Job must still
    /// exist with the same UID and not be deleting.
    async fn job_still_adopts(&self, job: &Job) -> Result<bool, SyncError> {
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let fresh = self.ctx.api.get_job(ns, name).await?;
        Ok(fresh.is_some_and(|f| {
            f.metadata.uid == job.metadata.uid && f.metadata.deletion_timestamp.is_none()
        }))
    }
}

/// A trusted shared view, decoded.
struct ViewRead {
    job: Job,
    /// The view's pods the Job claims ([`claimed_view_pods`]), in name order; `Err` when its
    /// selector does not compile.
    pods: Result<SummarizedPods, SyncError>,
    expectations: Option<JobExpectations>,
    /// `Some(seen)` when orphan notices wait for a LIST to adopt them.
    orphans_pending: Option<u64>,
    /// The stored pod-failure backoff record, read with the view (not yet checked for the UID).
    backoff: Option<Vec<u8>>,
}

/// Decodes a view: the Job, and its pods in name order (the order a LIST returns).
/// The view write-back of a Job the API server returned (managedFields left out), sealed as
/// Job `key`'s object; `None` without a UID or resourceVersion.
fn view_write_back(key: &str, job: &Job, view_key: &ViewKey) -> Option<ViewWriteBack> {
    let uid = job.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let rv = job.metadata.resource_version.as_deref().filter(|r| !r.is_empty())?;
    let mut trimmed = job.clone();
    trimmed.metadata.managed_fields = None;
    let bytes = serde_json::to_vec(&trimmed).ok()?;
    Some(ViewWriteBack {
        key: key.to_string(),
        job_uid: uid.to_string(),
        job: view_key.seal(EntryKind::Job, key, &bytes),
        resource_version: rv.to_string(),
    })
}

/// Why a view was not planned from.
#[derive(Debug)]
enum ViewProblem {
    /// An entry's seal does not open, or the Job is not the leased one.
    Forged(String),
    /// An entry does not parse.
    Undecodable(String),
    /// A delta that does not fit the view held (another version, UID or session, or a count
    /// that does not match): read the view whole.
    Gap(String),
}

/// Decodes the view of Job `key`: every entry must open with `view_key` as an entry of that
/// Job, and the Job must be the one leased (namespace, name and UID), before anything of it is
/// believed.
fn decode_view(v: JobView, key: &str, view_key: &ViewKey) -> Result<ViewRead, ViewProblem> {
    let job = open_job(&v, key, view_key)?;
    // Every pod is the Job's namespace's: the seal binds the entry to this key.
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let mut decoded = Vec::with_capacity(v.pods.len());
    for p in &v.pods {
        decoded.push(Some(open_pod(p, key, namespace, view_key)?));
    }
    // In name order, as a LIST returns them. A Pod is kilobytes inline, so the order is sorted
    // as indices and each pod moved once (sorting the pods moved each ~log n times: a quarter
    // of a worker's CPU on a 5,000-pod Job went to memmove).
    let name = |i: &usize| decoded[*i].as_ref().and_then(|p| p.metadata.name.as_deref());
    let mut order: Vec<usize> = (0..decoded.len()).collect();
    order.sort_by(|a, b| name(a).cmp(&name(b)));
    let mut pods = SummarizedPods::with_capacity(decoded.len());
    for i in order {
        if let Some(p) = decoded[i].take() {
            pods.push(p);
        }
    }
    let pods = claimed_view_pods(&job, pods);
    Ok(view_read(v, job, pods))
}

/// The pods a sync plans from (those the Job claims), decoded from trusted view `v` of Job
/// `key` as a sync's read does: with `cache`, a delta is applied to the view it holds for
/// `key` and the result held again (a whole view with its pods' names becomes what it holds),
/// and the pods are the held ones, shared; without, the whole view is decoded. `Err` says why
/// a sync would not plan from the view (it drops what `cache` held). For measurements and
/// tests of the view read outside a sync.
pub fn view_pods(
    v: JobView,
    key: &str,
    view_key: &ViewKey,
    cache: Option<&crate::view_cache::ViewCache>,
) -> Result<SummarizedPods, String> {
    let problem = |e: ViewProblem| format!("{e:?}");
    let read = match cache {
        None => decode_view(v, key, view_key).map_err(problem)?,
        Some(cache) => {
            let (read, keep) = decode_cached(v, key, view_key, cache.take(key)).map_err(problem)?;
            if let Some(c) = keep {
                cache.put(key, c);
            }
            read
        }
    };
    read.pods.map_err(|e| e.to_string())
}

/// The read of view `v` once its Job and pods are decoded.
fn view_read(v: JobView, job: Job, pods: Result<SummarizedPods, SyncError>) -> ViewRead {
    let backoff = v.records.into_iter().find(|r| r.name == BACKOFF_RECORD).map(|r| r.value);
    ViewRead {
        job,
        pods,
        expectations: v.expectations,
        orphans_pending: (v.orphans_seen > v.orphans_handled).then_some(v.orphans_seen),
        backoff,
    }
}

/// Decodes view `v` of Job `key` with the worker's cache (issue 46): a delta is applied to
/// `held` (the view this worker last planned from), which must be of the delta's base version,
/// UID and session, and hold the view's count after it; a whole view with its pods' names
/// becomes what is held. Every entry is opened and decoded as [`decode_view`] does, and the
/// pods come in the same order, so the plan is the one a full read would make; the read's pods
/// are the held ones, shared, not a copy. Returns the read and the view to hold next (`None`:
/// hold nothing, e.g. a server that sends no names).
fn decode_cached(
    mut v: JobView,
    key: &str,
    view_key: &ViewKey,
    held: Option<CachedJob>,
) -> Result<(ViewRead, Option<CachedJob>), ViewProblem> {
    let gap = |why: &str| ViewProblem::Gap(why.to_string());
    if !v.delta && (v.pod_names.len() != v.pods.len() || v.epoch.is_empty()) {
        return decode_view(v, key, view_key).map(|r| (r, None));
    }
    let job = open_job(&v, key, view_key)?;
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let names = std::mem::take(&mut v.pod_names);
    let entries = std::mem::take(&mut v.pods);
    if names.len() != entries.len() {
        return Err(gap("a delta's names do not match its pods"));
    }
    let mut c = if v.delta {
        let Some(c) = held else { return Err(gap("a delta, and no view held")) };
        // A delta from an older base than the view held applies too: it holds every pod that
        // changed after its base, so every one that changed after the held version, at its
        // current bytes, and names every pod gone since; the rest is the same in both. A
        // worker's Lease may name the version it held before its last sync's read (the Lease
        // that carries that sync's Done is built beside it), so this is the common case.
        let fits = c.uid == v.job_uid
            && c.epoch == v.epoch
            && v.delta_base <= c.version
            && c.version <= v.version;
        if !fits {
            return Err(ViewProblem::Gap(format!(
                "a delta from another version, UID or session than the one held: held {} {} {}, delta from {} {} {}",
                c.uid, c.epoch, c.version, v.job_uid, v.epoch, v.delta_base
            )));
        }
        c
    } else {
        CachedJob::new(v.job_uid.clone(), v.epoch.clone())
    };
    // Opened in name order (a whole view's pages come in hash order), so they go in with one
    // pass over what is held.
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|a, b| names[*a].cmp(&names[*b]));
    let mut changed = Vec::with_capacity(order.len());
    for i in order {
        let pod = open_pod(&entries[i], key, namespace, view_key)?;
        // The cache finds pods by name: each must be held under its own, as the watcher
        // writes them. Anything else is planned from as a full read plans from it, and not
        // held.
        if pod.metadata.name.as_deref() != Some(names[i].as_str()) {
            if v.delta {
                return Err(gap("a changed pod is not held under its own name"));
            }
            v.pods = entries;
            return decode_view(v, key, view_key).map(|r| (r, None));
        }
        changed.push(pod);
    }
    c.apply(&v.removed, changed);
    c.version = v.version;
    let count = v.pod_count.and_then(|n| usize::try_from(n).ok());
    if count != Some(c.len()) {
        if !v.delta {
            // A name twice in a whole view: plan from it as it is, hold nothing.
            v.pods = entries;
            return decode_view(v, key, view_key).map(|r| (r, None));
        }
        return Err(gap("the view's count after the delta is not the one held"));
    }
    let pods = job_selector(&job).map(|selector| c.claimed(&job, &selector));
    Ok((view_read(v, job, pods), Some(c)))
}

/// Opens view `v`'s Job: sealed by kjob as the object of Job `key`, and that Job (namespace,
/// name and the view's UID).
fn open_job(v: &JobView, key: &str, view_key: &ViewKey) -> Result<Job, ViewProblem> {
    let forged = |what: &str, e: SealError| ViewProblem::Forged(format!("{what}: {e}"));
    let undecodable =
        |what: &str, e: &dyn std::fmt::Display| ViewProblem::Undecodable(format!("{what}: {e}"));
    let job_bytes = view_key.open(EntryKind::Job, key, &v.job).map_err(|e| forged("job", e))?;
    let job: Job = serde_json::from_slice(job_bytes).map_err(|e| undecodable("job", &e))?;
    let named = format!(
        "{}/{}",
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default()
    );
    if named != key {
        return Err(ViewProblem::Forged(format!("the view of {key} holds Job {named}")));
    }
    if job.metadata.uid.as_deref() != Some(v.job_uid.as_str()) {
        return Err(ViewProblem::Forged(format!(
            "job UID {:?} is not the view's {:?}",
            job.metadata.uid, v.job_uid
        )));
    }
    Ok(job)
}

/// Opens one pod entry of Job `key`'s view (of `namespace`, the Job's).
fn open_pod(
    entry: &[u8],
    key: &str,
    namespace: &str,
    view_key: &ViewKey,
) -> Result<Pod, ViewProblem> {
    let bytes = view_key
        .open(EntryKind::Pod, key, entry)
        .map_err(|e| ViewProblem::Forged(format!("pod: {e}")))?;
    // The compact entry, or the trimmed JSON of a watcher before it (a rolling upgrade); one
    // that does not decode whole drops the view, never a part of a pod.
    view_pod::decode(bytes, namespace).map_err(|e| ViewProblem::Undecodable(format!("pod: {e}")))
}

fn job_name(job: &Job) -> &str {
    job.metadata.name.as_deref().unwrap_or_default()
}

/// The view's pods the Job claims. The view holds every pod the Job controls, matching its
/// selector or not; one that does not match is the orphan queue's to release, and upstream's
/// `ClaimPods` never counts it (counted, it would be an active pod too many, and deleted).
/// The worker's view cache keeps the same claims per pod ([`CachedJob::claimed`]).
fn claimed_view_pods(job: &Job, mut pods: SummarizedPods) -> Result<SummarizedPods, SyncError> {
    let selector = job_selector(job)?;
    pods.retain(|p| claim(job, &selector, p) == Claim::Owned);
    Ok(pods)
}

/// The Job's selector, as upstream `metav1.LabelSelectorAsSelector`: an empty selector
/// (`selector: {}`, possible with `manualSelector: true`) selects every pod of the namespace and
/// is synced like any other; an invalid one is an error. A missing selector is an error too:
/// upstream reads it as "matches nothing", which the API server never lets a Job have
/// (`spec.selector` is required), and a Job that can claim none of the pods it creates would
/// create pods without end.
pub(crate) fn job_selector(job: &Job) -> Result<Selector, SyncError> {
    let Some(ls) = job.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return Err(SyncError::InvalidJob("no selector".into()));
    };
    Selector::compile(Some(ls)).map_err(|e| SyncError::InvalidJob(format!("invalid selector: {e}")))
}

/// Strategic merge patch adopting a pod (upstream `ownerRefControllerPatch` with the tracking
/// finalizer); the pod UID guards against patching a recreated pod of the same name.
pub fn adoption_patch(job: &Job, pod: &Pod) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "ownerReferences": [kjob_reconcile::template::controller_ref(job)],
            "uid": pod.metadata.uid,
            "finalizers": [JOB_TRACKING_FINALIZER],
        }
    })
}

/// UIDs in `status.uncountedTerminatedPods` (succeeded and failed).
fn uncounted_uids(status: Option<&k8s_openapi::api::batch::v1::JobStatus>) -> BTreeSet<String> {
    let Some(u) = status.and_then(|s| s.uncounted_terminated_pods.as_ref()) else {
        return BTreeSet::new();
    };
    u.succeeded.iter().chain(u.failed.iter()).flatten().cloned().collect()
}

/// What a pod call skipped because the worker is handing its keys back reports.
fn winding_down() -> CallError {
    CallError::Other("the worker is shutting down; not sent".into())
}

/// Adds each nonzero `(name, n)` of `counts` to the series of `family` that `labels(name)` names
/// (upstream adds nothing to a series whose increment is zero).
fn add_counts<L: Clone + std::hash::Hash + Eq>(
    family: &Family<L, Counter>,
    counts: [(&'static str, u64); 2],
    labels: impl Fn(&'static str) -> L,
) {
    for (name, n) in counts {
        if n > 0 {
            family.get_or_create(&labels(name)).inc_by(n);
        }
    }
}

fn call_error(e: ApiError) -> CallError {
    match e {
        ApiError::NotFound(_) => CallError::NotFound,
        e if e.is_namespace_terminating() => CallError::NamespaceTerminating(e.to_string()),
        ApiError::Refused { message, .. } => CallError::Other(message),
        e => CallError::Other(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::batch::v1::JobSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kjob_reconcile::testutil::{mk_job, mk_pod};

    use super::*;

    fn job_key(job: &Job) -> String {
        format!("{}/{}", job.metadata.namespace.as_deref().unwrap(), job_name(job))
    }

    /// A view entry counts only when it opens with the view key as an entry of the leased Job:
    /// a bare or re-sealed object, a pod sealed for another Job, or another Job under this key
    /// are all refused as forged, and nothing of that view is planned from.
    #[test]
    fn only_a_view_sealed_for_the_leased_job_is_believed() {
        let job = mk_job("pi").build();
        let other = mk_job("other").build();
        let (k, key) = (ViewKey::new(&[9; 32]).unwrap(), job_key(&job));
        let json = serde_json::to_vec(&job).unwrap();
        let pod = serde_json::to_vec(&mk_pod(&job, "p").build()).unwrap();
        let view = |job: Vec<u8>, pods: Vec<Vec<u8>>| JobView {
            job,
            job_uid: "not-the-uid".into(),
            pods,
            ..Default::default()
        };
        let uid = job.metadata.uid.clone().unwrap();
        let with_uid = |mut v: JobView| {
            v.job_uid = uid.clone();
            v
        };
        let good = with_uid(view(
            k.seal(EntryKind::Job, &key, &json),
            vec![k.seal(EntryKind::Pod, &key, &pod)],
        ));
        assert!(decode_view(good, &key, &k).is_ok());
        let forged = |v: JobView| matches!(decode_view(v, &key, &k), Err(ViewProblem::Forged(_)));
        assert!(forged(with_uid(view(json.clone(), vec![]))), "unsealed Job");
        let attacker = ViewKey::new(&[1; 32]).unwrap();
        assert!(forged(with_uid(view(attacker.seal(EntryKind::Job, &key, &json), vec![]))));
        let moved_pod = k.seal(EntryKind::Pod, &job_key(&other), &pod);
        assert!(forged(with_uid(view(k.seal(EntryKind::Job, &key, &json), vec![moved_pod]))));
        let as_pod = k.seal(EntryKind::Pod, &key, &json);
        assert!(forged(with_uid(view(as_pod, vec![]))), "a pod entry passed off as the Job");
        let other_json = serde_json::to_vec(&other).unwrap();
        let mut under_key = view(k.seal(EntryKind::Job, &key, &other_json), vec![]);
        under_key.job_uid = other.metadata.uid.clone().unwrap();
        assert!(forged(under_key), "another Job sealed under this key");
        let wrong_uid = view(k.seal(EntryKind::Job, &key, &json), vec![]);
        assert!(forged(wrong_uid), "the view's UID is not the Job's");
        let back = view_write_back(&key, &job, &k).unwrap();
        assert!(k.open(EntryKind::Job, &key, &back.job).is_ok(), "write-backs are sealed");
    }

    #[test]
    fn view_pods_come_in_name_order_with_their_summaries() {
        let job = mk_job("pi").indexed().completions(Some(4)).build();
        let (k, key) = (ViewKey::new(&[9; 32]).unwrap(), job_key(&job));
        let pods: Vec<Vec<u8>> = [("c", 2), ("a", 0), ("d", 3), ("b", 1)]
            .iter()
            .map(|(n, i)| serde_json::to_vec(&mk_pod(&job, n).index(*i).build()).unwrap())
            .map(|p| k.seal(EntryKind::Pod, &key, &p))
            .collect();
        let view = JobView {
            job: k.seal(EntryKind::Job, &key, &serde_json::to_vec(&job).unwrap()),
            job_uid: job.metadata.uid.clone().unwrap(),
            pods,
            ..Default::default()
        };
        let pods = decode_view(view, &key, &k).unwrap().pods.unwrap();
        let names: Vec<_> = pods.pods().iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        let indexes: Vec<_> = pods.summaries().iter().map(|s| s.index()).collect();
        assert_eq!(indexes, [Some(0), Some(1), Some(2), Some(3)]);
    }

    /// A view of `pods` (each under its own name) at `version`, as a caching reader gets it:
    /// whole, or (with `delta_base`) what changed since that version, `removed` gone.
    fn named_view(
        job: &Job,
        k: &ViewKey,
        version: u64,
        count: usize,
        pods: &[Pod],
        delta: Option<(u64, &[&str])>,
    ) -> JobView {
        let key = job_key(job);
        JobView {
            trusted: true,
            job: k.seal(EntryKind::Job, &key, &serde_json::to_vec(job).unwrap()),
            job_uid: job.metadata.uid.clone().unwrap(),
            pods: pods
                .iter()
                .map(|p| k.seal(EntryKind::Pod, &key, &serde_json::to_vec(p).unwrap()))
                .collect(),
            pod_names: pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect(),
            version,
            pod_count: Some(count as u64),
            epoch: "epoch-1".into(),
            delta: delta.is_some(),
            delta_base: delta.map_or(0, |(b, _)| b),
            removed: delta.map_or(Vec::new(), |(_, r)| r.iter().map(|n| n.to_string()).collect()),
            ..Default::default()
        }
    }

    /// Through the sync's read: the pods a delta read hands the plan are the cache's own
    /// (the same `Arc`s, no copy), the same as a full read's, and a later delta applied to
    /// the cache leaves the pods an earlier sync holds as they were (no aliasing).
    #[test]
    fn delta_reads_hand_over_the_held_pods_and_never_change_a_sync_s() {
        let job = mk_job("pi").indexed().completions(Some(5)).build();
        let (k, key) = (ViewKey::new(&[9; 32]).unwrap(), job_key(&job));
        let pod =
            |n: &str, i: i32, restarts: i32| mk_pod(&job, n).index(i).restarts(restarts).build();
        let all = [pod("pi-3", 3, 0), pod("pi-0", 0, 0), pod("pi-2", 2, 0), pod("pi-1", 1, 0)];
        let cache = crate::view_cache::ViewCache::new(100);
        let first =
            view_pods(named_view(&job, &k, 1, 4, &all, None), &key, &k, Some(&cache)).unwrap();
        let full = view_pods(named_view(&job, &k, 1, 4, &all, None), &key, &k, None).unwrap();
        assert_eq!(first.pods(), full.pods(), "a whole read through the cache is a full read");
        assert_eq!(first.summaries(), full.summaries());

        // pi-2 restarted, pi-0 is gone, pi-4 is new.
        let changed = [pod("pi-2", 2, 1), pod("pi-4", 4, 0)];
        let delta = named_view(&job, &k, 2, 4, &changed, Some((1, &["pi-0"])));
        let second = view_pods(delta, &key, &k, Some(&cache)).unwrap();
        let now = [pod("pi-1", 1, 0), pod("pi-2", 2, 1), pod("pi-3", 3, 0), pod("pi-4", 4, 0)];
        let full = view_pods(named_view(&job, &k, 2, 4, &now, None), &key, &k, None).unwrap();
        assert_eq!(second.pods(), full.pods(), "the delta's pods are the full read's");
        assert_eq!(second.summaries(), full.summaries());
        let held = cache.take(&key).unwrap();
        assert!(second.shares_with(held.pods()), "the plan's pods are the cache's, not a copy");
        assert!(Arc::ptr_eq(&second.pods()[0], &held.pods().pods()[0]));
        cache.put(&key, held);
        assert!(Arc::ptr_eq(&second.pods()[0], &first.pods()[1]), "pi-1 was never copied");
        let names = |p: &SummarizedPods| -> Vec<String> {
            p.pods().iter().map(|p| p.metadata.name.clone().unwrap()).collect()
        };
        assert_eq!(names(&first), ["pi-0", "pi-1", "pi-2", "pi-3"], "the first sync's pods");
        assert_eq!(kjob_reconcile::pod::total_restarts(&first.pods()[2]), 0, "pi-2 as it was");

        // And a third delta while the second sync still holds its pods.
        let delta = named_view(&job, &k, 3, 3, &[], Some((2, &["pi-4"])));
        let third = view_pods(delta, &key, &k, Some(&cache)).unwrap();
        assert_eq!(names(&third), ["pi-1", "pi-2", "pi-3"]);
        assert_eq!(names(&second), ["pi-1", "pi-2", "pi-3", "pi-4"], "the second sync's pods");
        assert_eq!(second.summaries().len(), 4);
    }

    /// During a rolling upgrade a view may hold entries of either format (the trimmed JSON of
    /// a watcher before the compact one, and compact entries): both are read. An entry of a
    /// format this worker does not know (a newer watcher's) drops the whole view, so the sync
    /// reads the API server and plans from no part of it.
    #[test]
    fn view_entries_of_either_format_are_read_and_unknown_ones_drop_the_view() {
        use kjob_reconcile::view_pod as vp;
        let job = mk_job("pi").indexed().completions(Some(4)).build();
        let (k, key) = (ViewKey::new(&[9; 32]).unwrap(), job_key(&job));
        let controller = kjob_reconcile::template::controller_ref(&job);
        let compact = |name: &str, index: &str, labelled: bool| {
            let dict = vp::Dict::new(Some((&controller.name, &controller.uid)));
            let plain = vp::Dict::default();
            let (name, name_after_controller) = dict.name(name);
            let (uuid, uid) = vp::uid_parts("u-compact");
            let (api_version, api_version_text) = plain.code(&controller.api_version);
            let (kind, kind_text) = plain.code(&controller.kind);
            let (owner_uuid, owner_uid) = vp::uid_parts(&controller.uid);
            let (phase, phase_text) = dict.code("Running");
            vp::ViewPod {
                name,
                name_after_controller,
                uuid,
                uid,
                annotations: vec![dict.pair(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION, index)],
                labels: if labelled {
                    vec![dict.pair(kjob_core::CONTROLLER_UID_LABEL, &controller.uid)]
                } else {
                    Vec::new()
                },
                finalizers: vec![dict.sym(JOB_TRACKING_FINALIZER)],
                owners: vec![vp::Owner {
                    api_version,
                    api_version_text,
                    kind,
                    kind_text,
                    name: controller.name.clone(),
                    uuid: owner_uuid,
                    uid: owner_uid,
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }],
                status: Some(vp::Status { phase, phase_text, ..Default::default() }),
                ..Default::default()
            }
            .to_entry()
        };
        let legacy = serde_json::to_vec(&mk_pod(&job, "pi-0-a").index(0).build()).unwrap();
        let view = |entries: Vec<Vec<u8>>| JobView {
            job: k.seal(EntryKind::Job, &key, &serde_json::to_vec(&job).unwrap()),
            job_uid: job.metadata.uid.clone().unwrap(),
            pods: entries.iter().map(|e| k.seal(EntryKind::Pod, &key, e)).collect(),
            ..Default::default()
        };
        let entries =
            vec![compact("pi-1-b", "1", true), legacy.clone(), compact("pi-2-c", "2", false)];
        let read = decode_view(view(entries), &key, &k).unwrap().pods.unwrap();
        let pods = read.pods();
        assert_eq!(pods.len(), 2, "a pod without the selector's labels is not claimed");
        assert_eq!(pods[1].metadata.name.as_deref(), Some("pi-1-b"));
        assert_eq!(pods[1].metadata.namespace, job.metadata.namespace, "the Job's namespace");
        let indexes: Vec<_> = read.summaries().iter().map(|s| s.index()).collect();
        assert_eq!(indexes, [Some(0), Some(1)]);
        let mut newer = compact("pi-2-c", "2", true);
        newer[0] = vp::FORMAT_V1 + 1;
        let r = decode_view(view(vec![legacy, newer]), &key, &k);
        assert!(matches!(r, Err(ViewProblem::Undecodable(_))), "a newer format drops the view");
    }

    #[test]
    fn adoption_patch_shape() {
        let job = mk_job("pi").build();
        let pod = mk_pod(&job, "p").orphan().build();
        let p = adoption_patch(&job, &pod);
        assert_eq!(p["metadata"]["uid"], "p-uid");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "uid-pi");
        let owner = &p["metadata"]["ownerReferences"][0];
        assert_eq!(
            (&owner["controller"], &owner["blockOwnerDeletion"]),
            (&true.into(), &true.into())
        );
        assert_eq!((&owner["apiVersion"], &owner["kind"]), (&"batch/v1".into(), &"Job".into()));
        assert_eq!(p["metadata"]["finalizers"][0], JOB_TRACKING_FINALIZER);
    }

    #[test]
    fn backoff_record_belongs_to_one_job_uid() {
        let record = BackoffRecord {
            failures_after_last_success: 3,
            last_failure_time: Some("2026-01-01T00:00:10Z".parse().unwrap()),
        };
        let bytes = encode_backoff(&record, "uid-a");
        assert_eq!(decode_backoff(&bytes, "uid-a"), Some(record.clone()));
        // The same name recreated: a new UID starts without backoff.
        assert_eq!(decode_backoff(&bytes, "uid-b"), None);
        // Removed, unreadable, or written without a UID (before records carried one).
        assert_eq!(decode_backoff(b"", "uid-a"), None);
        assert_eq!(decode_backoff(b"{", "uid-a"), None);
        let legacy = serde_json::to_vec(&record).unwrap();
        assert_eq!(decode_backoff(&legacy, "uid-a"), None);
    }

    #[test]
    fn view_pods_that_stopped_matching_are_not_counted() {
        let job = mk_job("pi").build();
        let matching = mk_pod(&job, "pi-a").build();
        let mut relabelled = mk_pod(&job, "pi-b").build();
        relabelled.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
        let mut others = mk_pod(&job, "pi-c").build();
        others.metadata.owner_references.as_mut().unwrap()[0].uid = "another-job".into();
        let mut view = SummarizedPods::with_capacity(3);
        for p in [matching, relabelled, others] {
            view.push(p);
        }
        let claimed = claimed_view_pods(&job, view).unwrap();
        let names: Vec<_> = claimed.pods().iter().map(|p| p.metadata.name.clone()).collect();
        assert_eq!(names, [Some("pi-a".to_string())]);
        assert_eq!(claimed.summaries().len(), 1);
        // A Job without a selector is an error, not a Job that owns no pods.
        let mut bad = job.clone();
        bad.spec.as_mut().unwrap().selector = None;
        assert!(claimed_view_pods(&bad, SummarizedPods::with_capacity(0)).is_err());
    }

    #[test]
    fn selector_as_upstream_label_selector_as_selector() {
        let mut job = Job::default();
        assert!(job_selector(&job).is_err(), "no selector");
        let with = |ls: LabelSelector| Job {
            spec: Some(JobSpec { selector: Some(ls), ..Default::default() }),
            ..Default::default()
        };
        // `manualSelector: true` with `selector: {}`: selects every pod, no error.
        let every = job_selector(&with(LabelSelector::default())).unwrap();
        assert!(every.matches_pod(&Pod::default()));
        assert_eq!(every.api_query().as_deref(), Some(""));
        job = with(LabelSelector {
            match_labels: Some([("a".to_string(), "b".to_string())].into()),
            ..Default::default()
        });
        assert_eq!(job_selector(&job).unwrap().api_query().as_deref(), Some("a=b"));
        // Invalid, as the API server would never store it: an error, not a selector.
        let in_without_values = with(LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "a".into(),
                    operator: "In".into(),
                    values: Some(vec![]),
                },
            ]),
            ..Default::default()
        });
        assert!(job_selector(&in_without_values).is_err());
    }
}

#[cfg(test)]
mod stale_expectations_tests {
    use super::*;

    #[test]
    fn uncounted_uids_gathers_both_lists() {
        use k8s_openapi::api::batch::v1::{JobStatus, UncountedTerminatedPods};
        assert!(uncounted_uids(None).is_empty());
        let st = JobStatus {
            uncounted_terminated_pods: Some(UncountedTerminatedPods {
                succeeded: Some(vec!["a".into(), "b".into()]),
                failed: Some(vec!["c".into()]),
            }),
            ..Default::default()
        };
        let got: Vec<String> = uncounted_uids(Some(&st)).into_iter().collect();
        assert_eq!(got, ["a", "b", "c"]);
    }

    #[test]
    fn earliest_requeue_wins() {
        let s = Duration::from_secs;
        assert_eq!(earliest(None, None), None);
        assert_eq!(earliest(Some(s(5)), None), Some(s(5)));
        assert_eq!(earliest(None, Some(s(7))), Some(s(7)));
        assert_eq!(earliest(Some(s(5)), Some(s(7))), Some(s(5)));
        assert_eq!(earliest(Some(s(9)), Some(s(7))), Some(s(7)));
    }

    #[test]
    fn stale_records_count_as_satisfied_only_after_the_limit() {
        let limit = Duration::from_secs(45);
        // (satisfied, exists, age, want)
        let cases = [
            (true, false, 0, true),
            (true, true, 0, true),
            (false, true, 0, false),
            (false, true, 44, false),
            (false, true, 45, true),
            (false, true, 600, true),
        ];
        for (satisfied, exists, age, want) in cases {
            assert_eq!(
                expectations_usable(satisfied, exists, Duration::from_secs(age), limit),
                want,
                "satisfied={satisfied} exists={exists} age={age}s"
            );
        }
    }
}
