//! DoneBatch through the typed client, on a single redis-server and on a 3-node Redis Cluster:
//! per-item results (stale ids refused alone), dirty re-queue, rate-limited and requeue-after
//! outcomes in one batch, items of both queues, and bad input refused whole; and the same Dones
//! carried by a Lease call.

mod queue_common;

use queue_common::InProcessQueue;

use std::time::Duration;

use kjob_core::{Observation, ObservationKind};
use kjob_queue_client::{
    AddItem, ClientError, Done, DoneItem, FinalizerRemovals, LeaseCall, MAX_DONE_BATCH, Outcome,
    QueueClient, RetryPolicy, v1,
};
use kjob_testkit::{RedisCluster, RedisServer};

const LEASE: Duration = Duration::from_secs(30);

type Running = InProcessQueue;

/// kjob-queue over `redis_url`, once it answers (the default client retries UNAVAILABLE).
async fn start(redis_url: &str) -> Running {
    let r = InProcessQueue::insecure(redis_url).await;
    tokio::time::timeout(Duration::from_secs(15), r.client.stats("job"))
        .await
        .expect("server never answered")
        .unwrap();
    r
}

fn add(queue: &str, key: &str) -> AddItem {
    AddItem { queue: queue.into(), key: key.into(), ..Default::default() }
}

fn done(queue: &str, key: &str, lease_id: &str, outcome: Outcome) -> DoneItem {
    DoneItem { queue: queue.into(), key: key.into(), lease_id: lease_id.into(), outcome }
}

/// Leases exactly `keys` (in any order) and returns their lease ids in the order of `keys`.
async fn lease_all(c: &QueueClient, queue: &str, keys: &[&str]) -> Vec<String> {
    let got = c.lease(queue, 100, LEASE, Duration::from_secs(5), "w").await.unwrap();
    let mut leased: Vec<&str> = got.iter().map(|i| i.key.as_str()).collect();
    leased.sort_unstable();
    let mut want = keys.to_vec();
    want.sort_unstable();
    assert_eq!(leased, want);
    keys.iter().map(|k| got.iter().find(|i| i.key == *k).unwrap().lease_id.clone()).collect()
}

/// Most the clocks of one Done call's shard scripts may differ by (they run concurrently, on a
/// loaded machine).
const SAME_CALL_SKEW_MS: i64 = 250;

async fn semantics(c: &QueueClient) {
    c.add(vec![add("job", "ns/a"), add("job", "ns/b"), add("job", "ns/c"), add("job", "ns/d")])
        .await
        .unwrap();
    c.add(vec![add("orphan-pod", "ns/p")]).await.unwrap();
    let ids = lease_all(c, "job", &["ns/a", "ns/b", "ns/c", "ns/d"]).await;
    let pid = lease_all(c, "orphan-pod", &["ns/p"]).await.remove(0);
    // ns/b is added again while leased: dirty, so its Done puts it back at once.
    c.add(vec![add("job", "ns/b")]).await.unwrap();
    let items = vec![
        done("job", "ns/a", &ids[0], Outcome::Forget),
        done("job", "ns/a", &ids[0], Outcome::Forget), // the same lease again: stale
        done("job", "ns/b", &ids[1], Outcome::Forget),
        done("job", "ns/c", &ids[2], Outcome::RateLimited),
        done("job", "ns/d", &ids[3], Outcome::RequeueAfter(Duration::from_secs(60))),
        done("job", "ns/zz", "1-1", Outcome::Forget), // never leased: stale
        done("orphan-pod", "ns/p", &pid, Outcome::Forget),
    ];
    let r = c.done_many(&items).await.unwrap();
    assert_eq!(r.len(), items.len());
    let ok = |i: usize| r[i].as_ref().unwrap_or_else(|e| panic!("item {i}: {e:?}"));
    assert!(!ok(0).requeued);
    assert!(matches!(&r[1], Err(ClientError::LeaseLost(m)) if m.contains("ns/a")), "{:?}", r[1]);
    assert!(ok(2).requeued);
    let b_ready = ok(2).ready_unix_ms;
    // Rate limited: the first failure waits the 1 s base delay (Redis clock; the call runs one
    // script per shard, each reading its own clock within milliseconds of the others).
    let near = |got: i64, want: i64| (got - want).abs() <= SAME_CALL_SKEW_MS;
    assert!(ok(3).requeued);
    assert!(near(ok(3).ready_unix_ms, b_ready + 1000), "{} vs {b_ready}", ok(3).ready_unix_ms);
    assert!(near(ok(4).ready_unix_ms, b_ready + 60_000), "{} vs {b_ready}", ok(4).ready_unix_ms);
    assert!(matches!(&r[5], Err(ClientError::LeaseLost(m)) if m.contains("ns/zz")), "{:?}", r[5]);
    assert!(!ok(6).requeued);

    let st = c.stats("job").await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased, st.dirty, st.failing), (1, 2, 0, 0, 1));
    let st = c.stats("orphan-pod").await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased), (0, 0, 0));
    let v = c.inspect("job", vec!["ns/a".into(), "ns/c".into()]).await.unwrap().keys;
    assert_eq!((v[0].state.as_str(), v[1].state.as_str(), v[1].requeues), ("absent", "delayed", 1));

    // The dirty key is handed out again; a batch of only stale items changes nothing.
    let b = lease_all(c, "job", &["ns/b"]).await.remove(0);
    let r = c.done_many(&[done("job", "ns/b", &ids[1], Outcome::Forget)]).await.unwrap();
    assert!(matches!(&r[0], Err(ClientError::LeaseLost(_))));
    assert_eq!(c.stats("job").await.unwrap().leased, 1);
    let r = c.done_many(&[done("job", "ns/b", &b, Outcome::RateLimited)]).await.unwrap();
    assert!(r[0].as_ref().unwrap().requeued);
    assert_eq!(c.stats("job").await.unwrap().failing, 2);
    // An empty list makes no call.
    assert!(c.done_many(&[]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_batch_on_single_redis() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis.url()).await;
    semantics(&r.client).await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_batch_on_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().unwrap();
    let r = start(&cluster.url()).await;
    semantics(&r.client).await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_done_batches_are_refused_whole() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis.url()).await;
    let c = r.client.clone().with_retry_policy(RetryPolicy::no_retries());
    c.add(vec![add("job", "ns/a")]).await.unwrap();
    let id = lease_all(&c, "job", &["ns/a"]).await.remove(0);
    let good = done("job", "ns/a", &id, Outcome::Forget);
    let bad = |e: Result<_, ClientError>| match e {
        Err(ClientError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let too_many = vec![good.clone(); MAX_DONE_BATCH + 1];
    let m = bad(c.done_many(&too_many).await);
    assert!(m.contains("1..=200") && m.contains("201"), "{m}");
    // The typed client skips empty batches, so send one with the raw client.
    let mut raw = v1::queue_client::QueueClient::connect(r.url.clone()).await.unwrap();
    let empty = raw.done_batch(v1::DoneBatchRequest { items: vec![] }).await.unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert!(empty.message().contains("got 0"), "{}", empty.message());
    let cases: Vec<(DoneItem, &str)> = vec![
        (done("job", "bad", &id, Outcome::Forget), "item 1 (\"bad\")"),
        (done("jobs", "ns/a", &id, Outcome::Forget), "unknown queue"),
        (done("job", "ns/a", "", Outcome::Forget), "lease_id is required"),
        (done("job", "ns/a", &id, Outcome::RequeueAfter(Duration::MAX)), "30 days"),
    ];
    for (item, want) in cases {
        let m = bad(c.done_many(&[good.clone(), item]).await);
        assert!(m.contains(want), "{m} should contain {want}");
    }
    let mut unspecified = v1::DoneRequest {
        queue: "job".into(),
        key: "ns/a".into(),
        lease_id: id.clone(),
        outcome: v1::DoneOutcome::Unspecified as i32,
        requeue_after_ms: 0,
        view_write_back: None,
        expectations: None,
        finalizer_removals: None,
        error: String::new(),
    };
    let e = raw.done_batch(v1::DoneBatchRequest { items: vec![unspecified.clone()] }).await;
    assert!(e.unwrap_err().message().contains("outcome 0"));
    unspecified.outcome = 42;
    let e = raw.done_batch(v1::DoneBatchRequest { items: vec![unspecified] }).await;
    assert_eq!(e.unwrap_err().code(), tonic::Code::InvalidArgument);
    // Nothing was applied: the good item's lease is still held and finishes now.
    assert_eq!(c.stats("job").await.unwrap().leased, 1);
    let r2 = c.done_many(&[good]).await.unwrap();
    assert!(r2[0].is_ok());
    assert_eq!(c.stats("job").await.unwrap().leased, 0);
    r.stop().await;
}

/// Concurrent DoneBatches whose sum exceeds one script call's limit: when they meet in the
/// per-queue batch loop it splits them into several calls; every caller must still get its own
/// results in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_over_the_script_limit() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis.url()).await;
    let c = &r.client;
    let keys: Vec<String> = (0..600).map(|i| format!("ns/k{i:03}")).collect();
    c.add(keys.iter().map(|k| add("job", k)).collect()).await.unwrap();
    let got = c.lease("job", 1000, LEASE, Duration::from_secs(5), "w").await.unwrap();
    assert_eq!(got.len(), 600);
    let batches: Vec<Vec<DoneItem>> = got
        .chunks(150)
        .map(|chunk| {
            let mut b: Vec<DoneItem> = chunk
                .iter()
                .map(|it| done("job", &it.key, &it.lease_id, Outcome::RateLimited))
                .collect();
            // One stale item in the middle of each batch.
            b.insert(75, done("job", "ns/stale", "1-1", Outcome::Forget));
            b
        })
        .collect();
    let calls = batches.iter().map(|b| c.done_many(b));
    for (b, res) in batches.iter().zip(futures::future::join_all(calls).await) {
        let res = res.unwrap();
        assert_eq!(res.len(), b.len());
        for (i, item) in res.iter().enumerate() {
            if i == 75 {
                assert!(matches!(item, Err(ClientError::LeaseLost(_))), "{item:?}");
            } else {
                assert!(item.as_ref().unwrap().requeued, "{}: {item:?}", b[i].key);
            }
        }
    }
    let st = c.stats("job").await.unwrap();
    assert_eq!((st.leased, st.delayed, st.failing), (0, 600, 600));
    r.stop().await;
}

/// A Lease call of `queue` for up to 10 keys that does not wait.
fn lease_call(queue: &str) -> LeaseCall<'_> {
    LeaseCall {
        queue,
        max_items: 10,
        lease: LEASE,
        wait: Duration::ZERO,
        worker_id: "w",
        records: None,
        cached: None,
    }
}

fn carried(queue: &str, key: &str, lease_id: &str, outcome: Outcome) -> Done {
    Done::new(queue, key, lease_id, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_finishes_the_dones_it_carries_first() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis.url()).await;
    let c = r.client.clone().with_retry_policy(RetryPolicy::no_retries());
    c.add(vec![add("job", "ns/a"), add("job", "ns/b"), add("orphan-pod", "ns/p")]).await.unwrap();
    let ids = lease_all(&c, "job", &["ns/a", "ns/b"]).await;
    let pid = lease_all(&c, "orphan-pod", &["ns/p"]).await.remove(0);
    // ns/b is added again while leased: its Done makes it ready for the very same call.
    c.add(vec![add("job", "ns/b")]).await.unwrap();
    let dones = vec![
        carried("job", "ns/a", &ids[0], Outcome::Forget),
        carried("job", "ns/b", &ids[1], Outcome::Forget),
        carried("job", "ns/zz", "1-1", Outcome::Forget), // never leased: stale
        carried("orphan-pod", "ns/p", &pid, Outcome::RateLimited), // another queue's lease
    ];
    let (items, results) = c.lease_finishing(lease_call("job"), dones).await.unwrap();
    assert_eq!(results.len(), 4);
    assert!(!results[0].as_ref().unwrap().requeued);
    assert!(results[1].as_ref().unwrap().requeued);
    assert!(matches!(&results[2], Err(ClientError::LeaseLost(m)) if m.contains("ns/zz")));
    assert!(results[3].as_ref().unwrap().requeued);
    let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["ns/b"]);
    assert_ne!(items[0].lease_id, ids[1], "a new lease of the dirty key");
    let st = c.stats("job").await.unwrap();
    assert_eq!((st.ready, st.leased, st.dirty), (0, 1, 0));
    assert_eq!(c.stats("orphan-pod").await.unwrap().delayed, 1);

    // Bad carried Dones refuse the whole call: nothing finished, nothing leased.
    c.add(vec![add("job", "ns/c")]).await.unwrap();
    let good = carried("job", "ns/b", &items[0].lease_id, Outcome::Forget);
    let bad = |e: Result<_, ClientError>| match e {
        Err(ClientError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let bad_key = carried("job", "bad", "1-1", Outcome::Forget);
    let m = bad(c.lease_finishing(lease_call("job"), vec![good.clone(), bad_key]).await);
    assert!(m.contains("dones item 1 (\"bad\")"), "{m}");
    let m = bad(c.lease_finishing(lease_call("job"), vec![good.clone(); MAX_DONE_BATCH + 1]).await);
    assert!(m.contains("at most 200 dones, got 201"), "{m}");
    let st = c.stats("job").await.unwrap();
    assert_eq!((st.ready, st.leased), (1, 1));
    // No Dones: a plain Lease, with an empty result list.
    let (items, results) = c.lease_finishing(lease_call("job"), vec![]).await.unwrap();
    assert_eq!((items.len(), results.len()), (1, 0));
    let (_, results) = c.lease_finishing(lease_call("job"), vec![good]).await.unwrap();
    assert!(results[0].is_ok());
    assert_eq!(c.stats("job").await.unwrap().leased, 1);
    r.stop().await;
}

/// The finalizer removals a sync made ride its Done: checked first, expected before the lease
/// ends (for every Done of a Lease call in one script), less the pods the watcher has already
/// seen without the finalizer; the leases say the server does this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dones_expect_the_finalizer_removals_they_carry() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis.url()).await;
    let c = r.client.clone().with_retry_policy(RetryPolicy::no_retries());
    let removals = |key: &str, pods: &[&str]| FinalizerRemovals {
        key: key.into(),
        job_uid: "u1".into(),
        pod_uids: pods.iter().map(|p| p.to_string()).collect(),
    };
    let with = |d: Done, f| Done { finalizer_removals: Some(f), ..d };
    c.add(vec![add("job", "ns/a"), add("job", "ns/b"), add("orphan-pod", "ns/p")]).await.unwrap();
    let (items, _) = c.lease_finishing(lease_call("job"), vec![]).await.unwrap();
    let id = |k: &str| items.iter().find(|i| i.key == k).unwrap().lease_id.clone();
    let pid = lease_all(&c, "orphan-pod", &["ns/p"]).await.remove(0);
    // The watcher sees ns/a's p1 lose its finalizer while the sync still holds the lease.
    let seen = AddItem {
        observations: vec![Observation::new(ObservationKind::FinalizerRemoval, "u1", "p1")],
        observe_only: true,
        ..add("job", "ns/a")
    };
    c.add(vec![seen]).await.unwrap();
    let a = carried("job", "ns/a", &id("ns/a"), Outcome::Forget);
    let b = carried("job", "ns/b", &id("ns/b"), Outcome::Forget);
    let bad = |e: Result<_, ClientError>| match e {
        Err(ClientError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    for (done, want) in [
        (with(a.clone(), removals("ns/b", &["p2"])), "is for key \"ns/b\""),
        (with(a.clone(), removals("", &[""])), "finalizer_removals: pod_uid"),
        (
            with(carried("orphan-pod", "ns/p", &pid, Outcome::Forget), removals("", &["p2"])),
            "finalizer_removals is for the \"job\" queue only",
        ),
    ] {
        let m = bad(c.lease_finishing(lease_call("job"), vec![b.clone(), done]).await);
        assert!(m.contains(want), "{m} should contain {want}");
    }
    assert_eq!(c.stats("job").await.unwrap().leased, 2, "a refused call finishes nothing");
    let dones = vec![with(a, removals("", &["p1", "p2"])), with(b, removals("ns/b", &["q1"]))];
    let (_, results) = c.lease_finishing(lease_call("job"), dones).await.unwrap();
    assert!(results.iter().all(Result::is_ok));
    let in_flight = |k: &'static str| {
        let c = &c;
        async move { c.get_expectations(k, "u1").await.unwrap().finalizer_removals }
    };
    assert_eq!(in_flight("ns/a").await, vec!["p2"], "p1 was seen before the Done");
    assert_eq!(in_flight("ns/b").await, vec!["q1"]);
    // A stale Done's removals are expected all the same (the pods lost their finalizers).
    let stale = with(carried("job", "ns/a", "1-1", Outcome::Forget), removals("", &["p3"]));
    let err = c.done_as(&stale).await.unwrap_err();
    assert!(matches!(err, ClientError::LeaseLost(_)), "{err:?}");
    assert_eq!(in_flight("ns/a").await, vec!["p2", "p3"]);
    r.stop().await;
}
