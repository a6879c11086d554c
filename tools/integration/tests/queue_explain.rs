//! The explain API on kjob-queue's admin port: a Job put in every state the queue can hold it in
//! (ready, delayed by pod-failure backoff, delayed by request backoff, delayed by the batching of
//! pod events, waiting on expectations, leased, finished, never seen), read over HTTP from a
//! kjob-queue serving a real redis-server (one shard) and a 3-master Redis Cluster (24 shards),
//! with the numbers the state implies; and what the happy path leaves: no history, only its
//! last Done.

mod queue_common;

use queue_common::InProcessQueue;

use std::time::Duration;

use kjob_queue_client::Outcome;
use kjob_reconcile::BackoffRecord;
use kjob_reconcile::backoff::StoredBackoff;
use kjob_testkit::{RedisCluster, RedisServer};
use kjob_workqueue::{
    Done, Enqueue, LeaseOutcome, Observation, ObservationKind, Store, StoreConfig,
};
use serde_json::Value;

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(60);

type Running = InProcessQueue;

async fn start(redis_url: &str) -> Running {
    InProcessQueue::insecure(redis_url).await
}

/// GET `path` on the admin port: status and JSON body, waiting for kjob-queue to connect.
async fn get(r: &Running, path: &str) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(resp) = reqwest::get(format!("{}{path}", r.admin)).await {
            let status = resp.status().as_u16();
            if status != 503 {
                return (status, resp.json().await.unwrap());
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "admin port never answered {path}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn explain(r: &Running, key: &str) -> Value {
    let (status, body) = get(r, &format!("/api/v1/jobs/{key}")).await;
    assert_eq!(status, 200, "{key}: {body}");
    body
}

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path).and_then(Value::as_f64).unwrap_or_else(|| panic!("{path} in {v}"))
}

fn s<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or_else(|| panic!("{path} in {v}"))
}

/// Leases exactly `key` (the only ready key) as `worker`; its lease id.
async fn lease_one(store: &Store, key: &str, worker: &str) -> String {
    let b = store.lease(Q, worker, 1, LEASE).await.unwrap();
    assert_eq!(b.items.len(), 1, "{key} ready to lease");
    assert_eq!(b.items[0].key, key);
    b.items[0].lease_id.clone()
}

async fn done(store: &Store, key: &str, id: &str, outcome: LeaseOutcome, error: &str) {
    let d = Done { key: key.into(), lease_id: id.into(), outcome, error: error.into() };
    let r = store.done_many(Q, &[d]).await.unwrap();
    assert!(r[0].is_some(), "lease of {key} still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_why_a_job_waits_in_every_state() {
    let redis = RedisServer::start().unwrap();
    every_state(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_why_a_job_waits_in_every_state_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().unwrap();
    every_state(&cluster.url()).await;
}

fn events(x: &Value) -> Vec<&str> {
    x["history"].as_array().unwrap().iter().map(|h| h["event"].as_str().unwrap()).collect()
}

async fn every_state(url: &str) {
    let store = Store::connect(url, StoreConfig::default()).await.unwrap();
    let r = start(url).await;

    // A sync through kjob-queue itself, whose Dones per namespace it counts in memory.
    store.add(Q, &[Enqueue::now("rate/j")]).await.unwrap();
    let got = tokio::time::timeout(
        Duration::from_secs(15),
        r.client.lease(Q, 1, LEASE, Duration::from_secs(5), "worker-0"),
    )
    .await
    .expect("kjob-queue never answered")
    .unwrap();
    assert_eq!(got.len(), 1);
    r.client.done(Q, "rate/j", &got[0].lease_id, Outcome::Forget).await.unwrap();
    // Another replica's publication, which the namespaces answer adds to this one's.
    let other = [("rate".to_string(), 2.0)];
    store.publish_sync_rates(Q, "other-replica", &other).await.unwrap();
    // The namespaces answer sums both: this kjob-queue's comes within its 5 s period.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (status, n) = get(&r, "/api/v1/namespaces").await;
        assert_eq!(status, 200, "{n}");
        let rate = n["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["namespace"] == "rate")
            .and_then(|r| r["syncs_per_second"].as_f64())
            .unwrap_or(0.0);
        assert!(rate <= 2.2, "2/s from the other replica and 1 Done here: {n}");
        if rate > 2.0 {
            assert_eq!(n["replicas_counted"].as_u64(), Some(2), "{n}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "this replica never published: {n}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Finished: synced once, forgotten, nothing queued it since.
    store.add(Q, &[Enqueue::now("fin/a")]).await.unwrap();
    let id = lease_one(&store, "fin/a", "worker-1").await;
    done(&store, "fin/a", &id, LeaseOutcome::Forget, "").await;

    // Request backoff: three syncs failed in a row; the third waits 4 s (1 s doubling).
    store.add(Q, &[Enqueue::now("err/b")]).await.unwrap();
    for wait in [Duration::from_millis(1100), Duration::from_millis(2100), Duration::ZERO] {
        let id = lease_one(&store, "err/b", "worker-2").await;
        done(&store, "err/b", &id, LeaseOutcome::RateLimited, "pods is forbidden: quota").await;
        tokio::time::sleep(wait).await;
    }

    // Recovered: one failed sync, then a success (both on record).
    store.add(Q, &[Enqueue::now("rec/h")]).await.unwrap();
    let id = lease_one(&store, "rec/h", "worker-5").await;
    done(&store, "rec/h", &id, LeaseOutcome::RateLimited, "conflict").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let id = lease_one(&store, "rec/h", "worker-5").await;
    done(&store, "rec/h", &id, LeaseOutcome::Forget, "").await;

    // A lease that expired without a Done (the worker died): the sweep puts it back.
    store.add(Q, &[Enqueue::now("gone/i")]).await.unwrap();
    let b = store.lease(Q, "worker-6", 1, Duration::from_millis(100)).await.unwrap();
    assert_eq!(b.items.len(), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // kjob-queue's own sweep (every second or so) may have reaped it first: either way it is
    // reaped once, leased again below, and its history shows the expiry.
    assert!(store.sweep(Q).await.unwrap().reaped <= 1);
    let id = lease_one(&store, "gone/i", "worker-6").await;
    done(&store, "gone/i", &id, LeaseOutcome::Forget, "").await;

    // Pod-failure backoff: two pod failures just now (10 s doubling: 20 s before the next pod),
    // and the sync asked to come back then, as the worker does.
    let uid = "uid-pod";
    store.set_expectations("pod/c", uid, 0, 0).await.unwrap();
    let record = BackoffRecord {
        failures_after_last_success: 2,
        last_failure_time: Some(jiff::Timestamp::now()),
    };
    let bytes = StoredBackoff::encode(&record, uid);
    assert!(store.put_record("pod/c", "backoff", &bytes, None).await.unwrap());
    store.add(Q, &[Enqueue::now("pod/c")]).await.unwrap();
    let id = lease_one(&store, "pod/c", "worker-3").await;
    done(&store, "pod/c", &id, LeaseOutcome::RequeueAfter(Duration::from_secs(20)), "").await;

    // Leased, and added again meanwhile.
    store.add(Q, &[Enqueue::now("held/d")]).await.unwrap();
    lease_one(&store, "held/d", "worker-4").await;
    store.add(Q, &[Enqueue::now("held/d")]).await.unwrap();

    // Ready, behind one other ready key of its namespace (added before it; on a cluster the two
    // may sit in different shards).
    store.add(Q, &[Enqueue::now("ready/a0")]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    store.add(Q, &[Enqueue::now("ready/e")]).await.unwrap();

    // Added with a delay longer than a pod-event batch (the time left to a deadline).
    store.add(Q, &[Enqueue::after("late/k", Duration::from_secs(30))]).await.unwrap();

    // A pod event batched for upstream's 1 s.
    let obs = vec![Observation::new(ObservationKind::Creation, "uid-f", "pod-1")];
    store
        .add(Q, &[Enqueue::after("batch/f", Duration::from_secs(1)).observing(obs)])
        .await
        .unwrap();

    // Waiting on expectations: 2 creates and 1 delete not yet observed, not queued.
    store.set_expectations("exp/g", "uid-g", 2, 1).await.unwrap();

    // Now read them all.
    let x = explain(&r, "batch/f").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("delayed", "pod_event_batch"), "{x}");
    let due = f(&x, "/due_in_seconds");
    assert!(due > 0.0 && due <= 1.0, "{x}");
    // The batch delay is the happy path: no history.
    assert!(events(&x).is_empty(), "{x}");

    let x = explain(&r, "late/k").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("delayed", "delayed_add"), "{x}");
    assert!((f(&x, "/due_in_seconds") - 30.0).abs() < 1.0, "{x}");
    assert_eq!(events(&x), ["enqueued"], "{x}");
    assert_eq!(f(&x, "/history/0/delay_seconds"), 30.0, "{x}");

    let x = explain(&r, "err/b").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("delayed", "request_backoff"), "{x}");
    // Due 4 s after the third failure (the sleeps of the Jobs set up since make due_in smaller).
    let due = f(&x, "/due_unix_ms") - f(&x, "/last_sync/at_unix_ms");
    assert!((due - 4000.0).abs() < 1000.0, "due 4 s after the last error: {x}");
    assert_eq!(f(&x, "/requeues"), 3.0);
    assert_eq!(f(&x, "/backoff/failures"), 3.0);
    assert_eq!(f(&x, "/backoff/next_delay_seconds"), 8.0);
    assert_eq!(s(&x, "/last_sync/outcome"), "error");
    assert_eq!(s(&x, "/last_sync/error"), "pods is forbidden: quota");
    assert_eq!(s(&x, "/last_sync/worker"), "worker-2");
    assert!(s(&x, "/reason").contains("3 failures"), "{x}");
    // Three failed syncs, oldest first (the enqueue, the happy path, is not history).
    assert_eq!(events(&x), ["synced", "synced", "synced"], "{x}");
    assert_eq!(s(&x, "/history/2/error"), "pods is forbidden: quota");

    let x = explain(&r, "rec/h").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("absent", "finished"), "{x}");
    assert_eq!(events(&x), ["synced", "synced"], "{x}");
    assert_eq!((s(&x, "/history/0/outcome"), s(&x, "/history/1/outcome")), ("error", "forget"));
    assert_eq!(f(&x, "/requeues"), 0.0, "{x}");

    let x = explain(&r, "gone/i").await;
    // The expiry, and the success after it (the first after trouble is history too).
    assert_eq!(events(&x), ["lease_expired", "synced"], "{x}");
    assert_eq!(s(&x, "/history/0/worker"), "worker-6");
    assert_eq!(x["history"][0]["poisoned"], false, "{x}");
    assert_eq!(s(&x, "/last_sync/outcome"), "forget");

    let x = explain(&r, "pod/c").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("delayed", "pod_failure_backoff"), "{x}");
    let due = f(&x, "/due_in_seconds");
    assert!((due - 20.0).abs() < 1.0, "due in 20 s: {x}");
    assert_eq!(f(&x, "/backoff/pod_failures"), 2.0);
    let left = f(&x, "/backoff/pod_backoff_remaining_seconds");
    assert!((left - 20.0).abs() < 1.0, "pods again in 20 s: {x}");
    assert_eq!(s(&x, "/last_sync/outcome"), "requeue_after");

    let x = explain(&r, "held/d").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("leased", "leased"), "{x}");
    assert_eq!(s(&x, "/lease/holder"), "worker-4");
    assert_eq!(x["lease"]["dirty"], true);
    let ends = f(&x, "/lease/ends_in_seconds");
    assert!(ends > 58.0 && ends <= 60.0, "{x}");
    assert!(s(&x, "/reason").contains("worker-4"), "{x}");

    let x = explain(&r, "ready/e").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("ready", "ready"), "{x}");
    assert_eq!(f(&x, "/ready/position"), 1.0, "{x}");
    assert_eq!(f(&x, "/ready/namespace_ready"), 2.0, "{x}");
    assert_eq!((s(&x, "/namespace/name"), f(&x, "/namespace/ready")), ("ready", 2.0), "{x}");
    assert!(x["namespace"]["round_robin"]["position"].is_u64(), "in its shard's round robin: {x}");
    assert!(s(&x, "/reason").contains("position 2 of 2 ready in namespace ready"), "{x}");
    let x = explain(&r, "ready/a0").await;
    assert_eq!(f(&x, "/ready/position"), 0.0, "{x}");

    let x = explain(&r, "exp/g").await;
    assert_eq!(
        (s(&x, "/state"), s(&x, "/reason_code")),
        ("absent", "waiting_on_expectations"),
        "{x}"
    );
    assert_eq!((f(&x, "/expectations/add"), f(&x, "/expectations/del")), (2.0, 1.0));
    assert!(s(&x, "/reason").contains("2 creates / 1 deletes"), "{x}");

    let x = explain(&r, "fin/a").await;
    assert_eq!((s(&x, "/state"), s(&x, "/reason_code")), ("absent", "finished"), "{x}");
    assert_eq!(s(&x, "/last_sync/outcome"), "forget");
    assert_eq!(s(&x, "/last_sync/worker"), "worker-1");
    // The happy path (add, lease, success) wrote no history, only the last Done.
    assert!(events(&x).is_empty(), "{x}");

    // Never seen: 404; not a Kubernetes name: 400; both JSON.
    let (status, body) = get(&r, "/api/v1/jobs/nobody/here").await;
    assert_eq!((status, s(&body, "/error/code")), (404, "not_found"), "{body}");
    let (status, body) = get(&r, "/api/v1/jobs/Not_A_Namespace/x").await;
    assert_eq!((status, s(&body, "/error/code")), (400, "invalid_argument"), "{body}");

    // Namespaces: depths over every shard.
    let (status, n) = get(&r, "/api/v1/namespaces").await;
    assert_eq!(status, 200, "{n}");
    let row = |ns: &str| {
        n["namespaces"].as_array().unwrap().iter().find(|r| r["namespace"] == ns).cloned()
    };
    let ready = row("ready").unwrap();
    assert_eq!((ready["ready"].as_u64(), ready["delayed"].as_u64()), (Some(2), Some(0)));
    assert!(ready["oldest_ready_age_seconds"].as_f64().unwrap() >= 0.0);
    let err = row("err").unwrap();
    assert_eq!(err["delayed"].as_u64(), Some(1));
    // Its Dones went to Redis directly, past every kjob-queue: counted by none.
    assert_eq!(err["syncs_per_second"].as_f64(), Some(0.0), "{n}");
    assert_eq!(row("held").unwrap()["leased"].as_u64(), Some(1));

    r.stop().await;
}
