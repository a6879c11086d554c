//! A Job view larger than any reply may be (issue 46): 40,000 pods written by the watcher's
//! sender (trimmed and sealed as the watcher writes them), through kjob-queue over a real
//! redis-server. The worker's read (`QueueClient::read_job_view`) gets every pod exactly once,
//! page by page; no reply kjob-queue sends is above `MAX_REPLY_BYTES` (measured by a raw
//! client that would accept more); a caller older than paged views gets an untrusted answer
//! (it reads the API server) instead of a reply it cannot take; a Lease leaves the view to the
//! lessee; a pod written between two pages makes the read say the view moved.

mod queue_common;

use queue_common::InProcessQueue;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kjob_core::seal::{EntryKind, ViewKey};
use kjob_proto::v1;
use kjob_proto::v1::job_state_client::JobStateClient;
use kjob_queue_client::{CachedView, LeaseCall, Outcome, QueueClient, ViewPages};
use kjob_testkit::RedisServer;
use kjob_watcher::handlers::{Enqueue, SessionControl};
use kjob_watcher::view::ViewWrite;
use kjob_worker::sync::view_pods;
use kjob_worker::view_cache::ViewCache;
use prost::Message;
use serde_json::json;
use tonic::transport::Channel;

const NS: &str = "huge";
const JOB: &str = "huge";
const UID: &str = "0b5c1f3e-9d4a-4c61-8b0e-2f7a6d9e4c10";
/// More pods than fit in one 16 MiB reply at the per-pod size of [`pod`] (about 550 bytes a
/// compact entry, with its template's labels).
const PODS: usize = 40_000;

/// Pod `i` of the Job as the API server shows a running pod of an Indexed Job.
fn pod(i: usize) -> Pod {
    let t = "2026-12-07T06:00:00Z";
    let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{JOB}-{i}-{:05x}", i * 7919 % 0xfffff),
            "namespace": NS,
            "uid": format!("7c1e{i:04x}-52f1-4a8e-9b3d-{i:012x}"),
            "resourceVersion": (1000 + i).to_string(),
            "creationTimestamp": t,
            "labels": {
                "batch.kubernetes.io/controller-uid": UID,
                "batch.kubernetes.io/job-name": JOB,
                "batch.kubernetes.io/job-completion-index": i.to_string(),
                "controller-uid": UID,
                "job-name": JOB,
                // The template's own labels, as a large training Job's carry them.
                "app.kubernetes.io/name": "distributed-training",
                "app.kubernetes.io/instance": "huge-run-2026-12-07-experiment-0042",
                "app.kubernetes.io/part-of": "ml-platform-research-pipelines",
                "team.example.com/cost-center": "research-and-development-gpu-fleet-0007",
                "team.example.com/owner": "someone-with-a-long-name-at-example-com",
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": i.to_string()},
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": UID,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": format!("node-{}", i % 50),
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                cond("ContainersReady"), cond("PodScheduled"),
            ],
            "containerStatuses": [{
                "name": "main", "ready": true, "restartCount": 0,
                "image": "registry.k8s.io/pause:3.10", "imageID": "",
                "state": {"running": {"startedAt": t}},
            }],
        },
    }))
    .unwrap()
}

/// Writes a committed view of [`PODS`] pods through the watcher's sender, as a snapshot is
/// written (Reset, the pods in items of 200, the Job, Trust); returns its sender and task.
async fn write_view(
    client: &QueueClient,
    view_key: &ViewKey,
) -> (tokio::sync::mpsc::Sender<Enqueue>, tokio::task::JoinHandle<()>) {
    let metrics = kjob_watcher::metrics::Metrics::register(&mut Default::default());
    let (tx, rx) = kjob_watcher::sender::channel();
    let sender = tokio::spawn({
        let (client, metrics, view_key) = (client.clone(), metrics.clone(), view_key.clone());
        async move {
            kjob_watcher::sender::run_sender(
                rx,
                client,
                metrics,
                Arc::new(AtomicBool::new(false)),
                Arc::new(tokio::sync::Notify::new()),
                view_key,
                tokio_util::sync::CancellationToken::new(),
            )
            .await
            .unwrap();
        }
    });
    let session: Arc<str> = "watcher-1".into();
    let key = format!("{NS}/{JOB}");
    let item = |writes| Enqueue::view_only(key.clone(), session.clone(), writes);
    tx.send(Enqueue::session(SessionControl::Begin(session.clone()))).await.unwrap();
    tx.send(item(vec![ViewWrite::Reset { uid: UID.into() }])).await.unwrap();
    for first in (0..PODS).step_by(200) {
        let writes = (first..(first + 200).min(PODS))
            .map(|i| {
                let p = pod(i);
                let name = p.metadata.name.clone().unwrap();
                ViewWrite::Pod { name, object: kjob_watcher::view::trim_pod(&p) }
            })
            .collect();
        tx.send(item(writes)).await.unwrap();
    }
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": NS, "uid": UID, "resourceVersion": "5"},
        "spec": {"completions": PODS, "parallelism": PODS, "completionMode": "Indexed",
                 "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}},
                 "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}}},
    });
    let job = ViewWrite::Job {
        uid: UID.into(),
        object: serde_json::to_vec(&job).unwrap().into(),
        resource_version: "5".into(),
    };
    tx.send(item(vec![job, ViewWrite::Trust])).await.unwrap();
    tx.send(Enqueue::session(SessionControl::Commit(session))).await.unwrap();
    (tx, sender)
}

/// Waits until the view of `key` is trusted and holds `n` pods (the sender's Adds landed).
async fn until_trusted(client: &QueueClient, key: &str, n: u64) -> v1::GetJobViewResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let first = client.get_job_view_page(key, &[], "").await.unwrap();
        if first.trusted && first.pod_count == Some(n) {
            return v1::GetJobViewResponse {
                trusted: true,
                version: first.version,
                next_page: first.next_page,
                ..Default::default()
            };
        }
        assert!(tokio::time::Instant::now() < deadline, "the view never became whole");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_past_the_reply_cap_is_read_in_pages_of_one_version() {
    let redis = RedisServer::start().unwrap();
    let q = InProcessQueue::insecure(&redis.url()).await;
    let (url, client) = (q.url.clone(), q.client.clone());
    let view_key = ViewKey::new(&[7; 32]).unwrap();
    let key = format!("{NS}/{JOB}");

    let trimmed = kjob_watcher::view::trim_pod(&pod(0)).len();
    let (tx, sender) = write_view(&client, &view_key).await;
    let first = until_trusted(&client, &key, PODS as u64).await;
    assert!(!first.next_page.is_empty(), "a view of {PODS} pods of {trimmed} bytes is paged");

    // The worker's read: every pod exactly once, each sealed for this Job.
    let view = match client.read_job_view(&key, &["backoff"], None).await.unwrap() {
        ViewPages::Trusted(v) => *v,
        other => panic!("{other:?}"),
    };
    assert_eq!(view.pods.len(), PODS);
    let mut names = HashSet::new();
    for sealed in &view.pods {
        let bytes = view_key.open(EntryKind::Pod, &key, sealed).expect("sealed for this Job");
        let p: Pod = kjob_reconcile::view_pod::decode(bytes, NS).unwrap();
        assert!(names.insert(p.metadata.name.unwrap()), "a pod twice");
    }
    assert!((0..PODS).all(|i| names.contains(pod(i).metadata.name.as_deref().unwrap())));
    assert_eq!(view.job_uid, UID);

    // Every reply, measured by a client that would take far more: under the cap.
    let channel = Channel::from_shared(url.clone()).unwrap().connect_lazy();
    let mut raw = JobStateClient::new(channel).max_decoding_message_size(usize::MAX);
    let (mut page, mut sizes, mut pods) = (String::new(), Vec::new(), 0);
    loop {
        let r = raw
            .get_job_view(v1::GetJobViewRequest {
                key: key.clone(),
                paged: true,
                page: page.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.trusted && r.version == first.version);
        sizes.push(r.encoded_len());
        pods += r.pods.len();
        page = r.next_page;
        if page.is_empty() {
            break;
        }
    }
    let largest = *sizes.iter().max().unwrap();
    let whole: usize = sizes.iter().sum();
    eprintln!(
        "{PODS} pods of {trimmed} bytes trimmed: {} pages, largest reply {largest} bytes, \
         {whole} bytes in all",
        sizes.len()
    );
    assert_eq!(pods, PODS);
    assert!(largest <= kjob_core::MAX_REPLY_BYTES, "a reply of {largest} bytes");
    assert!(whole > kjob_core::MAX_REPLY_BYTES, "the view would not fit one reply");

    // A worker older than paged views asks for the whole view: untrusted, so it lists.
    let old = raw
        .get_job_view(v1::GetJobViewRequest { key: key.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(!old.trusted && old.pods.is_empty(), "an unpaged caller gets no partial view");
    // A page token that is not one kjob-queue made is refused.
    let bad = v1::GetJobViewRequest { key: key.clone(), page: "x".into(), ..Default::default() };
    let status = raw.get_job_view(bad).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // Records come with the first page only.
    let later = v1::GetJobViewRequest {
        key: key.clone(),
        page: first.next_page.clone(),
        records: vec!["backoff".into()],
        ..Default::default()
    };
    let status = raw.get_job_view(later).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    deltas_equal_full_reads(&client, &mut raw, &tx, &view_key).await;

    // A Lease brings no view it cannot carry whole: the lessee reads it in pages.
    let item =
        kjob_queue_client::AddItem { queue: "job".into(), key: key.clone(), ..Default::default() };
    client.add(vec![item]).await.unwrap();
    let leased = client
        .lease_with_views("job", 1, Duration::from_secs(30), Duration::from_secs(5), "w", &[])
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].view, None, "left to the lessee");

    // One pod written between two pages: the read says the view moved, never a mix.
    let first_page = client.get_job_view_page(&key, &[], "").await.unwrap();
    let mut changed = pod(17);
    changed.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let write = ViewWrite::Pod {
        name: changed.metadata.name.clone().unwrap(),
        object: kjob_watcher::view::trim_pod(&changed),
    };
    tx.send(Enqueue::view_only(key.clone(), "watcher-1".into(), vec![write])).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.get_job_view_page(&key, &[], "").await.unwrap().version == first_page.version {
        assert!(tokio::time::Instant::now() < deadline, "the write never landed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let read = client.read_job_view(&key, &[], Some(first_page)).await.unwrap();
    assert_eq!(read, ViewPages::Moved);
    // Read again from the start: whole, with the new pod.
    let again = client.get_job_view(&key, &[]).await.unwrap().expect("trusted");
    assert_eq!(again.pods.len(), PODS);

    drop(tx);
    tokio::time::timeout(Duration::from_secs(30), sender).await.unwrap().unwrap();
    q.stop().await;
}

/// Reads `key`'s view the worker's way with its cache (`view_pods`): what a sync plans from.
async fn cached_read(
    client: &QueueClient,
    key: &str,
    view_key: &ViewKey,
    cache: &ViewCache,
) -> (kjob_reconcile::SummarizedPods, bool) {
    let base = cache.base(key);
    let b = base.as_ref().map(|(v, e)| (*v, e.as_str()));
    let v = match client.read_job_view_cached(key, &["backoff"], None, b).await.unwrap() {
        ViewPages::Trusted(v) => *v,
        other => panic!("{other:?}"),
    };
    let delta = v.delta;
    (view_pods(v, key, view_key, Some(cache)).unwrap(), delta)
}

/// The same, read whole and decoded without a cache.
async fn full_read(client: &QueueClient, key: &str, view_key: &ViewKey) -> Vec<Arc<Pod>> {
    let v = match client.read_job_view(key, &[], None).await.unwrap() {
        ViewPages::Trusted(v) => *v,
        other => panic!("{other:?}"),
    };
    view_pods(v, key, view_key, None).unwrap().pods().to_vec()
}

/// Issue 46 through real kjob-queue: a worker holding the 40,000-pod view decoded reads only
/// what changed (pods updated, removed and created by the watcher's sender), in a reply of a
/// few kilobytes, and plans from exactly the pods a full read gives; a Lease that names the
/// view held brings its delta; one naming another session's version does not.
async fn deltas_equal_full_reads(
    client: &QueueClient,
    raw: &mut JobStateClient<Channel>,
    tx: &tokio::sync::mpsc::Sender<Enqueue>,
    view_key: &ViewKey,
) {
    let key = format!("{NS}/{JOB}");
    let cache = ViewCache::new(kjob_worker::view_cache::DEFAULT_VIEW_CACHE_PODS);
    let (mut pods, delta) = cached_read(client, &key, view_key, &cache).await;
    assert!(!delta, "the first read is whole");
    assert_eq!(pods.len(), PODS);
    // A pod no round changes: every read through the cache hands over the one decoded Pod.
    let untouched = pod(7).metadata.name.unwrap();
    let held = |p: &kjob_reconcile::SummarizedPods| {
        p.find_by_name(&untouched).map(|i| p.pods()[i].clone()).expect("held")
    };
    for round in 0..6 {
        let (version, epoch) = cache.base(&key).expect("held");
        // A pod updated, one removed, one created.
        let mut changed = pod(100 + round);
        changed.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let created = pod(PODS + round);
        let writes = vec![
            ViewWrite::Pod {
                name: changed.metadata.name.clone().unwrap(),
                object: kjob_watcher::view::trim_pod(&changed),
            },
            ViewWrite::DeletePod { name: pod(200 + round).metadata.name.clone().unwrap() },
            ViewWrite::Pod {
                name: created.metadata.name.clone().unwrap(),
                object: kjob_watcher::view::trim_pod(&created),
            },
        ];
        tx.send(Enqueue::view_only(key.clone(), "watcher-1".into(), writes)).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let reply = loop {
            let r = raw
                .get_job_view(v1::GetJobViewRequest {
                    key: key.clone(),
                    base_version: Some(version),
                    base_epoch: epoch.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            if r.version != version {
                break r;
            }
            assert!(tokio::time::Instant::now() < deadline, "the write never landed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(reply.delta && reply.trusted, "round {round}: a delta");
        assert_eq!((reply.pods.len(), reply.removed.len()), (2, 1), "round {round}");
        assert_eq!(reply.pod_count, Some(PODS as u64), "one removed, one created");
        assert!(reply.encoded_len() < 16 * 1024, "a delta of {} bytes", reply.encoded_len());
        let (by_delta, delta) = cached_read(client, &key, view_key, &cache).await;
        assert!(delta, "round {round}");
        let full = full_read(client, &key, view_key).await;
        assert!(by_delta.pods() == full.as_slice(), "round {round}: the pods a full read gives");
        assert!(Arc::ptr_eq(&held(&by_delta), &held(&pods)), "round {round}: shared, not copied");
        pods = by_delta;
    }

    // A Lease naming the view held brings what changed since.
    let (version, epoch) = cache.base(&key).unwrap();
    let mut changed = pod(300);
    changed.status.as_mut().unwrap().phase = Some("Failed".into());
    let write = ViewWrite::Pod {
        name: changed.metadata.name.clone().unwrap(),
        object: kjob_watcher::view::trim_pod(&changed),
    };
    tx.send(Enqueue::view_only(key.clone(), "watcher-1".into(), vec![write])).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.get_job_view_page(&key, &[], "").await.unwrap().version == version {
        assert!(tokio::time::Instant::now() < deadline, "the write never landed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lease = |cached: Vec<CachedView>| {
        let key = key.clone();
        async move {
            let item = kjob_queue_client::AddItem {
                queue: "job".into(),
                key: key.clone(),
                ..Default::default()
            };
            client.add(vec![item]).await.unwrap();
            let call = LeaseCall {
                queue: "job",
                max_items: 1,
                lease: Duration::from_secs(30),
                wait: Duration::from_secs(5),
                worker_id: "w",
                records: Some(&[]),
                cached: Some(cached.as_slice()),
            };
            let (mut leased, _) = client.lease_finishing(call, Vec::new()).await.unwrap();
            assert_eq!(leased.len(), 1);
            let it = leased.remove(0);
            client.done("job", &key, &it.lease_id, Outcome::Forget).await.unwrap();
            it.view
        }
    };
    let held = CachedView { key: key.clone(), version, epoch: epoch.clone() };
    let view = lease(vec![held]).await.expect("the delta rides along");
    assert!(view.delta && view.delta_base == version);
    assert_eq!(view.pods.len(), 1);
    let by_lease = view_pods(view, &key, view_key, Some(&cache)).unwrap();
    assert!(by_lease.pods() == full_read(client, &key, view_key).await.as_slice());
    // Another session's token: no delta; the whole view does not fit a Lease reply.
    let (version, _) = cache.base(&key).unwrap();
    let stale = CachedView { key: key.clone(), version, epoch: "00".into() };
    assert_eq!(lease(vec![stale]).await, None, "left to the lessee");
    // A token kjob-queue never makes is refused.
    let bad = v1::GetJobViewRequest {
        key: key.clone(),
        base_version: Some(1),
        base_epoch: "not hex".into(),
        ..Default::default()
    };
    let status = raw.get_job_view(bad).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}
