//! Measures what reading a large Job's shared view costs (issue 46): writes the view of one Job
//! of N realistic pods (default 20,000) through the watcher's sender into kjob-queue (in
//! process, over a private redis-server), then reads it R times (default 10) as a worker does
//! and reports the largest gRPC reply and the reading thread's CPU per read, two ways:
//!
//! * `one reply` — how a view was read before paging: the whole view as one GetJobView reply.
//!   kjob-queue no longer sends a reply above 16 MiB, so that reply is built here from the
//!   pages and only its decoding is timed (no HTTP/2 or TLS work: a lower bound of what it
//!   cost).
//! * `paged` — now: `QueueClient::read_job_view`, page by page over gRPC (plaintext).
//!
//! Either way each read then opens every pod's seal and decodes it into a `Pod` sorted by name,
//! the work of the worker's `decode_view`. CPU is the reading thread's own (utime + stime of
//! `/proc/thread-self/stat`), so kjob-queue's and Redis's work is not in it; Redis's bytes per
//! pod are `used_memory` grown by the view.
//!
//! `cargo run --release -p kjob-bench --example view_pages -- 20000 10`

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kjob_core::seal::{EntryKind, ViewKey};
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{JobView, QueueClient, ViewPages, v1};
use kjob_svc::Shutdown;
use kjob_testkit::RedisServer;
use kjob_watcher::handlers::{Enqueue, SessionControl};
use kjob_watcher::view::ViewWrite;
use prost::Message;
use serde_json::json;

const NS: &str = "bench";
const JOB: &str = "huge";
const UID: &str = "0b5c1f3e-9d4a-4c61-8b0e-2f7a6d9e4c10";

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
    .expect("a pod")
}

/// CPU seconds this thread has used (utime + stime).
fn thread_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// The worker's decode of a view's pods: open each seal, decode the entry (compact or the older
/// JSON) into a Pod, sort by name.
fn decode(view: &JobView, key: &str, view_key: &ViewKey) -> usize {
    let mut pods: Vec<Pod> = view
        .pods
        .iter()
        .map(|sealed| {
            let bytes = view_key.open(EntryKind::Pod, key, sealed).expect("sealed");
            kjob_reconcile::view_pod::decode(bytes, NS).expect("a pod")
        })
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods.len()
}

async fn used_memory(redis: &RedisServer) -> u64 {
    let client = redis::Client::open(redis.url()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut conn).await.expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20_000);
    let reads: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let redis = RedisServer::start()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let shutdown = Shutdown::new();
    let config = QueueConfig::new(redis.url(), Security::InsecureNoAuth);
    let server = rt.spawn(kjob_queue::run(Listeners::grpc(listener), config, shutdown.clone()));
    // The writer's client lives on this runtime (its connection task too).
    let client = {
        let _rt = rt.enter();
        QueueClient::connect_lazy(&url)?
    };
    let view_key = ViewKey::new(&[7; 32]).ok_or_else(|| anyhow::anyhow!("a view key"))?;
    let key = format!("{NS}/{JOB}");

    // The view, written as the watcher writes a snapshot.
    let before = rt.block_on(used_memory(&redis));
    let trimmed = kjob_watcher::view::trim_pod(&pod(0)).len();
    let written = Instant::now();
    rt.block_on(async {
        let metrics = kjob_watcher::metrics::Metrics::register(&mut Default::default());
        let (tx, rx) = kjob_watcher::sender::channel();
        let sender = tokio::spawn(kjob_watcher::sender::run_sender(
            rx,
            client.clone(),
            metrics,
            Arc::new(AtomicBool::new(false)),
            Arc::new(tokio::sync::Notify::new()),
            view_key.clone(),
            tokio_util::sync::CancellationToken::new(),
        ));
        let session: Arc<str> = "bench".into();
        let item = |writes| Enqueue::view_only(key.clone(), session.clone(), writes);
        tx.send(Enqueue::session(SessionControl::Begin(session.clone()))).await?;
        tx.send(item(vec![ViewWrite::Reset { uid: UID.into() }])).await?;
        for first in (0..n).step_by(200) {
            let writes = (first..(first + 200).min(n))
                .map(|i| {
                    let p = pod(i);
                    let name = p.metadata.name.clone().unwrap_or_default();
                    ViewWrite::Pod { name, object: kjob_watcher::view::trim_pod(&p) }
                })
                .collect();
            tx.send(item(writes)).await?;
        }
        let job = json!({"metadata": {"name": JOB, "namespace": NS, "uid": UID}});
        let job = ViewWrite::Job {
            uid: UID.into(),
            object: serde_json::to_vec(&job)?.into(),
            resource_version: "5".into(),
        };
        tx.send(item(vec![job, ViewWrite::Trust])).await?;
        tx.send(Enqueue::session(SessionControl::Commit(session))).await?;
        drop(tx);
        sender.await??;
        anyhow::Ok(())
    })?;
    let written = written.elapsed();
    let redis_bytes = rt.block_on(used_memory(&redis)).saturating_sub(before);

    // The reads, on a thread of their own so its CPU is the reader's alone.
    let reader = {
        let (key, view_key) = (key.clone(), view_key.clone());
        std::thread::spawn(move || -> anyhow::Result<String> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            // A client of this thread's runtime: its HTTP/2 connection's work is this thread's.
            let client = {
                let _rt = rt.enter();
                QueueClient::connect_lazy(&url)?
            };
            // Page sizes, as a raw client that takes any size sees them.
            let (pages, largest) = rt.block_on(async {
                let channel =
                    tonic::transport::Channel::from_shared(url.clone())?.connect().await?;
                let mut raw = v1::job_state_client::JobStateClient::new(channel)
                    .max_decoding_message_size(usize::MAX);
                let (mut page, mut sizes) = (String::new(), Vec::new());
                loop {
                    let req = v1::GetJobViewRequest {
                        key: key.clone(),
                        paged: true,
                        page: page.clone(),
                        ..Default::default()
                    };
                    let r = raw.get_job_view(req).await?.into_inner();
                    sizes.push(r.encoded_len());
                    page = r.next_page;
                    if page.is_empty() {
                        break;
                    }
                }
                anyhow::Ok((sizes.len(), sizes.into_iter().max().unwrap_or(0)))
            })?;
            let whole = match rt.block_on(client.read_job_view(&key, &[], None))? {
                ViewPages::Trusted(v) => v,
                other => anyhow::bail!("the view is not readable: {other:?}"),
            };
            let one_reply = v1::GetJobViewResponse {
                trusted: true,
                job: whole.job.clone(),
                pods: whole.pods.clone(),
                job_uid: whole.job_uid.clone(),
                ..Default::default()
            }
            .encode_to_vec();

            let (cpu, wall) = (thread_cpu_secs(), Instant::now());
            for _ in 0..reads {
                let r = v1::GetJobViewResponse::decode(one_reply.as_slice())?;
                assert_eq!(decode(&JobView::from(r), &key, &view_key), n);
            }
            let old = ((thread_cpu_secs() - cpu) / reads as f64, wall.elapsed() / reads as u32);
            let (cpu, wall) = (thread_cpu_secs(), Instant::now());
            for _ in 0..reads {
                let v = match rt.block_on(client.read_job_view(&key, &[], None))? {
                    ViewPages::Trusted(v) => v,
                    other => anyhow::bail!("the view is not readable: {other:?}"),
                };
                assert_eq!(decode(&v, &key, &view_key), n);
            }
            let new = ((thread_cpu_secs() - cpu) / reads as f64, wall.elapsed() / reads as u32);
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            Ok(format!(
                "| read | largest reply (bytes) | replies per read | reader CPU per read (ms) | wall per read (ms) |\n\
                 |---|---:|---:|---:|---:|\n\
                 | one reply (before; decode only) | {} | 1 | {:.1} | {:.1} |\n\
                 | paged (now; gRPC) | {largest} | {pages} | {:.1} | {:.1} |\n",
                one_reply.len(),
                old.0 * 1000.0,
                ms(old.1),
                new.0 * 1000.0,
                ms(new.1),
            ))
        })
    };
    let table = reader.join().map_err(|_| anyhow::anyhow!("the reader panicked"))??;
    println!("# Reading one Job's shared view: {n} pods, {reads} reads each way\n");
    println!(
        "Trimmed pod {trimmed} bytes (before sealing); the view took Redis {redis_bytes} bytes \
         ({} per pod); written by the watcher's sender in {:.1} s.\n",
        redis_bytes / n.max(1) as u64,
        written.as_secs_f64()
    );
    println!("{table}");
    shutdown.cancel();
    rt.block_on(server)??;
    Ok(())
}
