//! deploy/: every kustomization renders, every object parses into its k8s-openapi type, the
//! RBAC equals `kjob_core::rbac`, and the workloads follow the conventions of the issue.

use std::collections::BTreeSet;

use kjob_e2e::*;
use serde_json::Value;

const KUSTOMIZATIONS: [&str; 6] = [
    "deploy/base",
    "deploy/overlays/kind",
    "deploy/overlays/kind-manage-all",
    "deploy/overlays/hpa",
    "deploy/overlays/redis-tls",
    "deploy/overlays/redis-cluster",
];

/// Renders `dir`, or says loudly why it cannot.
fn render(dir: &str) -> Option<Vec<Value>> {
    match kubectl() {
        Some(k) => Some(kustomize(&k, dir).unwrap()),
        None => {
            eprintln!("SKIPPED rendering {dir}: no kubectl (set KJOB_KUBECTL or install kubectl)");
            None
        }
    }
}

/// deploy/base rendered by kubectl, or assembled without it.
fn base() -> Vec<Value> {
    render("deploy/base").unwrap_or_else(|| base_without_kustomize().unwrap())
}

fn deployment<'a>(objs: &'a [Value], name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == "Deployment" && kjob_e2e::name(o) == name)
        .unwrap_or_else(|| panic!("no Deployment {name}"))
}

#[test]
fn every_kustomization_renders_into_typed_objects() {
    for dir in KUSTOMIZATIONS {
        let Some(objs) = render(dir) else { continue };
        assert!(objs.len() >= 20, "{dir} rendered only {} objects", objs.len());
        for o in &objs {
            if let Err(e) = check_typed(o) {
                panic!("{dir}: {e:#}");
            }
            if !["Namespace", "ClusterRole", "ClusterRoleBinding"]
                .contains(&o["kind"].as_str().unwrap())
            {
                assert_eq!(o["metadata"]["namespace"], "kjob-system", "{dir}: {}", name(o));
            }
        }
    }
}

#[test]
fn rbac_equals_kjob_core_rbac_exactly() {
    let granted = grants_by_service_account(&base()).unwrap();
    let expected = expected_grants();
    for (sa, want) in &expected {
        let got = granted.get(sa).cloned().unwrap_or_default();
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{sa}: deploy/ lacks {missing:?} and grants more than kjob_core::rbac: {extra:?}"
        );
    }
    let unknown: Vec<_> = granted.keys().filter(|sa| !expected.contains_key(*sa)).collect();
    assert!(
        unknown.is_empty(),
        "bindings for ServiceAccounts kjob_core::rbac does not know: {unknown:?}"
    );
}

#[test]
fn service_accounts_exist_and_the_queue_and_redis_mount_no_token() {
    let objs = base();
    let sas: BTreeSet<&str> = of_kind(&objs, "ServiceAccount").into_iter().map(name).collect();
    for c in kjob_core::rbac::COMPONENTS {
        assert!(sas.contains(c.service_account), "no ServiceAccount {}", c.service_account);
        let d = deployment(&objs, c.name);
        assert_eq!(d["spec"]["template"]["spec"]["serviceAccountName"], c.service_account);
        if c.rules.is_empty() {
            assert_eq!(
                d["spec"]["template"]["spec"]["automountServiceAccountToken"], false,
                "{}",
                c.name
            );
        }
    }
}

#[test]
fn workloads_are_hardened_probed_and_sized() {
    let objs = base();
    let workloads: Vec<&Value> =
        objs.iter().filter(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet").collect();
    assert_eq!(workloads.len(), 4);
    for w in workloads {
        let n = name(w);
        let pod = &w["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{n}");
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{n}");
        for c in pod["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{n}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{n}");
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{n}");
            for k in ["requests", "limits"] {
                for r in ["cpu", "memory"] {
                    assert!(c["resources"][k][r].is_string(), "{n}: no {k}.{r}");
                }
            }
            for p in c["ports"].as_array().unwrap() {
                assert!(p["name"].is_string(), "{n}: unnamed port {p}");
            }
            assert!(c["livenessProbe"].is_object() && c["readinessProbe"].is_object(), "{n}");
            if n != "kjob-redis" {
                assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez", "{n}");
                assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{n}");
                assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin", "{n}");
            }
        }
    }
}

#[test]
fn replicas_leader_election_env_and_redis_persistence() {
    let objs = base();
    for (n, r) in [("kjob-watcher", 2), ("kjob-queue", 2), ("kjob-worker", 3)] {
        assert_eq!(deployment(&objs, n)["spec"]["replicas"], r, "{n}");
    }
    let env =
        &deployment(&objs, "kjob-watcher")["spec"]["template"]["spec"]["containers"][0]["env"];
    for (var, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        let e = env.as_array().unwrap().iter().find(|e| e["name"] == var).expect(var);
        assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
    let redis = of_kind(&objs, "StatefulSet")[0];
    let args: Vec<&str> = redis["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for pair in [
        ["--appendonly", "yes"],
        ["--appendfsync", "everysec"],
        ["--maxmemory-policy", "noeviction"],
    ] {
        assert!(args.windows(2).any(|w| w == pair), "redis args lack {pair:?}: {args:?}");
    }
    assert!(redis["spec"]["volumeClaimTemplates"].as_array().is_some_and(|v| !v.is_empty()));
    let pdbs: BTreeSet<&str> =
        of_kind(&objs, "PodDisruptionBudget").into_iter().map(name).collect();
    assert_eq!(pdbs, BTreeSet::from(["kjob-queue", "kjob-watcher", "kjob-worker"]));
    assert!(
        of_kind(&objs, "HorizontalPodAutoscaler").is_empty(),
        "the HPA belongs to overlays/hpa"
    );
}

/// The container `name` of the workload of kind `kind` named `workload`.
fn container<'a>(objs: &'a [Value], kind: &str, workload: &str) -> &'a Value {
    let w = of_kind(objs, kind).into_iter().find(|o| name(o) == workload).unwrap();
    &w["spec"]["template"]["spec"]["containers"][0]
}

/// The env var `var` of container `c`.
fn env<'a>(c: &'a Value, var: &str) -> &'a Value {
    c["env"].as_array().unwrap().iter().find(|e| e["name"] == var).unwrap_or_else(|| {
        panic!("no env {var}: {}", c["env"]);
    })
}

/// A container's `command`, joined with spaces (a start script and its arguments).
fn command_line(container: &Value) -> String {
    let parts = container["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap());
    parts.collect::<Vec<_>>().join(" ")
}

/// Bytes of a Kubernetes quantity like `1Gi`, `512Mi` or Redis's `400mb`.
fn bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap();
    n * match unit {
        "Gi" => 1 << 30,
        "Mi" | "mb" => 1 << 20,
        "" => 1,
        other => panic!("unit {other}"),
    }
}

/// Redis authenticates kjob as an ACL user from a Secret with exactly the rules kjob-queue
/// prints, the default user off; kjob-queue takes the password from the same Secret through
/// its environment; the Redis memory limit leaves room for an AOF rewrite's fork.
#[test]
fn redis_acl_user_from_a_secret_and_room_for_the_fork() {
    let objs = base();
    let redis = container(&objs, "StatefulSet", "kjob-redis");
    for var in ["KJOB_REDIS_PASSWORD", "REDISCLI_AUTH"] {
        let from = &env(redis, var)["valueFrom"]["secretKeyRef"];
        assert_eq!(
            (from["name"].as_str(), from["key"].as_str()),
            (Some("kjob-redis-auth"), Some("password"))
        );
    }
    let script = command_line(redis);
    assert!(script.contains("user default off") && script.contains("--aclfile"), "{script}");
    let acl =
        of_kind(&objs, "ConfigMap").into_iter().find(|c| name(c) == "kjob-redis-acl").unwrap();
    let rules = acl["data"]["rules"].as_str().unwrap();
    // The one source of the rules is kjob_workqueue::acl, printed by `kjob-queue redis-acl`.
    if let Ok(bin) = kjob_testkit::bin_path("kjob-queue") {
        let out = std::process::Command::new(bin)
            .args(["redis-acl", "--password", ">pw"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            printed.trim(),
            format!("user kjob on >pw {rules}"),
            "deploy's ACL rules drifted from `kjob-queue redis-acl`"
        );
    } else {
        eprintln!("SKIPPED comparing the ACL rules: kjob-queue not built (cargo build --bins)");
    }
    let queue = container(&objs, "Deployment", "kjob-queue");
    assert_eq!(env(queue, "KJOB_REDIS_USERNAME")["value"], "kjob");
    let from = &env(queue, "KJOB_REDIS_PASSWORD")["valueFrom"]["secretKeyRef"];
    assert_eq!(
        (from["name"].as_str(), from["key"].as_str()),
        (Some("kjob-redis-auth"), Some("password"))
    );

    let args: Vec<&str> =
        redis["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let maxmemory = args.windows(2).find(|w| w[0] == "--maxmemory").map(|w| bytes(w[1])).unwrap();
    let limit = bytes(redis["resources"]["limits"]["memory"].as_str().unwrap());
    assert!(limit >= 2 * maxmemory, "limit {limit} leaves no room for a fork of {maxmemory}");
}

/// The TLS overlay: Redis serves TLS only from Secret kjob-redis-tls, kjob-queue dials
/// rediss:// and verifies it with the Secret's ca.crt.
#[test]
fn redis_tls_overlay_serves_tls_only_and_the_queue_verifies_it() {
    let Some(objs) = render("deploy/overlays/redis-tls") else { return };
    let redis = container(&objs, "StatefulSet", "kjob-redis");
    let args: Vec<&str> =
        redis["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for pair in [["--port", "0"], ["--tls-port", "6379"], ["--tls-cert-file", "/tls/tls.crt"]] {
        assert!(args.windows(2).any(|w| w == pair), "redis args lack {pair:?}: {args:?}");
    }
    let queue = container(&objs, "Deployment", "kjob-queue");
    let qargs: Vec<&str> =
        queue["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(qargs.contains(&"--redis-url=rediss://kjob-redis.kjob-system.svc:6379"), "{qargs:?}");
    assert_eq!(env(queue, "KJOB_REDIS_CA_FILE")["value"], "/tls/ca.crt");
}

/// The Redis Cluster overlay: six TLS-only nodes (three masters, a replica each) that announce
/// their stable names, keep the base's ACL user with kjob's exact rules, replicate and form the
/// cluster as an `admin` user whose password never reaches a command line; kjob-queue names
/// every node as a seed over rediss+cluster:// and verifies them; the nodes (and the init Job)
/// reach one another and nobody else new reaches them.
#[test]
fn redis_cluster_overlay_forms_a_tls_cluster_with_replicas_that_kjob_follows() {
    let Some(objs) = render("deploy/overlays/redis-cluster") else { return };
    let sts = of_kind(&objs, "StatefulSet").into_iter().find(|s| name(s) == "kjob-redis").unwrap();
    assert_eq!(sts["spec"]["replicas"], 6);
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    let redis = container(&objs, "StatefulSet", "kjob-redis");
    let args: Vec<&str> =
        redis["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for pair in [
        ["--cluster-enabled", "yes"],
        ["--cluster-config-file", "/data/nodes.conf"],
        ["--cluster-announce-hostname", "$(POD_NAME).kjob-redis.kjob-system.svc"],
        ["--cluster-preferred-endpoint-type", "hostname"],
        ["--port", "0"],
        ["--tls-port", "6379"],
        ["--tls-cluster", "yes"],
        ["--tls-replication", "yes"],
        ["--tls-cert-file", "/tls/tls.crt"],
        ["--appendonly", "yes"],
        ["--maxmemory-policy", "noeviction"],
    ] {
        assert!(args.windows(2).any(|w| w == pair), "redis args lack {pair:?}: {args:?}");
    }
    assert!(!args.iter().any(|a| a.contains("masterauth")), "a password on the command line");
    let script = command_line(redis);
    for needed in
        ["user default off", "user kjob on #", "$KJOB_REDIS_ACL_RULES", "masteruser admin"]
    {
        assert!(script.contains(needed), "the start script lacks {needed:?}: {script}");
    }
    for (var, key) in
        [("KJOB_REDIS_PASSWORD", "password"), ("KJOB_REDIS_ADMIN_PASSWORD", "admin-password")]
    {
        let from = &env(redis, var)["valueFrom"]["secretKeyRef"];
        assert_eq!(
            (from["name"].as_str(), from["key"].as_str()),
            (Some("kjob-redis-auth"), Some(key))
        );
    }
    let mut ports: Vec<&str> =
        redis["ports"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    ports.sort();
    assert_eq!(ports, ["cluster-bus", "redis"]);

    let queue = container(&objs, "Deployment", "kjob-queue");
    let qargs: Vec<&str> =
        queue["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let url = qargs.iter().find_map(|a| a.strip_prefix("--redis-url=")).unwrap();
    let seeds = url.strip_prefix("rediss+cluster://").unwrap_or_else(|| panic!("{url}"));
    let want: Vec<String> =
        (0..6).map(|i| format!("kjob-redis-{i}.kjob-redis.kjob-system.svc:6379")).collect();
    assert_eq!(seeds.split(',').collect::<Vec<_>>(), want, "every node is a seed");
    assert_eq!(env(queue, "KJOB_REDIS_CA_FILE")["value"], "/tls/ca.crt");

    let init = of_kind(&objs, "Job").into_iter().find(|j| name(j) == "kjob-redis-cluster-init");
    let init = init.expect("the init Job");
    let c = &init["spec"]["template"]["spec"]["containers"][0];
    let from = &env(c, "REDISCLI_AUTH")["valueFrom"]["secretKeyRef"];
    assert_eq!(
        (from["name"].as_str(), from["key"].as_str()),
        (Some("kjob-redis-auth"), Some("admin-password"))
    );
    let script = command_line(c);
    for needed in [
        "--cluster create",
        "--cluster-replicas 1",
        "for i in 0 1 2 3 4 5",
        "cluster_known_nodes:6",
    ] {
        assert!(script.contains(needed), "the init script lacks {needed:?}: {script}");
    }
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);

    let policy =
        of_kind(&objs, "NetworkPolicy").into_iter().find(|p| name(p) == "kjob-redis").unwrap();
    let mut reach: BTreeSet<(String, String)> = BTreeSet::new();
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        for f in rule["from"].as_array().unwrap() {
            for p in rule["ports"].as_array().unwrap() {
                let who =
                    f["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str().unwrap();
                reach.insert((who.into(), p["port"].as_str().unwrap().into()));
            }
        }
    }
    let want: BTreeSet<(String, String)> = [
        ("kjob-queue", "redis"),
        ("kjob-redis", "redis"),
        ("kjob-redis", "cluster-bus"),
        ("kjob-redis-cluster-init", "redis"),
        ("kjob-redis-cluster-init", "cluster-bus"),
    ]
    .into_iter()
    .map(|(a, b)| (a.into(), b.into()))
    .collect();
    assert_eq!(reach, want);
    let pdb = of_kind(&objs, "PodDisruptionBudget").into_iter().find(|p| name(p) == "kjob-redis");
    assert_eq!(pdb.expect("a PDB for the nodes")["spec"]["maxUnavailable"], 1);
    // With the base's deny in both directions: the nodes reach one another and the cluster
    // DNS, the init Job reaches the nodes, kjob-queue the client port only, nobody else more.
    use Peer::*;
    let pols = of_kind(&objs, "NetworkPolicy");
    let (r, init, q) = ("kjob-redis", "kjob-redis-cluster-init", "kjob-queue");
    #[rustfmt::skip]
    let table: &[(&str, &str, Peer, &str, bool)] = &[
        (r, "egress", Pod(r), "redis", true),
        (r, "egress", Pod(r), "cluster-bus", true),
        (r, "egress", Dns, "53", true),
        (init, "egress", Pod(r), "redis", true),
        (init, "egress", Pod(r), "cluster-bus", true),
        (init, "egress", Dns, "53", true),
        (q, "egress", Pod(r), "redis", true),
        (r, "ingress", Pod(init), "cluster-bus", true),
        (q, "egress", Pod(r), "cluster-bus", false),
        (r, "egress", Outside, "443", false),
        (r, "egress", Pod(q), "grpc", false),
        (init, "egress", Outside, "443", false),
        (init, "ingress", Pod(r), "redis", false),
        (r, "ingress", Pod("kjob-worker"), "redis", false),
    ];
    for &(app, dir, peer, port, want) in table {
        assert_eq!(allowed(&pols, app, dir, peer, port), want, "{app} {dir} {peer:?} port {port}");
    }
}

/// Who is at the other end of a connection, as a NetworkPolicy peer sees it.
#[derive(Clone, Copy, Debug)]
enum Peer {
    /// A pod of kjob-system with this `app.kubernetes.io/name`.
    Pod(&'static str),
    /// The cluster DNS (kube-system, `k8s-app: kube-dns`).
    Dns,
    /// Prometheus in a namespace labelled `kjob.io/scrape: "true"`.
    Prometheus,
    /// An address outside the cluster's pods (kube-apiserver on the control plane's hosts).
    Outside,
}

/// Whether `selector` (a LabelSelector) selects `labels`.
fn selects(selector: &Value, labels: &[(&str, &str)]) -> bool {
    let has = |k: &str, v: &str| labels.iter().any(|(lk, lv)| *lk == k && *lv == v);
    let ml = selector["matchLabels"].as_object().cloned().unwrap_or_default();
    let me = selector["matchExpressions"].as_array().cloned().unwrap_or_default();
    ml.iter().all(|(k, v)| has(k, v.as_str().unwrap()))
        && me.iter().all(|e| {
            assert_eq!(e["operator"], "In", "only In is evaluated here");
            let key = e["key"].as_str().unwrap();
            e["values"].as_array().unwrap().iter().any(|v| has(key, v.as_str().unwrap()))
        })
}

/// Labels, as (key, value) pairs.
type Labels<'a> = Vec<(&'a str, &'a str)>;

/// Whether a rule's peer list (`from` or `to`) admits `peer`.
fn admits(peers: &Value, peer: Peer) -> bool {
    let Some(peers) = peers.as_array() else { return true }; // absent: any peer
    peers.iter().any(|p| {
        let (ns, pod): (Labels, Labels) = match peer {
            Peer::Pod(app) => (vec![], vec![("app.kubernetes.io/name", app)]),
            Peer::Dns => (
                vec![("kubernetes.io/metadata.name", "kube-system")],
                vec![("k8s-app", "kube-dns")],
            ),
            Peer::Prometheus => {
                (vec![("kjob.io/scrape", "true")], vec![("app.kubernetes.io/name", "prometheus")])
            }
            Peer::Outside => return p["ipBlock"].is_object(),
        };
        let ns_ok = match p.get("namespaceSelector") {
            Some(sel) => !ns.is_empty() && selects(sel, &ns),
            None => ns.is_empty(), // the policy's own namespace
        };
        let pod_ok = p.get("podSelector").is_none_or(|sel| selects(sel, &pod));
        !p["ipBlock"].is_object() && ns_ok && pod_ok
    })
}

/// Whether `pols` let a connection through in direction `dir` ("ingress" or "egress") of the
/// kjob pod `app`, to or from `peer`, on `port` (a port name or number).
fn allowed(pols: &[&Value], app: &str, dir: &str, peer: Peer, port: &str) -> bool {
    let labels = [("app.kubernetes.io/name", app)];
    let kind = if dir == "ingress" { "Ingress" } else { "Egress" };
    let from_to = if dir == "ingress" { "from" } else { "to" };
    let applying: Vec<_> = pols
        .iter()
        .filter(|p| selects(&p["spec"]["podSelector"], &labels))
        .filter(|p| p["spec"]["policyTypes"].as_array().unwrap().iter().any(|t| t == kind))
        .collect();
    assert!(!applying.is_empty(), "no policy isolates {app}'s {dir}: it would be open");
    applying.iter().any(|p| {
        p["spec"][dir].as_array().into_iter().flatten().any(|r| {
            let port_ok = r["ports"].as_array().is_none_or(|ps| {
                ps.iter().any(|x| match &x["port"] {
                    Value::String(s) => s == port,
                    v => v.as_u64().is_some_and(|n| n.to_string() == port),
                })
            });
            port_ok && admits(&r[from_to], peer)
        })
    })
}

/// deploy/base's NetworkPolicies, evaluated: every connection kjob needs is let through and
/// every other one tried here is not (docs/operations.md#network-policies).
#[test]
fn network_policies_admit_exactly_what_kjob_needs() {
    use Peer::*;
    let objs = base();
    let pols = of_kind(&objs, "NetworkPolicy");
    let deny = pols.iter().find(|p| name(p) == "kjob-default-deny").expect("a default deny");
    assert_eq!(deny["spec"]["podSelector"], serde_json::json!({}));
    assert_eq!(deny["spec"]["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    let (q, r, wa, wo) = ("kjob-queue", "kjob-redis", "kjob-watcher", "kjob-worker");
    #[rustfmt::skip]
    let table: &[(&str, &str, Peer, &str, bool)] = &[
        // egress: the clients reach kjob-queue and kube-apiserver, kjob-queue reaches Redis
        (wa, "egress", Pod(q), "grpc", true),
        (wo, "egress", Pod(q), "grpc", true),
        (wa, "egress", Outside, "6443", true),
        (wo, "egress", Outside, "443", true),
        (q, "egress", Pod(r), "redis", true),
        (q, "egress", Dns, "53", true),
        (wa, "egress", Dns, "53", true),
        (wo, "egress", Dns, "53", true),
        // and nothing else
        (wo, "egress", Pod(r), "redis", false),
        (wa, "egress", Pod(r), "redis", false),
        (q, "egress", Outside, "443", false),
        (wo, "egress", Outside, "80", false),
        (wo, "egress", Pod(wa), "admin", false),
        (r, "egress", Dns, "53", false),
        (r, "egress", Outside, "443", false),
        (r, "egress", Pod(q), "grpc", false),
        // ingress: kjob-queue from its clients, Redis from kjob-queue, admin ports from Prometheus
        (q, "ingress", Pod(wa), "grpc", true),
        (q, "ingress", Pod(wo), "grpc", true),
        (r, "ingress", Pod(q), "redis", true),
        (q, "ingress", Prometheus, "admin", true),
        (wa, "ingress", Prometheus, "admin", true),
        (wo, "ingress", Prometheus, "admin", true),
        // and nothing else
        (q, "ingress", Prometheus, "grpc", false),
        (q, "ingress", Outside, "grpc", false),
        (r, "ingress", Pod(wo), "redis", false),
        (r, "ingress", Prometheus, "redis", false),
        (wa, "ingress", Pod(wo), "admin", false),
        (q, "ingress", Pod(wo), "admin", false),
        (wo, "ingress", Outside, "admin", false),
    ];
    for &(app, dir, peer, port, want) in table {
        assert_eq!(allowed(&pols, app, dir, peer, port), want, "{app} {dir} {peer:?} port {port}");
    }
}

#[test]
fn kind_overlay_uses_local_dev_images_and_fewer_replicas() {
    let Some(objs) = render("deploy/overlays/kind") else { return };
    for c in ["queue", "watcher", "worker"] {
        let d = deployment(&objs, &format!("kjob-{c}"));
        let ctr = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(ctr["image"], format!("kjob/{c}:dev"));
        assert_eq!(ctr["imagePullPolicy"], "IfNotPresent");
        assert!(d["spec"]["replicas"].as_i64().unwrap() <= 2);
    }
    let Some(all) = render("deploy/overlays/kind-manage-all") else { return };
    for c in ["kjob-watcher", "kjob-worker"] {
        let args = &deployment(&all, c)["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(args.as_array().unwrap().iter().any(|a| a == "--manage-all-jobs"), "{c}");
    }
    let Some(hpa) = render("deploy/overlays/hpa") else { return };
    let h = of_kind(&hpa, "HorizontalPodAutoscaler");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["spec"]["scaleTargetRef"]["name"], "kjob-worker");
}

#[test]
fn kind_cluster_configs_and_grafana_dashboard_parse() {
    let root = root();
    let plain: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root.join("deploy/kind/cluster.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(plain["kind"], "Cluster");
    let text =
        std::fs::read_to_string(root.join("deploy/kind/cluster-no-job-controller.yaml")).unwrap();
    let nojob: Value = serde_yaml::from_str(&text).unwrap();
    let patch = nojob["nodes"][0]["kubeadmConfigPatches"][0].as_str().unwrap();
    let patch: Value = serde_yaml::from_str(patch).unwrap();
    assert_eq!(patch["controllerManager"]["extraArgs"]["controllers"], "*,-job");

    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/kjob.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    for m in [
        "workqueue_depth",
        "workqueue_adds_total",
        "job_controller_job_syncs_total",
        "job_controller_jobs_finished_total",
    ] {
        assert!(exprs.iter().any(|e| e.contains(m)), "dashboard has no panel over {m}");
    }
}

/// Each service mounts its role's TLS Secret read-only and points its flags at it; clients dial
/// kjob-queue over https:// (issue 44: authenticated, encrypted gRPC, on by default).
#[test]
fn services_mount_their_tls_secrets_and_speak_mtls() {
    let objs = base();
    for (n, secret, flags) in [
        ("kjob-queue", "kjob-queue-tls", ["--tls-cert-file", "--tls-key-file", "--client-ca-file"]),
        (
            "kjob-watcher",
            "kjob-watcher-tls",
            ["--queue-ca-file", "--queue-cert-file", "--queue-key-file"],
        ),
        (
            "kjob-worker",
            "kjob-worker-tls",
            ["--queue-ca-file", "--queue-cert-file", "--queue-key-file"],
        ),
    ] {
        let pod = &deployment(&objs, n)["spec"]["template"]["spec"];
        let volume = pod["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["secret"]["secretName"] == secret))
            .unwrap_or_else(|| panic!("{n}: no volume of Secret {secret}"));
        let c = &pod["containers"][0];
        let mount = c["volumeMounts"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["name"] == volume["name"]))
            .unwrap_or_else(|| panic!("{n}: {secret} not mounted"));
        assert_eq!(mount["readOnly"], true, "{n}");
        let dir = mount["mountPath"].as_str().unwrap();
        let args: Vec<&str> =
            c["args"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
        for f in flags {
            assert!(
                args.iter().any(|a| a.starts_with(&format!("{f}={dir}/"))),
                "{n}: {f} {args:?}"
            );
        }
        assert!(!args.contains(&"--insecure-no-auth"), "{n}");
        if n != "kjob-queue" {
            assert!(args.contains(&"--queue-url=https://kjob-queue.kjob-system.svc:50051"), "{n}");
        }
        // The view key: the watcher and workers mount it, kjob-queue never does.
        let view_key = pod["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["secret"]["secretName"] == "kjob-view-key"));
        let key_flag = args.iter().find(|a| a.starts_with("--view-key-file="));
        if n == "kjob-queue" {
            assert!(
                view_key.is_none() && key_flag.is_none(),
                "kjob-queue must not hold the view key"
            );
        } else {
            let v = view_key.unwrap_or_else(|| panic!("{n}: no kjob-view-key volume"));
            let m = c["volumeMounts"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["name"] == v["name"]))
                .unwrap_or_else(|| panic!("{n}: kjob-view-key not mounted"));
            assert_eq!(m["readOnly"], true, "{n}");
            let dir = m["mountPath"].as_str().unwrap();
            assert_eq!(key_flag, Some(&format!("--view-key-file={dir}/key").as_str()), "{n}");
        }
    }
}

/// The cert-manager overlay issues every Secret the base mounts (and the inspector's), from
/// one kjob CA, with the role as the CN and the Service's names in the serving certificate.
#[test]
fn cert_manager_overlay_issues_every_mounted_secret() {
    let Some(objs) = render("deploy/overlays/cert-manager") else { return };
    let certs: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "Certificate").collect();
    for (secret, cn, usage) in [
        ("kjob-queue-tls", "kjob-queue", "server auth"),
        ("kjob-watcher-tls", "kjob-watcher", "client auth"),
        ("kjob-worker-tls", "kjob-worker", "client auth"),
        ("kjob-inspector-tls", "kjob-inspector", "client auth"),
    ] {
        let c = certs
            .iter()
            .find(|c| c["spec"]["secretName"] == secret)
            .unwrap_or_else(|| panic!("no Certificate for {secret}"));
        assert_eq!(c["spec"]["commonName"], cn, "{secret}");
        assert_eq!(c["spec"]["issuerRef"]["name"], "kjob-ca", "{secret}");
        assert!(c["spec"]["usages"].as_array().unwrap().iter().any(|u| u == usage), "{secret}");
        assert_eq!(c["metadata"]["namespace"], "kjob-system");
    }
    let server = certs.iter().find(|c| c["spec"]["secretName"] == "kjob-queue-tls").unwrap();
    let names = server["spec"]["dnsNames"].as_array().unwrap();
    assert!(names.iter().any(|n| n == "kjob-queue.kjob-system.svc"), "{names:?}");
    let ca = certs.iter().find(|c| c["spec"]["secretName"] == "kjob-ca").unwrap();
    assert_eq!(ca["spec"]["isCA"], true);
}

/// Every file a container is told to read (a `--…-file=/path` argument, or an env value that is
/// an absolute path) lies under one of its volume mounts, and every mount names a volume of its
/// pod, in every kustomization: an overlay that replaced a list instead of appending to it once
/// dropped kjob-queue's serving certificate (redis-tls and redis-cluster) and nothing noticed.
#[test]
fn every_file_a_container_reads_is_mounted() {
    for dir in KUSTOMIZATIONS {
        let Some(objs) = render(dir) else { continue };
        for w in objs.iter().filter(|o| {
            ["Deployment", "StatefulSet", "Job"].contains(&o["kind"].as_str().unwrap_or(""))
        }) {
            let pod = &w["spec"]["template"]["spec"];
            // A StatefulSet's claim templates are volumes of its pods too.
            let claims = w["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten();
            let volumes: Vec<&str> = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["name"].as_str())
                .chain(claims.filter_map(|c| c["metadata"]["name"].as_str()))
                .collect();
            for c in pod["containers"].as_array().unwrap() {
                let mounts: Vec<(&str, &str)> = c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
                    .collect();
                for (volume, path) in &mounts {
                    assert!(
                        volumes.contains(volume),
                        "{dir}: {} {}: mount {path} names no volume {volume}",
                        w["kind"],
                        name(w)
                    );
                }
                let args = c["args"].as_array().into_iter().flatten().filter_map(|a| {
                    let (flag, value) = a.as_str()?.split_once('=')?;
                    flag.ends_with("-file").then_some(value)
                });
                let envs = c["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["value"].as_str())
                    .filter(|v| v.starts_with('/'));
                for file in args.chain(envs) {
                    assert!(
                        mounts.iter().any(|(_, m)| file.starts_with(&format!("{m}/"))),
                        "{dir}: {} {} container {}: reads {file}, which no volume mount holds \
                         (mounts {mounts:?})",
                        w["kind"],
                        name(w),
                        c["name"]
                    );
                }
            }
        }
    }
}

/// `kubectl kjob` reads kjob-queue's explain API through kube-apiserver's service proxy; the
/// role an admin binds for that grants `get` on the proxy of the kjob-queue Service and nothing
/// else, and deploy/ binds it to no one.
#[test]
fn the_queue_viewer_role_grants_only_get_on_the_queue_service_proxy() {
    let objs = base();
    let role = objs
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "kjob-queue-viewer")
        .expect("ClusterRole kjob-queue-viewer in deploy/base");
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    let r = &rules[0];
    assert_eq!(r["apiGroups"], serde_json::json!([""]));
    assert_eq!(r["resources"], serde_json::json!(["services/proxy"]));
    assert_eq!(r["verbs"], serde_json::json!(["get"]));
    let names: Vec<&str> =
        r["resourceNames"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(names.iter().all(|n| n.contains("kjob-queue")), "{names:?}");
    // The proxy path the plugin uses names the Service's admin port, which must exist.
    assert!(names.contains(&"http:kjob-queue:admin"), "{names:?}");
    let svc = objs
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "kjob-queue")
        .unwrap();
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert!(ports.iter().any(|p| p["name"] == "admin"), "{ports:?}");
    let bound = objs.iter().any(|o| {
        o["kind"].as_str().is_some_and(|k| k.ends_with("Binding"))
            && o["roleRef"]["name"] == "kjob-queue-viewer"
    });
    assert!(!bound, "deploy/ binds kjob-queue-viewer; an admin binds it to readers");
}

/// Every image deploy/ and docker-compose name that kjob does not build is pinned by digest
/// (a tag moves; a digest names the bytes), and all of them name the same Redis. kjob's own
/// images are named by tag and pinned by the installer (docs/operations.md#pin-images-by-digest).
#[test]
fn images_kjob_does_not_build_are_pinned_by_digest() {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let compose: Value = serde_yaml::from_str(&text).unwrap();
    let mut images: Vec<(String, String)> = compose["services"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, s)| s["build"].is_null())
        .map(|(n, s)| (format!("docker-compose {n}"), s["image"].as_str().unwrap().to_string()))
        .collect();
    let dirs: Vec<&str> = if kubectl().is_some() { KUSTOMIZATIONS.to_vec() } else { vec![] };
    for dir in dirs {
        let objs = render(dir).unwrap();
        for (obj, image) in pod_template_images(&objs) {
            images.push((format!("{dir} {obj}"), image));
        }
    }
    if kubectl().is_none() {
        for (obj, image) in pod_template_images(&base()) {
            images.push((format!("deploy/base {obj}"), image));
        }
    }
    let outside: Vec<&(String, String)> =
        images.iter().filter(|(_, i)| binary_of_image(i).is_none()).collect();
    assert!(outside.len() >= 3, "Redis in compose, the base and the cluster overlay: {outside:?}");
    for (at, image) in &outside {
        assert!(pinned_by_digest(image), "{at}: {image} is not pinned by digest");
    }
    let redis: BTreeSet<&str> = outside.iter().map(|(_, i)| i.as_str()).collect();
    assert_eq!(redis.len(), 1, "one Redis image everywhere: {redis:?}");
}
