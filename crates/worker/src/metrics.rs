//! Metrics: the upstream `job_controller_*` families (names, labels and buckets as upstream
//! `pkg/controller/job/metrics`) plus the worker's own `kjob_worker_*` families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the sync duration and sync count families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// `Indexed` or `NonIndexed`.
    pub completion_mode: String,
    /// `success` or `error`.
    pub result: String,
    /// `reconciling`, `tracking`, `pods_created` or `pods_deleted`.
    pub action: String,
}

/// Labels of `jobs_finished_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishedLabels {
    /// `Indexed` or `NonIndexed`.
    pub completion_mode: String,
    /// `succeeded` or `failed`.
    pub result: String,
    /// The terminal condition's reason.
    pub reason: String,
}

/// Labels of `job_pods_finished_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodsFinishedLabels {
    /// `Indexed` or `NonIndexed`.
    pub completion_mode: String,
    /// `succeeded` or `failed`.
    pub result: String,
}

/// Labels of `pod_failures_handled_by_failure_policy_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `FailJob`, `FailIndex`, `Ignore` or `Count`.
    pub action: String,
}

/// Labels of `terminated_pods_tracking_finalizer_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `add` or `delete`.
    pub event: String,
}

/// Labels of `job_finished_indexes_total`.
// The upstream label name is camelCase and the derive names labels after the fields.
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IndexesLabels {
    /// `succeeded` or `failed`.
    pub status: String,
    /// `perIndex` or `global`.
    pub backoffLimit: String,
}

/// Labels of `job_pods_creation_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreationLabels {
    /// `new`, `recreate_terminating_or_failed` or `recreate_failed`.
    pub reason: String,
    /// `succeeded` or `failed`.
    pub status: String,
}

/// Labels of the per-queue worker families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// Queue name (`job`, `orphan-pod`).
    pub queue: String,
}

/// Labels of the per-queue sync outcome family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Queue name.
    pub queue: String,
    /// `forget`, `rate_limited`, `requeue_after`, `lease_lost` or `handed_back`.
    pub outcome: String,
}

/// Labels of the API call family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// `get`, `list`, `create`, `delete`, `patch`, `update_status`.
    pub verb: String,
    /// `jobs`, `pods`, `events`.
    pub resource: String,
    /// HTTP status code, or `timeout` / `transport`.
    pub result: String,
}

/// Labels of `kjob_worker_job_view_reads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ViewLabels {
    /// `trusted` (planned from the shared view), `orphans` (the view, but pods listed to adopt
    /// orphans), `untrusted` (no trusted view: consistent reads), `undecodable` (a view that
    /// did not parse: consistent reads), `forged` (an entry not sealed by kjob for this Job:
    /// consistent reads), `moved` (a view read in pages that changed during every read:
    /// consistent reads).
    pub result: String,
}

fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.004, 2.0, 15))
}

fn wait_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 12))
}

kjob_svc::metrics! {
    /// Every metric the worker exports.
    #[derive(Clone)]
    pub struct Metrics {
        "job_controller" {
            /// `job_controller_job_sync_duration_seconds`.
            job_sync_duration: Family<SyncLabels, Histogram> = Family::new_with_constructor(sync_buckets),
                "job_sync_duration_seconds", "The time it took to sync a job";
            /// `job_controller_job_syncs_total`.
            job_syncs: Family<SyncLabels, Counter> = Family::default(),
                "job_syncs", "The number of job syncs";
            /// `job_controller_jobs_finished_total`.
            jobs_finished: Family<FinishedLabels, Counter> = Family::default(),
                "jobs_finished", "The number of finished jobs";
            /// `job_controller_job_pods_finished_total`.
            job_pods_finished: Family<PodsFinishedLabels, Counter> = Family::default(),
                "job_pods_finished", "The number of finished Pods that are fully tracked";
            /// `job_controller_pod_failures_handled_by_failure_policy_total`.
            pod_failures_handled_by_failure_policy: Family<ActionLabels, Counter> = Family::default(),
                "pod_failures_handled_by_failure_policy",
                "The number of failed Pods handled by failure policy with respect to the failure \
                 policy action applied based on the matched rule";
            /// `job_controller_terminated_pods_tracking_finalizer_total`.
            terminated_pods_tracking_finalizer: Family<EventLabels, Counter> = Family::default(),
                "terminated_pods_tracking_finalizer",
                "The number of terminated pods (phase=Failed|Succeeded) that have the finalizer \
                 batch.kubernetes.io/job-tracking";
            /// `job_controller_job_finished_indexes_total`.
            job_finished_indexes: Family<IndexesLabels, Counter> = Family::default(),
                "job_finished_indexes", "The number of finished indexes";
            /// `job_controller_job_pods_creation_total`.
            job_pods_creation: Family<CreationLabels, Counter> = Family::default(),
                "job_pods_creation",
                "The number of Pods created by the Job controller labelled with a reason for the \
                 Pod creation";
        }
        "kjob_worker" {
            /// `kjob_worker_leases_held`: leases this process holds now.
            leases_held: Family<QueueLabels, Gauge> = Family::default(),
                "leases_held", "Leases this worker holds now";
            /// `kjob_worker_lease_wait_seconds`: time from enqueue to lease.
            lease_wait: Family<QueueLabels, Histogram> = Family::new_with_constructor(wait_buckets),
                "lease_wait_seconds", "Time from a key's enqueue to its lease by this worker";
            /// `kjob_worker_renew_failures_total`: renewals refused or failed.
            renew_failures: Family<QueueLabels, Counter> = Family::default(),
                "renew_failures", "Lease renewals refused or failed";
            /// `kjob_worker_leases_finished_total`: how each lease ended.
            leases_finished: Family<OutcomeLabels, Counter> = Family::default(),
                "leases_finished", "Leases finished, by outcome";
            /// `kjob_worker_dones_carried_total`: Dones applied by a Lease call that carried them.
            dones_carried: Family<QueueLabels, Counter> = Family::default(),
                "dones_carried",
                "Lease Dones handed in with the worker's next Lease call rather than on their own";
            /// `kjob_worker_api_calls_total`: API server calls by verb, resource and result.
            api_calls: Family<ApiLabels, Counter> = Family::default(),
                "api_calls", "API server calls by verb, resource and result";
            /// `kjob_worker_api_budget_rate`: the shared API budget's rate in its last answer.
            api_budget_rate: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default(),
                "api_budget_rate",
                "The workers' shared API budget's current rate (requests/s, after 429 slowdowns) in its last answer to this worker";
            /// `kjob_worker_api_budget_tokens_total`: tokens of the shared budget granted.
            api_budget_tokens: Counter = Counter::default(),
                "api_budget_tokens", "Tokens of the workers' shared API budget granted to this worker";
            /// `kjob_worker_api_budget_waits_total`: times a request waited for the budget.
            api_budget_waits: Counter = Counter::default(),
                "api_budget_waits",
                "Times an API request of this worker waited because the shared budget had no token for it";
            /// `kjob_worker_api_budget_wait_seconds_total`: time requests waited for the budget.
            api_budget_wait_seconds: Counter<f64, std::sync::atomic::AtomicU64> = Counter::default(),
                "api_budget_wait_seconds",
                "Time API requests of this worker spent waiting for the shared budget";
            /// `kjob_worker_api_budget_throttled_total`: 429s reported to the budget.
            api_budget_throttled: Counter = Counter::default(),
                "api_budget_throttled",
                "429 answers from kube-apiserver this worker reported to the shared API budget";
            /// `kjob_worker_api_budget_slowdowns_total`: reports that lowered the budget's rate.
            api_budget_slowdowns: Counter = Counter::default(),
                "api_budget_slowdowns",
                "Times this worker's 429 report lowered the shared API budget's rate";
            /// `kjob_worker_api_budget_errors_total`: budget calls kjob-queue did not answer.
            api_budget_errors: Counter = Counter::default(),
                "api_budget_errors",
                "TakeApiTokens calls to kjob-queue that failed (the request waits and asks again)";
            /// `kjob_worker_job_view_reads_total`: where each sync read its Job and pods from.
            job_view_reads: Family<ViewLabels, Counter> = Family::default(),
                "job_view_reads",
                "Syncs by where they read their Job and pods: the shared view or the API server";
            /// `kjob_worker_job_view_cache_total`: how trusted view reads used the view cache.
            job_view_cache: Family<ViewLabels, Counter> = Family::default(),
                "job_view_cache",
                "Trusted view reads by how they used the worker's cache of decoded views: delta (what changed since the cached version), full (the whole view), gap (a delta that did not fit what was cached: read whole)";
            /// `kjob_worker_events_recorded_total`: events the syncs recorded (before correlation).
            events_recorded: Counter = Counter::default(),
                "events_recorded",
                "Kubernetes events recorded by syncs, before correlation and spam filtering";
            /// `kjob_worker_events_dropped_total`: events dropped because the event sink was full.
            events_dropped: Counter = Counter::default(),
                "events_dropped", "Kubernetes events dropped because the event sink was full";
            /// `kjob_worker_events_spam_filtered_total`: events dropped by the per-object spam filter.
            events_spam_filtered: Counter = Counter::default(),
                "events_spam_filtered",
                "Kubernetes events dropped by the per-object spam filter (burst 25, then 1 per 5 min)";
            /// `kjob_worker_events_gate_fallback_total`: events aggregated and spam-filtered with this
            /// worker's own correlator state because kjob-queue's shared one did not answer.
            events_gate_fallback: Counter = Counter::default(),
                "events_gate_fallback",
                "Kubernetes events aggregated and spam-filtered with this worker's own state because \
                 kjob-queue's shared correlator did not answer";
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`; the view-read series and the
    /// per-queue carried-Done series exist from start, at 0 (a Done is carried only when a
    /// Lease follows it closely, which a quiet worker may never see).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::register(registry);
        for result in ["trusted", "orphans", "untrusted", "undecodable", "forged", "moved"] {
            drop(m.job_view_reads.get_or_create(&ViewLabels { result: result.into() }));
        }
        for queue in kjob_core::QUEUES {
            drop(m.dones_carried.get_or_create(&Self::queue(queue)));
        }
        for result in ["delta", "full", "gap"] {
            drop(m.job_view_cache.get_or_create(&ViewLabels { result: result.into() }));
        }
        m
    }

    /// Counts one API call.
    pub fn api_call(&self, verb: &str, resource: &str, result: &str) {
        self.api_calls
            .get_or_create(&ApiLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts one sync's read of the shared view.
    pub fn view_read(&self, result: &str) {
        self.job_view_reads.get_or_create(&ViewLabels { result: result.to_string() }).inc();
    }

    /// Counts how one trusted view read used the view cache.
    pub fn view_cache(&self, result: &str) {
        self.job_view_cache.get_or_create(&ViewLabels { result: result.to_string() }).inc();
    }

    /// Counts `n` finished pods seen still holding the tracking finalizer (`event="add"`).
    pub fn finished_with_finalizer(&self, n: usize) {
        if n > 0 {
            self.terminated_pods_tracking_finalizer
                .get_or_create(&EventLabels { event: "add".into() })
                .inc_by(n as u64);
        }
    }

    /// Counts `n` tracking finalizers removed from finished pods (`event="delete"`).
    pub fn finalizer_removals(&self, n: u64) {
        if n > 0 {
            self.terminated_pods_tracking_finalizer
                .get_or_create(&EventLabels { event: "delete".into() })
                .inc_by(n);
        }
    }

    /// The per-queue label set.
    pub fn queue(queue: &str) -> QueueLabels {
        QueueLabels { queue: queue.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_and_labels() {
        let mut reg = Registry::default();
        let m = Metrics::new(&mut reg);
        m.job_syncs
            .get_or_create(&SyncLabels {
                completion_mode: "Indexed".into(),
                result: "success".into(),
                action: "pods_created".into(),
            })
            .inc();
        m.job_sync_duration
            .get_or_create(&SyncLabels {
                completion_mode: "NonIndexed".into(),
                result: "error".into(),
                action: "reconciling".into(),
            })
            .observe(0.01);
        m.job_finished_indexes
            .get_or_create(&IndexesLabels {
                status: "failed".into(),
                backoffLimit: "perIndex".into(),
            })
            .inc();
        m.api_call("create", "pods", "201");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains(
                r#"job_controller_job_syncs_total{completion_mode="Indexed",result="success",action="pods_created"} 1"#
            ),
            "{out}"
        );
        assert!(out.contains("job_controller_job_sync_duration_seconds_bucket{"), "{out}");
        assert!(out.contains(r#"le="0.004""#), "{out}");
        assert!(out.contains(r#"le="65.536""#), "{out}");
        assert!(out.contains(r#"backoffLimit="perIndex""#), "{out}");
        assert!(
            out.contains(
                r#"kjob_worker_api_calls_total{verb="create",resource="pods",result="201"} 1"#
            ),
            "{out}"
        );
    }
}
