//! Fair leasing across namespaces (deficit round robin, weight 1 by default), upstream's order
//! (ready time, then key) within a namespace, priority within a namespace with its aging bound,
//! on one shard (a single Redis's default), on 24 shards of one server, and on a 3-master Redis
//! Cluster.

use std::collections::HashMap;
use std::time::Duration;

use kjob_testkit::{RedisServer, TestRedis};
use kjob_workqueue::{Enqueue, Store, StoreConfig};

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(30);

async fn one_shard() -> (TestRedis, Store) {
    let redis = TestRedis::single().expect("redis-server");
    let store = Store::connect(&redis.url(), StoreConfig::default()).await.expect("connect");
    assert_eq!(store.layout().shards(), 1);
    (redis, store)
}

async fn many_shards() -> (TestRedis, Store) {
    let redis = TestRedis::single().expect("redis-server");
    let config = StoreConfig { shards: Some(kjob_workqueue::DEFAULT_SHARDS), ..Default::default() };
    let store = Store::connect(&redis.url(), config).await.expect("connect");
    (redis, store)
}

async fn cluster() -> (TestRedis, Store) {
    let redis = TestRedis::cluster().await.expect("cluster");
    let store = Store::connect(&redis.url(), StoreConfig::default()).await.expect("connect");
    (redis, store)
}

async fn add_all(s: &Store, keys: &[String]) {
    for chunk in keys.chunks(200) {
        let items: Vec<Enqueue> = chunk.iter().map(Enqueue::now).collect();
        s.add(Q, &items).await.unwrap();
    }
}

/// 2,000 keys ready in namespace `a`, then one in `b`: `b`'s is leased within the first 2·S
/// leases of one item (S shards: the lessee visits the shards in turn; in `b`'s shard, `a` at
/// the head of the round robin gives one key, then `b` is next), so second on one shard, not
/// after the 2,000 as in FIFO order; `a`'s keys come out in their order (within each shard; on
/// one shard, in all).
async fn a_quiet_namespace_is_not_stuck_behind_a_flood(s: Store) {
    let flood: Vec<String> = (0..2000).map(|i| format!("a/job-{i:04}")).collect();
    add_all(&s, &flood).await;
    s.add(Q, &[Enqueue::now("b/quiet")]).await.unwrap();
    let mut order = Vec::new();
    loop {
        let got = s.lease(Q, "w", 1, LEASE).await.unwrap().items;
        if got.is_empty() {
            break;
        }
        order.extend(got.into_iter().map(|l| l.key));
    }
    assert_eq!(order.len(), 2001);
    let at = order.iter().position(|k| k == "b/quiet").unwrap();
    let shards = s.layout().shards() as usize;
    assert!(at < 2 * shards, "b leased as #{} of 2001 (bound {})", at + 1, 2 * shards);
    let mut last: HashMap<u32, &str> = HashMap::new();
    for k in order.iter().filter(|k| k.starts_with("a/")) {
        let shard = s.layout().shard_of(k);
        if let Some(prev) = last.insert(shard, k) {
            assert!(prev < k.as_str(), "{prev} leased before {k} in shard {shard}");
        }
    }
    if shards == 1 {
        let a: Vec<&String> = order.iter().filter(|k| k.starts_with("a/")).collect();
        assert!(a.windows(2).all(|w| w[0] < w[1]), "a's order kept");
    }
}

/// Weights: `a` of weight 3 and `b` of weight 1, both with a backlog, share the leases 3:1 (on one
/// shard exactly; over many shards, each fair on its own, about so). The weight is in Redis:
/// another handle (replica) reads it.
async fn weights_are_honoured(s: Store) {
    s.set_namespace_weight("a", 3).await.unwrap();
    let other = Store::connect(s.target().url(), StoreConfig::default()).await.unwrap();
    assert_eq!(other.namespace_weights().await.unwrap().get("a"), Some(&3));
    assert!(s.set_namespace_weight("a,b=9", 2).await.is_err(), "not a namespace");
    assert!(s.set_namespace_weight("a", 0).await.is_err());
    let mut keys: Vec<String> = (0..300).map(|i| format!("a/j{i:03}")).collect();
    keys.extend((0..300).map(|i| format!("b/j{i:03}")));
    add_all(&s, &keys).await;
    let mut count: HashMap<String, u32> = HashMap::new();
    for _ in 0..20 {
        for l in s.lease(Q, "w", 4, LEASE).await.unwrap().items {
            *count.entry(l.key[..1].to_string()).or_default() += 1;
        }
    }
    let (a, b) = (count["a"], count["b"]);
    assert_eq!(a + b, 80);
    if s.layout().shards() == 1 {
        assert_eq!((a, b), (60, 20));
    } else {
        let ratio = f64::from(a) / f64::from(b);
        assert!((2.0..=4.5).contains(&ratio), "a {a} b {b}");
    }
    // Leases smaller than a turn: the head keeps what is left of its turn for the next lease.
    let mut count: HashMap<String, u32> = HashMap::new();
    for _ in 0..20 {
        for l in s.lease(Q, "w", 2, LEASE).await.unwrap().items {
            *count.entry(l.key[..1].to_string()).or_default() += 1;
        }
    }
    let n = |ns: &str| count.get(ns).copied().unwrap_or(0);
    let (a, b) = (n("a"), n("b"));
    assert_eq!(a + b, 40);
    if s.layout().shards() == 1 {
        assert_eq!((a, b), (30, 10));
    }
    // Back to 1: equal shares from now on.
    s.set_namespace_weight("a", 1).await.unwrap();
    assert!(s.namespace_weights().await.unwrap().is_empty());
}

/// `n` keys of namespace `ns` in one shard (order within a namespace holds per shard: a lessee
/// visits the shards in turn), named `<ns>/<prefix>-<i>` for rising i.
fn same_shard(s: &Store, ns: &str, prefix: &str, n: usize) -> Vec<String> {
    let shard = s.layout().shard_of(&format!("{ns}/{prefix}-0"));
    (0..)
        .map(|i| format!("{ns}/{prefix}-{i:05}"))
        .filter(|k| s.layout().shard_of(k) == shard)
        .take(n)
        .collect()
}

/// Leases everything ready, one key at a time, each finished at once (Forget), in lease order.
async fn lease_order(s: &Store) -> Vec<String> {
    let mut order = Vec::new();
    loop {
        let got = s.lease(Q, "w", 1, LEASE).await.unwrap().items;
        let Some(l) = got.into_iter().next() else { return order };
        let forget = kjob_workqueue::LeaseOutcome::Forget;
        s.done(Q, &l.key, &l.lease_id, forget).await.unwrap().unwrap();
        order.push(l.key);
    }
}

/// Within a namespace a higher priority goes first among keys that became ready together, equal
/// priorities keep the key order, and a lease reports the ready time (not the order score).
async fn priority_orders_a_namespace(s: Store) {
    let k = same_shard(&s, "a", "j", 6);
    let items = vec![
        Enqueue::now(&k[0]).with_priority(0),
        Enqueue::now(&k[1]),
        Enqueue::now(&k[2]).with_priority(1000),
        Enqueue::now(&k[3]).with_priority(10),
        Enqueue::now(&k[4]).with_priority(-100),
        Enqueue::now(&k[5]).with_priority(1_000_000),
    ];
    s.add(Q, &items).await.unwrap();
    let added_at = s.explain(Q, &k[5]).await.unwrap().unwrap();
    assert_eq!(added_at.priority, 1_000_000);
    assert_eq!(
        added_at.head_start,
        kjob_workqueue::priority_head_start(1_000_000, s.config().priority_aging)
    );
    let now = added_at.now_ms;
    assert!((now - added_at.ready_ms.unwrap()).abs() < 1000, "explain shows the ready time");
    // So do the longest-waiting keys (the metrics' and inspect's): every key became ready just
    // now, none 39 s ago for its head start.
    let oldest = s.oldest_ready(Q, Some("a"), 6).await.unwrap();
    assert_eq!(oldest.keys.len(), 6, "{oldest:?}");
    for w in &oldest.keys {
        assert!((oldest.now_ms - w.ready_ms).abs() < 1000, "{w:?} at {}", oldest.now_ms);
    }
    // Negative priorities get no head start: they order as 0 (and so by key).
    let want = [&k[5], &k[2], &k[3], &k[0], &k[1], &k[4]].map(String::clone);
    let leased = s.lease(Q, "w", 1, LEASE).await.unwrap().items;
    assert_eq!(leased[0].key, want[0]);
    assert!((now - leased[0].enqueued_ms).abs() < 1000, "the lease reports the ready time");
    let mut order = vec![leased[0].key.clone()];
    order.extend(lease_order(&s).await);
    assert_eq!(order, want);
}

/// With every priority equal (none sent, 0, or the same value) the order is upstream's: ready
/// time, then key.
async fn equal_priorities_keep_upstreams_order(s: Store) {
    for p in [None, Some(0), Some(5000)] {
        let k = same_shard(&s, "b", &format!("p{}", p.unwrap_or(-1)), 6);
        let with = |key: &String| {
            let e = Enqueue::now(key);
            match p {
                Some(p) => e.with_priority(p),
                None => e,
            }
        };
        // Two Adds, a few ms apart: the first's keys (out of key order), then the second's.
        s.add(Q, &[with(&k[3]), with(&k[1]), with(&k[2])]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        s.add(Q, &[with(&k[5]), with(&k[0]), with(&k[4])]).await.unwrap();
        let want = [&k[1], &k[2], &k[3], &k[0], &k[4], &k[5]].map(String::clone);
        assert_eq!(lease_order(&s).await, want, "priority {p:?}");
    }
}

/// The priority stays with the key while it is in the queue (a requeue after an error is scored
/// with it again), a later Add's priority replaces it, and it goes when the key leaves.
async fn the_priority_stays_with_the_key_until_it_leaves(s: Store) {
    use kjob_workqueue::LeaseOutcome;
    let k = same_shard(&s, "c", "j", 2);
    s.add(Q, &[Enqueue::now(&k[0]), Enqueue::now(&k[1]).with_priority(100)]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    assert_eq!(l.key, k[1]);
    // An Add without a priority (an older watcher, the worker's requeue) keeps the stored one.
    s.add(Q, &[Enqueue::now(&k[1])]).await.unwrap();
    s.done(Q, &k[1], &l.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    let x = s.explain(Q, &k[1]).await.unwrap().unwrap();
    assert_eq!((x.priority, x.state), (100, kjob_workqueue::KeyState::Ready), "dirty: back");
    assert_eq!(lease_order(&s).await, [k[1].clone(), k[0].clone()], "ahead of the older key again");
    // Now forgotten: the priority went with it.
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items;
    assert!(l.is_empty());
    s.add(Q, &[Enqueue::now(&k[1]).with_priority(7)]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    s.done(Q, &k[1], &l.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    let x = s.explain(Q, &k[1]).await.unwrap().unwrap();
    assert_eq!((x.priority, x.state), (0, kjob_workqueue::KeyState::Absent));
    // A requeue-after keeps it: promoted from the delayed set, the key is scored with it again
    // and goes ahead of an older key of priority 0.
    let k = same_shard(&s, "c", "r", 2);
    s.add(Q, &[Enqueue::now(&k[1]).with_priority(50)]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    s.done(Q, &k[1], &l.lease_id, LeaseOutcome::RequeueAfter(Duration::from_millis(200)))
        .await
        .unwrap()
        .unwrap();
    s.add(Q, &[Enqueue::now(&k[0])]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(lease_order(&s).await, [k[1].clone(), k[0].clone()]);
    // A later Add's priority replaces the stored one.
    s.add(Q, &[Enqueue::now(&k[0]), Enqueue::now(&k[1]).with_priority(50)]).await.unwrap();
    let l = s.lease(Q, "w", 1, LEASE).await.unwrap().items.remove(0);
    assert_eq!(l.key, k[1]);
    s.add(Q, &[Enqueue::now(&k[1]).with_priority(0)]).await.unwrap();
    s.done(Q, &k[1], &l.lease_id, LeaseOutcome::Forget).await.unwrap().unwrap();
    let x = s.explain(Q, &k[1]).await.unwrap().unwrap();
    assert_eq!(x.priority, 0, "replaced");
    assert_eq!(lease_order(&s).await, [k[0].clone(), k[1].clone()]);
}

/// Aging bounds the wait: with the cap at 1 s, a priority-0 key is leased about 1 s after it
/// became ready although top-priority keys keep arriving (one every 50 ms, as fast as they are
/// leased); none that arrived more than 1 s after it goes first. Without aging it would wait
/// as long as they came.
async fn aging_bounds_a_low_priority_wait(s: Store) {
    let aging = Duration::from_secs(1);
    let config = StoreConfig { priority_aging: aging, ..Default::default() };
    let s = Store::connect(s.target().url(), config).await.unwrap();
    let mut k = same_shard(&s, "d", "j", 81);
    let low = k.remove(40);
    let top = kjob_workqueue::TOP_PRIORITY;
    s.add(Q, &[Enqueue::now(&k[0]).with_priority(top)]).await.unwrap();
    s.add(Q, &[Enqueue::now(&low)]).await.unwrap();
    let low_at = s.explain(Q, &low).await.unwrap().unwrap().ready_ms.unwrap();
    let mut waited = None;
    for key in &k[1..] {
        s.add(Q, &[Enqueue::now(key).with_priority(top)]).await.unwrap();
        let batch = s.lease(Q, "w", 1, LEASE).await.unwrap();
        let l = &batch.items[0];
        if l.key == low {
            assert_eq!(l.enqueued_ms, low_at, "the lease reports the ready time");
            waited = Some(batch.now_ms - low_at);
            break;
        }
        // `enqueued_ms` is the ready time (the score plus the head start).
        assert!(
            l.enqueued_ms <= low_at + aging.as_millis() as i64,
            "{} became ready {} ms after the low key and went first",
            l.key,
            l.enqueued_ms - low_at
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waited = waited.expect("the low-priority key was leased while high ones kept coming");
    assert!(waited >= 900, "the head start held for about the cap: waited {waited} ms");
    assert!(
        waited <= 2500,
        "leased within the aging bound (1 s) and the backlog ahead: {waited} ms"
    );
}

/// `LeaseOrder::Fifo` (fairness off, `kjob-queue --lease-order fifo`): the oldest ready key first
/// whatever its namespace, so the quiet namespace's key waits behind the whole flood, as under
/// upstream's workqueue, and weights change nothing. A namespace that empties leaves the round
/// robin as under the fair order: a fair replica on the same data afterwards alternates again.
/// As kjob's ACL user, which has exactly the commands kjob's scripts may call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_serves_the_flood_first() {
    let security = kjob_testkit::RedisSecurity {
        tls: None,
        tls_auth_clients: false,
        acl: vec![
            "user default off".into(),
            kjob_workqueue::acl::acl_user_line("kjob", ">fifo-pw"),
        ],
    };
    let server = RedisServer::start_secured(&security, &[]).expect("redis-server");
    let url = format!("redis://kjob:fifo-pw@127.0.0.1:{}", server.port());
    let fifo = StoreConfig { lease_order: kjob_workqueue::LeaseOrder::Fifo, ..Default::default() };
    let s = Store::connect(&url, fifo).await.expect("connect");
    s.set_namespace_weight("b", 10).await.unwrap();
    let flood: Vec<String> = (0..200).map(|i| format!("a/job-{i:03}")).collect();
    add_all(&s, &flood).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.add(Q, &[Enqueue::now("b/quiet")]).await.unwrap();
    let mut order = Vec::new();
    loop {
        let got = s.lease(Q, "w", 7, LEASE).await.unwrap().items;
        if got.is_empty() {
            break;
        }
        order.extend(got.into_iter().map(|l| l.key));
    }
    let mut want = flood.clone();
    want.push("b/quiet".into());
    assert_eq!(order, want, "oldest first, whatever the namespace or its weight");

    let fair = Store::connect(&url, StoreConfig::default()).await.expect("connect");
    let keys: Vec<String> =
        ["a/x1", "a/x2", "a/x3", "c/y1", "c/y2", "c/y3"].map(String::from).to_vec();
    add_all(&fair, &keys).await;
    let order = lease_order(&fair).await;
    let namespaces: String = order.iter().map(|k| &k[..1]).collect();
    assert!(namespaces == "acacac" || namespaces == "cacaca", "{order:?}");
}

/// A namespace joins the round robin once, when its set was empty, whichever way an Add finds
/// out: from the list read whole (an Add naming at least half as many namespaces as the list
/// holds) or by asking each set (a longer list). A namespace listed twice would take two turns
/// in a round. The leases carry the Add's time and no failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_joins_the_round_robin_once() {
    let (_server, s) = one_shard().await;
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let before = i64::try_from(before.as_millis()).unwrap();
    let add = |keys: &'static [&'static str]| {
        let items: Vec<Enqueue> = keys.iter().map(|k| Enqueue::now(*k)).collect();
        let s = s.clone();
        async move { s.add(Q, &items).await.unwrap() }
    };
    // The list read whole: empty, then 3 entries against 2 namespaces named.
    add(&["n1/a", "n2/a", "n3/a"]).await;
    add(&["n1/b", "n4/a"]).await;
    // Asked per set: 4 entries against 1 namespace named, once listed and once not.
    add(&["n2/b"]).await;
    add(&["n5/a"]).await;
    let mut order = Vec::new();
    loop {
        let got = s.lease(Q, "w", 1, LEASE).await.unwrap().items;
        let Some(l) = got.into_iter().next() else { break };
        assert_eq!((l.requeues, l.expiries), (0, 0), "{l:?}");
        assert!(l.enqueued_ms >= before && l.deadline_ms >= l.enqueued_ms + 30_000, "{l:?}");
        order.push(l.key);
    }
    assert_eq!(order, ["n1/a", "n2/a", "n3/a", "n4/a", "n5/a", "n1/b", "n2/b"]);
}

/// A namespace whose set a lease empties leaves the round robin and its deficit goes, however
/// the lease found out: a visit that got fewer keys than it asked for, or (when it got exactly
/// what it asked for) the one check of every such set after the visits — with the whole list
/// read, with only its head read (a rotated namespace), and a head that keeps the rest of its
/// turn. The list is read from Redis after each lease: a namespace with nothing ready must not
/// stay listed (it would tell every lessee that the shard has work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_a_lease_empties_leaves_the_round_robin() {
    let (server, s) = one_shard().await;
    let tag = s.layout().tag(Q, 0);
    let (rr, drr) = (format!("{tag}:rr"), format!("{tag}:drr"));
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let add = |keys: &'static [&'static str]| {
        let items: Vec<Enqueue> = keys.iter().map(|k| Enqueue::now(*k)).collect();
        let s = s.clone();
        async move { s.add(Q, &items).await.unwrap() }
    };
    let lease = |n: u32| {
        let s = s.clone();
        async move {
            let got = s.lease(Q, "w", n, LEASE).await.unwrap().items;
            got.into_iter().map(|l| l.key).collect::<Vec<_>>()
        }
    };
    add(&["n1/a", "n2/a", "n2/b", "n2/c", "n3/a"]).await;
    // The whole list read (3 entries for 3 keys): n1 and n3 gave their last key.
    assert_eq!(lease(3).await, ["n1/a", "n2/a", "n3/a"]);
    let listed: Vec<String> =
        redis::cmd("LRANGE").arg(&rr).arg(0).arg(-1).query_async(&mut c).await.unwrap();
    assert_eq!(listed, ["n2"]);
    add(&["m1/a", "m2/a", "m2/b", "m3/a", "m4/a"]).await;
    s.set_namespace_weight("m2", 3).await.unwrap();
    // Only the head read (5 entries for 2 keys): n2 and m1 rotate, and m1 is empty.
    assert_eq!(lease(2).await, ["n2/b", "m1/a"]);
    let listed: Vec<String> =
        redis::cmd("LRANGE").arg(&rr).arg(0).arg(-1).query_async(&mut c).await.unwrap();
    assert_eq!(listed, ["m2", "m3", "m4", "n2"]);
    // m2 (weight 3) gives 2 and would keep the head for its third, but it has no third.
    assert_eq!(lease(2).await, ["m2/a", "m2/b"]);
    let listed: Vec<String> =
        redis::cmd("LRANGE").arg(&rr).arg(0).arg(-1).query_async(&mut c).await.unwrap();
    assert_eq!(listed, ["m3", "m4", "n2"]);
    let deficits: HashMap<String, String> =
        redis::cmd("HGETALL").arg(&drr).query_async(&mut c).await.unwrap();
    assert!(deficits.is_empty(), "an emptied namespace keeps no deficit: {deficits:?}");
    // Each gives its last key, then the next round finds them empty.
    assert_eq!(lease(10).await, ["m3/a", "m4/a", "n2/c"]);
    let exists: u32 = redis::cmd("EXISTS").arg(&rr).arg(&drr).query_async(&mut c).await.unwrap();
    assert_eq!(exists, 0, "nothing ready: no round robin, no deficits");
    // A namespace that left joins again, once.
    add(&["m2/c", "n1/b", "m2/d"]).await;
    assert_eq!(lease(10).await, ["m2/c", "m2/d", "n1/b"]);
    s.set_namespace_weight("m2", 1).await.unwrap();
}

macro_rules! on {
    ($backend:ident: $($name:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (_servers, store) = super::$backend().await;
                    super::$name(store).await;
                }
            )*
        }
    };
}

macro_rules! every_backend {
    ($($t:tt)*) => {
        on!(one_shard: $($t)*);
        on!(many_shards: $($t)*);
        on!(cluster: $($t)*);
    };
}

every_backend!(
    a_quiet_namespace_is_not_stuck_behind_a_flood,
    weights_are_honoured,
    priority_orders_a_namespace,
    equal_priorities_keep_upstreams_order,
    the_priority_stays_with_the_key_until_it_leaves,
    aging_bounds_a_low_priority_wait,
);
