//! The mixed workload: Job shapes (seeded or in a fixed rotation) and the outcome upstream
//! would reach for each. Shared with kjob-worker's whole-stack tests.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;

/// Exit code the pod-failure-policy Jobs' pods exit with; their FailJob rule matches it.
pub const FAIL_JOB_EXIT_CODE: i32 = 42;
/// Label carrying [`Shape::kind`] on each Job and, through its template, on its pods.
pub const KIND_LABEL: &str = "kjob.io/chaos-kind";
/// Shortest pod run time of an [`Shape::Ignore`] Job: long enough for a harness polling the
/// pods to see the first one running and evict it.
pub const IGNORE_MIN_RUN_MS: u64 = 3000;

/// The Job a pod belongs to by its `batch.kubernetes.io/job-name` label ("" without one).
pub fn job_name_of(pod: &Pod) -> String {
    let labels = pod.metadata.labels.as_ref();
    labels.and_then(|l| l.get(kjob_core::JOB_NAME_LABEL)).cloned().unwrap_or_default()
}

/// The shape of one Job of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// NonIndexed, `completions` pods that all succeed.
    NonIndexed {
        /// spec.completions.
        completions: i32,
        /// spec.parallelism.
        parallelism: i32,
    },
    /// Indexed, one pod per index, all succeed.
    Indexed {
        /// spec.completions.
        completions: i32,
        /// spec.parallelism.
        parallelism: i32,
    },
    /// Work queue (no completions): the Job completes once a pod succeeded and none runs.
    WorkQueue {
        /// spec.parallelism.
        parallelism: i32,
    },
    /// One pod exiting [`FAIL_JOB_EXIT_CODE`], matched by a FailJob podFailurePolicy rule.
    PodFailurePolicy,
    /// One pod at a time, every pod exits 1, until backoffLimit is exceeded.
    BackoffLimit {
        /// spec.backoffLimit.
        backoff_limit: i32,
    },
    /// Parallelism 1, pods succeed; a harness evicts the first running pod (DisruptionTarget),
    /// which an Ignore podFailurePolicy rule matches: not counted, replaced once. Only for
    /// harnesses that evict ([`Shape::random`] never draws it).
    Ignore {
        /// spec.completions.
        completions: i32,
    },
}

/// The terminal state upstream reaches for a Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// `Complete` or `Failed`.
    pub condition: &'static str,
    /// Reason of the terminal condition.
    pub reason: &'static str,
    /// Exact status.succeeded, or None when it equals the number of pods (work queue).
    pub succeeded: Option<i32>,
    /// Exact status.failed.
    pub failed: i32,
    /// Fewest pods upstream creates.
    pub min_pods: i32,
    /// Most pods upstream creates.
    pub max_pods: i32,
}

/// The terminal condition of `job` (`Complete` or `Failed`) and its reason, once it has one.
pub fn terminal(job: &Job) -> Option<(String, String)> {
    job.status.as_ref()?.conditions.as_ref()?.iter().find_map(|c| {
        ((c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            .then(|| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
    })
}

impl Expected {
    /// How `job`, which `npods` pods ran for, differs from this outcome in its terminal
    /// condition, its succeeded/failed counts and pods left uncounted; empty when it does not.
    /// Pod counts are the caller's to judge.
    pub fn mismatches(&self, job: &Job, npods: i32) -> Vec<String> {
        let status = job.status.clone().unwrap_or_default();
        let (succeeded, failed) = (status.succeeded.unwrap_or(0), status.failed.unwrap_or(0));
        let want_succeeded = self.succeeded.unwrap_or(npods);
        let mut wrong = Vec::new();
        match terminal(job) {
            None => wrong.push("not finished".to_string()),
            Some((c, r)) if c != self.condition || r != self.reason => {
                wrong.push(format!("ended {c}/{r}, expected {}/{}", self.condition, self.reason))
            }
            Some(_) => {}
        }
        if (succeeded, failed) != (want_succeeded, self.failed) {
            wrong.push(format!(
                "succeeded/failed {succeeded}/{failed}, expected {want_succeeded}/{}",
                self.failed
            ));
        }
        if let Some(u) = &status.uncounted_terminated_pods {
            let n =
                u.succeeded.as_ref().map_or(0, Vec::len) + u.failed.as_ref().map_or(0, Vec::len);
            if n > 0 {
                wrong.push(format!("{n} uncounted terminated pods left"));
            }
        }
        wrong
    }
}

impl Shape {
    /// Draws a shape; the mix is weighted toward the common successful kinds.
    pub fn random(rng: &mut StdRng) -> Self {
        match rng.random_range(0..10u32) {
            0..=2 => Shape::NonIndexed {
                completions: rng.random_range(1..=4),
                parallelism: rng.random_range(1..=3),
            },
            3..=5 => Shape::Indexed {
                completions: rng.random_range(1..=4),
                parallelism: rng.random_range(1..=3),
            },
            6 | 7 => Shape::WorkQueue { parallelism: rng.random_range(1..=3) },
            8 => Shape::PodFailurePolicy,
            _ => Shape::BackoffLimit { backoff_limit: 1 },
        }
    }

    /// The `i`th Job of a fixed rotation: every kind in turn ([`Shape::Ignore`] included, no
    /// weighting, unlike [`Shape::random`]), sizes cycling.
    pub fn nth(i: usize) -> Self {
        let a = (i / 6 % 4) as i32 + 1;
        let b = (i / 6 % 3) as i32 + 1;
        match i % 6 {
            0 => Shape::NonIndexed { completions: a, parallelism: b },
            1 => Shape::Indexed { completions: a, parallelism: b },
            2 => Shape::WorkQueue { parallelism: b },
            3 => Shape::PodFailurePolicy,
            4 => Shape::Ignore { completions: (i / 6 % 2) as i32 + 1 },
            _ => Shape::BackoffLimit { backoff_limit: 1 },
        }
    }

    /// Short name for reports (also the value of [`KIND_LABEL`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Shape::NonIndexed { .. } => "non-indexed",
            Shape::Indexed { .. } => "indexed",
            Shape::WorkQueue { .. } => "work-queue",
            Shape::PodFailurePolicy => "pod-failure-policy",
            Shape::BackoffLimit { .. } => "backoff-limit",
            Shape::Ignore { .. } => "ignore",
        }
    }

    /// What upstream ends with for this shape.
    pub fn expected(&self) -> Expected {
        let complete = |n: i32| Expected {
            condition: "Complete",
            reason: "CompletionsReached",
            succeeded: Some(n),
            failed: 0,
            min_pods: n,
            max_pods: n,
        };
        match *self {
            Shape::NonIndexed { completions, .. } | Shape::Indexed { completions, .. } => {
                complete(completions)
            }
            // Every pod that starts succeeds; once one has, no new pod is created, so between
            // one and `parallelism` pods run and each is counted as succeeded.
            Shape::WorkQueue { parallelism } => {
                Expected { succeeded: None, min_pods: 1, max_pods: parallelism, ..complete(1) }
            }
            Shape::PodFailurePolicy => Expected {
                condition: "Failed",
                reason: "PodFailurePolicy",
                succeeded: Some(0),
                failed: 1,
                min_pods: 1,
                max_pods: 1,
            },
            Shape::BackoffLimit { backoff_limit } => Expected {
                condition: "Failed",
                reason: "BackoffLimitExceeded",
                succeeded: Some(0),
                failed: backoff_limit + 1,
                min_pods: backoff_limit + 1,
                max_pods: backoff_limit + 1,
            },
            // The evicted pod is ignored (not counted) and replaced once, if the eviction
            // landed while it ran (a harness adjusts for one that raced the pod's exit).
            Shape::Ignore { completions } => Expected {
                min_pods: completions + 1,
                max_pods: completions + 1,
                ..complete(completions)
            },
        }
    }

    /// The Job object, managed by `controller`, pods running `run_ms` in the sim's kubelet.
    pub fn job(&self, name: &str, controller: &str, run_ms: u64) -> Job {
        let mut exit_code = 0;
        let mut run_ms = run_ms;
        let mut spec = json!({
            "managedBy": controller,
            "backoffLimit": 6,
        });
        match *self {
            Shape::NonIndexed { completions, parallelism } => {
                spec["completions"] = json!(completions);
                spec["parallelism"] = json!(parallelism);
            }
            Shape::Indexed { completions, parallelism } => {
                spec["completions"] = json!(completions);
                spec["parallelism"] = json!(parallelism);
                spec["completionMode"] = json!("Indexed");
            }
            Shape::WorkQueue { parallelism } => {
                spec["parallelism"] = json!(parallelism);
            }
            Shape::PodFailurePolicy => {
                exit_code = FAIL_JOB_EXIT_CODE;
                spec["podFailurePolicy"] = json!({"rules": [{
                    "action": "FailJob",
                    "onExitCodes": {"operator": "In", "values": [FAIL_JOB_EXIT_CODE]}
                }]});
            }
            Shape::BackoffLimit { backoff_limit } => {
                exit_code = 1;
                spec["backoffLimit"] = json!(backoff_limit);
            }
            Shape::Ignore { completions } => {
                spec["completions"] = json!(completions);
                spec["parallelism"] = json!(1);
                spec["podFailurePolicy"] = json!({"rules": [{
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget"}]
                }]});
                run_ms = run_ms.max(IGNORE_MIN_RUN_MS);
            }
        }
        spec["template"] = json!({
            "metadata": {
                "labels": {KIND_LABEL: self.kind()},
                "annotations": {
                    "kjob.io/sim-run-time": format!("{run_ms}ms"),
                    "kjob.io/sim-exit-code": exit_code.to_string(),
                }
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox:1.36"}]
            }
        });
        let v = json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {KIND_LABEL: self.kind()}},
            "spec": spec,
        });
        serde_json::from_value(v).expect("the Job literal matches the k8s-openapi schema")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mismatches_name_what_differs() {
        let exp = Expected {
            condition: "Complete",
            reason: "CompletionsReached",
            succeeded: Some(2),
            failed: 0,
            min_pods: 2,
            max_pods: 2,
        };
        let job = |status: serde_json::Value| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j"}, "status": status})).unwrap()
        };
        let cond =
            |ty: &str, reason: &str| json!([{"type": ty, "status": "True", "reason": reason}]);
        let done = json!({"succeeded": 2, "conditions": cond("Complete", "CompletionsReached")});
        assert!(exp.mismatches(&job(done), 2).is_empty());
        assert_eq!(
            exp.mismatches(&job(json!({"succeeded": 1})), 1),
            ["not finished", "succeeded/failed 1/0, expected 2/0"]
        );
        let failed = json!({"failed": 1, "conditions": cond("Failed", "BackoffLimitExceeded"),
                            "uncountedTerminatedPods": {"failed": ["u1"]}});
        assert_eq!(
            exp.mismatches(&job(failed), 1),
            [
                "ended Failed/BackoffLimitExceeded, expected Complete/CompletionsReached",
                "succeeded/failed 0/1, expected 2/0",
                "1 uncounted terminated pods left",
            ]
        );
        // A work queue's succeeded count is the pods it ran.
        let queue = Expected { succeeded: None, ..exp };
        let done = json!({"succeeded": 3, "conditions": cond("Complete", "CompletionsReached")});
        assert!(queue.mismatches(&job(done), 3).is_empty());
    }

    #[test]
    fn same_seed_same_shapes() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..50).map(|_| Shape::random(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn expectations_follow_upstream_counting() {
        let e = Shape::BackoffLimit { backoff_limit: 2 }.expected();
        assert_eq!((e.failed, e.min_pods, e.max_pods, e.reason), (3, 3, 3, "BackoffLimitExceeded"));
        let e = Shape::Indexed { completions: 4, parallelism: 2 }.expected();
        assert_eq!((e.succeeded, e.max_pods, e.condition), (Some(4), 4, "Complete"));
        let e = Shape::WorkQueue { parallelism: 3 }.expected();
        assert_eq!((e.succeeded, e.min_pods, e.max_pods), (None, 1, 3));
        let e = Shape::Ignore { completions: 2 }.expected();
        assert_eq!(
            (e.succeeded, e.failed, e.min_pods, e.reason),
            (Some(2), 0, 3, "CompletionsReached")
        );
    }

    #[test]
    fn the_rotation_covers_every_kind() {
        let kinds: std::collections::BTreeSet<&str> =
            (0..12).map(|i| Shape::nth(i).kind()).collect();
        assert_eq!(kinds.len(), 6, "{kinds:?}");
        let ignore = Shape::Ignore { completions: 1 }.job("z", "ctl", 100);
        let template = ignore.spec.unwrap().template.metadata.unwrap();
        assert_eq!(template.labels.unwrap()[KIND_LABEL], "ignore");
        assert_eq!(template.annotations.unwrap()["kjob.io/sim-run-time"], "3000ms");
    }

    #[test]
    fn job_objects_carry_the_shape() {
        let j = Shape::PodFailurePolicy.job("x", "ctl", 500);
        let spec = j.spec.unwrap();
        assert_eq!(spec.managed_by.as_deref(), Some("ctl"));
        assert!(spec.pod_failure_policy.is_some());
        let ann = spec.template.metadata.unwrap().annotations.unwrap();
        assert_eq!(ann["kjob.io/sim-exit-code"], "42");
        let j = Shape::Indexed { completions: 3, parallelism: 2 }.job("y", "ctl", 500);
        assert_eq!(j.spec.unwrap().completion_mode.as_deref(), Some("Indexed"));
    }
}
