//! Best-effort Kubernetes events (events.k8s.io/v1) with the upstream reasons and messages.
//!
//! Syncs never wait for an event: they hand it to a bounded channel drained by one task; when
//! the channel is full the event is dropped and counted, because a slow events endpoint must not
//! slow down pod creation.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::sync::mpsc;

use crate::kube_api::KubeApi;
use crate::metrics::Metrics;

/// Events waiting to be written; beyond this they are dropped (best effort, bounded memory).
const EVENT_QUEUE_CAPACITY: usize = 1024;

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
            Self { tx, controller: controller.to_string(), instance, metrics },
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
    fn actions() {
        assert_eq!(action_of("FailedCreate"), "Create");
        assert_eq!(action_of("SuccessfulDelete"), "Delete");
        assert_eq!(action_of("Completed"), "Sync");
    }
}
