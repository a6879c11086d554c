//! The compact view entry against the trimmed Pod JSON it replaced: the same facts for every
//! pod, the same plan, and both readable by the worker during a rolling upgrade.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kjob_reconcile::testutil::{
    TEST_NAMESPACE, at, condition_rule, exit_code_rule, mk_job, mk_pod,
};
use kjob_reconcile::view_pod::{self, FORMAT_V1, ViewPodError};
use kjob_reconcile::{JobSync, Step};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{VIEW_ANNOTATION_PREFIX, WatchedPod, WatchedPodSpec, WatchedPodStatus};

/// The view entry watchers before the compact format wrote (trimmed Pod JSON), kept here as
/// it was so the worker's reading of it stays tested while such entries may still be read.
fn legacy_entry(p: &WatchedPod) -> Vec<u8> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct LegacyPod<'a> {
        api_version: &'static str,
        kind: &'static str,
        metadata: LegacyMeta<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        spec: Option<&'a WatchedPodSpec>,
        #[serde(skip_serializing_if = "Option::is_none")]
        status: Option<&'a WatchedPodStatus>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct LegacyMeta<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        uid: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        creation_timestamp: Option<&'a Time>,
        #[serde(skip_serializing_if = "Option::is_none")]
        deletion_timestamp: Option<&'a Time>,
        #[serde(skip_serializing_if = "Option::is_none")]
        deletion_grace_period_seconds: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        labels: Option<&'a BTreeMap<String, String>>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        annotations: BTreeMap<&'a str, &'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        finalizers: Option<&'a Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        owner_references: Option<&'a Vec<OwnerReference>>,
    }
    let m = &p.metadata;
    let legacy = LegacyPod {
        api_version: "v1",
        kind: "Pod",
        metadata: LegacyMeta {
            name: m.name.as_deref(),
            namespace: m.namespace.as_deref(),
            uid: m.uid.as_deref(),
            creation_timestamp: m.creation_timestamp.as_ref(),
            deletion_timestamp: m.deletion_timestamp.as_ref(),
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            labels: m.labels.as_ref(),
            annotations: m
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(VIEW_ANNOTATION_PREFIX))
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            finalizers: m.finalizers.as_ref(),
            owner_references: m.owner_references.as_ref(),
        },
        spec: p.spec.as_ref(),
        status: p.status.as_ref(),
    };
    serde_json::to_vec(&legacy).unwrap()
}

/// The pod as the watcher decodes it off a JSON watch.
fn watched(pod: &Value) -> WatchedPod {
    serde_json::from_value(pod.clone()).unwrap()
}

/// How a worker before the compact format read an entry.
fn old_worker_reads(entry: &[u8]) -> Result<Pod, serde_json::Error> {
    serde_json::from_slice(entry)
}

/// A time the API server would send (whole seconds, RFC 3339).
fn time(secs: i64) -> String {
    jiff::Timestamp::from_second(1_796_000_000 + secs).unwrap().to_string()
}

const JOB_UID: &str = "0b5c1f3e-9d4a-4c61-8b0e-2f7a6d9e4c10";

prop_compose! {
    fn arb_owner()(controller in any::<bool>(), canonical in any::<bool>(),
                   job in any::<bool>(), block in proptest::option::of(any::<bool>()))
                   -> Value {
        let uid = if canonical { JOB_UID.to_string() } else { "not-a-uuid-42".to_string() };
        let (api_version, kind) =
            if job { ("batch/v1", "Job") } else { ("example.com/v2", "Workflow") };
        let mut o = json!({"apiVersion": api_version, "kind": kind, "name": "work", "uid": uid});
        if controller { o["controller"] = json!(true); }
        if let Some(b) = block { o["blockOwnerDeletion"] = json!(b); }
        o
    }
}

prop_compose! {
    fn arb_status()(name in prop::sample::select(vec!["main", "side", "helper"]),
                    restarts in 0..5i32, state in 0..4u8, exit in -1..256i32,
                    finished in proptest::option::of(0..500i64)) -> Value {
        let state = match state {
            0 => None,
            1 => Some(json!({"running": {"startedAt": time(3)}})),
            2 => Some(json!({"waiting": {"reason": "CrashLoopBackOff"}})),
            _ => {
                let mut t = json!({"exitCode": exit, "reason": "Error"});
                if let Some(f) = finished { t["finishedAt"] = json!(time(f)); }
                Some(json!({"terminated": t}))
            }
        };
        let mut c = json!({"name": name, "restartCount": restarts, "ready": false,
                           "image": "busybox", "imageID": ""});
        if let Some(s) = state { c["state"] = s; }
        c
    }
}

prop_compose! {
    fn arb_condition()(ty in prop::sample::select(vec![
                           "Ready", "PodScheduled", "Initialized", "ContainersReady",
                           "PodReadyToStartContainers", "DisruptionTarget", "ConfigIssue"]),
                       status in prop::sample::select(vec!["True", "False", "Unknown"]),
                       changed in proptest::option::of(-5..900i64)) -> Value {
        let mut c = json!({"type": ty, "status": status, "reason": "R", "message": "m",
                           "lastProbeTime": null});
        if let Some(t) = changed { c["lastTransitionTime"] = json!(time(t)); }
        c
    }
}

prop_compose! {
    /// A pod of a Job (or of something else) as the API server sends it: the Job controller's
    /// labels and annotations or others, sidecars, conditions a podFailurePolicy reads,
    /// deletion, finished containers; fields syncJob does not read too.
    fn arb_pod()(job_named in any::<bool>(), index in proptest::option::of(0..100_000i32),
                 failures in proptest::option::of((0..7i32, proptest::option::of(0..3i32))),
                 user_labels in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..3),
                 legacy_labels in any::<bool>(), other_annotation in any::<bool>(),
                 finalizers in proptest::collection::vec(prop::sample::select(vec![
                     "batch.kubernetes.io/job-tracking", "example.com/keep"]), 0..3),
                 owners in proptest::collection::vec(arb_owner(), 0..3),
                 created in any::<bool>(), deleting in proptest::option::of((0..900i64,
                     proptest::option::of(0..60i64))),
                 node in proptest::option::of("[a-z0-9-]{1,20}"),
                 sidecar in proptest::option::of(any::<bool>()),
                 phase in proptest::option::of(prop::sample::select(vec![
                     "Pending", "Running", "Succeeded", "Failed", "Unknown", "Weird"])),
                 conditions in proptest::collection::vec(arb_condition(), 0..6),
                 statuses in proptest::collection::vec(arb_status(), 0..3),
                 init_statuses in proptest::collection::vec(arb_status(), 0..2),
                 uid_canonical in any::<bool>(), with_status in any::<bool>())
                 -> Value {
        let name = if job_named { format!("work-{}-x7k2p", index.unwrap_or(0)) }
                   else { "lonely-pod".to_string() };
        let mut labels: BTreeMap<String, String> = user_labels;
        labels.insert("batch.kubernetes.io/controller-uid".into(), JOB_UID.into());
        labels.insert("batch.kubernetes.io/job-name".into(), "work".into());
        if legacy_labels {
            labels.insert("controller-uid".into(), JOB_UID.into());
            labels.insert("job-name".into(), "work".into());
        }
        let mut annotations = BTreeMap::new();
        if let Some(i) = index {
            labels.insert("batch.kubernetes.io/job-completion-index".into(), i.to_string());
            annotations.insert("batch.kubernetes.io/job-completion-index".to_string(), i.to_string());
        }
        if let Some((f, ignored)) = failures {
            annotations.insert("batch.kubernetes.io/job-index-failure-count".into(), f.to_string());
            if let Some(n) = ignored {
                annotations.insert(
                    "batch.kubernetes.io/job-index-ignored-failure-count".into(), n.to_string());
            }
        }
        if other_annotation {
            annotations.insert("kubectl.kubernetes.io/last-applied".into(), "{}".into());
        }
        let uid = if uid_canonical { "7c1e0042-52f1-4a8e-9b3d-00000000002a" } else { "pod-uid-7" };
        let mut meta = json!({"name": name, "namespace": TEST_NAMESPACE, "uid": uid,
                              "resourceVersion": "17", "labels": labels,
                              "managedFields": [{"manager": "kubelet"}]});
        if !annotations.is_empty() { meta["annotations"] = json!(annotations); }
        if !finalizers.is_empty() { meta["finalizers"] = json!(finalizers); }
        if !owners.is_empty() { meta["ownerReferences"] = json!(owners); }
        if created { meta["creationTimestamp"] = json!(time(0)); }
        if let Some((d, grace)) = deleting {
            meta["deletionTimestamp"] = json!(time(d));
            if let Some(g) = grace { meta["deletionGracePeriodSeconds"] = json!(g); }
        }
        let mut spec = json!({"containers": [{"name": "main", "image": "busybox"}],
                              "restartPolicy": "Never", "serviceAccountName": "default"});
        if let Some(n) = node { spec["nodeName"] = json!(n); }
        if let Some(always) = sidecar {
            let mut c = json!({"name": "side", "image": "envoy"});
            if always { c["restartPolicy"] = json!("Always"); }
            spec["initContainers"] = json!([c]);
        }
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec});
        if with_status {
            let mut status = json!({"podIP": "10.0.0.7", "qosClass": "BestEffort"});
            if let Some(p) = phase { status["phase"] = json!(p); }
            if !conditions.is_empty() { status["conditions"] = json!(conditions); }
            if !statuses.is_empty() { status["containerStatuses"] = json!(statuses); }
            if !init_statuses.is_empty() { status["initContainerStatuses"] = json!(init_statuses); }
            pod["status"] = status;
        }
        pod
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every field syncJob reads survives: the compact entry expands into exactly the Pod the
    /// trimmed JSON decoded into; a worker before the compact format refuses it (and reads the
    /// API server) instead of reading a part of it; and it is smaller.
    #[test]
    fn the_compact_entry_is_the_trimmed_pod(pod in arb_pod()) {
        let w = watched(&pod);
        let entry = w.view_entry();
        let legacy = legacy_entry(&w);
        prop_assert_eq!(entry[0], FORMAT_V1);
        let from_compact = view_pod::decode(&entry, TEST_NAMESPACE).unwrap();
        let from_legacy = view_pod::decode(&legacy, TEST_NAMESPACE).unwrap();
        prop_assert_eq!(&from_compact, &from_legacy);
        prop_assert_eq!(&from_legacy, &old_worker_reads(&legacy).unwrap());
        prop_assert!(old_worker_reads(&entry).is_err());
        prop_assert!(entry.len() < legacy.len(), "{} >= {}", entry.len(), legacy.len());
        // The watcher's equality check (no write when nothing syncJob reads changed) sees the
        // same entry for the same facts.
        prop_assert_eq!(&*entry, &*watched(&pod).view_entry());
    }
}

/// A Job with backoffLimitPerIndex and a podFailurePolicy that reads exit codes (of the main
/// container and of a sidecar) and conditions.
fn policy_job() -> Job {
    mk_job("work")
        .indexed()
        .completions(Some(8))
        .parallelism(8)
        .backoff_limit_per_index(2)
        .pod_failure_policy(vec![
            exit_code_rule("FailJob", Some("main"), "In", &[42]),
            condition_rule("Ignore", &[("DisruptionTarget", "True")]),
            exit_code_rule("FailIndex", None, "In", &[3]),
            exit_code_rule("Count", Some("side"), "NotIn", &[0]),
        ])
        .build()
}

/// The pods of [`policy_job`]: running, ready, succeeded, failed by each rule, disrupted,
/// terminating, with a sidecar, per-index failure counts, one index out of range.
fn policy_pods(job: &Job) -> Vec<Pod> {
    vec![
        mk_pod(job, "work-0-a").index(0).ready(at(5)).build(),
        mk_pod(job, "work-1-b").index(1).succeeded(at(9)).build(),
        mk_pod(job, "work-2-c").index(2).failed(3, at(7)).failure_counts(1, None).build(),
        mk_pod(job, "work-3-d")
            .index(3)
            .failed(1, at(6))
            .condition("DisruptionTarget", "True", at(5))
            .build(),
        mk_pod(job, "work-4-e").index(4).deleting(at(8)).restarts(2).node(None).build(),
        mk_pod(job, "work-5-f")
            .index(5)
            .init_terminated("side", 0, at(8))
            .terminated("main", 0, at(6))
            .with(|p| {
                p.spec.as_mut().unwrap().init_containers =
                    Some(vec![k8s_openapi::api::core::v1::Container {
                        name: "side".into(),
                        restart_policy: Some("Always".into()),
                        ..Default::default()
                    }]);
                p.status.as_mut().unwrap().phase = Some("Succeeded".into());
            })
            .build(),
        mk_pod(job, "work-6-g").index(6).failed(1, at(4)).failure_counts(2, Some(1)).build(),
        mk_pod(job, "work-9-h").index(9).build(),
        mk_pod(job, "work-7-i").index(7).pending().node(None).created(at(3)).build(),
    ]
}

/// The steps a sync plans from `pods`, every call reported as succeeding, until it is done.
fn plan(job: &Job, pods: &[Pod]) -> Vec<String> {
    let removals = Default::default();
    let input = kjob_reconcile::testutil::sync_input(job, pods, at(30), &removals);
    let mut sync = JobSync::new(input);
    let mut steps = Vec::new();
    loop {
        let step = sync.next_step();
        steps.push(format!("{step:?}"));
        if matches!(step, Step::Done(_)) {
            return steps;
        }
        let Some(report) = step.all_succeeded(|i| format!("new-{i}")) else { continue };
        sync.report(report).unwrap();
        assert!(steps.len() < 50, "a plan that never ends: {steps:#?}");
    }
}

/// The worker plans the same from the compact view as from the trimmed JSON view: the same
/// steps (pods created, deleted, finalizers removed, the status written) and the same outcome.
#[test]
fn a_sync_plans_the_same_from_the_compact_view() {
    let jobs = [
        policy_job(),
        mk_job("work").completions(Some(6)).parallelism(3).build(),
        mk_job("work").completions(Some(6)).parallelism(3).pod_replacement_policy("Failed").build(),
    ];
    for job in jobs {
        let via = |entry: fn(&WatchedPod) -> Vec<u8>| -> Vec<Pod> {
            policy_pods(&job)
                .iter()
                .map(|p| {
                    let w: WatchedPod =
                        serde_json::from_slice(&serde_json::to_vec(p).unwrap()).unwrap();
                    view_pod::decode(&entry(&w), TEST_NAMESPACE).unwrap()
                })
                .collect()
        };
        let compact = via(|w| w.view_entry().to_vec());
        let legacy = via(legacy_entry);
        assert_eq!(compact, legacy);
        let steps = plan(&job, &compact);
        assert!(steps.len() > 1, "the plan acts: {steps:#?}");
        assert_eq!(steps, plan(&job, &legacy));
        // And as from the whole pods (what a LIST returns).
        assert_eq!(steps, plan(&job, &policy_pods(&job)));
    }
}

/// Version skew, the other ways: an entry of a format this worker does not know (a newer
/// watcher's), or whose strings use a code it does not know, is refused whole, so the sync
/// reads the API server; a damaged message is refused too.
#[test]
fn entries_of_unknown_formats_are_refused_whole() {
    let job = policy_job();
    let pod = mk_pod(&job, "work-0-a").index(0).ready(at(5)).build();
    let w: WatchedPod = serde_json::from_slice(&serde_json::to_vec(&pod).unwrap()).unwrap();
    let entry = w.view_entry().to_vec();
    let mut newer = entry.clone();
    newer[0] = FORMAT_V1 + 1;
    assert_eq!(view_pod::decode(&newer, TEST_NAMESPACE), Err(ViewPodError::Format(Some(2))));
    assert_eq!(view_pod::decode(&[], TEST_NAMESPACE), Err(ViewPodError::Format(None)));
    // A phase coded with a number past the known strings.
    let m = view_pod::ViewPod {
        status: Some(view_pod::Status { phase: 200, ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(view_pod::decode(&m.to_entry(), TEST_NAMESPACE), Err(ViewPodError::Code(200)));
    // A reference to a controller the pod does not have.
    let m = view_pod::ViewPod {
        labels: vec![view_pod::Pair { key: 5, value: 2, ..Default::default() }],
        ..Default::default()
    };
    assert!(view_pod::decode(&m.to_entry(), TEST_NAMESPACE).is_err());
    let mut cut = entry.clone();
    cut.truncate(entry.len() - 3);
    assert!(view_pod::decode(&cut, TEST_NAMESPACE).is_err(), "a message cut inside a field");
}

/// What one entry costs, before and after, for the two pods the Redis measurement writes (a
/// running pod of a single-pod Job and of an Indexed Job, as the API server shows them).
#[test]
fn entry_sizes() {
    for (kind, indexed) in [("single-pod Job", false), ("Indexed Job", true)] {
        let pod = typical_pod(indexed);
        let w = watched(&pod);
        let (compact, legacy) = (w.view_entry().len(), legacy_entry(&w).len());
        eprintln!("{kind}: trimmed JSON {legacy} B, compact {compact} B (+32 B seal each)");
        assert!(compact * 3 < legacy, "{compact} vs {legacy}");
    }
}

/// A running pod of a Job as kube-apiserver shows it (a single-pod Job's or an Indexed Job's).
pub fn typical_pod(indexed: bool) -> Value {
    let t = "2026-12-07T06:00:00Z";
    let cond = |ty: &str| {
        json!({"type": ty, "status": "True", "lastTransitionTime": t,
                                 "lastProbeTime": null})
    };
    let job = "train-resnet50";
    let mut labels = json!({
        "batch.kubernetes.io/controller-uid": JOB_UID,
        "batch.kubernetes.io/job-name": job,
        "controller-uid": JOB_UID,
        "job-name": job,
    });
    let mut annotations = json!({});
    let name = if indexed {
        labels["batch.kubernetes.io/job-completion-index"] = json!("1234");
        annotations["batch.kubernetes.io/job-completion-index"] = json!("1234");
        format!("{job}-1234-x7k2p")
    } else {
        format!("{job}-x7k2p")
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": format!("{job}-"), "namespace": "ml-team-a",
            "uid": "7c1e0042-52f1-4a8e-9b3d-00000000002a", "resourceVersion": "123456",
            "creationTimestamp": t, "labels": labels, "annotations": annotations,
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                 "uid": JOB_UID, "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"nodeName": "worker-node-17", "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {
            "phase": "Running",
            "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                           cond("ContainersReady"), cond("PodScheduled")],
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0,
                                   "image": "registry.k8s.io/pause:3.10", "imageID": "",
                                   "state": {"running": {"startedAt": t}}}],
            "podIP": "10.244.3.17", "hostIP": "172.18.0.5", "qosClass": "BestEffort",
        },
    })
}
