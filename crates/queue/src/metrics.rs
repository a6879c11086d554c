//! Metrics: the client-go workqueue names (label `name` = queue) plus lease counters, and the
//! gRPC ecosystem's per-RPC server metrics (`grpc_server_*`, as go-grpc-prometheus names them).
//!
//! Counters and histograms count what this replica did (sum them across replicas); gauges are
//! read from Redis and so are the same on every replica (use `max by (name)`). Every series of
//! the known queues and RPCs exists from start, at 0, as client-go's do, so dashboards show 0
//! rather than "no data". Labels are static strings, and a call takes its handles from tables
//! built at start instead of building a label set.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tonic::Code;

use crate::auth::RefusedLabels;

/// Label of per-queue metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// The queue name.
    pub name: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Declares the per-queue metrics once: [`QueueMetrics`] (one queue's handles), the registered
/// families and their registration, from one line per metric.
macro_rules! queue_metrics {
    ($($(#[$doc:meta])* $field:ident: $kind:ty = $new:expr, $name:literal, $help:literal;)*) => {
        /// The metrics of one queue (handles into the registered families).
        #[derive(Clone, Debug)]
        pub struct QueueMetrics {
            $($(#[$doc])* pub $field: $kind,)*
        }

        /// The registered per-queue families.
        struct QueueFamilies {
            $($field: Family<QueueLabel, $kind>,)*
        }

        impl QueueFamilies {
            fn register(registry: &mut Registry) -> Self {
                let f = Self { $($field: Family::new_with_constructor($new),)* };
                $(registry.register($name, $help, f.$field.clone());)*
                f
            }

            /// The handles of queue `name`, creating its series (at 0).
            fn queue(&self, name: &'static str) -> QueueMetrics {
                let l = QueueLabel { name };
                QueueMetrics { $($field: self.$field.get_or_create(&l).clone(),)* }
            }
        }
    };
}

fn workqueue_buckets() -> Histogram {
    // component-base: ExponentialBuckets(1e-8, 10, 10) = 10 ns … 10 s.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

queue_metrics! {
    /// `workqueue_depth`: items waiting to be processed (ready + dirty while processing).
    depth: Gauge = Gauge::default, "workqueue_depth", "Current depth of workqueue";
    /// `workqueue_adds_total`: accepted adds.
    adds: Counter = Counter::default, "workqueue_adds", "Total number of adds handled by workqueue";
    /// `workqueue_queue_duration_seconds`: add → lease.
    queue_duration: Histogram = workqueue_buckets, "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested";
    /// `workqueue_work_duration_seconds`: lease → done.
    work_duration: Histogram = workqueue_buckets, "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes";
    /// `workqueue_unfinished_work_seconds`: total time in processing of leased items.
    unfinished: FloatGauge = FloatGauge::default, "workqueue_unfinished_work_seconds",
        "How many seconds of work has been done that is in progress and hasn't been observed by work_duration";
    /// `workqueue_longest_running_processor_seconds`.
    longest: FloatGauge = FloatGauge::default, "workqueue_longest_running_processor_seconds",
        "How many seconds has the longest running processor for workqueue been running";
    /// `workqueue_retries_total`: every AddAfter (delayed add, rate-limited or requeue-after).
    retries: Counter = Counter::default, "workqueue_retries",
        "Total number of retries handled by workqueue";
    /// Items leased by this replica.
    leases: Counter = Counter::default, "kjob_queue_leases", "Items leased by this replica";
    /// Leased Job keys whose shared view the Add that handed them to a waiting Lease read in
    /// its own script (the rest take a view read of their own).
    handoff_views: Counter = Counter::default, "kjob_queue_handoff_views",
        "Leased keys whose shared view came with an Add's hand-off, read in the Add's script";
    /// Leases that expired and were put back by this replica (its reaper or a Lease call).
    lease_expired: Counter = Counter::default, "kjob_queue_lease_expired",
        "Expired leases put back by this replica's reaper";
    /// Poison items (leases expired several times in a row without a Done) requeued through the
    /// rate limiter instead of at once.
    poisoned: Counter = Counter::default, "kjob_queue_poison_requeues",
        "Expired leases of poison items (expired repeatedly without a Done) requeued through the rate limiter";
    /// Done/Renew calls refused for a stale lease id.
    stale: Counter = Counter::default, "kjob_queue_stale_lease",
        "Done or Renew calls refused because the lease id was stale";
    /// Items ready to be leased (kjob extra).
    ready: Gauge = Gauge::default, "kjob_queue_ready", "Items ready to be leased";
    /// Items waiting for a later time.
    delayed: Gauge = Gauge::default, "kjob_queue_delayed", "Items waiting for a later time";
    /// Leased items.
    leased: Gauge = Gauge::default, "kjob_queue_leased", "Items leased to workers";
    /// Age of the oldest ready item (0 when none is ready).
    oldest_ready: FloatGauge = FloatGauge::default, "kjob_queue_oldest_ready_seconds",
        "How long the oldest ready item has waited for a worker (0 when none is ready)";
}

/// Label of the Redis memory gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// The Redis node, `host:port`.
    pub node: String,
}

/// Label of the per-namespace gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NamespaceLabel {
    /// A namespace of the top N, or [`crate::tenants::OTHER`] for the rest.
    pub namespace: String,
}

/// Labels of `kjob_queue_oldest_ready_job_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WaitingLabel {
    /// The Job's namespace.
    pub namespace: String,
    /// The Job's key, `namespace/name`.
    pub key: String,
}

/// The per-namespace gauges of the job queue and the series they hold now, so a namespace (or
/// a Job) that leaves the top loses its series instead of keeping its last value.
#[derive(Default)]
struct NamespaceFamilies {
    ready: Family<NamespaceLabel, Gauge>,
    delayed: Family<NamespaceLabel, Gauge>,
    leased: Family<NamespaceLabel, Gauge>,
    oldest: Family<NamespaceLabel, FloatGauge>,
    waiting: Family<WaitingLabel, FloatGauge>,
    namespaces: Gauge,
    truncated: Gauge,
    /// How many namespaces get series of their own.
    top: std::sync::atomic::AtomicUsize,
    shown: std::sync::Mutex<(Vec<NamespaceLabel>, Vec<WaitingLabel>)>,
}

impl NamespaceFamilies {
    fn register(registry: &mut Registry) -> Self {
        let f = Self::default();
        f.top.store(crate::tenants::DEFAULT_NAMESPACE_METRICS_TOP, Ordering::Relaxed);
        registry.register(
            "kjob_queue_namespace_ready",
            "Keys of the job queue ready to be leased, per namespace of the top --namespace-metrics-top by depth (the rest summed as namespace=\"_other\")",
            f.ready.clone(),
        );
        registry.register(
            "kjob_queue_namespace_delayed",
            "Keys of the job queue waiting for a later time, per top namespace (the rest as _other)",
            f.delayed.clone(),
        );
        registry.register(
            "kjob_queue_namespace_leased",
            "Keys of the job queue leased to workers, per top namespace (the rest as _other)",
            f.leased.clone(),
        );
        registry.register(
            "kjob_queue_namespace_oldest_ready_seconds",
            "How long the oldest ready key of each top namespace has waited (_other: the oldest of the rest; 0 when none is ready)",
            f.oldest.clone(),
        );
        registry.register(
            "kjob_queue_oldest_ready_job_seconds",
            "How long each of the 10 ready Jobs waiting longest has waited, by namespace and key",
            f.waiting.clone(),
        );
        registry.register(
            "kjob_queue_namespaces",
            "Namespaces with keys in the job queue (ready, delayed or leased)",
            f.namespaces.clone(),
        );
        registry.register(
            "kjob_queue_namespace_counts_truncated",
            "1 when the last per-namespace refresh read only part of a set, so its counts are lower bounds",
            f.truncated.clone(),
        );
        // Present from start, at 0, as the queue gauges are.
        f.set(&crate::tenants::TopNamespaces {
            now_ms: 0,
            top: Vec::new(),
            other: kjob_workqueue::NamespaceStats {
                namespace: crate::tenants::OTHER.into(),
                ready: 0,
                delayed: 0,
                leased: 0,
                oldest_ready_ms: None,
                syncs_per_second: 0.0,
            },
            total: 0,
            truncated: false,
            oldest: Vec::new(),
        });
        f
    }

    fn set(&self, t: &crate::tenants::TopNamespaces) {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let age = |at: Option<i64>| at.map_or(0.0, |at| (t.now_ms - at).max(0) as f64 / 1000.0);
        let rows: Vec<(NamespaceLabel, &kjob_workqueue::NamespaceStats)> = t
            .top
            .iter()
            .chain(std::iter::once(&t.other))
            .map(|s| (NamespaceLabel { namespace: s.namespace.clone() }, s))
            .collect();
        let waiting: Vec<(WaitingLabel, f64)> = t
            .oldest
            .iter()
            .map(|k| {
                let namespace = k.key.split_once('/').map_or("", |(ns, _)| ns).to_string();
                (WaitingLabel { namespace, key: k.key.clone() }, age(Some(k.ready_ms)))
            })
            .collect();
        // One refresh at a time, so the removals see the series the last one set.
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        for l in shown.0.iter().filter(|l| !rows.iter().any(|(r, _)| r == *l)) {
            self.ready.remove(l);
            self.delayed.remove(l);
            self.leased.remove(l);
            self.oldest.remove(l);
        }
        for l in shown.1.iter().filter(|l| !waiting.iter().any(|(w, _)| w == *l)) {
            self.waiting.remove(l);
        }
        for (l, s) in &rows {
            self.ready.get_or_create(l).set(i(s.ready));
            self.delayed.get_or_create(l).set(i(s.delayed));
            self.leased.get_or_create(l).set(i(s.leased));
            self.oldest.get_or_create(l).set(age(s.oldest_ready_ms));
        }
        for (l, secs) in &waiting {
            self.waiting.get_or_create(l).set(*secs);
        }
        self.namespaces.set(i64::try_from(t.total).unwrap_or(i64::MAX));
        self.truncated.set(i64::from(t.truncated));
        *shown = (
            rows.into_iter().map(|(l, _)| l).collect(),
            waiting.into_iter().map(|(l, _)| l).collect(),
        );
    }
}

/// All metrics of kjob-queue.
#[derive(Clone)]
pub struct Metrics {
    /// `kjob_redis_used_memory_bytes` by node.
    redis_used: Family<NodeLabel, Gauge>,
    /// `kjob_redis_maxmemory_bytes` by node.
    redis_max: Family<NodeLabel, Gauge>,
    queues: Arc<[(&'static str, QueueMetrics)]>,
    /// Handles registered nowhere, for a queue name that validation refuses anyway.
    unknown: Arc<QueueMetrics>,
    grpc: Arc<GrpcMetrics>,
    auth_refused: Family<RefusedLabels, Counter>,
    /// `kjob_queue_redis_data_lost_total`: Redis epoch or run id changes this replica saw.
    pub redis_data_lost: Counter,
    limits: crate::limits::LimitMetrics,
    budget: Arc<BudgetMetrics>,
    namespaces: Arc<NamespaceFamilies>,
}

/// The workers' shared API budget, as the TakeApiTokens calls this replica served saw it.
#[derive(Default)]
struct BudgetMetrics {
    rate: Gauge<f64, std::sync::atomic::AtomicU64>,
    namespaces: Gauge,
    granted: Counter,
    throttled: Counter,
    slowdowns: Counter,
}

impl Metrics {
    /// Creates the metrics of `queues` and of the `rpcs` (service, its methods) and registers
    /// them.
    pub fn register(
        registry: &mut Registry,
        queues: &[&'static str],
        rpcs: &[(&'static str, &'static [&'static str])],
    ) -> Self {
        let families = QueueFamilies::register(registry);
        let queues = queues.iter().map(|q| (*q, families.queue(q))).collect();
        let unknown = Arc::new(QueueFamilies::register(&mut Registry::default()).queue("unknown"));
        let grpc = Arc::new(GrpcMetrics::register(registry, rpcs));
        let auth_refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "kjob_queue_auth_refused",
            "Calls refused before any service saw them (UNAUTHENTICATED or PERMISSION_DENIED), by reason and the caller's role",
            auth_refused.clone(),
        );
        // Present from start, at 0: the refusal an alert on probing would watch first.
        let _ =
            auth_refused.get_or_create(&RefusedLabels { reason: "no_certificate", role: "none" });
        let redis_used = Family::<NodeLabel, Gauge>::default();
        let redis_max = Family::<NodeLabel, Gauge>::default();
        registry.register(
            "kjob_redis_used_memory_bytes",
            "Redis used_memory (INFO memory) of each node, sampled every second",
            redis_used.clone(),
        );
        registry.register(
            "kjob_redis_maxmemory_bytes",
            "Redis maxmemory of each node (0: no limit); at used >= max Redis refuses writes",
            redis_max.clone(),
        );
        let redis_data_lost = Counter::default();
        registry.register(
            "kjob_queue_redis_data_lost",
            "Times Redis may have lost writes (a wipe, a restart or a failover changed its epoch or run id); each holds leasing for the longest lease granted",
            redis_data_lost.clone(),
        );
        let limits = crate::limits::LimitMetrics::default();
        registry.register(
            "kjob_queue_calls_in_flight",
            "gRPC calls being handled now, across every connection (see --max-concurrent-calls)",
            limits.in_flight.clone(),
        );
        registry.register(
            "kjob_queue_calls_refused",
            "Calls refused with RESOURCE_EXHAUSTED because --max-concurrent-calls were being handled",
            limits.refused.clone(),
        );
        let budget = Arc::new(BudgetMetrics::default());
        registry.register(
            "kjob_queue_api_budget_rate",
            "The workers' shared API budget's current rate (requests/s) after 429 slowdowns, as last served here",
            budget.rate.clone(),
        );
        registry.register(
            "kjob_queue_api_budget_namespaces",
            "Namespaces sharing the workers' API budget, as last served here",
            budget.namespaces.clone(),
        );
        registry.register(
            "kjob_queue_api_budget_granted",
            "Tokens of the workers' API budget granted by this replica",
            budget.granted.clone(),
        );
        registry.register(
            "kjob_queue_api_budget_throttled",
            "429 answers from kube-apiserver the workers reported to this replica",
            budget.throttled.clone(),
        );
        registry.register(
            "kjob_queue_api_budget_slowdowns",
            "Times a 429 report to this replica lowered the API budget's rate",
            budget.slowdowns.clone(),
        );
        let namespaces = Arc::new(NamespaceFamilies::register(registry));
        Self {
            namespaces,
            redis_used,
            redis_max,
            queues,
            unknown,
            grpc,
            auth_refused,
            redis_data_lost,
            limits,
            budget,
        }
    }

    /// Records one TakeApiTokens answer (`throttled` 429s reported with it).
    pub fn api_budget(&self, g: &kjob_workqueue::budget::TokenGrant, throttled: u32) {
        let b = &self.budget;
        b.rate.set(g.rate);
        b.namespaces.set(i64::from(g.active_namespaces));
        b.granted.inc_by(u64::from(g.granted));
        b.throttled.inc_by(u64::from(throttled));
        if g.slowed {
            b.slowdowns.inc();
        }
    }

    /// Gives the `n` deepest namespaces series of their own (`--namespace-metrics-top`, at most
    /// [`crate::tenants::MAX_NAMESPACE_METRICS_TOP`]).
    pub fn set_namespace_top(&self, n: usize) {
        let n = n.min(crate::tenants::MAX_NAMESPACE_METRICS_TOP);
        self.namespaces.top.store(n, Ordering::Relaxed);
    }

    /// How many namespaces get series of their own.
    pub fn namespace_top(&self) -> usize {
        self.namespaces.top.load(Ordering::Relaxed)
    }

    /// Sets the per-namespace gauges from a refresh, removing the series of namespaces and
    /// Jobs no longer in it.
    pub fn set_namespaces(&self, t: &crate::tenants::TopNamespaces) {
        self.namespaces.set(t);
    }

    /// The global concurrency limit's handles, for the [`crate::limits::LimitLayer`].
    pub fn limits(&self) -> crate::limits::LimitMetrics {
        self.limits.clone()
    }

    /// `kjob_queue_auth_refused_total`, for the [`crate::auth::AuthLayer`].
    pub fn auth_refused(&self) -> Family<RefusedLabels, Counter> {
        self.auth_refused.clone()
    }

    /// Sets the Redis memory gauges from a sample.
    pub fn set_redis_memory(&self, nodes: &[kjob_workqueue::NodeMemory]) {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for n in nodes {
            let l = NodeLabel { node: n.node.clone() };
            self.redis_used.get_or_create(&l).set(i(n.used));
            self.redis_max.get_or_create(&l).set(i(n.max));
        }
    }

    /// The metrics of `queue`.
    pub fn queue(&self, queue: &str) -> &QueueMetrics {
        self.queues.iter().find(|(q, _)| *q == queue).map(|(_, m)| m).unwrap_or(&self.unknown)
    }

    /// Starts measuring one call of `service`/`method` (see [`Rpc`]).
    pub fn rpc(&self, service: &'static str, method: &'static str) -> Rpc<'_> {
        self.grpc.start(service, method)
    }

    /// Counts expired leases put back (`reaped`), of which `poisoned` went through the rate
    /// limiter (each of those is an AddRateLimited: a retry).
    pub fn count_reaped(&self, queue: &str, reaped: u32, poisoned: u32) {
        let m = self.queue(queue);
        m.lease_expired.inc_by(u64::from(reaped));
        m.poisoned.inc_by(u64::from(poisoned));
        m.retries.inc_by(u64::from(poisoned));
    }

    /// Refreshes the gauges from a stats snapshot.
    pub fn set_stats(&self, queue: &str, s: &kjob_workqueue::QueueStats) {
        let m = self.queue(queue);
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        m.depth.set(i(s.ready + s.dirty));
        m.ready.set(i(s.ready));
        m.delayed.set(i(s.delayed));
        m.leased.set(i(s.leased));
        let oldest = s.oldest_ready_ms.map(|t| (s.now_ms - t).max(0) as f64 / 1000.0);
        m.oldest_ready.set(oldest.unwrap_or(0.0));
        m.unfinished.set(s.unfinished_ms as f64 / 1000.0);
        let longest = s.oldest_started_ms.map(|t| (s.now_ms - t).max(0) as f64 / 1000.0);
        m.longest.set(longest.unwrap_or(0.0));
    }
}

/// Labels of the per-RPC series (every kjob RPC is unary).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_type: &'static str,
}

/// [`RpcLabels`] plus the status code the call ended with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_type: &'static str,
    grpc_code: &'static str,
}

/// The handles of one RPC.
struct RpcMetrics {
    labels: RpcLabels,
    started: Counter,
    handling: Histogram,
}

/// `grpc_server_started_total`, `grpc_server_handled_total`, `grpc_server_handling_seconds`.
struct GrpcMetrics {
    rpcs: Vec<RpcMetrics>,
    started: Family<RpcLabels, Counter>,
    handled: Family<CodeLabels, Counter>,
    handling: Family<RpcLabels, Histogram>,
}

fn handling_buckets() -> Histogram {
    // Prometheus' default buckets (go-grpc-prometheus uses them), plus the long-poll range of
    // Lease (up to a minute).
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
}

impl GrpcMetrics {
    fn register(registry: &mut Registry, rpcs: &[(&'static str, &'static [&'static str])]) -> Self {
        let started = Family::<RpcLabels, Counter>::default();
        let handled = Family::<CodeLabels, Counter>::default();
        let handling = Family::<RpcLabels, Histogram>::new_with_constructor(handling_buckets);
        registry.register(
            "grpc_server_started",
            "Total number of RPCs started on the server",
            started.clone(),
        );
        registry.register(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure",
            handled.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server",
            handling.clone(),
        );
        let rpcs = rpcs
            .iter()
            .flat_map(|&(service, methods)| methods.iter().map(move |m| (service, *m)))
            .map(|(grpc_service, grpc_method)| {
                let labels = RpcLabels { grpc_service, grpc_method, grpc_type: "unary" };
                // Present from start: the call counts, and the OK count, at 0.
                let _ = handled.get_or_create(&labels.with_code(Code::Ok));
                RpcMetrics {
                    started: started.get_or_create(&labels).clone(),
                    handling: handling.get_or_create(&labels).clone(),
                    labels,
                }
            })
            .collect();
        Self { rpcs, started, handled, handling }
    }

    fn start(&self, service: &'static str, method: &'static str) -> Rpc<'_> {
        let found = self
            .rpcs
            .iter()
            .find(|r| r.labels.grpc_method == method && r.labels.grpc_service == service);
        let rpc = match found {
            Some(r) => RpcRef::Known(r),
            // An RPC left out of the table at start: measured all the same, by label lookup.
            None => RpcRef::Other(RpcLabels {
                grpc_service: service,
                grpc_method: method,
                grpc_type: "unary",
            }),
        };
        match &rpc {
            RpcRef::Known(r) => r.started.inc(),
            RpcRef::Other(l) => self.started.get_or_create(l).inc(),
        };
        Rpc { metrics: self, rpc, started: Instant::now(), ended: false }
    }
}

impl RpcLabels {
    fn with_code(&self, code: Code) -> CodeLabels {
        CodeLabels {
            grpc_service: self.grpc_service,
            grpc_method: self.grpc_method,
            grpc_type: self.grpc_type,
            grpc_code: code_name(code),
        }
    }
}

enum RpcRef<'a> {
    Known(&'a RpcMetrics),
    Other(RpcLabels),
}

/// One call being measured: made by [`Metrics::rpc`] on entry (counting it started), ended by
/// [`Rpc::end`] with the call's status code on every exit (counting it handled and observing
/// its latency). A call dropped before it ended (the client went away) counts as `Canceled`.
pub struct Rpc<'a> {
    metrics: &'a GrpcMetrics,
    rpc: RpcRef<'a>,
    started: Instant,
    ended: bool,
}

impl Rpc<'_> {
    /// Ends the call with `code`.
    pub fn end(mut self, code: Code) {
        self.finish(code);
    }

    /// Ends the call with the code of `res`, and hands `res` back.
    pub fn end_with<T>(self, res: Result<T, tonic::Status>) -> Result<T, tonic::Status> {
        self.end(res.as_ref().map_or_else(|s| s.code(), |_| Code::Ok));
        res
    }

    fn finish(&mut self, code: Code) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let secs = self.started.elapsed().as_secs_f64();
        let labels = match &self.rpc {
            RpcRef::Known(r) => {
                r.handling.observe(secs);
                &r.labels
            }
            RpcRef::Other(l) => {
                self.metrics.handling.get_or_create(l).observe(secs);
                l
            }
        };
        self.metrics.handled.get_or_create(&labels.with_code(code)).inc();
    }
}

impl Drop for Rpc<'_> {
    fn drop(&mut self) {
        self.finish(Code::Cancelled);
    }
}

/// The code's name as gRPC's Go implementation spells it (`codes.Code.String()`), which is
/// what go-grpc-prometheus puts in `grpc_code` and dashboards match on.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(r: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, r).unwrap();
        out
    }

    #[test]
    fn series_exist_at_zero_and_calls_count_by_code() {
        let mut r = Registry::default();
        let m = Metrics::register(&mut r, &["job", "orphan-pod"], &[("svc.Q", &["Add"])]);
        let text = render(&r);
        for want in [
            "workqueue_depth{name=\"job\"} 0",
            "workqueue_adds_total{name=\"orphan-pod\"} 0",
            "workqueue_queue_duration_seconds_count{name=\"job\"} 0",
            "grpc_server_started_total{grpc_service=\"svc.Q\",grpc_method=\"Add\",grpc_type=\"unary\"} 0",
            "grpc_server_handled_total{grpc_service=\"svc.Q\",grpc_method=\"Add\",grpc_type=\"unary\",grpc_code=\"OK\"} 0",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        m.rpc("svc.Q", "Add").end(Code::Ok);
        let _ = m.rpc("svc.Q", "Add").end_with::<()>(Err(tonic::Status::invalid_argument("x")));
        drop(m.rpc("svc.Q", "Add"));
        m.rpc("svc.Q", "Other").end(Code::Unavailable);
        m.queue("job").adds.inc();
        m.queue("nope").adds.inc();
        let text = render(&r);
        for want in [
            "grpc_server_started_total{grpc_service=\"svc.Q\",grpc_method=\"Add\",grpc_type=\"unary\"} 3",
            "grpc_code=\"OK\"} 1",
            "grpc_method=\"Add\",grpc_type=\"unary\",grpc_code=\"InvalidArgument\"} 1",
            "grpc_method=\"Add\",grpc_type=\"unary\",grpc_code=\"Canceled\"} 1",
            "grpc_method=\"Other\",grpc_type=\"unary\",grpc_code=\"Unavailable\"} 1",
            "grpc_server_handling_seconds_count{grpc_service=\"svc.Q\",grpc_method=\"Add\",grpc_type=\"unary\"} 3",
            "workqueue_adds_total{name=\"job\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(!text.contains("nope") && !text.contains("unknown"), "{text}");
        assert!(
            text.contains(
                "kjob_queue_auth_refused_total{reason=\"no_certificate\",role=\"none\"} 0"
            ),
            "{text}"
        );
    }
}
