//! The upgrade from the unsharded layout: a Redis filled by hand the way the previous release
//! filled it (every key under `{wq:<queue>}`) is moved into the shards when a store of this
//! release connects (as kjob-queue does at start): no item, lease, expectation or record is lost,
//! a lease keeps its id, and running it again changes nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kjob_testkit::RedisServer;
use kjob_workqueue::{
    Enqueue, KeyState, LeaseOutcome, Observation, ObservationKind, Store, StoreConfig,
};

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(30);

fn unix_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Writes the previous release's keys: two ready Jobs, a delayed one, a leased one with its
/// failure count, a Job's expectations (with a seen pod), records, view and event state, the view
/// session, and an orphan pod.
async fn fill_the_old_layout(url: &str) {
    let mut c = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let now = unix_ms();
    let cmds: Vec<Vec<String>> = vec![
        vec!["ZADD".into(), "{wq:job}:ready".into(), "1000".into(), "ns/a".into()],
        vec!["ZADD".into(), "{wq:job}:ready".into(), "1001".into(), "other/b".into()],
        vec!["ZADD".into(), "{wq:job}:delayed".into(), (now + 60_000).to_string(), "ns/c".into()],
        vec!["ZADD".into(), "{wq:job}:leases".into(), (now + 30_000).to_string(), "ns/d".into()],
        vec![
            "HSET".into(),
            "{wq:job}:lease".into(),
            "ns/d".into(),
            "7-1000|1000|2|0|-1|w-old".into(),
        ],
        vec!["HSET".into(), "{wq:job}:failures".into(), "ns/d".into(), "2".into()],
        vec!["HSET".into(), "{wq:job}:failures".into(), "ns/c".into(), "1".into()],
        vec!["HINCRBY".into(), "{wq:job}:stats".into(), "lease_seq".into(), "7".into()],
        vec![
            "HSET".into(),
            "{wq:job}:exp:ns/a".into(),
            "uid".into(),
            "u".into(),
            "add".into(),
            "2".into(),
            "del".into(),
            "0".into(),
            "ts".into(),
            now.to_string(),
        ],
        vec!["SADD".into(), "{wq:job}:exp:ns/a:seen".into(), "1:p1".into()],
        vec!["HSET".into(), "{wq:job}:exp:ns/a:rec".into(), "backoff".into(), "0|b1".into()],
        vec!["SET".into(), "{wq:job}:view:ns/a".into(), "job".into()],
        vec!["HSET".into(), "{wq:job}:view:ns/a:meta".into(), "uid".into(), "u".into()],
        vec!["HSET".into(), "{wq:job}:ev:ns/a".into(), "b:spam".into(), "3|1000".into()],
        vec!["PEXPIRE".into(), "{wq:job}:ev:ns/a".into(), "600000".into()],
        vec!["SET".into(), "{wq:job}:view-session".into(), "s".into()],
        vec!["ZADD".into(), "{wq:orphan-pod}:ready".into(), "1000".into(), "ns/p".into()],
    ];
    for args in cmds {
        let mut cmd = redis::cmd(&args[0]);
        cmd.arg(&args[1..]);
        let _: redis::Value = cmd.query_async(&mut c).await.unwrap();
    }
}

async fn exists(url: &str, key: &str) -> bool {
    let mut c = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    redis::cmd("EXISTS").arg(key).query_async::<i64>(&mut c).await.unwrap() == 1
}

async fn nothing_is_lost_on_upgrade(shards: Option<u32>) {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    fill_the_old_layout(&url).await;
    let config = StoreConfig { shards, ..StoreConfig::default() };
    let s = Store::connect(&url, config.clone()).await.unwrap();

    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased), (2, 1, 1));
    assert_eq!(st.failing, 2, "failure counts moved");
    assert_eq!(s.stats("orphan-pod").await.unwrap().ready, 1);
    // The lease is the same lease: its holder finishes it with the id it has.
    let d = &s.inspect(Q, &["ns/d".into()]).await.unwrap()[0];
    assert_eq!((d.state, d.holder.as_str(), d.requeues), (KeyState::Leased, "w-old", 2));
    assert!(s.done(Q, "ns/d", "7-1000", LeaseOutcome::Forget).await.unwrap().is_some());
    // Expectations, the seen set and records.
    let e = s.get_expectations("ns/a", "u").await.unwrap();
    assert_eq!(e.record.as_ref().map(|r| (r.add, r.del)), Some((2, 0)));
    let seen_again = Observation::new(ObservationKind::Creation, "u", "p1");
    let fresh = Observation::new(ObservationKind::Creation, "u", "p2");
    let r = s
        .add(
            Q,
            &[Enqueue { observe_only: true, ..Enqueue::now("ns/a") }
                .observing(vec![seen_again, fresh])],
        )
        .await
        .unwrap();
    assert_eq!(r.observed, 1, "the pod seen before the upgrade is not counted twice");
    assert_eq!(s.get_record("ns/a", "backoff").await.unwrap(), Some(b"b1".to_vec()));
    // The view moved but is not trusted (no session): the watcher re-snapshots.
    assert_eq!(s.get_job_view("ns/a", &[]).await.unwrap(), None);
    let tag = s.layout().job_tag("ns/a");
    assert!(exists(&url, &format!("{tag}:view:ns/a")).await);
    assert!(exists(&url, &format!("{tag}:ev:ns/a")).await);
    // Every ready item once; nothing of the old layout is left.
    let mut got: Vec<String> =
        s.lease(Q, "w", 10, LEASE).await.unwrap().items.into_iter().map(|l| l.key).collect();
    got.sort();
    assert_eq!(got, ["ns/a", "other/b"]);
    for old in [
        "{wq:job}:ready",
        "{wq:job}:delayed",
        "{wq:job}:leases",
        "{wq:job}:lease",
        "{wq:job}:failures",
        "{wq:job}:stats",
        "{wq:job}:exp:ns/a",
        "{wq:job}:exp:ns/a:seen",
        "{wq:job}:exp:ns/a:rec",
        "{wq:job}:view:ns/a",
        "{wq:job}:view-session",
        "{wq:job}:ev:ns/a",
        "{wq:orphan-pod}:ready",
    ] {
        assert!(!exists(&url, old).await, "{old} is left");
    }

    // Again (a second replica, or a restart after a crash part way: the marker cleared and an
    // old entry left behind for a key now leased): nothing moves twice, nothing is doubled.
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL").arg("{wq:migrated}").query_async(&mut c).await.unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg("{wq:job}:ready")
        .arg(1000)
        .arg("ns/a")
        .query_async(&mut c)
        .await
        .unwrap();
    let again = Store::connect(&url, config).await.unwrap();
    let a = &again.inspect(Q, &["ns/a".into()]).await.unwrap()[0];
    assert_eq!(a.state, KeyState::Leased, "a key leased in the shards is not also made ready");
    assert!(again.lease(Q, "w2", 10, LEASE).await.unwrap().items.is_empty());
    assert_eq!(again.stats(Q).await.unwrap().leased, 2);
}

#[tokio::test]
async fn nothing_is_lost_on_upgrade_to_one_shard() {
    nothing_is_lost_on_upgrade(None).await;
}

#[tokio::test]
async fn nothing_is_lost_on_upgrade_to_many_shards() {
    nothing_is_lost_on_upgrade(Some(kjob_workqueue::DEFAULT_SHARDS)).await;
}
