//! Drives a `JobSync` to its end against a scripted API: every call succeeds unless the script
//! says otherwise, and the trace records what the worker would have done.

#![allow(dead_code)]

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use kjob_reconcile::testutil::sync_input;
use kjob_reconcile::{CallError, Expectations, JobSync, Outcome, Report, Step, SyncInput};

/// Scripted failures.
#[derive(Debug, Default, Clone)]
pub struct Api {
    /// Creates fail (with this message) from the n-th create on (0-based), if set.
    pub fail_creates_from: Option<usize>,
    /// Pod names whose delete fails.
    pub fail_deletes: BTreeSet<String>,
    /// Pod names whose finalizer patch fails.
    pub fail_finalizer: BTreeSet<String>,
    /// Status writes fail from the n-th write on (0-based), if set.
    pub fail_writes_from: Option<usize>,
}

/// What one sync did.
#[derive(Debug, Default)]
pub struct Trace {
    /// Every status written (successfully or not), in order.
    pub writes: Vec<JobStatus>,
    /// Created pods in order, with the name the "server" gave them.
    pub created: Vec<(String, Pod)>,
    /// Sizes of the create batches.
    pub batches: Vec<usize>,
    /// Deleted pod names; `(name, finalizer removed first)`.
    pub deleted: Vec<(String, bool)>,
    /// Pods whose finalizer was patched away.
    pub finalizers_removed: Vec<String>,
    /// Expectation operations in order.
    pub expectations: Vec<Expectations>,
    /// Kinds of steps in order (for ordering assertions).
    pub kinds: Vec<&'static str>,
    /// The end of the sync.
    pub outcome: Outcome,
}

impl Trace {
    /// The last status written, if any.
    pub fn last_status(&self) -> Option<&JobStatus> {
        self.writes.last()
    }

    /// Names of the events, `reason: message`.
    pub fn events(&self) -> Vec<String> {
        self.outcome.events.iter().map(|e| format!("{}: {}", e.reason, e.message)).collect()
    }

    /// Condition types of the last written status, in order.
    pub fn condition_types(&self) -> Vec<String> {
        self.last_status()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| cs.iter().map(|c| format!("{}={}", c.type_, c.status)).collect())
            .unwrap_or_default()
    }
}

/// Inputs besides the Job and pods, with test defaults.
#[derive(Debug, Clone)]
pub struct Env {
    /// Sync time.
    pub now: Timestamp,
    /// Expectations satisfied.
    pub satisfied: bool,
    /// Finalizer removals in flight.
    pub in_flight: BTreeSet<String>,
    /// Backoff record.
    pub backoff: Option<kjob_reconcile::BackoffRecord>,
    /// First suffix the fake API server uses for generated names (keeps names unique).
    pub name_offset: usize,
}

impl Env {
    /// Defaults: `now`, satisfied expectations, nothing in flight, no backoff record.
    pub fn at(now: Timestamp) -> Self {
        Env { now, satisfied: true, in_flight: BTreeSet::new(), backoff: None, name_offset: 0 }
    }
}

/// Runs one sync to its end.
pub fn run(job: &Job, pods: &[Pod], env: &Env, api: &Api) -> Trace {
    let input = SyncInput {
        expectations_satisfied: env.satisfied,
        backoff: env.backoff.as_ref(),
        ..sync_input(job, pods, env.now, &env.in_flight)
    };
    let mut sync = JobSync::new(input);
    let mut trace = Trace::default();
    let mut creates = 0usize;
    let mut names = env.name_offset;
    for _ in 0..10_000 {
        let step = sync.next_step();
        let report = match step {
            Step::Done(outcome) => {
                trace.kinds.push("done");
                trace.outcome = *outcome;
                return trace;
            }
            Step::Expectations(op) => {
                trace.kinds.push("expectations");
                trace.expectations.push(op);
                continue;
            }
            Step::CreatePods { pods } => {
                trace.kinds.push("create");
                trace.batches.push(pods.len());
                let mut results = Vec::new();
                for pod in pods {
                    let i = creates;
                    creates += 1;
                    if api.fail_creates_from.is_some_and(|n| i >= n) {
                        results.push(Err(CallError::Other("quota exceeded".into())));
                        continue;
                    }
                    let name = format!(
                        "{}{names}",
                        pod.metadata.generate_name.clone().unwrap_or_default()
                    );
                    names += 1;
                    trace.created.push((name.clone(), pod));
                    results.push(Ok(name));
                }
                Report::PodsCreated(results)
            }
            Step::DeletePods { pods, remove_finalizer } => {
                trace.kinds.push(if remove_finalizer { "delete+patch" } else { "delete" });
                let mut results = Vec::new();
                for p in pods {
                    if remove_finalizer && api.fail_finalizer.contains(&p.name) {
                        results.push(Err(CallError::FinalizerPatch("conflict".into())));
                    } else if api.fail_deletes.contains(&p.name) {
                        results.push(Err(CallError::Other("delete refused".into())));
                    } else {
                        trace.deleted.push((p.name, remove_finalizer));
                        results.push(Ok(()));
                    }
                }
                Report::PodsDeleted(results)
            }
            Step::RemoveFinalizers { pods } => {
                trace.kinds.push("remove-finalizers");
                let mut results = Vec::new();
                for p in pods {
                    if api.fail_finalizer.contains(&p.name) {
                        results.push(Err(CallError::Other("conflict".into())));
                    } else {
                        trace.finalizers_removed.push(p.name);
                        results.push(Ok(()));
                    }
                }
                Report::FinalizersRemoved(results)
            }
            Step::UpdateStatus { status } => {
                trace.kinds.push("status");
                let i = trace.writes.len();
                trace.writes.push(*status);
                if api.fail_writes_from.is_some_and(|n| i >= n) {
                    Report::StatusUpdated(Err("conflict".into()))
                } else {
                    Report::StatusUpdated(Ok(()))
                }
            }
        };
        sync.report(report).expect("report answers the step");
    }
    panic!("sync did not end within 10000 steps");
}

/// Applies a written status to the Job, as the API server would (for multi-sync scenarios).
pub fn apply(job: &mut Job, status: &JobStatus) {
    job.status = Some(status.clone());
}

/// A tiny API server + kubelet for multi-sync scenarios: it applies what a sync did to the Job
/// and its pods, the way the real API server would.
#[derive(Debug, Clone)]
pub struct World {
    /// The Job as stored.
    pub job: Job,
    /// The pods as stored.
    pub pods: Vec<Pod>,
    /// Persisted backoff record.
    pub backoff: Option<kjob_reconcile::BackoffRecord>,
    /// Counter for generated names/UIDs.
    pub next_id: usize,
    /// Scripted API failures for the next syncs.
    pub api: Api,
    /// Whether the next syncs see their expectations satisfied.
    pub satisfied: bool,
}

impl World {
    /// A world holding `job` and `pods`.
    pub fn new(job: Job, pods: Vec<Pod>) -> Self {
        World { job, pods, backoff: None, next_id: 0, api: Api::default(), satisfied: true }
    }

    /// Runs one sync at `now` and applies its effects. Returns the trace.
    pub fn sync(&mut self, now: Timestamp) -> Trace {
        let mut env = Env::at(now);
        env.backoff = self.backoff.clone();
        env.name_offset = self.next_id;
        env.satisfied = self.satisfied;
        let trace = run(&self.job, &self.pods, &env, &self.api);
        self.apply(&trace, now);
        trace
    }

    /// Applies a sync's effects.
    pub fn apply(&mut self, trace: &Trace, now: Timestamp) {
        if let Some(st) = trace.outcome.status_written.as_deref() {
            self.job.status = Some(st.clone());
        }
        match &trace.outcome.backoff {
            kjob_reconcile::BackoffUpdate::Put(r) => self.backoff = Some(r.clone()),
            kjob_reconcile::BackoffUpdate::Remove => self.backoff = None,
            kjob_reconcile::BackoffUpdate::Keep => {}
        }
        for (name, pod) in &trace.created {
            let mut pod = pod.clone();
            self.next_id += 1;
            pod.metadata.name = Some(name.clone());
            pod.metadata.namespace = self.job.metadata.namespace.clone();
            pod.metadata.uid = Some(format!("{name}-uid-{}", self.next_id));
            pod.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
            pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            });
            self.pods.push(pod);
        }
        let drop_finalizer = |p: &mut Pod| {
            if let Some(f) = p.metadata.finalizers.as_mut() {
                f.retain(|x| x != kjob_core::JOB_TRACKING_FINALIZER);
            }
        };
        for name in &trace.finalizers_removed {
            if let Some(p) = self.pods.iter_mut().find(|p| p.metadata.name.as_deref() == Some(name))
            {
                drop_finalizer(p);
            }
        }
        for (name, patched) in &trace.deleted {
            if let Some(p) = self.pods.iter_mut().find(|p| p.metadata.name.as_deref() == Some(name))
            {
                if *patched {
                    drop_finalizer(p);
                }
                if p.metadata.deletion_timestamp.is_none() {
                    p.metadata.deletion_timestamp =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
                }
            }
        }
        // Objects being deleted disappear once their finalizers are gone (graceful deletion is
        // instantaneous here: the kubelet is fast).
        self.pods.retain(|p| {
            p.metadata.deletion_timestamp.is_none()
                || p.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty())
        });
    }

    /// Finds a pod by name prefix.
    pub fn pod_mut(&mut self, name: &str) -> &mut Pod {
        self.pods.iter_mut().find(|p| p.metadata.name.as_deref() == Some(name)).expect("pod exists")
    }

    /// Kubelet: pods being deleted finish terminating (phase Failed), so only the finalizer
    /// keeps them.
    pub fn kubelet_finish_terminating(&mut self) {
        for p in &mut self.pods {
            if p.metadata.deletion_timestamp.is_some() {
                let st = p.status.get_or_insert_with(Default::default);
                if !matches!(st.phase.as_deref(), Some("Succeeded" | "Failed")) {
                    st.phase = Some("Failed".into());
                }
            }
        }
    }
}
