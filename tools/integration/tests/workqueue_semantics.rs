//! The semantic suite, written once and run against a single redis-server, a 3-node Redis
//! Cluster, and a secured redis-server (TLS only, client certificates required, `default` user
//! off, kjob's ACL user with exactly `kjob_workqueue::acl::ACL_RULES`), each test starting its
//! own servers on free ports.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use kjob_testkit::{RedisSecurity, RedisServer, TestPki, TestRedis};
use kjob_workqueue::events::{EventGateConfig, GateEvent};
use kjob_workqueue::{
    Done, Enqueue, FinalizerRemovals, HANDOFF_VIEW_MAX_PODS, KeyState, LeaseAsk, LeaseBatch,
    LeaseOutcome, Observation, ObservationKind, RedisOptions, RedisTarget, RedisTls, SessionPhase,
    Store, StoreConfig, ViewDelta, ViewOp, ViewPage, Waker, WqError,
};

const Q: &str = "job";

async fn single(config: StoreConfig) -> (TestRedis, Store) {
    let redis = TestRedis::single().expect("redis-server");
    let store = Store::connect(&redis.url(), config).await.expect("connect");
    (redis, store)
}

async fn cluster(config: StoreConfig) -> (TestRedis, Store) {
    let redis = TestRedis::cluster().await.expect("cluster");
    let store = Store::connect(&redis.url(), config).await.expect("connect");
    (redis, store)
}

/// A TLS-only redis-server that asks for client certificates, with the `default` user off and
/// kjob's ACL user, reached as kjob-queue reaches it in production. Its data set is sharded as
/// a Cluster's (a single server defaults to one shard), so the suite runs with several shards
/// on one server too.
async fn secured(config: StoreConfig) -> (TestRedis, Store) {
    let config = StoreConfig { shards: Some(kjob_workqueue::DEFAULT_SHARDS), ..config };
    let pki = TestPki::generate("semantics").expect("test certificates");
    let security = RedisSecurity {
        tls: Some(pki.dir().to_path_buf()),
        tls_auth_clients: true,
        acl: vec![
            "user default off".into(),
            kjob_workqueue::acl::acl_user_line("kjob", ">s3cret-pw"),
        ],
    };
    let server = RedisServer::start_secured(&security, &[]).expect("redis-server");
    let options = RedisOptions {
        username: Some("kjob".into()),
        password: Some("s3cret-pw".into()),
        tls: RedisTls {
            ca_file: Some(pki.ca()),
            cert_file: Some(pki.client_cert()),
            key_file: Some(pki.client_key()),
        },
    };
    let target = RedisTarget::new(&server.url(), &options).expect("target");
    let store = Store::connect_to(target, config).await.expect("connect");
    (TestRedis::Secured(server, pki), store)
}

/// `INFO memory` reaches every node (a Cluster's too), for the per-node memory gauges.
async fn memory_of_every_node(s: Store) {
    let nodes = s.memory().await.unwrap();
    let expected = if s.target().is_cluster() { 3 } else { 1 };
    assert_eq!(nodes.len(), expected, "{nodes:?}");
    for n in &nodes {
        assert!(n.used > 0 && n.node.contains(':'), "{n:?}");
        assert!(!n.is_full(), "{n:?}");
    }
}

fn now(key: &str) -> Enqueue {
    Enqueue::now(key)
}

fn after(key: &str, ms: u64) -> Enqueue {
    Enqueue::after(key, Duration::from_millis(ms))
}

const LEASE: Duration = Duration::from_secs(30);

/// Polls `lease` until it returns something or `within` passes.
async fn lease_within(s: &Store, worker: &str, within: Duration) -> Vec<kjob_workqueue::Leased> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let got = s.lease(Q, worker, 10, LEASE).await.unwrap().items;
        if !got.is_empty() || tokio::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn dedupe(s: Store) {
    assert_eq!(s.add(Q, &[now("ns/a")]).await.unwrap().added, 1);
    let again = s.add(Q, &[now("ns/a"), now("ns/a")]).await.unwrap();
    assert_eq!((again.added, again.accepted_now), (0, 0));
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased, st.dirty), (1, 0, 0, 0));
    let got = s.lease(Q, "w1", 10, LEASE).await.unwrap().items;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, "ns/a");
    assert!(s.lease(Q, "w1", 10, LEASE).await.unwrap().items.is_empty());
}

async fn earliest_ready_time_wins(s: Store) {
    s.add(Q, &[after("ns/a", 10_000)]).await.unwrap();
    let first = s.inspect(Q, &["ns/a".into()]).await.unwrap()[0].delayed_ms.unwrap();
    assert_eq!(s.add(Q, &[after("ns/a", 300)]).await.unwrap().added, 1);
    let v = &s.inspect(Q, &["ns/a".into()]).await.unwrap()[0];
    assert_eq!(v.state, KeyState::Delayed);
    let earlier = v.delayed_ms.unwrap();
    assert!(earlier < first - 9_000, "{earlier} vs {first}");
    // A later time never postpones.
    assert_eq!(s.add(Q, &[after("ns/a", 20_000)]).await.unwrap().added, 0);
    assert_eq!(s.inspect(Q, &["ns/a".into()]).await.unwrap()[0].delayed_ms, Some(earlier));
    assert!(s.lease(Q, "w", 1, LEASE).await.unwrap().items.is_empty());
    let got = lease_within(&s, "w", Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1);
    // An immediate add beats a pending delayed one.
    s.add(Q, &[after("ns/b", 10_000), now("ns/b")]).await.unwrap();
    let got = s.lease(Q, "w", 10, LEASE).await.unwrap().items;
    assert_eq!(got.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(), vec!["ns/b"]);
}

async fn dirty_while_processing(s: Store) {
    s.add(Q, &[now("ns/a")]).await.unwrap();
    let l = s.lease(Q, "w1", 1, LEASE).await.unwrap().items.remove(0);
    let add = s.add(Q, &[now("ns/a")]).await.unwrap();
    assert_eq!(add.added, 1);
    let v = &s.inspect(Q, &["ns/a".into()]).await.unwrap()[0];
    assert_eq!((v.state, v.dirty, v.holder.as_str()), (KeyState::Leased, true, "w1"));
    // Never handed to a second worker while leased.
    assert!(s.lease(Q, "w2", 10, LEASE).await.unwrap().items.is_empty());
    let done = s.done(Q, "ns/a", &l.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    assert_eq!(done.ready_at_ms, Some(done.now_ms));
    let l2 = s.lease(Q, "w2", 1, LEASE).await.unwrap().items.remove(0);
    assert_ne!(l2.lease_id, l.lease_id);
    assert!(!s.inspect(Q, &["ns/a".into()]).await.unwrap()[0].dirty);

    // Added with a delay while processing: back at that time, not at Done.
    s.add(Q, &[after("ns/a", 400)]).await.unwrap();
    let done = s.done(Q, "ns/a", &l2.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    let ready = done.ready_at_ms.unwrap();
    assert!(ready > done.now_ms, "{ready} vs {}", done.now_ms);
    assert!(s.lease(Q, "w", 1, LEASE).await.unwrap().items.is_empty());
    assert_eq!(lease_within(&s, "w", Duration::from_secs(5)).await.len(), 1);
}

async fn dirty_requeue_takes_earliest_time(s: Store) {
    s.add(Q, &[now("ns/a")]).await.unwrap();
    let l = s.lease(Q, "w1", 1, LEASE).await.unwrap().items.remove(0);
    s.add(Q, &[after("ns/a", 60_000), now("ns/a")]).await.unwrap();
    let done = s
        .done(Q, "ns/a", &l.lease_id, LeaseOutcome::RequeueAfter(Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.ready_at_ms, Some(done.now_ms));
    assert_eq!(s.lease(Q, "w", 1, LEASE).await.unwrap().items.len(), 1);
}

async fn no_key_leased_twice(s: Store) {
    let items: Vec<Enqueue> = (0..200).map(|i| now(&format!("ns/k{i}"))).collect();
    assert_eq!(s.add(Q, &items).await.unwrap().added, 200);
    let mut tasks = Vec::new();
    for w in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = s.lease(Q, &format!("w{w}"), 7, LEASE).await.unwrap().items;
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|l| l.key));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), 200, "a key was leased twice or lost");
    assert_eq!(unique.len(), 200);
    assert_eq!(s.stats(Q).await.unwrap().leased, 200);
}

async fn lease_expiry_returns_key_and_fences_stale_holder(s: Store) {
    s.add(Q, &[now("ns/a")]).await.unwrap();
    let old = s.lease(Q, "w1", 1, Duration::from_millis(300)).await.unwrap().items.remove(0);
    s.add(Q, &[now("ns/a")]).await.unwrap(); // dirty while processing
    assert!(s.renew(Q, "ns/a", &old.lease_id, Duration::from_millis(300)).await.unwrap().is_some());
    let new = lease_within(&s, "w2", Duration::from_secs(5)).await;
    assert_eq!(new.len(), 1, "expired lease did not come back");
    let new = &new[0];
    assert_ne!(new.lease_id, old.lease_id);
    // The new lessee learns that the lease before it expired.
    assert_eq!((old.expiries, new.expiries), (0, 1));
    // The stale holder can neither extend nor finish, and changes nothing by trying.
    assert_eq!(s.renew(Q, "ns/a", &old.lease_id, LEASE).await.unwrap(), None);
    assert_eq!(s.done(Q, "ns/a", &old.lease_id, LeaseOutcome::Forget).await.unwrap(), None);
    assert_eq!(s.done(Q, "ns/a", &old.lease_id, LeaseOutcome::RateLimited).await.unwrap(), None);
    let v = &s.inspect(Q, &["ns/a".into()]).await.unwrap()[0];
    assert_eq!((v.state, v.holder.as_str(), v.requeues), (KeyState::Leased, "w2", 0));
    assert_eq!(v.lease_deadline_ms, Some(new.deadline_ms));
    assert!(s.done(Q, "ns/a", &new.lease_id, LeaseOutcome::Forget).await.unwrap().is_some());
    // The dirty mark was folded into the re-queue at expiry: exactly one more run, not two.
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.leased, st.dirty), (0, 0, 0));
    // Garbage ids are refused too.
    s.add(Q, &[now("ns/b")]).await.unwrap();
    s.lease(Q, "w", 1, LEASE).await.unwrap();
    assert_eq!(s.done(Q, "ns/b", "1-1", LeaseOutcome::Forget).await.unwrap(), None);
    assert_eq!(s.inspect(Q, &["ns/b".into()]).await.unwrap()[0].state, KeyState::Leased);
}

async fn sweep_reaps_without_lessees(s: Store) {
    s.add(Q, &[now("ns/a"), after("ns/b", 100)]).await.unwrap();
    s.lease(Q, "w", 1, Duration::from_millis(100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r = s.sweep(Q).await.unwrap();
    assert_eq!((r.reaped, r.promoted), (1, 1));
    assert_eq!(s.stats(Q).await.unwrap().ready, 2);
    assert_eq!(s.sweep(Q).await.unwrap().reaped, 0);
}

async fn rate_limiter_sequence_and_forget(s: Store) {
    s.add(Q, &[now("ns/a")]).await.unwrap();
    let mut delays = Vec::new();
    for i in 0..9u32 {
        let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
        assert_eq!(l.requeues, i);
        let d = s.done(Q, "ns/a", &l.lease_id, LeaseOutcome::RateLimited).await.unwrap().unwrap();
        if i == 0 {
            assert_eq!(d.ready_at_ms, Some(d.now_ms + 1000));
        }
        delays.push(d.retry_delay_ms.unwrap() / 1000);
        s.add(Q, &[now("ns/a")]).await.unwrap(); // make it ready again without waiting
    }
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(s.stats(Q).await.unwrap().failing, 1);
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    s.done(Q, "ns/a", &l.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    assert_eq!(s.inspect(Q, &["ns/a".into()]).await.unwrap()[0].requeues, 0);
    assert_eq!(s.stats(Q).await.unwrap().failing, 0);
    s.add(Q, &[now("ns/a")]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    let d = s.done(Q, "ns/a", &l.lease_id, LeaseOutcome::RateLimited).await.unwrap().unwrap();
    assert_eq!(d.retry_delay_ms, Some(1000));
}

async fn requeue_after(s: Store) {
    s.add(Q, &[now("ns/a")]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    let d = s
        .done(Q, "ns/a", &l.lease_id, LeaseOutcome::RequeueAfter(Duration::from_millis(300)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.ready_at_ms, Some(d.now_ms + 300));
    assert_eq!(s.inspect(Q, &["ns/a".into()]).await.unwrap()[0].state, KeyState::Delayed);
    let l = lease_within(&s, "w", Duration::from_secs(5)).await.remove(0);
    let d =
        s.done(Q, "ns/a", &l.lease_id, LeaseOutcome::RequeueAfter(Duration::ZERO)).await.unwrap();
    assert_eq!(d.unwrap().ready_at_ms, d.map(|d| d.now_ms));
    assert_eq!(s.inspect(Q, &["ns/a".into()]).await.unwrap()[0].state, KeyState::Ready);
}

async fn expectations_semantics(s: Store) {
    let k = "ns/job";
    // No record: satisfied.
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert!(e.satisfied && e.record.is_none());
    // Lower without a record creates nothing.
    assert!(!s.lower_expectations(k, "u1", 1, 0).await.unwrap());
    assert!(s.get_expectations(k, "u1").await.unwrap().record.is_none());
    s.set_expectations(k, "u1", 2, 1).await.unwrap();
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert!(!e.satisfied);
    assert_eq!(e.record.as_ref().map(|r| (r.add, r.del)), Some((2, 1)));
    // Set replaces.
    s.set_expectations(k, "u1", 1, 1).await.unwrap();
    assert_eq!(s.get_expectations(k, "u1").await.unwrap().record.unwrap().add, 1);
    // Observations lower; a repeated observation of one pod counts once.
    let c = |p: &str| Observation::new(ObservationKind::Creation, "u1", p);
    assert_eq!(s.observe(k, &[c("p1"), c("p1")]).await.unwrap(), 1);
    assert!(!s.get_expectations(k, "u1").await.unwrap().satisfied);
    // Another Job UID's observation is ignored, and its view is "no record".
    let other = Observation::new(ObservationKind::Deletion, "u2", "p9");
    assert_eq!(s.observe(k, &[other]).await.unwrap(), 0);
    let e2 = s.get_expectations(k, "u2").await.unwrap();
    assert!(e2.satisfied && e2.record.is_none());
    assert!(!s.lower_expectations(k, "u2", 0, 1).await.unwrap());
    // Lowering (a failed delete call) satisfies it.
    assert!(s.lower_expectations(k, "u1", 0, 1).await.unwrap());
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert!(e.satisfied);
    assert_eq!(e.record.map(|r| (r.add, r.del)), Some((0, 0)));
    // A new Set resets the seen pods.
    s.set_expectations(k, "u1", 1, 0).await.unwrap();
    assert_eq!(s.observe(k, &[c("p1")]).await.unwrap(), 1);
    assert!(s.get_expectations(k, "u1").await.unwrap().satisfied);
}

/// A sync that raises its record after creating its pods: the creations the watcher observed
/// in between (with no record, another Job's or an older one) are not expected again.
async fn expectations_raised_after_the_creates(s: Store) {
    let k = "ns/job";
    let c = |p: &str| Observation::new(ObservationKind::Creation, "u1", p);
    let created = |p: &[&str]| p.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    // No record yet (a new Job's first sync): p1 is observed before the record is raised.
    assert_eq!(s.observe(k, &[c("p1")]).await.unwrap(), 0, "no record to lower");
    assert_eq!(
        s.set_expectations_created(k, "u1", 2, 0, &created(&["p1", "p2"])).await.unwrap(),
        1
    );
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert!(!e.satisfied);
    assert_eq!(e.record.as_ref().map(|r| (r.add, r.del)), Some((1, 0)));
    // p1 counted once, even re-sent; p2 satisfies the record.
    assert_eq!(s.observe(k, &[c("p1")]).await.unwrap(), 0);
    assert_eq!(s.observe(k, &[c("p2")]).await.unwrap(), 1);
    assert!(s.get_expectations(k, "u1").await.unwrap().satisfied);
    // A satisfied record: the observation lowers it below zero, the late raise counts it out.
    assert_eq!(s.observe(k, &[c("p3")]).await.unwrap(), 1);
    assert_eq!(s.set_expectations_created(k, "u1", 1, 0, &created(&["p3"])).await.unwrap(), 0);
    assert!(s.get_expectations(k, "u1").await.unwrap().satisfied);
    // A record of an older Job of the same name: the new Job's pod creation is still kept.
    s.set_expectations(k, "u0", 0, 0).await.unwrap();
    assert_eq!(s.observe(k, &[c("p4")]).await.unwrap(), 0);
    assert_eq!(s.set_expectations_created(k, "u1", 1, 0, &created(&["p4"])).await.unwrap(), 0);
    assert!(s.get_expectations(k, "u1").await.unwrap().satisfied);
    // Creations not observed, and those whose outcome is unknown (add beyond the UIDs), wait.
    assert_eq!(s.set_expectations_created(k, "u1", 3, 0, &created(&["p5"])).await.unwrap(), 3);
    assert_eq!(s.observe(k, &[c("p5"), c("p6")]).await.unwrap(), 2);
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert_eq!(e.record.map(|r| r.add), Some(1));
    // Only the created pods stay seen across the raise (the seen set does not grow with the
    // Job): p4, seen before it, counts again, as after a plain Set.
    assert_eq!(s.observe(k, &[c("p4")]).await.unwrap(), 1);
    // A plain Set starts afresh: the pods seen before count again.
    s.set_expectations(k, "u1", 1, 0).await.unwrap();
    assert_eq!(s.observe(k, &[c("p5")]).await.unwrap(), 1);
}

async fn expectations_timeout(s: Store) {
    s.set_expectations("ns/j", "u1", 3, 0).await.unwrap();
    assert!(!s.get_expectations("ns/j", "u1").await.unwrap().satisfied);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let e = s.get_expectations("ns/j", "u1").await.unwrap();
    assert!(e.satisfied, "{e:?}");
    assert!(e.age_ms >= 400, "{e:?}");
}

async fn finalizer_uid_sets_and_records(s: Store) {
    let k = "ns/job";
    s.expect_finalizer_removals(k, "u1", &["a".into(), "b".into(), "c".into()]).await.unwrap();
    assert_eq!(s.get_expectations(k, "u1").await.unwrap().finalizer_removals, vec!["a", "b", "c"]);
    let fr = |p: &str| Observation::new(ObservationKind::FinalizerRemoval, "u1", p);
    assert_eq!(s.observe(k, &[fr("a"), fr("a"), fr("zz")]).await.unwrap(), 1);
    assert_eq!(s.get_expectations(k, "u1").await.unwrap().finalizer_removals, vec!["b", "c"]);
    assert!(s.get_expectations(k, "u2").await.unwrap().finalizer_removals.is_empty());

    assert_eq!(s.get_record(k, "backoff").await.unwrap(), None);
    let bin = vec![0u8, 1, 2, b'|', 255];
    s.put_record(k, "backoff", &bin, None).await.unwrap();
    assert_eq!(s.get_record(k, "backoff").await.unwrap(), Some(bin));
    s.put_record(k, "short", b"x", Some(Duration::from_millis(150))).await.unwrap();
    assert_eq!(s.get_record(k, "short").await.unwrap().as_deref(), Some(&b"x"[..]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.get_record(k, "short").await.unwrap(), None);

    s.set_expectations(k, "u1", 1, 0).await.unwrap();
    s.delete_expectations(k).await.unwrap();
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert!(e.record.is_none() && e.finalizer_removals.is_empty() && e.satisfied);
    assert_eq!(s.get_record(k, "backoff").await.unwrap(), None);
}

/// A sync expects its finalizer removals with its Done, after making them: the ones the
/// watcher has seen meanwhile (through an Add, as the watcher sends them) are not expected.
async fn finalizer_removals_expected_with_the_done(s: Store) {
    let (k, k2) = ("ns/fin", "ns/fin2");
    let fr = |p: &str| Observation::new(ObservationKind::FinalizerRemoval, "u1", p);
    let raise = |key: &str, pods: &[&str]| FinalizerRemovals {
        key: key.into(),
        job_uid: "u1".into(),
        pod_uids: pods.iter().map(|p| p.to_string()).collect(),
    };
    let in_flight = |key: &'static str| {
        let s = &s;
        async move { s.get_expectations(key, "u1").await.unwrap().finalizer_removals }
    };
    let seen = Enqueue { observe_only: true, ..now(k).observing(vec![fr("p1")]) };
    assert_eq!(s.add(Q, &[seen]).await.unwrap().observed, 0, "nothing in flight to drop");
    // One script call for two Jobs' Dones: p1 is counted out.
    let two = [raise(k, &["p1", "p2", "p3"]), raise(k2, &["q1"])];
    assert_eq!(s.expect_finalizer_removals_done(&two).await.unwrap(), 3);
    assert_eq!(in_flight(k).await, vec!["p2", "p3"]);
    assert_eq!(in_flight(k2).await, vec!["q1"]);
    // Seen after the Done: dropped from the in-flight set, as always.
    assert_eq!(s.observe(k, &[fr("p2")]).await.unwrap(), 1);
    assert_eq!(in_flight(k).await, vec!["p3"]);
    // The Done emptied what had been seen: a later Done expects p1 again, not p4 (seen since).
    assert_eq!(s.observe(k, &[fr("p4")]).await.unwrap(), 0);
    let later = [raise(k, &["p1", "p4", "p5"])];
    assert_eq!(s.expect_finalizer_removals_done(&later).await.unwrap(), 2);
    assert_eq!(in_flight(k).await, vec!["p1", "p3", "p5"]);
    // Nothing to expect costs no script call.
    let before = scripts_run(&s).await;
    assert_eq!(s.expect_finalizer_removals_done(&[raise(k, &[])]).await.unwrap(), 0);
    assert_eq!(scripts_run(&s).await, before);
    // Deleting the Job's expectations deletes what was seen too.
    assert_eq!(s.observe(k, &[fr("p6")]).await.unwrap(), 0);
    s.delete_expectations(k).await.unwrap();
    assert_eq!(s.expect_finalizer_removals_done(&[raise(k, &["p6"])]).await.unwrap(), 1);
    assert_eq!(in_flight(k).await, vec!["p6"]);
}

async fn stats_and_inspect(s: Store) {
    s.add(Q, &[now("ns/a"), now("ns/b"), after("ns/c", 60_000)]).await.unwrap();
    let l = s.lease(Q, "w9", 1, LEASE).await.unwrap().items.remove(0);
    s.add(Q, &[now(&l.key)]).await.unwrap();
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased, st.dirty), (1, 1, 1, 1));
    assert!(st.oldest_ready_ms.is_some() && st.oldest_started_ms.is_some());
    // Either ready key may be leased first (they are in different shards or not): the other
    // stays ready.
    let other = if l.key == "ns/a" { "ns/b" } else { "ns/a" };
    let keys: Vec<String> = [l.key.as_str(), other, "ns/c", "ns/zz"].map(String::from).to_vec();
    let v = s.inspect(Q, &keys).await.unwrap();
    let states: Vec<_> = v.iter().map(|v| v.state).collect();
    assert_eq!(
        states,
        vec![KeyState::Leased, KeyState::Ready, KeyState::Delayed, KeyState::Absent]
    );
    assert_eq!(v[0].holder, "w9");
    // Queues are independent.
    assert_eq!(s.stats("orphan-pod").await.unwrap().ready, 0);
}

async fn waiting_lease_wakes_on_add(s: Store) {
    let waker = Waker::new(&s, [Q]);
    let shutdown = tokio::sync::oneshot::channel::<()>();
    let runner = {
        let (w, s, rx) = (waker.clone(), s.clone(), shutdown.1);
        tokio::spawn(async move {
            w.run(s, async move {
                let _ = rx.await;
            })
            .await
        })
    };
    let t0 = tokio::time::Instant::now();
    let waiter = {
        let (w, s) = (waker.clone(), s.clone());
        tokio::spawn(async move { w.lease(&s, Q, "w", 5, LEASE, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let added_at = tokio::time::Instant::now();
    // Added through another Store (another replica's connection).
    let other = Store::connect_to(s.target().clone(), StoreConfig::default()).await.unwrap();
    other.add(Q, &[now("ns/a")]).await.unwrap();
    let got = waiter.await.unwrap().unwrap().items;
    let latency = added_at.elapsed();
    assert_eq!(got.len(), 1);
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert!(latency < Duration::from_millis(800), "woke after {latency:?}");
    // A zero wait returns at once with nothing.
    let r: Result<_, WqError> = waker.lease(&s, Q, "w", 1, LEASE, Duration::ZERO).await;
    assert!(r.unwrap().items.is_empty());
    let _ = shutdown.0.send(());
    runner.await.unwrap();
}

/// The wake loop keeps its blocking connection between waits (a lessee that alternates between
/// waiting and working must not pay a new connection, over TLS a handshake, each time), and a
/// kept connection that was closed while idle is replaced at once.
async fn wake_connection_kept_between_waits(s: Store) {
    let waker = Waker::new(&s, [Q]);
    let (stop, runner) = run_waker(&waker, &s);
    let mut admin = s.target().node_connections().await.unwrap();
    async fn connections_made(admin: &mut [(String, redis::aio::MultiplexedConnection)]) -> u64 {
        let mut total = 0;
        for (_, c) in admin.iter_mut() {
            let info: String = redis::cmd("INFO").arg("stats").query_async(c).await.unwrap();
            total += info
                .lines()
                .find_map(|l| l.strip_prefix("total_connections_received:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap();
        }
        total
    }
    let wait_once = |key: &'static str| {
        let (w, s) = (waker.clone(), s.clone());
        async move {
            let waiter = {
                let (w, s) = (w.clone(), s.clone());
                tokio::spawn(
                    async move { w.lease(&s, Q, "w", 5, LEASE, Duration::from_secs(10)).await },
                )
            };
            until_waiting(&w, 1).await;
            let added_at = tokio::time::Instant::now();
            s.add(Q, &[now(key)]).await.unwrap();
            let got = waiter.await.unwrap().unwrap().items;
            assert_eq!(got.len(), 1, "{key}");
            let done = Done {
                key: key.into(),
                lease_id: got[0].lease_id.clone(),
                outcome: LeaseOutcome::Forget,
                error: String::new(),
            };
            s.done_many(Q, &[done]).await.unwrap();
            added_at.elapsed()
        }
    };
    wait_once("ns/first").await;
    let made = connections_made(&mut admin).await;
    for key in ["ns/second", "ns/third", "ns/fourth"] {
        wait_once(key).await;
        // Long enough for the loop's BLPOP to time out with nobody waiting: it goes idle.
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    assert_eq!(connections_made(&mut admin).await, made, "a new connection per wait");
    // Close the idle blocking connection behind the loop's back, as Redis's `timeout` would
    // (not on the secured backend: kjob's ACL user may not list or kill clients, rightly).
    let mut killed = 0;
    for (_, c) in admin.iter_mut() {
        let list = redis::cmd("CLIENT").arg("LIST").query_async::<String>(c).await;
        let list = match list {
            Err(e) if e.code() == Some("NOPERM") => {
                let _ = stop.send(());
                runner.await.unwrap();
                return;
            }
            r => r.unwrap(),
        };
        for line in list.lines().filter(|l| l.contains("cmd=blpop")) {
            let id = line.split(' ').find_map(|f| f.strip_prefix("id=")).unwrap();
            let n: i64 =
                redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query_async(c).await.unwrap();
            killed += n;
        }
    }
    assert_eq!(killed, 1, "one blocking connection, idle");
    let latency = wait_once("ns/after-kill").await;
    assert!(latency < Duration::from_millis(800), "woke after {latency:?}");
    let _ = stop.send(());
    runner.await.unwrap();
}

async fn done_many_in_one_call(s: Store) {
    s.add(Q, &[now("ns/a"), now("ns/b"), now("ns/c")]).await.unwrap();
    let l = s.lease(Q, "w", 3, LEASE).await.unwrap().items;
    let id = |k: &str| l.iter().find(|i| i.key == k).unwrap().lease_id.clone();
    s.add(Q, &[now("ns/b")]).await.unwrap(); // dirty while leased
    let d =
        |k: &str, outcome| Done { key: k.into(), lease_id: id(k), outcome, error: String::new() };
    let r = s
        .done_many(
            Q,
            &[
                d("ns/a", LeaseOutcome::Forget),
                d("ns/a", LeaseOutcome::Forget), // the same lease again: stale
                d("ns/b", LeaseOutcome::Forget),
                d("ns/c", LeaseOutcome::RateLimited),
                Done {
                    key: "ns/zz".into(),
                    lease_id: "1-1".into(),
                    outcome: LeaseOutcome::Forget,
                    error: String::new(),
                },
            ],
        )
        .await
        .unwrap();
    // Each ready time is counted from its own shard's script's clock.
    let ready: Vec<Option<Option<i64>>> =
        r.iter().map(|r| r.map(|d| d.ready_at_ms.map(|t| t - d.now_ms))).collect();
    assert_eq!(ready, vec![Some(None), None, Some(Some(0)), Some(Some(1000)), None]);
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased, st.dirty, st.failing), (1, 1, 0, 0, 1));
    let too_many = vec![d("ns/a", LeaseOutcome::Forget); kjob_workqueue::MAX_DONE_BATCH + 1];
    assert!(s.done_many(Q, &too_many).await.is_err());
}

async fn large_add_batch(s: Store) {
    s.add(Q, &[now("ns/k0"), now("ns/k1")]).await.unwrap();
    assert_eq!(s.lease(Q, "w", 2, LEASE).await.unwrap().items.len(), 2);
    // Larger than one multi-member command takes; repeats and leased keys inside.
    let mut items: Vec<Enqueue> = (0..2500).map(|i| now(&format!("ns/k{i}"))).collect();
    items.extend((0..10).map(|i| now(&format!("ns/k{i}"))));
    let r = s.add(Q, &items).await.unwrap();
    assert_eq!((r.added, r.accepted_now), (2500, 2500));
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.leased, st.dirty), (2498, 2, 2));
}

/// Scripts run so far (EVAL + EVALSHA calls) summed over every node of the store's target.
async fn scripts_run(s: &Store) -> u64 {
    let mut total = 0;
    for (_, mut c) in s.target().node_connections().await.unwrap() {
        let info: String =
            redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
        total += info
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

async fn observations_applied_in_the_enqueue_script(s: Store) {
    let k = "ns/job";
    s.set_expectations(k, "u1", 2, 1).await.unwrap();
    let c = |p: &str| Observation::new(ObservationKind::Creation, "u1", p);
    let d = Observation::new(ObservationKind::Deletion, "u1", "p9");
    let other = Observation::new(ObservationKind::Creation, "u1", "p3");
    // Load the script first (the first EVALSHA of a script runs as NOSCRIPT + EVAL).
    let warm = Enqueue { observe_only: true, ..now("ns/warm").observing(vec![c("px")]) };
    s.add(Q, &[warm, now("ns/warm")]).await.unwrap();
    s.lease(Q, "w", 10, LEASE).await.unwrap();
    let before = scripts_run(&s).await;
    let r = s
        .add(
            Q,
            &[
                now(k).observing(vec![c("p1"), c("p2"), c("p1")]),
                now("ns/plain"),
                Enqueue { observe_only: true, ..now("ns/job2").observing(vec![d.clone()]) },
            ],
        )
        .await
        .unwrap();
    // One script per shard touched, and on a Cluster one MARK of the index per shard that got
    // work (a single server's scripts mark the index themselves): a Job's
    // observations and its enqueue share a script. On a Cluster that is only possible because
    // the Job's expectation keys share its shard's slot (a cross-slot script fails with
    // CROSSSLOT), and a script is atomic, so no crash can apply the observations without the
    // enqueue or the reverse. The enqueued key is therefore never leased before its
    // observations count.
    let shard = |key: &str| s.layout().shard_of(key);
    let touched: HashSet<u32> = [k, "ns/plain", "ns/job2"].into_iter().map(shard).collect();
    let mut marked: HashSet<u32> = [k, "ns/plain"].into_iter().map(shard).collect();
    if !s.target().is_cluster() {
        marked.clear();
    }
    assert_eq!(
        scripts_run(&s).await - before,
        (touched.len() + marked.len()) as u64,
        "Add with observations ran more than one script per shard"
    );
    assert_eq!((r.added, r.accepted_now, r.observed), (2, 2, 2));
    let e = s.get_expectations(k, "u1").await.unwrap();
    assert_eq!(e.record.as_ref().map(|r| (r.add, r.del)), Some((0, 1)));
    assert!(!e.satisfied);
    let mut leased: Vec<String> =
        s.lease(Q, "w", 10, LEASE).await.unwrap().items.into_iter().map(|l| l.key).collect();
    leased.sort();
    assert_eq!(leased, vec![k.to_string(), "ns/plain".to_string()], "observe-only enqueued");
    // Observations of a delayed item count at once; the item waits.
    let r = s.add(Q, &[after(k, 60_000).observing(vec![d])]).await.unwrap();
    assert_eq!((r.observed, r.delayed), (1, 1));
    assert!(s.get_expectations(k, "u1").await.unwrap().satisfied);
    // Another queue: still applied (by a separate script on the job queue's slot) and enqueued.
    s.set_expectations(k, "u1", 1, 0).await.unwrap();
    let r = s.add("orphan-pod", &[now(k).observing(vec![other])]).await.unwrap();
    assert_eq!((r.added, r.observed), (1, 1));
    assert!(s.get_expectations(k, "u1").await.unwrap().satisfied);
    assert_eq!(s.stats("orphan-pod").await.unwrap().ready, 1);
}

async fn poison_item_goes_through_the_rate_limiter(s: Store) {
    // Poison after 2 expiries; limiter base 300 ms (config below).
    s.add(Q, &[now("ns/p")]).await.unwrap();
    // A lease of ns/p by `worker` that expires: what the sweep did, and the key's state after.
    let s = &s;
    let expire = |worker: &'static str| async move {
        s.lease(Q, worker, 1, Duration::from_millis(100)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = s.sweep(Q).await.unwrap();
        let v = s.inspect(Q, &["ns/p".into()]).await.unwrap().remove(0);
        ((r.reaped, r.poisoned), (v.state, v.expiries, v.requeues))
    };
    // First expiry: a crash or a pause, requeued at once.
    assert_eq!(expire("w1").await, ((1, 0), (KeyState::Ready, 1, 0)));
    assert_eq!(s.stats(Q).await.unwrap().failing, 0, "expiries are not failures");
    // Second expiry in a row: poison, so it waits out the rate limiter and counts a failure.
    assert_eq!(expire("w2").await, ((1, 1), (KeyState::Delayed, 2, 1)));
    assert!(s.lease(Q, "w3", 1, LEASE).await.unwrap().items.is_empty());
    let l = lease_within(s, "w3", Duration::from_secs(5)).await.remove(0);
    assert_eq!(l.requeues, 1);
    // A Done ends the run of expiries and (Forget) the failures.
    s.done(Q, "ns/p", &l.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    let v = &s.inspect(Q, &["ns/p".into()]).await.unwrap()[0];
    assert_eq!((v.state, v.expiries, v.requeues), (KeyState::Absent, 0, 0));
    assert_eq!(s.stats(Q).await.unwrap().failing, 0);
    // After the Done the count starts again: one expiry is not poison.
    s.add(Q, &[now("ns/p")]).await.unwrap();
    s.lease(Q, "w4", 1, Duration::from_millis(100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = s.lease(Q, "w5", 1, LEASE).await.unwrap();
    assert_eq!((b.reaped, b.poisoned, b.items.len()), (1, 0, 1));
}

async fn lease_promotes_due_items_and_counts_them(s: Store) {
    s.add(Q, &[now("ns/d"), after("ns/d", 150), after("ns/e", 150)]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    assert_eq!(l.key, "ns/d");
    tokio::time::sleep(Duration::from_millis(250)).await;
    // ns/d is promoted while leased (an accepted add: it becomes dirty), so is ns/e.
    let b = s.lease(Q, "w", 10, LEASE).await.unwrap();
    assert_eq!(b.promoted, 2);
    assert_eq!(b.items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), vec!["ns/e"]);
    assert!(s.inspect(Q, &["ns/d".into()]).await.unwrap()[0].dirty);
}

fn poison_config() -> StoreConfig {
    StoreConfig {
        poison_after: 2,
        limiter: kjob_workqueue::ItemExponentialLimiter {
            base: Duration::from_millis(300),
            max: Duration::from_secs(5),
        },
        ..StoreConfig::default()
    }
}

fn pod_op(name: &str, body: &str) -> ViewOp {
    ViewOp::Pod { name: name.into(), object: body.as_bytes().to_vec() }
}

fn job_op(uid: &str, rv: &str, body: &str) -> ViewOp {
    ViewOp::Job { uid: uid.into(), object: body.as_bytes().to_vec(), resource_version: rv.into() }
}

fn snapshot(uid: &str, rv: &str, pods: &[(&str, &str)]) -> Vec<ViewOp> {
    let mut ops = vec![ViewOp::Reset { uid: uid.into() }];
    ops.extend(pods.iter().map(|(n, b)| pod_op(n, b)));
    ops.push(job_op(uid, rv, "job"));
    ops.push(ViewOp::Trust);
    ops
}

fn sorted_pods(v: &kjob_workqueue::JobView) -> Vec<String> {
    let mut p: Vec<String> = v.pods.iter().map(|b| String::from_utf8(b.clone()).unwrap()).collect();
    p.sort();
    p
}

/// The shared Job view: trusted only when written in full by the committed current session;
/// a new session distrusts every older view at once; a deposed session's writes are dropped;
/// resourceVersions only move forward; worker write-backs and orphan notices.
async fn job_view_sessions_and_trust(s: Store) {
    let k = "ns/j";
    let item = |sess: &str, ops: Vec<ViewOp>| Enqueue {
        observe_only: true,
        ..Enqueue::now(k).writing_view(sess, ops)
    };
    // No session: writes are dropped, nothing is trusted.
    s.add(Q, &[item("s1", snapshot("u1", "5", &[("p1", "a")]))]).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
    // Begun but not committed: writes land, nothing is trusted yet.
    assert!(s.view_session("s1", SessionPhase::Begin).await.unwrap());
    s.add(Q, &[item("s1", snapshot("u1", "5", &[("p1", "a"), ("p2", "b")]))]).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
    assert!(!s.view_session("s0", SessionPhase::Commit).await.unwrap(), "not the current one");
    assert!(s.view_session("s1", SessionPhase::Commit).await.unwrap());
    let v = s.get_job_view(k, &[]).await.unwrap().expect("trusted after commit");
    assert_eq!(v.job, b"job");
    assert_eq!(sorted_pods(&v), ["a", "b"]);
    // Incremental writes in the enqueue script, observations beside them.
    let enq = Enqueue::now(k)
        .writing_view("s1", vec![pod_op("p1", "a2"), ViewOp::DeletePod { name: "p2".into() }]);
    s.add(Q, &[enq]).await.unwrap();
    assert_eq!(sorted_pods(&s.get_job_view(k, &[]).await.unwrap().unwrap()), ["a2"]);
    assert_eq!(s.stats(Q).await.unwrap().ready, 1, "the item was enqueued too");
    // Older resourceVersions never replace newer ones; a worker's write-back moves it forward.
    s.add(Q, &[item("s1", vec![job_op("u1", "4", "old")])]).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap().unwrap().job, b"job");
    assert!(s.put_job_view(k, "u1", b"mine", "9", 0).await.unwrap());
    assert!(!s.put_job_view(k, "u1", b"older", "7", 0).await.unwrap());
    assert!(!s.put_job_view(k, "other-uid", b"x", "99", 0).await.unwrap());
    s.add(Q, &[item("s1", vec![job_op("u1", "8", "watch")])]).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap().unwrap().job, b"mine");
    // Orphan notices: seen by the watcher, acknowledged by a worker.
    s.add(Q, &[item("s1", vec![ViewOp::Orphans, ViewOp::Orphans])]).await.unwrap();
    let v = s.get_job_view(k, &[]).await.unwrap().unwrap();
    assert_eq!((v.orphans_seen, v.orphans_handled), (2, 0));
    s.put_job_view(k, "u1", b"", "", 2).await.unwrap();
    let v = s.get_job_view(k, &[]).await.unwrap().unwrap();
    assert_eq!((v.orphans_seen, v.orphans_handled), (2, 2));
    // A new leader begins: the old view is distrusted at once; the deposed session's writes
    // are dropped; the new snapshot is trusted once committed.
    assert!(s.view_session("s2", SessionPhase::Begin).await.unwrap());
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
    s.add(Q, &[item("s1", vec![pod_op("p9", "stale")])]).await.unwrap();
    s.add(Q, &[item("s2", snapshot("u1", "10", &[("p3", "c")]))]).await.unwrap();
    assert!(s.view_session("s2", SessionPhase::Commit).await.unwrap());
    let v = s.get_job_view(k, &[]).await.unwrap().unwrap();
    assert_eq!(sorted_pods(&v), ["c"], "a snapshot replaces every pod; s1's late write dropped");
    // A recreated Job (another UID) is untrusted until its own snapshot.
    s.add(Q, &[item("s2", vec![job_op("u2", "11", "new")])]).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
    s.add(Q, &[item("s2", snapshot("u2", "11", &[]))]).await.unwrap();
    let v = s.get_job_view(k, &[]).await.unwrap().unwrap();
    assert!(v.pods.is_empty());
    // Deleted: gone. Deleting the expectations removes the view too.
    s.add(Q, &[item("s2", vec![ViewOp::DeleteJob])]).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
    s.add(Q, &[item("s2", snapshot("u3", "12", &[("p", "d")]))]).await.unwrap();
    assert!(s.get_job_view(k, &[]).await.unwrap().is_some());
    s.delete_expectations(k).await.unwrap();
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
    // Ending the session distrusts everything; ending another session changes nothing.
    s.add(Q, &[item("s2", snapshot("u3", "12", &[]))]).await.unwrap();
    assert!(!s.view_session("s1", SessionPhase::End).await.unwrap());
    assert!(s.get_job_view(k, &[]).await.unwrap().is_some());
    assert!(s.view_session("s2", SessionPhase::End).await.unwrap());
    assert_eq!(s.get_job_view(k, &[]).await.unwrap(), None);
}

/// A pod write and the observation it explains land in one script, pod first: whoever sees the
/// lowered expectations sees the pod.
async fn view_write_and_observation_in_one_script(s: Store) {
    let k = "ns/j";
    s.view_session("s", SessionPhase::Begin).await.unwrap();
    s.add(
        Q,
        &[Enqueue {
            observe_only: true,
            ..Enqueue::now(k).writing_view("s", snapshot("u", "1", &[]))
        }],
    )
    .await
    .unwrap();
    s.view_session("s", SessionPhase::Commit).await.unwrap();
    s.set_expectations(k, "u", 1, 0).await.unwrap();
    assert!(!s.get_expectations(k, "u").await.unwrap().satisfied);
    let v = s.get_job_view(k, &[]).await.unwrap().unwrap();
    assert!(!v.expectations.satisfied, "the view brings its Job's expectations");
    assert_eq!((v.uid.as_str(), v.expectations.record.as_ref().map(|r| r.add)), ("u", Some(1)));
    let obs = Observation::new(ObservationKind::Creation, "u", "pu");
    let r = s
        .add(Q, &[Enqueue::now(k).observing(vec![obs]).writing_view("s", vec![pod_op("p", "x")])])
        .await
        .unwrap();
    assert_eq!(r.observed, 1);
    assert!(s.get_expectations(k, "u").await.unwrap().satisfied);
    let v = s.get_job_view(k, &[]).await.unwrap().unwrap();
    assert_eq!(sorted_pods(&v), ["x"]);
    assert!(v.expectations.satisfied, "read in the same script as the pod");
    // Per-Job records come with the view (expired ones do not).
    s.put_record(k, "backoff", b"b1", None).await.unwrap();
    s.put_record(k, "gone", b"g", Some(Duration::from_millis(1))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let names = ["backoff", "gone", "absent"].map(String::from);
    let v = s.get_job_view(k, &names).await.unwrap().unwrap();
    assert_eq!(v.records, [("backoff".to_string(), b"b1".to_vec())]);
    // Other queues never carry view writes (their script cannot name the job queue's keys).
    let other = Enqueue::now("ns/p").writing_view("s", vec![pod_op("q", "y")]);
    s.add("orphan-pod", &[other]).await.unwrap();
    assert_eq!(sorted_pods(&s.get_job_view(k, &[]).await.unwrap().unwrap()), ["x"]);
}

// ---- the shared event correlator (client-go's aggregator and spam filter)

/// A second handle on the same Redis, as another kjob-queue replica (serving another
/// worker) has: its own connection, no shared memory.
async fn second_store(s: &Store) -> Store {
    Store::connect_to(s.target().clone(), s.config().clone()).await.unwrap()
}

/// An event of Job `ns/<job>` with reason `reason` and `message`, keyed as the worker keys it.
fn job_event(job: &str, reason: &str, message: &str) -> GateEvent {
    let spam = format!("job-controllerJobns{job}uid-{job}batch/v1");
    GateEvent {
        object_key: format!("ns/{job}"),
        aggregate_key: format!("{spam}Normal{reason}kjob"),
        event_key: format!("{spam}Normal{reason}{message}"),
        spam_key: spam,
        message: message.into(),
    }
}

/// Gates `events`, returning which were let through.
async fn allowed(s: &Store, config: &EventGateConfig, events: &[GateEvent]) -> Vec<bool> {
    s.gate_events(events, config).await.unwrap().iter().map(|g| !g.dropped).collect()
}

async fn event_spam_filter_burst_then_refill(s: Store) {
    let config =
        EventGateConfig { refill_interval: Duration::from_millis(500), ..Default::default() };
    let same = job_event("a", "FailedCreate", "quota");
    // 30 at once (one script call): the burst of 25 passes, the rest are dropped.
    let got = allowed(&s, &config, &vec![same.clone(); 30]).await;
    assert_eq!(got, [vec![true; 25], vec![false; 5]].concat());
    // Another Job has its own bucket, in the same batch or not.
    let b = job_event("b", "FailedCreate", "quota");
    assert_eq!(allowed(&s, &config, &[same.clone(), b.clone()]).await, [false, true]);
    // One token per refill interval.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(allowed(&s, &config, &[same.clone(), same.clone()]).await, [true, false]);
    // A long quiet spell (30 refill intervals) refills up to the burst, never beyond.
    let fast = EventGateConfig { refill_interval: Duration::from_millis(20), ..config };
    tokio::time::sleep(Duration::from_millis(20 * 30)).await;
    let got = allowed(&s, &fast, &vec![same.clone(); 26]).await;
    assert_eq!(got, [vec![true; 25], vec![false]].concat());
    // The state is one hash per Job, expiring once it no longer matters (a full refill).
    // (The secured server's user may not read TTLs: that is checked on the plain one.)
    if !s.target().is_cluster() && !s.target().is_tls() {
        let mut conn = redis::Client::open(s.target().url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let key = format!("{}:ev:ns/a", s.layout().job_tag("ns/a"));
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.unwrap();
        let want = i64::try_from(fast.state_ttl().as_millis()).unwrap();
        assert!(ttl > want - 2_000 && ttl <= want, "{ttl} vs {want}");
    }
}

async fn event_aggregation_after_ten_similar_messages(s: Store) {
    let config = EventGateConfig::default();
    let batch: Vec<GateEvent> = (0..12)
        .map(|i| job_event("a", "SuccessfulCreate", &format!("Created pod: a-{i}")))
        .collect();
    let gated = s.gate_events(&batch, &config).await.unwrap();
    for (i, g) in gated.iter().enumerate().take(9) {
        assert!(!g.aggregated && !g.dropped, "event {i} stands alone: {g:?}");
        assert_eq!(g.key, batch[i].event_key);
        assert_eq!(g.message, format!("Created pod: a-{i}"));
    }
    for (i, g) in gated.iter().enumerate().skip(9) {
        assert!(g.aggregated, "event {i} is combined: {g:?}");
        assert_eq!(g.key, batch[i].aggregate_key, "counted under the aggregate key");
        assert_eq!(g.message, format!("(combined from similar events): Created pod: a-{i}"));
    }
    // Another reason, or another Job, has its own record.
    let del = job_event("a", "SuccessfulDelete", "Deleted pod: a-0");
    let other = job_event("b", "SuccessfulCreate", "Created pod: b-0");
    let g = s.gate_events(&[del, other], &config).await.unwrap();
    assert!(!g[0].aggregated && !g[1].aggregated, "{g:?}");
    // The record starts over after the aggregation interval without a similar event.
    let short = EventGateConfig { aggregate_interval: Duration::from_millis(200), ..config };
    let more: Vec<GateEvent> = (0..10)
        .map(|i| job_event("c", "SuccessfulCreate", &format!("Created pod: c-{i}")))
        .collect();
    let g = s.gate_events(&more, &short).await.unwrap();
    assert!(g[9].aggregated && !g[8].aggregated, "{g:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let g = s.gate_events(&more[..1], &short).await.unwrap();
    assert!(!g[0].aggregated, "a fresh record after the interval: {g:?}");
}

async fn event_state_is_shared_by_every_store_handle(s: Store) {
    let other = second_store(&s).await;
    let config = EventGateConfig::default();
    let ev = job_event("a", "FailedCreate", "quota");
    // Two "workers" alternate through two handles: one bucket of 25 between them.
    let mut passed = 0;
    for i in 0..20 {
        let store = if i % 2 == 0 { &s } else { &other };
        passed +=
            allowed(store, &config, &[ev.clone(), ev.clone()]).await.iter().filter(|a| **a).count();
    }
    assert_eq!(passed, 25, "one bucket per Job, not one per handle");
    // And one aggregation record: nine messages through one handle, the tenth through the other.
    let msgs: Vec<GateEvent> = (0..10)
        .map(|i| job_event("b", "SuccessfulCreate", &format!("Created pod: b-{i}")))
        .collect();
    let g = s.gate_events(&msgs[..9], &config).await.unwrap();
    assert!(g.iter().all(|g| !g.aggregated));
    let g = other.gate_events(&msgs[9..], &config).await.unwrap();
    assert_eq!(g[0].message, "(combined from similar events): Created pod: b-9");
    // Concurrent callers: 40 single-event calls at once, still 25 through.
    let ev = job_event("c", "FailedCreate", "quota");
    let calls = (0..40).map(|i| {
        let store = if i % 2 == 0 { s.clone() } else { other.clone() };
        let ev = ev.clone();
        async move { allowed(&store, &config, &[ev]).await[0] }
    });
    let got = futures::future::join_all(calls).await;
    assert_eq!(got.iter().filter(|a| **a).count(), 25);
}

fn short_expectations() -> StoreConfig {
    StoreConfig { expectations_timeout: Duration::from_millis(400), ..StoreConfig::default() }
}

macro_rules! suite {
    ($backend:ident: $($name:ident $(($config:expr))?),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    #[allow(unused_mut, unused_assignments)]
                    let mut config = kjob_workqueue::StoreConfig::default();
                    $( config = $config; )?
                    let (_servers, store) = super::$backend(config).await;
                    super::$name(store).await;
                }
            )*
        }
    };
}

macro_rules! every_backend {
    ($($t:tt)*) => {
        suite!(single: $($t)*);
        suite!(cluster: $($t)*);
        suite!(secured: $($t)*);
    };
}

every_backend!(
    memory_of_every_node,
    dedupe,
    earliest_ready_time_wins,
    dirty_while_processing,
    dirty_requeue_takes_earliest_time,
    no_key_leased_twice,
    lease_expiry_returns_key_and_fences_stale_holder,
    sweep_reaps_without_lessees,
    rate_limiter_sequence_and_forget,
    requeue_after,
    expectations_semantics,
    expectations_raised_after_the_creates,
    expectations_timeout(super::short_expectations()),
    finalizer_uid_sets_and_records,
    finalizer_removals_expected_with_the_done,
    stats_and_inspect,
    waiting_lease_wakes_on_add,
    wake_connection_kept_between_waits,
    observations_applied_in_the_enqueue_script,
    poison_item_goes_through_the_rate_limiter(super::poison_config()),
    lease_promotes_due_items_and_counts_them,
    done_many_in_one_call,
    large_add_batch,
    job_view_sessions_and_trust,
    view_write_and_observation_in_one_script,
    event_spam_filter_burst_then_refill,
    event_aggregation_after_ten_similar_messages,
    event_state_is_shared_by_every_store_handle,
    handoff_leases_each_item_exactly_once,
    handoff_leaves_the_rest_to_other_replicas,
    handoff_skips_a_lessee_that_went_away,
    handoff_brings_the_view_read_in_the_add_script,
    a_large_view_is_left_to_get_view,
    a_large_view_reads_in_pages,
    view_delta_equals_a_full_read,
);

/// A Redis that restarted may have lost the last view writes: nothing written before is
/// trusted, and the writer's next view write learns its session is gone.
#[tokio::test]
async fn a_restarted_redis_distrusts_every_view() {
    let mut server = RedisServer::start_with(true, &[]).unwrap();
    let s = Store::connect(&server.url(), StoreConfig::default()).await.unwrap();
    let k = "ns/j";
    s.view_session("s", SessionPhase::Begin).await.unwrap();
    let snap = Enqueue {
        observe_only: true,
        ..Enqueue::now(k).writing_view("s", snapshot("u", "1", &[]))
    };
    assert!(!s.add(Q, std::slice::from_ref(&snap)).await.unwrap().view_lost);
    s.view_session("s", SessionPhase::Commit).await.unwrap();
    assert!(s.get_job_view(k, &[]).await.unwrap().is_some());
    server.kill();
    server.restart().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let view = loop {
        match s.get_job_view(k, &[]).await {
            Ok(v) => break v,
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(view, None, "written before the restart: not trusted");
    let write = Enqueue::now(k).writing_view("s", vec![pod_op("p", "x")]);
    assert!(s.add(Q, &[write]).await.unwrap().view_lost, "the writer learns it");
    // A new session makes views trusted again.
    s.view_session("s2", SessionPhase::Begin).await.unwrap();
    let snap = Enqueue {
        observe_only: true,
        ..Enqueue::now(k).writing_view("s2", snapshot("u", "2", &[]))
    };
    assert!(!s.add(Q, &[snap]).await.unwrap().view_lost);
    s.view_session("s2", SessionPhase::Commit).await.unwrap();
    assert!(s.get_job_view(k, &[]).await.unwrap().is_some());
}

#[tokio::test]
async fn refuses_redis_that_may_evict() {
    let server = RedisServer::start_with(false, &["--maxmemory-policy", "allkeys-lru"]).unwrap();
    let err = Store::connect(&server.url(), StoreConfig::default()).await.unwrap_err();
    assert!(err.to_string().contains("noeviction"), "{err}");
}

#[tokio::test]
async fn redis_down_is_unavailable_and_recovers() {
    let mut server = RedisServer::start().unwrap();
    let s = Store::connect(&server.url(), StoreConfig::default()).await.unwrap();
    s.add(Q, &[now("ns/a")]).await.unwrap();
    server.kill();
    let err = s.add(Q, &[now("ns/b")]).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    server.restart().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match s.add(Q, &[now("ns/c")]).await {
            Ok(r) => {
                assert_eq!(r.added, 1);
                break;
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                assert!(tokio::time::Instant::now() < deadline, "no recovery: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Runs `waker`'s blocking loops until the returned sender is dropped or fired.
fn run_waker(
    waker: &Waker,
    s: &Store,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (w, s) = (waker.clone(), s.clone());
    let task = tokio::spawn(async move {
        w.run(s, async move {
            let _ = rx.await;
        })
        .await
    });
    (tx, task)
}

/// Waits until `waker` has `n` lessees waiting on the queue (their first LEASE found nothing).
async fn until_waiting(waker: &Waker, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while waker.waiting(Q) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} lessees waiting",
            waker.waiting(Q)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A committed view session "s" holding Job `k` (UID "u") with `pods`, expectations of
/// `adds` creations, and a stored "backoff" record `b1`.
async fn committed_view(s: &Store, k: &str, pods: &[(&str, &str)], adds: i64) {
    s.view_session("s", SessionPhase::Begin).await.unwrap();
    let snap = Enqueue {
        observe_only: true,
        ..Enqueue::now(k).writing_view("s", snapshot("u", "1", pods))
    };
    s.add(Q, &[snap]).await.unwrap();
    s.view_session("s", SessionPhase::Commit).await.unwrap();
    s.set_expectations(k, "u", adds, 0).await.unwrap();
    s.put_record(k, "backoff", b"b1", None).await.unwrap();
}

/// A lessee `worker` waiting on `waker` for up to 5 items, asking for views with the records
/// `views` (or none).
fn spawn_lessee(
    waker: &Waker,
    s: &Store,
    worker: &'static str,
    views: Option<Vec<String>>,
) -> tokio::task::JoinHandle<Result<LeaseBatch, WqError>> {
    let (w, s) = (waker.clone(), s.clone());
    tokio::spawn(async move {
        let ask = LeaseAsk {
            worker,
            n: 5,
            lease: LEASE,
            wait: Duration::from_secs(10),
            view_records: views.as_deref(),
        };
        w.lease_for(&s, Q, ask).await
    })
}

/// An Add served by the replica whose lessees wait hands the new items to them in its own
/// script: every item is leased exactly once, to one of them, with a live lease record.
async fn handoff_leases_each_item_exactly_once(s: Store) {
    let waker = Waker::new(&s, [Q]);
    let (stop, runner) = run_waker(&waker, &s);
    let total = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let waiters: Vec<_> = (0..4)
        .map(|w| {
            let (waker, s, total) = (waker.clone(), s.clone(), total.clone());
            tokio::spawn(async move {
                let worker = format!("w{w}");
                let mut got = Vec::new();
                while total.load(std::sync::atomic::Ordering::SeqCst) < 100 {
                    let wait = Duration::from_millis(500);
                    let items = waker.lease(&s, Q, &worker, 3, LEASE, wait).await.unwrap().items;
                    total.fetch_add(items.len(), std::sync::atomic::Ordering::SeqCst);
                    got.extend(items);
                }
                (worker, got)
            })
        })
        .collect();
    until_waiting(&waker, 4).await;
    let keys: Vec<String> = (0..100).map(|i| format!("ns/h{i:03}")).collect();
    let adds: Vec<_> = keys
        .chunks(5)
        .map(|c| {
            let (waker, s) = (waker.clone(), s.clone());
            let batch: Vec<Enqueue> = c.iter().map(|k| now(k)).collect();
            tokio::spawn(async move { waker.add(&s, Q, batch).await.unwrap() })
        })
        .collect();
    let mut accepted = 0;
    for a in adds {
        accepted += a.await.unwrap().accepted_now;
    }
    assert_eq!(accepted, 100);
    let mut seen = HashSet::new();
    for w in waiters {
        let (worker, got) = w.await.unwrap();
        for it in got {
            assert!(seen.insert(it.key.clone()), "{} leased twice", it.key);
            let v = &s.inspect(Q, std::slice::from_ref(&it.key)).await.unwrap()[0];
            assert_eq!((v.state, v.holder.as_str()), (KeyState::Leased, worker.as_str()));
            let d = s.done(Q, &it.key, &it.lease_id, LeaseOutcome::Forget).await.unwrap();
            assert!(d.is_some(), "the handed lease id is the one Redis holds");
        }
    }
    assert_eq!(seen.len(), 100, "every item leased once");
    let st = s.stats(Q).await.unwrap();
    assert_eq!((st.ready, st.leased), (0, 0));
    let _ = stop.send(());
    runner.await.unwrap();
}

/// A lessee waiting on another replica still gets what this replica's Add leaves: the items
/// beyond what the local waiters take, and everything when no local lessee waits.
async fn handoff_leaves_the_rest_to_other_replicas(s: Store) {
    let here = Waker::new(&s, [Q]);
    let other_store = Store::connect_to(s.target().clone(), StoreConfig::default()).await.unwrap();
    let there = Waker::new(&other_store, [Q]);
    let (stop_here, run_here) = run_waker(&here, &s);
    let (stop_there, run_there) = run_waker(&there, &other_store);
    let remote = {
        let (w, s) = (there.clone(), other_store.clone());
        tokio::spawn(
            async move { w.lease(&s, Q, "remote", 5, LEASE, Duration::from_secs(10)).await },
        )
    };
    until_waiting(&there, 1).await;
    // No local lessee waits: the whole Add is announced through the wake marker.
    let t0 = tokio::time::Instant::now();
    here.add(&s, Q, vec![now("ns/r1")]).await.unwrap();
    let got = remote.await.unwrap().unwrap().items;
    assert_eq!(got.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["ns/r1"]);
    assert!(t0.elapsed() < Duration::from_millis(800), "woke after {:?}", t0.elapsed());
    // One local lessee takes one item; the remote one gets the other.
    let local = {
        let (w, s) = (here.clone(), s.clone());
        tokio::spawn(
            async move { w.lease(&s, Q, "local", 1, LEASE, Duration::from_secs(10)).await },
        )
    };
    let remote = {
        let (w, s) = (there.clone(), other_store.clone());
        tokio::spawn(
            async move { w.lease(&s, Q, "remote", 5, LEASE, Duration::from_secs(10)).await },
        )
    };
    until_waiting(&here, 1).await;
    until_waiting(&there, 1).await;
    here.add(&s, Q, vec![now("ns/r2"), now("ns/r3")]).await.unwrap();
    assert_eq!(here.waiting(Q), 0, "the Add took the local lessee's offer");
    let l = local.await.unwrap().unwrap().items;
    let r = remote.await.unwrap().unwrap().items;
    assert_eq!(l.len(), 1, "the local lessee takes its one item");
    assert_eq!(r.len(), 1, "the remote lessee gets the rest: {r:?}");
    assert_ne!(l[0].key, r[0].key);
    let _ = stop_here.send(());
    let _ = stop_there.send(());
    run_here.await.unwrap();
    run_there.await.unwrap();
}

/// A lessee that went away while waiting loses nothing: its stale offer is skipped, and the
/// item stays ready for the next lessee.
async fn handoff_skips_a_lessee_that_went_away(s: Store) {
    let waker = Waker::new(&s, [Q]);
    let gone = {
        let (w, s) = (waker.clone(), s.clone());
        tokio::spawn(async move { w.lease(&s, Q, "gone", 1, LEASE, Duration::from_secs(10)).await })
    };
    until_waiting(&waker, 1).await;
    gone.abort();
    let _ = gone.await;
    waker.add(&s, Q, vec![now("ns/g")]).await.unwrap();
    let v = &s.inspect(Q, &["ns/g".to_string()]).await.unwrap()[0];
    assert_eq!(v.state, KeyState::Ready, "not leased to a lessee that left");
    let got = waker.lease(&s, Q, "next", 1, LEASE, Duration::from_secs(1)).await.unwrap().items;
    assert_eq!(got.len(), 1);
}

/// A lessee that asks for views gets, with each item an Add hands it, the Job's view read in
/// the Add's own script (after its view writes): what GET_VIEW would return, with the records
/// asked. Items the Add wrote no view for, and lessees that asked for none, get no view; an
/// untrusted view comes back as such.
async fn handoff_brings_the_view_read_in_the_add_script(s: Store) {
    let (k, names) = ("ns/v", vec!["backoff".to_string(), "absent".to_string()]);
    committed_view(&s, k, &[("p1", "a")], 1).await;
    let waker = Waker::new(&s, [Q]);
    let (stop, runner) = run_waker(&waker, &s);
    let lessee = |worker, views| spawn_lessee(&waker, &s, worker, views);
    // The pod the Add writes and the creation it observes are in the view handed over.
    let waiting = lessee("w", Some(names.clone()));
    until_waiting(&waker, 1).await;
    let obs = Observation::new(ObservationKind::Creation, "u", "pu");
    let write = Enqueue::now(k).observing(vec![obs]).writing_view("s", vec![pod_op("p2", "b")]);
    // An Add hands over the items of one shard (its script's): a plain item of k's shard.
    let shard = s.layout().shard_of(k);
    let plain =
        (0..).map(|i| format!("ns/plain{i}")).find(|p| s.layout().shard_of(p) == shard).unwrap();
    waker.add(&s, Q, vec![write, now(&plain)]).await.unwrap();
    let items = waiting.await.unwrap().unwrap().items;
    let by_key = |key: &str| items.iter().find(|i| i.key == key).unwrap().clone();
    assert_eq!(by_key(&plain).view, None, "no view written by this Add: not read");
    let v = by_key(k).view.expect("read with the hand-off").expect("trusted");
    assert_eq!(sorted_pods(&v), ["a", "b"]);
    assert_eq!((v.job.as_slice(), v.uid.as_str()), (b"job".as_slice(), "u"));
    assert_eq!(v.records, [("backoff".to_string(), b"b1".to_vec())]);
    assert!(v.expectations.satisfied, "the creation observed in the same script");
    let read = s.get_job_view(k, &names).await.unwrap().unwrap();
    assert_eq!((read.pods.len(), &read.records), (v.pods.len(), &v.records));
    assert_eq!(read.expectations.record, v.expectations.record);
    // A lessee that asked for no views gets none.
    let plain = lessee("p", None);
    until_waiting(&waker, 1).await;
    waker
        .add(&s, Q, vec![Enqueue::now("ns/v2").writing_view("s", vec![pod_op("q", "c")])])
        .await
        .unwrap();
    let items = plain.await.unwrap().unwrap().items;
    assert_eq!((items.len(), items[0].view.clone()), (1, None));
    // A session begun and not committed: the view is handed over as untrusted.
    s.view_session("s2", SessionPhase::Begin).await.unwrap();
    let waiting = lessee("w", Some(names.clone()));
    until_waiting(&waker, 1).await;
    s.done(Q, k, &by_key(k).lease_id, LeaseOutcome::Forget).await.unwrap();
    waker
        .add(&s, Q, vec![Enqueue::now(k).writing_view("s2", vec![pod_op("p3", "d")])])
        .await
        .unwrap();
    let items = waiting.await.unwrap().unwrap().items;
    assert_eq!((items.len(), items[0].view.clone()), (1, Some(None)));
    let _ = stop.send(());
    runner.await.unwrap();
}

/// A hand-off whose view holds more than `HANDOFF_VIEW_MAX_PODS` pods comes without it (the
/// ADD script does not copy thousands of pods through Lua); GET_VIEW then reads the whole view,
/// its pods with an HVALS in the script's transaction: trusted with every pod, the
/// expectations and the records, or untrusted. GET_VIEW's first run here finds its script not
/// yet loaded (only ADD has run), so the transaction is sent again after loading it.
async fn a_large_view_is_left_to_get_view(s: Store) {
    let (k, names) = ("ns/big", vec!["backoff".to_string()]);
    let body = |i: usize| format!("{i:05}{}", "x".repeat(4096));
    let pods: Vec<(String, String)> =
        (0..=HANDOFF_VIEW_MAX_PODS).map(|i| (format!("p{i:05}"), body(i))).collect();
    let refs: Vec<(&str, &str)> = pods.iter().map(|(n, b)| (n.as_str(), b.as_str())).collect();
    committed_view(&s, k, &refs, 2).await;
    let waker = Waker::new(&s, [Q]);
    let (stop, runner) = run_waker(&waker, &s);
    let waiting = spawn_lessee(&waker, &s, "w", Some(names.clone()));
    until_waiting(&waker, 1).await;
    let obs = Observation::new(ObservationKind::Creation, "u", "pu");
    let last = body(HANDOFF_VIEW_MAX_PODS + 1);
    let write = Enqueue::now(k).observing(vec![obs]).writing_view("s", vec![pod_op("pz", &last)]);
    waker.add(&s, Q, vec![write]).await.unwrap();
    let items = waiting.await.unwrap().unwrap().items;
    assert_eq!((items.len(), items[0].view.clone()), (1, None), "handed over without its view");
    let v = s.get_job_view(k, &names).await.unwrap().expect("trusted");
    let mut want: Vec<String> = pods.iter().map(|(_, b)| b.clone()).collect();
    want.push(last);
    assert_eq!(sorted_pods(&v), want, "every pod, the Add's too");
    assert_eq!((v.job.as_slice(), v.uid.as_str()), (b"job".as_slice(), "u"));
    assert_eq!(v.records, [("backoff".to_string(), b"b1".to_vec())]);
    assert_eq!(v.expectations.record.as_ref().map(|r| r.add), Some(1), "one creation observed");
    // A new session distrusts the view: no pods come back with it.
    s.view_session("s2", SessionPhase::Begin).await.unwrap();
    assert_eq!(s.get_job_view(k, &names).await.unwrap(), None);
    let _ = stop.send(());
    runner.await.unwrap();
}

/// Pods of the paged-view tests: 40,000 of 2,200 bytes (a trimmed, sealed pod of today), about
/// 88 MB, five times the 16 MiB reply cap.
const PAGED_PODS: usize = 40_000;
/// Bytes of each of those pods.
const PAGED_POD_BYTES: usize = 2_200;

/// Pod `i` of a paged view: its name, and a body of [`PAGED_POD_BYTES`] that begins with it.
fn paged_pod(i: usize) -> ViewOp {
    let name = format!("p{i:06}");
    let mut object = name.clone().into_bytes();
    object.resize(PAGED_POD_BYTES, b'x');
    ViewOp::Pod { name, object }
}

/// Writes a committed view of `n` pods as the watcher's snapshot does: Reset, the pods in Add
/// items of 200 (its snapshot item), the Job and Trust.
async fn big_view(s: &Store, k: &str, n: usize) {
    let item =
        |ops: Vec<ViewOp>| Enqueue { observe_only: true, ..Enqueue::now(k).writing_view("s", ops) };
    assert!(s.view_session("s", SessionPhase::Begin).await.unwrap());
    s.add(Q, &[item(vec![ViewOp::Reset { uid: "u".into() }])]).await.unwrap();
    let items: Vec<Enqueue> = (0..n)
        .collect::<Vec<_>>()
        .chunks(200)
        .map(|c| item(c.iter().map(|&i| paged_pod(i)).collect()))
        .collect();
    // About 6.6 MB an Add, under kjob-queue's 8 MiB request cap, as the watcher sends them.
    for batch in items.chunks(15) {
        s.add(Q, batch).await.unwrap();
    }
    s.add(Q, &[item(vec![job_op("u", "1", "job"), ViewOp::Trust])]).await.unwrap();
    assert!(s.view_session("s", SessionPhase::Commit).await.unwrap());
}

/// Reads every page of `k`'s view with `budget`; panics unless each is of one version.
async fn every_page(s: &Store, k: &str, budget: usize) -> Vec<kjob_workqueue::ViewPods> {
    let mut pages: Vec<kjob_workqueue::ViewPods> = Vec::new();
    let mut from = None;
    loop {
        let page = match s.get_job_view_page(k, &[], from, budget).await.unwrap() {
            ViewPage::Pods(p) => p,
            other => panic!("page {} of {k}: {other:?}", pages.len()),
        };
        assert_eq!(page.head.is_some(), pages.is_empty(), "the object comes with page one only");
        if let Some(first) = pages.first() {
            assert_eq!(page.version, first.version, "one version for every page");
        }
        from = page.next;
        pages.push(page);
        if from.is_none() {
            return pages;
        }
    }
}

/// A view five times the reply cap comes back in pages of at most the page budget (or one
/// pod), all of one version, every pod exactly once; a page budget that ends pages inside an
/// HSCAN chunk still returns each pod once; a pod written between two pages, or a new watcher
/// session, makes the next page say so instead of mixing two versions of the view.
async fn a_large_view_reads_in_pages(s: Store) {
    let k = "ns/huge";
    big_view(&s, k, PAGED_PODS).await;
    let budget = kjob_core::VIEW_PAGE_BYTES;
    let pages = every_page(&s, k, budget).await;
    let largest = pages.iter().map(|p| p.pods.iter().map(Vec::len).sum::<usize>()).max();
    assert!(largest.unwrap() <= budget, "a page of {largest:?} bytes");
    assert!(pages.len() >= PAGED_PODS * PAGED_POD_BYTES / budget, "{} pages", pages.len());
    let names: Vec<&[u8]> = pages.iter().flat_map(|p| &p.pods).map(|b| &b[..7]).collect();
    let distinct: HashSet<&[u8]> = names.iter().copied().collect();
    assert_eq!((names.len(), distinct.len()), (PAGED_PODS, PAGED_PODS), "each pod once");
    assert!(pages.iter().all(|p| p.pod_count == PAGED_PODS as u64));
    let head = pages[0].head.as_ref().unwrap();
    assert_eq!((head.job.as_slice(), head.uid.as_str()), (&b"job"[..], "u"));

    // Pages that end inside a chunk (ten pods a page, 256 a chunk) resume where they ended.
    let small = "ns/small";
    big_view(&s, small, 600).await;
    let pages = every_page(&s, small, 10 * PAGED_POD_BYTES).await;
    assert_eq!(pages.len(), 60);
    let names: HashSet<Vec<u8>> =
        pages.iter().flat_map(|p| &p.pods).map(|b| b[..7].to_vec()).collect();
    assert_eq!(names.len(), 600, "each pod once");

    // One pod written between two pages: the next page is Moved, never a mix.
    let first = |s: Store| async move {
        match s.get_job_view_page(k, &[], None, budget).await.unwrap() {
            ViewPage::Pods(p) => p.next.expect("more pages"),
            other => panic!("{other:?}"),
        }
    };
    let next = first(s.clone()).await;
    let write = Enqueue::now(k).writing_view("s", vec![pod_op("p000001", "changed")]);
    s.add(Q, &[write]).await.unwrap();
    assert_eq!(s.get_job_view_page(k, &[], Some(next), budget).await.unwrap(), ViewPage::Moved);
    // The version moves with a deletion too; a read begun after it is whole again.
    let next = first(s.clone()).await;
    let delete = vec![ViewOp::DeletePod { name: "p000002".into() }];
    s.add(Q, &[Enqueue::now(k).writing_view("s", delete)]).await.unwrap();
    assert_eq!(s.get_job_view_page(k, &[], Some(next), budget).await.unwrap(), ViewPage::Moved);
    let pages = every_page(&s, k, budget).await;
    assert_eq!(pages.iter().map(|p| p.pods.len()).sum::<usize>(), PAGED_PODS - 1);
    // A new watcher session distrusts the view between two pages.
    let next = first(s.clone()).await;
    assert!(s.view_session("s2", SessionPhase::Begin).await.unwrap());
    let page = s.get_job_view_page(k, &[], Some(next), budget).await.unwrap();
    assert_eq!(page, ViewPage::Untrusted);
}

/// The whole view of `k` now, read in full: (version, epoch token, pod name → entry).
async fn full_view(s: &Store, k: &str) -> Option<(u64, String, BTreeMap<String, Vec<u8>>)> {
    let mut pods = BTreeMap::new();
    let (mut from, mut head) = (None, None);
    loop {
        let page = match s.get_job_view_page(k, &[], from, usize::MAX).await.unwrap() {
            ViewPage::Pods(p) => p,
            ViewPage::Untrusted => return None,
            ViewPage::Moved => panic!("nothing writes during the read"),
        };
        head.get_or_insert((page.version, page.epoch.clone()));
        assert_eq!(page.names.len(), page.pods.len(), "a name for every pod");
        pods.extend(page.names.into_iter().zip(page.pods));
        from = page.next;
        if from.is_none() {
            let (version, epoch) = head.unwrap();
            return Some((version, epoch, pods));
        }
    }
}

/// A reader's cache of `k`'s view at `base`, brought up to date by a delta read: `None` when
/// the read says to read in full.
async fn by_delta(
    s: &Store,
    k: &str,
    base: &(u64, String, BTreeMap<String, Vec<u8>>),
) -> Option<(u64, String, BTreeMap<String, Vec<u8>>)> {
    let (version, epoch, pods) = base;
    match s.get_job_view_delta(k, &[], *version, epoch, usize::MAX).await.unwrap() {
        ViewDelta::Full => None,
        ViewDelta::Untrusted => panic!("the view is trusted"),
        ViewDelta::Changes(c) => {
            let c = *c;
            let mut pods = pods.clone();
            for name in &c.removed {
                pods.remove(name);
            }
            pods.extend(c.changed);
            assert_eq!(c.pod_count, pods.len() as u64, "the count the view holds");
            Some((c.version, c.epoch, pods))
        }
    }
}

/// Issue 46's change log: for random sequences of view writes (pods written and removed, the
/// Job updated, orphan notices, snapshots, a recreated Job), a cache taken at any earlier
/// version and brought up to date with a delta read equals a full read at every version; a
/// delta is refused (read in full) only for a base before the last snapshot.
async fn view_delta_equals_a_full_read(s: Store) {
    use rand::{Rng, SeedableRng};
    let k = "ns/delta";
    let item =
        |ops: Vec<ViewOp>| Enqueue { observe_only: true, ..Enqueue::now(k).writing_view("s", ops) };
    assert!(s.view_session("s", SessionPhase::Begin).await.unwrap());
    s.add(Q, &[item(snapshot("u1", "1", &[("p0", "a")]))]).await.unwrap();
    assert!(s.view_session("s", SessionPhase::Commit).await.unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(46);
    let mut bases = vec![full_view(&s, k).await.unwrap()];
    // The version of the last snapshot: a base before it must be read in full.
    let mut snapshot_at = bases[0].0;
    let mut deltas = 0;
    for step in 0..120 {
        let mut ops = Vec::new();
        let mut resets = false;
        for _ in 0..rng.random_range(1..6) {
            let name = format!("p{}", rng.random_range(0..12));
            match rng.random_range(0..100) {
                0..45 => ops.push(pod_op(&name, &format!("{name}@{step}.{}", ops.len()))),
                45..80 => ops.push(ViewOp::DeletePod { name }),
                80..90 => ops.push(job_op("u1", &(step + 2).to_string(), "job")),
                90..95 => ops.push(ViewOp::Orphans),
                _ => {
                    resets = true;
                    let pods = [(name.as_str(), "snap")];
                    // Now and then a recreated Job: another UID under the same key.
                    let uid = if rng.random_ratio(1, 3) { "u2" } else { "u1" };
                    ops.extend(snapshot(uid, &(step + 2).to_string(), &pods));
                }
            }
        }
        if ops.iter().any(|o| matches!(o, ViewOp::Reset { uid } if uid == "u2")) {
            // The recreated Job is trusted after its snapshot; later writes are of its UID.
            ops.push(job_op("u1", "999999", "back"));
            ops.extend(snapshot("u1", "999999", &[]));
        }
        s.add(Q, &[item(ops)]).await.unwrap();
        let now = full_view(&s, k).await.expect("trusted");
        if resets {
            snapshot_at = now.0;
        }
        for base in &bases {
            match by_delta(&s, k, base).await {
                Some(d) => {
                    assert!(base.0 >= snapshot_at, "a delta across a snapshot (step {step})");
                    assert_eq!(d, now, "a delta from version {} at step {step}", base.0);
                    deltas += 1;
                }
                None => assert!(
                    base.0 < snapshot_at,
                    "read in full with no snapshot since {} (step {step})",
                    base.0
                ),
            }
        }
        bases.push(now);
        if bases.len() > 8 {
            bases.remove(rng.random_range(0..bases.len() - 1));
        }
    }
    assert!(deltas > 100, "{deltas} deltas");
    // A new session: the view is untrusted until its snapshot, then no older base is carried
    // over (another session, and the snapshot reset the log).
    let last = bases.last().unwrap().clone();
    assert!(s.view_session("s2", SessionPhase::Begin).await.unwrap());
    let d = s.get_job_view_delta(k, &[], last.0, &last.1, usize::MAX).await.unwrap();
    assert_eq!(d, ViewDelta::Untrusted);
    let snap = Enqueue {
        observe_only: true,
        ..Enqueue::now(k).writing_view("s2", snapshot("u1", "5000", &[("p1", "x")]))
    };
    s.add(Q, &[snap]).await.unwrap();
    assert!(s.view_session("s2", SessionPhase::Commit).await.unwrap());
    assert_eq!(by_delta(&s, k, &last).await, None, "another session: read in full");
    let now = full_view(&s, k).await.unwrap();
    assert_ne!(now.1, last.1, "the epoch token names the session");
    // A base with the right version but another session's token is read in full too.
    let forged = (now.0, last.1.clone(), now.2.clone());
    assert_eq!(by_delta(&s, k, &forged).await, None);
    assert_eq!(by_delta(&s, k, &now).await, Some(now.clone()), "nothing changed: empty delta");
    // A changed pod too large for the caller's budget: read in full.
    let big = Enqueue::now(k).writing_view("s2", vec![pod_op("p1", &"y".repeat(4096))]);
    s.add(Q, &[big]).await.unwrap();
    let d = s.get_job_view_delta(k, &[], now.0, &now.1, 1024).await.unwrap();
    assert_eq!(d, ViewDelta::Full, "over the byte budget");
    // The head comes with the delta, records and expectations as a first page has them.
    s.set_expectations(k, "u1", 2, 0).await.unwrap();
    match s.get_job_view_delta(k, &["backoff".into()], now.0, &now.1, usize::MAX).await.unwrap() {
        ViewDelta::Changes(c) => {
            assert_eq!(c.head.uid, "u1");
            assert_eq!(c.head.expectations.record.as_ref().map(|r| r.add), Some(2));
            assert!(c.head.records.is_empty());
            assert_eq!((c.changed.len(), c.removed.len()), (1, 0));
        }
        other => panic!("{other:?}"),
    }
}

/// Raw access to one key of a view on a single server (its name carries the shard's tag).
async fn view_key_named(conn: &mut redis::aio::MultiplexedConnection, suffix: &str) -> String {
    let keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("*:view:{suffix}")).query_async(conn).await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys.into_iter().next().unwrap()
}

/// The change log stays bounded (at most twice the pods, and some slack) under churn, raising
/// its floor as it drops old entries: a reader older than the floor reads in full, one newer
/// gets a delta equal to a full read. A view written by a kjob-queue that does not keep the log
/// (an older one during an upgrade) is read in full until a writer that keeps it starts a new
/// log.
#[tokio::test]
async fn view_change_log_is_bounded_and_survives_an_older_writer() {
    let server = RedisServer::start().unwrap();
    let s = Store::connect(&server.url(), StoreConfig::default()).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let k = "ns/churn";
    let item =
        |ops: Vec<ViewOp>| Enqueue { observe_only: true, ..Enqueue::now(k).writing_view("s", ops) };
    s.view_session("s", SessionPhase::Begin).await.unwrap();
    let live: Vec<(String, String)> = (0..10).map(|i| (format!("live{i}"), "x".into())).collect();
    let pods: Vec<(&str, &str)> = live.iter().map(|(n, b)| (n.as_str(), b.as_str())).collect();
    s.add(Q, &[item(snapshot("u", "1", &pods))]).await.unwrap();
    s.view_session("s", SessionPhase::Commit).await.unwrap();
    let meta = view_key_named(&mut conn, "ns/churn:meta").await;
    // A snapshot starts the log empty: the key appears with the first change after it.
    let chg = format!("{}:chg", meta.strip_suffix(":meta").unwrap());
    let oldest = full_view(&s, k).await.unwrap();
    // Pods created and removed: each leaves a tombstone.
    let mut recent = None;
    for i in 0..200 {
        let name = format!("gone{i}");
        s.add(Q, &[item(vec![pod_op(&name, "y")])]).await.unwrap();
        s.add(Q, &[item(vec![ViewOp::DeletePod { name }])]).await.unwrap();
        let n: u64 = redis::cmd("ZCARD").arg(&chg).query_async(&mut conn).await.unwrap();
        // Twice the pods (11 while `gone{i}` lives) and the slack.
        assert!(n <= 2 * 11 + 64, "{n} entries in the change log of 10 pods");
        if i == 150 {
            recent = full_view(&s, k).await;
        }
    }
    let floor: u64 =
        redis::cmd("HGET").arg(&meta).arg("floor").query_async(&mut conn).await.unwrap();
    assert!(floor > oldest.0, "the floor rose");
    let now = full_view(&s, k).await.unwrap();
    assert_eq!(by_delta(&s, k, &oldest).await, None, "older than the floor: read in full");
    assert_eq!(by_delta(&s, k, &recent.unwrap()).await, Some(now.clone()));
    // Bytes of the log per live pod and tombstone, for the record: small beside an entry.
    let log_bytes: u64 =
        redis::cmd("MEMORY").arg("USAGE").arg(&chg).query_async(&mut conn).await.unwrap();
    assert!(log_bytes < 84 * 100, "{log_bytes} bytes for at most 84 names");

    // An older kjob-queue removes a pod and moves the version (from the shard's sequence)
    // without logging it.
    let pods_key = view_key_named(&mut conn, "ns/churn:pods").await;
    let stats: Vec<String> =
        redis::cmd("KEYS").arg("*wq:job:*:stats").query_async(&mut conn).await.unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    let ver: u64 = redis::cmd("HINCRBY")
        .arg(&stats[0])
        .arg("view_ver")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () =
        redis::cmd("HDEL").arg(&pods_key).arg("live0").query_async(&mut conn).await.unwrap();
    let _: () =
        redis::cmd("HSET").arg(&meta).arg("ver").arg(ver).query_async(&mut conn).await.unwrap();
    assert_eq!(by_delta(&s, k, &now).await, None, "a write the log missed: read in full");
    // The next write that keeps the log starts it afresh; deltas work from there.
    s.add(Q, &[item(vec![pod_op("live1", "z")])]).await.unwrap();
    let fresh = full_view(&s, k).await.unwrap();
    assert!(!fresh.2.contains_key("live0"));
    assert_eq!(by_delta(&s, k, &now).await, None, "still below the new floor");
    s.add(Q, &[item(vec![ViewOp::DeletePod { name: "live2".into() }])]).await.unwrap();
    let after = full_view(&s, k).await.unwrap();
    assert_eq!(by_delta(&s, k, &fresh).await, Some(after));
    // Deleting the view's keys takes the log with them.
    s.delete_expectations(k).await.unwrap();
    let n: u64 = redis::cmd("EXISTS").arg(&chg).query_async(&mut conn).await.unwrap();
    assert_eq!(n, 0, "the change log is deleted with the view");
}
