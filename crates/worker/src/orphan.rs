//! The `orphan-pod` queue: strip the tracking finalizer from pods no Job will ever count
//! (upstream `syncOrphanPod`).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::{JOB_TRACKING_FINALIZER, ObjectKey};
use kjob_reconcile::conditions::is_finished;
use kjob_reconcile::{Claim, claim};

use crate::context::{SyncContext, SyncError, SyncOutcome};
use crate::kube_api::ApiError;

/// What to do with a pod that reached the orphan queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanDecision {
    /// Leave the pod alone, with the reason (for logs).
    Keep(&'static str),
    /// Remove the tracking finalizer.
    RemoveFinalizer,
    /// The pod's controller is a running Job of ours whose selector no longer matches the
    /// pod's labels: remove that owner reference (upstream `ReleasePod`), then treat the pod
    /// as any orphan.
    Release {
        /// UID of the Job whose owner reference goes.
        job_uid: String,
    },
}

/// How the pod's controller resolves.
#[derive(Debug, Clone, PartialEq)]
pub enum ControllerLookup<'a> {
    /// The pod has no controller reference.
    None,
    /// The controller is something other than a batch/v1 Job.
    NotAJob,
    /// The controller is a batch/v1 Job with this name and UID; `job` is what a GET returned
    /// (`None` when it is gone or has another UID).
    Job(Option<&'a Job>),
}

/// A pod's controller reference, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Controller {
    /// No controller reference.
    None,
    /// A controller that is not a batch/v1 Job (CronJob, a CRD, …).
    NotAJob,
    /// A batch/v1 Job with this name and UID.
    Job {
        /// Job name.
        name: String,
        /// Job UID.
        uid: String,
    },
}

/// Classifies a pod's controller reference (the Job still needs to be fetched).
pub fn controller_of(pod: &Pod) -> Controller {
    let Some(owner) =
        pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true))
    else {
        return Controller::None;
    };
    if owner.kind != "Job" || owner.api_version != "batch/v1" {
        return Controller::NotAJob;
    }
    Controller::Job { name: owner.name.clone(), uid: owner.uid.clone() }
}

/// Whether upstream `ClaimPods` would release `pod` from `job` (its controller): the Job is
/// running (upstream's sync of a finished Job stops before claiming) and not being deleted,
/// the pod is not being deleted, and the Job's selector no longer matches the pod's labels. A
/// Job whose selector cannot be compiled never releases (its syncs refuse to run at all); one
/// whose selector is empty matches, so keeps, every pod.
pub fn should_release(pod: &Pod, job: &Job) -> bool {
    if pod.metadata.deletion_timestamp.is_some() || is_finished(job) {
        return false;
    }
    let Ok(selector) = crate::sync::job_selector(job) else { return false };
    claim(job, &selector, pod) == Claim::Release
}

/// Pure decision of upstream `syncOrphanPod`, plus the release of owned pods whose labels
/// stopped matching (upstream does that in the Job's own sync; kjob's syncs list pods by
/// selector and never see such a pod, so the watcher sends it here).
pub fn decide(
    pod: &Pod,
    controller: &ControllerLookup<'_>,
    controller_name: &str,
    manage_all: bool,
) -> OrphanDecision {
    if let ControllerLookup::Job(Some(job)) = controller
        && kjob_core::manages(
            job.spec.as_ref().and_then(|s| s.managed_by.as_deref()),
            controller_name,
            manage_all,
        )
        && should_release(pod, job)
    {
        return OrphanDecision::Release { job_uid: job.metadata.uid.clone().unwrap_or_default() };
    }
    if !has_tracking_finalizer(pod) {
        return OrphanDecision::Keep("no tracking finalizer");
    }
    match controller {
        ControllerLookup::None => OrphanDecision::RemoveFinalizer,
        ControllerLookup::NotAJob => OrphanDecision::Keep("controller is not a batch/v1 Job"),
        ControllerLookup::Job(None) => OrphanDecision::RemoveFinalizer,
        ControllerLookup::Job(Some(job)) => {
            let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.as_deref());
            if !kjob_core::manages(managed_by, controller_name, manage_all) {
                OrphanDecision::Keep("Job is managed by another controller")
            } else if !is_finished(job) {
                OrphanDecision::Keep("Job is running; it owns the pod")
            } else {
                OrphanDecision::RemoveFinalizer
            }
        }
    }
}

/// Whether the pod carries the Job tracking finalizer.
pub fn has_tracking_finalizer(pod: &Pod) -> bool {
    pod.metadata.finalizers.iter().flatten().any(|f| f == JOB_TRACKING_FINALIZER)
}

/// Syncs one `orphan-pod` key (`namespace/podname`).
pub async fn sync_orphan_pod(ctx: &SyncContext, key: &ObjectKey) -> Result<SyncOutcome, SyncError> {
    let Some(mut pod) = ctx.api.get_pod(&key.namespace, &key.name).await? else {
        return Ok(SyncOutcome::Done);
    };
    let job = match controller_of(&pod) {
        Controller::Job { name, uid } => ctx
            .api
            .get_job(&key.namespace, &name)
            .await?
            // A Job of the same name but another UID is a successor, not the pod's owner.
            .filter(|j| j.metadata.uid.as_deref() == Some(uid.as_str())),
        _ => None,
    };
    let mut decision =
        decide(&pod, &lookup(&pod, job.as_ref()), &ctx.controller_name, ctx.manage_all);
    if let OrphanDecision::Release { job_uid } = &decision {
        match release_pod(ctx, &pod, job_uid).await? {
            Some(released) => pod = released,
            None => return Ok(SyncOutcome::Done),
        }
        // Released, the pod is an orphan like any other (unless another controller
        // reference remains, which the decision reads from the patched pod).
        let rest = decide(&pod, &lookup(&pod, None), &ctx.controller_name, ctx.manage_all);
        decision = match rest {
            OrphanDecision::Release { .. } => OrphanDecision::Keep("still controlled"),
            d => d,
        };
    }
    match decision {
        OrphanDecision::Release { .. } => {}
        OrphanDecision::Keep(why) => {
            tracing::debug!(pod = %key, why, "leaving orphan pod alone");
        }
        OrphanDecision::RemoveFinalizer => {
            ctx.api.remove_tracking_finalizer(&key.namespace, &key.name).await?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                // Seen finished with the finalizer, then without it.
                ctx.metrics.finished_with_finalizer(1);
                ctx.metrics.finalizer_removals(1);
            }
            tracing::debug!(pod = %key, "removed tracking finalizer from orphan pod");
        }
    }
    Ok(SyncOutcome::Done)
}

/// Removes the Job's owner reference from `pod` (upstream `ReleasePod`: a strategic merge
/// `$patch: delete` by UID, with the pod's UID as precondition). Returns the patched pod,
/// or `None` when the pod is gone or was replaced by a namesake.
async fn release_pod(
    ctx: &SyncContext,
    pod: &Pod,
    job_uid: &str,
) -> Result<Option<Pod>, SyncError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match ctx.api.patch_pod(ns, name, &release_patch(pod, job_uid)).await {
        Ok(p) => {
            tracing::info!(pod = %format!("{ns}/{name}"), job_uid,
                    "released pod whose labels no longer match its Job");
            Ok(Some(p))
        }
        Err(ApiError::NotFound(_) | ApiError::Conflict { .. }) => Ok(None),
        // The UID precondition failed: the name now belongs to another pod.
        Err(ApiError::Refused { code: 422, .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How `pod`'s controller resolves, given the Job a GET returned for it (`None`: gone, another
/// UID, or not looked up because the controller is no Job).
fn lookup<'a>(pod: &Pod, job: Option<&'a Job>) -> ControllerLookup<'a> {
    match controller_of(pod) {
        Controller::None => ControllerLookup::None,
        Controller::NotAJob => ControllerLookup::NotAJob,
        Controller::Job { uid, .. } => {
            ControllerLookup::Job(job.filter(|j| j.metadata.uid.as_deref() == Some(uid.as_str())))
        }
    }
}

/// The strategic merge patch removing the owner reference with `owner_uid` (upstream
/// `deleteOwnerRefStrategicMergePatch`); the pod UID makes it fail on a recreated namesake.
pub fn release_patch(pod: &Pod, owner_uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "ownerReferences": [{"$patch": "delete", "uid": owner_uid}],
            "uid": pod.metadata.uid,
        }
    })
}

#[cfg(test)]
mod tests {
    use kjob_reconcile::testutil::{mk_job, mk_pod, t0};

    use super::*;

    const ME: &str = kjob_core::DEFAULT_CONTROLLER_NAME;

    /// Pod `p`, with or without the tracking finalizer, controlled by an object of
    /// `(apiVersion, kind)` named `j` with Job `j`'s UID, or by nothing.
    fn pod(finalizer: bool, owner: Option<(&str, &str)>) -> Pod {
        let b = mk_pod(&job(None, None), "p");
        let b = if finalizer { b } else { b.no_finalizer() };
        match owner {
            None => b.orphan(),
            Some((api_version, kind)) => b.with(|p| {
                let owner = &mut p.metadata.owner_references.as_mut().unwrap()[0];
                (owner.api_version, owner.kind) = (api_version.into(), kind.into());
            }),
        }
        .build()
    }

    /// Job `j`, finished with a True condition of type `finished` when set.
    fn job(finished: Option<&str>, managed_by: Option<&str>) -> Job {
        let b = mk_job("j");
        let b = match managed_by {
            Some(m) => b.managed_by(m),
            None => b,
        };
        match finished {
            Some(t) => b.condition(t, "True", "", "", t0()),
            None => b,
        }
        .build()
    }

    #[test]
    fn sync_orphan_pod_table() {
        use ControllerLookup as C;
        use OrphanDecision::*;
        let running = job(None, Some(ME));
        let complete = job(Some("Complete"), Some(ME));
        let failed = job(Some("Failed"), Some(ME));
        let only_target = job(Some("FailureTarget"), Some(ME));
        let external = job(Some("Complete"), Some("example.com/other"));
        let builtin_unset = job(Some("Complete"), None);
        let job_owned = pod(true, Some(("batch/v1", "Job")));
        let cases: Vec<(&str, Pod, C<'_>, bool, bool)> = vec![
            ("no finalizer", pod(false, None), C::None, false, false),
            ("no controller", pod(true, None), C::None, false, true),
            ("cronjob owner", pod(true, Some(("batch/v1", "CronJob"))), C::NotAJob, false, false),
            ("job gone", job_owned.clone(), C::Job(None), false, true),
            ("job running", job_owned.clone(), C::Job(Some(&running)), false, false),
            ("job only FailureTarget", job_owned.clone(), C::Job(Some(&only_target)), false, false),
            ("job complete", job_owned.clone(), C::Job(Some(&complete)), false, true),
            ("job failed", job_owned.clone(), C::Job(Some(&failed)), false, true),
            ("external", job_owned.clone(), C::Job(Some(&external)), true, false),
            (
                "unset, not manage-all",
                job_owned.clone(),
                C::Job(Some(&builtin_unset)),
                false,
                false,
            ),
            ("unset, manage-all", job_owned.clone(), C::Job(Some(&builtin_unset)), true, true),
        ];
        for (name, p, lookup, all, want_remove) in cases {
            let got = decide(&p, &lookup, ME, all);
            assert_eq!(got == RemoveFinalizer, want_remove, "{name}: {got:?}");
        }
    }

    #[test]
    fn owned_pods_whose_labels_stopped_matching_are_released() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
        let with_selector = |mut j: Job| {
            j.spec.as_mut().unwrap().selector = Some(LabelSelector {
                match_labels: Some([("app".to_string(), "x".to_string())].into()),
                ..Default::default()
            });
            j
        };
        let labelled = |mut p: Pod, v: Option<&str>| {
            p.metadata.labels = v.map(|v| [("app".to_string(), v.to_string())].into());
            p
        };
        let running = with_selector(job(None, Some(ME)));
        let complete = with_selector(job(Some("Complete"), Some(ME)));
        let external = with_selector(job(None, Some("example.com/other")));
        let mut deleting_job = running.clone();
        deleting_job.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let owned = pod(true, Some(("batch/v1", "Job")));
        let mut deleting_pod = labelled(owned.clone(), Some("y"));
        deleting_pod.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let release = OrphanDecision::Release { job_uid: "uid-j".into() };
        use ControllerLookup as C;
        // (case, pod, job, expected)
        let cases: Vec<(&str, Pod, &Job, OrphanDecision)> = vec![
            ("labels edited", labelled(owned.clone(), Some("y")), &running, release.clone()),
            ("labels removed", labelled(owned.clone(), None), &running, release.clone()),
            (
                "no finalizer is released too",
                labelled(pod(false, Some(("batch/v1", "Job"))), Some("y")),
                &running,
                release.clone(),
            ),
            (
                "still matching",
                labelled(owned.clone(), Some("x")),
                &running,
                OrphanDecision::Keep("Job is running; it owns the pod"),
            ),
            (
                "pod being deleted",
                deleting_pod,
                &running,
                OrphanDecision::Keep("Job is running; it owns the pod"),
            ),
            (
                "job being deleted",
                labelled(owned.clone(), Some("y")),
                &deleting_job,
                OrphanDecision::Keep("Job is running; it owns the pod"),
            ),
            (
                "finished job: plain orphan cleanup",
                labelled(owned.clone(), Some("y")),
                &complete,
                OrphanDecision::RemoveFinalizer,
            ),
            (
                "another controller's job",
                labelled(owned.clone(), Some("y")),
                &external,
                OrphanDecision::Keep("Job is managed by another controller"),
            ),
        ];
        for (name, p, j, want) in cases {
            assert_eq!(decide(&p, &C::Job(Some(j)), ME, false), want, "{name}");
        }
        let p = release_patch(&labelled(owned, Some("y")), "uid-j");
        assert_eq!(
            p,
            serde_json::json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": "uid-j"}], "uid": "p-uid"}})
        );
    }

    #[test]
    fn controller_ref_classification() {
        assert_eq!(controller_of(&pod(true, None)), Controller::None);
        assert_eq!(controller_of(&pod(true, Some(("batch/v1", "CronJob")))), Controller::NotAJob);
        assert_eq!(controller_of(&pod(true, Some(("example.com/v1", "Job")))), Controller::NotAJob);
        assert_eq!(
            controller_of(&pod(true, Some(("batch/v1", "Job")))),
            Controller::Job { name: "j".into(), uid: "uid-j".into() }
        );
    }
}
