//! Measures a sync's read of a large Job's shared view, and its plan, after one pod changed
//! (issue 46: a sync costs what changed): writes the view of one Job of N realistic pods
//! (default 20,000) through the watcher's sender into kjob-queue (in process, over a private
//! redis-server), then R times (default 20) changes one pod (as the watcher writes a pod
//! update) and syncs as a worker does, two ways:
//!
//! * `full` — the whole view, page by page (`QueueClient::read_job_view`), every entry opened
//!   and decoded into the pods the Job claims (`kjob_worker::sync::view_pods` without a
//!   cache).
//! * `delta` — what changed since the version the worker holds
//!   (`QueueClient::read_job_view_cached` with its base), applied to the worker's view cache,
//!   whose pods the plan then reads (`view_pods` with the cache); the pods handed to the plan
//!   are the same as the full read's (checked every round).
//!
//! Each way then plans one sync (`kjob_reconcile::JobSync` over the pods handed over, every
//! step answered as successful) and drops its pods, as a sync ends. CPU is the syncing
//! thread's own (`/proc/thread-self/schedstat`, in nanoseconds; gRPC included), so kjob-queue's
//! and Redis's work is not in it. Redis bytes per pod are `used_memory` grown by the view,
//! after every pod was changed once more (so the change log holds every pod).
//!
//! `cargo run --release -p kjob-bench --example view_delta -- 20000 20`

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::seal::ViewKey;
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{QueueClient, ViewPages};
use kjob_svc::Shutdown;
use kjob_testkit::RedisServer;
use kjob_watcher::handlers::{Enqueue, SessionControl};
use kjob_watcher::view::ViewWrite;
use kjob_worker::view_cache::ViewCache;
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

/// CPU seconds this thread has used: the scheduler's run time in nanoseconds, or else utime +
/// stime in 10 ms ticks.
fn thread_cpu_secs() -> f64 {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    if let Some(ns) = schedstat.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()) {
        return ns as f64 / 1e9;
    }
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
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

/// Pod `i` after its `round`-th change: a restart counted (what the view keeps changes).
fn changed_pod(i: usize, round: usize) -> Pod {
    let mut p = pod(i);
    if let Some(cs) = p.status.as_mut().and_then(|s| s.container_statuses.as_mut()) {
        cs[0].restart_count = i32::try_from(round + 1).unwrap_or(i32::MAX);
    }
    p
}

fn pod_write(p: &Pod) -> ViewWrite {
    let name = p.metadata.name.clone().unwrap_or_default();
    ViewWrite::Pod { name, object: kjob_watcher::view::trim_pod(p) }
}

/// The Job of the view, as the API server shows an Indexed Job with every pod running.
fn job(n: usize) -> serde_json::Value {
    let labels =
        json!({"batch.kubernetes.io/controller-uid": UID, "batch.kubernetes.io/job-name": JOB});
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": NS, "uid": UID, "resourceVersion": "5"},
        "spec": {
            "completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 6,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
        "status": {
            "startTime": "2026-12-07T06:00:00Z", "active": n, "ready": n, "terminating": 0,
            "uncountedTerminatedPods": {},
        },
    })
}

/// Plans one sync of `job` from `pods` (what a worker's sync does once its read is done),
/// answering every step as successful; returns the number of steps.
fn plan(job: &Job, pods: &kjob_reconcile::SummarizedPods) -> usize {
    use kjob_reconcile::{JobSync, Step, SyncInput};
    let in_flight = Default::default();
    let input = SyncInput {
        job,
        pods: pods.as_slice(),
        now: jiff::Timestamp::now(),
        expectations_satisfied: true,
        finalizer_removals_in_flight: &in_flight,
        backoff: None,
        controller_name: kjob_core::DEFAULT_CONTROLLER_NAME,
        manage_all: true,
    };
    let mut sync = JobSync::with_summaries(input, pods.summaries());
    let mut steps = 0;
    loop {
        steps += 1;
        let step = sync.next_step();
        if matches!(step, Step::Done(_)) {
            return steps;
        }
        let Some(report) = step.all_succeeded(|i| format!("new-{i}")) else { continue };
        if sync.report(report).is_err() {
            return steps;
        }
    }
}

/// The names of the pods a plan gets, in order, and their restart counts: what a full read and
/// a delta must agree on.
fn fingerprint(pods: &kjob_reconcile::SummarizedPods) -> Vec<(String, i32)> {
    pods.pods()
        .iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            (p.metadata.name.clone().unwrap_or_default(), restarts)
        })
        .collect()
}

/// The syncing thread's CPU over all rounds, in seconds.
#[derive(Debug, Default)]
struct Cpu {
    /// Syncs that read the view whole: read, plan, pods dropped.
    full: f64,
    /// Of which the plan.
    full_plan: f64,
    /// Of which dropping the pods.
    full_drop: f64,
    /// Syncs that read what changed.
    delta: f64,
    /// Of which the plan.
    delta_plan: f64,
    /// Of which dropping the pods.
    delta_drop: f64,
    /// Reads that came as deltas.
    deltas: usize,
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20_000);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let redis = RedisServer::start()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let shutdown = Shutdown::new();
    let config = QueueConfig::new(redis.url(), Security::InsecureNoAuth);
    let server = rt.spawn(kjob_queue::run(Listeners::grpc(listener), config, shutdown.clone()));
    let client = {
        let _rt = rt.enter();
        QueueClient::connect_lazy(&url)?
    };
    let view_key = ViewKey::new(&[7; 32]).ok_or_else(|| anyhow::anyhow!("a view key"))?;
    let key = format!("{NS}/{JOB}");
    let before = rt.block_on(used_memory(&redis));

    // The watcher's sender, kept open: the rounds write pod updates through it.
    let metrics = kjob_watcher::metrics::Metrics::register(&mut Default::default());
    let (tx, rx) = kjob_watcher::sender::channel();
    let sender = rt.spawn(kjob_watcher::sender::run_sender(
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
    rt.block_on(async {
        tx.send(Enqueue::session(SessionControl::Begin(session.clone()))).await?;
        tx.send(item(vec![ViewWrite::Reset { uid: UID.into() }])).await?;
        for first in (0..n).step_by(200) {
            let writes = (first..(first + 200).min(n)).map(|i| pod_write(&pod(i))).collect();
            tx.send(item(writes)).await?;
        }
        let job = ViewWrite::Job {
            uid: UID.into(),
            object: serde_json::to_vec(&job(n))?.into(),
            resource_version: "5".into(),
        };
        tx.send(item(vec![job, ViewWrite::Trust])).await?;
        tx.send(Enqueue::session(SessionControl::Commit(session.clone()))).await?;
        anyhow::Ok(())
    })?;

    // Wait for the snapshot to land: the view's version and epoch token from then on.
    let mut head = rt.block_on(async {
        loop {
            if let Ok(ViewPages::Trusted(v)) = client.read_job_view(&key, &[], None).await
                && v.pod_count == Some(n as u64)
            {
                break (v.version, v.epoch);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    // Writes one batch through the sender and waits until kjob-queue has it (the view's
    // version moved: a delta read from the last version seen, cheap), so a read after it sees
    // it.
    let mut write = |writes: Vec<ViewWrite>| -> anyhow::Result<()> {
        rt.block_on(async {
            tx.send(item(writes)).await?;
            loop {
                let base = Some((head.0, head.1.as_str()));
                if let ViewPages::Trusted(v) =
                    client.read_job_view_cached(&key, &[], None, base).await?
                    && v.version != head.0
                {
                    head.0 = v.version;
                    return anyhow::Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    };
    let (tx_round, rx_round) = std::sync::mpsc::channel::<usize>();
    let (tx_done, rx_done) = std::sync::mpsc::channel::<()>();
    // The reads, on a thread of their own so its CPU is the reader's alone.
    let reader = {
        let (key, view_key, url) = (key.clone(), view_key.clone(), url.clone());
        std::thread::spawn(move || -> anyhow::Result<Cpu> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let client = {
                let _rt = rt.enter();
                QueueClient::connect_lazy(&url)?
            };
            let job: Job = serde_json::from_value(job(n))?;
            let cache = ViewCache::new(kjob_worker::view_cache::DEFAULT_VIEW_CACHE_PODS);
            let read = |base: Option<(u64, String)>| -> anyhow::Result<kjob_queue_client::JobView> {
                let b = base.as_ref().map(|(v, e)| (*v, e.as_str()));
                match rt.block_on(client.read_job_view_cached(&key, &[], None, b))? {
                    ViewPages::Trusted(v) => Ok(*v),
                    other => anyhow::bail!("the view is not readable: {other:?}"),
                }
            };
            // The first read fills the cache (a sync's first read of the Job).
            let first = read(None)?;
            let pods = kjob_worker::sync::view_pods(first, &key, &view_key, Some(&cache))
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(pods.len() == n, "{} pods held", pods.len());
            drop(pods);
            // Filled: the writes may begin.
            tx_done.send(())?;
            let mut cpu = Cpu::default();
            for _round in rx_round {
                // A sync that reads the view whole: read, plan, and drop its pods at the end.
                let t = thread_cpu_secs();
                let v = match rt.block_on(client.read_job_view(&key, &[], None))? {
                    ViewPages::Trusted(v) => *v,
                    other => anyhow::bail!("the view is not readable: {other:?}"),
                };
                let full = kjob_worker::sync::view_pods(v, &key, &view_key, None)
                    .map_err(anyhow::Error::msg)?;
                let planning = thread_cpu_secs();
                std::hint::black_box(plan(&job, &full));
                let planned = thread_cpu_secs();
                let want = fingerprint(&full);
                let dropping = thread_cpu_secs();
                drop(full);
                let end = thread_cpu_secs();
                // The fingerprint (a check, not the sync's) is left out.
                cpu.full += (planned - t) + (end - dropping);
                cpu.full_plan += planned - planning;
                cpu.full_drop += end - dropping;

                // A sync that reads what changed into the cache and plans from the held pods.
                let t = thread_cpu_secs();
                let v = read(cache.base(&key))?;
                cpu.deltas += usize::from(v.delta);
                let by_delta = kjob_worker::sync::view_pods(v, &key, &view_key, Some(&cache))
                    .map_err(anyhow::Error::msg)?;
                let planning = thread_cpu_secs();
                std::hint::black_box(plan(&job, &by_delta));
                let planned = thread_cpu_secs();
                let got = fingerprint(&by_delta);
                let dropping = thread_cpu_secs();
                drop(by_delta);
                let end = thread_cpu_secs();
                cpu.delta += (planned - t) + (end - dropping);
                cpu.delta_plan += planned - planning;
                cpu.delta_drop += end - dropping;
                anyhow::ensure!(want == got, "the delta's pods are not the full read's");
                tx_done.send(())?;
            }
            Ok(cpu)
        })
    };
    // The reader's first read (the cache filled) before any write: else it would race one.
    let mut ready = rx_done.recv().is_ok();
    for round in 0..rounds {
        if !ready {
            break;
        }
        let i = (round * 7919) % n;
        write(vec![pod_write(&changed_pod(i, round))])?;
        // A reader that stopped says why when joined.
        ready = tx_round.send(round).is_ok() && rx_done.recv().is_ok();
    }
    drop(tx_round);
    let cpu = reader.join().map_err(|_| anyhow::anyhow!("the reader panicked"))??;

    // Every pod changed once more: the change log holds each.
    for first in (0..n).step_by(200) {
        let writes =
            (first..(first + 200).min(n)).map(|i| pod_write(&changed_pod(i, rounds))).collect();
        write(writes)?;
    }
    let redis_bytes = rt.block_on(used_memory(&redis)).saturating_sub(before);
    drop(tx);
    rt.block_on(sender)??;

    let ms = |s: f64| s * 1000.0 / rounds as f64;
    let pct = |a: f64, b: f64| 100.0 * a / b.max(f64::MIN_POSITIVE);
    println!("# A sync after one pod of {n} changed: {rounds} rounds\n");
    println!("| per sync, syncing thread's CPU (ms) | full read | delta read |\n|---|---:|---:|");
    println!(
        "| whole sync: read, plan, pods dropped | {:.2} | {:.2} |",
        ms(cpu.full),
        ms(cpu.delta)
    );
    println!(
        "| of which: the read (pods handed to the plan) | {:.2} | {:.2} |",
        ms(cpu.full - cpu.full_plan - cpu.full_drop),
        ms(cpu.delta - cpu.delta_plan - cpu.delta_drop)
    );
    println!("| of which: the plan | {:.2} | {:.2} |", ms(cpu.full_plan), ms(cpu.delta_plan));
    println!(
        "| of which: the pods dropped as the sync ends | {:.2} | {:.2} |",
        ms(cpu.full_drop),
        ms(cpu.delta_drop)
    );
    println!(
        "\nsync after one pod changed ÷ sync reading the whole view: {:.1} % (reads alone: {:.1} %; \
         {} of {rounds} reads were deltas; the pods planned from matched the full read's every \
         round)",
        pct(cpu.delta, cpu.full),
        pct(cpu.delta - cpu.delta_plan - cpu.delta_drop, cpu.full - cpu.full_plan - cpu.full_drop),
        cpu.deltas,
    );
    println!(
        "Redis: {redis_bytes} bytes for the view with every pod in its change log \
         ({} per pod)",
        redis_bytes / n.max(1) as u64
    );
    shutdown.cancel();
    rt.block_on(server)??;
    Ok(())
}
