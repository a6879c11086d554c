//! Kubernetes events as upstream's Job controller records them: core/v1 Events from source
//! `job-controller`, passed through client-go's event correlator (`tools/record/events_cache.go`)
//! before they are written.
//!
//! * **Counting** (`eventLogger`): a repeat of an identical event (same source, object, type,
//!   reason and message) PATCHes `count`, `lastTimestamp` and `message` of the existing Event
//!   instead of creating another.
//! * **Aggregation** (`EventAggregator`): once 10 events of one object, type and reason that
//!   differ only by message are seen within 600 s, the rest go to one event whose message is
//!   `(combined from similar events): <latest message>`, counted as above.
//! * **Spam filter** (`EventSourceObjectSpamFilter`): 25 events per source, object and event
//!   type, then one every 5 minutes; the rest are dropped (their occurrences still count).
//!
//! Upstream runs one controller process; kjob runs many workers, so the same repeat may come
//! from any of them. Event names are therefore not random but derived from the correlation key
//! (`<job>.<16 hex digits>`): every worker names the same event the same way, a second worker's
//! create gets 409 AlreadyExists and turns into a count PATCH of the existing Event, and counts
//! are written as "what the server had + 1" under a resourceVersion precondition, so concurrent
//! workers never lose an occurrence. The aggregator's similar-message sets and the spam
//! filter's token buckets, which client-go keeps in process memory, live in kjob-queue's Redis
//! (its `GateEvents` call, one script per batch), so every worker sees one bucket and one
//! aggregation record per Job: a Job gets one burst of 25 events, not 25 per worker. When
//! kjob-queue does not answer, the writer falls back to its own in-memory correlator state
//! (counted in `kjob_worker_events_gate_fallback_total`) rather than drop or hold events.
//!
//! Syncs never wait for an event: they hand it to a bounded channel drained by one task (which
//! owns the correlator and gates what it finds queued as one batch); when the channel is full
//! the event is dropped and counted, because a slow events endpoint must not slow down pod
//! creation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kjob_core::events::{GateEvent, Gated, MAX_GATE_EVENTS, MAX_GATED_MESSAGE_BYTES};
use kjob_queue_client::{QueueClient, RetryPolicy};
use tokio::sync::mpsc;

use crate::kube_api::{ApiError, KubeApi, WrittenEvent};
use crate::metrics::Metrics;

/// Events waiting to be written; beyond this they are dropped (best effort, bounded memory).
const EVENT_QUEUE_CAPACITY: usize = 1024;
/// How long the writer waits for more events after the first before gating them through
/// kjob-queue as one batch: at a low rate each event would otherwise cost a call of its own.
/// Events are written asynchronously anyway (upstream's broadcaster queues them too), and under
/// load a batch fills without waiting.
pub const EVENT_GATHER: Duration = Duration::from_millis(50);

/// `first` and what follows it on `rx` within `window` (or at once, with a zero window), up to
/// `max` events; a closed channel ends the wait.
async fn gather(
    rx: &mut mpsc::Receiver<NewEvent>,
    first: NewEvent,
    window: Duration,
    max: usize,
) -> Vec<NewEvent> {
    let until = tokio::time::Instant::now() + window;
    let mut batch = vec![first];
    while batch.len() < max {
        match rx.try_recv() {
            Ok(ev) => batch.push(ev),
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) if window.is_zero() => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(ev)) => batch.push(ev),
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
    batch
}

/// `source.component` of every event: upstream's Job controller records as `job-controller`
/// (`kubectl describe` shows it under "From").
pub const SOURCE_COMPONENT: &str = "job-controller";
/// Events a source may send about one object at once (client-go `defaultSpamBurst`).
pub const SPAM_BURST: f64 = kjob_core::events::SPAM_BURST as f64;
/// Refill of that allowance: one event every 5 minutes (client-go `defaultSpamQPS`).
pub const SPAM_REFILL_PERIOD: Duration = kjob_core::events::SPAM_REFILL_PERIOD;
/// Entries each correlator cache remembers; the least recently used is forgotten beyond this
/// (client-go `maxLruCacheEntries`).
pub const SPAM_CACHE_ENTRIES: usize = 4096;
/// Similar events (differing only by message) seen before they are combined (client-go
/// `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_EVENTS: usize = kjob_core::events::AGGREGATE_MAX_EVENTS as usize;
pub use kjob_core::events::{AGGREGATE_INTERVAL, AGGREGATE_PREFIX};
/// Writes tried for one event (create, 409 → read, PATCH, 409 → read, PATCH ...): concurrent
/// workers bumping one event each win a round, so a few rounds are plenty.
const MAX_WRITE_ROUNDS: usize = 6;
/// How long the writer waits for kjob-queue to gate a batch before its own correlator state
/// decides: events must not pile up behind a slow queue service.
const GATE_TIMEOUT: Duration = Duration::from_secs(2);
/// After a gate call failed, batches are gated locally this long without asking again, so a
/// queue service that is down costs one timeout per period, not one per batch.
const GATE_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A string-keyed LRU map of bounded size (client-go's `groupcache/lru`).
#[derive(Debug)]
struct Lru<V> {
    entries: HashMap<String, (V, u64)>,
    /// Last use → key, to find the least recently used entry.
    by_use: BTreeMap<u64, String>,
    uses: u64,
    capacity: usize,
}

impl<V> Lru<V> {
    fn new(capacity: usize) -> Self {
        Self { entries: HashMap::new(), by_use: BTreeMap::new(), uses: 0, capacity }
    }

    /// The entry for `key` (made with `make` if absent, forgetting the least recently used one
    /// when full), marked as used.
    fn entry(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        self.uses += 1;
        let use_id = self.uses;
        if let Some((_, last)) = self.entries.get(key) {
            self.by_use.remove(last);
        } else {
            if self.entries.len() >= self.capacity
                && let Some((_, oldest)) = self.by_use.pop_first()
            {
                self.entries.remove(&oldest);
            }
            self.entries.insert(key.to_string(), (make(), use_id));
        }
        self.by_use.insert(use_id, key.to_string());
        let slot = self.entries.get_mut(key).expect("inserted above");
        slot.1 = use_id;
        &mut slot.0
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.entries.get_mut(key).map(|(v, _)| v)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Per (source, involved object) token bucket, as client-go's `EventSourceObjectSpamFilter`:
/// each object starts with [`SPAM_BURST`] events and regains one every
/// [`SPAM_REFILL_PERIOD`]; events over that are dropped. Keeps at most
/// [`SPAM_CACHE_ENTRIES`] objects (least recently used forgotten). Time comes in as a
/// parameter so the filter is plain data.
#[derive(Debug)]
pub struct SpamFilter {
    buckets: Lru<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for SpamFilter {
    fn default() -> Self {
        Self { buckets: Lru::new(SPAM_CACHE_ENTRIES) }
    }
}

impl SpamFilter {
    /// An empty filter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether an event with this spam key may be sent at `now` (takes a token when it may).
    pub fn allow(&mut self, key: &str, now: Instant) -> bool {
        let bucket = self.buckets.entry(key, || Bucket { tokens: SPAM_BURST, at: now });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64()
            / SPAM_REFILL_PERIOD.as_secs_f64();
        bucket.tokens = (bucket.tokens + refill).min(SPAM_BURST);
        bucket.at = bucket.at.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Number of objects remembered.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no object is remembered.
    pub fn is_empty(&self) -> bool {
        self.buckets.len() == 0
    }
}

/// client-go's `getSpamKey`: source component and host, then the involved object's kind,
/// namespace, name, UID and apiVersion, and the event type, joined without separator (so
/// Warning events have a bucket of their own: a burst of Normal ones never drops them).
pub fn spam_key(component: &str, host: &str, object: &ObjectReference, type_: EventType) -> String {
    [
        component,
        host,
        object.kind.as_deref().unwrap_or_default(),
        object.namespace.as_deref().unwrap_or_default(),
        object.name.as_deref().unwrap_or_default(),
        object.uid.as_deref().unwrap_or_default(),
        object.api_version.as_deref().unwrap_or_default(),
        type_.as_str(),
    ]
    .concat()
}

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Informational.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event as the recorder makes it (client-go `makeEvent`), before correlation.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The involved object.
    pub regarding: ObjectReference,
    /// Normal or Warning.
    pub type_: EventType,
    /// Upstream reason.
    pub reason: String,
    /// Upstream message.
    pub message: String,
}

/// client-go's `getEventKey` (source, object with field path, type, reason, message).
fn event_key(component: &str, ev: &NewEvent) -> String {
    let o = &ev.regarding;
    [
        component,
        "",
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.field_path.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
        ev.type_.as_str(),
        &ev.reason,
        &ev.message,
    ]
    .concat()
}

/// client-go's `EventAggregatorByReasonFunc`: the group key (source, object, type, reason,
/// reporting controller and instance) of events that differ only by message. The reporting
/// instance is empty, as client-go's recorder sets it (from the empty source host), so that
/// every worker's events group alike.
fn aggregate_key(component: &str, reporting: &str, ev: &NewEvent) -> String {
    [spam_key(component, "", &ev.regarding, ev.type_).as_str(), &ev.reason, reporting, ""].concat()
}

/// 64-bit FNV-1a: a hash every worker (and every build) computes alike, unlike std's hasher.
fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The name every worker gives the event of correlation key `key` about object `object_name`:
/// client-go's `<object>.<16 hex digits>` shape, the digits a hash of the key instead of the
/// time.
pub fn event_name(object_name: &str, key: &str) -> String {
    format!("{object_name}.{:016x}", fnv1a64(key))
}

#[derive(Debug)]
struct AggregateRecord {
    messages: BTreeSet<String>,
    last: Timestamp,
}

/// What the server holds of one correlated event, and what is not written yet.
#[derive(Debug, Clone)]
struct EventLog {
    name: String,
    /// Count and resourceVersion from the last write (None: not written yet).
    written: Option<(i32, String)>,
    /// Occurrences observed since then (spam-filtered ones included, as client-go counts
    /// them).
    unsent: i32,
}

/// What the aggregator and the spam filter made of one event (shared or local state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// Correlation key: the event key, or the aggregate key for a combined event.
    pub key: String,
    /// Message to write (prefixed for a combined event).
    pub message: String,
    /// The spam filter dropped it.
    pub dropped: bool,
}

impl From<Gated> for Gate {
    fn from(g: Gated) -> Self {
        Self { key: g.key, message: g.message, dropped: g.dropped }
    }
}

/// One event to write, after correlation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Correlated {
    /// Correlation key: the event key, or the aggregate key for a combined event.
    pub key: String,
    /// Name of the Event object.
    pub name: String,
    /// Message to write (prefixed for a combined event).
    pub message: String,
    /// Occurrences to add to the server's count (1 unless spam-filtered repeats preceded it).
    pub occurrences: i32,
    /// Count and resourceVersion of this worker's last write of it, if any.
    pub written: Option<(i32, String)>,
}

/// client-go's `EventCorrelator` (aggregator → logger → spam filter) as plain data: time comes
/// in as a parameter, writes are the caller's.
#[derive(Debug)]
pub struct Correlator {
    component: String,
    reporting: String,
    aggregates: Lru<AggregateRecord>,
    logs: Lru<EventLog>,
    spam: SpamFilter,
}

impl Correlator {
    /// An empty correlator for events of source `component` reported by controller
    /// `reporting`.
    pub fn new(component: &str, reporting: &str) -> Self {
        Self {
            component: component.to_string(),
            reporting: reporting.to_string(),
            aggregates: Lru::new(SPAM_CACHE_ENTRIES),
            logs: Lru::new(SPAM_CACHE_ENTRIES),
            spam: SpamFilter::new(),
        }
    }

    /// Correlates an event seen at `now` (wall clock, for aggregation) / `mono` (for the spam
    /// filter) with this correlator's own state: what to write, or `None` when the spam filter
    /// drops it.
    pub fn correlate(
        &mut self,
        ev: &NewEvent,
        now: Timestamp,
        mono: Instant,
    ) -> Option<Correlated> {
        let gate = self.gate(ev, now, mono);
        self.observe(ev, &gate)
    }

    /// The shared-state request of `ev` (client-go's keys of it).
    pub fn gate_request(&self, ev: &NewEvent) -> GateEvent {
        let o = &ev.regarding;
        GateEvent {
            object_key: format!(
                "{}/{}",
                o.namespace.as_deref().unwrap_or_default(),
                o.name.as_deref().unwrap_or_default()
            ),
            spam_key: spam_key(&self.component, "", o, ev.type_),
            aggregate_key: aggregate_key(&self.component, &self.reporting, ev),
            event_key: event_key(&self.component, ev),
            message: ev.message.clone(),
        }
    }

    /// The aggregator and spam filter over this correlator's own state (client-go's
    /// `EventAggregate` and `filterFunc`).
    pub fn gate(&mut self, ev: &NewEvent, now: Timestamp, mono: Instant) -> Gate {
        // EventAggregate.
        let agg_key = aggregate_key(&self.component, &self.reporting, ev);
        let record = self
            .aggregates
            .entry(&agg_key, || AggregateRecord { messages: BTreeSet::new(), last: now });
        let fresh = now
            .duration_since(record.last)
            .try_into()
            .is_ok_and(|d: Duration| d > AGGREGATE_INTERVAL);
        if fresh {
            record.messages.clear();
        }
        record.messages.insert(ev.message.clone());
        record.last = now;
        let (key, message) = if record.messages.len() < AGGREGATE_MAX_EVENTS {
            (event_key(&self.component, ev), ev.message.clone())
        } else {
            // Do not grow the set beyond the threshold (client-go pops any one).
            if let Some(any) = record.messages.iter().next().cloned() {
                record.messages.remove(&any);
            }
            (agg_key, format!("{AGGREGATE_PREFIX}{}", ev.message))
        };
        // Filter (the aggregation record above counts a dropped event too, as client-go's).
        let spam = spam_key(&self.component, "", &ev.regarding, ev.type_);
        let dropped = !self.spam.allow(&spam, mono);
        Gate { key, message, dropped }
    }

    /// client-go's `eventObserve` of a gated event: the occurrence counts even when dropped;
    /// what to write, or `None` when the gate dropped it.
    pub fn observe(&mut self, ev: &NewEvent, gate: &Gate) -> Option<Correlated> {
        let object_name = ev.regarding.name.clone().unwrap_or_default();
        let Gate { key, message, dropped } = gate.clone();
        let log = self.logs.entry(&key, || EventLog {
            name: event_name(&object_name, &key),
            written: None,
            unsent: 0,
        });
        log.unsent += 1;
        let out = Correlated {
            key,
            name: log.name.clone(),
            message,
            occurrences: log.unsent,
            written: log.written.clone(),
        };
        (!dropped).then_some(out)
    }

    /// Records what the server holds after a write of `c` (client-go `UpdateState`): its name,
    /// count and resourceVersion; the occurrences it carried are no longer unsent.
    pub fn written(&mut self, c: &Correlated, event: &WrittenEvent) {
        if let Some(log) = self.logs.get_mut(&c.key) {
            log.name = if event.name.is_empty() { c.name.clone() } else { event.name.clone() };
            log.written = Some((event.count.unwrap_or(1), event.resource_version.clone()));
            log.unsent = (log.unsent - c.occurrences).max(0);
        }
    }

    /// Makes later repeats of `c` go to `name` (a name collision moved it there).
    fn rename(&mut self, c: &Correlated, name: &str) {
        if let Some(log) = self.logs.get_mut(&c.key) {
            log.name = name.to_string();
            log.written = None;
        }
    }
}

/// The core/v1 Event of a first write (client-go `makeEvent` with `Source`). The reporting
/// controller is kjob's controller name, which tells kjob's events from the built-in
/// controller's (both have source `job-controller`, which `kubectl describe` shows). A
/// combined event has none, as client-go's aggregate copy (`EventAggregate` builds it from the
/// source alone).
fn new_event(
    ev: &NewEvent,
    c: &Correlated,
    component: &str,
    reporting: &str,
    now: Timestamp,
) -> Event {
    let ns = ev.regarding.namespace.clone().unwrap_or_else(|| "default".to_string());
    Event {
        metadata: ObjectMeta {
            name: Some(c.name.clone()),
            namespace: Some(ns),
            ..Default::default()
        },
        involved_object: ev.regarding.clone(),
        reason: Some(ev.reason.clone()),
        message: Some(truncate_note(&c.message)),
        type_: Some(ev.type_.as_str().to_string()),
        source: Some(EventSource { component: Some(component.to_string()), host: None }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(c.occurrences),
        reporting_component: Some(if c.key == aggregate_key(component, reporting, ev) {
            String::new()
        } else {
            reporting.to_string()
        }),
        reporting_instance: Some(String::new()),
        ..Default::default()
    }
}

/// The count PATCH of a repeat (client-go's two-way merge patch of count, lastTimestamp and
/// message), guarded by the resourceVersion the count was read at.
fn count_patch(
    count: i32,
    message: &str,
    resource_version: &str,
    now: Timestamp,
) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "count": count,
        "lastTimestamp": Time(now),
        "message": truncate_note(message),
    })
}

/// Whether an Event found under a correlated name is that event (not a hash collision).
fn same_event(found: &Event, ev: &NewEvent, component: &str) -> bool {
    found.involved_object.uid == ev.regarding.uid
        && found.involved_object.kind == ev.regarding.kind
        && found.reason.as_deref() == Some(ev.reason.as_str())
        && found.type_.as_deref() == Some(ev.type_.as_str())
        && found.source.as_ref().and_then(|s| s.component.as_deref()) == Some(component)
}

/// Cloneable handle that queues events for the writer task.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<NewEvent>,
    metrics: Metrics,
}

/// The task correlating and writing queued events; run it until the sinks are dropped.
pub struct EventWriter {
    rx: mpsc::Receiver<NewEvent>,
    api: KubeApi,
    correlator: Correlator,
    component: String,
    reporting: String,
    metrics: Metrics,
    /// kjob-queue's shared aggregator and spam filter (`None`: this worker's own state only).
    shared: Option<SharedGate>,
}

/// The shared correlator state behind kjob-queue, and when to ask it again after a failure.
struct SharedGate {
    queue: QueueClient,
    /// Until then, batches are gated locally (the last call failed).
    retry_at: Option<Instant>,
}

impl EventSink {
    /// A sink and the writer task that sends its events through `api`. Events have source
    /// [`SOURCE_COMPONENT`] and reporting controller `controller`; the worker id (`_instance`)
    /// is not written (reporting instance empty, as upstream's): the correlation of repeats
    /// across workers needs every worker to write an event alike.
    pub fn new(
        api: KubeApi,
        controller: &str,
        _instance: &str,
        metrics: Metrics,
    ) -> (Self, EventWriter) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE_CAPACITY);
        let writer = EventWriter {
            rx,
            api,
            correlator: Correlator::new(SOURCE_COMPONENT, controller),
            component: SOURCE_COMPONENT.to_string(),
            reporting: controller.to_string(),
            metrics: metrics.clone(),
            shared: None,
        };
        (Self { tx, metrics }, writer)
    }

    /// Queues an event about `job`; never waits.
    pub fn job_event(&self, job: &Job, kind: EventType, reason: &str, message: &str) {
        let meta = &job.metadata;
        let regarding = ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..Default::default()
        };
        let ev = NewEvent {
            regarding,
            type_: kind,
            reason: reason.to_string(),
            message: message.to_string(),
        };
        self.metrics.events_recorded.inc();
        if self.tx.try_send(ev).is_err() {
            self.metrics.events_dropped.inc();
            tracing::debug!(reason, "event queue full; dropping event");
        }
    }
}

impl EventWriter {
    /// Gates events through kjob-queue's shared aggregator and spam filter (one bucket and one
    /// aggregation record per Job for every worker), falling back to this writer's own state
    /// when it does not answer.
    pub fn with_shared_gate(mut self, queue: QueueClient) -> Self {
        // No retries: a failed call falls back at once, and the next batch asks again.
        let queue = queue.with_retry_policy(RetryPolicy::no_retries());
        self.shared = Some(SharedGate { queue, retry_at: None });
        self
    }

    /// Correlates and writes events until every sink is dropped; failures are logged and
    /// forgotten. What is queued when the writer looks is gated as one batch.
    pub async fn run(mut self) {
        // With the shared gate each batch costs a kjob-queue call: gather what a sync or two
        // records (a Job's SuccessfulCreate, another's Completed) into one.
        let window = if self.shared.is_some() { EVENT_GATHER } else { Duration::ZERO };
        while let Some(first) = self.rx.recv().await {
            let batch = gather(&mut self.rx, first, window, MAX_GATE_EVENTS).await;
            let gates = self.gate(&batch).await;
            for (ev, gate) in batch.iter().zip(gates) {
                let Some(c) = self.correlator.observe(ev, &gate) else {
                    self.metrics.events_spam_filtered.inc();
                    tracing::debug!(
                        reason = ev.reason,
                        "event over the per-object spam limit; dropping it"
                    );
                    continue;
                };
                if let Err(e) = self.write(ev, c).await {
                    tracing::debug!(error = %e, reason = ev.reason, "writing event failed");
                }
            }
        }
    }

    /// Aggregates and spam-filters a batch: with kjob-queue's shared state when it answers,
    /// else (and for messages too long to gate there) with this writer's own.
    async fn gate(&mut self, batch: &[NewEvent]) -> Vec<Gate> {
        let shareable = |ev: &NewEvent| ev.message.len() <= MAX_GATED_MESSAGE_BYTES;
        let mut remote: Option<Vec<Gate>> = None;
        // Whether kjob-queue should have gated the shareable events but did not.
        let mut unanswered = false;
        if let Some(shared) = &mut self.shared
            && shared.retry_at.is_some_and(|t| Instant::now() < t)
        {
            unanswered = true;
        } else if let Some(shared) = &mut self.shared
            && batch.iter().any(shareable)
        {
            let requests: Vec<GateEvent> = batch
                .iter()
                .filter(|ev| shareable(ev))
                .map(|ev| self.correlator.gate_request(ev))
                .collect();
            let sent = requests.len();
            let answer = tokio::time::timeout(GATE_TIMEOUT, shared.queue.gate_events(requests));
            match answer.await {
                Ok(Ok(gated)) if gated.len() == sent => {
                    shared.retry_at = None;
                    remote = Some(gated.into_iter().map(Gate::from).collect());
                }
                failed => {
                    let error = match failed {
                        Ok(Ok(gated)) => format!("{} answers to {sent} events", gated.len()),
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => format!("no answer in {GATE_TIMEOUT:?}"),
                    };
                    tracing::warn!(
                        %error,
                        events = batch.len(),
                        "kjob-queue did not gate events; using this worker's correlator state"
                    );
                    shared.retry_at = Some(Instant::now() + GATE_RETRY_AFTER);
                    unanswered = true;
                }
            }
        }
        let mut remote = remote.map(Vec::into_iter);
        let (now, mono) = (Timestamp::now(), Instant::now());
        batch
            .iter()
            .map(|ev| match remote.as_mut().filter(|_| shareable(ev)).and_then(Iterator::next) {
                Some(gate) => gate,
                None => {
                    if unanswered && shareable(ev) {
                        self.metrics.events_gate_fallback.inc();
                    }
                    self.correlator.gate(ev, now, mono)
                }
            })
            .collect()
    }

    /// Writes one correlated event: a create for a first occurrence, a count PATCH under a
    /// resourceVersion precondition for a repeat; a create that finds the name taken, or a
    /// PATCH that finds the event changed, reads the event (an empty PATCH: upstream's RBAC has
    /// no `get` on events) and PATCHes again from what it read.
    async fn write(&mut self, ev: &NewEvent, mut c: Correlated) -> Result<(), ApiError> {
        enum Next {
            Create,
            Patch { count: i32, rv: String },
            Read,
        }
        let ns = ev.regarding.namespace.clone().unwrap_or_else(|| "default".to_string());
        let mut next = match &c.written {
            Some((count, rv)) => Next::Patch { count: *count, rv: rv.clone() },
            None => Next::Create,
        };
        let mut last_err = None;
        for _ in 0..MAX_WRITE_ROUNDS {
            let now = Timestamp::now();
            let sent = match next {
                Next::Create => {
                    let event = new_event(ev, &c, &self.component, &self.reporting, now);
                    self.api.create_event(&ns, &event).await
                }
                Next::Patch { count, rv } => {
                    let patch = count_patch(count + c.occurrences, &c.message, &rv, now);
                    match self.api.patch_event_count(&ns, &c.name, &patch).await {
                        // Expired (events live an hour) or deleted: start over.
                        Err(ApiError::NotFound(_)) => {
                            next = Next::Create;
                            continue;
                        }
                        sent => sent,
                    }
                }
                Next::Read => {
                    next = match self.api.patch_event(&ns, &c.name, &serde_json::json!({})).await {
                        Ok(found) if same_event(&found, ev, &self.component) => Next::Patch {
                            count: found.count.unwrap_or(1),
                            rv: found.metadata.resource_version.clone().unwrap_or_default(),
                        },
                        Ok(_) => {
                            // Another event hashed to this name: fall back to client-go's
                            // time-based name (this worker alone will count its repeats there).
                            let nanos = now.as_nanosecond();
                            let name = format!(
                                "{}.{nanos:x}",
                                ev.regarding.name.as_deref().unwrap_or_default()
                            );
                            self.correlator.rename(&c, &name);
                            c.name = name;
                            Next::Create
                        }
                        Err(ApiError::NotFound(_)) => Next::Create,
                        Err(e) => return Err(e),
                    };
                    continue;
                }
            };
            next = match sent {
                Ok(written) => {
                    self.correlator.written(&c, &written);
                    return Ok(());
                }
                Err(e @ ApiError::Conflict { .. }) => {
                    last_err = Some(e);
                    Next::Read
                }
                Err(e) => return Err(e),
            };
        }
        Err(last_err.unwrap_or_else(|| ApiError::Unavailable {
            what: format!("event {ns}/{}", c.name),
            message: "too many concurrent writers".into(),
        }))
    }
}

/// The API limits an event's message (`note`) to 1 kB.
fn truncate_note(note: &str) -> String {
    const MAX: usize = 1024;
    if note.len() <= MAX {
        return note.to_string();
    }
    let mut end = MAX;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_is_bounded_on_char_boundary() {
        let long = "é".repeat(800);
        let t = truncate_note(&long);
        assert!(t.len() <= 1024 && t.len() >= 1022, "{}", t.len());
        assert_eq!(truncate_note("short"), "short");
    }

    #[test]
    fn spam_filter_allows_a_burst_then_one_per_five_minutes_per_object() {
        let t0 = Instant::now();
        let mut f = SpamFilter::new();
        for i in 0..25 {
            assert!(f.allow("job-a", t0), "event {i} of the burst");
        }
        assert!(!f.allow("job-a", t0), "the 26th at once is dropped");
        assert!(f.allow("job-b", t0), "another object has its own allowance");
        assert!(!f.allow("job-a", t0 + Duration::from_secs(299)), "not refilled yet");
        assert!(f.allow("job-a", t0 + Duration::from_secs(300)), "one token after 5 minutes");
        assert!(!f.allow("job-a", t0 + Duration::from_secs(301)));
        // A long quiet spell refills up to the burst, never beyond.
        let later = t0 + Duration::from_secs(100 * 300);
        for _ in 0..25 {
            assert!(f.allow("job-a", later));
        }
        assert!(!f.allow("job-a", later));
        // Time going backwards (it cannot, but be safe) refills nothing.
        assert!(!f.allow("job-a", t0));
    }

    #[test]
    fn spam_filter_forgets_the_least_recently_used_object_beyond_its_capacity() {
        let t0 = Instant::now();
        let mut f = SpamFilter::new();
        for _ in 0..25 {
            assert!(f.allow("hot", t0));
        }
        assert!(!f.allow("hot", t0));
        for i in 0..SPAM_CACHE_ENTRIES - 1 {
            f.allow(&format!("o{i}"), t0);
        }
        assert_eq!(f.len(), SPAM_CACHE_ENTRIES);
        // Touching "hot" makes o0 the least recently used, so the next new key pushes o0 out
        // (a forgotten object starts over with a full allowance, as in client-go's LRU).
        assert!(!f.allow("hot", t0), "still remembered: the cache holds exactly its capacity");
        f.allow("new", t0);
        assert_eq!(f.len(), SPAM_CACHE_ENTRIES);
        assert!(!f.allow("hot", t0), "touched last, so o0 was forgotten instead");
        assert!(f.allow("o0", t0), "forgotten, so a fresh allowance");
    }

    #[test]
    fn spam_key_is_source_and_object() {
        let obj = ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            name: Some("pi".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        };
        let normal = EventType::Normal;
        assert_eq!(spam_key("ctl", "w1", &obj, normal), "ctlw1Jobnspiu1batch/v1Normal");
        let mut newer = obj.clone();
        newer.resource_version = Some("8".into());
        assert_eq!(spam_key("ctl", "w1", &obj, normal), spam_key("ctl", "w1", &newer, normal));
        // Warning events are filtered apart from Normal ones (client-go keys by type too).
        assert_ne!(
            spam_key("ctl", "w1", &obj, normal),
            spam_key("ctl", "w1", &obj, EventType::Warning)
        );
    }

    const CTL: &str = kjob_core::DEFAULT_CONTROLLER_NAME;

    fn job_ref(uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            name: Some("pi".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
    }

    fn ev(uid: &str, reason: &str, message: &str) -> NewEvent {
        NewEvent {
            regarding: job_ref(uid),
            type_: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// The writer's batches on tokio's paused clock: events within the window go together,
    /// a full batch and a closed channel end the wait, and a zero window takes only what waits.
    #[tokio::test(start_paused = true)]
    async fn the_writer_gathers_events_for_one_gate_call() {
        let (tx, mut rx) = mpsc::channel(16);
        let feed = |tx: mpsc::Sender<NewEvent>, gaps: Vec<u64>| {
            tokio::spawn(async move {
                for (i, ms) in gaps.into_iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    tx.send(ev("u1", &format!("R{i}"), "m")).await.unwrap();
                }
            })
        };
        let reasons = |b: Vec<NewEvent>| b.into_iter().map(|e| e.reason).collect::<Vec<_>>();
        let window = EVENT_GATHER;
        let first = || ev("u1", "first", "m");
        // Events at 0, 20 and 40 ms join the first; the one at 60 ms starts the next batch.
        feed(tx.clone(), vec![0, 20, 20, 20]);
        let t0 = tokio::time::Instant::now();
        assert_eq!(
            reasons(gather(&mut rx, first(), window, 10).await),
            ["first", "R0", "R1", "R2"]
        );
        assert_eq!(t0.elapsed(), window);
        // A full batch goes at once.
        assert_eq!(reasons(gather(&mut rx, first(), window, 2).await), ["first", "R3"]);
        assert_eq!(t0.elapsed(), Duration::from_millis(60));
        // A zero window takes what waits, without waiting.
        assert_eq!(reasons(gather(&mut rx, first(), Duration::ZERO, 10).await), ["first"]);
        assert_eq!(t0.elapsed(), Duration::from_millis(60));
        // The window counts from the first event, not from the last one.
        feed(tx.clone(), vec![30, 30]);
        let t1 = tokio::time::Instant::now();
        assert_eq!(reasons(gather(&mut rx, first(), window, 10).await), ["first", "R0"]);
        assert_eq!(t1.elapsed(), window);
        // A closed channel ends the wait as soon as it is drained.
        drop(tx);
        assert_eq!(reasons(gather(&mut rx, first(), window, 10).await), ["first", "R1"]);
        assert_eq!(t1.elapsed(), Duration::from_millis(60));
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// A correlator that saw Job `u1`'s event `reason`/`message` once, at 0 s: it, the event,
    /// that first answer and the clock it was given.
    fn seen_once(reason: &str, message: &str) -> (Correlator, NewEvent, Correlated, Instant) {
        let t = Instant::now();
        let mut c = Correlator::new(SOURCE_COMPONENT, CTL);
        let e = ev("u1", reason, message);
        let first = c.correlate(&e, at(0), t).unwrap();
        (c, e, first, t)
    }

    /// The server's answer to a write of `c` with count `count`.
    fn server(c: &Correlated, count: i32, rv: &str) -> WrittenEvent {
        WrittenEvent { name: c.name.clone(), resource_version: rv.into(), count: Some(count) }
    }

    #[test]
    fn identical_events_are_one_counted_event_under_one_name_in_every_worker() {
        let t = Instant::now();
        let mut w1 = Correlator::new(SOURCE_COMPONENT, CTL);
        let mut w2 = Correlator::new(SOURCE_COMPONENT, CTL);
        let a = w1.correlate(&ev("u1", "SuccessfulCreate", "Created pod: pi-a"), at(0), t).unwrap();
        assert_eq!((a.occurrences, a.written.clone()), (1, None), "a first occurrence is created");
        assert!(a.name.starts_with("pi.") && a.name.len() == "pi.".len() + 16, "{}", a.name);
        assert_eq!(a.message, "Created pod: pi-a");
        w1.written(&a, &server(&a, 1, "10"));
        // The repeat is a count PATCH from what the server holds.
        let again = w1.correlate(&ev("u1", "SuccessfulCreate", "Created pod: pi-a"), at(5), t);
        let again = again.unwrap();
        assert_eq!((again.name.as_str(), again.occurrences), (a.name.as_str(), 1));
        assert_eq!(again.written, Some((1, "10".to_string())));
        // Another worker names the same event alike (so its create meets the first one).
        let b = w2.correlate(&ev("u1", "SuccessfulCreate", "Created pod: pi-a"), at(6), t).unwrap();
        assert_eq!(b.name, a.name);
        // Another message, object or reason is another event.
        let mut other = |e: NewEvent| w2.correlate(&e, at(7), t).unwrap().name;
        assert_ne!(other(ev("u1", "SuccessfulCreate", "Created pod: pi-b")), a.name);
        assert_ne!(other(ev("u2", "SuccessfulCreate", "Created pod: pi-a")), a.name);
        assert_ne!(other(ev("u1", "SuccessfulDelete", "Created pod: pi-a")), a.name);
    }

    #[test]
    fn ten_similar_messages_within_ten_minutes_are_combined() {
        let t = Instant::now();
        let mut c = Correlator::new(SOURCE_COMPONENT, CTL);
        let mut names = BTreeSet::new();
        for i in 0..9 {
            let e = ev("u1", "SuccessfulCreate", &format!("Created pod: pi-{i}"));
            let out = c.correlate(&e, at(i), t).unwrap();
            assert_eq!(out.message, format!("Created pod: pi-{i}"), "event {i} stands alone");
            names.insert(out.name);
        }
        assert_eq!(names.len(), 9);
        let tenth = c.correlate(&ev("u1", "SuccessfulCreate", "Created pod: pi-9"), at(9), t);
        let tenth = tenth.unwrap();
        assert_eq!(tenth.message, "(combined from similar events): Created pod: pi-9");
        assert!(!names.contains(&tenth.name));
        c.written(&tenth, &server(&tenth, 1, "20"));
        let eleventh = c.correlate(&ev("u1", "SuccessfulCreate", "Created pod: pi-10"), at(10), t);
        let eleventh = eleventh.unwrap();
        assert_eq!(eleventh.name, tenth.name, "the combined event is counted up");
        assert_eq!(eleventh.message, "(combined from similar events): Created pod: pi-10");
        assert_eq!(eleventh.written, Some((1, "20".to_string())));
        // Another reason has its own group.
        let del = c.correlate(&ev("u1", "SuccessfulDelete", "Deleted pod: pi-0"), at(11), t);
        assert_eq!(del.unwrap().message, "Deleted pod: pi-0");
        // More than 600 s after the group's last event, it starts over.
        let later = c.correlate(&ev("u1", "SuccessfulCreate", "Created pod: pi-99"), at(611), t);
        assert_eq!(later.unwrap().message, "Created pod: pi-99");
    }

    #[test]
    fn spam_filtered_repeats_still_count() {
        let (mut c, e, first, t) = seen_once("FailedCreate", "Error creating: quota");
        c.written(&first, &server(&first, 1, "1"));
        for i in 1..25 {
            let r = c.correlate(&e, at(i), t).unwrap();
            c.written(&r, &server(&r, 1 + i as i32, &format!("{}", i + 1)));
        }
        // The 26th and 27th at once are over the burst: dropped, but counted.
        assert!(c.correlate(&e, at(30), t).is_none());
        assert!(c.correlate(&e, at(31), t).is_none());
        let next = c.correlate(&e, at(400), t + SPAM_REFILL_PERIOD).unwrap();
        assert_eq!(next.occurrences, 3, "the two dropped repeats go with the next write");
        assert_eq!(next.written, Some((25, "25".to_string())));
    }

    #[test]
    fn a_shared_gate_decides_and_dropped_occurrences_still_count() {
        let mut c = Correlator::new(SOURCE_COMPONENT, CTL);
        let e = ev("u1", "FailedCreate", "quota");
        let req = c.gate_request(&e);
        assert_eq!(req.object_key, "ns/pi");
        assert_eq!(req.spam_key, spam_key(SOURCE_COMPONENT, "", &e.regarding, e.type_));
        assert_eq!(req.aggregate_key, aggregate_key(SOURCE_COMPONENT, CTL, &e));
        assert_eq!(req.event_key, event_key(SOURCE_COMPONENT, &e));
        let pass = Gate { key: req.event_key.clone(), message: e.message.clone(), dropped: false };
        let first = c.observe(&e, &pass).unwrap();
        c.written(&first, &server(&first, 1, "1"));
        assert!(c.observe(&e, &Gate { dropped: true, ..pass.clone() }).is_none());
        let next = c.observe(&e, &pass).unwrap();
        assert_eq!(next.occurrences, 2, "the dropped occurrence goes with the next write");
        // A combined answer is counted under the aggregate key, as another event.
        let combined = Gate {
            key: req.aggregate_key.clone(),
            message: format!("{AGGREGATE_PREFIX}quota"),
            dropped: false,
        };
        let out = c.observe(&e, &combined).unwrap();
        assert_ne!(out.name, first.name);
        assert_eq!(out.message, "(combined from similar events): quota");
        // Written with no reporting controller, as client-go's aggregate copy.
        let v = serde_json::to_value(new_event(&e, &out, SOURCE_COMPONENT, CTL, at(0))).unwrap();
        assert_eq!(v["reportingComponent"], "");
        let v = serde_json::to_value(new_event(&e, &first, SOURCE_COMPONENT, CTL, at(0))).unwrap();
        assert_eq!(v["reportingComponent"], CTL);
    }

    #[test]
    fn first_write_and_count_patch_shapes() {
        let (_, e, out, _) = seen_once("Completed", "Job completed");
        let created = new_event(&e, &out, SOURCE_COMPONENT, CTL, at(0));
        let v = serde_json::to_value(&created).unwrap();
        assert_eq!(v["source"], serde_json::json!({"component": "job-controller"}));
        assert_eq!(v["count"], 1);
        assert_eq!(v["firstTimestamp"], v["lastTimestamp"]);
        assert_eq!(v["involvedObject"]["kind"], "Job");
        assert_eq!(v["involvedObject"]["uid"], "u1");
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(v["reason"], "Completed");
        assert_eq!(v["message"], "Job completed");
        assert_eq!(v["type"], "Normal");
        assert_eq!(v["reportingComponent"], CTL);
        assert!(v.get("eventTime").is_none_or(|t| t.is_null()), "a core/v1 (legacy) event");
        let p = count_patch(4, "Job completed", "77", at(9));
        assert_eq!(p["count"], 4);
        assert_eq!(p["metadata"]["resourceVersion"], "77");
        assert_eq!(p["lastTimestamp"], serde_json::to_value(Time(at(9))).unwrap());
        assert!(same_event(&created, &e, SOURCE_COMPONENT));
        assert!(!same_event(&created, &ev("u2", "Completed", "x"), SOURCE_COMPONENT));
    }

    #[test]
    fn fnv_is_stable() {
        // Fixed vectors: every worker and every build must name events alike.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(event_name("pi", "a"), "pi.af63dc4c8601ec8c");
    }
}
