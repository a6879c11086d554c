//! The `orphan-pod` queue: strip the tracking finalizer from pods no Job will ever count
//! (upstream `syncOrphanPod`).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::{JOB_TRACKING_FINALIZER, ObjectKey};

use crate::worker::{SyncError, SyncOutcome, Worker};

/// What to do with a pod that reached the orphan queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanDecision {
    /// Leave the pod alone, with the reason (for logs).
    Keep(&'static str),
    /// Remove the tracking finalizer.
    RemoveFinalizer,
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

/// Whether a Job has a `Complete` or `Failed` condition with status True (upstream
/// `IsJobFinished`).
pub fn is_job_finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

/// Pure decision of upstream `syncOrphanPod`.
pub fn decide(
    pod: &Pod,
    controller: &ControllerLookup<'_>,
    controller_name: &str,
    manage_all: bool,
) -> OrphanDecision {
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
            } else if !is_job_finished(job) {
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

impl Worker {
    /// Syncs one `orphan-pod` key (`namespace/podname`).
    pub(crate) async fn sync_orphan_pod(&self, key: &ObjectKey) -> Result<SyncOutcome, SyncError> {
        let Some(pod) = self.api.get_pod(&key.namespace, &key.name).await? else {
            return Ok(SyncOutcome::Done);
        };
        let job;
        let lookup = match controller_of(&pod) {
            Controller::NotAJob => ControllerLookup::NotAJob,
            Controller::None => ControllerLookup::None,
            Controller::Job { name, uid } => {
                job = self.api.get_job(&key.namespace, &name).await?;
                // A Job of the same name but another UID is a successor, not the pod's owner.
                ControllerLookup::Job(
                    job.as_ref().filter(|j| j.metadata.uid.as_deref() == Some(uid.as_str())),
                )
            }
        };
        match decide(&pod, &lookup, &self.controller_name, self.manage_all) {
            OrphanDecision::Keep(why) => {
                tracing::debug!(pod = %key, why, "leaving orphan pod alone");
            }
            OrphanDecision::RemoveFinalizer => {
                self.api.remove_tracking_finalizer(&key.namespace, &key.name).await?;
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if matches!(phase, Some("Succeeded" | "Failed")) {
                    self.count_finalizer_removals(1);
                }
                tracing::debug!(pod = %key, "removed tracking finalizer from orphan pod");
            }
        }
        Ok(SyncOutcome::Done)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    const ME: &str = kjob_core::DEFAULT_CONTROLLER_NAME;

    fn pod(finalizer: bool, owner: Option<(&str, &str)>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                finalizers: finalizer.then(|| vec![JOB_TRACKING_FINALIZER.to_string()]),
                owner_references: owner.map(|(api_version, kind)| {
                    vec![OwnerReference {
                        api_version: api_version.into(),
                        kind: kind.into(),
                        name: "j".into(),
                        uid: "u1".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn job(finished: Option<&str>, managed_by: Option<&str>) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("j".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(JobSpec { managed_by: managed_by.map(Into::into), ..Default::default() }),
            status: Some(JobStatus {
                conditions: finished.map(|t| {
                    vec![JobCondition {
                        type_: t.into(),
                        status: "True".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
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
    fn controller_ref_classification() {
        assert_eq!(controller_of(&pod(true, None)), Controller::None);
        assert_eq!(controller_of(&pod(true, Some(("batch/v1", "CronJob")))), Controller::NotAJob);
        assert_eq!(controller_of(&pod(true, Some(("example.com/v1", "Job")))), Controller::NotAJob);
        assert_eq!(
            controller_of(&pod(true, Some(("batch/v1", "Job")))),
            Controller::Job { name: "j".into(), uid: "u1".into() }
        );
    }
}
