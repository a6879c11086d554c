//! Fair leasing across namespaces (deficit round robin, weight 1 by default), upstream's order
//! (ready time, then key) within a namespace, on one shard (a single Redis's default), on 24
//! shards of one server, and on a 3-master Redis Cluster.

use std::collections::HashMap;
use std::time::Duration;

use kjob_testkit::{RedisCluster, RedisServer};
use kjob_workqueue::{Enqueue, Store, StoreConfig};

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(30);

/// Keeps the servers alive for the test.
#[allow(dead_code)]
enum Backend {
    Single(RedisServer),
    Cluster(RedisCluster),
}

async fn one_shard() -> (Backend, Store) {
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(&server.url(), StoreConfig::default()).await.expect("connect");
    assert_eq!(store.layout().shards(), 1);
    (Backend::Single(server), store)
}

async fn many_shards() -> (Backend, Store) {
    let server = RedisServer::start().expect("redis-server");
    let config = StoreConfig { shards: Some(kjob_workqueue::DEFAULT_SHARDS), ..Default::default() };
    let store = Store::connect(&server.url(), config).await.expect("connect");
    (Backend::Single(server), store)
}

async fn cluster() -> (Backend, Store) {
    let c = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().expect("cluster");
    let store = Store::connect(&c.url(), StoreConfig::default()).await.expect("connect");
    (Backend::Cluster(c), store)
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

every_backend!(a_quiet_namespace_is_not_stuck_behind_a_flood, weights_are_honoured);
