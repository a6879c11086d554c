//! The shared Job view cannot be forged (issue 44): an attacker who can write Redis (or anything
//! kjob-queue stores) but holds neither the watcher's nor a worker's view key replaces a Job's
//! view with a Job of their own — another image, more pods, resumed — and pins it with a huge
//! resourceVersion. The worker must not create one pod from it: it counts the view as forged,
//! reads the API server, and runs the Job the user made.

mod stack_common;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::{Stack, StackConfig};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

const NS: &str = "forged";
const GOOD_IMAGE: &str = "registry.k8s.io/pause:3.10";
const EVIL_IMAGE: &str = "evil.example.com/miner:latest";

async fn redis(stack: &Stack) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(stack.redis_url.as_str()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

async fn worker_metric(stack: &Stack, result: &str) -> f64 {
    let name = stack.workers()[0].clone();
    let admin = stack.admin_url(&name).unwrap();
    let text = reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap();
    let needle = format!("result=\"{result}\"");
    stack_common::metric_sum(&text, "kjob_worker_job_view_reads_total", &[&needle])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_written_into_redis_by_someone_else_makes_no_pod() {
    let bin_dir = kjob_testkit::bin_path("kjob-sim").expect("run `cargo build --bins` first");
    let bin_dir = bin_dir.parent().unwrap().to_path_buf();
    let redis_bin = kjob_testkit::redis::redis_server_binary().expect("redis-server");
    let run = tempfile::tempdir().unwrap();
    let mut cfg = StackConfig::new(bin_dir, redis_bin, run.path().to_path_buf(), 1);
    // Secure, as deployed: mTLS and a random view key the attacker does not have.
    cfg.tls = true;
    let stack = tokio::task::block_in_place(|| Stack::start(cfg)).expect("stack");
    let client = stack_common::client(&stack).await;
    stack_common::create_namespace(&client, NS).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let logs = || stack_common::log_tails(&stack, 30);

    // The user's Job: suspended for now, two pods of the good image.
    let shape = stack_common::Shape::NonIndexed { completions: 2, parallelism: 2 };
    let mut job = shape.job("victim", kjob_core::DEFAULT_CONTROLLER_NAME, 60_000);
    job.spec.as_mut().unwrap().suspend = Some(true);
    let containers = &mut job.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers;
    containers[0].image = Some(GOOD_IMAGE.into());
    stack_common::create_job_retrying(&jobs, &job).await;

    // Wait until the watcher has written the Job's view (sealed: not bare JSON).
    let mut conn = redis(&stack).await;
    let key = format!("{NS}/victim");
    // The stack's single Redis: the layout kjob-queue records for a new data set there.
    let tag = kjob_workqueue::auto_layout(false).job_tag(&key);
    let view_key = format!("{tag}:view:{key}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let stored: Vec<u8> = loop {
        let v: Option<Vec<u8>> =
            redis::cmd("GET").arg(&view_key).query_async(&mut conn).await.unwrap();
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            break v;
        }
        assert!(tokio::time::Instant::now() < deadline, "no view written\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(stored.first(), Some(&b'{'), "the view holds bare JSON: it is not sealed");

    // The attacker's Job under the same key and UID: resumed, five pods of their image, and a
    // resourceVersion no later write of the watcher or a worker can outrank.
    let real = jobs.get("victim").await.unwrap();
    let mut forged = real.clone();
    let spec = forged.spec.as_mut().unwrap();
    spec.suspend = Some(false);
    spec.parallelism = Some(5);
    spec.completions = Some(5);
    spec.template.spec.as_mut().unwrap().containers[0].image = Some(EVIL_IMAGE.into());
    forged.metadata.resource_version = Some("999999999999".into());
    let forged_json = serde_json::to_vec(&forged).unwrap();
    // Also a copy that carries the real seal's first 32 bytes: a tag lifted from another entry.
    let mut lifted = stored[..32].to_vec();
    lifted.extend_from_slice(&forged_json);
    for (i, body) in [forged_json, lifted].into_iter().enumerate() {
        let _: () =
            redis::cmd("SET").arg(&view_key).arg(body).query_async(&mut conn).await.unwrap();
        let meta = format!("{view_key}:meta");
        let _: () = redis::cmd("HSET")
            .arg(&meta)
            .arg("rv")
            .arg("999999999999")
            .query_async(&mut conn)
            .await
            .unwrap();
        if i == 0 {
            // The user resumes their Job: the watcher enqueues it, and its own view write of the
            // resumed Job is outranked by the pinned resourceVersion.
            let patch = json!({"spec": {"suspend": false}});
            jobs.patch("victim", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        } else {
            // Poke another sync (an annotation: the spec stays the user's).
            let patch = json!({"metadata": {"annotations": {"poke": "1"}}});
            jobs.patch("victim", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while worker_metric(&stack, "forged").await < (i + 1) as f64 {
            assert!(tokio::time::Instant::now() < deadline, "no forged read counted\n{}", logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // The worker made the user's pods, from the API server: two, of the good image; none of the
    // attacker's, now or a little later.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let images: Vec<String> = list
            .iter()
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
            .filter_map(|c| c.image.clone())
            .collect();
        assert!(!images.iter().any(|i| i == EVIL_IMAGE), "a pod of the forged view: {images:?}");
        assert!(list.len() <= 2, "{} pods for a Job of parallelism 2\n{}", list.len(), logs());
        if list.len() == 2 {
            assert!(images.iter().all(|i| i == GOOD_IMAGE), "{images:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the Job's pods never came\n{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.len(), 2, "{}", logs());
}
