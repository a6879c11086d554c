//! `kubectl kjob` on the real control plane with the whole kjob stack: a ResourceQuota of 0
//! pods makes every sync of a Job fail, so the Job goes into request backoff; then
//! `kubectl kjob explain job` (kubectl's plugin discovery finding `kubectl-kjob` on PATH) shows
//! its failures, the error and the next retry, and `kubectl kjob top` its namespace.
//!
//! The plugin is run with `--queue-admin-url` (the stack's kjob-queue admin port on loopback).
//! Its default path, kube-apiserver's service proxy, is not exercised: a Service's endpoints may
//! not name loopback, and with the admin port relayed from this machine's other address
//! (192.0.2.2) kube-apiserver's proxied call did not answer within 15 s in this sandbox, so that
//! path is left to a cluster whose pods kube-apiserver can reach.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ResourceQuota;
use kjob_testkit::server::TestServer;
use kjob_testkit::stack::{Stack, StackConfig};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// Longest any step may take on a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(90);

async fn stack(server: &TestServer, ns: &str) -> (Stack, kube::Client, tempfile::TempDir) {
    let run_dir = tempfile::Builder::new().prefix("kjob-plugin-").tempdir().unwrap();
    let bin = kjob_testkit::bin_path("kjob-sim").expect("cargo build --bins");
    let redis = kjob_testkit::redis::redis_server_binary().expect("redis-server");
    let cfg =
        StackConfig::new(bin.parent().unwrap().to_path_buf(), redis, run_dir.path().into(), 1);
    let stack = server.start_stack(ns, cfg).await.expect("stack");
    let kc = kube::config::Kubeconfig::read_from(&stack.kubeconfig).unwrap();
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap(),
    )
    .unwrap();
    (stack, client, run_dir)
}

/// Runs `kubectl kjob <args>` with `kubectl-kjob` on PATH; (success, stdout, stderr).
fn kubectl_kjob(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let plugin = kjob_testkit::bin_path("kubectl-kjob").expect("cargo build --bins");
    let dir: PathBuf = plugin.parent().unwrap().to_path_buf();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new(kubectl)
        .arg("kjob")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_kjob_explains_a_job_in_backoff() {
    let Some(server) = TestServer::real().await else { return };
    let info = server.cluster().unwrap();
    let kubectl = info.bin_dir.join("kubectl");
    let kubeconfig = info.kubeconfig.clone();
    let ns = server.namespace("plugin");
    let (kjob, client, _dir) = stack(&server, &ns).await;
    let admin_url = kjob.admin_url(kjob_testkit::stack::QUEUE).expect("kjob-queue admin port");

    let pp = PostParams::default();
    let quota: ResourceQuota = serde_json::from_value(
        json!({"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "0"}}}),
    )
    .unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    quotas.create(&pp, &quota).await.unwrap();
    let deadline = tokio::time::Instant::now() + STEP;
    while quotas.get("pods").await.ok().and_then(|q| q.status?.hard).is_none() {
        assert!(tokio::time::Instant::now() < deadline, "the quota never got its status");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "stuck"},
        "spec": {"managedBy": kjob_core::DEFAULT_CONTROLLER_NAME, "template": {
            "spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}}}
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), &ns).create(&pp, &job).await.unwrap();

    let target_args = [format!("--queue-admin-url={admin_url}")];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter().map(|a| a.to_string()).chain(target_args.iter().cloned()).collect()
    };

    // Two failed syncs: the second waits 2 s, the third 4 s (1 s doubling).
    let explain_args = with(&["explain", "job", "stuck", "-n", &ns, "-o", "json"]);
    let mut last: String;
    let x: Value = loop {
        let args: Vec<&str> = explain_args.iter().map(String::as_str).collect();
        let (ok, out, err) =
            tokio::task::block_in_place(|| kubectl_kjob(&kubectl, &kubeconfig, &args));
        if ok {
            let v: Value = serde_json::from_str(&out).unwrap();
            if v["reason_code"] == "request_backoff" && v["backoff"]["failures"].as_u64() >= Some(2)
            {
                break v;
            }
            last = out;
        } else {
            last = err;
        }
        assert!(tokio::time::Instant::now() < deadline + STEP, "never in backoff; last: {last}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(x["state"], "delayed", "{x}");
    let failures = x["backoff"]["failures"].as_i64().unwrap();
    // The backoff the status implies: 1 s doubled per earlier failure (capped at 60 s), from the
    // last failed sync; the due time is within 1 s of it.
    let implied_ms = (1000i64 << (failures - 1).min(6)).min(60_000);
    let last_at = x["last_sync"]["at_unix_ms"].as_i64().unwrap();
    let due_ms = x["due_unix_ms"].as_i64().unwrap();
    assert!(
        (due_ms - (last_at + implied_ms)).abs() < 1000,
        "due {due_ms}, implied {implied_ms}: {x}"
    );
    let due_in = x["due_in_seconds"].as_f64().unwrap();
    assert!(due_in > 0.0 && due_in <= implied_ms as f64 / 1000.0, "{x}");
    assert_eq!(
        x["backoff"]["next_delay_seconds"].as_f64(),
        Some((implied_ms * 2).min(60_000) as f64 / 1000.0)
    );
    let error = x["last_sync"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("exceeded quota"), "{x}");

    // The readable form says the same.
    let text_args = with(&["explain", "job", "stuck", "-n", &ns]);
    let args: Vec<&str> = text_args.iter().map(String::as_str).collect();
    let (ok, out, err) = tokio::task::block_in_place(|| kubectl_kjob(&kubectl, &kubeconfig, &args));
    assert!(ok, "{err}");
    for want in [
        "State:        delayed",
        "(request_backoff)",
        "Next retry:   in ",
        "failed syncs",
        "exceeded quota",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }

    // top lists the namespace; a Job nobody queued is an error naming it.
    let top_args = with(&["top"]);
    let args: Vec<&str> = top_args.iter().map(String::as_str).collect();
    let (ok, out, err) = tokio::task::block_in_place(|| kubectl_kjob(&kubectl, &kubeconfig, &args));
    assert!(ok && out.lines().any(|l| l.starts_with(&ns)), "{out}{err}");
    let missing_args = with(&["explain", "job", "nobody", "-n", &ns]);
    let args: Vec<&str> = missing_args.iter().map(String::as_str).collect();
    let (ok, _, err) = tokio::task::block_in_place(|| kubectl_kjob(&kubectl, &kubeconfig, &args));
    assert!(!ok && err.contains("404") && err.contains("nobody"), "{err}");
}
