//! charts/kjob: rendered by Helm (built from its Go module, `cluster/build-helm.sh`), its
//! defaults give exactly the objects `kubectl kustomize deploy/base` gives — kind for kind, name
//! for name, spec for spec, Helm's own labels aside — and its choices give what the overlays
//! give (HPA, cert-manager) or what the base would be with the choice made (manage-all, an
//! external Redis, replicas and worker settings). Then the chart is installed on a real control
//! plane of its own and uninstalled.
//!
//! Without a Go toolchain (Helm cannot be built) or kubectl (kustomize cannot render) the tests
//! say so and pass without running, as the other real-server suites do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kjob_e2e::*;
use kjob_testkit::Program;
use kjob_testkit::cluster::{self, ClusterInfo, ClusterOptions, ControlPlane, KJOB_NAMESPACE};
use serde_json::{Value, json};

/// Labels Helm's chart adds to every object's metadata beside the ones deploy/base sets.
const HELM_LABELS: [&str; 3] =
    ["app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"];

/// Helm and kubectl, or why a test cannot run.
fn tools() -> Option<(PathBuf, PathBuf)> {
    if !cluster::go_available() {
        eprintln!("SKIPPED helm_chart: no Go toolchain on PATH, so Helm cannot be built");
        return None;
    }
    let Some(kubectl) = kubectl() else {
        eprintln!("SKIPPED helm_chart: no kubectl (set KJOB_KUBECTL or install kubectl)");
        return None;
    };
    Some((cluster::build_helm().expect("cluster/build-helm.sh"), kubectl))
}

/// `helm template` of charts/kjob into kjob-system with `sets`; its stderr when it fails.
fn helm_template(helm: &Path, sets: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "kjob"]).arg(root().join("charts/kjob"));
    cmd.args(["--namespace", KJOB_NAMESPACE]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("running helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(parse_docs(&String::from_utf8(out.stdout).unwrap()).unwrap())
}

/// Objects by (kind, name), Helm's labels taken off.
fn by_key(objs: Vec<Value>) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for mut o in objs {
        if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
            for l in HELM_LABELS {
                labels.remove(l);
            }
        }
        let key = (o["kind"].as_str().unwrap().to_string(), name(&o).to_string());
        assert!(out.insert(key.clone(), o).is_none(), "{key:?} rendered twice");
    }
    out
}

/// Asserts two renders hold the same objects with the same content, naming the first that
/// differs.
fn assert_same(what: &str, helm: Vec<Value>, expected: Vec<Value>) {
    let (h, k) = (by_key(helm), by_key(expected));
    let hk: Vec<_> = h.keys().collect();
    let kk: Vec<_> = k.keys().collect();
    assert_eq!(hk, kk, "{what}: the chart renders other objects than kustomize");
    for (key, obj) in &h {
        assert_eq!(
            obj,
            &k[key],
            "{what}: {key:?} differs:\nhelm:\n{}\nkustomize:\n{}",
            serde_yaml::to_string(obj).unwrap(),
            serde_yaml::to_string(&k[key]).unwrap()
        );
    }
}

fn container_args<'a>(objs: &'a [Value], kind: &str, workload: &str) -> Vec<&'a str> {
    let w = objs
        .iter()
        .find(|o| o["kind"] == kind && name(o) == workload)
        .unwrap_or_else(|| panic!("no {kind} {workload}"));
    w["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

#[test]
fn default_values_render_exactly_deploy_base() {
    let Some((helm, kubectl)) = tools() else { return };
    let chart = helm_template(&helm, &[]).unwrap();
    // The Helm labels are there, on every object.
    for o in &chart {
        for l in HELM_LABELS {
            assert!(o["metadata"]["labels"][l].is_string(), "{} has no label {l}", name(o));
        }
    }
    assert_same("defaults", chart, kustomize(&kubectl, "deploy/base").unwrap());
}

#[test]
fn the_hpa_redis_tls_and_cert_manager_choices_render_their_overlays() {
    let Some((helm, kubectl)) = tools() else { return };
    assert_same(
        "hpa.enabled",
        helm_template(&helm, &["hpa.enabled=true"]).unwrap(),
        kustomize(&kubectl, "deploy/overlays/hpa").unwrap(),
    );
    assert_same(
        "redis.tls.enabled",
        helm_template(&helm, &["redis.tls.enabled=true"]).unwrap(),
        kustomize(&kubectl, "deploy/overlays/redis-tls").unwrap(),
    );
    assert_same(
        "certManager.enabled",
        helm_template(&helm, &["certManager.enabled=true"]).unwrap(),
        kustomize(&kubectl, "deploy/overlays/cert-manager").unwrap(),
    );
}

#[test]
fn manage_all_replicas_and_worker_settings_change_only_their_fields() {
    let Some((helm, kubectl)) = tools() else { return };
    let sets = [
        "manageAllJobs=true",
        "queue.replicas=3",
        "watcher.replicas=1",
        "worker.replicas=7",
        "worker.concurrency=9",
        "worker.kubeQps=20",
        "worker.kubeBurst=30",
        "worker.apiQpsTotal=20",
        "worker.apiBurstTotal=0",
        "worker.extraArgs={--log-level=debug}",
        "image.registry=registry.example/batch",
        "image.tag=1.2.3",
        "namespace.create=false",
    ];
    let chart = helm_template(&helm, &sets).unwrap();
    // The base with the same choices made by hand.
    let mut base = kustomize(&kubectl, "deploy/base").unwrap();
    base.retain(|o| o["kind"] != "Namespace");
    for o in &mut base {
        if o["kind"] != "Deployment" {
            continue;
        }
        let n = name(o).to_string();
        let replicas = match n.as_str() {
            "kjob-queue" => 3,
            "kjob-watcher" => 1,
            _ => 7,
        };
        o["spec"]["replicas"] = json!(replicas);
        let c = &mut o["spec"]["template"]["spec"]["containers"][0];
        c["image"] = json!(format!("registry.example/batch/{n}:1.2.3"));
        let args = c["args"].as_array_mut().unwrap();
        if n == "kjob-worker" {
            for a in args.iter_mut() {
                let s = a.as_str().unwrap();
                let new = match s.split('=').next().unwrap() {
                    "--concurrency" => "--concurrency=9",
                    "--kube-qps" => "--kube-qps=20",
                    "--kube-burst" => "--kube-burst=30",
                    "--api-qps-total" => "--api-qps-total=20",
                    // A burst of 0 (unset) defaults to the total.
                    "--api-burst-total" => "--api-burst-total=20",
                    _ => continue,
                };
                *a = json!(new);
            }
        }
        if n != "kjob-queue" {
            args.push(json!("--manage-all-jobs"));
        }
        if n == "kjob-worker" {
            args.push(json!("--log-level=debug"));
        }
    }
    assert_same("choices", chart, base);
    // A total of 0 turns the shared budget off: no budget flags.
    let off = helm_template(&helm, &["worker.apiQpsTotal=0"]).unwrap();
    let args = container_args(&off, "Deployment", "kjob-worker");
    assert!(args.iter().all(|a| !a.starts_with("--api-")), "{args:?}");
}

#[test]
fn an_external_redis_drops_the_bundled_one_and_is_required() {
    let Some((helm, _)) = tools() else { return };
    let err = helm_template(&helm, &["redis.bundled=false"]).unwrap_err();
    assert!(err.contains("redis.url is required"), "{err}");
    let url = "rediss://redis.example:6380";
    let chart = helm_template(
        &helm,
        &["redis.bundled=false", &format!("redis.url={url}"), "redis.port=6380"],
    )
    .unwrap();
    let redis: Vec<_> = chart.iter().filter(|o| name(o) == "kjob-redis").collect();
    assert!(redis.is_empty(), "bundled Redis objects rendered: {redis:?}");
    assert!(chart.iter().all(|o| name(o) != "kjob-redis-acl"));
    let args = container_args(&chart, "Deployment", "kjob-queue");
    assert!(args.contains(&format!("--redis-url={url}").as_str()), "{args:?}");
    // kjob-queue may reach the external port, on any address, and nothing else.
    let pol =
        chart.iter().find(|o| o["kind"] == "NetworkPolicy" && name(o) == "kjob-queue").unwrap();
    assert_eq!(pol["spec"]["egress"], json!([{"ports": [{"port": 6380, "protocol": "TCP"}]}]));
    // With TLS on, kjob-queue verifies the external Redis against the Secret's CA.
    let chart = helm_template(
        &helm,
        &["redis.bundled=false", &format!("redis.url={url}"), "redis.tls.enabled=true"],
    )
    .unwrap();
    let queue =
        chart.iter().find(|o| o["kind"] == "Deployment" && name(o) == "kjob-queue").unwrap();
    let c = &queue["spec"]["template"]["spec"]["containers"][0];
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "KJOB_REDIS_CA_FILE", "value": "/tls/ca.crt"})),
        "{}",
        c["env"]
    );
    assert!(chart.iter().all(|o| name(o) != "kjob-redis"));
}

#[test]
fn image_digests_pin_kjob_images_and_nothing_else_changes() {
    let Some((helm, kubectl)) = tools() else { return };
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let chart = helm_template(&helm, &[&format!("image.digests.kjob-worker={digest}")]).unwrap();
    let mut base = kustomize(&kubectl, "deploy/base").unwrap();
    for o in &mut base {
        if o["kind"] == "Deployment" && name(o) == "kjob-worker" {
            let c = &mut o["spec"]["template"]["spec"]["containers"][0];
            let pinned = format!("{}@{digest}", c["image"].as_str().unwrap());
            c["image"] = json!(pinned);
        }
    }
    assert_same("worker digest", chart, base);
    // Not a digest: refused, naming the value, rather than rendering an image no node can pull.
    for bad in [
        "sha256:abc",
        "latest",
        "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        let err = helm_template(&helm, &[&format!("image.digests.kjob-queue={bad}")]).unwrap_err();
        assert!(err.contains("image.digests.kjob-queue must be sha256:"), "{bad}: {err}");
    }
}

#[test]
fn the_prometheus_rule_is_the_rules_file_behind_a_value() {
    let Some((helm, _)) = tools() else { return };
    // Off by default (the default render is deploy/base's, checked above).
    let off = helm_template(&helm, &[]).unwrap();
    assert!(off.iter().all(|o| o["kind"] != "PrometheusRule"));
    let on = helm_template(
        &helm,
        &["prometheusRule.enabled=true", "prometheusRule.labels.release=prom"],
    )
    .unwrap();
    let rules: Vec<&Value> = on.iter().filter(|o| o["kind"] == "PrometheusRule").collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    let r = rules[0];
    assert_eq!(r["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!((name(r), r["metadata"]["namespace"].as_str()), ("kjob", Some(KJOB_NAMESPACE)));
    assert_eq!(r["metadata"]["labels"]["release"], "prom");
    assert_eq!(r["metadata"]["labels"]["app.kubernetes.io/part-of"], "kjob");
    // Its spec is deploy/prometheus/kjob-rules.yaml, unchanged (Helm does not template the
    // rules' own {{ $labels }}).
    let file: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("deploy/prometheus/kjob-rules.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(r["spec"], file);
    assert!(r["spec"]["groups"][0]["rules"].as_array().unwrap().len() > 3);
    // Everything else renders as without it.
    assert_eq!(on.len(), off.len() + 1);
}

/// How long the Deployments' pods may take to be created on a fresh, loaded control plane.
const PODS_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn the_chart_installs_on_the_real_control_plane_and_uninstalls() {
    let Some((helm, kubectl)) = tools() else { return };
    let dir = tempfile::Builder::new().prefix("kjob-helm-").tempdir().unwrap();
    let cluster_dir = dir.path().join("cluster");
    let agent = kjob_testkit::bin_path("kjob-node-agent").expect("cargo build --bins");
    let mut opts = ClusterOptions::new(cluster_dir.clone(), agent);
    opts.nodes = 2;
    // The Deployments' controllers too (the harness runs only the ones Job tests need; a
    // repeated --controllers adds to the list).
    opts.extra_args.add(
        Program::KubeControllerManager,
        ["--controllers=deployment-controller,replicaset-controller"],
    );
    let _cp = ControlPlane::start(opts).expect("a control plane of its own");
    let info = ClusterInfo::read(&cluster_dir).unwrap();
    let kc = info.kubeconfig.display().to_string();
    // The control plane's bootstrap already made kjob-system with kjob's ServiceAccounts and
    // deploy/base's RBAC (for the stacks tests start); the chart takes those objects over.
    let out = run_ok(
        Command::new(&helm)
            .args(["install", "kjob"])
            .arg(root().join("charts/kjob"))
            .args(["--namespace", KJOB_NAMESPACE, "--kubeconfig", &kc, "--take-ownership"])
            .args(["--set", "hpa.enabled=true", "--wait=false"]),
    );
    assert!(out.contains("STATUS: deployed"), "{out}");
    // Every object the chart renders is on the server (server-side validation and admission
    // passed), each with the release's labels.
    let rendered = helm_template(&helm, &["hpa.enabled=true"]).unwrap();
    for o in &rendered {
        let kind = o["kind"].as_str().unwrap();
        let mut cmd = Command::new(&kubectl);
        cmd.args(["--kubeconfig", &kc, "get", kind, name(o), "-o", "json"]);
        if !["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&kind) {
            cmd.args(["-n", KJOB_NAMESPACE]);
        }
        let live: Value = serde_json::from_str(&run_ok(&mut cmd)).unwrap();
        assert_eq!(live["metadata"]["labels"]["app.kubernetes.io/instance"], "kjob", "{kind}");
    }
    // The Deployments' pods get created: their templates pass the namespace's restricted Pod
    // Security level (the kubelet here is the node agent; the images are never pulled).
    let deadline = Instant::now() + PODS_TIMEOUT;
    let want = [("kjob-queue", 2), ("kjob-watcher", 2), ("kjob-worker", 3)];
    loop {
        let pods: Value = serde_json::from_str(&run_ok(Command::new(&kubectl).args([
            "--kubeconfig",
            &kc,
            "get",
            "pods",
            "-n",
            KJOB_NAMESPACE,
            "-o",
            "json",
        ])))
        .unwrap();
        let count = |app: &str| {
            pods["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/name"] == app)
                .count()
        };
        let have: Vec<_> = want.iter().map(|(app, _)| (*app, count(app))).collect();
        if want.iter().all(|(app, n)| count(app) >= *n) {
            break;
        }
        if Instant::now() > deadline {
            let events = run_ok(Command::new(&kubectl).args([
                "--kubeconfig",
                &kc,
                "get",
                "events",
                "-n",
                KJOB_NAMESPACE,
            ]));
            panic!("pods per Deployment {have:?}, want {want:?}; events:\n{events}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = run_ok(Command::new(&helm).args([
        "uninstall",
        "kjob",
        "--namespace",
        KJOB_NAMESPACE,
        "--kubeconfig",
        &kc,
        "--wait=false",
    ]));
    assert!(out.contains("uninstalled"), "{out}");
    let left = Command::new(&kubectl)
        .args(["--kubeconfig", &kc, "get", "clusterrole", "kjob-worker"])
        .output()
        .unwrap();
    assert!(!left.status.success(), "ClusterRole kjob-worker left after uninstall");
}
