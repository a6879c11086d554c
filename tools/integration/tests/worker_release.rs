//! Release: a pod of a running Job whose labels are edited so the Job's selector no longer
//! matches is released (its owner reference removed by UID, then its tracking finalizer), as
//! upstream `ClaimPods` does; the Job replaces it and completes. Real processes throughout:
//! the watcher spots the pod, the orphan-pod queue carries it, a worker releases it.

mod stack_common;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use stack_common::*;

const TIMEOUT: Duration = Duration::from_secs(30);

async fn a_pod_whose_labels_stop_matching_is_released_and_replaced(
    server: kjob_testkit::server::TestServer,
) {
    let run_dir = tempfile::Builder::new().prefix("kjob-release-").tempdir().unwrap();
    let ns = server.namespace("release");
    let (stack, client) = start_stack_on(&server, &ns, run_dir.path().to_path_buf(), 1, &[]).await;
    let tracker = PodTracker::start(&client, &ns).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Pods run long enough for the test to edit the first one while it runs.
    let shape = Shape::NonIndexed { completions: 1, parallelism: 1 };
    create_job_retrying(&jobs, &shape.job("rel", kjob_core::DEFAULT_CONTROLLER_NAME, 3000)).await;
    let job = jobs.get("rel").await.unwrap();
    let job_uid = job.metadata.uid.clone().unwrap();
    let selector = job.spec.as_ref().unwrap().selector.clone().unwrap();
    let by_job = ListParams::default().labels("batch.kubernetes.io/job-name=rel");

    let first = poll("the first pod running", || async {
        let list = pods.list(&by_job).await.ok()?;
        list.items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let first_name = first.metadata.name.clone().unwrap();
    // Change every label the selector matches on.
    let edited: serde_json::Map<String, serde_json::Value> = selector
        .match_labels
        .unwrap_or_default()
        .into_keys()
        .map(|k| (k, serde_json::Value::from("edited")))
        .collect();
    assert!(!edited.is_empty(), "the Job selects by labels");
    let patch = serde_json::json!({"metadata": {"labels": edited}});
    pods.patch(&first_name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    // Released: no owner reference to the Job, no tracking finalizer; the pod itself stays.
    let released = poll("the edited pod released", || async {
        let p = pods.get(&first_name).await.ok()?;
        let owned = p.metadata.owner_references.iter().flatten().any(|o| o.uid == job_uid);
        let fin = pods_with_finalizer(std::slice::from_ref(&p));
        (!owned && fin.is_empty()).then_some(p)
    })
    .await;
    assert_eq!(released.metadata.uid, first.metadata.uid, "the same pod, not a namesake");

    // The Job replaces it and completes with exactly the replacement counted.
    let done = poll("the Job complete", || async {
        let j = jobs.get("rel").await.ok()?;
        terminal(&j).is_some().then_some(j)
    })
    .await;
    assert_eq!(terminal(&done).unwrap().0, "Complete", "{:?}", done.status);
    let status = done.status.unwrap();
    assert_eq!((status.succeeded, status.failed.unwrap_or(0)), (Some(1), 0));
    assert_eq!(tracker.per_job().get("rel"), Some(&2), "the released pod and one replacement");
    let owned: Vec<Pod> = pods
        .list(&by_job)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.owner_references.iter().flatten().any(|o| o.uid == job_uid))
        .collect();
    assert_eq!(owned.len(), 1, "only the replacement belongs to the Job");
    assert!(pods_with_finalizer(&owned).is_empty());

    // The upstream metrics move: the watcher counted the externally managed Job on add, the
    // worker saw finished pods with the finalizer (add) and removed it (delete).
    let watcher = &stack.watchers()[0];
    let port = port_from_log(&stack.log_path(watcher), "kjob-watcher starting").unwrap();
    let text = tokio::task::block_in_place(|| http_get(port, "/metrics")).unwrap();
    let external = metric_sum(
        &text,
        "job_controller_jobs_by_external_controller_total",
        &[&format!("controller_name=\"{}\"", kjob_core::DEFAULT_CONTROLLER_NAME)],
    );
    assert_eq!(external, 1.0, "{text}");
    let worker = &stack.workers()[0];
    let port = admin_port_from_log(&stack.log_path(worker)).unwrap();
    let text = tokio::task::block_in_place(|| http_get(port, "/metrics")).unwrap();
    let name = "job_controller_terminated_pods_tracking_finalizer_total";
    // The replacement was recorded and cleared by the Job's sync; the released pod counts too
    // only if it had finished before its finalizer came off (a slow machine).
    let add = metric_sum(&text, name, &["event=\"add\""]);
    let delete = metric_sum(&text, name, &["event=\"delete\""]);
    assert!((1.0..=2.0).contains(&add) && add == delete, "add {add} delete {delete}\n{text}");
    drop(stack);
}

async fn poll<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    a_pod_whose_labels_stop_matching_is_released_and_replaced);
