//! API cost of the steady path: a large Indexed Job through the real processes, counting the
//! worker's API calls per pod (every verb and resource, events included), on kjob-sim and on the
//! real control plane.

mod stack_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use stack_common::*;

const COMPLETIONS: i32 = 400;
const TIMEOUT: Duration = Duration::from_secs(150);
/// Most API calls per pod allowed on this path (create, finalizer removal, and the shares of
/// the per-sync GET, LIST and status write; events are capped per Job by the spam filter).
const MAX_CALLS_PER_POD: f64 = 2.5;
/// Most LISTs of the Job's pods per pod: syncs read the shared view.
const MAX_LISTS_PER_POD: f64 = 0.01;

async fn a_large_indexed_job_costs_few_api_calls_per_pod(server: kjob_testkit::server::TestServer) {
    let run_dir = tempfile::Builder::new().prefix("kjob-api-cost-").tempdir().unwrap();
    let ns = server.namespace("cost");
    let (stack, client) = start_stack_on(&server, &ns, run_dir.path().to_path_buf(), 1, &[]).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let shape = Shape::Indexed { completions: COMPLETIONS, parallelism: 100 };
    create_job_retrying(&jobs, &shape.job("big", kjob_core::DEFAULT_CONTROLLER_NAME, 500)).await;
    let deadline = Instant::now() + TIMEOUT;
    let job = loop {
        let j = jobs.get("big").await.unwrap();
        if terminal(&j).is_some() {
            break j;
        }
        assert!(Instant::now() < deadline, "not finished: {:?}", j.status);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(terminal(&job).unwrap().0, "Complete");
    assert_eq!(job.status.as_ref().unwrap().succeeded, Some(COMPLETIONS));
    // The finished Job's last Done lands a moment after its status.
    let queue = kjob_queue_client::QueueClient::connect_lazy(&stack.queue_url).unwrap();
    wait_queues_drained(&queue, Duration::from_secs(15)).await.unwrap();

    let w = &stack.workers()[0];
    let port = admin_port_from_log(&stack.log_path(w)).expect("admin port in the log");
    let text = tokio::task::block_in_place(|| http_get(port, "/metrics")).expect("metrics");
    let mut by_call: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("kjob_worker_api_calls_total{")) {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        *by_call.entry(labels.to_string()).or_default() += value.parse::<f64>().unwrap();
    }
    let total: f64 = by_call.values().sum();
    let per_pod = total / f64::from(COMPLETIONS);
    let filtered = metric_sum(&text, "kjob_worker_events_spam_filtered_total", &[]);
    eprintln!(
        "{total} API calls for {COMPLETIONS} pods: {per_pod:.2} per pod; {filtered} events filtered"
    );
    for (k, v) in &by_call {
        eprintln!("  {k} {v}");
    }
    let events = metric_sum(&text, "kjob_worker_api_calls_total", &["resource=\"events\""]);
    assert!(events <= 30.0, "the spam filter caps events about one Job: {events}");
    assert!(filtered >= f64::from(COMPLETIONS) - 30.0, "{filtered} events filtered");
    assert!(per_pod <= MAX_CALLS_PER_POD, "{per_pod:.2} API calls per pod: {by_call:#?}");
    // Syncs plan from the watcher's shared view, as upstream plans from its informer: the API
    // reads left are the few syncs before the view's first commit and conflict refreshes.
    let views = |r: &str| {
        metric_sum(&text, "kjob_worker_job_view_reads_total", &[&format!("result=\"{r}\"")])
    };
    let (trusted, untrusted) = (views("trusted"), views("untrusted"));
    eprintln!("view reads: {trusted} trusted, {untrusted} untrusted");
    // The worker holds the Job's view decoded between syncs: after the first sync's whole
    // read, its Leases bring only what changed (issue 46), and no delta misses what it holds.
    let cached = |r: &str| {
        metric_sum(&text, "kjob_worker_job_view_cache_total", &[&format!("result=\"{r}\"")])
    };
    let (deltas, fulls, gaps) = (cached("delta"), cached("full"), cached("gap"));
    eprintln!("view cache: {deltas} deltas, {fulls} whole, {gaps} gaps");
    assert!(deltas >= trusted / 2.0, "{deltas} deltas of {trusted} view reads");
    assert!(gaps <= 1.0, "{gaps} deltas did not fit the view held");
    assert!(trusted > 0.0 && untrusted <= 3.0, "{trusted} trusted, {untrusted} untrusted");
    // The Lease replies brought the views: a sync asks kjob-queue for one only when the
    // watcher's writes moved the view under kjob-queue's read three times running (this Job's
    // view spans two HSCAN chunks; a loaded CI run saw one such sync before the retry).
    let queue_admin = stack.admin_url(kjob_testkit::stack::QUEUE).expect("queue admin");
    let queue_port: u16 = queue_admin.rsplit(':').next().unwrap().parse().unwrap();
    let queue_text =
        tokio::task::block_in_place(|| http_get(queue_port, "/metrics")).expect("queue metrics");
    let asked =
        metric_sum(&queue_text, "grpc_server_handled_total", &["grpc_method=\"GetJobView\""]);
    assert!(asked <= 1.0, "{asked} GetJobView calls although the leases bring the views");
    // ... and the Dones carry the write-backs: PutJobView only after a conflict.
    let puts =
        metric_sum(&queue_text, "grpc_server_handled_total", &["grpc_method=\"PutJobView\""]);
    assert!(puts <= 3.0, "{puts} PutJobView calls although the Dones write the views back");
    // Every pod succeeds, so the pod-failure backoff record never changes from absent.
    let records =
        metric_sum(&queue_text, "grpc_server_handled_total", &["grpc_method=\"PutRecord\""]);
    assert_eq!(records, 0.0, "backoff records written for a Job without failures");
    let lists = metric_sum(&text, "kjob_worker_api_calls_total", &["verb=\"list\""]);
    assert!(
        lists / f64::from(COMPLETIONS) <= MAX_LISTS_PER_POD,
        "{lists} LISTs of pods for {COMPLETIONS} pods: {by_call:#?}"
    );
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    a_large_indexed_job_costs_few_api_calls_per_pod);
