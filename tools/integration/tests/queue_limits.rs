//! kjob-queue's input limits, sent one past each by a raw gRPC client (not kjob's own client,
//! which would refuse some of them before sending): every request is refused with
//! INVALID_ARGUMENT naming the rule, and Redis holds exactly what it held before. Then the
//! global concurrency limit: calls held up for real in Redis fill it, the one past it is
//! refused with RESOURCE_EXHAUSTED naming it, and the held ones complete afterwards.

mod queue_common;

use queue_common::InProcessQueue;

use std::time::Duration;

use kjob_proto::v1;
use kjob_proto::v1::job_state_client::JobStateClient;
use kjob_proto::v1::queue_client::QueueClient;
use kjob_queue::validate;
use kjob_queue::{QueueConfig, Security};
use kjob_testkit::RedisServer;
use tonic::transport::Channel;

fn item(key: &str) -> v1::AddItem {
    v1::AddItem { queue: "job".into(), key: key.into(), ..Default::default() }
}

/// Asserts that `res` is INVALID_ARGUMENT whose message contains every one of `words`.
fn refused<T: std::fmt::Debug>(what: &str, res: Result<T, tonic::Status>, words: &[&str]) {
    let status = res.expect_err(what);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}: {status:?}");
    for w in words {
        assert!(status.message().contains(w), "{what}: {:?} lacks {w:?}", status.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_past_every_limit_is_refused_and_changes_nothing() {
    let redis = RedisServer::start().unwrap();
    let running = InProcessQueue::insecure(&redis.url()).await;
    let url = running.url.clone();
    let channel = Channel::from_shared(url).unwrap().connect_lazy();
    // Larger than the server's request limit, so the server (not this client) refuses.
    let big = validate::MAX_REPLY_BYTES;
    let mut q = QueueClient::new(channel.clone())
        .max_encoding_message_size(big)
        .max_decoding_message_size(big);
    let mut s =
        JobStateClient::new(channel).max_encoding_message_size(big).max_decoding_message_size(big);

    // Something legitimate first, so "unchanged" compares a Redis that holds queue state.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match q.add(v1::AddRequest { items: vec![item("ns/real")] }).await {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("waiting for kjob-queue: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("kjob-queue never answered: {e}"),
        }
    }
    // A Job with as many records as one may keep.
    let full = |name: String| v1::PutRecordRequest {
        key: "ns/full".into(),
        name,
        value: vec![1],
        ttl_ms: 0,
    };
    for i in 0..validate::MAX_RECORDS_PER_JOB {
        s.put_record(full(format!("r{i}"))).await.unwrap();
    }
    let before = redis.snapshot().await.unwrap();
    assert!(!before.is_empty());

    // Keys that are not Kubernetes names would land on another key's Redis key.
    for key in ["ns/real:seen", "ns/real:pods", "ns/{wq:job}", "NS/a", "ns/a_b"] {
        let res = q.add(v1::AddRequest { items: vec![item(key)] }).await;
        refused(&format!("Add {key}"), res, &["DNS-1123"]);
        let res = s.get_job_view(v1::GetJobViewRequest { key: key.into(), ..Default::default() });
        refused(&format!("GetJobView {key}"), res.await, &["DNS-1123"]);
        let res = s
            .set_expectations(v1::SetExpectationsRequest {
                key: key.into(),
                job_uid: "u".into(),
                add: 1,
                ..Default::default()
            })
            .await;
        refused(&format!("SetExpectations {key}"), res, &["DNS-1123"]);
    }

    let too_many = vec![item("ns/a"); validate::MAX_ADD_ITEMS + 1];
    let res = q.add(v1::AddRequest { items: too_many }).await;
    refused("Add of too many items", res, &["MAX_ADD_ITEMS", &validate::MAX_ADD_ITEMS.to_string()]);

    // Operations per item: view writes and observations together.
    let observation = |i: usize| v1::Observation {
        kind: v1::ObservationKind::Creation as i32,
        job_uid: "u".into(),
        pod_uid: format!("p{i}"),
    };
    let delete = |i: usize| v1::CacheOp {
        kind: v1::CacheOpKind::DeletePod as i32,
        name: format!("p{i}"),
        ..Default::default()
    };
    let half = validate::MAX_ADD_ITEM_OPS / 2;
    let busy = v1::AddItem {
        observations: (0..half + 1).map(observation).collect(),
        cache: (0..half).map(delete).collect(),
        cache_session: "s".into(),
        ..item("ns/real")
    };
    let res = q.add(v1::AddRequest { items: vec![busy] }).await;
    refused("Add item of too many operations", res, &["MAX_ADD_ITEM_OPS", "513 operations"]);

    // A request past the size limit, whatever it holds.
    let huge = v1::AddItem {
        cache: vec![v1::CacheOp {
            kind: v1::CacheOpKind::Pod as i32,
            name: "p".into(),
            object: vec![b'x'; validate::MAX_REQUEST_BYTES],
            ..Default::default()
        }],
        cache_session: "s".into(),
        ..item("ns/real")
    };
    let res = q.add(v1::AddRequest { items: vec![huge] }).await;
    refused(
        "Add past the request size limit",
        res,
        &["MAX_REQUEST_BYTES", &validate::MAX_REQUEST_BYTES.to_string()],
    );
    let res = s.put_record(v1::PutRecordRequest {
        key: "ns/real".into(),
        name: "backoff".into(),
        value: vec![0; validate::MAX_REQUEST_BYTES],
        ttl_ms: 0,
    });
    refused("PutRecord past the request size limit", res.await, &["MAX_REQUEST_BYTES"]);

    // Lists: Dones per DoneBatch and per Lease, keys per Inspect, pod UIDs per call.
    let done = |i: usize| v1::DoneRequest {
        queue: "job".into(),
        key: format!("ns/d{i}"),
        lease_id: "1-1".into(),
        ..Default::default()
    };
    let dones: Vec<_> = (0..validate::MAX_DONE_BATCH + 1).map(done).collect();
    let res = q.done_batch(v1::DoneBatchRequest { items: dones.clone() }).await;
    refused("DoneBatch of too many items", res, &[&validate::MAX_DONE_BATCH.to_string()]);
    let res = q
        .lease(v1::LeaseRequest {
            queue: "job".into(),
            max_items: 1,
            lease_ms: 1000,
            dones,
            ..Default::default()
        })
        .await;
    refused("Lease carrying too many Dones", res, &[&validate::MAX_DONE_BATCH.to_string()]);
    let keys: Vec<String> = (0..validate::MAX_LIST + 1).map(|i| format!("ns/k{i}")).collect();
    let res = q.inspect(v1::InspectRequest { queue: "job".into(), keys });
    refused("Inspect of too many keys", res.await, &[&validate::MAX_LIST.to_string()]);
    let uids: Vec<String> = (0..validate::MAX_LIST + 1).map(|i| format!("p{i}")).collect();
    let res = s.expect_finalizer_removals(v1::ExpectFinalizerRemovalsRequest {
        key: "ns/real".into(),
        job_uid: "u".into(),
        pod_uids: uids,
    });
    refused("ExpectFinalizerRemovals of too many UIDs", res.await, &["pod UIDs"]);

    let lease = |max_items, lease_ms, wait_ms| v1::LeaseRequest {
        queue: "job".into(),
        worker_id: "w".into(),
        max_items,
        lease_ms,
        wait_ms,
        ..Default::default()
    };
    let res = q.lease(lease(validate::MAX_LEASE_ITEMS + 1, 1000, 0)).await;
    refused("Lease of too many keys", res, &["max_items", &validate::MAX_LEASE_ITEMS.to_string()]);
    let res = q.lease(lease(1, validate::MAX_LEASE_MS + 1, 0)).await;
    refused("Lease held too long", res, &["lease_ms"]);
    let res = q.lease(lease(1, 1000, validate::MAX_WAIT_MS + 1)).await;
    refused("Lease waiting too long", res, &["wait_ms"]);

    let res = q
        .add(v1::AddRequest {
            items: vec![v1::AddItem { delay_ms: validate::MAX_DELAY_MS + 1, ..item("ns/a") }],
        })
        .await;
    refused("Add delayed past the limit", res, &["30 days"]);

    let record = |name: String, value: Vec<u8>| v1::PutRecordRequest {
        key: "ns/real".into(),
        name,
        value,
        ttl_ms: 0,
    };
    let res = s.put_record(record("backoff".into(), vec![0; validate::MAX_RECORD_BYTES + 1])).await;
    refused("PutRecord too large", res, &[&validate::MAX_RECORD_BYTES.to_string()]);
    let res = s.put_record(record("n".repeat(validate::MAX_ID_LEN + 1), vec![1])).await;
    refused("PutRecord name too long", res, &[&validate::MAX_ID_LEN.to_string()]);
    let res = s.put_record(full("one-more".into())).await;
    refused("PutRecord past the records of a Job", res, &["MAX_RECORDS_PER_JOB", "16"]);

    let res = s
        .set_expectations(v1::SetExpectationsRequest {
            key: "ns/real".into(),
            job_uid: "u".into(),
            add: 1_000_001,
            ..Default::default()
        })
        .await;
    refused("SetExpectations past the count limit", res, &["1000000"]);

    let after = redis.snapshot().await.unwrap();
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    assert!(before == after, "a refused request changed Redis");

    running.stop().await;
}

/// The series `name` (no labels) on kjob-queue's admin port.
async fn metric(admin: &str, name: &str) -> f64 {
    let body = reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

/// Four Adds held in Redis (its writes paused from a second connection) fill a limit of four:
/// the fifth call is refused at once with RESOURCE_EXHAUSTED naming the limit, counted, and
/// changes nothing; the four complete once Redis answers again, and the limit frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_past_the_concurrency_limit_is_refused_and_the_others_complete() {
    const LIMIT: usize = 4;
    let redis = RedisServer::start().unwrap();
    let config = QueueConfig {
        max_concurrent_calls: LIMIT,
        ..QueueConfig::new(redis.url(), Security::InsecureNoAuth)
    };
    let running = InProcessQueue::start(config).await;
    let admin_url = running.admin.clone();
    let q = QueueClient::new(Channel::from_shared(running.url.clone()).unwrap().connect_lazy());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while q.clone().add(v1::AddRequest { items: vec![item("ns/real")] }).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "kjob-queue never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&admin_url, "kjob_queue_calls_in_flight").await, 0.0);

    // Redis holds every write (scripts included) for 3 s; reads still answer.
    let pauser = redis::Client::open(redis.url()).unwrap();
    let mut pauser = pauser.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("WRITE")
        .query_async(&mut pauser)
        .await
        .unwrap();
    let held: Vec<_> = (0..LIMIT)
        .map(|i| {
            let mut q = q.clone();
            tokio::spawn(async move {
                q.add(v1::AddRequest { items: vec![item(&format!("ns/held{i}"))] }).await
            })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while metric(&admin_url, "kjob_queue_calls_in_flight").await < LIMIT as f64 {
        assert!(tokio::time::Instant::now() < deadline, "the Adds never piled up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = redis.snapshot().await.unwrap();
    let res = q.clone().add(v1::AddRequest { items: vec![item("ns/refused")] }).await;
    let status = res.expect_err("the call past the limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    for w in ["--max-concurrent-calls", &LIMIT.to_string()] {
        assert!(status.message().contains(w), "{:?} lacks {w:?}", status.message());
    }
    assert_eq!(metric(&admin_url, "kjob_queue_calls_refused_total").await, 1.0);
    assert!(redis.snapshot().await.unwrap() == before, "the refused call changed Redis");

    for h in held {
        let added = h.await.unwrap().expect("a held Add completes once Redis answers");
        assert_eq!(added.into_inner().added, 1);
    }
    assert_eq!(metric(&admin_url, "kjob_queue_calls_in_flight").await, 0.0);
    let keys = ["ns/held0", "ns/held3", "ns/refused"].map(String::from).to_vec();
    let states = q.clone().inspect(v1::InspectRequest { queue: "job".into(), keys }).await;
    let states: Vec<_> = states.unwrap().into_inner().keys.into_iter().map(|k| k.state).collect();
    assert_eq!(states[..2], ["ready", "ready"]);
    assert_ne!(states[2], "ready", "the refused Add was not applied: {states:?}");
    // The limit is free again.
    q.clone().add(v1::AddRequest { items: vec![item("ns/after")] }).await.unwrap();

    running.stop().await;
}

/// The watcher's sender never sends an Add past kjob-queue's request limit: a snapshot item of
/// eight pods of 1.2 MiB (9.6 MiB, past the 8 MiB limit) goes as several Adds, in order; every
/// pod lands, the view is trusted once the session commits, and nothing was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchers_sender_splits_an_add_past_the_request_limit() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use kjob_watcher::handlers::{Enqueue, SessionControl};
    use kjob_watcher::view::ViewWrite;

    let redis = RedisServer::start().unwrap();
    let q = InProcessQueue::insecure(&redis.url()).await;
    let client = q.client.clone();
    let metrics = kjob_watcher::metrics::Metrics::register(&mut Default::default());
    let (tx, rx) = kjob_watcher::sender::channel();
    let sender = tokio::spawn(kjob_watcher::sender::run_sender(
        rx,
        client.clone(),
        metrics.clone(),
        Arc::new(AtomicBool::new(false)),
        Arc::new(tokio::sync::Notify::new()),
        kjob_core::seal::ViewKey::new(&[7; 32]).unwrap(),
        tokio_util::sync::CancellationToken::new(),
    ));

    let session: Arc<str> = "watcher-1".into();
    let pod =
        |i: usize| ViewWrite::Pod { name: format!("p{i}"), object: vec![b'x'; 1200 * 1024].into() };
    let mut writes = vec![ViewWrite::Reset { uid: "u1".into() }];
    writes.extend((0..8).map(pod));
    writes.push(ViewWrite::Job {
        uid: "u1".into(),
        object: br#"{"metadata":{"name":"big","namespace":"ns"}}"#.to_vec().into(),
        resource_version: "5".into(),
    });
    writes.push(ViewWrite::Trust);
    let item = Enqueue::view_only("ns/big".into(), session.clone(), writes);
    tx.send(Enqueue::session(SessionControl::Begin(session.clone()))).await.unwrap();
    tx.send(item).await.unwrap();
    tx.send(Enqueue::session(SessionControl::Commit(session))).await.unwrap();
    drop(tx);
    tokio::time::timeout(Duration::from_secs(30), sender).await.unwrap().unwrap().unwrap();

    assert_eq!(metrics.send_errors.get(), 0, "kjob-queue refused or failed an Add");
    assert_eq!(metrics.batches.get(), 2, "9.6 MiB goes as two Adds");
    let view = client.get_job_view("ns/big", &[]).await.unwrap().expect("a trusted view");
    assert_eq!(view.pods.len(), 8);
    q.stop().await;
}
