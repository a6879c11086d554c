//! The real kubectl against kjob-sim and against the real kube-apiserver, with the same
//! commands and the same expectations: apply (client- and server-side), get with columns,
//! get -w, patch with each type, wait, delete with cascade modes, describe.
//!
//! kubectl 1.32 when installed, else `KJOB_KUBECTL` (make test points it at the kubectl built
//! with the control plane); skipped with a visible message when there is neither. The pods the
//! tests create name a scheduler nobody runs, so no kubelet moves them on either server.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::server::TestServer;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";
/// A scheduler no one runs: the test's pods stay where the test puts them on both servers.
const NO_SCHEDULER: &str = "kjob-test-nobody";
/// Upper bound of any single kubectl invocation or wait.
const WAIT: Duration = Duration::from_secs(15);

const JOB_YAML: &str = "apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: pi
        image: perl:5.34
        command: [\"perl\", \"-e\", \"print 1\"]
";

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    cache: tempfile::TempDir,
    dir: tempfile::TempDir,
}

impl Kubectl {
    /// kubectl on `server`, every command in namespace `ns` (created here).
    async fn find(server: &TestServer, ns: &str) -> Option<Kubectl> {
        let bin = Some(PathBuf::from(KUBECTL))
            .filter(|p| p.exists())
            .or_else(|| std::env::var_os("KJOB_KUBECTL").map(PathBuf::from));
        let Some(bin) = bin else {
            eprintln!("SKIPPED: neither {KUBECTL} nor $KJOB_KUBECTL is installed");
            return None;
        };
        server.create_namespace(ns).await;
        Some(Kubectl {
            bin,
            kubeconfig: server.kubeconfig(),
            namespace: ns.to_string(),
            cache: tempfile::tempdir().unwrap(),
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--namespace")
            .arg(&self.namespace)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args);
        cmd.kill_on_drop(true);
        cmd
    }

    /// Runs kubectl; panics unless it exits 0; returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(WAIT, self.command(args).output())
            .await
            .expect("kubectl in time")
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl {args:?} failed: {stdout}{stderr}");
        stdout
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p: PathBuf = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }
}

async fn set_complete(client: &kube::Client, ns: &str, name: &str) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let status = json!({"status": {"startTime": "2025-01-01T00:00:00Z", "completionTime": "2025-01-01T00:01:00Z",
        "succeeded": 1, "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True"},
            {"type": "Complete", "status": "True"}]}});
    jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

async fn apply_get_describe(server: TestServer) {
    let ns = server.namespace("kubectl-apply-get-describe");
    let Some(k) = Kubectl::find(&server, &ns).await else { return };
    let f = k.file("job.yaml", JOB_YAML);
    assert_eq!(k.ok(&["apply", "-f", &f]).await.trim(), "job.batch/pi created");
    assert_eq!(k.ok(&["apply", "-f", &f]).await.trim(), "job.batch/pi unchanged");
    let changed = k.file(
        "job2.yaml",
        &JOB_YAML.replace("  name: pi\n", "  name: pi\n  labels:\n    tier: x\n"),
    );
    assert_eq!(k.ok(&["apply", "-f", &changed]).await.trim(), "job.batch/pi configured");
    assert_eq!(
        k.ok(&["apply", "--server-side", "-f", &f]).await.trim(),
        "job.batch/pi serverside-applied"
    );
    let ssa = k.file("job3.yaml", &JOB_YAML.replace("name: pi", "name: pi-ssa"));
    assert_eq!(
        k.ok(&["apply", "--server-side", "-f", &ssa]).await.trim(),
        "job.batch/pi-ssa serverside-applied"
    );
    let created = k.file("job4.yaml", &JOB_YAML.replace("name: pi", "name: pi-create"));
    assert_eq!(k.ok(&["create", "-f", &created]).await.trim(), "job.batch/pi-create created");

    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "pi-abcde"}, "spec": {"schedulerName": NO_SCHEDULER, "containers": [{"name": "pi", "image": "perl"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let out = k.ok(&["get", "jobs,pods"]).await;
    assert!(
        out.contains("STATUS") && out.contains("COMPLETIONS") && out.contains("DURATION"),
        "{out}"
    );
    assert!(out.contains("job.batch/pi ") && out.contains("Running"), "{out}");
    assert!(out.contains("READY") && out.contains("pod/pi-abcde") && out.contains("0/1"), "{out}");
    let wide = k.ok(&["get", "jobs", "-o", "wide", "-A"]).await;
    assert!(
        wide.contains("NAMESPACE") && wide.contains("SELECTOR") && wide.contains("perl:5.34"),
        "{wide}"
    );
    let desc = k.ok(&["describe", "job", "pi"]).await;
    assert!(
        desc.contains("Name:") && desc.contains("Completions:") && desc.contains("Backoff Limit:"),
        "{desc}"
    );
    let yaml = k.ok(&["get", "job", "pi", "-o", "yaml"]).await;
    assert!(yaml.contains("batch.kubernetes.io/controller-uid"), "{yaml}");
    // The server-side apply of the file without the label: kubectl hands the client-side
    // apply's fields to the server-side manager, which then drops the label it no longer
    // applies.
    assert!(!yaml.contains("tier: x"), "{yaml}");
    // What the migration and the apply leave, the same on both: the annotation under a
    // manager of its own (migrated, so without a time) and the applied fields under `kubectl`;
    // the server rewrote the annotation to the applied file.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pi = serde_json::to_value(jobs.get("pi").await.unwrap()).unwrap();
    let mut owners = pi["metadata"]["managedFields"].clone();
    for e in owners.as_array_mut().unwrap() {
        let timed = e.as_object_mut().unwrap().remove("time").is_some();
        e["timed"] = json!(timed);
    }
    let container = json!({".": {}, "f:command": {}, "f:image": {}, "f:name": {}});
    assert_eq!(
        owners,
        json!([
            {"manager": "kubectl-last-applied", "operation": "Apply", "apiVersion": "batch/v1",
             "fieldsType": "FieldsV1", "timed": false, "fieldsV1": {"f:metadata": {"f:annotations":
                {"f:kubectl.kubernetes.io/last-applied-configuration": {}}}}},
            {"manager": "kubectl", "operation": "Apply", "apiVersion": "batch/v1",
             "fieldsType": "FieldsV1", "timed": true, "fieldsV1": {"f:spec": {"f:template":
                {"f:spec": {"f:containers": {"k:{\"name\":\"pi\"}": container},
                            "f:restartPolicy": {}}}}}}
        ]),
        "{pi}"
    );
    let last = pi["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .unwrap();
    assert!(last.ends_with("}\n") && !last.contains("tier"), "{last}");
}

async fn patch_with_each_type(server: TestServer) {
    let ns = server.namespace("kubectl-patch-with-each-type");
    let Some(k) = Kubectl::find(&server, &ns).await else { return };
    let f = k.file("job.yaml", JOB_YAML);
    k.ok(&["apply", "-f", &f]).await;
    assert_eq!(
        k.ok(&["patch", "job", "pi", "-p", r#"{"metadata":{"labels":{"a":"1"}}}"#]).await.trim(),
        "job.batch/pi patched"
    );
    assert_eq!(
        k.ok(&["patch", "job", "pi", "-p", r#"{"metadata":{"labels":{"a":"1"}}}"#]).await.trim(),
        "job.batch/pi patched (no change)"
    );
    k.ok(&["patch", "job", "pi", "--type=merge", "-p", r#"{"metadata":{"labels":{"b":"2"}}}"#])
        .await;
    k.ok(&[
        "patch",
        "job",
        "pi",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/c","value":"3"}]"#,
    ])
    .await;
    k.ok(&["label", "job", "pi", "d=4"]).await;
    k.ok(&["annotate", "job", "pi", "e=5"]).await;
    let jobs: Api<Job> = Api::namespaced(server.client(), &ns);
    let j = jobs.get("pi").await.unwrap();
    let labels = j.metadata.labels.unwrap();
    for (key, v) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")] {
        assert_eq!(labels.get(key).map(String::as_str), Some(v), "{key}");
    }
    assert_eq!(j.metadata.annotations.unwrap().get("e").map(String::as_str), Some("5"));
}

async fn wait_and_delete_with_cascades(server: TestServer) {
    let ns = server.namespace("kubectl-wait-and-delete-with");
    let Some(k) = Kubectl::find(&server, &ns).await else { return };
    let client = server.client();
    let f = k.file("job.yaml", JOB_YAML);
    k.ok(&["apply", "-f", &f]).await;
    let waiter =
        k.command(&["wait", "--for=condition=complete", "job/pi", "--timeout=15s"]).output();
    let waiter = tokio::spawn(waiter);
    tokio::time::sleep(Duration::from_millis(300)).await;
    set_complete(&client, &ns, "pi").await;
    let out = tokio::time::timeout(WAIT, waiter).await.expect("wait in time").unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "job.batch/pi condition met");
    assert!(k.ok(&["get", "jobs"]).await.contains("Complete"));

    // Orphan: the job's pod stays, without its owner reference.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let owned = |name: &str, j: &Job| -> Pod {
        let mut p: Pod = serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"schedulerName": NO_SCHEDULER, "containers": [{"name": "c", "image": "x"}]}}),
        )
        .unwrap();
        p.metadata.owner_references =
            Some(vec![kube::Resource::controller_owner_ref(j, &()).unwrap()]);
        p
    };
    let j = jobs.get("pi").await.unwrap();
    pods.create(&PostParams::default(), &owned("pi-1", &j)).await.unwrap();
    assert_eq!(
        k.ok(&["delete", "job", "pi", "--cascade=orphan"]).await.trim(),
        "job.batch \"pi\" deleted"
    );
    assert!(jobs.get_opt("pi").await.unwrap().is_none());
    assert!(pods.get("pi-1").await.unwrap().metadata.owner_references.is_none());

    // Background: the GC removes the pod after the job.
    k.ok(&["apply", "-f", &f]).await;
    let j = jobs.get("pi").await.unwrap();
    pods.create(&PostParams::default(), &owned("pi-2", &j)).await.unwrap();
    assert_eq!(
        k.ok(&["delete", "job", "pi", "--cascade=background"]).await.trim(),
        "job.batch \"pi\" deleted"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while pods.get_opt("pi-2").await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "pod not collected");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(pods.get_opt("pi-1").await.unwrap().is_some(), "the orphan is untouched");
}

async fn get_watch_sees_changes(server: TestServer) {
    let ns = server.namespace("kubectl-get-watch-sees-chang");
    let Some(k) = Kubectl::find(&server, &ns).await else { return };
    let mut child = k
        .command(&["get", "pods", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pods: Api<Pod> = Api::namespaced(server.client(), &ns);
    // Created once kubectl is watching (it prints nothing for an empty namespace): retry until seen.
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "w"}, "spec": {"schedulerName": NO_SCHEDULER, "containers": [{"name": "c", "image": "x"}]}}),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let first =
        tokio::time::timeout(WAIT, lines.next_line()).await.expect("header").unwrap().unwrap();
    let mut seen = vec![first];
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status("w", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    while !seen.iter().any(|l| l.starts_with("w ") && l.contains("Running")) {
        let l = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("watch line in time")
            .unwrap()
            .unwrap();
        seen.push(l);
    }
    assert!(seen.iter().any(|l| l.contains("Pending")), "{seen:?}");
    let _ = child.kill().await;
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    apply_get_describe, patch_with_each_type, wait_and_delete_with_cascades, get_watch_sees_changes);
