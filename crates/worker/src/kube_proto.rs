//! The few parts of the API server's protobuf answers the worker reads.
//!
//! A pod create, delete or finalizer patch answers with the whole pod, an event create or
//! count patch with the whole event, a Job status write with the whole Job. Encoded as JSON that
//! costs kube-apiserver a JSON encoding per write and the worker a JSON decoding of an object it
//! reads one or two fields of; upstream's controller asks for protobuf. These writes ask for
//! protobuf too (`Accept: application/vnd.kubernetes.protobuf, application/json`) and decode
//! only what they use: the pod's name and UID, the event's name, resourceVersion and count, the
//! Job's new resourceVersion, or a failure's `Status`. prost skips every field
//! a message here does not declare, so the rest of the pod costs a skip, not a decoding.
//!
//! Wire format (k8s.io/apimachinery `runtime/serializer/protobuf`): the 4-byte magic `k8s\0`,
//! then a `runtime.Unknown` whose `raw` holds the object's own message. Field numbers are those
//! of `generated.proto` in k8s.io/apimachinery and k8s.io/api.

use prost::Message;

/// Media type of the API server's protobuf encoding.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What the worker's writes accept: protobuf first, JSON from a server without it.
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
/// The prefix of every protobuf-encoded object.
const MAGIC: &[u8; 4] = b"k8s\0";

/// `runtime.Unknown`: the envelope of every protobuf object.
#[derive(Clone, PartialEq, Message)]
pub struct Unknown {
    /// The object, encoded as its own message.
    #[prost(bytes = "vec", tag = "2")]
    pub raw: Vec<u8>,
}

/// `meta.v1.ObjectMeta`, the fields the worker reads.
#[derive(Clone, PartialEq, Message)]
pub struct ObjectMeta {
    /// `name`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `namespace`.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// `uid`.
    #[prost(string, tag = "5")]
    pub uid: String,
    /// `resourceVersion`.
    #[prost(string, tag = "6")]
    pub resource_version: String,
}

/// Any object (a `core.v1.Pod`, a `batch.v1.Job`), its metadata only: `metadata` is field 1 of
/// every Kubernetes object, so spec and status are skipped.
#[derive(Clone, PartialEq, Message)]
pub struct MetaOnly {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
}

/// `core.v1.Event`, what a write of it tells the event recorder: name, resourceVersion, count.
#[derive(Clone, PartialEq, Message)]
pub struct EventMeta {
    /// `metadata`.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    /// `count` (absent on events that never counted).
    #[prost(int32, optional, tag = "8")]
    pub count: Option<i32>,
}

/// `meta.v1.StatusDetails`, the field the worker reads.
#[derive(Clone, PartialEq, Message)]
pub struct StatusDetails {
    /// `retryAfterSeconds`.
    #[prost(int32, tag = "5")]
    pub retry_after_seconds: i32,
}

/// `meta.v1.Status`: the body of a failed call.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    /// `status` (`Failure`).
    #[prost(string, tag = "2")]
    pub status: String,
    /// `message`.
    #[prost(string, tag = "3")]
    pub message: String,
    /// `reason`.
    #[prost(string, tag = "4")]
    pub reason: String,
    /// `details`.
    #[prost(message, optional, tag = "5")]
    pub details: Option<StatusDetails>,
    /// `code`.
    #[prost(int32, tag = "6")]
    pub code: i32,
}

/// Whether a response's `Content-Type` is the protobuf encoding.
pub fn is_protobuf(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|t| t.split(';').next().is_some_and(|t| t.trim() == PROTOBUF))
}

/// Decodes a protobuf-encoded object of type `M` (magic, envelope, object).
pub fn decode<M: Message + Default>(body: &[u8]) -> Result<M, String> {
    let rest = body
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| "protobuf body without the k8s magic prefix".to_string())?;
    let unknown = Unknown::decode(rest).map_err(|e| format!("protobuf envelope: {e}"))?;
    M::decode(unknown.raw.as_slice()).map_err(|e| format!("protobuf object: {e}"))
}

/// The kube `Status` of a failed call, from its protobuf `Status`; the HTTP status stands in
/// for a missing code.
pub fn kube_status(s: Status, http_code: u16) -> kube::core::Status {
    let code = u16::try_from(s.code).ok().filter(|c| *c != 0).unwrap_or(http_code);
    let retry = s.details.map_or(0, |d| d.retry_after_seconds.max(0));
    let value = serde_json::json!({
        "status": if s.status.is_empty() { "Failure" } else { s.status.as_str() },
        "code": code,
        "message": s.message,
        "reason": s.reason,
        "details": {"retryAfterSeconds": retry},
    });
    serde_json::from_value(value).unwrap_or_else(|_| {
        kube::core::Status::failure("undecodable protobuf Status", "").with_code(code)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kube-apiserver sends: magic, then an Unknown holding the object.
    fn encoded<M: Message>(m: &M) -> Vec<u8> {
        #[derive(Clone, PartialEq, Message)]
        struct Envelope {
            #[prost(bytes = "vec", tag = "2")]
            raw: Vec<u8>,
            #[prost(string, tag = "4")]
            content_type: String,
        }
        let env = Envelope { raw: m.encode_to_vec(), content_type: String::new() };
        [MAGIC.as_slice(), &env.encode_to_vec()].concat()
    }

    /// An object with spec and status (fields 2 and 3), which the worker does not declare.
    #[derive(Clone, PartialEq, Message)]
    struct FullObject {
        #[prost(message, optional, tag = "1")]
        metadata: Option<ObjectMeta>,
        #[prost(bytes = "vec", tag = "2")]
        spec: Vec<u8>,
        #[prost(bytes = "vec", tag = "3")]
        status: Vec<u8>,
    }

    #[test]
    fn a_pod_decodes_to_its_name_and_uid_skipping_the_rest() {
        let meta = ObjectMeta {
            name: "job-0-x7k2p".into(),
            namespace: "ns".into(),
            uid: "5c3f".into(),
            resource_version: "42".into(),
        };
        let pod =
            FullObject { metadata: Some(meta.clone()), spec: vec![7; 300], status: vec![1; 9] };
        let got: MetaOnly = decode(&encoded(&pod)).expect("decodes");
        assert_eq!(got.metadata, Some(meta));
        // No magic: not an object of the protobuf encoding.
        assert!(decode::<MetaOnly>(&pod.encode_to_vec()).is_err());
        assert!(decode::<MetaOnly>(b"k8s\0\xff\xff").is_err());
    }

    #[test]
    fn a_job_decodes_to_its_metadata_skipping_spec_and_status() {
        let meta = ObjectMeta {
            name: "pi".into(),
            namespace: "ns".into(),
            uid: "u1".into(),
            resource_version: "1207".into(),
        };
        let job =
            FullObject { metadata: Some(meta.clone()), spec: vec![3; 900], status: vec![5; 40] };
        let got: MetaOnly = decode(&encoded(&job)).expect("decodes");
        assert_eq!(got.metadata, Some(meta));
    }

    #[test]
    fn an_event_decodes_to_name_version_and_count() {
        #[derive(Clone, PartialEq, Message)]
        struct FullEvent {
            #[prost(message, optional, tag = "1")]
            metadata: Option<ObjectMeta>,
            #[prost(string, tag = "4")]
            message: String,
            #[prost(int32, optional, tag = "8")]
            count: Option<i32>,
        }
        let meta =
            ObjectMeta { name: "pi.17".into(), resource_version: "9".into(), ..Default::default() };
        let ev = FullEvent {
            metadata: Some(meta.clone()),
            message: "Created pod".into(),
            count: Some(3),
        };
        let got: EventMeta = decode(&encoded(&ev)).expect("decodes");
        assert_eq!((got.metadata, got.count), (Some(meta), Some(3)));
        let uncounted = FullEvent { count: None, ..ev };
        assert_eq!(decode::<EventMeta>(&encoded(&uncounted)).expect("decodes").count, None);
    }

    #[test]
    fn a_failure_keeps_code_reason_message_and_retry_hint() {
        let st = Status {
            status: "Failure".into(),
            message: "pods \"p\" is forbidden: exceeded quota: q, requested: pods=1".into(),
            reason: "Forbidden".into(),
            details: Some(StatusDetails { retry_after_seconds: 3 }),
            code: 403,
        };
        let got = kube_status(decode(&encoded(&st)).expect("decodes"), 500);
        assert_eq!(got.code, 403);
        assert_eq!(got.reason, "Forbidden");
        assert_eq!(got.message, st.message);
        assert_eq!(got.details.map(|d| d.retry_after_seconds), Some(3));
        // A Status without a code takes the HTTP status.
        let bare = Status { message: "m".into(), ..Status::default() };
        assert_eq!(kube_status(bare, 429).code, 429);
    }

    #[test]
    fn content_types() {
        assert!(is_protobuf(Some("application/vnd.kubernetes.protobuf")));
        assert!(is_protobuf(Some("application/vnd.kubernetes.protobuf; charset=utf-8")));
        assert!(!is_protobuf(Some("application/json")));
        assert!(is_protobuf(Some("application/vnd.kubernetes.protobuf;stream=watch")));
        assert!(!is_protobuf(None));
    }
}
