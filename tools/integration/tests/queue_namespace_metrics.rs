//! The queue per namespace, bounded: a real kjob-queue over a real redis-server (one shard) and
//! a 3-master Redis Cluster (24 shards) with keys in 14 namespaces exports gauges for the 10
//! deepest and sums the other 4 as `namespace="_other"`, names the 10 Jobs waiting longest, and
//! drops the series of a namespace that drains (and of Jobs no longer waiting); the Namespaces
//! RPC answers the same table, deepest first, and one namespace's longest waiting keys.

mod queue_common;

use kjob_queue::{QueueConfig, Security};
use queue_common::InProcessQueue;

use std::collections::BTreeMap;
use std::time::Duration;

use kjob_testkit::{RedisCluster, RedisServer};
use kjob_workqueue::{Done, Enqueue, LeaseOutcome, Store, StoreConfig};

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(600);
/// Two refresh periods (10 s, jittered up to 12 s) and some.
const REFRESH_WAIT: Duration = Duration::from_secs(40);

type Running = InProcessQueue;

async fn start(redis_url: &str) -> Running {
    InProcessQueue::insecure(redis_url).await
}

/// Samples of `family` on `/metrics`: label set → value.
async fn samples(r: &Running, family: &str) -> BTreeMap<String, f64> {
    let text = match reqwest::get(format!("{}/metrics", r.admin)).await {
        Ok(resp) => resp.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let prefix = format!("{family}{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(labels, v)| (labels.trim_end_matches('}').to_string(), v.parse().unwrap()))
        .collect()
}

/// The value of the unlabelled gauge `name`.
async fn value(r: &Running, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", r.admin)).await.ok()?.text().await.ok()?;
    let prefix = format!("{name} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
}

/// The per-namespace series of `family` by namespace.
async fn by_namespace(r: &Running, family: &str) -> BTreeMap<String, f64> {
    samples(r, family)
        .await
        .into_iter()
        .map(|(l, v)| {
            let ns = l.strip_prefix("namespace=\"").and_then(|l| l.strip_suffix('"')).unwrap();
            (ns.to_string(), v)
        })
        .collect()
}

/// Waits until the ready gauges equal `want` (namespace → ready + delayed + leased).
async fn wait_for_depths(r: &Running, want: &BTreeMap<String, f64>) {
    let deadline = tokio::time::Instant::now() + REFRESH_WAIT;
    loop {
        let mut got: BTreeMap<String, f64> = BTreeMap::new();
        for f in [
            "kjob_queue_namespace_ready",
            "kjob_queue_namespace_delayed",
            "kjob_queue_namespace_leased",
        ] {
            for (ns, v) in by_namespace(r, f).await {
                *got.entry(ns).or_default() += v;
            }
        }
        if &got == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "depths {got:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_namespaces_get_series_and_the_rest_one() {
    let redis = RedisServer::start().unwrap();
    top_namespaces(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_namespaces_get_series_and_the_rest_one_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().unwrap();
    top_namespaces(&cluster.url()).await;
}

/// `--namespace-metrics-top` sets N: with 2, four namespaces make two series and `_other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flag_sets_how_many_namespaces_get_series() {
    let redis = RedisServer::start().unwrap();
    let store = Store::connect(&redis.url(), StoreConfig::default()).await.unwrap();
    let config = QueueConfig {
        namespace_metrics_top: 2,
        ..QueueConfig::new(redis.url(), Security::InsecureNoAuth)
    };
    let r = InProcessQueue::start(config).await;
    for (ns, n) in [("a", 4), ("b", 3), ("c", 2), ("d", 1)] {
        let keys: Vec<Enqueue> = (0..n).map(|j| Enqueue::now(format!("{ns}/j{j}"))).collect();
        store.add(Q, &keys).await.unwrap();
    }
    let want: BTreeMap<String, f64> =
        [("a", 4.0), ("b", 3.0), ("_other", 3.0)].map(|(n, v)| (n.to_string(), v)).into();
    wait_for_depths(&r, &want).await;
    assert_eq!(value(&r, "kjob_queue_namespaces").await, Some(4.0));
    r.stop().await;
}

async fn top_namespaces(url: &str) {
    let store = Store::connect(url, StoreConfig::default()).await.unwrap();
    let r = start(url).await;
    assert_eq!(
        QueueConfig::new(url, Security::InsecureNoAuth).namespace_metrics_top,
        10,
        "the default top N"
    );

    // "busy": 30 keys, all leased (the only ready namespace when leased).
    let busy: Vec<Enqueue> = (0..30).map(|i| Enqueue::now(format!("busy/j{i:02}"))).collect();
    store.add(Q, &busy).await.unwrap();
    let mut leased = Vec::new();
    while leased.len() < 30 {
        let b = store.lease(Q, "w", 30, LEASE).await.unwrap();
        assert!(!b.items.is_empty(), "30 busy keys to lease, got {}", leased.len());
        leased.extend(b.items);
    }
    // "later": 20 keys delayed by an hour.
    let later: Vec<Enqueue> = (0..20)
        .map(|i| Enqueue::after(format!("later/j{i:02}"), Duration::from_secs(3600)))
        .collect();
    store.add(Q, &later).await.unwrap();
    // t00 … t11: 12, 11, … 1 ready keys, in that order, so t00's wait longest.
    let mut want: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..12u32 {
        let ns = format!("t{i:02}");
        // One at a time, a few ms apart: each shard's script stamps its own Redis time, so
        // the keys of one batch would be ordered by shard.
        for j in 0..12 - i {
            store.add(Q, &[Enqueue::now(format!("{ns}/j{j:02}"))]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        if i < 8 {
            want.insert(ns, f64::from(12 - i));
        }
    }
    want.insert("busy".into(), 30.0);
    want.insert("later".into(), 20.0);
    // t08 … t11 summed: 4 + 3 + 2 + 1.
    want.insert("_other".into(), 10.0);
    wait_for_depths(&r, &want).await;

    // Each part in its own gauge.
    let leased_g = by_namespace(&r, "kjob_queue_namespace_leased").await;
    let delayed_g = by_namespace(&r, "kjob_queue_namespace_delayed").await;
    let ready_g = by_namespace(&r, "kjob_queue_namespace_ready").await;
    assert_eq!((leased_g["busy"], delayed_g["later"], ready_g["t00"]), (30.0, 20.0, 12.0));
    assert_eq!((ready_g["busy"], ready_g["_other"], leased_g["_other"]), (0.0, 10.0, 0.0));
    assert_eq!(ready_g.len(), 11, "10 namespaces and _other: {ready_g:?}");
    let oldest = by_namespace(&r, "kjob_queue_namespace_oldest_ready_seconds").await;
    assert_eq!((oldest["busy"], oldest["later"]), (0.0, 0.0), "nothing ready: {oldest:?}");
    assert!(oldest["t00"] >= oldest["t07"] && oldest["t07"] > 0.0, "{oldest:?}");
    // _other's oldest is t08's (added before t09 … t11).
    assert!(oldest["_other"] > 0.0 && oldest["_other"] <= oldest["t07"], "{oldest:?}");
    assert_eq!(value(&r, "kjob_queue_namespaces").await, Some(14.0));
    assert_eq!(value(&r, "kjob_queue_namespace_counts_truncated").await, Some(0.0));
    // The 10 Jobs waiting longest: t00's first 10 (its 12 keys went in first, ties by name).
    let waiting = samples(&r, "kjob_queue_oldest_ready_job_seconds").await;
    let keys: Vec<&str> = waiting.keys().map(String::as_str).collect();
    let want_keys: Vec<String> =
        (0..10).map(|j| format!("namespace=\"t00\",key=\"t00/j{j:02}\"")).collect();
    assert_eq!(keys, want_keys, "{waiting:?}");
    assert!(waiting.values().all(|v| *v > 0.0), "{waiting:?}");

    // The Namespaces RPC: the same table, deepest first, counted in full.
    let n = r.client.namespaces(Q, "", 3, 0).await.unwrap();
    let rows: Vec<(&str, u64, u64, u64)> =
        n.namespaces.iter().map(|s| (s.namespace.as_str(), s.ready, s.delayed, s.leased)).collect();
    assert_eq!(rows, [("busy", 0, 0, 30), ("later", 0, 20, 0), ("t00", 12, 0, 0)]);
    assert_eq!(n.total_namespaces, 14);
    assert!(n.oldest_ready.is_empty() && !n.truncated);
    let one = r.client.namespaces(Q, "t03", 0, 5).await.unwrap();
    assert_eq!(one.namespaces.len(), 1);
    assert_eq!((one.namespaces[0].namespace.as_str(), one.namespaces[0].ready), ("t03", 9));
    assert!(one.namespaces[0].oldest_ready_age_ms > 0);
    let keys: Vec<&str> = one.oldest_ready.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["t03/j00", "t03/j01", "t03/j02", "t03/j03", "t03/j04"]);
    for bad in ["_other", "Team", "a/b"] {
        let e = r.client.namespaces(Q, bad, 0, 0).await.unwrap_err();
        assert!(format!("{e:?}").contains("InvalidArgument"), "{bad}: {e:?}");
    }
    let e = r.client.namespaces(Q, "", 1001, 0).await.unwrap_err();
    assert!(format!("{e:?}").contains("InvalidArgument"), "{e:?}");

    // `kjob-queue inspect`: the namespaces by depth, and one namespace's longest waiting keys.
    let url = r.url.clone();
    let inspect = move |args: &[&str]| {
        let out = std::process::Command::new(kjob_testkit::bin_path("kjob-queue").unwrap())
            .args(["inspect", "--insecure-no-auth", &format!("--queue-url={url}")])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let out = tokio::task::block_in_place(|| inspect(&["--top=3"]));
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip_while(|l| !l.starts_with("NAMESPACE"))
        .skip(1)
        .take(3)
        .map(|l| l.split_whitespace().take(4).collect())
        .collect();
    assert_eq!(
        rows,
        [["busy", "0", "0", "30"], ["later", "0", "20", "0"], ["t00", "12", "0", "0"]],
        "{out}"
    );
    assert!(out.contains("(11 more namespaces; --top shows more)"), "{out}");
    let out = tokio::task::block_in_place(|| inspect(&["--namespace=t11"]));
    assert!(out.contains("longest waiting ready keys of t11:"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("t11/j00")), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("t10")), "{out}");

    // Every ready key leased; t00's finished: t00 drops out (and its series with it), t08
    // moves up, and no Job waits any more.
    let mut t00 = Vec::new();
    loop {
        let b = store.lease(Q, "w", 100, LEASE).await.unwrap();
        if b.items.is_empty() {
            break;
        }
        t00.extend(b.items.into_iter().filter(|l| l.key.starts_with("t00/")));
    }
    assert_eq!(t00.len(), 12);
    let dones: Vec<Done> = t00
        .iter()
        .map(|l| Done {
            key: l.key.clone(),
            lease_id: l.lease_id.clone(),
            outcome: LeaseOutcome::Forget,
            error: String::new(),
        })
        .collect();
    store.done_many(Q, &dones).await.unwrap();
    want.remove("t00");
    want.insert("t08".into(), 4.0);
    want.insert("_other".into(), 6.0);
    wait_for_depths(&r, &want).await;
    let leased_g = by_namespace(&r, "kjob_queue_namespace_leased").await;
    assert!(!leased_g.contains_key("t00"), "{leased_g:?}");
    assert_eq!((leased_g["t08"], leased_g["_other"]), (4.0, 6.0));
    let oldest = by_namespace(&r, "kjob_queue_namespace_oldest_ready_seconds").await;
    assert!(!oldest.contains_key("t00") && oldest.values().all(|v| *v == 0.0), "{oldest:?}");
    assert_eq!(value(&r, "kjob_queue_namespaces").await, Some(13.0));
    let waiting = samples(&r, "kjob_queue_oldest_ready_job_seconds").await;
    assert!(waiting.is_empty(), "no Job is ready: {waiting:?}");

    r.stop().await;
}
