//! Metrics: the client-go workqueue names (label `name` = queue) plus lease and error counters.
//!
//! Counters and histograms count what this replica did (sum them across replicas); gauges are
//! read from Redis and so are the same on every replica (use `max by (name)`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of per-queue metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// The queue name.
    pub name: String,
}

/// Label of per-method error counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    /// The gRPC method.
    pub method: String,
    /// The gRPC status code name.
    pub code: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// All metrics of kjob-queue.
#[derive(Clone)]
pub struct Metrics {
    /// `workqueue_depth`: items waiting to be processed (ready + dirty while processing).
    pub depth: Family<QueueLabel, Gauge>,
    /// `workqueue_adds_total`: accepted adds.
    pub adds: Family<QueueLabel, Counter>,
    /// `workqueue_queue_duration_seconds`: add → lease.
    pub queue_duration: Family<QueueLabel, Histogram>,
    /// `workqueue_work_duration_seconds`: lease → done.
    pub work_duration: Family<QueueLabel, Histogram>,
    /// `workqueue_unfinished_work_seconds`: total time in processing of leased items.
    pub unfinished: Family<QueueLabel, FloatGauge>,
    /// `workqueue_longest_running_processor_seconds`.
    pub longest: Family<QueueLabel, FloatGauge>,
    /// `workqueue_retries_total`: every AddAfter (delayed add, rate-limited or requeue-after).
    pub retries: Family<QueueLabel, Counter>,
    /// Items leased by this replica.
    pub leases: Family<QueueLabel, Counter>,
    /// Leases that expired and were put back by this replica (its reaper or a Lease call).
    pub lease_expired: Family<QueueLabel, Counter>,
    /// Poison items (leases expired several times in a row without a Done) requeued through the
    /// rate limiter instead of at once.
    pub poisoned: Family<QueueLabel, Counter>,
    /// Done/Renew calls refused for a stale lease id.
    pub stale: Family<QueueLabel, Counter>,
    /// Ready, delayed and leased counts (kjob extras).
    pub ready: Family<QueueLabel, Gauge>,
    /// Items waiting for a later time.
    pub delayed: Family<QueueLabel, Gauge>,
    /// Leased items.
    pub leased: Family<QueueLabel, Gauge>,
    /// gRPC errors by method and code.
    pub errors: Family<ErrorLabel, Counter>,
}

fn histogram_family() -> Family<QueueLabel, Histogram> {
    // component-base: ExponentialBuckets(1e-8, 10, 10) = 10 ns … 10 s.
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(1e-8, 10.0, 10)))
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: histogram_family(),
            work_duration: histogram_family(),
            unfinished: Family::default(),
            longest: Family::default(),
            retries: Family::default(),
            leases: Family::default(),
            lease_expired: Family::default(),
            poisoned: Family::default(),
            stale: Family::default(),
            ready: Family::default(),
            delayed: Family::default(),
            leased: Family::default(),
            errors: Family::default(),
        };
        registry.register("workqueue_depth", "Current depth of workqueue", m.depth.clone());
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            m.work_duration.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            m.unfinished.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            m.longest.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            m.retries.clone(),
        );
        registry.register("kjob_queue_leases", "Items leased by this replica", m.leases.clone());
        registry.register(
            "kjob_queue_lease_expired",
            "Expired leases put back by this replica's reaper",
            m.lease_expired.clone(),
        );
        registry.register(
            "kjob_queue_poison_requeues",
            "Expired leases of poison items (expired repeatedly without a Done) requeued through the rate limiter",
            m.poisoned.clone(),
        );
        registry.register(
            "kjob_queue_stale_lease",
            "Done or Renew calls refused because the lease id was stale",
            m.stale.clone(),
        );
        registry.register("kjob_queue_ready", "Items ready to be leased", m.ready.clone());
        registry.register(
            "kjob_queue_delayed",
            "Items waiting for a later time",
            m.delayed.clone(),
        );
        registry.register("kjob_queue_leased", "Items leased to workers", m.leased.clone());
        registry.register(
            "kjob_queue_grpc_errors",
            "gRPC calls that failed, by method and code",
            m.errors.clone(),
        );
        m
    }

    /// The label of `queue`.
    pub fn q(queue: &str) -> QueueLabel {
        QueueLabel { name: queue.to_string() }
    }

    /// Counts a failed call.
    pub fn error(&self, method: &str, code: tonic::Code) {
        self.errors
            .get_or_create(&ErrorLabel { method: method.to_string(), code: format!("{code:?}") })
            .inc();
    }

    /// Counts expired leases put back (`reaped`), of which `poisoned` went through the rate
    /// limiter (each of those is an AddRateLimited: a retry).
    pub fn count_reaped(&self, queue: &str, reaped: u32, poisoned: u32) {
        let l = Self::q(queue);
        self.lease_expired.get_or_create(&l).inc_by(u64::from(reaped));
        self.poisoned.get_or_create(&l).inc_by(u64::from(poisoned));
        self.retries.get_or_create(&l).inc_by(u64::from(poisoned));
    }

    /// Refreshes the gauges from a stats snapshot.
    pub fn set_stats(&self, queue: &str, s: &kjob_workqueue::QueueStats) {
        let l = Self::q(queue);
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.depth.get_or_create(&l).set(i(s.ready + s.dirty));
        self.ready.get_or_create(&l).set(i(s.ready));
        self.delayed.get_or_create(&l).set(i(s.delayed));
        self.leased.get_or_create(&l).set(i(s.leased));
        self.unfinished.get_or_create(&l).set(s.unfinished_ms as f64 / 1000.0);
        let longest = s.oldest_started_ms.map(|t| (s.now_ms - t).max(0) as f64 / 1000.0);
        self.longest.get_or_create(&l).set(longest.unwrap_or(0.0));
    }
}
