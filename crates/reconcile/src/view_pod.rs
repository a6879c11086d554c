//! The pod as the shared Job view stores it: a compact summary of what syncJob reads, which the
//! worker expands back into a `Pod` for the rest of this crate.
//!
//! The leading watcher writes one entry per pod of every managed Job into Redis (sealed, see
//! `kjob_core::seal`); each worker reads every entry of a Job's view at each sync. Trimmed Pod
//! JSON cost about 1,280 bytes an entry (about 1,640 in Redis): field names, label keys the
//! Job controller always sets, the Job's UID three times, RFC 3339 times. This encoding keeps
//! the same facts, exactly:
//!
//! * the marker byte [`FORMAT_V1`], then a protobuf message ([`ViewPod`]; prost, field numbers
//!   are the format);
//! * strings the Job controller writes on every pod (its label and annotation keys, the tracking
//!   finalizer, `batch/v1`, `Job`, phases, condition types and statuses, `Always`) as small
//!   numbers ([`KNOWN`]), and label or annotation values equal to the controller's name or UID
//!   as a reference to the controller owner reference, which holds them once;
//! * the pod's name as what follows `<controller name>-` when it begins so; UIDs in the
//!   canonical UUID form as their 16 bytes;
//! * times as seconds (and nanoseconds, when any) since the pod's creationTimestamp;
//! * no namespace: a view holds only pods of its Job's namespace, and the entry's seal binds it
//!   to that Job's key, so [`decode`] takes the namespace from the key.
//!
//! What it keeps is what the trimmed JSON kept (`kjob_watcher::view::WatchedPod`): name, UID,
//! creation and deletion times, the deletion grace period, labels, the `batch.kubernetes.io/`
//! annotations, finalizers, owner references, nodeName, init containers' names and restart
//! policies, phase, conditions (type, status, transition time) and every container status'
//! name, restart count and terminated exit code and finish time. Empty lists and maps, and
//! empty strings of optional fields, decode as absent (as the API server's JSON leaves them
//! out).
//!
//! Version skew: [`decode`] reads this format and the trimmed Pod JSON that watchers before it
//! wrote (it begins with `{`). A worker before it parses every entry as JSON, which fails on the
//! marker byte, so it reads the API server instead of planning from the view (never from a part
//! of a pod). A change of what the message means takes another marker: prost skips fields it
//! does not know, so an old reader would otherwise read a new entry in part; [`decode`] refuses
//! markers it does not know.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition,
    PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use prost::Message;

/// The first byte of an entry in this format (JSON never begins with it).
pub const FORMAT_V1: u8 = 0x01;

/// Strings coded as numbers, code `FIRST_KNOWN + i` for `KNOWN[i]`. Append only: a code is part
/// of the format, and a reader that does not know a code refuses the entry.
pub const KNOWN: [&str; 26] = [
    kjob_core::CONTROLLER_UID_LABEL,
    kjob_core::JOB_NAME_LABEL,
    kjob_core::LEGACY_CONTROLLER_UID_LABEL,
    kjob_core::LEGACY_JOB_NAME_LABEL,
    kjob_core::JOB_COMPLETION_INDEX_ANNOTATION,
    kjob_core::JOB_INDEX_FAILURE_COUNT_ANNOTATION,
    kjob_core::JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION,
    kjob_core::JOB_TRACKING_FINALIZER,
    "batch/v1",
    "Job",
    "Pending",
    "Running",
    "Succeeded",
    "Failed",
    "Unknown",
    "True",
    "False",
    "PodScheduled",
    "Initialized",
    "ContainersReady",
    "Ready",
    "PodReadyToStartContainers",
    "DisruptionTarget",
    "Always",
    "0",
    "1",
];

/// Code of a string spelled out.
const LITERAL: u32 = 0;
/// Code of the controller owner reference's name.
const CONTROLLER_NAME: u32 = 1;
/// Code of the controller owner reference's UID.
const CONTROLLER_UID: u32 = 2;
/// Code of `KNOWN[0]`.
const FIRST_KNOWN: u32 = 3;

/// One pod of the view (after the marker byte). Strings that may be coded are a pair of fields:
/// the code, and the text when the code is 0 (both unset: absent, or empty).
#[derive(Clone, PartialEq, Message)]
pub struct ViewPod {
    /// `metadata.name`, or what follows `<controller name>-` when [`Self::name_after_controller`].
    #[prost(string, tag = "1")]
    pub name: String,
    /// The name begins with the controller's name and a dash, left out of [`Self::name`].
    #[prost(bool, tag = "2")]
    pub name_after_controller: bool,
    /// `metadata.uid` when it is a canonical UUID: its 16 bytes ([`uid_parts`]).
    #[prost(bytes = "vec", tag = "3")]
    pub uuid: Vec<u8>,
    /// `metadata.uid` otherwise.
    #[prost(string, tag = "4")]
    pub uid: String,
    /// `metadata.creationTimestamp`, seconds since the epoch.
    #[prost(sint64, optional, tag = "5")]
    pub created: Option<i64>,
    /// Its nanoseconds.
    #[prost(uint32, tag = "6")]
    pub created_nanos: u32,
    /// `metadata.deletionTimestamp`, seconds after the creation.
    #[prost(sint64, optional, tag = "7")]
    pub deleted: Option<i64>,
    /// Its nanoseconds.
    #[prost(uint32, tag = "8")]
    pub deleted_nanos: u32,
    /// `metadata.deletionGracePeriodSeconds`.
    #[prost(int64, optional, tag = "9")]
    pub deletion_grace_period_seconds: Option<i64>,
    /// `metadata.labels`.
    #[prost(message, repeated, tag = "10")]
    pub labels: Vec<Pair>,
    /// `metadata.annotations` (the `batch.kubernetes.io/` ones the watcher keeps).
    #[prost(message, repeated, tag = "11")]
    pub annotations: Vec<Pair>,
    /// `metadata.finalizers`.
    #[prost(message, repeated, tag = "12")]
    pub finalizers: Vec<Sym>,
    /// `metadata.ownerReferences`.
    #[prost(message, repeated, tag = "13")]
    pub owners: Vec<Owner>,
    /// What syncJob reads of `spec`.
    #[prost(message, optional, tag = "14")]
    pub spec: Option<Spec>,
    /// What syncJob reads of `status`.
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
}

/// A string: a code ([`KNOWN`], the controller's name or UID) or spelled out (code 0).
#[derive(Clone, PartialEq, Message)]
pub struct Sym {
    /// The code.
    #[prost(uint32, tag = "1")]
    pub code: u32,
    /// The text when the code is 0.
    #[prost(string, tag = "2")]
    pub text: String,
}

/// A label or annotation, its key and value each coded as a [`Sym`] is.
#[derive(Clone, PartialEq, Message)]
pub struct Pair {
    /// The key's code.
    #[prost(uint32, tag = "1")]
    pub key: u32,
    /// The key's text when its code is 0.
    #[prost(string, tag = "2")]
    pub key_text: String,
    /// The value's code.
    #[prost(uint32, tag = "3")]
    pub value: u32,
    /// The value's text when its code is 0.
    #[prost(string, tag = "4")]
    pub value_text: String,
}

/// An owner reference (its apiVersion and kind coded as a [`Sym`] is; never the controller's
/// name or UID by reference, since they are read from here).
#[derive(Clone, PartialEq, Message)]
pub struct Owner {
    /// `apiVersion`'s code.
    #[prost(uint32, tag = "1")]
    pub api_version: u32,
    /// `apiVersion` when its code is 0.
    #[prost(string, tag = "2")]
    pub api_version_text: String,
    /// `kind`'s code.
    #[prost(uint32, tag = "3")]
    pub kind: u32,
    /// `kind` when its code is 0.
    #[prost(string, tag = "4")]
    pub kind_text: String,
    /// `name`.
    #[prost(string, tag = "5")]
    pub name: String,
    /// `uid` when it is a canonical UUID: its 16 bytes.
    #[prost(bytes = "vec", tag = "6")]
    pub uuid: Vec<u8>,
    /// `uid` otherwise.
    #[prost(string, tag = "7")]
    pub uid: String,
    /// `controller`.
    #[prost(bool, optional, tag = "8")]
    pub controller: Option<bool>,
    /// `blockOwnerDeletion`.
    #[prost(bool, optional, tag = "9")]
    pub block_owner_deletion: Option<bool>,
}

/// What syncJob reads of a pod's spec.
#[derive(Clone, PartialEq, Message)]
pub struct Spec {
    /// `nodeName`.
    #[prost(string, tag = "1")]
    pub node_name: String,
    /// `initContainers`: names and restart policies.
    #[prost(message, repeated, tag = "2")]
    pub init_containers: Vec<InitContainer>,
}

/// An init container's name and restart policy (`Always` for a sidecar).
#[derive(Clone, PartialEq, Message)]
pub struct InitContainer {
    /// `name`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `restartPolicy`'s code.
    #[prost(uint32, tag = "2")]
    pub restart_policy: u32,
    /// `restartPolicy` when its code is 0 (absent: neither).
    #[prost(string, tag = "3")]
    pub restart_policy_text: String,
}

/// What syncJob reads of a pod's status.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    /// `phase`'s code.
    #[prost(uint32, tag = "1")]
    pub phase: u32,
    /// `phase` when its code is 0 (absent: neither).
    #[prost(string, tag = "2")]
    pub phase_text: String,
    /// `conditions`.
    #[prost(message, repeated, tag = "3")]
    pub conditions: Vec<Condition>,
    /// `containerStatuses`.
    #[prost(message, repeated, tag = "4")]
    pub containers: Vec<ContainerStat>,
    /// `initContainerStatuses`.
    #[prost(message, repeated, tag = "5")]
    pub init_containers: Vec<ContainerStat>,
}

/// A pod condition: type, status, and when it last changed.
#[derive(Clone, PartialEq, Message)]
pub struct Condition {
    /// `type`'s code.
    #[prost(uint32, tag = "1")]
    pub type_: u32,
    /// `type` when its code is 0.
    #[prost(string, tag = "2")]
    pub type_text: String,
    /// `status`'s code.
    #[prost(uint32, tag = "3")]
    pub status: u32,
    /// `status` when its code is 0.
    #[prost(string, tag = "4")]
    pub status_text: String,
    /// `lastTransitionTime`, seconds after the pod's creation.
    #[prost(sint64, optional, tag = "5")]
    pub changed: Option<i64>,
    /// Its nanoseconds.
    #[prost(uint32, tag = "6")]
    pub changed_nanos: u32,
}

/// A container status: name, restarts, and how it terminated.
#[derive(Clone, PartialEq, Message)]
pub struct ContainerStat {
    /// `name`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `restartCount`.
    #[prost(int32, tag = "2")]
    pub restart_count: i32,
    /// `state` is present.
    #[prost(bool, tag = "3")]
    pub has_state: bool,
    /// `state.terminated` is present.
    #[prost(bool, tag = "4")]
    pub terminated: bool,
    /// `state.terminated.exitCode`.
    #[prost(int32, tag = "5")]
    pub exit_code: i32,
    /// `state.terminated.finishedAt`, seconds after the pod's creation.
    #[prost(sint64, optional, tag = "6")]
    pub finished: Option<i64>,
    /// Its nanoseconds.
    #[prost(uint32, tag = "7")]
    pub finished_nanos: u32,
}

/// Why a view entry did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewPodError {
    /// Empty, or a marker this version does not know (a newer format).
    #[error("unknown view pod format {0:?}")]
    Format(Option<u8>),
    /// The message does not parse.
    #[error("view pod message: {0}")]
    Message(String),
    /// A string code this version does not know, or a reference to a controller the pod
    /// does not have.
    #[error("view pod string code {0} is not known here")]
    Code(u32),
    /// A time out of range.
    #[error("view pod time out of range")]
    Time,
    /// Trimmed Pod JSON (the format before this one) that does not parse.
    #[error("view pod JSON: {0}")]
    Json(String),
}

/// Codes strings for one pod: the controller's name and UID are references.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dict<'a> {
    controller_name: Option<&'a str>,
    controller_uid: Option<&'a str>,
}

impl<'a> Dict<'a> {
    /// The dictionary of a pod whose controller owner reference is `controller`, if any.
    pub fn new(controller: Option<(&'a str, &'a str)>) -> Self {
        Self { controller_name: controller.map(|c| c.0), controller_uid: controller.map(|c| c.1) }
    }

    /// `s` as `(code, text)`: a known string or a reference by its code, else spelled out.
    pub fn code(&self, s: &str) -> (u32, String) {
        if let Some(i) = KNOWN.iter().position(|k| *k == s) {
            return (FIRST_KNOWN + i as u32, String::new());
        }
        if !s.is_empty() && self.controller_uid == Some(s) {
            return (CONTROLLER_UID, String::new());
        }
        if !s.is_empty() && self.controller_name == Some(s) {
            return (CONTROLLER_NAME, String::new());
        }
        (LITERAL, s.to_string())
    }

    /// `s` as a [`Sym`].
    pub fn sym(&self, s: &str) -> Sym {
        let (code, text) = self.code(s);
        Sym { code, text }
    }

    /// A label or annotation as a [`Pair`].
    pub fn pair(&self, key: &str, value: &str) -> Pair {
        let (key, key_text) = self.code(key);
        let (value, value_text) = self.code(value);
        Pair { key, key_text, value, value_text }
    }

    /// The string of `(code, text)`.
    fn text(&self, code: u32, text: &str) -> Result<String, ViewPodError> {
        let s = match code {
            LITERAL => text,
            CONTROLLER_NAME => self.controller_name.ok_or(ViewPodError::Code(code))?,
            CONTROLLER_UID => self.controller_uid.ok_or(ViewPodError::Code(code))?,
            c => KNOWN.get((c - FIRST_KNOWN) as usize).ok_or(ViewPodError::Code(c))?,
        };
        Ok(s.to_string())
    }

    /// The pod name as [`ViewPod::name`] and [`ViewPod::name_after_controller`] keep it.
    pub fn name(&self, name: &str) -> (String, bool) {
        match self.controller_name.and_then(|c| name.strip_prefix(c)?.strip_prefix('-')) {
            Some(rest) => (rest.to_string(), true),
            None => (name.to_string(), false),
        }
    }
}

/// A UID as the view keeps it: `(its 16 bytes, "")` when it is a canonical UUID, else
/// `(empty, the text)`.
pub fn uid_parts(uid: &str) -> (Vec<u8>, String) {
    match uuid_bytes(uid) {
        Some(b) => (b.to_vec(), String::new()),
        None => (Vec::new(), uid.to_string()),
    }
}

/// The UID [`uid_parts`] gave these parts of.
fn uid_text(uuid: &[u8], text: String) -> Result<String, ViewPodError> {
    match uuid.len() {
        0 => Ok(text),
        16 => {
            let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
            Ok(format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            ))
        }
        n => Err(ViewPodError::Message(format!("a UUID of {n} bytes"))),
    }
}

/// The 16 bytes of a canonical UUID (lowercase hex, hyphens at 8, 13, 18 and 23), else `None`:
/// only a UID that prints back the same is kept as bytes.
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut n = 0;
    let mut i = 0;
    while i < 36 {
        if matches!(i, 8 | 13 | 18 | 23) {
            if b[i] != b'-' {
                return None;
            }
            i += 1;
            continue;
        }
        let nib = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        out[n] = (nib(b[i])? << 4) | nib(b[i + 1])?;
        n += 1;
        i += 2;
    }
    Some(out)
}

/// Times as the view keeps them: seconds after a base (the pod's creation), and nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    base: i64,
}

impl Clock {
    /// Times relative to `created` (the epoch when the pod has none).
    pub fn new(created: Option<&Time>) -> Self {
        Self { base: created.map_or(0, |t| t.0.as_second()) }
    }

    /// `t` as `(seconds after the base, nanoseconds)`.
    pub fn since(&self, t: Option<&Time>) -> (Option<i64>, u32) {
        match t {
            Some(t) => (
                Some(t.0.as_second() - self.base),
                u32::try_from(t.0.subsec_nanosecond()).unwrap_or(0),
            ),
            None => (None, 0),
        }
    }

    fn at(&self, secs: Option<i64>, nanos: u32) -> Result<Option<Time>, ViewPodError> {
        let Some(s) = secs else { return Ok(None) };
        let s = s.checked_add(self.base).ok_or(ViewPodError::Time)?;
        let nanos = i32::try_from(nanos).map_err(|_| ViewPodError::Time)?;
        Timestamp::new(s, nanos).map(|t| Some(Time(t))).map_err(|_| ViewPodError::Time)
    }
}

impl ViewPod {
    /// The entry: the marker byte, then the message.
    pub fn to_entry(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.encoded_len());
        out.push(FORMAT_V1);
        self.encode(&mut out).expect("a Vec grows as needed");
        out
    }
}

/// Decodes a view entry (opened from its seal) of a pod in `namespace` (the Job's): this format,
/// or the trimmed Pod JSON of watchers before it.
pub fn decode(entry: &[u8], namespace: &str) -> Result<Pod, ViewPodError> {
    match entry.first() {
        Some(&FORMAT_V1) => {
            let m =
                ViewPod::decode(&entry[1..]).map_err(|e| ViewPodError::Message(e.to_string()))?;
            expand(m, namespace)
        }
        Some(b'{') => serde_json::from_slice(entry).map_err(|e| ViewPodError::Json(e.to_string())),
        other => Err(ViewPodError::Format(other.copied())),
    }
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn text(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The Pod a message stands for.
fn expand(m: ViewPod, namespace: &str) -> Result<Pod, ViewPodError> {
    let owners = m
        .owners
        .into_iter()
        .map(|o| {
            let dict = Dict::default();
            Ok(OwnerReference {
                api_version: dict.text(o.api_version, &o.api_version_text)?,
                kind: dict.text(o.kind, &o.kind_text)?,
                name: o.name,
                uid: uid_text(&o.uuid, o.uid)?,
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
        })
        .collect::<Result<Vec<_>, ViewPodError>>()?;
    let controller =
        owners.iter().find(|r| r.controller == Some(true)).map(|c| (c.name.clone(), c.uid.clone()));
    let dict = Dict::new(controller.as_ref().map(|c| (c.0.as_str(), c.1.as_str())));
    let name = if m.name_after_controller {
        let c = dict.controller_name.ok_or(ViewPodError::Code(CONTROLLER_NAME))?;
        format!("{c}-{}", m.name)
    } else {
        m.name
    };
    let pairs = |v: Vec<Pair>| -> Result<Option<BTreeMap<String, String>>, ViewPodError> {
        let map = v
            .into_iter()
            .map(|p| Ok((dict.text(p.key, &p.key_text)?, dict.text(p.value, &p.value_text)?)))
            .collect::<Result<BTreeMap<_, _>, ViewPodError>>()?;
        Ok((!map.is_empty()).then_some(map))
    };
    let sym = |s: Sym| dict.text(s.code, &s.text);
    let clock = Clock { base: m.created.unwrap_or(0) };
    let labels = pairs(m.labels)?;
    let annotations = pairs(m.annotations)?;
    let finalizers = non_empty(m.finalizers.into_iter().map(sym).collect::<Result<_, _>>()?);
    let metadata = ObjectMeta {
        name: text(name),
        namespace: Some(namespace.to_string()),
        uid: text(uid_text(&m.uuid, m.uid)?),
        creation_timestamp: clock.at(m.created.map(|_| 0), m.created_nanos)?,
        deletion_timestamp: clock.at(m.deleted, m.deleted_nanos)?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels,
        annotations,
        finalizers,
        owner_references: non_empty(owners),
        ..Default::default()
    };
    let spec = m
        .spec
        .map(|s| {
            let init = s
                .init_containers
                .into_iter()
                .map(|c| {
                    Ok(Container {
                        name: c.name,
                        restart_policy: text(dict.text(c.restart_policy, &c.restart_policy_text)?),
                        ..Default::default()
                    })
                })
                .collect::<Result<Vec<_>, ViewPodError>>()?;
            Ok::<_, ViewPodError>(PodSpec {
                node_name: text(s.node_name),
                init_containers: non_empty(init),
                containers: Vec::new(),
                ..Default::default()
            })
        })
        .transpose()?;
    let statuses = |v: Vec<ContainerStat>| -> Result<Option<Vec<ContainerStatus>>, ViewPodError> {
        let v = v
            .into_iter()
            .map(|c| {
                let terminated = match c.terminated {
                    true => Some(ContainerStateTerminated {
                        exit_code: c.exit_code,
                        finished_at: clock.at(c.finished, c.finished_nanos)?,
                        ..Default::default()
                    }),
                    false => None,
                };
                Ok(ContainerStatus {
                    name: c.name,
                    restart_count: c.restart_count,
                    state: (c.has_state || terminated.is_some())
                        .then(|| ContainerState { terminated, ..Default::default() }),
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, ViewPodError>>()?;
        Ok(non_empty(v))
    };
    let status = m
        .status
        .map(|s| {
            let conditions = s
                .conditions
                .into_iter()
                .map(|c| {
                    Ok(PodCondition {
                        type_: dict.text(c.type_, &c.type_text)?,
                        status: dict.text(c.status, &c.status_text)?,
                        last_transition_time: clock.at(c.changed, c.changed_nanos)?,
                        ..Default::default()
                    })
                })
                .collect::<Result<Vec<_>, ViewPodError>>()?;
            Ok::<_, ViewPodError>(PodStatus {
                phase: text(dict.text(s.phase, &s.phase_text)?),
                conditions: non_empty(conditions),
                container_statuses: statuses(s.containers)?,
                init_container_statuses: statuses(s.init_containers)?,
                ..Default::default()
            })
        })
        .transpose()?;
    Ok(Pod { metadata, spec, status })
}
