//! Shared vocabulary of kjob, defined once: the names upstream Kubernetes uses for Job labels,
//! annotations and finalizers, kjob's queue names, the `namespace/name` key format, and the
//! limits and periods the services share.

pub mod events;
pub mod queue;
pub mod rbac;
pub mod seal;

pub use queue::{
    CachedView, Done, DoneAnswer, FinalizerRemovals, JobExpectations, JobView, LeaseOutcome,
    Leased, Observation, ObservationKind, SetExpectations, ViewOp, ViewRecord, ViewWriteBack,
};

use std::time::Duration;

/// Finalizer the Job controller puts on every pod it creates, removed once the pod is counted.
pub const JOB_TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// Label (and annotation) carrying a pod's completion index in Indexed Jobs.
pub const JOB_COMPLETION_INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
/// Annotation counting failures of the pod's index (backoffLimitPerIndex).
pub const JOB_INDEX_FAILURE_COUNT_ANNOTATION: &str = "batch.kubernetes.io/job-index-failure-count";
/// Annotation counting ignored failures of the pod's index (backoffLimitPerIndex).
pub const JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION: &str =
    "batch.kubernetes.io/job-index-ignored-failure-count";
/// Label with the owning Job's UID, added to the generated selector and template.
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// Legacy twin of [`CONTROLLER_UID_LABEL`].
pub const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
/// Label with the owning Job's name.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Legacy twin of [`JOB_NAME_LABEL`].
pub const LEGACY_JOB_NAME_LABEL: &str = "job-name";
/// Env var carrying the completion index inside Indexed Job containers.
pub const JOB_COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

/// `spec.managedBy` value of the built-in controller.
pub const BUILTIN_JOB_CONTROLLER: &str = "kubernetes.io/job-controller";
/// Default `spec.managedBy` value (and `--controller-name`) kjob answers to.
pub const DEFAULT_CONTROLLER_NAME: &str = "kjob.io/job-controller";

/// Queue of Job keys to sync.
pub const JOB_QUEUE: &str = "job";
/// Queue of orphan pod keys whose tracking finalizer must be removed.
pub const ORPHAN_POD_QUEUE: &str = "orphan-pod";
/// Every queue name kjob knows.
pub const QUEUES: [&str; 2] = [JOB_QUEUE, ORPHAN_POD_QUEUE];

/// The Namespace annotation that sets a namespace's weight in the fair lease (a positive
/// integer up to [`MAX_QUEUE_WEIGHT`]; absent or invalid: 1). A namespace of weight w is leased
/// w keys per turn of the deficit round robin over namespaces with ready work.
pub const QUEUE_WEIGHT_ANNOTATION: &str = "kjob.io/queue-weight";
/// Largest namespace weight: at most this many keys of one namespace per turn, so one tenant
/// cannot make the others wait for more than a bounded run of its keys.
pub const MAX_QUEUE_WEIGHT: u32 = 1000;

/// Longest key accepted anywhere: namespace (63) + '/' + name (253).
pub const MAX_KEY_LEN: usize = 63 + 1 + 253;

/// Largest request message kjob-queue decodes (8 MiB), and so the most a client sends in one
/// call. The largest request that must travel whole is one Done carrying a Job object at etcd's
/// 1.5 MiB object limit plus 10,000 pod UIDs each of expectations and finalizer removals
/// (about 2.3 MiB), or a GateEvents of 256 events at their key and message caps (about 5 MiB);
/// batches (Add, DoneBatch, the Dones a Lease carries) are split by their senders by encoded
/// bytes below it. One call's request then costs kjob-queue at most this much memory to decode.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// Largest reply message kjob-queue sends, and so the most a client decodes (16 MiB): a Job
/// view larger than a page comes in pages of [`VIEW_PAGE_BYTES`] (issue 46), so no reply grows
/// with a Job's size; the rest of the bound is room for what rides along (the Job object at
/// etcd's 1.5 MiB, records, a Lease's items and Done results).
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;
/// Most bytes of pods one page of a Job view carries (a page also holds at least one pod,
/// whatever its size): half of [`MAX_REPLY_BYTES`], so a first page with the Job object
/// (≤ 1.5 MiB), 16 records (≤ 1 MiB), the expectations and one pod past the budget (≤ 1.5 MiB)
/// stays under it; about 3,800 pods a page at today's ~2.2 KB a pod.
pub const VIEW_PAGE_BYTES: usize = MAX_REPLY_BYTES / 2;
/// Most items in one Add. The watcher, its only caller, sends at most 500 (its batch limit);
/// twice that bounds one Add's script run (a script blocks Redis while it runs).
pub const MAX_ADD_ITEMS: usize = 1000;
/// Most operations (view writes plus observations) in one Add item. A watcher snapshot item is
/// 200 pods and 4 other writes; 512 leaves room, and with [`MAX_ADD_ITEMS`] bounds one script's
/// work. The watcher splits a larger item (coalesced events of one Job) into several.
pub const MAX_ADD_ITEM_OPS: usize = 512;

/// Most Dones one DoneBatch call carries and one Done script call finishes (a script blocks
/// the whole Redis server while it runs).
pub const MAX_DONE_BATCH: usize = 200;
/// Delay that batches the syncs triggered by pod events and Job status updates, and the
/// smallest requeue delay of pod-failure backoff (upstream `syncJobBatchPeriod`).
pub const SYNC_JOB_BATCH_PERIOD: Duration = Duration::from_secs(1);
/// client-go `ExpectationsTimeout`: expectations older than this count as satisfied, so a lost
/// watch event cannot block a Job forever.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// Errors parsing an object key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// The key is empty.
    #[error("key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("key is {0} bytes long; the limit is {MAX_KEY_LEN}")]
    TooLong(usize),
    /// The key is not of the form `namespace/name`.
    #[error("key {0:?} is not of the form namespace/name")]
    Malformed(String),
    /// The namespace is not a DNS-1123 label, as Kubernetes requires of every namespace.
    #[error("key {key:?}: namespace {why}")]
    Namespace {
        /// The whole key.
        key: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The name is not a DNS-1123 subdomain, as Kubernetes requires of Job and pod names.
    #[error("key {key:?}: name {why}")]
    Name {
        /// The whole key.
        key: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Longest namespace: a DNS-1123 label.
const MAX_NAMESPACE_LEN: usize = 63;
/// Longest Job or pod name: a DNS-1123 subdomain.
const MAX_NAME_LEN: usize = 253;

/// Why `s` is not a DNS-1123 label (lowercase alphanumerics and '-', starting and ending with an
/// alphanumeric, at most 63 bytes), or None when it is.
fn dns1123_label_problem(s: &str) -> Option<&'static str> {
    dns1123_problem(s, MAX_NAMESPACE_LEN, false)
}

/// Why `s` is not a DNS-1123 subdomain (as a label, '.' also allowed, at most 253 bytes).
fn dns1123_subdomain_problem(s: &str) -> Option<&'static str> {
    dns1123_problem(s, MAX_NAME_LEN, true)
}

fn dns1123_problem(s: &str, max: usize, dots: bool) -> Option<&'static str> {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if s.len() > max {
        return Some(if dots {
            "is longer than 253 bytes (a DNS-1123 subdomain)"
        } else {
            "is longer than 63 bytes (a DNS-1123 label)"
        });
    }
    let b = s.as_bytes();
    if !b.iter().all(|&c| alnum(c) || c == b'-' || (dots && c == b'.')) {
        return Some(if dots {
            "may hold only lowercase letters, digits, '-' and '.' (a DNS-1123 subdomain)"
        } else {
            "may hold only lowercase letters, digits and '-' (a DNS-1123 label)"
        });
    }
    if !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Some("must start and end with a lowercase letter or digit");
    }
    None
}

/// A namespaced object key, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
}

impl ObjectKey {
    /// Builds a key from its parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// Parses `namespace/name` as Kubernetes names them: the namespace a DNS-1123 label, the
    /// name a DNS-1123 subdomain. So a key never holds ':', '{', '}' or a second '/', and the
    /// Redis keys built from it cannot collide with another key's or hit another hash tag.
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong(key.len()));
        }
        match key.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                if let Some(why) = dns1123_label_problem(ns) {
                    return Err(KeyError::Namespace { key: key.to_string(), why });
                }
                if let Some(why) = dns1123_subdomain_problem(name) {
                    return Err(KeyError::Name { key: key.to_string(), why });
                }
                Ok(Self::new(ns, name))
            }
            _ => Err(KeyError::Malformed(key.to_string())),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trip() {
        let k = ObjectKey::parse("default/pi").unwrap();
        assert_eq!(k, ObjectKey::new("default", "pi"));
        assert_eq!(k.to_string(), "default/pi");
    }

    #[test]
    fn key_rejects_bad_input() {
        assert_eq!(ObjectKey::parse(""), Err(KeyError::Empty));
        for bad in ["noslash", "/name", "ns/", "a/b/c"] {
            assert!(matches!(ObjectKey::parse(bad), Err(KeyError::Malformed(_))), "{bad}");
        }
        let long = format!("ns/{}", "x".repeat(MAX_KEY_LEN));
        assert!(matches!(ObjectKey::parse(&long), Err(KeyError::TooLong(_))));
    }

    #[test]
    fn key_parts_are_kubernetes_names() {
        for good in [
            "a/b",
            "kube-system/pi-1",
            "ns0/job.v2",
            &format!("{}/{}", "n".repeat(63), "x".repeat(253)),
        ] {
            assert!(ObjectKey::parse(good).is_ok(), "{good}");
        }
        // Each of these would build a Redis key that names another key or hash tag.
        for bad in
            ["ns/a:seen", "ns/a:pods", "ns/{wq:job}", "ns/A", "ns/-a", "ns/a-", "ns/a_b", "ns/a b"]
        {
            let e = ObjectKey::parse(bad).unwrap_err();
            assert!(matches!(e, KeyError::Name { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("name"), "{e}");
        }
        for bad in ["ns.x/a", "NS/a", "n:s/a", &format!("{}/a", "n".repeat(64))] {
            let e = ObjectKey::parse(bad).unwrap_err();
            assert!(matches!(e, KeyError::Namespace { .. }), "{bad}: {e}");
        }
        assert!(ObjectKey::parse("ns/a:seen").unwrap_err().to_string().contains("DNS-1123"));
    }
}

/// Whether a controller named `controller_name` reconciles a Job whose `spec.managedBy` is
/// `managed_by`. With `manage_all`, Jobs without managedBy (or naming the built-in controller,
/// for clusters whose built-in Job controller is disabled) are taken too; Jobs naming any other
/// controller are never touched.
pub fn manages(managed_by: Option<&str>, controller_name: &str, manage_all: bool) -> bool {
    match managed_by {
        Some(m) if m == controller_name => true,
        None => manage_all,
        Some(m) => manage_all && m == BUILTIN_JOB_CONTROLLER,
    }
}

#[cfg(test)]
mod manages_tests {
    use super::*;

    #[test]
    fn managed_by_table() {
        let me = DEFAULT_CONTROLLER_NAME;
        let cases = [
            (Some(me), false, true),
            (Some(me), true, true),
            (None, false, false),
            (None, true, true),
            (Some(BUILTIN_JOB_CONTROLLER), false, false),
            (Some(BUILTIN_JOB_CONTROLLER), true, true),
            (Some("example.com/other"), true, false),
            (Some("example.com/other"), false, false),
        ];
        for (m, all, want) in cases {
            assert_eq!(manages(m, me, all), want, "{m:?} manage_all={all}");
        }
    }
}
