//! What the shared Job view costs Redis per live pod (issue 46: at most 1 KB). 10,000 running
//! pods of a single-pod-per-slot Job and 10,000 of an Indexed Job, as kube-apiserver shows them,
//! written by the watcher's sender (compact entries, sealed) through kjob-queue into a real
//! redis-server. Measured two ways: `MEMORY USAGE` of the Job's pods hash, and `used_memory`
//! grown by the view; both divided by the pods. Prints the figures and the entry's parts.

mod queue_common;

use queue_common::InProcessQueue;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kjob_core::seal::ViewKey;
use kjob_testkit::RedisServer;
use kjob_watcher::handlers::{Enqueue, SessionControl};
use kjob_watcher::view::{ViewWrite, WatchedPod};
use serde_json::{Value, json};

/// Pods per Job measured: enough that the hash's own table and Redis' rounding average out.
const PODS: usize = 10_000;
/// The ceiling asserted: the 1 KB, with room for allocator and version differences.
const MAX_BYTES_PER_POD: f64 = 1_100.0;
const NS: &str = "ml-team-a";
const JOB_UID: &str = "0b5c1f3e-9d4a-4c61-8b0e-2f7a6d9e4c10";

/// Pod `i` of Job `job`, running, as kube-apiserver shows it.
fn pod(job: &str, indexed: bool, i: usize) -> Value {
    let t = "2026-12-07T06:00:00Z";
    let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
    let mut labels = json!({
        "batch.kubernetes.io/controller-uid": JOB_UID, "batch.kubernetes.io/job-name": job,
        "controller-uid": JOB_UID, "job-name": job,
    });
    let mut annotations = json!({});
    let suffix = format!("{:05x}", i * 7919 % 0xfffff);
    let name = if indexed {
        labels["batch.kubernetes.io/job-completion-index"] = json!(i.to_string());
        annotations["batch.kubernetes.io/job-completion-index"] = json!(i.to_string());
        format!("{job}-{i}-{suffix}")
    } else {
        format!("{job}-{suffix}")
    };
    json!({
        "metadata": {
            "name": name, "generateName": format!("{job}-"), "namespace": NS,
            "uid": format!("7c1e{i:04x}-52f1-4a8e-9b3d-{i:012x}"),
            "resourceVersion": (1000 + i).to_string(), "creationTimestamp": t,
            "labels": labels, "annotations": annotations,
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                 "uid": JOB_UID, "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"nodeName": format!("worker-node-{}", i % 50), "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        "status": {
            "phase": "Running",
            "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                           cond("ContainersReady"), cond("PodScheduled")],
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0,
                                   "image": "registry.k8s.io/pause:3.10", "imageID": "",
                                   "state": {"running": {"startedAt": t}}}],
            "podIP": "10.244.3.17", "hostIP": "172.18.0.5",
        },
    })
}

async fn conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

async fn used_memory(c: &mut redis::aio::MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(c).await.unwrap();
    info.lines().find_map(|l| l.strip_prefix("used_memory:")).unwrap().trim().parse().unwrap()
}

/// The pods hash of Job `key` (whichever shard's tag it is under).
async fn pods_hash(c: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let pattern = format!("*:view:{key}:pods");
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(c).await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys.into_iter().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_pod_costs_redis_under_a_kilobyte_in_the_view() {
    let redis = RedisServer::start().unwrap();
    let q = InProcessQueue::insecure(&redis.url()).await;
    let client = q.client.clone();
    let view_key = ViewKey::new(&[7; 32]).unwrap();
    let metrics = kjob_watcher::metrics::Metrics::register(&mut Default::default());
    let (tx, rx) = kjob_watcher::sender::channel();
    let sender = tokio::spawn(kjob_watcher::sender::run_sender(
        rx,
        client.clone(),
        metrics,
        Arc::new(AtomicBool::new(false)),
        Arc::new(tokio::sync::Notify::new()),
        view_key,
        tokio_util::sync::CancellationToken::new(),
    ));
    let session: Arc<str> = "watcher-1".into();
    tx.send(Enqueue::session(SessionControl::Begin(session.clone()))).await.unwrap();
    let mut c = conn(&redis).await;

    for (job, indexed) in [("train-resnet50", false), ("train-resnet50-sharded", true)] {
        let key = format!("{NS}/{job}");
        let item = |writes| Enqueue::view_only(key.clone(), session.clone(), writes);
        tx.send(item(vec![ViewWrite::Reset { uid: JOB_UID.into() }])).await.unwrap();
        // Wait for the reset to land, so the baseline holds the view's other keys.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let meta: Vec<String> = redis::cmd("KEYS")
                .arg(format!("*:view:{key}:meta"))
                .query_async(&mut c)
                .await
                .unwrap();
            if !meta.is_empty() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the reset never landed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = used_memory(&mut c).await;
        let mut entry = 0;
        let mut name_len = 0;
        for first in (0..PODS).step_by(200) {
            let writes = (first..(first + 200).min(PODS))
                .map(|i| {
                    let w: WatchedPod = serde_json::from_value(pod(job, indexed, i)).unwrap();
                    let object = w.view_entry();
                    entry += object.len();
                    let name = w.metadata.name.clone().unwrap();
                    name_len += name.len();
                    ViewWrite::Pod { name, object }
                })
                .collect();
            tx.send(item(writes)).await.unwrap();
        }
        let hash = loop {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("*:view:{key}:pods"))
                .query_async(&mut c)
                .await
                .unwrap();
            if let Some(h) = keys.first() {
                let n: usize = redis::cmd("HLEN").arg(h).query_async(&mut c).await.unwrap();
                if n == PODS {
                    break h.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(hash, pods_hash(&mut c, &key).await);
        let grown = used_memory(&mut c).await - before;
        let usage: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&hash)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut c)
            .await
            .unwrap();
        let per_pod = usage as f64 / PODS as f64;
        let grown_per_pod = grown as f64 / PODS as f64;
        let entry = entry as f64 / PODS as f64;
        let name = name_len as f64 / PODS as f64;
        let seal = kjob_core::seal::TAG_LEN;
        let total = entry + seal as f64;
        let kind = if indexed { "an Indexed Job" } else { "a single-pod-per-slot Job" };
        eprintln!(
            "{PODS} pods of {kind}: entry {total:.0} B ({entry:.0} B content + {seal} B seal), \
             field name {name:.0} B; MEMORY USAGE {per_pod:.0} B per pod; used_memory grew \
             {grown_per_pod:.0} B per pod"
        );
        assert!(per_pod < MAX_BYTES_PER_POD, "{per_pod:.0} B per pod in the pods hash");
        assert!(grown_per_pod < MAX_BYTES_PER_POD, "used_memory grew {grown_per_pod:.0} B per pod");
    }

    drop(tx);
    tokio::time::timeout(Duration::from_secs(30), sender).await.unwrap().unwrap().unwrap();
    q.stop().await;
}
