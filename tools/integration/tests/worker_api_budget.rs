//! The workers' one API budget through the real processes: with `--api-qps-total Q` the
//! requests the API server saw from the workers, summed over 1 or 4 workers, stay within
//! 1.1 × Q over every 10 s window while a backlog of Jobs keeps them busy, and every Job still
//! completes exactly; a share of 429 answers slows the shared rate down (and it shows in the
//! workers' and kjob-queue's metrics).
//!
//! The rate is what the server received, sampled every second: on kjob-sim its own
//! `kjob_sim_apiserver_requests_by_agent_total` for the workers' User-Agent (`kjob-worker/…`);
//! on the real control plane, the requests with that User-Agent the stack's own proxy in front
//! of kube-apiserver forwarded (kube-apiserver's `apiserver_request_total` has no per-client
//! label, and the workers of every test on the shared control plane share one ServiceAccount).

mod stack_common;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kjob_testkit::faults::ApiFaults;
use kjob_testkit::server::TestServer;
use kube::Api;
use stack_common::*;

/// The total budget the tests give: well below what the workers do unbounded on kjob-sim
/// (hundreds of requests a second), so it binds.
const QPS: f64 = 20.0;
/// The total burst: at most QPS/2, so a 10 s window holds at most
/// burst + 10·QPS + the tokens the workers hold (one batch each) = 1.1 × QPS · 10 s.
const BURST: u32 = 10;
/// Jobs in the backlog: about six worker requests each (pod create, finalizer removal, status
/// writes, events), so about 25 s of the budget.
const JOBS: usize = 80;
/// Time for every Job to finish at the budget.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);
/// Length of the windows checked.
const WINDOW: Duration = Duration::from_secs(10);

/// The workers' requests as kjob-sim counted them: by their User-Agent (`kjob-worker/…`).
fn worker_requests(metrics: &str) -> f64 {
    metric_sum(metrics, "kjob_sim_apiserver_requests_by_agent_total", &["agent=\"kjob-worker\""])
}

/// One sample of the workers' request counter.
struct Sample {
    at: Instant,
    requests: f64,
}

/// On the real control plane, what the stack's own proxy in front of kube-apiserver forwarded
/// from the workers (by their User-Agent; only this stack's services go through it); on
/// kjob-sim, the sim's own counter.
fn sample(stack: &kjob_testkit::Stack) -> Sample {
    let requests = match stack.fault_proxy() {
        Ok(proxy) => proxy.forwarded_from("kjob-worker") as f64,
        Err(_) => {
            let (code, body) = stack.sim_get("/metrics").expect("kjob-sim /metrics");
            assert_eq!(code, 200);
            worker_requests(&String::from_utf8_lossy(&body))
        }
    };
    Sample { at: Instant::now(), requests }
}

/// The highest rate over any window of at least [`WINDOW`] between samples taken every second,
/// and the requests counted in all.
fn peak_window_rate(samples: &[Sample]) -> (f64, f64) {
    let mut peak = 0.0f64;
    for (i, a) in samples.iter().enumerate() {
        if let Some(b) = samples[i..].iter().find(|b| b.at.duration_since(a.at) >= WINDOW) {
            peak = peak.max((b.requests - a.requests) / b.at.duration_since(a.at).as_secs_f64());
        }
    }
    let total = samples.last().map_or(0.0, |l| l.requests) - samples[0].requests;
    (peak, total)
}

/// Every Job of a backlog completes with `workers` workers sharing `--api-qps-total`, and the
/// workers' summed rate stays within 1.1 × QPS over every 10 s window (while reaching most of
/// it: the budget binds).
async fn the_budget_bounds_the_summed_rate(server: TestServer, workers: usize) {
    let run_dir = tempfile::Builder::new().prefix("kjob-api-budget-").tempdir().unwrap();
    let ns = server.namespace(&format!("budget-{workers}"));
    let args = [format!("--api-qps-total={QPS}"), format!("--api-burst-total={BURST}")];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut stack, client) =
        start_stack_on(&server, &ns, run_dir.path().to_path_buf(), workers, &args).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let shape = Shape::NonIndexed { completions: 1, parallelism: 1 };

    let mut samples = vec![tokio::task::block_in_place(|| sample(&stack))];
    for i in 0..JOBS {
        create_job_retrying(
            &jobs,
            &shape.job(&format!("b-{i:03}"), kjob_core::DEFAULT_CONTROLLER_NAME, 100),
        )
        .await;
    }
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let finished = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(tokio::task::block_in_place(|| sample(&stack)));
        let list = list_all(&jobs).await;
        let done = list.iter().filter(|j| terminal(j).is_some()).count();
        if done >= JOBS || Instant::now() > deadline {
            break list;
        }
    };
    // The last writes (finalizer removals after the terminal condition) land within seconds.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(tokio::task::block_in_place(|| sample(&stack)));
    }
    let elapsed = samples.last().unwrap().at.duration_since(samples[0].at);
    let (peak, total) = peak_window_rate(&samples);
    eprintln!(
        "{workers} worker(s), budget {QPS}/s burst {BURST}: {total} worker requests in {:.1}s \
         ({:.1}/s); highest 10 s window {peak:.1}/s",
        elapsed.as_secs_f64(),
        total / elapsed.as_secs_f64()
    );

    let mut violations = Vec::new();
    let complete = finished
        .iter()
        .filter(|j| terminal(j).is_some_and(|(c, _)| c == "Complete"))
        .filter(|j| j.status.as_ref().and_then(|s| s.succeeded) == Some(1))
        .count();
    if complete != JOBS {
        violations.push(format!("{complete} of {JOBS} Jobs complete with one success"));
    }
    if peak > 1.1 * QPS {
        violations.push(format!("a 10 s window at {peak:.1} requests/s > 1.1 × {QPS}"));
    }
    if peak < 0.6 * QPS {
        violations.push(format!("the budget did not bind: at most {peak:.1} requests/s"));
    }
    let mut waits = 0.0;
    for w in stack.workers() {
        let port = admin_port_from_log(&stack.log_path(&w)).expect("worker logged its admin port");
        let text = tokio::task::block_in_place(|| http_get(port, "/metrics")).expect("metrics");
        waits += metric_sum(&text, "kjob_worker_api_budget_waits_total", &[]);
        let tokens = metric_sum(&text, "kjob_worker_api_budget_tokens_total", &[]);
        let calls = metric_sum(&text, "kjob_worker_api_calls_total", &[]);
        eprintln!("{w}: {tokens} budget tokens, {calls} API calls");
        if tokens < 1.0 {
            violations.push(format!("{w} took no token of the budget"));
        }
    }
    if waits < 1.0 {
        violations.push("no request waited for the budget".into());
    }
    let alive = tokio::task::block_in_place(|| stack.check_alive());
    fail_on_violations(&stack, run_dir, &violations, alive);
}

async fn one_worker_stays_within_the_budget(server: TestServer) {
    the_budget_bounds_the_summed_rate(server, 1).await;
}

async fn four_workers_stay_within_the_budget(server: TestServer) {
    the_budget_bounds_the_summed_rate(server, 4).await;
}

/// With a share of 429 answers the workers report them and the shared rate comes down
/// (kjob-queue's gauge and slowdown counter, and the workers'); every Job still completes.
async fn throttling_lowers_the_shared_rate(server: TestServer) {
    let run_dir = tempfile::Builder::new().prefix("kjob-api-budget-429-").tempdir().unwrap();
    let ns = server.namespace("budget-429");
    let args = ["--api-qps-total=50", "--api-burst-total=25"];
    let (mut stack, client) =
        start_stack_on(&server, &ns, run_dir.path().to_path_buf(), 2, &args).await;
    tokio::task::block_in_place(|| stack.inject(&ApiFaults::errors(0.2, 0.0))).unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let shape = Shape::NonIndexed { completions: 1, parallelism: 1 };
    let n = 20;
    for i in 0..n {
        create_job_retrying(
            &jobs,
            &shape.job(&format!("t-{i:02}"), kjob_core::DEFAULT_CONTROLLER_NAME, 100),
        )
        .await;
    }
    let finished = wait_terminal(&jobs, n, CONVERGE_TIMEOUT).await;
    let queue_admin = stack.admin_url(kjob_testkit::stack::QUEUE).expect("queue admin");
    let queue_port: u16 = queue_admin.rsplit(':').next().unwrap().parse().unwrap();
    let queue_text =
        tokio::task::block_in_place(|| http_get(queue_port, "/metrics")).expect("queue metrics");
    tokio::task::block_in_place(|| stack.inject(&ApiFaults::none())).unwrap();

    let mut violations = Vec::new();
    let complete =
        finished.iter().filter(|j| terminal(j).is_some_and(|(c, _)| c == "Complete")).count();
    if complete != n {
        violations.push(format!("{complete} of {n} Jobs complete"));
    }
    let slowdowns = metric_sum(&queue_text, "kjob_queue_api_budget_slowdowns_total", &[]);
    let throttled = metric_sum(&queue_text, "kjob_queue_api_budget_throttled_total", &[]);
    let rate = metric_sum(&queue_text, "kjob_queue_api_budget_rate", &[]);
    eprintln!("429s reported {throttled}, slowdowns {slowdowns}, rate now {rate}/s");
    if throttled < 1.0 || slowdowns < 1.0 {
        violations.push(format!("429s not reported ({throttled}) or no slowdown ({slowdowns})"));
    }
    if rate >= 50.0 {
        violations.push(format!("the shared rate did not come down: {rate}/s"));
    }
    let mut reported = 0.0;
    for w in stack.workers() {
        let port = admin_port_from_log(&stack.log_path(&w)).expect("worker logged its admin port");
        let text = tokio::task::block_in_place(|| http_get(port, "/metrics")).expect("metrics");
        reported += metric_sum(&text, "kjob_worker_api_budget_throttled_total", &[]);
    }
    if reported != throttled {
        violations.push(format!("workers reported {reported} 429s, kjob-queue saw {throttled}"));
    }
    let alive = tokio::task::block_in_place(|| stack.check_alive());
    fail_on_violations(&stack, run_dir, &violations, alive);
}

/// One namespace's big Job cannot take the whole budget: while a 300-pod Job in `big` keeps
/// the workers asking for far more than the budget, five single-pod Jobs created in `small`
/// afterwards all complete within [`SMALL_DEADLINE`] (their ~35 requests at their half of the
/// budget take about 4 s), before the big Job is done.
async fn a_big_job_leaves_other_namespaces_their_share(server: TestServer) {
    let run_dir = tempfile::Builder::new().prefix("kjob-api-budget-fair-").tempdir().unwrap();
    let big_ns = server.namespace("budget-big");
    let small_ns = server.namespace("budget-small");
    let args = [format!("--api-qps-total={QPS}"), format!("--api-burst-total={BURST}")];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut stack, client) =
        start_stack_on(&server, &big_ns, run_dir.path().to_path_buf(), 2, &args).await;
    create_namespace(&client, &small_ns).await;
    let big: Api<Job> = Api::namespaced(client.clone(), &big_ns);
    let small: Api<Job> = Api::namespaced(client.clone(), &small_ns);
    let controller = kjob_core::DEFAULT_CONTROLLER_NAME;
    let huge = Shape::Indexed { completions: 300, parallelism: 300 };
    create_job_retrying(&big, &huge.job("huge", controller, 100)).await;
    // Let the big Job's syncs take the budget first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let one = Shape::NonIndexed { completions: 1, parallelism: 1 };
    let created = Instant::now();
    for i in 0..5 {
        create_job_retrying(&small, &one.job(&format!("s-{i}"), controller, 100)).await;
    }
    let finished = wait_terminal(&small, 5, SMALL_DEADLINE).await;
    let took = created.elapsed();
    let huge_job = big.get("huge").await.unwrap();
    let succeeded = huge_job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0);
    eprintln!(
        "5 small Jobs finished in {:.1}s while the big Job had {succeeded}/300 pods succeeded",
        took.as_secs_f64()
    );
    let mut violations = Vec::new();
    let complete =
        finished.iter().filter(|j| terminal(j).is_some_and(|(c, _)| c == "Complete")).count();
    if complete != 5 {
        violations.push(format!("{complete} of 5 small Jobs complete within {SMALL_DEADLINE:?}"));
    }
    if terminal(&huge_job).is_some() {
        violations.push("the big Job finished first: the budget never bound".into());
    }
    let alive = tokio::task::block_in_place(|| stack.check_alive());
    fail_on_violations(&stack, run_dir, &violations, alive);
}

/// How long five single-pod Jobs in a second namespace may take beside the big Job.
const SMALL_DEADLINE: Duration = Duration::from_secs(15);

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    one_worker_stays_within_the_budget,
    four_workers_stay_within_the_budget,
    throttling_lowers_the_shared_rate);

// kjob-sim only: on the real control plane each test's stack runs its watcher scoped to one
// namespace (the control plane is shared by every test), so a second namespace is not watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_job_leaves_other_namespaces_their_share_on_sim() {
    let server = TestServer::sim(kjob_sim::SimConfig::default()).await;
    a_big_job_leaves_other_namespaces_their_share(server).await;
}
