//! Prometheus metrics of the watcher, registered under the `kjob_watcher` prefix.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Labels of per-event counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `job` or `pod`.
    pub kind: &'static str,
    /// `add`, `update`, `delete` or `tombstone`.
    pub r#type: &'static str,
}

/// Labels naming a queue.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// Queue name.
    pub queue: &'static str,
}

/// Labels naming an object kind.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `job` or `pod`.
    pub kind: &'static str,
}

/// Labels naming an observation kind.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObservationLabels {
    /// `creation`, `deletion` or `finalizer_removal`.
    pub kind: &'static str,
}

/// Labels of the orphan re-check counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `sent` or `settled`.
    pub outcome: &'static str,
}

/// Labels of `job_controller_jobs_by_external_controller_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerNameLabels {
    /// The Job's `spec.managedBy`.
    pub controller_name: String,
}

fn send_buckets() -> Histogram {
    // 1 ms .. ~16 s: a local queue answers in ms, a retried one in seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

kjob_svc::metrics! {
    /// Every watcher metric; cheap to clone (all handles are shared).
    #[derive(Debug, Clone)]
    pub struct Metrics {
        "kjob_watcher" {
            /// Informer events handled, by kind and type.
            events: Family<EventLabels, Counter> = Family::default(),
                "events", "Informer events handled";
            /// Items enqueued (sent to kjob-queue), by queue.
            enqueues: Family<QueueLabels, Counter> = Family::default(),
                "enqueues", "Items sent to kjob-queue";
            /// Expectation observations sent, by kind.
            observations: Family<ObservationLabels, Counter> = Family::default(),
                "observations", "Expectation observations sent";
            /// Add batches acknowledged by kjob-queue.
            batches: Counter = Counter::default(),
                "batches", "Add batches acknowledged by kjob-queue";
            /// Failed Add calls (each is retried).
            send_errors: Counter = Counter::default(),
                "send_errors", "Failed Add calls (retried)";
            /// Latency of successful Add calls.
            send_duration: Histogram = send_buckets(),
                "send_duration_seconds", "Latency of Add calls";
            /// 1 while this process holds the Lease.
            leader: Gauge = Gauge::default(),
                "leader", "1 while this process holds the Lease";
            /// Watch stream errors (each leads to a backoff and a re-watch or relist), by kind.
            watch_restarts: Family<KindLabels, Counter> = Family::default(),
                "watch_restarts", "Watch stream errors";
            /// Orphan entries of finished Jobs re-checked after their wait, by outcome: `sent`
            /// (the pod still had the tracking finalizer) or `settled` (it no longer needed one).
            orphan_rechecks: Family<OutcomeLabels, Counter> = Family::default(),
                "orphan_rechecks", "Finished Jobs' orphan entries re-checked after their wait";
            /// Objects in the informer cache, by kind.
            cached: Family<KindLabels, Gauge> = Family::default(),
                "cached_objects", "Objects in the informer cache";
        }
        // Upstream's name, so dashboards built for kube-controller-manager keep working.
        "job_controller" {
            /// `job_controller_jobs_by_external_controller_total`: Jobs seen added whose managedBy
            /// names a controller other than the built-in one (upstream `addJob`).
            jobs_by_external_controller: Family<ControllerNameLabels, Counter> = Family::default(),
                "jobs_by_external_controller",
                "The number of Jobs managed by an external controller";
        }
    }
}
