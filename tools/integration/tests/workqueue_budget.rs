//! The workers' shared API budget in Redis (`kjob_workqueue::budget`): a burst then the rate,
//! summed over every caller; a fair split across namespaces while it binds (one namespace
//! asking as fast as it can leaves another its share); 429 reports halve the rate once per gap,
//! down to a floor; and it runs as kjob's ACL user and on a 3-master Redis Cluster.

use std::time::{Duration, Instant};

use kjob_testkit::{RedisCluster, RedisSecurity, RedisServer};
use kjob_workqueue::budget::{DECREASE_GAP, FLOOR_SHARE, TokenAsk};
use kjob_workqueue::{Store, StoreConfig};

fn ask(ns: &str, want: u32, qps: f64, burst: u32) -> TokenAsk<'_> {
    TokenAsk { namespace: ns, want, qps, burst, throttled: 0 }
}

/// Takes tokens for `ns` as fast as the bucket allows for `d`; the tokens granted.
async fn drain(store: &Store, ns: &str, qps: f64, burst: u32, d: Duration) -> u64 {
    let end = Instant::now() + d;
    let mut got = 0u64;
    while Instant::now() < end {
        let g = store.take_api_tokens(&ask(ns, 4, qps, burst)).await.unwrap();
        got += u64::from(g.granted);
        if g.granted < 4 {
            tokio::time::sleep(g.wait.min(end.saturating_duration_since(Instant::now()))).await;
        }
    }
    got
}

/// The burst at once, then the rate, across four concurrent callers: the sum never exceeds
/// burst + qps·t (+1 for rounding), and reaches most of it.
async fn burst_then_rate_across_callers(store: Store) {
    let (qps, burst) = (40.0, 20);
    let first = store.take_api_tokens(&ask("a", 100, qps, burst)).await.unwrap();
    assert_eq!(first.granted, burst, "a full bucket gives its burst");
    assert!(first.wait > Duration::ZERO && first.wait <= Duration::from_secs(1), "{first:?}");
    assert_eq!(first.active_namespaces, 1);
    let start = Instant::now();
    let d = Duration::from_secs(3);
    let callers = (0..4).map(|_| drain(&store, "a", qps, burst, d));
    let got: u64 = futures::future::join_all(callers).await.into_iter().sum();
    let most = qps * start.elapsed().as_secs_f64() + 1.0;
    eprintln!("4 callers took {got} tokens in {:?} at {qps} QPS", start.elapsed());
    assert!((got as f64) <= most, "{got} tokens > {most}");
    assert!((got as f64) >= 0.8 * qps * d.as_secs_f64(), "{got} tokens: the rate is not given");
}

/// While the budget binds, a namespace asking in a tight loop from six callers and one asking
/// from one caller each get about half (at least 40 % each; without the claims the one caller
/// got about a third, against three callers as against six).
async fn fair_across_namespaces(store: Store) {
    let (qps, burst) = (40.0, 10);
    let d = Duration::from_secs(4);
    let big = (0..6).map(|_| drain(&store, "big", qps, burst, d));
    let (big, small) =
        tokio::join!(futures::future::join_all(big), drain(&store, "small", qps, burst, d));
    let big: u64 = big.into_iter().sum();
    let total = (big + small) as f64;
    eprintln!("big {big}, small {small} tokens in {d:?} at {qps} QPS");
    assert!(total <= qps * d.as_secs_f64() + f64::from(burst) + 2.0, "{total} > the budget");
    assert!(small as f64 >= 0.4 * total, "small got {small} of {total}");
    assert!(big as f64 >= 0.4 * total, "big got {big} of {total}");
}

/// A 429 report halves the rate; another within the gap does not; the floor holds.
async fn throttling_slows_the_budget(store: Store) {
    let (qps, burst) = (100.0, 10);
    let g = store.take_api_tokens(&ask("a", 1, qps, burst)).await.unwrap();
    assert_eq!((g.rate, g.slowed), (qps, false));
    let report = |n| TokenAsk { throttled: n, ..ask("a", 1, qps, burst) };
    let g = store.take_api_tokens(&report(3)).await.unwrap();
    assert!(g.slowed && (g.rate - 50.0).abs() < 0.5, "{g:?}");
    let g = store.take_api_tokens(&report(1)).await.unwrap();
    assert!(!g.slowed && g.rate < 51.0, "a second report within the gap counts once: {g:?}");
    for _ in 0..4 {
        tokio::time::sleep(DECREASE_GAP + Duration::from_millis(20)).await;
        store.take_api_tokens(&report(1)).await.unwrap();
    }
    let g = store.take_api_tokens(&ask("a", 1, qps, burst)).await.unwrap();
    assert!(g.rate < qps * FLOOR_SHARE + 2.0, "at the floor (plus recovery): {g:?}");
    assert!(g.rate >= qps * FLOOR_SHARE, "{g:?}");
    // And the bucket now refills at the slowed rate: about 10/s, not 100/s.
    let start = Instant::now();
    let got = drain(&store, "a", qps, burst, Duration::from_secs(2)).await;
    let most = 14.0 * start.elapsed().as_secs_f64() + f64::from(burst) + 1.0;
    assert!((got as f64) <= most, "{got} tokens at a slowed rate (most {most})");
}

async fn single() -> (RedisServer, Store) {
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(&server.url(), StoreConfig::default()).await.expect("connect");
    (server, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_burst_then_rate() {
    let (_s, store) = single().await;
    burst_then_rate_across_callers(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_fair_across_namespaces() {
    let (_s, store) = single().await;
    fair_across_namespaces(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_slowed_by_429s() {
    let (_s, store) = single().await;
    throttling_slows_the_budget(store).await;
}

/// kjob's ACL user (`kjob_workqueue::acl`) may run the budget's script on its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_runs_as_the_acl_user() {
    let security = RedisSecurity {
        tls: None,
        tls_auth_clients: false,
        acl: vec![
            "user default off".into(),
            kjob_workqueue::acl::acl_user_line("kjob", ">budget-pw"),
        ],
    };
    let server = RedisServer::start_secured(&security, &[]).unwrap();
    let url = format!("redis://kjob:budget-pw@127.0.0.1:{}", server.port());
    let store = Store::connect(&url, StoreConfig::default()).await.expect("connect as kjob");
    let g = store.take_api_tokens(&ask("a", 5, 10.0, 5)).await.unwrap();
    assert_eq!(g.granted, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_on_a_redis_cluster() {
    let c = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().expect("cluster");
    let store = Store::connect(&c.url(), StoreConfig::default()).await.expect("connect");
    fair_across_namespaces(store).await;
}
