//! The writes that ask for protobuf answers (pod create, delete and finalizer patch; event
//! create and count patch; Job status write), against
//! kjob-sim (which answers JSON) and the real control plane (protobuf): what they return and
//! how they fail, failures compared with what kube's own JSON calls report for the same
//! request.

mod common;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kjob_testkit::server::TestServer;
use kjob_worker::kube_api::{ApiError, KubeApi};
use kjob_worker::metrics::Metrics;
use kube::Api;
use kube::api::PostParams;

fn pod(meta: serde_json::Value, container: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta,
        "spec": {"schedulerName": common::TEST_SCHEDULER,
                 "containers": [{"name": container, "image": "busybox"}]}
    }))
    .unwrap()
}

/// A fresh namespace named after `base` and a `KubeApi` on the server.
async fn namespace_and_api(server: &TestServer, base: &str) -> (String, KubeApi) {
    let ns = server.namespace(base);
    server.create_namespace(&ns).await;
    let mut registry = prometheus_client::registry::Registry::default();
    (ns, KubeApi::new(server.client(), 100.0, 100, Metrics::new(&mut registry)))
}

async fn pod_writes_answer_and_fail_as_json_calls_do(server: TestServer) {
    let (ns, api) = namespace_and_api(&server, "podwrites").await;
    let ns = ns.as_str();
    let pods: Api<Pod> = Api::namespaced(server.client(), ns);

    // A create from generateName answers with the server's name and UID.
    let tracked = serde_json::json!({"generateName": "w-",
        "finalizers": [kjob_core::JOB_TRACKING_FINALIZER]});
    let created = api.create_pod(ns, &pod(tracked, "main")).await.expect("created");
    assert!(created.name.starts_with("w-") && created.name.len() > 2, "{created:?}");
    let stored = pods.get(&created.name).await.expect("stored");
    assert_eq!(stored.metadata.uid.as_deref(), Some(created.uid.as_str()));
    assert!(common::has_finalizer(&stored));

    // The same name again: a conflict carrying the server's own message.
    let named = pod(serde_json::json!({"name": created.name}), "main");
    let json_err = pods.create(&PostParams::default(), &named).await.expect_err("exists");
    let kube::Error::Api(want) = json_err else { panic!("{json_err:?}") };
    match api.create_pod(ns, &named).await {
        Err(ApiError::Conflict { message, .. }) => assert_eq!(message, want.message),
        other => panic!("{other:?}"),
    }

    // An invalid pod: refused with the code, reason and message a JSON call gets.
    let invalid = pod(serde_json::json!({"name": "invalid"}), "Not_A_DNS_Label");
    let json_err = pods.create(&PostParams::default(), &invalid).await.expect_err("invalid");
    let kube::Error::Api(want) = json_err else { panic!("{json_err:?}") };
    match api.create_pod(ns, &invalid).await {
        Err(ApiError::Refused { code, reason, message, .. }) => {
            assert_eq!(
                (code, reason.as_str(), message.as_str()),
                (want.code, &*want.reason, &*want.message)
            );
            assert_eq!(code, 422);
        }
        other => panic!("{other:?}"),
    }

    // The finalizer patch removes the finalizer; the delete then deletes the pod.
    api.patch_out_tracking_finalizer(ns, &created.name).await.expect("patched");
    let stored = pods.get(&created.name).await.expect("still there");
    assert!(!common::has_finalizer(&stored));
    api.delete_pod(ns, &created.name).await.expect("deleted");
    common::eventually("the deleted pod gone", std::time::Duration::from_secs(30), || async {
        pods.get_opt(&created.name).await.unwrap().is_none().then_some(())
    })
    .await;

    // Both on a missing pod: NotFound.
    let missing = api.patch_out_tracking_finalizer(ns, &created.name).await;
    assert!(matches!(missing, Err(ApiError::NotFound(_))), "{missing:?}");
    let missing = api.delete_pod(ns, &created.name).await;
    assert!(matches!(missing, Err(ApiError::NotFound(_))), "{missing:?}");
}

async fn event_writes_answer_name_version_and_count(server: TestServer) {
    let (ns, api) = namespace_and_api(&server, "eventwrites").await;
    let ns = ns.as_str();
    let events: Api<Event> = Api::namespaced(server.client(), ns);
    let event: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pi.17f0", "namespace": ns},
        "involvedObject": {"kind": "Job", "namespace": ns, "name": "pi", "apiVersion": "batch/v1"},
        "reason": "SuccessfulCreate", "message": "Created pod: pi-a", "type": "Normal",
        "source": {"component": "job-controller"}, "count": 1,
        "firstTimestamp": "2026-12-05T10:00:00Z", "lastTimestamp": "2026-12-05T10:00:00Z"
    }))
    .unwrap();
    let written = api.create_event(ns, &event).await.expect("created");
    let stored = events.get("pi.17f0").await.expect("stored");
    assert_eq!(written, (&stored).into());
    assert_eq!((written.name.as_str(), written.count), ("pi.17f0", Some(1)));

    // A count patch preconditioned on that version answers with the new version and count.
    let patch = |count: i32, rv: &str| {
        serde_json::json!({"count": count, "lastTimestamp": "2026-12-05T10:00:05Z",
                           "metadata": {"resourceVersion": rv}})
    };
    let counted_patch = patch(2, &written.resource_version);
    let counted = api.patch_event_count(ns, "pi.17f0", &counted_patch).await.expect("patched");
    let stored = events.get("pi.17f0").await.expect("stored");
    assert_eq!(counted, (&stored).into());
    assert_eq!(counted.count, Some(2));
    assert_ne!(counted.resource_version, written.resource_version);
    // The old version again: a conflict, as a JSON patch gets.
    let stale_patch = patch(3, &written.resource_version);
    let stale = api.patch_event_count(ns, "pi.17f0", &stale_patch).await;
    assert!(matches!(stale, Err(ApiError::Conflict { .. })), "{stale:?}");
    // The same name created again: a conflict.
    let again = api.create_event(ns, &event).await;
    assert!(matches!(again, Err(ApiError::Conflict { .. })), "{again:?}");
}

async fn status_writes_answer_the_new_version_and_stay_fenced(server: TestServer) {
    let (ns, api) = namespace_and_api(&server, "statuswrites").await;
    let ns = ns.as_str();
    let jobs: Api<Job> = Api::namespaced(server.client(), ns);
    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "pi"},
        "spec": {"managedBy": kjob_core::DEFAULT_CONTROLLER_NAME,
                 "template": {"spec": {"restartPolicy": "Never",
                   "containers": [{"name": "main", "image": "busybox"}]}}}
    }))
    .unwrap();
    let mut job = jobs.create(&PostParams::default(), &job).await.expect("created");
    let before = job.metadata.resource_version.clone().expect("a version");

    // The answer's version is the one the server stored.
    job.status = Some(serde_json::from_value(serde_json::json!({"active": 1})).unwrap());
    let written = api.replace_job_status(&job).await.expect("written");
    let stored = jobs.get_status("pi").await.expect("stored");
    assert_eq!(Some(written.as_str()), stored.metadata.resource_version.as_deref());
    assert_ne!(written, before);
    assert_eq!(stored.status.and_then(|s| s.active), Some(1));

    // The old version again: a conflict, as a JSON write gets; the new one writes.
    job.status = Some(serde_json::from_value(serde_json::json!({"active": 2})).unwrap());
    let stale = api.replace_job_status(&job).await;
    assert!(matches!(stale, Err(ApiError::Conflict { .. })), "{stale:?}");
    job.metadata.resource_version = Some(written);
    api.replace_job_status(&job).await.expect("written with the new version");
    let stored = jobs.get_status("pi").await.expect("stored");
    assert_eq!(stored.status.and_then(|s| s.active), Some(2));

    // A Job that is gone: NotFound.
    jobs.delete("pi", &Default::default()).await.expect("deleted");
    common::eventually("the deleted Job gone", std::time::Duration::from_secs(30), || async {
        jobs.get_opt("pi").await.unwrap().is_none().then_some(())
    })
    .await;
    let missing = api.replace_job_status(&job).await;
    assert!(matches!(missing, Err(ApiError::NotFound(_))), "{missing:?}");
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    pod_writes_answer_and_fail_as_json_calls_do,
    event_writes_answer_name_version_and_count,
    status_writes_answer_the_new_version_and_stay_fenced);
