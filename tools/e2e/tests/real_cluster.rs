//! kjob on the real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler built from Go modules, kjob-node-agent as kubelet): the demo's example Jobs
//! run to their expected outcomes with the watcher and workers on their own ServiceAccounts, and
//! the audit log shows that RBAC refused none of kjob's requests and the server rejected none of
//! its writes as invalid.
//!
//! The control plane is the one `make test` shares through `KJOB_TEST_CLUSTER`, or one started
//! for this test. Without any Go toolchain the test says so and passes without running.

use std::collections::BTreeMap;
use std::process::Command;

use kjob_testkit::cluster::{TestCluster, test_cluster};
use serde_json::Value;

fn cluster() -> Option<TestCluster> {
    test_cluster().expect("the real control plane (cluster/build.sh, kjob-cluster)")
}

/// Requests of kjob's ServiceAccounts in the audit log, counted by (user, verb, resource, code).
fn kjob_requests(log: &str, namespace: &str) -> BTreeMap<(String, String, String, i64), usize> {
    let mut out = BTreeMap::new();
    for e in log.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
        let ns = e["objectRef"]["namespace"].as_str().unwrap_or_default();
        let name = e["objectRef"]["name"].as_str().unwrap_or_default();
        // This test's namespace, and its watcher's Lease in kjob-system.
        if ns != namespace && !name.ends_with(namespace) {
            continue;
        }
        let mut resource = e["objectRef"]["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = e["objectRef"]["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let key = (
            e["user"]["username"].as_str().unwrap_or_default().to_string(),
            e["verb"].as_str().unwrap_or_default().to_string(),
            resource,
            e["responseStatus"]["code"].as_i64().unwrap_or_default(),
        );
        *out.entry(key).or_default() += 1;
    }
    out
}

#[test]
fn demo_examples_finish_as_expected_on_the_real_control_plane() {
    let Some(cluster) = cluster() else { return };
    let info = cluster.info();
    let demo = kjob_testkit::bin_path("kjob-demo").expect("kjob-demo binary");
    let run_dir = tempfile::tempdir().unwrap();
    let namespace = format!("e2e-demo-{}", std::process::id());
    let out = Command::new(&demo)
        .arg(format!("--cluster={}", info.dir.display()))
        .arg(format!("--run-dir={}", run_dir.path().display()))
        .arg(format!("--namespace={namespace}"))
        .arg("--timeout=240s")
        .arg("--plain")
        .output()
        .expect("run kjob-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kjob-demo on the real control plane: {}", out.status);
    // The demo names its namespace `<namespace>-<unix time>`.
    let ns = stdout
        .lines()
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with(&format!("{namespace}-"))))
        .map(|w| w.split('/').next().unwrap_or(w).to_string())
        .expect("the demo printed its namespace");

    let log = std::fs::read_to_string(&info.audit_log).expect("audit log");
    let requests = kjob_requests(&log, &ns);
    println!("kjob's requests in {ns} (user, verb, resource, code) -> count:");
    for (k, n) in &requests {
        println!("  {k:?} {n}");
    }
    assert!(
        requests
            .keys()
            .any(|(u, v, r, _)| u.ends_with(":kjob-worker") && v == "create" && r == "pods"),
        "the audit log holds the workers' pod creates"
    );
    let refused: Vec<_> =
        requests.iter().filter(|((_, _, _, code), _)| *code == 403 || *code == 422).collect();
    assert!(refused.is_empty(), "requests refused by RBAC (403) or validation (422): {refused:?}");
    let forbidden = info.forbidden_requests().unwrap();
    assert!(
        forbidden.is_empty(),
        "RBAC forbid decisions for kjob's ServiceAccounts: {forbidden:?}"
    );
}
