//! The watcher's pod list and watch (`--watch-encoding protobuf`, `kjob_watcher::pod_watch`)
//! against kjob-sim and the real control plane: the same requests as protobuf and as JSON give
//! the same pods, event by event, and the same view JSON; kube-apiserver answers them in
//! protobuf (kjob-sim in JSON, which the watcher reads all the same).

mod common;

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::server::TestServer;
use kjob_watcher::pod_watch::{WatchError, watch_pods};
use kjob_watcher::view::WatchedPod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;

/// Longest wait for one watch event.
const EVENT_WAIT: Duration = Duration::from_secs(30);

type Events = std::pin::Pin<Box<dyn Stream<Item = Result<Event<WatchedPod>, WatchError>> + Send>>;

async fn next(events: &mut Events) -> Event<WatchedPod> {
    tokio::time::timeout(EVENT_WAIT, events.next())
        .await
        .expect("an event in time")
        .expect("an endless stream")
        .expect("no list or watch failure")
}

/// The initial list's pods, by name, up to its InitDone.
async fn listed(events: &mut Events) -> Vec<WatchedPod> {
    assert!(matches!(next(events).await, Event::Init));
    let mut pods = Vec::new();
    loop {
        match next(events).await {
            Event::InitApply(p) => pods.push(p),
            Event::InitDone => break,
            other => panic!("during the list: {other:?}"),
        }
    }
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods
}

/// The next Apply of pod `name`.
async fn applied(events: &mut Events, name: &str) -> WatchedPod {
    loop {
        if let Event::Apply(p) = next(events).await
            && p.metadata.name.as_deref() == Some(name)
        {
            return p;
        }
    }
}

/// Same pod, same view entry (resourceVersions equal too: both saw the same write).
fn assert_same(pb: &WatchedPod, json: &WatchedPod) {
    assert_eq!(pb, json);
    assert_eq!(
        String::from_utf8_lossy(&pb.view_entry()),
        String::from_utf8_lossy(&json.view_entry())
    );
}

async fn protobuf_and_json_watches_see_the_same_pods(server: TestServer) {
    let ns = server.namespace("pbwatch");
    server.create_namespace(&ns).await;
    let client = server.client();
    // A Job nobody reconciles (kjob is not running), so its pods are left as written.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pb"},
        "spec": {"managedBy": kjob_core::DEFAULT_CONTROLLER_NAME, "suspend": true,
                 "template": {"spec": {"restartPolicy": "Never",
                   "containers": [{"name": "main", "image": "busybox"}]}}}
    }))
    .unwrap();
    let job = jobs.create(&PostParams::default(), &job).await.expect("the Job");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name,
                "labels": {"batch.kubernetes.io/job-name": "pb"},
                "annotations": {"batch.kubernetes.io/job-completion-index": "0", "note": "x"},
                "finalizers": [kjob_core::JOB_TRACKING_FINALIZER],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pb",
                    "uid": job.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"schedulerName": common::TEST_SCHEDULER,
                "initContainers": [{"name": "side", "image": "busybox", "restartPolicy": "Always"}],
                "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}
        }))
        .unwrap()
    };
    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(name)).await.expect("a pod");
    }

    // kube-apiserver answers the list and the watch in protobuf; kjob-sim in JSON.
    for (query, accept) in [
        ("limit=500", kjob_watcher::kube_proto::ACCEPT_LIST),
        ("watch=true&timeoutSeconds=1", kjob_watcher::kube_proto::ACCEPT_WATCH),
    ] {
        let request = http::Request::get(format!("/api/v1/namespaces/{ns}/pods?{query}"))
            .header(http::header::ACCEPT, accept)
            .body(Vec::new())
            .unwrap();
        let response = client.send(request.map(kube::client::Body::from)).await.expect("answered");
        assert!(response.status().is_success(), "{query}: {}", response.status());
        let content_type = response.headers().get(http::header::CONTENT_TYPE).cloned();
        let protobuf = kjob_watcher::kube_proto::is_protobuf(
            content_type.as_ref().and_then(|v| v.to_str().ok()),
        );
        assert_eq!(protobuf, server.is_real(), "{query}: {content_type:?}");
    }

    let mut pb: Events = Box::pin(watch_pods(client.clone(), Some(&ns), true));
    let mut json: Events = Box::pin(watch_pods(client.clone(), Some(&ns), false));
    let (from_pb, from_json) = (listed(&mut pb).await, listed(&mut json).await);
    assert_eq!(from_pb.len(), 2);
    for (p, j) in from_pb.iter().zip(&from_json) {
        assert_same(p, j);
    }

    // A status write (what a kubelet sends), then an annotation nobody reads: the same events.
    let status = serde_json::json!({"status": {
        "phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False",
                        "lastTransitionTime": "2026-12-01T10:00:00Z", "reason": "PodFailed"}],
        "initContainerStatuses": [{"name": "side", "image": "busybox", "imageID": "",
            "ready": false, "restartCount": 1, "state": {"terminated": {"exitCode": 0,
            "finishedAt": "2026-12-01T10:00:05Z", "startedAt": "2026-12-01T09:59:00Z"}}}],
        "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "",
            "ready": false, "restartCount": 2, "state": {"terminated": {"exitCode": 42,
            "reason": "Error", "finishedAt": "2026-12-01T10:00:00Z",
            "startedAt": "2026-12-01T09:59:00Z"}}}]}});
    pods.patch_status("a", &PatchParams::default(), &Patch::Merge(&status)).await.expect("status");
    let (p, j) = (applied(&mut pb, "a").await, applied(&mut json, "a").await);
    assert_same(&p, &j);
    let exit = |w: &WatchedPod| {
        w.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
    };
    assert_eq!(exit(&p), Some(42));
    let before = p.view_entry();
    let note = serde_json::json!({"metadata": {"annotations": {"note": "y"}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&note)).await.expect("annotated");
    let (p, j) = (applied(&mut pb, "a").await, applied(&mut json, "a").await);
    assert_same(&p, &j);
    assert_eq!(*p.view_entry(), *before, "an annotation syncJob does not read: the same view");

    // A delete: the same last state on both.
    pods.delete("b", &Default::default()).await.expect("deleted");
    let mut deleting = Vec::new();
    for events in [&mut pb, &mut json] {
        // Terminating first (the finalizer holds it), as an update.
        deleting.push(applied(events, "b").await);
    }
    assert_same(&deleting[0], &deleting[1]);
    assert!(deleting[0].metadata.deletion_timestamp.is_some());
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    protobuf_and_json_watches_see_the_same_pods);
