//! Best-effort Kubernetes events (events.k8s.io/v1) with the upstream reasons and messages.
//!
//! Syncs never wait for an event: they hand it to a bounded channel drained by one task; when
//! the channel is full the event is dropped and counted, because a slow events endpoint must not
//! slow down pod creation.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::sync::mpsc;

use crate::kube_api::KubeApi;
use crate::metrics::Metrics;

/// Events waiting to be written; beyond this they are dropped (best effort, bounded memory).
const EVENT_QUEUE_CAPACITY: usize = 1024;
/// Events a source may send about one object at once (client-go `defaultSpamBurst`).
pub const SPAM_BURST: f64 = 25.0;
/// Refill of that allowance: one event every 5 minutes (client-go `defaultSpamQPS`).
pub const SPAM_REFILL_PERIOD: Duration = Duration::from_secs(300);
/// Objects whose allowance is remembered; the least recently used is forgotten beyond this
/// (client-go `maxLruCacheEntries`).
pub const SPAM_CACHE_ENTRIES: usize = 4096;

/// Per (source, involved object) token bucket, as client-go's `EventSourceObjectSpamFilter`:
/// each object starts with [`SPAM_BURST`] events and regains one every
/// [`SPAM_REFILL_PERIOD`]; events over that are dropped. Keeps at most
/// [`SPAM_CACHE_ENTRIES`] objects (least recently used forgotten). Time comes in as a
/// parameter so the filter is plain data.
#[derive(Debug, Default)]
pub struct SpamFilter {
    buckets: HashMap<String, Bucket>,
    /// Last use → key, to find the least recently used entry.
    by_use: BTreeMap<u64, String>,
    uses: u64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    last_use: u64,
}

impl SpamFilter {
    /// An empty filter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether an event with this spam key may be sent at `now` (takes a token when it may).
    pub fn allow(&mut self, key: &str, now: Instant) -> bool {
        self.uses += 1;
        let use_id = self.uses;
        let bucket = match self.buckets.get_mut(key) {
            Some(b) => {
                self.by_use.remove(&b.last_use);
                let refill = now.saturating_duration_since(b.at).as_secs_f64()
                    / SPAM_REFILL_PERIOD.as_secs_f64();
                b.tokens = (b.tokens + refill).min(SPAM_BURST);
                b.at = now;
                b
            }
            None => {
                if self.buckets.len() >= SPAM_CACHE_ENTRIES
                    && let Some((_, oldest)) = self.by_use.pop_first()
                {
                    self.buckets.remove(&oldest);
                }
                self.buckets.entry(key.to_string()).or_insert(Bucket {
                    tokens: SPAM_BURST,
                    at: now,
                    last_use: use_id,
                })
            }
        };
        bucket.last_use = use_id;
        self.by_use.insert(use_id, key.to_string());
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
        self.buckets.is_empty()
    }
}

/// client-go's `getSpamKey`: source component and host, then the involved object's kind,
/// namespace, name, UID and apiVersion, joined without separator.
pub fn spam_key(component: &str, host: &str, object: &ObjectReference) -> String {
    [
        component,
        host,
        object.kind.as_deref().unwrap_or_default(),
        object.namespace.as_deref().unwrap_or_default(),
        object.name.as_deref().unwrap_or_default(),
        object.uid.as_deref().unwrap_or_default(),
        object.api_version.as_deref().unwrap_or_default(),
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

/// Cloneable handle that queues events for the writer task.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Event>,
    controller: String,
    instance: String,
    metrics: Metrics,
    spam: Arc<Mutex<SpamFilter>>,
}

/// The task writing queued events; run it until the sinks are dropped.
pub struct EventWriter {
    rx: mpsc::Receiver<Event>,
    api: KubeApi,
}

impl EventSink {
    /// A sink whose events name `controller` as reportingController and `instance` (the worker
    /// id) as reportingInstance, and the writer task that sends them through `api`.
    pub fn new(
        api: KubeApi,
        controller: &str,
        instance: &str,
        metrics: Metrics,
    ) -> (Self, EventWriter) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE_CAPACITY);
        // The API limits reportingInstance to 128 characters.
        let instance: String = instance.chars().take(128).collect();
        (
            Self {
                tx,
                controller: controller.to_string(),
                instance,
                metrics,
                spam: Arc::new(Mutex::new(SpamFilter::new())),
            },
            EventWriter { rx, api },
        )
    }

    /// Queues an event about `job`; never waits.
    pub fn job_event(&self, job: &Job, kind: EventType, reason: &str, note: &str) {
        let meta = &job.metadata;
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let regarding = ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..Default::default()
        };
        let key = spam_key(&self.controller, &self.instance, &regarding);
        // A poisoned lock only means another sync panicked mid-update; the counts stay usable.
        let allowed =
            self.spam.lock().unwrap_or_else(|e| e.into_inner()).allow(&key, Instant::now());
        if !allowed {
            self.metrics.events_spam_filtered.inc();
            tracing::debug!(reason, "event over the per-object spam limit; dropping it");
            return;
        }
        let event = Event {
            metadata: ObjectMeta {
                // Same shape as client-go: `<object>.<unique suffix>`.
                name: Some(format!("{name}.{}", uuid::Uuid::new_v4().simple())),
                namespace: Some(ns),
                ..Default::default()
            },
            event_time: Some(MicroTime(jiff::Timestamp::now())),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(action_of(reason).to_string()),
            reason: Some(reason.to_string()),
            note: Some(truncate_note(note)),
            regarding: Some(regarding),
            type_: Some(kind.as_str().to_string()),
            ..Default::default()
        };
        if self.tx.try_send(event).is_err() {
            self.metrics.events_dropped.inc();
            tracing::debug!(reason, "event queue full; dropping event");
        }
    }
}

impl EventWriter {
    /// Writes events until every sink is dropped; failures are logged and forgotten.
    pub async fn run(mut self) {
        while let Some(ev) = self.rx.recv().await {
            let ns = ev.metadata.namespace.clone().unwrap_or_default();
            if let Err(e) = self.api.create_event(&ns, &ev).await {
                tracing::debug!(error = %e, reason = ?ev.reason, "writing event failed");
            }
        }
    }
}

/// events.k8s.io/v1 requires an action; derive a stable one from the reason.
fn action_of(reason: &str) -> &'static str {
    match reason {
        "SuccessfulCreate" | "FailedCreate" => "Create",
        "SuccessfulDelete" | "FailedDelete" => "Delete",
        _ => "Sync",
    }
}

/// The API limits `note` to 1 kB.
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
        assert_eq!(spam_key("ctl", "w1", &obj), "ctlw1Jobnspiu1batch/v1");
        let mut newer = obj.clone();
        newer.resource_version = Some("8".into());
        assert_eq!(spam_key("ctl", "w1", &obj), spam_key("ctl", "w1", &newer));
    }

    #[test]
    fn actions() {
        assert_eq!(action_of("FailedCreate"), "Create");
        assert_eq!(action_of("SuccessfulDelete"), "Delete");
        assert_eq!(action_of("Completed"), "Sync");
    }
}
