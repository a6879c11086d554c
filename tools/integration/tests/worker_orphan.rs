//! The orphan-pod sync against kjob-sim and the real control plane: which pods lose the
//! tracking finalizer. (On the real server its garbage collector deletes the pods whose owner
//! is gone at the same time; that changes nothing here: the finalizer keeps them until the
//! sync removes it.)

mod common;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::server::TestServer;
use kjob_worker::Worker;
use kjob_worker::events::EventSink;
use kjob_worker::kube_api::KubeApi;
use kjob_worker::metrics::Metrics;
use kube::Api;
use kube::api::{ListParams, PostParams};

fn pod(name: &str, owner: Option<serde_json::Value>) -> Pod {
    let mut p = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "finalizers": [kjob_core::JOB_TRACKING_FINALIZER],
                     "labels": {"app": "x"}},
        "spec": {"schedulerName": common::TEST_SCHEDULER,
                 "containers": [{"name": "main", "image": "busybox"}]}
    });
    if let Some(o) = owner {
        p["metadata"]["ownerReferences"] = serde_json::json!([o]);
    }
    serde_json::from_value(p).unwrap()
}

fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
                       "controller": true})
}

async fn orphan_pods_lose_the_finalizer_only_when_nobody_counts_them(server: TestServer) {
    let client = server.client();
    let ns = server.namespace("orphans");
    let ns = ns.as_str();
    server.create_namespace(ns).await;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::new(&mut registry);
    let api = KubeApi::new(client.clone(), 100.0, 100, metrics.clone());
    let (events, writer) =
        EventSink::new(api.clone(), kjob_core::DEFAULT_CONTROLLER_NAME, "t", metrics.clone());
    let writer = tokio::spawn(writer.run());
    // Nothing here talks to the queue; the lazy client never connects.
    let queue = kjob_queue_client::QueueClient::connect_lazy("http://127.0.0.1:9").unwrap();
    let worker =
        Worker::new(api, queue, events, metrics, kjob_core::DEFAULT_CONTROLLER_NAME.into(), false);

    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let mk_job = |name: &str, managed_by: &str| -> Job {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name},
            "spec": {"managedBy": managed_by, "template": common::template("Never")}
        }))
        .unwrap()
    };
    let running = jobs
        .create(&PostParams::default(), &mk_job("running", kjob_core::DEFAULT_CONTROLLER_NAME))
        .await
        .unwrap();
    let finished = jobs
        .create(&PostParams::default(), &mk_job("finished", kjob_core::DEFAULT_CONTROLLER_NAME))
        .await
        .unwrap();
    let external = jobs
        .create(&PostParams::default(), &mk_job("external", "example.com/other"))
        .await
        .unwrap();
    // Mark `finished` (and `external`) Complete through /status, as a controller would.
    for j in [&finished, &external] {
        let now = jiff::Timestamp::now().to_string();
        let status = serde_json::json!({"status": {
        "startTime": now, "completionTime": now, "succeeded": 1,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached", "message": "Reached expected number of succeeded pods", "lastProbeTime": now, "lastTransitionTime": now},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached", "message": "Reached expected number of succeeded pods", "lastProbeTime": now, "lastTransitionTime": now}
        ]}});
        let name = j.metadata.name.clone().unwrap();
        jobs.patch_status(&name, &Default::default(), &kube::api::Patch::Merge(&status))
            .await
            .expect("complete job");
    }
    let uid = |j: &Job| j.metadata.uid.clone().unwrap();
    let cases = [
        ("no-controller", None, true),
        ("cronjob-owned", Some(owner("CronJob", "batch/v1", "cj", "c1")), false),
        ("crd-job-owned", Some(owner("Job", "example.com/v1", "x", "x1")), false),
        ("running-job", Some(owner("Job", "batch/v1", "running", &uid(&running))), false),
        // Owned by the running Job but its labels (app=x) do not match the Job's selector:
        // released (owner reference removed), then cleaned up like any orphan.
        ("running-job-unmatched", Some(owner("Job", "batch/v1", "running", &uid(&running))), true),
        ("finished-job", Some(owner("Job", "batch/v1", "finished", &uid(&finished))), true),
        ("external-job", Some(owner("Job", "batch/v1", "external", &uid(&external))), false),
        ("gone-job", Some(owner("Job", "batch/v1", "gone", "nope")), true),
        // Same name as a live Job but another UID: its owner is gone.
        ("stale-uid", Some(owner("Job", "batch/v1", "running", "old-uid")), true),
    ];
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let never = tokio_util::sync::CancellationToken::new();
    let selected = running.spec.as_ref().unwrap().selector.clone().unwrap().match_labels;
    for (name, o, _) in &cases {
        let mut p = pod(name, o.clone());
        if *name == "running-job" {
            // The running Job's pods carry the labels its selector matches.
            p.metadata.labels = selected.clone();
        }
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    for (name, _, _) in &cases {
        let out = worker
            .sync(kjob_core::ORPHAN_POD_QUEUE, &format!("{ns}/{name}"), &never)
            .await
            .unwrap();
        assert_eq!(out, kjob_worker::SyncOutcome::Done, "{name}");
    }
    // A pod that does not exist is simply done.
    let out =
        worker.sync(kjob_core::ORPHAN_POD_QUEUE, &format!("{ns}/missing"), &never).await.unwrap();
    assert_eq!(out, kjob_worker::SyncOutcome::Done);
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    for (name, _, removed) in &cases {
        // The simulator's garbage collector deletes pods whose owner is gone; once the
        // finalizer is off, such a pod disappears altogether.
        match listed.iter().find(|p| p.metadata.name.as_deref() == Some(name)) {
            Some(p) => {
                assert_eq!(
                    !common::has_finalizer(p),
                    *removed,
                    "{name}: {:?}",
                    p.metadata.finalizers
                )
            }
            None => assert!(*removed, "{name} vanished but should have kept its finalizer"),
        }
    }
    let released =
        listed.iter().find(|p| p.metadata.name.as_deref() == Some("running-job-unmatched"));
    assert!(
        released.is_none_or(|p| p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .all(|o| o.uid != uid(&running))),
        "released pods lose the owner reference: {released:?}"
    );
    let kept = listed.iter().find(|p| p.metadata.name.as_deref() == Some("running-job")).unwrap();
    assert_eq!(kept.metadata.owner_references.as_ref().map(Vec::len), Some(1));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    // Four finalizer removals, plus the release and the finalizer removal of the unmatched pod.
    assert!(
        out.contains(r#"kjob_worker_api_calls_total{verb="patch",resource="pods",result="ok"} 6"#),
        "{out}"
    );
    drop(worker);
    tokio::time::timeout(Duration::from_secs(5), writer).await.unwrap().unwrap();
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    orphan_pods_lose_the_finalizer_only_when_nobody_counts_them);
