//! Redis out of memory (issue 44): a redis-server with `maxmemory 4mb` and `noeviction` filled
//! through kjob-queue. Adds then fail with UNAVAILABLE (which clients retry with backoff, unlike
//! INTERNAL), `/readyz` says not ready and the memory gauges show used at max (within 1 %: see
//! below); once memory frees,
//! readiness comes back and every Add that was acknowledged is in the queue.

mod queue_common;

use queue_common::InProcessQueue;

use std::time::Duration;

use kjob_queue_client::{ClientError, QueueClient, RetryPolicy};
use kjob_testkit::RedisServer;

/// Keys per Add while filling: big enough to fill 4 MB in a few dozen calls.
const FILL_BATCH: usize = 500;
/// Most memory one refused fill request can have held in Redis (see its use).
const REFUSED_REQUEST_BOUND: u64 = 256 * 1024;

async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ready(admin: &str) -> bool {
    reqwest::get(format!("{admin}/readyz")).await.is_ok_and(|r| r.status() == 200)
}

/// `(used, max)` from kjob-queue's gauges (one node here).
async fn memory_gauges(admin: &str) -> Option<(u64, u64)> {
    let text = reqwest::get(format!("{admin}/metrics")).await.ok()?.text().await.ok()?;
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    Some((value("kjob_redis_used_memory_bytes")?, value("kjob_redis_maxmemory_bytes")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_unavailable_not_ready_and_loses_nothing_acknowledged() {
    let redis = RedisServer::start_with(false, &["--maxmemory", "4mb"]).unwrap();
    let q = InProcessQueue::insecure(&redis.url()).await;
    let (url, admin_url) = (q.url.clone(), q.admin.clone());
    eventually("ready", async || ready(&admin_url).await).await;
    let (used, max) = memory_gauges(&admin_url).await.expect("memory gauges");
    assert_eq!(max, 4 * 1024 * 1024);
    assert!(used > 0 && used < max, "{used} {max}");

    // Fill until Redis refuses: every Add either is acknowledged or fails as a whole.
    let c = QueueClient::connect_lazy(&url).unwrap().with_retry_policy(RetryPolicy::no_retries());
    let mut acked: Vec<String> = Vec::new();
    let refusal = loop {
        let n = acked.len();
        let keys: Vec<String> =
            (n..n + FILL_BATCH).map(|i| format!("fill/key-{i:08}-{}", "x".repeat(40))).collect();
        let items = keys
            .iter()
            .map(|k| kjob_queue_client::AddItem {
                queue: "job".into(),
                key: k.clone(),
                ..Default::default()
            })
            .collect();
        match c.add(items).await {
            Ok(r) => {
                assert_eq!(r.added as usize, FILL_BATCH);
                acked.extend(keys);
            }
            Err(e) => break e,
        }
        assert!(acked.len() < 200_000, "4 MB never filled");
    };
    // The client's UNAVAILABLE (a status it retries with backoff; this one was told not to).
    let ClientError::Unavailable(message) = &refusal else {
        panic!("not UNAVAILABLE: {refusal:?}")
    };
    assert!(message.contains("OOM"), "{message}");

    eventually("not ready while Redis refuses writes", async || !ready(&admin_url).await).await;
    // Redis refuses a write when used memory, the request's own bytes included, is over the
    // limit; once the refused request is gone the gauge can read below it by what Redis held of
    // that request: its query buffer and its parsed arguments (the ADD script's 500 items of
    // six arguments each, a few hundred bytes per item with Redis's per-argument overhead).
    // Readiness also remembers the refusal itself.
    let (used, max) = memory_gauges(&admin_url).await.unwrap();
    assert!(used + REFUSED_REQUEST_BOUND >= max, "gauges while full: used {used}, max {max}");

    // An operator raises maxmemory (through their own connection): the stack recovers.
    let admin_redis = redis::Client::open(redis.url()).unwrap();
    let mut a = admin_redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("64mb")
        .query_async(&mut a)
        .await
        .unwrap();
    eventually("ready again", async || ready(&admin_url).await).await;
    let (used, max) = memory_gauges(&admin_url).await.unwrap();
    assert!(used < max && max == 64 * 1024 * 1024, "{used} {max}");
    let again = kjob_queue_client::AddItem {
        queue: "job".into(),
        key: "after/oom".into(),
        ..Default::default()
    };
    assert_eq!(c.add(vec![again]).await.unwrap().added, 1);

    // Nothing acknowledged was lost: every acknowledged key is ready in the queue.
    let stats = c.stats("job").await.unwrap();
    assert_eq!(stats.ready as usize, acked.len() + 1);
    let sample: Vec<String> = acked.iter().step_by(97).cloned().collect();
    for k in c.inspect("job", sample).await.unwrap().keys {
        assert_eq!(k.state, "ready", "{k:?}");
    }
    q.stop().await;
}
