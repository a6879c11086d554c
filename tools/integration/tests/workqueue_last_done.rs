//! Explain's last-Done record (the DONE script's `HSET` into its shard's last-Done hash): it
//! says exactly what the history says of the same Done, another store (another kjob-queue
//! replica) sees it at once, and a later Done of the key replaces it, a happy one in the record
//! only. On one server and on a 3-master Redis Cluster.

use std::time::Duration;

use kjob_testkit::TestRedis;
use kjob_workqueue::{Done, Enqueue, HistoryEntry, LeaseOutcome, Store, StoreConfig};

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(30);

/// Leases `key` as `worker` and finishes it with `outcome` and `error`.
async fn sync_once(s: &Store, key: &str, worker: &str, outcome: LeaseOutcome, error: &str) {
    let leased = s.lease(Q, worker, 1, LEASE).await.unwrap().items;
    assert_eq!(leased.len(), 1, "{key} leased");
    assert_eq!(leased[0].key, key);
    let done = Done {
        key: key.into(),
        lease_id: leased[0].lease_id.clone(),
        outcome,
        error: error.into(),
    };
    let r = s.done_many(Q, &[done]).await.unwrap();
    assert!(r[0].is_some(), "the Done of {key} applied");
}

async fn the_last_done_is_the_historys_and_reaches_other_replicas(url: String) {
    let a = Store::connect(&url, StoreConfig::default()).await.unwrap();
    let b = Store::connect(&url, StoreConfig::default()).await.unwrap();
    let key = "team-a/train";
    a.add(Q, &[Enqueue::now(key)]).await.unwrap();
    // An error: the Done script writes a history entry, kjob-queue the last-Done record.
    sync_once(&a, key, "worker-7", LeaseOutcome::RateLimited, "pods is forbidden: quota").await;
    let x = a.explain(Q, key).await.unwrap().expect("known");
    let last = x.last_sync.clone().expect("the replica that took the Done shows it at once");
    assert_eq!(x.history.last(), Some(&last), "the record says what the history says");
    match &last {
        HistoryEntry::Synced { worker, error, delay_ms, .. } => {
            assert_eq!(worker, "worker-7");
            assert_eq!(error, "pods is forbidden: quota");
            assert!(delay_ms.is_some_and(|d| d > 0), "the rate limiter's delay: {delay_ms:?}");
        }
        other => panic!("not a Done: {other:?}"),
    }

    // The next sync succeeds: the first success after an error is history too; the one after
    // it is the happy path, written to the record only.
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.add(Q, &[Enqueue::now(key)]).await.unwrap();
    let leased = loop {
        let got = a.lease(Q, "worker-8", 1, LEASE).await.unwrap().items;
        if let Some(l) = got.into_iter().next() {
            break l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let done = |id: String| Done {
        key: key.into(),
        lease_id: id,
        outcome: LeaseOutcome::Forget,
        error: String::new(),
    };
    a.done_many(Q, &[done(leased.lease_id)]).await.unwrap();
    a.add(Q, &[Enqueue::now(key)]).await.unwrap();
    let leased = a.lease(Q, "worker-9", 1, LEASE).await.unwrap().items.remove(0);
    a.done_many(Q, &[done(leased.lease_id)]).await.unwrap();

    // Replica b never took a Done: it sees a's newest.
    let seen = b.explain(Q, key).await.unwrap().expect("known");
    match &seen.last_sync {
        Some(HistoryEntry::Synced { worker, .. }) => assert_eq!(worker, "worker-9"),
        other => panic!("b shows {other:?}"),
    }
    match seen.last_sync.unwrap() {
        HistoryEntry::Synced { error, delay_ms, .. } => {
            assert_eq!(error, "");
            assert_eq!(delay_ms, None);
        }
        other => panic!("not a Done: {other:?}"),
    }
    // The happy Done is in the record only: the history ends with worker-8's recovery.
    match seen.history.last() {
        Some(HistoryEntry::Synced { worker, .. }) => assert_eq!(worker, "worker-8"),
        other => panic!("history ends with {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_done_is_the_historys_and_reaches_other_replicas_on_one_server() {
    let redis = TestRedis::single().expect("redis-server");
    let url = redis.url();
    the_last_done_is_the_historys_and_reaches_other_replicas(url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_done_is_the_historys_and_reaches_other_replicas_on_a_cluster() {
    let redis = TestRedis::cluster().await.expect("cluster");
    let url = redis.url();
    the_last_done_is_the_historys_and_reaches_other_replicas(url).await;
}
