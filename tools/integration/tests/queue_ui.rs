//! The web view on kjob-queue's admin port: its embedded files with their content types and
//! security headers, the redirects to `ui/` (relative, so they stay under a proxy's prefix), a
//! 404 for any other file, and `GET /api/v1/overview` read from a kjob-queue serving a real
//! redis-server (one shard) and a 3-master Redis Cluster (24 shards) with Jobs in known states:
//! ready, delayed and leased, in three namespaces, two leases held by one worker.

mod queue_common;

use queue_common::InProcessQueue;

use std::time::Duration;

use kjob_queue::ui::CONTENT_SECURITY_POLICY;
use kjob_testkit::{RedisCluster, RedisServer};
use kjob_workqueue::{Enqueue, Store, StoreConfig};
use serde_json::Value;

const Q: &str = "job";
const LEASE: Duration = Duration::from_secs(300);
/// How long kjob-queue may take to connect and take its second depth sample (5 s apart).
const SAMPLE_WAIT: Duration = Duration::from_secs(20);

type Running = InProcessQueue;

async fn start(redis_url: &str) -> Running {
    InProcessQueue::insecure(redis_url).await
}

/// A client that shows redirects instead of following them.
fn http() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// GET `path` on the admin port once kjob-queue answers it (503 until it has connected).
async fn get(r: &Running, path: &str) -> reqwest::Response {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(resp) = http().get(format!("{}{path}", r.admin)).send().await
            && resp.status() != 503
        {
            return resp;
        }
        assert!(tokio::time::Instant::now() < deadline, "admin port never answered {path}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing on {}", resp.url()))
        .to_str()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_serves_its_files_with_their_types_and_policy() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis.url()).await;

    for (path, content_type, contains) in [
        ("/ui/", "text/html; charset=utf-8", "<script src=\"app.js\" defer></script>"),
        ("/ui/app.js", "text/javascript; charset=utf-8", "textContent"),
        ("/ui/app.css", "text/css; charset=utf-8", ".badge.delayed"),
    ] {
        let resp = get(&r, path).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(header(&resp, "content-type"), content_type, "{path}");
        assert_eq!(header(&resp, "content-security-policy"), CONTENT_SECURITY_POLICY, "{path}");
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff", "{path}");
        let body = resp.text().await.unwrap();
        assert!(body.contains(contains), "{path} lacks {contains:?}");
    }
    assert!(CONTENT_SECURITY_POLICY.starts_with("default-src 'self'"));
    assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-inline"));

    // The page names only relative URLs, so it works under kube-apiserver's proxy prefix, and
    // carries no inline script or style (the policy would refuse them).
    let html = get(&r, "/ui/").await.text().await.unwrap();
    for absolute in ["src=\"/", "href=\"/", "http://", "https://", "<style", "style=", "<script>"] {
        assert!(!html.contains(absolute), "index.html has {absolute:?}");
    }
    let js = get(&r, "/ui/app.js").await.text().await.unwrap();
    assert!(js.contains("\"../api/v1/overview\""));
    assert!(!js.contains("innerHTML") && !js.contains("eval("), "the script builds no HTML");

    // `/` and `/ui` lead to `ui/`, relative.
    for path in ["/", "/ui"] {
        let resp = get(&r, path).await;
        assert_eq!(resp.status(), 307, "{path}");
        assert_eq!(header(&resp, "location"), "ui/", "{path}");
    }

    // Any other file: 404, typed, not sniffed.
    for path in ["/ui/nope.js", "/ui/index.htm", "/ui/%2e%2e%2fCargo.toml", "/ui/app.js.map"] {
        let resp = get(&r, path).await;
        assert_eq!(resp.status(), 404, "{path}");
        assert_eq!(header(&resp, "content-type"), "text/plain; charset=utf-8", "{path}");
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff", "{path}");
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_counts_jobs_in_known_states() {
    let redis = RedisServer::start().unwrap();
    overview_in_known_states(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_counts_jobs_in_known_states_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap().unwrap();
    overview_in_known_states(&cluster.url()).await;
}

async fn overview_in_known_states(url: &str) {
    let store = Store::connect(url, StoreConfig::default()).await.unwrap();
    let r = start(url).await;
    // kjob-queue is connected (and has taken its first sample, of an empty queue).
    assert_eq!(get(&r, "/api/v1/overview").await.status(), 200);

    // lease/: two Jobs leased by worker-a; ready/: three ready; later/: one delayed.
    store.add(Q, &[Enqueue::now("lease/a0"), Enqueue::now("lease/a1")]).await.unwrap();
    let b = store.lease(Q, "worker-a", 2, LEASE).await.unwrap();
    let mut held: Vec<String> = b.items.iter().map(|i| i.key.clone()).collect();
    held.sort();
    assert_eq!(held, ["lease/a0", "lease/a1"]);
    let ready: Vec<Enqueue> = (0..3).map(|i| Enqueue::now(format!("ready/r{i}"))).collect();
    store.add(Q, &ready).await.unwrap();
    store.add(Q, &[Enqueue::after("later/d", Duration::from_secs(600))]).await.unwrap();

    // Until a sample after the writes is in the series (one every 5 s).
    let deadline = tokio::time::Instant::now() + SAMPLE_WAIT;
    let v = loop {
        let resp = get(&r, "/api/v1/overview").await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "content-type"), "application/json");
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff");
        let v: Value = resp.json().await.unwrap();
        let last = v["series"].as_array().unwrap().last().cloned().unwrap();
        if (&last["ready"], &last["delayed"], &last["leased"]) == (&3.into(), &1.into(), &2.into())
        {
            break v;
        }
        assert!(tokio::time::Instant::now() < deadline, "no sample of the writes: {v}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    assert_eq!(v["queue"], "job");
    assert_eq!(v["sample_period_seconds"], 5);
    assert_eq!(v["window_seconds"], 600);
    let d = &v["depth"];
    assert_eq!(
        (d["ready"].as_u64(), d["delayed"].as_u64(), d["leased"].as_u64()),
        (Some(3), Some(1), Some(2))
    );
    assert!(d["oldest_ready_age_seconds"].as_f64().unwrap() >= 0.0, "{v}");
    assert!(d["oldest_lease_age_seconds"].as_f64().unwrap() >= 0.0, "{v}");
    // Samples in time order, one per period.
    let series = v["series"].as_array().unwrap();
    let times: Vec<i64> = series.iter().map(|s| s["at_unix_ms"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] >= 4000), "{times:?}");

    // One worker, both its leases, oldest first.
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{v}");
    assert_eq!(workers[0]["worker"], "worker-a");
    assert_eq!(workers[0]["leases"], 2);
    let mut keys: Vec<&str> =
        workers[0]["keys"].as_array().unwrap().iter().map(|k| k["key"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, ["lease/a0", "lease/a1"]);
    assert_eq!(v["workers_truncated"], false);

    // Deepest namespace first; equal depths by name.
    let ns: Vec<(&str, u64, u64, u64)> = v["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["namespace"].as_str().unwrap(),
                n["ready"].as_u64().unwrap(),
                n["delayed"].as_u64().unwrap(),
                n["leased"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ns, [("ready", 3, 0, 0), ("lease", 0, 0, 2), ("later", 0, 1, 0)]);
    assert_eq!(v["namespaces_total"], 3);
    r.stop().await;
}
