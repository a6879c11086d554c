//! Which pods belong to a Job: the decision of upstream `ClaimPods` (keep, adopt, release or
//! ignore), shared by the worker and the watcher's cache.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::job::is_job_deleting;
use crate::pod::{controller_ref, is_deleting};
use crate::selector::Selector;

/// What `ClaimPods` would do with one pod for a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Owned by the Job and still matching its selector: part of the Job.
    Owned,
    /// Orphan matching the selector: patch in the controllerRef (and the tracking finalizer).
    Adopt,
    /// Owned by the Job but no longer matching the selector: remove the ownerReference.
    Release,
    /// Owned by someone else, or an orphan that does not match (or is being deleted).
    Ignore,
}

/// How a pod's controllerRef relates to one Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// No controllerRef: an orphan.
    Nobody,
    /// The controllerRef carries the Job's UID (upstream compares the UID only).
    ThisJob,
    /// Controlled by something else.
    Other,
}

/// What upstream `BaseControllerRefManager.ClaimObject` reads of a pod and a Job, so callers
/// that hold other shapes of the two (the watcher's cache) reach the same [`Claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimFacts {
    /// The pod's controllerRef against the Job.
    pub owner: Owner,
    /// The Job's selector matches the pod's labels.
    pub matches: bool,
    /// The Job has a deletionTimestamp.
    pub job_deleting: bool,
    /// The pod has a deletionTimestamp.
    pub pod_deleting: bool,
}

impl ClaimFacts {
    /// The claim decision; adoption additionally needs the caller to confirm with a fresh read
    /// that the Job still exists and is not being deleted (upstream `RecheckDeletionTimestamp`).
    pub fn decide(self) -> Claim {
        match self.owner {
            Owner::Other => Claim::Ignore,
            Owner::ThisJob if self.matches => Claim::Owned,
            // A Job being deleted neither releases nor keeps pods that stopped matching.
            Owner::ThisJob if self.job_deleting => Claim::Ignore,
            Owner::ThisJob => Claim::Release,
            Owner::Nobody if !self.matches || self.job_deleting || self.pod_deleting => {
                Claim::Ignore
            }
            Owner::Nobody => Claim::Adopt,
        }
    }
}

/// Classifies a pod for a Job with the Job's compiled selector, as upstream
/// `PodControllerRefManager.ClaimPods` does (orphans of other namespaces are never adopted).
pub fn claim(job: &Job, selector: &Selector, pod: &Pod) -> Claim {
    let owner = match controller_ref(pod) {
        None => Owner::Nobody,
        Some(r) if Some(r.uid.as_str()) == job.metadata.uid.as_deref() => Owner::ThisJob,
        Some(_) => Owner::Other,
    };
    if owner == Owner::Nobody && pod.metadata.namespace != job.metadata.namespace {
        return Claim::Ignore;
    }
    ClaimFacts {
        owner,
        matches: selector.matches_pod(pod),
        job_deleting: is_job_deleting(job),
        pod_deleting: is_deleting(pod),
    }
    .decide()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, mk_job, mk_pod, pods_for_job};

    #[test]
    fn claim_table() {
        let job = mk_job("j").build();
        let sel = |j: &Job| Selector::compile(j.spec.as_ref().unwrap().selector.as_ref()).unwrap();
        let selector = sel(&job);
        let other = mk_job("k").build();
        let owned = mk_pod(&job, "owned").build();
        let orphan = mk_pod(&job, "orphan").orphan().build();
        let foreign = mk_pod(&other, "foreign").build();
        let relabelled = mk_pod(&job, "rl").with(|p| p.metadata.labels = None).build();
        let deleting_job = mk_job("j").deleting(at(1)).build();
        let cases = [
            ("owned", &job, &owned, Claim::Owned),
            ("orphan", &job, &orphan, Claim::Adopt),
            (
                "deleting orphan",
                &job,
                &mk_pod(&job, "o").orphan().deleting(at(1)).build(),
                Claim::Ignore,
            ),
            (
                "orphan of another namespace",
                &job,
                &mk_pod(&job, "o")
                    .orphan()
                    .with(|p| p.metadata.namespace = Some("x".into()))
                    .build(),
                Claim::Ignore,
            ),
            ("foreign", &job, &foreign, Claim::Ignore),
            ("relabelled", &job, &relabelled, Claim::Release),
            ("owned, Job deleting", &deleting_job, &owned, Claim::Owned),
            ("relabelled, Job deleting", &deleting_job, &relabelled, Claim::Ignore),
            ("orphan, Job deleting", &deleting_job, &orphan, Claim::Ignore),
        ];
        for (what, job, pod, want) in cases {
            assert_eq!(claim(job, &sel(job), pod), want, "{what}");
        }
        assert_eq!(pods_for_job(&job, [&owned, &orphan, &foreign]).len(), 1);
        // `selector: {}` claims every pod of the namespace; a nil selector none.
        let every = Selector::compile(Some(&Default::default())).unwrap();
        assert_eq!(claim(&job, &every, &relabelled), Claim::Owned);
        assert_eq!(claim(&job, &Selector::nothing(), &owned), Claim::Release);
        assert_eq!(claim(&job, &Selector::nothing(), &orphan), Claim::Ignore);
        assert_eq!(claim(&job, &selector, &owned), Claim::Owned);
    }
}
