//! Metric deltas one sync produces, labelled as upstream's `job_controller_*` metrics
//! (`pkg/controller/job/metrics`). The worker owns the registry and adds these deltas.

use std::collections::BTreeMap;

/// `action` label: manageJob did not run.
pub const ACTION_RECONCILING: &str = "reconciling";
/// `action` label: manageJob ran and neither created nor deleted pods.
pub const ACTION_TRACKING: &str = "tracking";
/// `action` label: manageJob created pods (or wanted to but was held back by backoff).
pub const ACTION_PODS_CREATED: &str = "pods_created";
/// `action` label: manageJob deleted pods.
pub const ACTION_PODS_DELETED: &str = "pods_deleted";

/// `result` label of sync metrics for a sync that returned no error.
pub const RESULT_SUCCESS: &str = "success";
/// `result` label of sync metrics for a sync that returned an error.
pub const RESULT_ERROR: &str = "error";
/// `result`/`status` label value for successes.
pub const SUCCEEDED: &str = "succeeded";
/// `result`/`status` label value for failures.
pub const FAILED: &str = "failed";

/// `reason` label of `job_pods_creation_total`: first pods of the Job.
pub const POD_CREATE_NEW: &str = "new";
/// `reason` label of `job_pods_creation_total`: replacing terminating or failed pods.
pub const POD_RECREATE_TERMINATING_OR_FAILED: &str = "recreate_terminating_or_failed";
/// `reason` label of `job_pods_creation_total`: replacing failed pods (policy `Failed`).
pub const POD_RECREATE_FAILED: &str = "recreate_failed";

/// `backoffLimit` label of `job_finished_indexes_total` for Jobs with backoffLimitPerIndex.
pub const BACKOFF_LIMIT_PER_INDEX: &str = "perIndex";
/// `backoffLimit` label of `job_finished_indexes_total` for other Indexed Jobs.
pub const BACKOFF_LIMIT_GLOBAL: &str = "global";

/// Histogram buckets of `job_sync_duration_seconds`: `ExponentialBuckets(0.004, 2, 15)`.
pub fn sync_duration_buckets() -> Vec<f64> {
    (0..15).map(|i| 0.004 * f64::from(1u32 << i)).collect()
}

/// `job_controller_jobs_finished_total` increment for a Job that finished in this sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFinished {
    /// `succeeded` or `failed`.
    pub result: &'static str,
    /// Reason of the terminal condition (e.g. `CompletionsReached`, `BackoffLimitExceeded`).
    pub reason: String,
}

/// `job_controller_job_pods_creation_total` increments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodsCreation {
    /// `new`, `recreate_terminating_or_failed` or `recreate_failed`.
    pub reason: &'static str,
    /// Increment of the `status="succeeded"` series (upstream over-counts: it includes failures).
    pub succeeded: u64,
    /// Increment of the `status="failed"` series.
    pub failed: u64,
}

/// Everything a sync adds to the `job_controller_*` counters; the worker times the sync itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricDeltas {
    /// `completion_mode` label: `Indexed` or `NonIndexed`.
    pub completion_mode: &'static str,
    /// `action` label of `job_syncs_total` / `job_sync_duration_seconds`.
    pub action: &'static str,
    /// `jobs_finished_total` increment, when the Job finished in this sync.
    pub job_finished: Option<JobFinished>,
    /// `job_pods_finished_total{result="succeeded"}` increment.
    pub pods_finished_succeeded: u64,
    /// `job_pods_finished_total{result="failed"}` increment.
    pub pods_finished_failed: u64,
    /// `pod_failures_handled_by_failure_policy_total` increments by `action` label.
    pub pod_failures_by_policy_action: BTreeMap<String, u64>,
    /// `job_finished_indexes_total{status="succeeded"}` increment (Indexed Jobs).
    pub finished_indexes_succeeded: u64,
    /// `job_finished_indexes_total{status="failed"}` increment (backoffLimitPerIndex Jobs).
    pub finished_indexes_failed: u64,
    /// `backoffLimit` label of the finished-indexes increments (`perIndex` or `global`).
    pub backoff_limit_label: &'static str,
    /// `job_pods_creation_total` increments, when pods were created.
    pub pods_creation: Option<PodsCreation>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_upstream_exponential() {
        let b = sync_duration_buckets();
        assert_eq!(b.len(), 15);
        assert!((b[0] - 0.004).abs() < 1e-12);
        assert!((b[14] - 65.536).abs() < 1e-9);
    }
}
