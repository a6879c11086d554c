//! API server faults: a share of every request is answered with 429 (with
//! `retryAfterSeconds`) or 500 while real kjob processes run mixed Jobs — by kjob-sim itself, or
//! on the real control plane by the testkit's fault proxy the services reach kube-apiserver
//! through. Workers back off and retry, every Job still ends exactly as upstream would with no
//! pod created twice, and `kjob_worker_api_calls_total` shows the refused calls by result.

mod stack_common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kjob_queue_client::QueueClient;
use kjob_testkit::faults::ApiFaults;
use kjob_testkit::server::TestServer;
use kube::Api;
use stack_common::*;

/// Time for every Job to finish under faults (the backoffLimit Jobs wait 10 s of pod-failure
/// backoff, and every 429 costs at least the server's one-second hint).
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

async fn workers_ride_out_429_and_500_without_duplicates(server: TestServer) {
    let started = std::time::Instant::now();
    let run_dir = tempfile::Builder::new().prefix("kjob-api-faults-").tempdir().unwrap();
    let ns = server.namespace("faults");
    let (mut stack, client) =
        start_stack_on(&server, &ns, run_dir.path().to_path_buf(), 2, &["--lease-duration=10s"])
            .await;
    let tracker = PodTracker::start(&client, &ns).await;
    tokio::task::block_in_place(|| stack.inject(&ApiFaults::errors(0.15, 0.1))).unwrap();

    // Every kind except the eviction one (its harness calls would fight the faults too).
    let shapes: BTreeMap<String, Shape> = (0..30)
        .map(Shape::nth)
        .filter(|s| !matches!(s, Shape::Ignore { .. }))
        .enumerate()
        .map(|(i, s)| (format!("f-{i:02}"), s))
        .collect();
    let jobs_api: Api<Job> = Api::namespaced(client.clone(), &ns);
    for (name, shape) in &shapes {
        create_job_retrying(&jobs_api, &shape.job(name, kjob_core::DEFAULT_CONTROLLER_NAME, 300))
            .await;
    }
    let jobs = wait_terminal(&jobs_api, shapes.len(), CONVERGE_TIMEOUT).await;
    tokio::task::block_in_place(|| stack.inject(&ApiFaults::none())).unwrap();

    let pods = settled_pods(&Api::namespaced(client.clone(), &ns), &tracker).await;
    let queue = QueueClient::connect_lazy(&stack.queue_url).unwrap();
    let drained = wait_queues_drained(&queue, Duration::from_secs(15)).await;

    let mut violations = check_jobs(&jobs, &shapes, &tracker);
    let kept = pods_with_finalizer(&pods);
    if !kept.is_empty() {
        violations.push(format!("{} pods keep the tracking finalizer: {kept:?}", kept.len()));
    }
    if tracker.total() != pods.len() {
        violations.push(format!(
            "{} pods ever created but {} present: some were created and deleted",
            tracker.total(),
            pods.len()
        ));
    }
    if let Err(busy) = drained {
        violations.push(format!("queues not drained: {busy}"));
    }

    // The refused calls show up in the workers' API call counters, by result.
    let mut by_result: BTreeMap<&str, f64> = BTreeMap::new();
    for w in stack.workers() {
        let port = admin_port_from_log(&stack.log_path(&w)).expect("worker logged its admin port");
        let text = tokio::task::block_in_place(|| http_get(port, "/metrics")).expect("metrics");
        for result in ["429", "500", "ok"] {
            let needle = format!("result=\"{result}\"");
            *by_result.entry(result).or_default() +=
                metric_sum(&text, "kjob_worker_api_calls_total", &[&needle]);
        }
    }
    if by_result["429"] < 1.0 || by_result["500"] < 1.0 {
        violations.push(format!("refused calls not counted: {by_result:?}"));
    }
    let alive = tokio::task::block_in_place(|| stack.check_alive());
    eprintln!(
        "api calls by result: {by_result:?}; {} pods created; {:.1}s",
        tracker.total(),
        started.elapsed().as_secs_f64()
    );
    fail_on_violations(&stack, run_dir, &violations, alive);
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    workers_ride_out_429_and_500_without_duplicates);
