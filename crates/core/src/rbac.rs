//! The Kubernetes API permissions each kjob component needs, as plain data.
//!
//! This is the single source of truth: the RBAC objects in `deploy/base` must grant exactly
//! these rules (the e2e suite renders the manifests and compares, so a verb added in code
//! without a manifest change, or a manifest rule no code uses, fails the build). Keep each
//! rule next to the reason the code needs it.

/// The namespace kjob's own workloads (and the watcher's leader-election Lease) live in.
pub const KJOB_NAMESPACE: &str = "kjob-system";

/// Where a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every namespace (a ClusterRole bound with a ClusterRoleBinding).
    Cluster,
    /// One namespace (a Role and RoleBinding in it).
    Namespace(&'static str),
}

/// One RBAC rule: some verbs on one resource of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Where the rule applies.
    pub scope: Scope,
    /// API group; `""` is the core group.
    pub api_group: &'static str,
    /// Resource, with `/subresource` for subresources (e.g. `jobs/status`).
    pub resource: &'static str,
    /// Verbs granted, in the order kubectl prints them.
    pub verbs: &'static [&'static str],
    /// Why the component needs it.
    pub why: &'static str,
}

/// A kjob component and the permissions of its ServiceAccount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// Component (and binary) name, e.g. `kjob-watcher`.
    pub name: &'static str,
    /// Name of its ServiceAccount in [`KJOB_NAMESPACE`].
    pub service_account: &'static str,
    /// The rules it needs; empty means it never talks to the API server.
    pub rules: &'static [Rule],
}

/// One granted permission, flattened: (scope, api group, resource, verb).
pub type Permission = (Scope, &'static str, &'static str, &'static str);

impl Component {
    /// Every (scope, group, resource, verb) this component is granted, sorted and deduplicated.
    pub fn permissions(&self) -> Vec<Permission> {
        let mut out: Vec<Permission> = self
            .rules
            .iter()
            .flat_map(|r| r.verbs.iter().map(move |v| (r.scope, r.api_group, r.resource, *v)))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// kjob-watcher: informers over Jobs, Pods, Namespaces and PriorityClasses, and a
/// leader-election Lease.
pub const WATCHER: Component = Component {
    name: "kjob-watcher",
    service_account: "kjob-watcher",
    rules: &[
        Rule {
            scope: Scope::Cluster,
            api_group: "batch",
            resource: "jobs",
            verbs: &["get", "list", "watch"],
            why: "the Job informer lists and watches every Job it may manage",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "",
            resource: "pods",
            verbs: &["get", "list", "watch"],
            why: "the Pod informer turns pod events into expectation observations and enqueues",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "",
            resource: "namespaces",
            verbs: &["get", "list", "watch"],
            why: "the kjob.io/queue-weight annotation sets a namespace's weight in the fair lease",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "scheduling.k8s.io",
            resource: "priorityclasses",
            verbs: &["get", "list", "watch"],
            why: "a Job's pods' PriorityClass value orders its key within its namespace",
        },
        Rule {
            scope: Scope::Namespace(KJOB_NAMESPACE),
            api_group: "coordination.k8s.io",
            resource: "leases",
            verbs: &["get", "create", "update"],
            why: "only one watcher may be active: observations lower shared counters",
        },
    ],
};

/// kjob-worker: syncJob with consistent reads, pod writes, status writes and events.
pub const WORKER: Component = Component {
    name: "kjob-worker",
    service_account: "kjob-worker",
    rules: &[
        Rule {
            scope: Scope::Cluster,
            api_group: "batch",
            resource: "jobs",
            verbs: &["get", "list"],
            why: "each sync GETs its Job; orphan adoption lists Jobs whose selector matches",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "batch",
            resource: "jobs/status",
            verbs: &["update", "patch"],
            why: "status is written with the read resourceVersion so conflicts requeue",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "batch",
            resource: "jobs/finalizers",
            verbs: &["update"],
            why: "pods carry a blockOwnerDeletion controllerRef to their Job; with the \
                  OwnerReferencesPermissionEnforcement admission plugin that needs update on \
                  the owner's finalizers (upstream's job-controller role has it for this)",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "",
            resource: "pods",
            verbs: &["get", "list", "create", "delete", "patch"],
            why: "pods are listed by selector, created, deleted, adopted and de-finalized by patch",
        },
        Rule {
            scope: Scope::Cluster,
            api_group: "",
            resource: "events",
            verbs: &["create", "patch"],
            why: "upstream's core/v1 events (SuccessfulCreate, Completed, ...); repeats PATCH \
                  the count, and an empty PATCH reads an event another worker created",
        },
    ],
};

/// kjob-queue: talks only to Redis, never to the API server.
pub const QUEUE: Component =
    Component { name: "kjob-queue", service_account: "kjob-queue", rules: &[] };

/// Every component, in deployment order.
pub const COMPONENTS: [Component; 3] = [QUEUE, WATCHER, WORKER];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_needs_nothing_and_watcher_cannot_write_jobs_or_pods() {
        assert!(QUEUE.permissions().is_empty());
        let w = WATCHER.permissions();
        assert!(w.iter().all(|(_, g, r, v)| {
            !((*r == "jobs" || *r == "pods") && *g != "coordination.k8s.io")
                || ["get", "list", "watch"].contains(v)
        }));
        assert!(w.contains(&(
            Scope::Namespace(KJOB_NAMESPACE),
            "coordination.k8s.io",
            "leases",
            "update"
        )));
    }

    #[test]
    fn worker_permissions_are_flattened_sorted_and_unique() {
        let p = WORKER.permissions();
        assert_eq!(p.len(), 2 + 2 + 1 + 5 + 2);
        let mut sorted = p.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(p, sorted);
        assert!(p.contains(&(Scope::Cluster, "batch", "jobs/status", "update")));
        assert!(!p.contains(&(Scope::Cluster, "batch", "jobs", "update")));
        assert!(!p.iter().any(|(_, _, _, v)| *v == "watch"), "workers read, never watch");
    }

    /// Upstream's `system:controller:job-controller` ClusterRole (plugin/pkg/auth/authorizer/
    /// rbac/bootstrappolicy/controller_policy.go), flattened: what the built-in controller may do.
    const UPSTREAM_JOB_CONTROLLER: &[(&str, &str, &[&str])] = &[
        ("batch", "jobs", &["get", "list", "watch", "update", "patch"]),
        ("batch", "jobs/status", &["update"]),
        ("batch", "jobs/finalizers", &["update"]),
        ("", "pods", &["list", "watch", "create", "delete", "patch"]),
        ("", "events", &["create", "update", "patch"]),
        ("events.k8s.io", "events", &["create", "update", "patch"]),
    ];

    /// What kjob holds beyond upstream's role, each with its reason. Anything else fails.
    const BEYOND_UPSTREAM: &[(&str, &str, &str, &str)] = &[
        ("coordination.k8s.io", "leases", "get", "watcher leader election (kjob-system only)"),
        ("coordination.k8s.io", "leases", "create", "watcher leader election (kjob-system only)"),
        ("coordination.k8s.io", "leases", "update", "watcher leader election (kjob-system only)"),
        ("", "pods", "get", "workers read single pods by name where upstream reads its cache"),
        (
            "batch",
            "jobs/status",
            "patch",
            "status is written by merge patch with a resourceVersion",
        ),
        ("", "namespaces", "get", "the watcher reads namespaces' kjob.io/queue-weight"),
        ("", "namespaces", "list", "the watcher reads namespaces' kjob.io/queue-weight"),
        ("", "namespaces", "watch", "the watcher reads namespaces' kjob.io/queue-weight"),
        (
            "scheduling.k8s.io",
            "priorityclasses",
            "get",
            "the watcher orders a namespace's Jobs by their pods' priority",
        ),
        (
            "scheduling.k8s.io",
            "priorityclasses",
            "list",
            "the watcher orders a namespace's Jobs by their pods' priority",
        ),
        (
            "scheduling.k8s.io",
            "priorityclasses",
            "watch",
            "the watcher orders a namespace's Jobs by their pods' priority",
        ),
    ];

    #[test]
    fn kjob_holds_upstreams_job_controller_role_plus_only_named_extras() {
        let upstream: Vec<(&str, &str, &str)> = UPSTREAM_JOB_CONTROLLER
            .iter()
            .flat_map(|(g, r, vs)| vs.iter().map(move |v| (*g, *r, *v)))
            .collect();
        let mut extras_used = Vec::new();
        for c in COMPONENTS {
            for (scope, g, r, v) in c.permissions() {
                if upstream.contains(&(g, r, v)) {
                    continue;
                }
                let extra =
                    BEYOND_UPSTREAM.iter().find(|(eg, er, ev, _)| (*eg, *er, *ev) == (g, r, v));
                assert!(
                    extra.is_some(),
                    "{}: {scope:?} {g}/{r} {v} is neither upstream's nor a named extra",
                    c.name
                );
                if g == "coordination.k8s.io" {
                    assert_eq!(
                        scope,
                        Scope::Namespace(KJOB_NAMESPACE),
                        "Leases only in kjob's namespace"
                    );
                }
                extras_used.push((g, r, v));
            }
        }
        for (g, r, v, why) in BEYOND_UPSTREAM {
            assert!(
                extras_used.contains(&(*g, *r, *v)),
                "named extra {g}/{r} {v} ({why}) is not granted: drop it"
            );
        }
        // Nothing cluster-wide that writes Jobs' spec, and no delete of Jobs at all.
        for c in COMPONENTS {
            assert!(!c.permissions().iter().any(|(_, g, r, v)| *g == "batch"
                && *r == "jobs"
                && ["update", "patch", "delete", "create"].contains(v)));
        }
    }

    #[test]
    fn component_names_are_unique() {
        let mut names: Vec<_> = COMPONENTS.iter().map(|c| c.service_account).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), COMPONENTS.len());
    }
}
