//! The API server's protobuf encoding of pods, decoded straight into [`WatchedPod`]s.
//!
//! kube-controller-manager's informers ask for `application/vnd.kubernetes.protobuf`; so does
//! the watcher for its pod list and watch (the stream most of its CPU goes to). Wire format
//! (k8s.io/apimachinery `runtime/serializer/protobuf` and `pkg/watch/versioned`):
//! * an object (a list answer, a failure's `Status`, a watch event's object) is the 4-byte
//!   magic `k8s\0` then a `runtime.Unknown` whose `raw` holds the object's own message;
//! * a watch answer (`;stream=watch`) is a series of frames, each a 4-byte big-endian length
//!   then a `meta.v1.WatchEvent` (no magic), whose `object.raw` is such an encoded object.
//!
//! The pod messages below declare only the fields the watcher keeps (the handlers' metadata and
//! what syncJob reads, as [`WatchedPod`] has them), with the field numbers of k8s.io/api's
//! `generated.proto` (the same as `k8s_pb::api::core::v1`). prost skips every field a message
//! does not declare, so container specs, volumes, managedFields, images and IPs cost a skip,
//! not an allocation; decoding `k8s_pb`'s whole `Pod` would allocate all of them. The leaf
//! messages whose every field is kept come from `k8s_pb` ([`k8s_pb`]'s `OwnerReference`,
//! `Time`, `ListMeta`, `Status`, `WatchEvent`); the envelope keeps its bytes as `Bytes`, so the
//! object is sliced out of the frame rather than copied.

use std::collections::BTreeMap;

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use prost::Message;

use crate::view::{
    WatchedCondition, WatchedContainer, WatchedContainerState, WatchedContainerStatus, WatchedPod,
    WatchedPodSpec, WatchedPodStatus, WatchedTerminated,
};

/// Media type of the API server's protobuf encoding.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What a list asks for: protobuf, or JSON from a server without it.
pub const ACCEPT_LIST: &str = "application/vnd.kubernetes.protobuf, application/json";
/// What a watch asks for: protobuf frames, or JSON lines from a server without them.
pub const ACCEPT_WATCH: &str =
    "application/vnd.kubernetes.protobuf;stream=watch, application/json;stream=watch";
/// The prefix of every protobuf-encoded object.
const MAGIC: &[u8; 4] = b"k8s\0";
/// The largest watch frame read: a pod is at most the API server's 3 MiB request limit
/// (etcd's 1.5 MiB object limit, encoded), so a larger length is a broken stream.
pub const MAX_FRAME: usize = 16 << 20;

/// Errors decoding the protobuf encoding.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The body does not start with `k8s\0`.
    #[error("protobuf body without the k8s magic prefix")]
    NoMagic,
    /// A message does not parse.
    #[error("protobuf {what}: {source}")]
    Decode {
        /// Which message.
        what: &'static str,
        /// prost's error.
        source: prost::DecodeError,
    },
    /// A frame longer than [`MAX_FRAME`].
    #[error("watch frame of {0} bytes, above the {MAX_FRAME}-byte bound")]
    FrameTooLarge(usize),
}

fn decode_err(what: &'static str) -> impl FnOnce(prost::DecodeError) -> ProtoError {
    move |source| ProtoError::Decode { what, source }
}

/// `runtime.Unknown`, its `raw` only, kept as a slice of the buffer it came in.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(bytes = "bytes", optional, tag = "2")]
    raw: Option<Bytes>,
}

/// `runtime.RawExtension`, kept as a slice.
#[derive(Clone, PartialEq, Message)]
struct RawExtension {
    #[prost(bytes = "bytes", optional, tag = "1")]
    raw: Option<Bytes>,
}

/// `meta.v1.WatchEvent` (as `k8s_pb`'s, its object kept as a slice).
#[derive(Clone, PartialEq, Message)]
struct WatchEvent {
    #[prost(string, optional, tag = "1")]
    r#type: Option<String>,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

/// `core.v1.Pod`: metadata, spec, status.
#[derive(Clone, PartialEq, Message)]
struct Pod {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PodSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<PodStatus>,
}

/// `core.v1.PodList`.
#[derive(Clone, PartialEq, Message)]
struct PodList {
    #[prost(message, optional, tag = "1")]
    metadata: Option<pb_meta::ListMeta>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<Pod>,
}

/// `meta.v1.ObjectMeta` without managedFields (17) and the fields nobody reads.
#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    creation_timestamp: Option<pb_meta::Time>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<pb_meta::Time>,
    #[prost(int64, optional, tag = "10")]
    deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    owner_references: Vec<pb_meta::OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

/// `core.v1.PodSpec`: nodeName and the init containers.
#[derive(Clone, PartialEq, Message)]
struct PodSpec {
    #[prost(string, optional, tag = "10")]
    node_name: Option<String>,
    #[prost(message, repeated, tag = "20")]
    init_containers: Vec<Container>,
}

/// `core.v1.Container`: name and restartPolicy.
#[derive(Clone, PartialEq, Message)]
struct Container {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "24")]
    restart_policy: Option<String>,
}

/// `core.v1.PodStatus`: phase, conditions, container statuses.
#[derive(Clone, PartialEq, Message)]
struct PodStatus {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
    #[prost(message, repeated, tag = "2")]
    conditions: Vec<PodCondition>,
    #[prost(message, repeated, tag = "8")]
    container_statuses: Vec<ContainerStatus>,
    #[prost(message, repeated, tag = "10")]
    init_container_statuses: Vec<ContainerStatus>,
}

/// `core.v1.PodCondition`: type, status, lastTransitionTime.
#[derive(Clone, PartialEq, Message)]
struct PodCondition {
    #[prost(string, optional, tag = "1")]
    r#type: Option<String>,
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(message, optional, tag = "4")]
    last_transition_time: Option<pb_meta::Time>,
}

/// `core.v1.ContainerStatus`: name, state, restartCount.
#[derive(Clone, PartialEq, Message)]
struct ContainerStatus {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(message, optional, tag = "2")]
    state: Option<ContainerState>,
    #[prost(int32, optional, tag = "5")]
    restart_count: Option<i32>,
}

/// `core.v1.ContainerState`: terminated.
#[derive(Clone, PartialEq, Message)]
struct ContainerState {
    #[prost(message, optional, tag = "3")]
    terminated: Option<ContainerStateTerminated>,
}

/// `core.v1.ContainerStateTerminated`: exitCode, finishedAt.
#[derive(Clone, PartialEq, Message)]
struct ContainerStateTerminated {
    #[prost(int32, optional, tag = "1")]
    exit_code: Option<i32>,
    #[prost(message, optional, tag = "6")]
    finished_at: Option<pb_meta::Time>,
}

/// A `meta.v1.Time` as its JSON encoding has it: whole seconds (apimachinery drops the
/// nanoseconds when decoding protobuf too), and none for the zero time (an empty message).
fn time(t: Option<pb_meta::Time>) -> Option<meta::Time> {
    let seconds = t?.seconds?;
    jiff::Timestamp::from_second(seconds).ok().map(meta::Time)
}

/// A string JSON leaves out when empty (`omitempty`): Go's protobuf encoding writes every
/// string field, empty ones too.
fn text(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// A list or map that JSON leaves out when empty (`omitempty`).
fn non_empty<T: IsEmpty>(v: T) -> Option<T> {
    (!v.is_empty()).then_some(v)
}

trait IsEmpty {
    fn is_empty(&self) -> bool;
}

impl<T> IsEmpty for Vec<T> {
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

impl<K, V> IsEmpty for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl From<ObjectMeta> for meta::ObjectMeta {
    fn from(m: ObjectMeta) -> Self {
        let owner_references = m
            .owner_references
            .into_iter()
            .map(|o| meta::OwnerReference {
                api_version: o.api_version.unwrap_or_default(),
                block_owner_deletion: o.block_owner_deletion,
                controller: o.controller,
                kind: o.kind.unwrap_or_default(),
                name: o.name.unwrap_or_default(),
                uid: o.uid.unwrap_or_default(),
            })
            .collect();
        meta::ObjectMeta {
            annotations: non_empty(m.annotations),
            creation_timestamp: time(m.creation_timestamp),
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: time(m.deletion_timestamp),
            finalizers: non_empty(m.finalizers),
            generate_name: text(m.generate_name),
            generation: m.generation.filter(|g| *g != 0),
            labels: non_empty(m.labels),
            managed_fields: None,
            name: text(m.name),
            namespace: text(m.namespace),
            owner_references: non_empty(owner_references),
            resource_version: text(m.resource_version),
            self_link: None,
            uid: text(m.uid),
        }
    }
}

fn container_statuses(v: Vec<ContainerStatus>) -> Option<Vec<WatchedContainerStatus>> {
    let v: Vec<_> = v
        .into_iter()
        .map(|c| WatchedContainerStatus {
            name: c.name.unwrap_or_default(),
            restart_count: c.restart_count.unwrap_or_default(),
            state: c.state.map(|s| WatchedContainerState {
                terminated: s.terminated.map(|t| WatchedTerminated {
                    exit_code: t.exit_code.unwrap_or_default(),
                    finished_at: time(t.finished_at),
                }),
            }),
        })
        .collect();
    non_empty(v)
}

impl From<Pod> for WatchedPod {
    fn from(p: Pod) -> Self {
        WatchedPod {
            metadata: p.metadata.map(Into::into).unwrap_or_default(),
            spec: p.spec.map(|s| WatchedPodSpec {
                node_name: text(s.node_name),
                init_containers: non_empty(
                    s.init_containers
                        .into_iter()
                        .map(|c| WatchedContainer {
                            name: c.name.unwrap_or_default(),
                            restart_policy: text(c.restart_policy),
                        })
                        .collect(),
                ),
                containers: Vec::new(),
            }),
            status: p.status.map(|s| WatchedPodStatus {
                phase: text(s.phase),
                conditions: non_empty(
                    s.conditions
                        .into_iter()
                        .map(|c| WatchedCondition {
                            type_: c.r#type.unwrap_or_default(),
                            status: c.status.unwrap_or_default(),
                            last_transition_time: time(c.last_transition_time),
                        })
                        .collect(),
                ),
                container_statuses: container_statuses(s.container_statuses),
                init_container_statuses: container_statuses(s.init_container_statuses),
            }),
        }
    }
}

/// Whether a response's `Content-Type` is the protobuf encoding (an object or a watch stream).
pub fn is_protobuf(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|t| t.split(';').next().is_some_and(|t| t.trim() == PROTOBUF))
}

/// The object's message out of an encoded object (magic, envelope), as a slice of `body`.
fn unwrap_object(body: Bytes) -> Result<Bytes, ProtoError> {
    if !body.starts_with(MAGIC) {
        return Err(ProtoError::NoMagic);
    }
    let unknown = Unknown::decode(body.slice(MAGIC.len()..)).map_err(decode_err("envelope"))?;
    Ok(unknown.raw.unwrap_or_default())
}

/// A decoded pod list: its items and where the watch resumes (or the next page starts).
#[derive(Debug, Default)]
pub struct PodPage {
    /// The pods.
    pub items: Vec<WatchedPod>,
    /// `metadata.resourceVersion` of the list.
    pub resource_version: String,
    /// `metadata.continue`: the next page's token, empty on the last page.
    pub continue_token: String,
}

/// Decodes a protobuf pod list answer.
pub fn decode_pod_list(body: Bytes) -> Result<PodPage, ProtoError> {
    let list = PodList::decode(unwrap_object(body)?).map_err(decode_err("PodList"))?;
    let meta = list.metadata.unwrap_or_default();
    Ok(PodPage {
        items: list.items.into_iter().map(Into::into).collect(),
        resource_version: meta.resource_version.unwrap_or_default(),
        continue_token: meta.r#continue.unwrap_or_default(),
    })
}

/// Decodes a protobuf pod (an encoded object).
pub fn decode_pod(body: Bytes) -> Result<WatchedPod, ProtoError> {
    Ok(Pod::decode(unwrap_object(body)?).map_err(decode_err("Pod"))?.into())
}

/// A failure's `meta.v1.Status`: its code, reason and message.
pub fn decode_status(body: Bytes) -> Result<pb_meta::Status, ProtoError> {
    pb_meta::Status::decode(unwrap_object(body)?).map_err(decode_err("Status"))
}

/// One watch event: its type and its encoded object.
pub fn decode_watch_event(frame: Bytes) -> Result<(String, Bytes), ProtoError> {
    let ev = WatchEvent::decode(frame).map_err(decode_err("WatchEvent"))?;
    Ok((ev.r#type.unwrap_or_default(), ev.object.and_then(|o| o.raw).unwrap_or_default()))
}

/// Takes the next whole frame (length prefix removed) off the front of `buf`, if it holds one.
pub fn next_frame(buf: &mut bytes::BytesMut) -> Result<Option<Bytes>, ProtoError> {
    let Some(head) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::FrameTooLarge(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len);
    Ok(Some(frame.split_off(4).freeze()))
}

/// Encoding helpers for tests: objects and watch frames as kube-apiserver writes them.
pub mod encode {
    use super::*;

    /// An encoded object: magic, then an `Unknown` holding `raw` with its type meta.
    pub fn object(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC.as_slice(), &unknown.encode_to_vec()].concat()
    }

    /// One watch frame: length, then a `WatchEvent` of `type` holding `object` (encoded).
    pub fn frame(r#type: &str, object: Vec<u8>) -> Vec<u8> {
        let ev = pb_meta::WatchEvent {
            r#type: Some(r#type.into()),
            object: Some(k8s_pb::apimachinery::pkg::runtime::RawExtension { raw: Some(object) }),
        };
        let body = ev.encode_to_vec();
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        [len.to_be_bytes().as_slice(), &body].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::api::core::v1 as pb;

    /// A whole `k8s_pb` Pod, as kube-apiserver encodes it: spec and status fields the watcher
    /// does not declare included.
    fn full_pod() -> pb::Pod {
        let t = |s: i64| Some(pb_meta::Time { seconds: Some(s), nanos: Some(500) });
        let cs = |name: &str, code: i32| pb::ContainerStatus {
            name: Some(name.into()),
            image: Some("busybox".into()),
            ready: Some(false),
            restart_count: Some(2),
            state: Some(pb::ContainerState {
                terminated: Some(pb::ContainerStateTerminated {
                    exit_code: Some(code),
                    reason: Some("Error".into()),
                    started_at: t(10),
                    finished_at: t(20),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        pb::Pod {
            metadata: Some(pb_meta::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                resource_version: Some("42".into()),
                // Go writes every string, empty ones too; JSON leaves those out.
                generate_name: Some(String::new()),
                creation_timestamp: t(5),
                labels: [("job-name".to_string(), "j".to_string())].into(),
                annotations: [
                    ("batch.kubernetes.io/job-completion-index".to_string(), "3".to_string()),
                    ("note".to_string(), "x".to_string()),
                ]
                .into(),
                owner_references: vec![pb_meta::OwnerReference {
                    api_version: Some("batch/v1".into()),
                    kind: Some("Job".into()),
                    name: Some("j".into()),
                    uid: Some("ju".into()),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }],
                finalizers: vec![kjob_core::JOB_TRACKING_FINALIZER.into()],
                managed_fields: vec![pb_meta::ManagedFieldsEntry {
                    manager: Some("kubelet".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            spec: Some(pb::PodSpec {
                node_name: Some("n1".into()),
                containers: vec![pb::Container {
                    name: Some("main".into()),
                    image: Some("busybox".into()),
                    command: vec!["sleep".into(), "1".into()],
                    ..Default::default()
                }],
                init_containers: vec![pb::Container {
                    name: Some("side".into()),
                    restart_policy: Some("Always".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(pb::PodStatus {
                phase: Some("Failed".into()),
                pod_ip: Some("10.0.0.1".into()),
                conditions: vec![pb::PodCondition {
                    r#type: Some("Ready".into()),
                    status: Some("False".into()),
                    last_transition_time: t(21),
                    // The zero time: an empty message.
                    last_probe_time: Some(pb_meta::Time::default()),
                    message: Some("m".into()),
                    ..Default::default()
                }],
                container_statuses: vec![cs("main", 42)],
                init_container_statuses: vec![cs("side", 0)],
                ..Default::default()
            }),
        }
    }

    /// The same pod as kube-apiserver's JSON has it.
    fn full_pod_json() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
                "creationTimestamp": "1970-01-01T00:00:05Z", "labels": {"job-name": "j"},
                "annotations": {"batch.kubernetes.io/job-completion-index": "3", "note": "x"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                    "uid": "ju", "controller": true, "blockOwnerDeletion": true}],
                "finalizers": [kjob_core::JOB_TRACKING_FINALIZER],
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1",
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"]}],
                "initContainers": [{"name": "side", "restartPolicy": "Always"}]},
            "status": {"phase": "Failed", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "False", "lastProbeTime": null,
                    "lastTransitionTime": "1970-01-01T00:00:21Z", "message": "m"}],
                "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "",
                    "ready": false, "restartCount": 2, "state": {"terminated": {"exitCode": 42,
                    "reason": "Error", "startedAt": "1970-01-01T00:00:10Z",
                    "finishedAt": "1970-01-01T00:00:20Z"}}}],
                "initContainerStatuses": [{"name": "side", "image": "busybox", "imageID": "",
                    "ready": false, "restartCount": 2, "state": {"terminated": {"exitCode": 0,
                    "reason": "Error", "startedAt": "1970-01-01T00:00:10Z",
                    "finishedAt": "1970-01-01T00:00:20Z"}}}]}
        })
    }

    #[test]
    fn a_protobuf_pod_decodes_to_what_its_json_does() {
        let encoded = encode::object("v1", "Pod", full_pod().encode_to_vec());
        let from_pb = decode_pod(encoded.into()).expect("decodes");
        let from_json: WatchedPod = serde_json::from_value(full_pod_json()).unwrap();
        assert_eq!(from_pb, from_json);
        assert_eq!(*from_pb.view_entry(), *from_json.view_entry());
        assert_eq!(from_pb.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(from_pb.metadata.managed_fields, None);
    }

    #[test]
    fn a_list_gives_its_items_version_and_continue_token() {
        let list = pb::PodList {
            metadata: Some(pb_meta::ListMeta {
                resource_version: Some("77".into()),
                r#continue: Some("next".into()),
                ..Default::default()
            }),
            items: vec![full_pod(), full_pod()],
        };
        let page = decode_pod_list(encode::object("v1", "PodList", list.encode_to_vec()).into())
            .expect("decodes");
        assert_eq!(page.items.len(), 2);
        assert_eq!((page.resource_version.as_str(), page.continue_token.as_str()), ("77", "next"));
        assert!(matches!(decode_pod_list(Bytes::from_static(b"{}")), Err(ProtoError::NoMagic)));
    }

    #[test]
    fn frames_come_off_the_buffer_whole() {
        let pod = encode::object("v1", "Pod", full_pod().encode_to_vec());
        let stream = [encode::frame("ADDED", pod.clone()), encode::frame("DELETED", pod)].concat();
        let mut buf = bytes::BytesMut::new();
        let mut got = Vec::new();
        // Arriving in pieces of 7 bytes, as a network delivers them.
        for chunk in stream.chunks(7) {
            buf.extend_from_slice(chunk);
            while let Some(frame) = next_frame(&mut buf).expect("a frame") {
                let (ty, object) = decode_watch_event(frame).expect("an event");
                got.push((ty, decode_pod(object).expect("a pod").metadata.name));
            }
        }
        assert!(buf.is_empty());
        assert_eq!(
            got,
            [("ADDED".into(), Some("p".to_string())), ("DELETED".into(), Some("p".to_string()))]
        );
        let mut huge = bytes::BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(matches!(next_frame(&mut huge), Err(ProtoError::FrameTooLarge(_))));
    }

    #[test]
    fn a_status_decodes_its_code() {
        let status = pb_meta::Status {
            code: Some(410),
            reason: Some("Expired".into()),
            message: Some("too old resource version".into()),
            ..Default::default()
        };
        let got = decode_status(encode::object("v1", "Status", status.encode_to_vec()).into())
            .expect("decodes");
        assert_eq!((got.code, got.reason.as_deref()), (Some(410), Some("Expired")));
    }
}
