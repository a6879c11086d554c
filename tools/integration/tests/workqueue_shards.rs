//! The sharded key layout on a real 3-master Redis Cluster: kjob's keys spread evenly over the
//! masters, while each Job's keys stay in one slot (every script of the suite runs there too:
//! `workqueue_semantics.rs` runs on a cluster).

use std::collections::HashSet;
use std::time::Duration;

use kjob_testkit::RedisCluster;
use kjob_workqueue::{
    Done, Enqueue, LeaseOutcome, Observation, ObservationKind, SessionPhase, Store, StoreConfig,
    ViewOp,
};

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(30);

/// A Job's writes as the watcher and a worker make them: expectations, an Add carrying an
/// observation and view writes, a record.
async fn a_job_with_its_state(s: &Store, key: &str) {
    s.set_expectations(key, "u", 1, 0).await.unwrap();
    let view = vec![
        ViewOp::Reset { uid: "u".into() },
        ViewOp::Pod { name: "p".into(), object: b"pod".to_vec() },
        ViewOp::Job { uid: "u".into(), object: b"job".to_vec(), resource_version: "1".into() },
        ViewOp::Trust,
    ];
    let obs = Observation::new(ObservationKind::Creation, "u", "p");
    let add = Enqueue::now(key).observing(vec![obs]).writing_view("s", view);
    s.add(Q, &[add]).await.unwrap();
    s.put_record(key, "backoff", b"1", Some(Duration::from_secs(600))).await.unwrap();
}

/// 300 Jobs over 30 namespaces: each master holds 33 % ± 8 % of kjob's keys (DBSIZE per
/// master), and every Job is leased once and finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_evenly_over_a_three_master_cluster() {
    let c = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().expect("cluster");
    let s = Store::connect(&c.url(), StoreConfig::default()).await.expect("connect");
    assert!(s.view_session("s", SessionPhase::Begin).await.unwrap());
    let keys: Vec<String> = (0..300).map(|i| format!("ns-{}/job-{i}", i % 30)).collect();
    for chunk in keys.chunks(20) {
        futures::future::join_all(chunk.iter().map(|k| a_job_with_its_state(&s, k))).await;
    }
    assert!(s.view_session("s", SessionPhase::Commit).await.unwrap());
    assert!(s.get_job_view(&keys[7], &[]).await.unwrap().is_some(), "a view is trusted");
    assert_eq!(s.stats(Q).await.unwrap().ready, 300);

    let mut per_node = Vec::new();
    for (node, mut conn) in s.target().node_connections().await.unwrap() {
        let n: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        per_node.push((node, n));
    }
    let total: u64 = per_node.iter().map(|(_, n)| n).sum();
    assert_eq!(per_node.len(), 3, "{per_node:?}");
    assert!(total > 300 * 5, "each Job has several keys: {per_node:?}");
    for (node, n) in &per_node {
        let share = *n as f64 / total as f64;
        assert!((0.25..=0.41).contains(&share), "{node} holds {share:.3} of {total}: {per_node:?}");
    }
    eprintln!("keys per master: {per_node:?}");

    // Every Job leased exactly once, from every shard, and finished.
    let mut leased = Vec::new();
    loop {
        let got = s.lease(Q, "w", 50, LEASE).await.unwrap().items;
        if got.is_empty() {
            break;
        }
        let dones: Vec<Done> = got
            .iter()
            .map(|l| Done {
                key: l.key.clone(),
                lease_id: l.lease_id.clone(),
                outcome: LeaseOutcome::Forget,
                error: String::new(),
            })
            .collect();
        assert!(s.done_many(Q, &dones).await.unwrap().iter().all(Option::is_some));
        leased.extend(got.into_iter().map(|l| l.key));
    }
    let unique: HashSet<&String> = leased.iter().collect();
    assert_eq!((leased.len(), unique.len()), (300, 300));
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.leased), (0, 0));
}

/// The shard tags cover the slot space evenly: shard `i`'s tag lies in the `i`-th of S equal
/// slices, so 3 masters with contiguous ranges get 8 of the 24 default shards each.
#[test]
fn shard_tags_cover_the_slots_evenly() {
    let layout = kjob_workqueue::Layout::default();
    let s = layout.shards();
    assert_eq!(s, kjob_workqueue::DEFAULT_SHARDS);
    let mut per_master = [0; 3];
    for i in 0..s {
        let slot = u32::from(kjob_workqueue::slot_of(&layout.tag(Q, i)));
        assert!((i * 16384 / s..(i + 1) * 16384 / s).contains(&slot), "shard {i} at slot {slot}");
        // redis-cli's ranges for 3 masters: 0-5460, 5461-10922, 10923-16383.
        per_master[usize::from(slot > 5460) + usize::from(slot > 10922)] += 1;
    }
    assert_eq!(per_master, [8, 8, 8]);
    // The slot function is Redis Cluster's (CRC16/XMODEM of the tag): known values.
    assert_eq!(kjob_workqueue::slot_of("123456789"), 0x31c3);
    assert_eq!(
        kjob_workqueue::slot_of("{user1000}.following"),
        kjob_workqueue::slot_of("user1000")
    );
}

/// A data set keeps the shard count it was created with: a replica started with another count
/// (or the default) uses the recorded one and sees every item.
#[tokio::test]
async fn a_data_set_keeps_its_recorded_shard_count() {
    let server = kjob_testkit::RedisServer::start().expect("redis-server");
    let four = StoreConfig { shards: Some(4), ..StoreConfig::default() };
    let a = Store::connect(&server.url(), four).await.unwrap();
    assert_eq!(a.layout().shards(), 4);
    let keys: Vec<Enqueue> = (0..40).map(|i| Enqueue::now(format!("ns/k{i}"))).collect();
    a.add(Q, &keys).await.unwrap();
    let b = Store::connect(&server.url(), StoreConfig::default()).await.unwrap();
    assert_eq!(b.layout().shards(), 4, "the recorded layout wins over the default (1)");
    let got = b.lease(Q, "w", 100, LEASE).await.unwrap().items;
    assert_eq!(got.len(), 40);
    // A new data set on a single server gets one shard.
    let other = kjob_testkit::RedisServer::start().expect("redis-server");
    let c = Store::connect(&other.url(), StoreConfig::default()).await.unwrap();
    assert_eq!(c.layout().shards(), 1);
}
