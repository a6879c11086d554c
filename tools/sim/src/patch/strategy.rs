//! Hand-written patch metadata (the `patchStrategy`/`patchMergeKey` struct tags of the Go
//! types) for the kinds the simulator serves: pods, jobs, events, leases and namespaces.

/// How a list field merges in a strategic merge patch or apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replace the whole list (the default for lists without struct tags).
    Replace,
    /// A list of objects merged element-wise by the named key.
    MergeByKey(&'static str),
    /// A list of primitives merged as a set union (e.g. `metadata.finalizers`).
    MergePrimitives,
}

/// Strategy of the list at `path` (field names from the object root, list indices omitted).
/// `kind` is the resource or Kind name (`pods`/`Pod`, `jobs`/`Job`, ...).
pub fn list_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    if let Some(s) = metadata_strategy(path) {
        return s;
    }
    match kind.to_ascii_lowercase().as_str() {
        "pod" | "pods" => pod_strategy(path),
        "job" | "jobs" => match path {
            ["spec", "template", rest @ ..] => {
                metadata_strategy(rest).unwrap_or_else(|| pod_strategy(rest))
            }
            ["status", "conditions"] => ListStrategy::MergeByKey("type"),
            _ => ListStrategy::Replace,
        },
        "namespace" | "namespaces" => match path {
            ["status", "conditions"] => ListStrategy::MergeByKey("type"),
            _ => ListStrategy::Replace,
        },
        _ => ListStrategy::Replace,
    }
}

/// Whether the map at `path` carries `retainKeys` semantics (pod volumes).
pub fn retains_keys(kind: &str, path: &[&str]) -> bool {
    let pod_path = match kind.to_ascii_lowercase().as_str() {
        "pod" | "pods" => path,
        "job" | "jobs" => match path {
            ["spec", "template", rest @ ..] => rest,
            _ => return false,
        },
        _ => return false,
    };
    matches!(pod_path, ["spec", "volumes"])
}

fn metadata_strategy(path: &[&str]) -> Option<ListStrategy> {
    match path {
        ["metadata", "finalizers"] => Some(ListStrategy::MergePrimitives),
        ["metadata", "ownerReferences"] => Some(ListStrategy::MergeByKey("uid")),
        ["metadata", ..] => Some(ListStrategy::Replace),
        _ => None,
    }
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

fn pod_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", c] if CONTAINER_LISTS.contains(c) => ListStrategy::MergeByKey("name"),
        ["spec", c, field] if CONTAINER_LISTS.contains(c) => match *field {
            "env" => ListStrategy::MergeByKey("name"),
            "ports" => ListStrategy::MergeByKey("containerPort"),
            "volumeMounts" => ListStrategy::MergeByKey("mountPath"),
            "volumeDevices" => ListStrategy::MergeByKey("devicePath"),
            "resizePolicy" => ListStrategy::MergeByKey("resourceName"),
            _ => ListStrategy::Replace,
        },
        ["spec", "volumes"] => ListStrategy::MergeByKey("name"),
        ["spec", "imagePullSecrets"] => ListStrategy::MergeByKey("name"),
        ["spec", "hostAliases"] => ListStrategy::MergeByKey("ip"),
        ["spec", "topologySpreadConstraints"] => ListStrategy::MergeByKey("topologyKey"),
        ["spec", "schedulingGates"] => ListStrategy::MergeByKey("name"),
        ["spec", "resourceClaims"] => ListStrategy::MergeByKey("name"),
        ["status", "conditions"] => ListStrategy::MergeByKey("type"),
        ["status", "podIPs"] | ["status", "hostIPs"] => ListStrategy::MergeByKey("ip"),
        ["status", "resourceClaimStatuses"] => ListStrategy::MergeByKey("name"),
        _ => ListStrategy::Replace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use ListStrategy::*;
        let cases: &[(&str, &[&str], ListStrategy)] = &[
            ("pods", &["metadata", "finalizers"], MergePrimitives),
            ("jobs", &["metadata", "ownerReferences"], MergeByKey("uid")),
            ("pods", &["spec", "containers"], MergeByKey("name")),
            ("pods", &["spec", "initContainers", "env"], MergeByKey("name")),
            ("pods", &["spec", "containers", "ports"], MergeByKey("containerPort")),
            ("pods", &["spec", "containers", "volumeMounts"], MergeByKey("mountPath")),
            ("pods", &["spec", "containers", "args"], Replace),
            ("pods", &["spec", "tolerations"], Replace),
            ("pods", &["status", "conditions"], MergeByKey("type")),
            ("pods", &["status", "containerStatuses"], Replace),
            ("Job", &["spec", "template", "spec", "containers"], MergeByKey("name")),
            ("jobs", &["spec", "template", "metadata", "finalizers"], MergePrimitives),
            ("jobs", &["status", "conditions"], MergeByKey("type")),
            ("jobs", &["spec", "podFailurePolicy", "rules"], Replace),
            ("namespaces", &["status", "conditions"], MergeByKey("type")),
            ("namespaces", &["spec", "finalizers"], Replace),
            ("leases", &["metadata", "finalizers"], MergePrimitives),
            ("events", &["series"], Replace),
        ];
        for (kind, path, want) in cases {
            assert_eq!(list_strategy(kind, path), *want, "{kind} {path:?}");
        }
        assert!(retains_keys("pods", &["spec", "volumes"]));
        assert!(retains_keys("jobs", &["spec", "template", "spec", "volumes"]));
        assert!(!retains_keys("pods", &["spec", "containers"]));
    }
}
