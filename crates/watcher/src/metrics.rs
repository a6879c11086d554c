//! Prometheus metrics of the watcher, registered under the `kjob_watcher` prefix.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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

/// Labels of `job_controller_jobs_by_external_controller_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerNameLabels {
    /// The Job's `spec.managedBy`.
    pub controller_name: String,
}

/// Every watcher metric; cheap to clone (all handles are shared).
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Informer events handled, by kind and type.
    pub events: Family<EventLabels, Counter>,
    /// Items enqueued (sent to kjob-queue), by queue.
    pub enqueues: Family<QueueLabels, Counter>,
    /// Expectation observations sent, by kind.
    pub observations: Family<ObservationLabels, Counter>,
    /// Add batches acknowledged by kjob-queue.
    pub batches: Counter,
    /// Failed Add calls (each is retried).
    pub send_errors: Counter,
    /// Latency of successful Add calls.
    pub send_duration: Histogram,
    /// 1 while this process holds the Lease.
    pub leader: Gauge,
    /// Watch stream errors (each leads to a backoff and a re-watch or relist), by kind.
    pub watch_restarts: Family<KindLabels, Counter>,
    /// Objects in the informer cache, by kind.
    pub cached: Family<KindLabels, Gauge>,
    /// `job_controller_jobs_by_external_controller_total`: Jobs seen added whose managedBy
    /// names a controller other than the built-in one (upstream `addJob`).
    pub jobs_by_external_controller: Family<ControllerNameLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            events: Family::default(),
            enqueues: Family::default(),
            observations: Family::default(),
            batches: Counter::default(),
            send_errors: Counter::default(),
            // 1 ms .. ~16 s: a local queue answers in ms, a retried one in seconds.
            send_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            leader: Gauge::default(),
            watch_restarts: Family::default(),
            cached: Family::default(),
            jobs_by_external_controller: Family::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `kjob_watcher`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("kjob_watcher");
        r.register("events", "Informer events handled", m.events.clone());
        r.register("enqueues", "Items sent to kjob-queue", m.enqueues.clone());
        r.register("observations", "Expectation observations sent", m.observations.clone());
        r.register("batches", "Add batches acknowledged by kjob-queue", m.batches.clone());
        r.register("send_errors", "Failed Add calls (retried)", m.send_errors.clone());
        r.register("send_duration_seconds", "Latency of Add calls", m.send_duration.clone());
        r.register("leader", "1 while this process holds the Lease", m.leader.clone());
        r.register("watch_restarts", "Watch stream errors", m.watch_restarts.clone());
        r.register("cached_objects", "Objects in the informer cache", m.cached.clone());
        // Upstream's name, so dashboards built for kube-controller-manager keep working.
        registry.sub_registry_with_prefix("job_controller").register(
            "jobs_by_external_controller",
            "The number of Jobs managed by an external controller",
            m.jobs_by_external_controller.clone(),
        );
        m
    }
}
