//! Events as upstream's Job controller writes them (core/v1, source `job-controller`, counted
//! and combined by client-go's correlator), with two workers' sinks writing about one Job: a
//! repeat from the other worker counts up the same Event. On kjob-sim and on the real control
//! plane, where the sinks write under the worker's ServiceAccount (create and patch on events,
//! nothing more). With kjob-queue's shared correlator, two workers' events about one Job stay
//! within one spam-filter burst; without kjob-queue, each falls back to its own.

mod common;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Event;
use kjob_testkit::server::TestServer;
use kjob_worker::events::{EventSink, EventType};
use kjob_worker::kube_api::KubeApi;
use kjob_worker::metrics::Metrics;
use kube::Api;

const TIMEOUT: Duration = Duration::from_secs(10);

async fn sink(server: &TestServer, id: &str) -> (EventSink, tokio::task::JoinHandle<()>) {
    let (sink, writer, _) = sink_with(server, id, None).await;
    (sink, writer)
}

/// A worker's event sink, gating through kjob-queue at `queue_url` when given; with its
/// metrics.
async fn sink_with(
    server: &TestServer,
    id: &str,
    queue_url: Option<&str>,
) -> (EventSink, tokio::task::JoinHandle<()>, Metrics) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::new(&mut registry);
    let client =
        kjob_testkit::server::kube_client(&server.worker_kubeconfig(), None).await.unwrap();
    let api = KubeApi::new(client, 100.0, 100, metrics.clone());
    let (sink, mut writer) =
        EventSink::new(api, kjob_core::DEFAULT_CONTROLLER_NAME, id, metrics.clone());
    if let Some(url) = queue_url {
        writer =
            writer.with_shared_gate(kjob_queue_client::QueueClient::connect_lazy(url).unwrap());
    }
    (sink, tokio::spawn(writer.run()), metrics)
}

/// A Job `cnt` in a fresh namespace `ns`, and the namespace's Events.
async fn job_cnt(server: &TestServer, ns: &str) -> (Job, Api<Event>) {
    let client = server.client();
    let ns = server.namespace(ns);
    server.create_namespace(&ns).await;
    let job = common::create_job(
        &client,
        &ns,
        serde_json::json!({"metadata": {"name": "cnt"}, "spec": {"template": common::template("Never")}}),
    )
    .await;
    (job, Api::namespaced(client, &ns))
}

/// The Job's events, as `kubectl describe job` finds them (core/v1, by involved object).
async fn job_events(events: &Api<Event>, job: &Job) -> Vec<Event> {
    let uid = job.metadata.uid.clone().unwrap();
    let lp = kube::api::ListParams::default().fields(&format!(
        "involvedObject.kind=Job,involvedObject.name=cnt,involvedObject.uid={uid}"
    ));
    let mut items = events.list(&lp).await.unwrap().items;
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    items
}

fn count_of(evs: &[Event], message: &str) -> Option<i32> {
    evs.iter().find(|e| e.message.as_deref() == Some(message)).and_then(|e| e.count)
}

async fn repeats_from_any_worker_count_up_one_event_and_similar_ones_are_combined(
    server: TestServer,
) {
    let (job, events) = job_cnt(&server, "events").await;
    let (w1, t1) = sink(&server, "w1").await;
    let (w2, t2) = sink(&server, "w2").await;

    // The same event from worker 1, then twice from worker 2 (which never saw it).
    let quota = "Error creating: pods \"cnt-x\" is forbidden: exceeded quota";
    w1.job_event(&job, EventType::Warning, "FailedCreate", quota);
    common::eventually("the first event", TIMEOUT, || async {
        count_of(&job_events(&events, &job).await, quota).filter(|c| *c == 1)
    })
    .await;
    w2.job_event(&job, EventType::Warning, "FailedCreate", quota);
    w2.job_event(&job, EventType::Warning, "FailedCreate", quota);
    common::eventually("one event counted three times", TIMEOUT, || async {
        count_of(&job_events(&events, &job).await, quota).filter(|c| *c == 3)
    })
    .await;
    // Then once more from worker 1, whose last write is now stale.
    w1.job_event(&job, EventType::Warning, "FailedCreate", quota);
    let evs = common::eventually("worker 1 counts on from the server's count", TIMEOUT, || async {
        let evs = job_events(&events, &job).await;
        (count_of(&evs, quota) == Some(4)).then_some(evs)
    })
    .await;
    assert_eq!(evs.len(), 1, "one Event object: {evs:#?}");
    let e = &evs[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reason.as_deref(), Some("FailedCreate"));
    assert_eq!(e.source.as_ref().and_then(|s| s.component.as_deref()), Some("job-controller"));
    assert_eq!(e.reporting_component.as_deref(), Some(kjob_core::DEFAULT_CONTROLLER_NAME));
    assert_eq!(e.involved_object.api_version.as_deref(), Some("batch/v1"));
    let (first, last) = (e.first_timestamp.clone().unwrap(), e.last_timestamp.clone().unwrap());
    assert!(first.0 <= last.0, "{first:?} {last:?}");

    // Twelve pods created, each its own message: nine stand alone, the rest are combined.
    for i in 0..12 {
        w1.job_event(&job, EventType::Normal, "SuccessfulCreate", &format!("Created pod: cnt-{i}"));
    }
    let combined = "(combined from similar events): Created pod: cnt-11";
    let evs = common::eventually("the combined event", TIMEOUT, || async {
        let evs = job_events(&events, &job).await;
        (count_of(&evs, combined) == Some(3)).then_some(evs)
    })
    .await;
    let creates: Vec<&Event> =
        evs.iter().filter(|e| e.reason.as_deref() == Some("SuccessfulCreate")).collect();
    assert_eq!(creates.len(), 10, "9 single events and 1 combined: {creates:#?}");
    for i in 0..9 {
        assert_eq!(count_of(&evs, &format!("Created pod: cnt-{i}")), Some(1));
    }
    drop((w1, w2));
    t1.await.unwrap();
    t2.await.unwrap();
}

/// 30 events from each of two workers about one Job, every one its own Event (another reason
/// each, so none is counted up or combined): the Job's one token bucket, kept by kjob-queue,
/// lets 25 through in all (upstream's burst), where two per-process buckets let 50 through.
async fn two_workers_share_one_spam_burst_per_job(server: TestServer) {
    let (job, events) = job_cnt(&server, "events-burst").await;
    let queue = common::QueueService::start();
    let (w1, t1, m1) = sink_with(&server, "w1", Some(&queue.url)).await;
    let (w2, t2, m2) = sink_with(&server, "w2", Some(&queue.url)).await;
    for i in 0..30 {
        w1.job_event(&job, EventType::Normal, &format!("FromOne{i}"), "an event of worker 1");
        w2.job_event(&job, EventType::Normal, &format!("FromTwo{i}"), "an event of worker 2");
    }
    common::eventually("35 of 60 events spam-filtered", TIMEOUT, || async {
        let filtered = m1.events_spam_filtered.get() + m2.events_spam_filtered.get();
        (filtered == 35).then_some(())
    })
    .await;
    let evs = common::eventually("the 25 events let through are written", TIMEOUT, || async {
        let evs = job_events(&events, &job).await;
        (evs.len() >= 25).then_some(evs)
    })
    .await;
    assert_eq!(evs.len(), 25, "one burst for the Job, not one per worker");
    assert!(evs.iter().all(|e| e.count == Some(1)), "{evs:#?}");
    assert_eq!(m1.events_gate_fallback.get() + m2.events_gate_fallback.get(), 0);
    drop((w1, w2));
    t1.await.unwrap();
    t2.await.unwrap();
    // Nothing more arrives later (every writer has finished).
    assert_eq!(job_events(&events, &job).await.len(), 25);
}

/// A worker whose kjob-queue does not answer gates with its own state: its events are still
/// written (the burst of 25, then dropped), and the fallback is counted.
async fn without_kjob_queue_a_worker_falls_back_to_its_own_correlator(server: TestServer) {
    let (job, events) = job_cnt(&server, "events-fallback").await;
    // A port nothing listens on: the gate call is refused at once.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let (w, t, m) = sink_with(&server, "w1", Some(&url)).await;
    for i in 0..30 {
        w.job_event(&job, EventType::Normal, &format!("Local{i}"), "an event");
    }
    let evs = common::eventually("the local burst is written", TIMEOUT, || async {
        let evs = job_events(&events, &job).await;
        (evs.len() >= 25 && m.events_spam_filtered.get() == 5).then_some(evs)
    })
    .await;
    assert_eq!(evs.len(), 25);
    assert_eq!(m.events_gate_fallback.get(), 30, "every event gated locally, and counted");
    drop(w);
    t.await.unwrap();
}

/// `name` (a counter without labels) on worker `w`'s `/metrics`.
async fn counter(w: &common::WorkerHandle, name: &str) -> f64 {
    let (_, text) = w.admin_get("/metrics").await;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

/// Two kjob-worker runs sync one Job of 40 pods (its syncs go to whichever worker leases it
/// next): between them the Job's events pass one spam-filter burst of 25, every other recorded
/// event is filtered.
async fn two_worker_processes_keep_a_job_within_one_burst(server: TestServer) {
    let ns = server.namespace("events-workers");
    server.create_namespace(&ns).await;
    let queue = common::QueueService::start();
    let lease = Duration::from_secs(5);
    let workers: Vec<common::WorkerHandle> = ["w1", "w2"]
        .iter()
        .map(|id| common::WorkerHandle::on(&server, &queue, id, lease, lease))
        .collect();
    let mut driver = common::Driver::new(server.client(), queue.client(), &ns, "burst");
    common::create_job(
        &server.client(),
        &ns,
        serde_json::json!({
            "metadata": {"name": "burst"},
            "spec": {"completions": 40, "parallelism": 4, "template": common::template("Never")}
        }),
    )
    .await;
    driver
        .run_until(Duration::from_secs(120), &mut |_| common::Fate::Succeed, &mut common::finished)
        .await;
    let (recorded, filtered) =
        common::eventually("every recorded event gated", TIMEOUT, || async {
            let mut recorded = Vec::new();
            let mut filtered = 0.0;
            for w in &workers {
                recorded.push(counter(w, "kjob_worker_events_recorded_total").await);
                filtered += counter(w, "kjob_worker_events_spam_filtered_total").await;
            }
            let total: f64 = recorded.iter().sum();
            (total >= 41.0 && filtered == total - 25.0).then_some((recorded, filtered))
        })
        .await;
    eprintln!("events recorded per worker: {recorded:?}; spam-filtered in all: {filtered}");
    for w in &workers {
        assert_eq!(counter(w, "kjob_worker_events_gate_fallback_total").await, 0.0);
    }
    for w in workers {
        w.stop().await;
    }
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    two_worker_processes_keep_a_job_within_one_burst,
    repeats_from_any_worker_count_up_one_event_and_similar_ones_are_combined,
    two_workers_share_one_spam_burst_per_job,
    without_kjob_queue_a_worker_falls_back_to_its_own_correlator);
