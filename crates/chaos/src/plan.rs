//! The mixed workload: seeded Job shapes and the outcome upstream would reach for each.

use k8s_openapi::api::batch::v1::Job;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;

/// Exit code the pod-failure-policy Jobs' pods exit with; their FailJob rule matches it.
pub const FAIL_JOB_EXIT_CODE: i32 = 42;

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
}

/// The terminal state upstream reaches for a Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// `Complete` or `Failed`.
    pub condition: &'static str,
    /// Reason of the Failed condition (None for Complete).
    pub reason: Option<&'static str>,
    /// Exact status.succeeded, or None when it equals the number of pods (work queue).
    pub succeeded: Option<i32>,
    /// Exact status.failed.
    pub failed: i32,
    /// Fewest pods upstream creates.
    pub min_pods: i32,
    /// Most pods upstream creates.
    pub max_pods: i32,
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

    /// Short name for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Shape::NonIndexed { .. } => "non-indexed",
            Shape::Indexed { .. } => "indexed",
            Shape::WorkQueue { .. } => "work-queue",
            Shape::PodFailurePolicy => "pod-failure-policy",
            Shape::BackoffLimit { .. } => "backoff-limit",
        }
    }

    /// What upstream ends with for this shape.
    pub fn expected(&self) -> Expected {
        let complete = |n: i32| Expected {
            condition: "Complete",
            reason: None,
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
                reason: Some("PodFailurePolicy"),
                succeeded: Some(0),
                failed: 1,
                min_pods: 1,
                max_pods: 1,
            },
            Shape::BackoffLimit { backoff_limit } => Expected {
                condition: "Failed",
                reason: Some("BackoffLimitExceeded"),
                succeeded: Some(0),
                failed: backoff_limit + 1,
                min_pods: backoff_limit + 1,
                max_pods: backoff_limit + 1,
            },
        }
    }

    /// The Job object, managed by `controller`, pods running `run_ms` in the sim's kubelet.
    pub fn job(&self, name: &str, controller: &str, run_ms: u64) -> Job {
        let mut exit_code = 0;
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
        }
        spec["template"] = json!({
            "metadata": {"annotations": {
                "kjob.io/sim-run-time": format!("{run_ms}ms"),
                "kjob.io/sim-exit-code": exit_code.to_string(),
            }},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox:1.36"}]
            }
        });
        let v = json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {"kjob.io/chaos-kind": self.kind()}},
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
        assert_eq!(
            (e.failed, e.min_pods, e.max_pods, e.reason),
            (3, 3, 3, Some("BackoffLimitExceeded"))
        );
        let e = Shape::Indexed { completions: 4, parallelism: 2 }.expected();
        assert_eq!((e.succeeded, e.max_pods, e.condition), (Some(4), 4, "Complete"));
        let e = Shape::WorkQueue { parallelism: 3 }.expected();
        assert_eq!((e.succeeded, e.min_pods, e.max_pods), (None, 1, 3));
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
