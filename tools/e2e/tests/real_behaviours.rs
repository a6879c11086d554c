//! What users meet on a real cluster, with the whole kjob stack running: a ResourceQuota
//! refusing pod creates, an eviction through the Eviction API matched by a podFailurePolicy
//! Ignore rule, and Job deletion with each propagation policy. Each runs on the real control
//! plane (garbage collector, quota controller and admission, eviction subresource of
//! kube-apiserver) and, for comparison, on kjob-sim.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, ResourceQuota};
use kjob_testkit::server::TestServer;
use kjob_testkit::stack::{Stack, StackConfig};
use kube::Api;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Longest any step may take on a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(60);

async fn stack(server: &TestServer, ns: &str) -> (Stack, kube::Client, tempfile::TempDir) {
    let run_dir = tempfile::Builder::new().prefix("kjob-behaviour-").tempdir().unwrap();
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

fn job(name: &str, run_time: &str, spec: serde_json::Value) -> Job {
    let mut j = json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"managedBy": kjob_core::DEFAULT_CONTROLLER_NAME, "template": {
            "metadata": {"annotations": {"kjob.io/sim-run-time": run_time}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}
    });
    for (k, v) in spec.as_object().unwrap() {
        j["spec"][k] = v.clone();
    }
    serde_json::from_value(j).unwrap()
}

/// Creates `job(name, run_time, spec)` through `jobs`.
async fn create_job(jobs: &Api<Job>, name: &str, run_time: &str, spec: serde_json::Value) -> Job {
    jobs.create(&PostParams::default(), &job(name, run_time, spec)).await.unwrap()
}

async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn condition(job: &Job, ty: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty && c.status == "True"))
}

fn job_pods(name: &str) -> ListParams {
    ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}"))
}

/// Waits until `n` pods of Job `job` run.
async fn wait_running(pods: &Api<Pod>, job: &str, n: usize) {
    eventually(&format!("{n} running pods of {job}"), || async {
        let items = pods.list(&job_pods(job)).await.ok()?.items;
        let running = items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        (running == n).then_some(())
    })
    .await;
}

/// A quota of 0 pods refuses every create: FailedCreate warnings with the server's reason, no
/// pod; raised, the Job runs to Complete.
async fn quota_refuses_creates_until_raised(server: TestServer) {
    let ns = server.namespace("quota");
    let (kjob, client, _dir) = stack(&server, &ns).await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    if server.is_real() {
        let q = serde_json::from_value(
            json!({"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "0"}}}),
        )
        .unwrap();
        quotas.create(&PostParams::default(), &q).await.unwrap();
        eventually("the quota's usage", || async {
            quotas.get("pods").await.ok()?.status?.hard.filter(|h| h.contains_key("pods"))
        })
        .await;
    } else {
        server.as_sim().unwrap();
        // The stack's own kjob-sim takes faults over HTTP.
        let (code, _) = tokio::task::block_in_place(|| {
            kjob.sim_post("/sim/faults", r#"{"podQuotaExceeded": true}"#)
        })
        .unwrap();
        assert_eq!(code, 200);
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    create_job(&jobs, "q", "500ms", json!({"completions": 3, "parallelism": 3})).await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let refused = eventually("a FailedCreate event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| e.reason.as_deref() == Some("FailedCreate"))
    })
    .await;
    assert_eq!(refused.type_.as_deref(), Some("Warning"));
    let msg = refused.message.clone().unwrap_or_default();
    assert!(msg.starts_with("Error creating: ") && msg.contains("exceeded quota"), "{msg}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.list(&job_pods("q")).await.unwrap().items.is_empty(),
        "a refused create left a pod"
    );
    if server.is_real() {
        let raise = json!({"spec": {"hard": {"pods": "10"}}});
        quotas.patch("pods", &PatchParams::default(), &Patch::Merge(&raise)).await.unwrap();
    } else {
        let (code, _) = tokio::task::block_in_place(|| {
            kjob.sim_post("/sim/faults", r#"{"podQuotaExceeded": false}"#)
        })
        .unwrap();
        assert_eq!(code, 200);
    }
    let done = eventually("the Job Complete after the quota was raised", || async {
        jobs.get("q").await.ok().filter(|j| condition(j, "Complete"))
    })
    .await;
    assert_eq!(done.status.as_ref().unwrap().succeeded, Some(3));
}

/// A pod evicted through the Eviction API gets DisruptionTarget from the server; an Ignore rule
/// on that condition neither counts the failure nor fails the Job (backoffLimit 0).
async fn eviction_is_ignored_by_pod_failure_policy(server: TestServer) {
    let ns = server.namespace("evict");
    let (_stack, client, _dir) = stack(&server, &ns).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let spec = json!({"backoffLimit": 0, "podFailurePolicy": {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]}});
    create_job(&jobs, "ev", "4s", spec).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let first = eventually("a running pod", || async {
        pods.list(&job_pods("ev"))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let name = first.metadata.name.clone().unwrap();
    pods.evict(&name, &EvictParams::default()).await.expect("eviction");
    let done = eventually("the Job Complete", || async {
        jobs.get("ev").await.ok().filter(|j| condition(j, "Complete") || condition(j, "Failed"))
    })
    .await;
    assert!(condition(&done, "Complete"), "{:?}", done.status);
    let s = done.status.as_ref().unwrap();
    assert_eq!((s.succeeded, s.failed.unwrap_or(0)), (Some(1), 0), "{s:?}");
}

/// Deleting a Job with each propagation policy: Background and Foreground take its pods along,
/// Orphan leaves them running without the owner reference; in every case no pod keeps the
/// tracking finalizer (kjob removes it from pods whose Job is gone or going).
async fn job_deletion_propagates(server: TestServer) {
    let ns = server.namespace("propagation");
    let (_stack, client, _dir) = stack(&server, &ns).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, dp) in [
        ("bg", DeleteParams::background()),
        ("fg", DeleteParams::foreground()),
        ("orphan", DeleteParams::orphan()),
    ] {
        create_job(&jobs, name, "never", json!({"parallelism": 2, "completions": 2})).await;
        wait_running(&pods, name, 2).await;
        jobs.delete(name, &dp).await.unwrap();
        eventually("the Job gone", || async {
            jobs.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
        let left = eventually("the pods settled", || async {
            let items = pods.list(&job_pods(name)).await.ok()?.items;
            let fin = items.iter().any(|p| {
                p.metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == kjob_core::JOB_TRACKING_FINALIZER)
            });
            let settled = if name == "orphan" { items.len() == 2 } else { items.is_empty() };
            (!fin && settled).then_some(items)
        })
        .await;
        for p in &left {
            assert!(
                p.metadata.owner_references.as_ref().is_none_or(|o| o.is_empty()),
                "{name}: {p:?}"
            );
            assert!(p.metadata.deletion_timestamp.is_none(), "orphans are not deleted");
        }
    }
}

/// A Job deleted while no watcher leads: its pods keep the tracking finalizer (the garbage
/// collector marks them for deletion, nothing removes the finalizer) until a watcher starts
/// leading, sends them to the orphan queue from its initial list, and a worker removes it.
async fn pods_of_a_job_deleted_while_no_watcher_led_are_released(server: TestServer) {
    let ns = server.namespace("leaderless");
    let (mut kjob, client, _dir) = stack(&server, &ns).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create_job(&jobs, "gone", "never", json!({"parallelism": 2, "completions": 2})).await;
    wait_running(&pods, "gone", 2).await;
    let watcher = kjob.watchers()[0].clone();
    tokio::task::block_in_place(|| kjob.kill(&watcher)).unwrap();
    jobs.delete("gone", &DeleteParams::background()).await.unwrap();
    eventually("the Job gone and its pods terminating", || async {
        let gone = jobs.get_opt("gone").await.ok()?.is_none();
        let items = pods.list(&job_pods("gone")).await.ok()?.items;
        let terminating = items.iter().all(|p| p.metadata.deletion_timestamp.is_some());
        (gone && items.len() == 2 && terminating).then_some(())
    })
    .await;
    // Nobody leads: the pods stay, held by the tracking finalizer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = pods.list(&job_pods("gone")).await.unwrap().items;
    assert_eq!(held.len(), 2, "pods without a leading watcher: {held:?}");
    // The watcher takes the Lease again (after the killed holder's Lease expires).
    tokio::task::block_in_place(|| kjob.restart(&watcher)).unwrap();
    eventually("the pods released and gone", || async {
        pods.list(&job_pods("gone")).await.ok()?.items.is_empty().then_some(())
    })
    .await;
}

/// A pod of an Indexed Job that carries the completion-index label but not the annotation is
/// index-less, as upstream's getCompletionIndex reads only the annotation: kjob deletes it and
/// creates index 0 properly (the label-only pod runs forever, so counting it as index 0 would
/// never finish the Job).
async fn label_only_index_pod_is_replaced(server: TestServer) {
    let ns = server.namespace("labelindex");
    let (_kjob, client, _dir) = stack(&server, &ns).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let spec =
        json!({"completionMode": "Indexed", "completions": 1, "parallelism": 1, "suspend": true});
    let created = create_job(&jobs, "li", "500ms", spec).await;
    let uid = created.metadata.uid.clone().unwrap();
    let owner = kube::Resource::controller_owner_ref(&created, &()).unwrap();
    let stray: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "li-stray",
            "labels": {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                       "batch.kubernetes.io/job-name": "li", "job-name": "li",
                       "batch.kubernetes.io/job-completion-index": "0"},
            "annotations": {"kjob.io/sim-run-time": "never"},
            "finalizers": [kjob_core::JOB_TRACKING_FINALIZER],
            "ownerReferences": [owner],
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &stray).await.unwrap();
    let resume = json!({"spec": {"suspend": false}});
    jobs.patch("li", &PatchParams::default(), &Patch::Merge(&resume)).await.unwrap();
    let done = eventually("the Job Complete", || async {
        jobs.get("li").await.ok().filter(|j| condition(j, "Complete"))
    })
    .await;
    assert_eq!(done.status.as_ref().unwrap().completed_indexes.as_deref(), Some("0"));
    let stray = pods.get_opt("li-stray").await.unwrap();
    assert!(
        stray.as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the label-only pod was left running: {stray:?}"
    );
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    label_only_index_pod_is_replaced,
    pods_of_a_job_deleted_while_no_watcher_led_are_released,
    quota_refuses_creates_until_raised,
    eviction_is_ignored_by_pod_failure_policy,
    job_deletion_propagates,
);
