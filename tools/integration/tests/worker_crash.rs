//! Faults: a worker killed mid-sync, workers restarted during pod-failure backoff, syncs longer
//! than their lease, and the drain on shutdown. Every test runs on kjob-sim and on the real
//! control plane; the write latency that stretches a sync is kjob-sim's own fault on kjob-sim
//! and the testkit's fault proxy in front of kube-apiserver on the real server (there only the
//! workers' traffic waits, not the test's).

mod common;

use std::time::{Duration, Instant};

use common::{
    Driver, Fate, QueueService, WorkerHandle, create_job, create_plain_job, finished, template,
};
use k8s_openapi::api::batch::v1::Job;
use kjob_testkit::faults::ApiFaults;
use kjob_testkit::server::TestServer;

const TIMEOUT: Duration = Duration::from_secs(20);

fn counts(job: &Job) -> (i32, i32, i32) {
    let s = job.status.clone().unwrap_or_default();
    (s.succeeded.unwrap_or(0), s.failed.unwrap_or(0), s.active.unwrap_or(0))
}

/// Every write of the workers takes a while, so a sync spans several hundred milliseconds and a
/// test can act between its pod creations and its status write.
const SLOW_WRITES: Duration = Duration::from_millis(300);

/// Creates namespace `base` (unique on the real server), delays every write of the workers on
/// `server` by `write_latency`, and starts a queue service; returns the test's client, the
/// namespace and the queue.
async fn slowed(
    server: &TestServer,
    base: &str,
    write_latency: Duration,
) -> (kube::Client, String, QueueService) {
    let ns = server.namespace(base);
    server.create_namespace(&ns).await;
    server.inject(ApiFaults::write_latency(write_latency)).await;
    (server.client(), ns, QueueService::start())
}

/// A worker on `server` (through its fault proxy on the real one) with the default 5 s grace.
fn worker(server: &TestServer, queue: &QueueService, id: &str, lease: Duration) -> WorkerHandle {
    WorkerHandle::on(server, queue, id, lease, Duration::from_secs(5))
}

async fn a_worker_killed_after_creating_pods_leaves_no_duplicates(server: TestServer) {
    let (client, ns, queue) = slowed(&server, "crash", SLOW_WRITES).await;
    let a = worker(&server, &queue, "a", Duration::from_secs(2));
    let mut d = Driver::new(client.clone(), queue.client(), &ns, "cj");
    create_plain_job(&client, &ns, "cj", 3, 3).await;
    d.queue
        .add(vec![kjob_queue_client::AddItem {
            queue: kjob_core::JOB_QUEUE.into(),
            key: format!("{ns}/cj"),
            ..Default::default()
        }])
        .await
        .unwrap();
    // Kill A as soon as all three pods exist, before its status write (300 ms away) lands.
    common::eventually("three pods", TIMEOUT, || {
        let d = &d;
        async move {
            let pods = d.pods().await;
            (pods.len() == 3).then_some(())
        }
    })
    .await;
    a.crash();
    let job = d.get_job().await.unwrap();
    let active_when_killed = counts(&job).2;
    // B takes over once A's lease expires; the test kubelet lets every pod succeed.
    let b = worker(&server, &queue, "b", Duration::from_secs(2));
    let job = d.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    assert!(common::condition(&job, "Complete").is_some(), "{:?}", job.status);
    assert_eq!(counts(&job), (3, 0, 0));
    assert_eq!(
        d.all_pods.len(),
        3,
        "no pod was created twice: {:?} (active at kill: {active_when_killed})",
        d.all_pods
    );
    for p in d.pods().await {
        assert!(
            !p.metadata.finalizers.iter().flatten().any(|f| f == kjob_core::JOB_TRACKING_FINALIZER)
        );
    }
    b.stop().await;
}

async fn pod_failure_backoff_survives_worker_restarts(server: TestServer) {
    let client = server.client();
    let ns = server.namespace("restart");
    server.create_namespace(&ns).await;
    let kubeconfig = server.worker_kubeconfig();
    let queue = QueueService::start();
    let queue_url = queue.url.clone();
    let start_worker = |id: &str| {
        WorkerHandle::start_on(
            &kubeconfig,
            &queue_url,
            id,
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
    };
    let mut w = Some(start_worker("w1"));
    let mut d = Driver::new(client.clone(), queue.client(), &ns, "rb");
    create_job(&client, &ns, serde_json::json!({
        "metadata": {"name": "rb"},
        "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 3, "template": template("Never")}
    }))
    .await;
    let mut first_uid = None::<String>;
    let mut failed_at = None::<Instant>;
    let mut restarted = 0;
    let start = Instant::now();
    let replacement = loop {
        let mut fate = |p: &k8s_openapi::api::core::v1::Pod| {
            let uid = p.metadata.uid.clone().unwrap();
            if first_uid.get_or_insert(uid.clone()) == &uid {
                failed_at.get_or_insert_with(Instant::now);
                Fate::Fail(1)
            } else {
                Fate::Run
            }
        };
        d.step(&mut fate).await;
        if d.all_pods.len() > 1 {
            break failed_at.expect("first pod failed").elapsed();
        }
        // Restart every worker twice during the 10 s backoff: a fresh process must keep it.
        if let Some(t) = failed_at
            && restarted < 2
            && t.elapsed() > Duration::from_secs(2 + 3 * restarted)
        {
            w.take().unwrap().stop().await;
            w = Some(start_worker(&format!("w{}", restarted + 2)));
            restarted += 1;
        }
        assert!(start.elapsed() < TIMEOUT, "no replacement pod after {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(restarted, 2);
    // Upstream: the first failure delays the replacement by 10 s (DefaultJobPodFailureBackOff),
    // counted from the pod's finishedAt, which has second precision: up to 1 s of the test's
    // own stopwatch is truncated away. A forgotten backoff would replace it at the restart (~2 s).
    assert!(replacement >= Duration::from_millis(8900), "replacement after only {replacement:?}");
    let job = d.get_job().await.unwrap();
    assert_eq!(counts(&job).1, 1);
    w.take().unwrap().stop().await;
}

async fn syncs_longer_than_the_lease_are_renewed_and_two_workers_share_jobs(server: TestServer) {
    let (client, ns, queue) = slowed(&server, "renew", SLOW_WRITES).await;
    // A 1 s lease against syncs of several 300 ms writes: only renewals keep them.
    let a = worker(&server, &queue, "a", Duration::from_secs(1));
    let b = worker(&server, &queue, "b", Duration::from_secs(1));
    let names = ["r0", "r1", "r2"];
    for n in names {
        create_plain_job(&client, &ns, n, 4, 4).await;
    }
    let mut drivers: Vec<Driver> =
        names.iter().map(|n| Driver::new(client.clone(), queue.client(), &ns, n)).collect();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let mut done = 0;
        for d in &mut drivers {
            d.step(&mut |_| Fate::Succeed).await;
            if d.get_job().await.is_some_and(|j| finished(&j)) {
                done += 1;
            }
        }
        if done == drivers.len() {
            break;
        }
        assert!(Instant::now() < deadline, "jobs did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for d in &drivers {
        let job = d.get_job().await.unwrap();
        assert_eq!(counts(&job), (4, 0, 0), "{}", d.job);
        assert_eq!(d.all_pods.len(), 4, "{}: {:?}", d.job, d.all_pods);
    }
    for w in [&a, &b] {
        let (code, body) = w.admin_get("/metrics").await;
        assert_eq!(code, 200);
        assert!(!body.contains("outcome=\"lease_lost\""), "{body}");
        assert!(body.contains("job_controller_job_syncs_total{"), "{body}");
        assert_eq!(w.admin_get("/readyz").await.0, 200);
    }
    a.stop().await;
    b.stop().await;
}

async fn shutdown_hands_back_syncs_that_outlive_the_grace(server: TestServer) {
    let (client, ns, queue) = slowed(&server, "drain", Duration::from_millis(800)).await;
    let a =
        WorkerHandle::on(&server, &queue, "a", Duration::from_secs(10), Duration::from_millis(200));
    let mut d = Driver::new(client.clone(), queue.client(), &ns, "dr");
    create_plain_job(&client, &ns, "dr", 4, 4).await;
    d.step(&mut |_| Fate::Run).await;
    // Wait until A is mid-sync (its first pod exists; three more creates in two slow-start
    // batches and a status write, 400 ms each, are still to come), then drain with a 200 ms
    // grace.
    common::eventually("first pod", TIMEOUT, || {
        let d = &d;
        async move { (!d.pods().await.is_empty()).then_some(()) }
    })
    .await;
    let stopped = Instant::now();
    a.stop().await;
    // Grace (0.2 s) + wind-down (the batch in flight and one status write, 0.4 s each) + at most
    // 5 s flushing queued events through the slow API.
    assert!(stopped.elapsed() < Duration::from_secs(9), "drain took {:?}", stopped.elapsed());
    // The key was handed back (not left to its 10 s lease): B picks it up at once.
    let inspect = d.queue.inspect(kjob_core::JOB_QUEUE, vec![format!("{ns}/dr")]).await.unwrap();
    let state = &inspect.keys[0];
    assert_ne!(state.state, "leased", "{state:?}");
    let b = worker(&server, &queue, "b", Duration::from_secs(10));
    let job = d.run_until(Duration::from_secs(30), &mut |_| Fate::Succeed, &mut finished).await;
    assert_eq!(counts(&job), (4, 0, 0));
    assert_eq!(d.all_pods.len(), 4, "{:?}", d.all_pods);
    b.stop().await;
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    a_worker_killed_after_creating_pods_leaves_no_duplicates,
    pod_failure_backoff_survives_worker_restarts,
    syncs_longer_than_the_lease_are_renewed_and_two_workers_share_jobs,
    shutdown_hands_back_syncs_that_outlive_the_grace);
