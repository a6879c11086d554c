//! The server-side-apply schema of the kinds kjob-sim serves: how each list is keyed
//! (`+listType`/`+listMapKey` of the Go types, which can differ from the strategic-merge tags:
//! container ports are keyed by port and protocol, Job conditions are atomic), which structs are
//! atomic (`+structType=atomic`) and which objects are maps (labels) rather than structs.

use crate::resources::{MAP_FIELDS, StoreKind};

/// How a list merges and is owned under server-side apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Owned and replaced as a whole.
    Atomic,
    /// A set of scalars, each owned on its own (`v:`).
    Set,
    /// Elements keyed by these fields (`k:`), each owned on its own.
    Map(&'static [&'static str]),
}

/// What the object at a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjType {
    /// Named fields, each owned on its own.
    Struct,
    /// String keys to scalars (labels, annotations, resource lists), each key owned on its own.
    Map,
    /// Owned and replaced as a whole (label selectors, object references).
    Atomic,
}

/// Fields whose struct type is `+structType=atomic` (LabelSelector, ObjectReference, the key
/// selectors, NodeSelector).
const ATOMIC_STRUCTS: [&str; 12] = [
    "selector",
    "labelSelector",
    "namespaceSelector",
    "fieldRef",
    "resourceFieldRef",
    "configMapKeyRef",
    "secretKeyRef",
    "fileKeyRef",
    "involvedObject",
    "related",
    "regarding",
    "requiredDuringSchedulingIgnoredDuringExecution",
];

/// Fields of the object at `path` that the Go types never omit (a `metav1.Time` that is not a
/// pointer, a list without `omitempty`): the typed object the real server compares carries
/// them as `null` when unset, so a new element owns them too.
pub fn null_fields(kind: StoreKind, path: &[&str]) -> &'static [&'static str] {
    if let Some(rest) = pod_path(kind, path) {
        return match rest {
            ["spec"] => &["containers"],
            ["status", "conditions"] => &["lastProbeTime", "lastTransitionTime"],
            _ => &[],
        };
    }
    match (kind, path) {
        (StoreKind::Job, ["status", "conditions"]) => &["lastProbeTime", "lastTransitionTime"],
        (StoreKind::Namespace, ["status", "conditions"]) => &["lastTransitionTime"],
        _ => &[],
    }
}

/// The default of a key field that an element may leave out (`+default` in the Go types).
pub fn key_default(field: &str) -> Option<&'static str> {
    (field == "protocol").then_some("TCP")
}

/// The type of the object at `path` (field names from the root; list elements and map keys
/// left out).
pub fn obj_type(path: &[&str]) -> ObjType {
    match path.last().copied() {
        Some(f) if MAP_FIELDS.contains(&f) => ObjType::Map,
        Some(f) if ATOMIC_STRUCTS.contains(&f) => ObjType::Atomic,
        _ => ObjType::Struct,
    }
}

/// Whether the elements of the list at `path` are atomic structs (LocalObjectReference).
pub fn atomic_elements(kind: StoreKind, path: &[&str]) -> bool {
    matches!(pod_path(kind, path), Some(["spec", "imagePullSecrets"]))
}

/// The list type of the list at `path`.
pub fn list_type(kind: StoreKind, path: &[&str]) -> ListType {
    if let Some(t) = metadata_list(path) {
        return t;
    }
    if let Some(rest) = pod_path(kind, path) {
        if let Some(t) = metadata_list(rest) {
            return t;
        }
        return pod_list(rest);
    }
    match (kind, path) {
        (StoreKind::Namespace, ["status", "conditions"]) => ListType::Map(&["type"]),
        _ => ListType::Atomic,
    }
}

// The part of `path` inside a pod (the whole path for pods, below `spec.template` for jobs).
fn pod_path<'a, 'b>(kind: StoreKind, path: &'a [&'b str]) -> Option<&'a [&'b str]> {
    match kind {
        StoreKind::Pod => Some(path),
        StoreKind::Job => match path {
            ["spec", "template", rest @ ..] => Some(rest),
            _ => None,
        },
        _ => None,
    }
}

fn metadata_list(path: &[&str]) -> Option<ListType> {
    match path {
        ["metadata", "finalizers"] => Some(ListType::Set),
        ["metadata", "ownerReferences"] => Some(ListType::Map(&["uid"])),
        ["metadata", ..] => Some(ListType::Atomic),
        _ => None,
    }
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

fn pod_list(path: &[&str]) -> ListType {
    match path {
        ["spec", c] if CONTAINER_LISTS.contains(c) => ListType::Map(&["name"]),
        ["spec", c, field] if CONTAINER_LISTS.contains(c) => match *field {
            "env" => ListType::Map(&["name"]),
            "ports" => ListType::Map(&["containerPort", "protocol"]),
            "volumeMounts" => ListType::Map(&["mountPath"]),
            "volumeDevices" => ListType::Map(&["devicePath"]),
            _ => ListType::Atomic,
        },
        ["spec", c, "resources", "claims"] if CONTAINER_LISTS.contains(c) => {
            ListType::Map(&["name"])
        }
        ["spec", "volumes"] | ["spec", "imagePullSecrets"] => ListType::Map(&["name"]),
        ["spec", "schedulingGates"] | ["spec", "resourceClaims"] => ListType::Map(&["name"]),
        ["spec", "hostAliases"] => ListType::Map(&["ip"]),
        ["spec", "topologySpreadConstraints"] => {
            ListType::Map(&["topologyKey", "whenUnsatisfiable"])
        }
        ["status", "conditions"] => ListType::Map(&["type"]),
        ["status", "podIPs"] => ListType::Map(&["ip"]),
        ["status", "resourceClaimStatuses"] => ListType::Map(&["name"]),
        _ => ListType::Atomic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<&str> {
        s.split('.').collect()
    }

    #[test]
    fn table() {
        use ListType::*;
        let cases: &[(StoreKind, &str, ListType)] = &[
            (StoreKind::Pod, "metadata.finalizers", Set),
            (StoreKind::Job, "metadata.ownerReferences", Map(&["uid"])),
            (StoreKind::Pod, "spec.containers", Map(&["name"])),
            (StoreKind::Pod, "spec.containers.ports", Map(&["containerPort", "protocol"])),
            (StoreKind::Pod, "spec.containers.args", Atomic),
            (StoreKind::Pod, "spec.tolerations", Atomic),
            (StoreKind::Pod, "status.conditions", Map(&["type"])),
            (StoreKind::Pod, "status.hostIPs", Atomic),
            (StoreKind::Job, "spec.template.spec.containers", Map(&["name"])),
            (StoreKind::Job, "spec.template.metadata.finalizers", Set),
            (StoreKind::Job, "status.conditions", Atomic),
            (StoreKind::Namespace, "spec.finalizers", Atomic),
            (StoreKind::Namespace, "status.conditions", Map(&["type"])),
        ];
        for (kind, path, want) in cases {
            assert_eq!(list_type(*kind, &p(path)), *want, "{kind:?} {path}");
        }
        assert_eq!(obj_type(&p("metadata.labels")), ObjType::Map);
        assert_eq!(obj_type(&p("spec.selector")), ObjType::Atomic);
        assert_eq!(obj_type(&p("spec.template")), ObjType::Struct);
        assert!(atomic_elements(StoreKind::Job, &p("spec.template.spec.imagePullSecrets")));
    }
}
