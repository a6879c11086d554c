//! Events the Job controller records, with upstream reasons and messages.

/// Event type `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Informational event.
    Normal,
    /// Something went wrong or the Job failed.
    Warning,
}

impl EventType {
    /// The wire string (`Normal` / `Warning`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event about the Job being synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub type_: EventType,
    /// Upstream reason, e.g. `SuccessfulCreate`.
    pub reason: String,
    /// Upstream message, e.g. `Created pod: pi-x7k2p`.
    pub message: String,
}

impl Event {
    /// An event of the given type, reason and message.
    pub fn new(type_: EventType, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self { type_, reason: reason.into(), message: message.into() }
    }
}

/// Reason of a pod created for the Job.
pub const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
/// Reason of a failed pod creation.
pub const FAILED_CREATE: &str = "FailedCreate";
/// Reason of a pod deleted by the Job controller.
pub const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
/// Reason of a failed pod deletion.
pub const FAILED_DELETE: &str = "FailedDelete";
/// Reason when the Job got `Suspended=True`.
pub const SUSPENDED: &str = "Suspended";
/// Reason when the Job got `Suspended=False`.
pub const RESUMED: &str = "Resumed";
/// Reason when the Job got `Complete=True`.
pub const COMPLETED: &str = "Completed";
/// Reason when a Job completes with more successes than completions.
pub const TOO_MANY_SUCCEEDED_PODS: &str = "TooManySucceededPods";
/// Reason when the completion mode is neither NonIndexed nor Indexed.
pub const UNKNOWN_COMPLETION_MODE: &str = "UnknownCompletionMode";

/// `SuccessfulCreate`: `Created pod: <name>`.
pub fn created(pod_name: &str) -> Event {
    Event::new(EventType::Normal, SUCCESSFUL_CREATE, format!("Created pod: {pod_name}"))
}

/// `FailedCreate`: `Error creating: <err>`.
pub fn failed_create(error: &str) -> Event {
    Event::new(EventType::Warning, FAILED_CREATE, format!("Error creating: {error}"))
}

/// `SuccessfulDelete`: `Deleted pod: <name>`.
pub fn deleted(pod_name: &str) -> Event {
    Event::new(EventType::Normal, SUCCESSFUL_DELETE, format!("Deleted pod: {pod_name}"))
}

/// `FailedDelete`: `Error deleting: <err>`.
pub fn failed_delete(error: &str) -> Event {
    Event::new(EventType::Warning, FAILED_DELETE, format!("Error deleting: {error}"))
}

/// `Suspended`: `Job suspended`.
pub fn suspended() -> Event {
    Event::new(EventType::Normal, SUSPENDED, "Job suspended")
}

/// `Resumed`: `Job resumed`.
pub fn resumed() -> Event {
    Event::new(EventType::Normal, RESUMED, "Job resumed")
}

/// `Completed`: `Job completed`.
pub fn completed() -> Event {
    Event::new(EventType::Normal, COMPLETED, "Job completed")
}

/// `TooManySucceededPods` warning.
pub fn too_many_succeeded_pods() -> Event {
    Event::new(
        EventType::Warning,
        TOO_MANY_SUCCEEDED_PODS,
        "Too many succeeded pods running after completion count reached",
    )
}

/// Warning whose reason and message are those of the Job's `Failed` condition.
pub fn job_failed(reason: &str, message: &str) -> Event {
    Event::new(EventType::Warning, reason, message)
}

/// `UnknownCompletionMode` warning.
pub fn unknown_completion_mode() -> Event {
    Event::new(
        EventType::Warning,
        UNKNOWN_COMPLETION_MODE,
        "Skipped Job sync because completion mode is unknown",
    )
}
