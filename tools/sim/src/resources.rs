//! The resources the simulator serves, and how their objects are normalised to the shape the Go
//! server would serialise (unknown fields dropped, empty values absent, times truncated).

use serde_json::{Map, Value};

/// The stores behind the resources; core/v1 and events.k8s.io/v1 events share one store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreKind {
    /// core/v1 namespaces (cluster-scoped).
    Namespace,
    /// core/v1 pods.
    Pod,
    /// batch/v1 jobs.
    Job,
    /// core/v1 events (also served as events.k8s.io/v1).
    Event,
    /// coordination.k8s.io/v1 leases.
    Lease,
    /// scheduling.k8s.io/v1 priorityclasses (cluster-scoped).
    PriorityClass,
}

impl StoreKind {
    /// Every store, in a fixed order.
    pub const ALL: [StoreKind; 6] = [
        StoreKind::Namespace,
        StoreKind::Pod,
        StoreKind::Job,
        StoreKind::Event,
        StoreKind::Lease,
        StoreKind::PriorityClass,
    ];

    /// Index into per-kind arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether objects of this store live in namespaces.
    pub fn namespaced(self) -> bool {
        !matches!(self, StoreKind::Namespace | StoreKind::PriorityClass)
    }

    /// The canonical resource (the one whose shape the store holds).
    pub fn resource(self) -> &'static Resource {
        match self {
            StoreKind::Namespace => &RESOURCES[0],
            StoreKind::Pod => &RESOURCES[1],
            StoreKind::Job => &RESOURCES[2],
            StoreKind::Event => &RESOURCES[3],
            StoreKind::Lease => &RESOURCES[5],
            StoreKind::PriorityClass => &RESOURCES[6],
        }
    }
}

/// One served resource (group/version/plural) and its discovery facts.
#[derive(Debug)]
pub struct Resource {
    /// API group ("" for core).
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Plural resource name used in paths.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind of the objects.
    pub kind: &'static str,
    /// Short names for kubectl.
    pub short_names: &'static [&'static str],
    /// Subresources served (`status`, `binding`, `finalize`, `eviction`).
    pub subresources: &'static [&'static str],
    /// The store holding the objects.
    pub store: StoreKind,
    /// Whether objects are converted to the events.k8s.io/v1 shape on the way out.
    pub events_v1: bool,
}

/// The verb kube-apiserver names a request by (in RBAC, audit and metrics): from its method,
/// whether its path names one object, and whether it is a watch; `None` for other methods.
pub fn request_verb(method: &str, named: bool, watch: bool) -> Option<&'static str> {
    Some(match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

/// Verbs every resource supports.
pub const VERBS: [&str; 8] =
    ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// Events, served from one store under two groups: core v1 and events.k8s.io/v1 (converted to
/// that group's shape on the way out when `events_v1`).
const fn events_in(group: &'static str, events_v1: bool) -> Resource {
    Resource {
        group,
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        subresources: &[],
        store: StoreKind::Event,
        events_v1,
    }
}

/// Every served resource.
pub static RESOURCES: [Resource; 7] = [
    Resource {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        short_names: &["ns"],
        subresources: &["status", "finalize"],
        store: StoreKind::Namespace,
        events_v1: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short_names: &["po"],
        subresources: &["status", "binding", "eviction"],
        store: StoreKind::Pod,
        events_v1: false,
    },
    Resource {
        group: "batch",
        version: "v1",
        plural: "jobs",
        singular: "job",
        kind: "Job",
        short_names: &[],
        subresources: &["status"],
        store: StoreKind::Job,
        events_v1: false,
    },
    events_in("", false),
    events_in("events.k8s.io", true),
    Resource {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        short_names: &[],
        subresources: &[],
        store: StoreKind::Lease,
        events_v1: false,
    },
    Resource {
        group: "scheduling.k8s.io",
        version: "v1",
        plural: "priorityclasses",
        singular: "priorityclass",
        kind: "PriorityClass",
        short_names: &["pc"],
        subresources: &[],
        store: StoreKind::PriorityClass,
        events_v1: false,
    },
];

impl Resource {
    /// `apiVersion` of the objects (`v1`, `batch/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether objects live in namespaces.
    pub fn namespaced(&self) -> bool {
        self.store.namespaced()
    }

    /// `jobs.batch`, `pods`: the name used in error messages.
    pub fn qualified(&self) -> String {
        self.dotted(self.plural)
    }

    /// `Job.batch`, `Pod`: the kind as used in Invalid messages.
    pub fn qualified_kind(&self) -> String {
        self.dotted(self.kind)
    }

    /// `name.group`, or `name` alone in the core group.
    fn dotted(&self, name: &str) -> String {
        if self.group.is_empty() { name.to_owned() } else { format!("{name}.{}", self.group) }
    }

    /// Finds the resource served at `group/version/plural`.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
    }
}

/// Errors normalising an object.
#[derive(Debug, thiserror::Error)]
pub enum NormalizeError {
    /// The body does not decode as the kind (wrong JSON types, missing required fields).
    #[error("{0}")]
    Decode(String),
    /// `fieldValidation=Strict` and the body has fields the kind does not know.
    #[error("strict decoding error: {}", .0.iter().map(|f| format!("unknown field \"{f}\"")).collect::<Vec<_>>().join(", "))]
    UnknownFields(Vec<String>),
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(
    v: &Value,
) -> Result<Value, NormalizeError> {
    // Deserialising from a borrowed Value avoids copying the whole object first.
    let typed = T::deserialize(v).map_err(|e| NormalizeError::Decode(e.to_string()))?;
    serde_json::to_value(&typed).map_err(|e| NormalizeError::Decode(e.to_string()))
}

/// Normalises an object of the store's (core) shape: decoded through the k8s-openapi type and
/// re-encoded, then empty values dropped as Go's `omitempty` would. With `strict`, fields the type
/// does not know are an error; otherwise they are silently dropped.
pub fn normalize(kind: StoreKind, body: &Value, strict: bool) -> Result<Value, NormalizeError> {
    use k8s_openapi::api::{batch, coordination, core, scheduling};
    let mut out = match kind {
        StoreKind::Namespace => roundtrip::<core::v1::Namespace>(body)?,
        StoreKind::Pod => roundtrip::<core::v1::Pod>(body)?,
        StoreKind::Job => roundtrip::<batch::v1::Job>(body)?,
        StoreKind::Event => roundtrip::<core::v1::Event>(body)?,
        StoreKind::Lease => roundtrip::<coordination::v1::Lease>(body)?,
        StoreKind::PriorityClass => roundtrip::<scheduling::v1::PriorityClass>(body)?,
    };
    if strict {
        let mut unknown = Vec::new();
        unknown_fields(body, &out, "", &mut unknown);
        if !unknown.is_empty() {
            return Err(NormalizeError::UnknownFields(unknown));
        }
    }
    prune(&mut out);
    drop_zero_ints(kind, &mut out);
    if kind == StoreKind::PriorityClass
        && let Some(m) = out.as_object_mut()
    {
        // The Go type never omits `value` and omits `globalDefault` when false.
        m.entry("value").or_insert(Value::from(0));
        if m.get("globalDefault") == Some(&Value::Bool(false)) {
            m.remove("globalDefault");
        }
    }
    Ok(out)
}

/// Non-pointer integer fields with `omitempty` in the Go types: a real server never returns
/// them as 0 (JobStatus' `active`, `succeeded`, `failed`; `metadata.generation`; an Event's
/// `count`). Pointer fields such as `status.ready` or `status.terminating` keep their 0.
fn drop_zero_ints(kind: StoreKind, v: &mut Value) {
    let paths: &[&[&str]] = match kind {
        StoreKind::Job => &[&["status", "active"], &["status", "succeeded"], &["status", "failed"]],
        StoreKind::Event => &[&["count"]],
        _ => &[],
    };
    for path in paths.iter().copied().chain([&["metadata", "generation"][..]]) {
        let (last, parents) = path.split_last().expect("non-empty path");
        let parent = parents.iter().try_fold(&mut *v, |cur, p| cur.get_mut(*p));
        if let Some(m) = parent.and_then(Value::as_object_mut)
            && m.get(*last).and_then(Value::as_i64) == Some(0)
        {
            m.remove(*last);
        }
    }
}

/// Normalises an events.k8s.io/v1 body and converts it to the stored core/v1 shape.
pub fn normalize_event_v1(body: &Value, strict: bool) -> Result<Value, NormalizeError> {
    let out = roundtrip::<k8s_openapi::api::events::v1::Event>(body)?;
    if strict {
        let mut unknown = Vec::new();
        unknown_fields(body, &out, "", &mut unknown);
        if !unknown.is_empty() {
            return Err(NormalizeError::UnknownFields(unknown));
        }
    }
    let mut core = event_v1_to_core(&out);
    prune(&mut core);
    Ok(core)
}

fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

// Collects keys present in `input` but absent from the re-encoded `out`: those the type does not
// know. Known keys with null/empty values also vanish from `out`, so they are not reported.
fn unknown_fields(input: &Value, out: &Value, path: &str, acc: &mut Vec<String>) {
    match (input, out) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match o.get(k) {
                    Some(ov) => unknown_fields(v, ov, &p, acc),
                    None if is_empty_value(v) => {}
                    None => acc.push(p),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter().zip(o.iter()).enumerate() {
                unknown_fields(iv, ov, &format!("{path}[{n}]"), acc);
            }
        }
        _ => {}
    }
}

/// Map-typed fields of the served kinds (string keys to scalars, not structs): their empty value
/// Go omits (`omitempty` on a map), and server-side apply owns each key on its own. Empty
/// structs such as `emptyDir: {}` or `securityContext: {}` must stay, so objects are not pruned
/// in general.
pub const MAP_FIELDS: [&str; 8] = [
    "labels",
    "annotations",
    "matchLabels",
    "nodeSelector",
    "limits",
    "requests",
    "data",
    "overhead",
];

/// Removes empty arrays everywhere and empty map-typed fields, as Go's `omitempty` does.
pub fn prune(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, val| match val {
                Value::Null => false,
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) if o.is_empty() => !MAP_FIELDS.contains(&k.as_str()),
                _ => true,
            });
            for val in m.values_mut() {
                prune(val);
            }
            m.retain(|k, val| {
                !(matches!(val, Value::Object(o) if o.is_empty())
                    && MAP_FIELDS.contains(&k.as_str()))
            });
        }
        Value::Array(a) => a.iter_mut().for_each(prune),
        _ => {}
    }
}

// core/v1 field name ↔ events.k8s.io/v1 field name.
const EVENT_RENAMES: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

fn rename(obj: &Value, api_version: &str, forward: bool) -> Value {
    let Some(m) = obj.as_object() else { return obj.clone() };
    let mut out = Map::new();
    for (k, v) in m {
        let key = EVENT_RENAMES
            .iter()
            .find_map(|(core, new)| {
                if forward && k == core {
                    Some(*new)
                } else if !forward && k == new {
                    Some(*core)
                } else {
                    None
                }
            })
            .unwrap_or(k.as_str());
        out.insert(key.to_owned(), v.clone());
    }
    out.insert("apiVersion".into(), Value::String(api_version.to_owned()));
    out.insert("kind".into(), Value::String("Event".into()));
    Value::Object(out)
}

/// Converts a stored core/v1 Event to its events.k8s.io/v1 view.
pub fn event_core_to_v1(obj: &Value) -> Value {
    rename(obj, "events.k8s.io/v1", true)
}

/// Converts an events.k8s.io/v1 Event to the stored core/v1 shape.
pub fn event_v1_to_core(obj: &Value) -> Value {
    let mut core = rename(obj, "v1", false);
    // core/v1 requires involvedObject; an events.k8s.io event without `regarding` still stores.
    if let Some(m) = core.as_object_mut() {
        m.entry("involvedObject").or_insert_with(|| Value::Object(Map::new()));
    }
    core
}

/// Converts a stored object to the view of `res` (only events differ).
pub fn to_view(res: &Resource, obj: &Value) -> Value {
    if res.events_v1 { event_core_to_v1(obj) } else { obj.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn normalize_drops_unknown_and_empty_fields() {
        let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {}, "finalizers": [], "bogus": 1},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": [{"name": "v", "emptyDir": {}}]}});
        let out = normalize(StoreKind::Pod, &body, false).unwrap();
        assert_eq!(out["metadata"], json!({"name": "p"}));
        assert_eq!(out["spec"]["volumes"][0]["emptyDir"], json!({}));
        let err = normalize(StoreKind::Pod, &body, true).unwrap_err();
        assert_eq!(err.to_string(), "strict decoding error: unknown field \"metadata.bogus\"");
    }

    #[test]
    fn normalize_truncates_times() {
        let body = json!({"metadata": {"name": "l", "creationTimestamp": "2025-01-01T00:00:00.123Z"},
            "spec": {"renewTime": "2025-01-01T00:00:00.1Z"}});
        let out = normalize(StoreKind::Lease, &body, false).unwrap();
        assert_eq!(out["metadata"]["creationTimestamp"], "2025-01-01T00:00:00Z");
        assert_eq!(out["spec"]["renewTime"], "2025-01-01T00:00:00.100000Z");
    }

    #[test]
    fn wrong_types_are_decode_errors() {
        let body = json!({"metadata": {"name": 5}});
        assert!(matches!(normalize(StoreKind::Job, &body, false), Err(NormalizeError::Decode(_))));
    }

    #[test]
    fn event_views_round_trip() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "eventTime": "2025-01-01T00:00:00.000001Z", "note": "hi", "regarding": {"name": "p"},
            "reportingController": "x.io/c", "reason": "R", "type": "Normal", "action": "A", "reportingInstance": "i"});
        let core = normalize_event_v1(&v1, true).unwrap();
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["reportingComponent"], "x.io/c");
        let back = event_core_to_v1(&core);
        assert_eq!(back["note"], "hi");
        assert_eq!(back["regarding"]["name"], "p");
        assert!(back.get("message").is_none());
    }
}
