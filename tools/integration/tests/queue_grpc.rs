//! kjob-queue in process over a real redis-server, driven through the typed client: the
//! queue's semantics over gRPC, its gRPC edge (per-RPC metrics by code, every workqueue series
//! present at start, server reflection v1 and v1alpha), and its supervision (a listener that
//! breaks under the server ends the service with an error naming it).

mod common;
mod queue_common;

use std::time::Duration;

use common::logs::Logs;
use kjob_core::events::GateEvent;
use kjob_core::{Observation, ObservationKind, ViewOp};
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{
    AddItem, ClientError, Done, LeaseCall, Outcome, QueueClient, SetExpectations, ViewRecord,
    ViewWriteBack, v1,
};
use kjob_svc::Shutdown;
use kjob_testkit::RedisServer;
use queue_common::InProcessQueue;
use tokio::net::TcpListener;
use tracing::instrument::WithSubscriber;

type Running = InProcessQueue;

async fn start(redis: &RedisServer) -> Running {
    start_with(redis, Default::default()).await
}

async fn start_with(redis: &RedisServer, store: kjob_workqueue::StoreConfig) -> Running {
    InProcessQueue::start(QueueConfig {
        store,
        ..QueueConfig::new(redis.url(), Security::InsecureNoAuth)
    })
    .await
}

fn item(key: &str, delay_ms: u64) -> AddItem {
    let delay = Duration::from_millis(delay_ms);
    AddItem { queue: "job".into(), key: key.into(), delay, ..Default::default() }
}

const LEASE: Duration = Duration::from_secs(30);

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_metrics_health_and_shutdown() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    let c = &r.client;
    let add = c.add(vec![item("ns/a", 0), item("ns/a", 0), item("ns/b", 0)]).await.unwrap();
    assert_eq!(add.added, 2);
    let got = c.lease("job", 10, LEASE, Duration::from_secs(1), "w1").await.unwrap();
    assert_eq!(got.len(), 2);
    let a = got.iter().find(|i| i.key == "ns/a").unwrap();
    c.renew("job", "ns/a", &a.lease_id, LEASE).await.unwrap();
    let d = c.done("job", "ns/a", &a.lease_id, Outcome::RateLimited).await.unwrap();
    assert!(d.requeued);
    // Stale: the lease is finished.
    assert!(matches!(
        c.done("job", "ns/a", &a.lease_id, Outcome::Forget).await,
        Err(ClientError::LeaseLost(_))
    ));
    assert!(matches!(
        c.renew("job", "ns/a", &a.lease_id, LEASE).await,
        Err(ClientError::LeaseLost(_))
    ));
    let st = c.stats("job").await.unwrap();
    assert_eq!((st.ready, st.delayed, st.leased, st.failing), (0, 1, 1, 1));
    let v = c.inspect("job", vec!["ns/a".into(), "ns/b".into()]).await.unwrap().keys;
    assert_eq!((v[0].state.as_str(), v[0].requeues), ("delayed", 1));
    assert_eq!((v[1].state.as_str(), v[1].lease_holder.as_str()), ("leased", "w1"));

    // Expectations and records through the client.
    c.set_expectations("ns/a", "u1", 1, 0).await.unwrap();
    assert!(!c.get_expectations("ns/a", "u1").await.unwrap().satisfied);
    let obs = AddItem {
        observations: vec![Observation::new(ObservationKind::Creation, "u1", "p1")],
        observe_only: true,
        ..item("ns/a", 0)
    };
    assert_eq!(c.add(vec![obs]).await.unwrap().added, 0);
    assert!(c.get_expectations("ns/a", "u1").await.unwrap().satisfied);
    c.expect_finalizer_removals("ns/a", "u1", vec!["p1".into()]).await.unwrap();
    assert_eq!(c.get_expectations("ns/a", "u1").await.unwrap().finalizer_removals, vec!["p1"]);
    c.put_record("ns/a", "backoff", b"rec".to_vec(), None).await.unwrap();
    assert_eq!(c.get_record("ns/a", "backoff").await.unwrap(), Some(b"rec".to_vec()));
    c.lower_expectations("ns/a", "u1", 1, 0).await.unwrap();
    c.delete_expectations("ns/a").await.unwrap();
    assert_eq!(c.get_record("ns/a", "backoff").await.unwrap(), None);

    // Health and reflection.
    let channel =
        tonic::transport::Endpoint::from_shared(r.url.clone()).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let mut serving = false;
    for _ in 0..50 {
        let resp = health
            .check(tonic_health::pb::HealthCheckRequest { service: "kjob.queue.v1.Queue".into() })
            .await;
        if resp.is_ok_and(|r| r.into_inner().status == 1) {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serving, "health never reported SERVING");

    // Admin port: ready, and the client-go metric names with label name.
    let http = reqwest::Client::new();
    let admin = r.admin.clone();
    wait_for("readyz", async || {
        http.get(format!("{admin}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let body = http.get(format!("{admin}/metrics")).send().await.unwrap().text().await.unwrap();
    for want in [
        "workqueue_adds_total{name=\"job\"} 2",
        "workqueue_retries_total{name=\"job\"} 1",
        "workqueue_depth{name=\"job\"}",
        "workqueue_queue_duration_seconds_bucket{",
        "workqueue_work_duration_seconds_count{name=\"job\"} 1",
        "workqueue_unfinished_work_seconds{name=\"job\"}",
        "workqueue_longest_running_processor_seconds{name=\"job\"}",
        "kjob_queue_stale_lease_total{name=\"job\"} 2",
    ] {
        assert!(body.contains(want), "missing {want} in\n{body}");
    }

    // Graceful shutdown ends a waiting long poll promptly.
    let waiter = {
        let c = c.clone();
        tokio::spawn(
            async move { c.lease("orphan-pod", 1, LEASE, Duration::from_secs(30), "w").await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = tokio::time::Instant::now();
    r.shutdown.cancel();
    let got = waiter.await.unwrap();
    assert!(got.is_ok_and(|v| v.is_empty()));
    r.task.await.unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
}

async fn metric(http: &reqwest::Client, admin: &str, series: &str) -> Option<f64> {
    let body = http.get(format!("{admin}/metrics")).send().await.ok()?.text().await.ok()?;
    body.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_items_count_as_adds_and_poison_items_are_counted() {
    let redis = RedisServer::start().unwrap();
    let store = kjob_workqueue::StoreConfig { poison_after: 1, ..Default::default() };
    let r = start_with(&redis, store).await;
    let (c, http, admin) = (&r.client, reqwest::Client::new(), r.admin.clone());
    // client-go: an AddAfter counts a retry when called and an add when the item is added.
    c.add(vec![item("ns/d", 300)]).await.unwrap();
    let got = c.lease("job", 1, LEASE, Duration::from_secs(5), "w").await.unwrap();
    assert_eq!(got.len(), 1);
    c.done("job", "ns/d", &got[0].lease_id, Outcome::Forget).await.unwrap();
    let adds = "workqueue_adds_total{name=\"job\"}";
    assert_eq!(metric(&http, &admin, adds).await, Some(1.0));
    assert_eq!(metric(&http, &admin, "workqueue_retries_total{name=\"job\"}").await, Some(1.0));

    // A lease that expires without a Done (poison after one expiry here) is requeued through
    // the rate limiter (1 s) and counted, without any worker calling.
    c.add(vec![item("ns/p", 0)]).await.unwrap();
    let got = c.lease("job", 1, Duration::from_millis(100), Duration::ZERO, "w").await.unwrap();
    assert_eq!(got.len(), 1);
    let poison = "kjob_queue_poison_requeues_total{name=\"job\"}";
    wait_for("poison counted", async || metric(&http, &admin, poison).await == Some(1.0)).await;
    let v = &c.inspect("job", vec!["ns/p".into()]).await.unwrap().keys[0];
    assert_eq!((v.state.as_str(), v.requeues), ("delayed", 1));
    assert_eq!(
        metric(&http, &admin, "kjob_queue_lease_expired_total{name=\"job\"}").await,
        Some(1.0)
    );
    r.stop().await;
}

/// Records are deleted and in-flight finalizer removals forgotten by their own calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_deleted_and_finalizer_removals_forgotten() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    let c = r.strict();
    c.put_record("ns/j", "backoff", b"r".to_vec(), None).await.unwrap();
    c.put_record("ns/j", "other", b"o".to_vec(), None).await.unwrap();
    assert!(c.delete_record("ns/j", "backoff").await.unwrap());
    assert!(!c.delete_record("ns/j", "backoff").await.unwrap(), "already gone");
    assert_eq!(c.get_record("ns/j", "backoff").await.unwrap(), None);
    assert_eq!(c.get_record("ns/j", "other").await.unwrap(), Some(b"o".to_vec()));
    let err = c.delete_record("ns/j", "").await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");

    c.set_expectations("ns/j", "u1", 0, 0).await.unwrap();
    let uids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    c.expect_finalizer_removals("ns/j", "u1", uids(&["p1", "p2", "p3"])).await.unwrap();
    assert_eq!(c.forget_finalizer_removals("ns/j", uids(&["p1", "p3", "p9"])).await.unwrap(), 2);
    let e = c.get_expectations("ns/j", "u1").await.unwrap();
    assert_eq!(e.finalizer_removals, vec!["p2".to_string()]);
    let err = c.forget_finalizer_removals("ns/j", uids(&[""])).await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
    r.stop().await;
}

/// One shared-cache write as the watcher sends it with an Add.
fn cache_op(kind: v1::CacheOpKind, name: &str, object: &[u8], rv: &str) -> ViewOp<Vec<u8>> {
    use v1::CacheOpKind as K;
    let (name, object) = (name.to_string(), object.to_vec());
    match kind {
        K::Job => ViewOp::Job { uid: name, object, resource_version: rv.into() },
        K::DeleteJob => ViewOp::DeleteJob,
        K::Pod => ViewOp::Pod { name, object },
        K::DeletePod => ViewOp::DeletePod { name },
        K::Reset => ViewOp::Reset { uid: name },
        K::Trust => ViewOp::Trust,
        K::Orphans => ViewOp::Orphans,
        K::Unspecified => panic!("no view write of an unspecified kind"),
    }
}

/// A Lease of the Job queue asked `with_views` brings each key's shared view, as GetJobView
/// would answer it, read after the lease: trusted with its pods, expectations and records, or
/// untrusted; other queues carry none, and bad record names are refused before leasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_bring_the_job_view() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    let c = r.strict();
    assert!(c.cache_session("s1", v1::CacheSessionPhase::Begin).await.unwrap());
    let snapshot = AddItem {
        queue: "job".into(),
        key: "ns/viewed".into(),
        observe_only: true,
        cache_session: "s1".into(),
        cache: vec![
            cache_op(v1::CacheOpKind::Reset, "u1", b"", ""),
            cache_op(v1::CacheOpKind::Job, "u1", b"{\"job\":1}", "7"),
            cache_op(v1::CacheOpKind::Pod, "p1", b"{\"pod\":1}", ""),
            cache_op(v1::CacheOpKind::Trust, "", b"", ""),
        ],
        ..Default::default()
    };
    c.add(vec![snapshot]).await.unwrap();
    assert!(c.cache_session("s1", v1::CacheSessionPhase::Commit).await.unwrap());
    c.put_record("ns/viewed", "backoff", b"rec".to_vec(), None).await.unwrap();
    c.set_expectations("ns/viewed", "u1", 1, 0).await.unwrap();
    c.add(vec![item("ns/viewed", 0), item("ns/plain", 0)]).await.unwrap();

    let err = c.lease_with_views("job", 2, LEASE, Duration::ZERO, "w", &[""]).await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
    let mut got = c
        .lease_with_views("job", 2, LEASE, Duration::from_secs(5), "w", &["backoff"])
        .await
        .unwrap();
    assert_eq!(got.len(), 2, "nothing was leased by the refused call");
    got.sort_by(|a, b| a.key.cmp(&b.key));
    let plain = got[0].view.as_ref().expect("a view reply for every Job key");
    assert!(!plain.trusted && plain.job.is_empty(), "{plain:?}");
    let v = got[1].view.as_ref().unwrap();
    assert!(v.trusted);
    assert_eq!((v.job.as_slice(), v.job_uid.as_str()), (&b"{\"job\":1}"[..], "u1"));
    assert_eq!(v.pods, vec![b"{\"pod\":1}".to_vec()]);
    assert_eq!(v.records, vec![ViewRecord { name: "backoff".into(), value: b"rec".to_vec() }]);
    let e = v.expectations.as_ref().unwrap();
    assert!(e.exists && !e.satisfied && e.add == 1, "{e:?}");
    // The same as GetJobView answers.
    let direct = c.get_job_view("ns/viewed", &["backoff"]).await.unwrap().unwrap();
    assert_eq!((&direct.job, &direct.pods, &direct.records), (&v.job, &v.pods, &v.records));
    // Without with_views, and on other queues, no view rides along.
    c.add(vec![AddItem { queue: "orphan-pod".into(), ..item("ns/pod", 0) }]).await.unwrap();
    let orphan = c
        .lease_with_views("orphan-pod", 1, LEASE, Duration::from_secs(5), "w", &["backoff"])
        .await
        .unwrap();
    assert_eq!(orphan.len(), 1);
    assert_eq!(orphan[0].view, None);
    // A Done can carry the sync's last Job object back into the view, checked first.
    let wb = |key: &str, rv: &str| ViewWriteBack {
        key: key.into(),
        job_uid: "u1".into(),
        job: format!("{{\"job\":{rv}}}").into_bytes(),
        resource_version: rv.into(),
    };
    let viewed = &got[1];
    for (queue, key, w, want) in [
        ("job", "ns/viewed", wb("ns/other", "9"), "not this Done's"),
        ("orphan-pod", "ns/pod", wb("", "9"), "queue only"),
        ("job", "ns/viewed", ViewWriteBack { job_uid: "".into(), ..wb("", "9") }, "job_uid"),
    ] {
        let lease_id = if queue == "job" { &viewed.lease_id } else { &orphan[0].lease_id };
        let err =
            c.done_writing_back(queue, key, lease_id, Outcome::Forget, Some(w)).await.unwrap_err();
        assert!(matches!(&err, ClientError::InvalidArgument(m) if m.contains(want)), "{err:?}");
    }
    c.done_writing_back("job", "ns/viewed", &viewed.lease_id, Outcome::Forget, Some(wb("", "9")))
        .await
        .unwrap();
    let v = c.get_job_view("ns/viewed", &[]).await.unwrap().unwrap();
    assert_eq!(v.job, b"{\"job\":9}", "written back before the Done");
    c.done("job", &got[0].key, &got[0].lease_id, Outcome::Forget).await.unwrap();
    c.done("orphan-pod", "ns/pod", &orphan[0].lease_id, Outcome::Forget).await.unwrap();
    // In a DoneBatch too, with the expectations a sync raises after its creates: checked
    // (every created pod counted in add), then set before the lease ends.
    c.add(vec![item("ns/viewed", 0)]).await.unwrap();
    let again = c.lease("job", 1, LEASE, Duration::from_secs(5), "w").await.unwrap();
    let mut raw = kjob_proto::v1::queue_client::QueueClient::connect(r.url.clone()).await.unwrap();
    let raise = |add: i64, pods: &[&str]| SetExpectations {
        key: String::new(),
        job_uid: "u1".into(),
        add,
        del: 0,
        created_pod_uids: pods.iter().map(|p| p.to_string()).collect(),
    };
    let done = |expectations| Done {
        view_write_back: Some(wb("ns/viewed", "10")),
        expectations: Some(expectations),
        ..Done::new("job", "ns/viewed", &again[0].lease_id, Outcome::Forget)
    };
    let refused = raw
        .done_batch(v1::DoneBatchRequest { items: vec![done(raise(1, &["p7", "p8"])).into()] })
        .await
        .unwrap_err();
    assert!(refused.message().contains("created_pod_uids"), "{refused:?}");
    let batch = v1::DoneBatchRequest { items: vec![done(raise(3, &["p7", "p8"])).into()] };
    let res = raw.done_batch(batch).await.unwrap().into_inner();
    assert_eq!(res.results[0].code, 0, "{res:?}");
    let v = c.get_job_view("ns/viewed", &[]).await.unwrap().unwrap();
    assert_eq!(v.job, b"{\"job\":10}");
    let e = c.get_expectations("ns/viewed", "u1").await.unwrap();
    assert!(e.exists && !e.satisfied && (e.add, e.del) == (3, 0), "{e:?}");
    // And in a Done on its own.
    c.add(vec![item("ns/viewed", 0)]).await.unwrap();
    let again = c.lease("job", 1, LEASE, Duration::from_secs(5), "w").await.unwrap();
    let single = Done { lease_id: again[0].lease_id.clone(), ..done(raise(1, &["p9"])) };
    c.done_as(&single).await.unwrap();
    let e = c.get_expectations("ns/viewed", "u1").await.unwrap();
    assert!(e.exists && (e.add, e.del) == (1, 0), "{e:?}");
    c.add(vec![item("ns/viewed", 0)]).await.unwrap();
    let got = c.lease("job", 1, LEASE, Duration::from_secs(5), "w").await.unwrap();
    assert_eq!(got[0].view, None);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_are_refused_with_clear_messages() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    let c = r.strict();
    // Wait until the server is up (the first call may race the bind).
    wait_for("server", async || r.client.stats("job").await.is_ok()).await;
    let bad = |e: Result<_, ClientError>| match e {
        Err(ClientError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(bad(c.add(vec![item("", 0)]).await.map(|_| ())).contains("empty"));
    let long = format!("ns/{}", "x".repeat(400));
    assert!(bad(c.add(vec![item(&long, 0)]).await.map(|_| ())).contains("limit"));
    let mut unknown = item("ns/a", 0);
    unknown.queue = "jobs".into();
    assert!(bad(c.add(vec![unknown]).await.map(|_| ())).contains("unknown queue"));
    assert!(bad(c.add(vec![item("ns/a", u64::MAX)]).await.map(|_| ())).contains("30 days"));
    let m = bad(c.lease("job", 0, LEASE, Duration::ZERO, "w").await.map(|_| ()));
    assert!(m.contains("max_items"), "{m}");
    assert!(
        bad(c.lease("job", 5000, LEASE, Duration::ZERO, "w").await.map(|_| ()))
            .contains("max_items")
    );
    assert!(
        bad(c.lease("job", 1, LEASE, Duration::from_secs(61), "w").await.map(|_| ()))
            .contains("wait_ms")
    );
    assert!(
        bad(c.lease("job", 1, Duration::ZERO, Duration::ZERO, "w").await.map(|_| ()))
            .contains("lease_ms")
    );
    assert!(bad(c.set_expectations("ns/a", "u", -1, 0).await).contains("add"));
    let gate = |object_key: &str, spam_key: &str| GateEvent {
        object_key: object_key.into(),
        spam_key: spam_key.into(),
        aggregate_key: "a".into(),
        event_key: "e".into(),
        message: "m".into(),
    };
    let m = bad(c.gate_events(vec![gate("ns/a", "s"), gate("ns/a", "")]).await.map(|_| ()));
    assert_eq!(m, "events[1].spam_key is required");
    assert!(
        bad(c.gate_events(vec![gate("nope", "s")]).await.map(|_| ()))
            .contains("events[0].object_key")
    );
    let m = bad(c.gate_events(vec![gate("ns/a", "s"); 257]).await.map(|_| ()));
    assert!(m.contains("the limit is 256"), "{m}");
    // A good batch is gated: one answer per event, in order.
    let got = c.gate_events(vec![gate("ns/a", "s"); 26]).await.unwrap();
    assert_eq!(got.iter().filter(|g| g.dropped).count(), 1, "{got:?}");
    assert!(got[25].dropped && got.iter().all(|g| g.key == "e" && g.message == "m"));
    // A batch with one bad item applies nothing.
    assert!(c.add(vec![item("ns/ok", 0), item("bad", 0)]).await.is_err());
    assert_eq!(c.stats("job").await.unwrap().ready, 0);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_unavailable_then_recovers_without_restart() {
    let mut redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    wait_for("server", async || r.client.stats("job").await.is_ok()).await;
    r.client.add(vec![item("ns/a", 0)]).await.unwrap();
    let http = reqwest::Client::new();
    let admin = r.admin.clone();
    wait_for("ready", async || {
        http.get(format!("{admin}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    redis.kill();
    let c = r.strict();
    match c.add(vec![item("ns/b", 0)]).await {
        Err(ClientError::Unavailable(m)) => assert!(m.contains("redis"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    wait_for("not ready", async || {
        http.get(format!("{admin}/readyz")).send().await.is_ok_and(|r| r.status() == 503)
    })
    .await;
    redis.restart().unwrap();
    // The default client retries UNAVAILABLE, so this returns once Redis is back.
    let add = tokio::time::timeout(Duration::from_secs(15), r.client.add(vec![item("ns/c", 0)]))
        .await
        .expect("no recovery")
        .unwrap();
    assert_eq!(add.added, 1);
    wait_for("ready again", async || {
        http.get(format!("{admin}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_over_a_redis_cluster() {
    let cluster =
        tokio::task::spawn_blocking(kjob_testkit::RedisCluster::start).await.unwrap().unwrap();
    let r = InProcessQueue::insecure(&cluster.url()).await;
    let c = r.client.clone();
    // A waiting lessee is woken by an Add (the marker lives in the queue's slot).
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.lease("job", 5, LEASE, Duration::from_secs(20), "w").await })
    };
    wait_for("server", async || c.stats("job").await.is_ok()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.add(vec![item("ns/a", 0), item("ns/b", 0)]).await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert!(!got.is_empty());
    let mut keys: Vec<String> = got.iter().map(|i| i.key.clone()).collect();
    for it in &got {
        c.done("job", &it.key, &it.lease_id, Outcome::Forget).await.unwrap();
    }
    if keys.len() < 2 {
        let more = c.lease("job", 5, LEASE, Duration::from_secs(5), "w").await.unwrap();
        keys.extend(more.iter().map(|i| i.key.clone()));
    }
    keys.sort();
    assert_eq!(keys, vec!["ns/a", "ns/b"]);
    c.set_expectations("ns/a", "u", 1, 0).await.unwrap();
    c.set_expectations("other/x", "u", 0, 0).await.unwrap();
    assert!(!c.get_expectations("ns/a", "u").await.unwrap().satisfied);
    assert!(c.get_expectations("other/x", "u").await.unwrap().satisfied);
    r.stop().await;
}

async fn scrape(admin: &str) -> String {
    reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap()
}

/// A server that is ready (Redis reachable).
async fn start_ready(redis: &RedisServer) -> Running {
    let r = start(redis).await;
    wait_ready(&r.admin).await;
    r
}

async fn wait_ready(admin: &str) {
    wait_for("readyz", async || {
        reqwest::get(format!("{admin}/readyz")).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_shows_every_workqueue_series_at_zero() {
    let redis = RedisServer::start().unwrap();
    let r = start_ready(&redis).await;
    let body = scrape(&r.admin).await;
    for q in kjob_core::QUEUES {
        for series in [
            "workqueue_depth",
            "workqueue_adds_total",
            "workqueue_retries_total",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
            "workqueue_queue_duration_seconds_count",
            "workqueue_work_duration_seconds_count",
        ] {
            let want = format!("{series}{{name=\"{q}\"}} ");
            let value = body.lines().find_map(|l| l.strip_prefix(&want)?.parse::<f64>().ok());
            assert_eq!(value, Some(0.0), "{want} in\n{body}");
        }
    }
    // Every RPC, not called yet, is there too.
    let started = body.lines().filter(|l| l.starts_with("grpc_server_started_total{")).count();
    let rpcs: usize = kjob_queue::service::RPCS.iter().map(|(_, methods)| methods.len()).sum();
    assert_eq!((started, rpcs), (23, 23), "{body}");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_counted_by_grpc_code() {
    let redis = RedisServer::start().unwrap();
    let r = start_ready(&redis).await;
    let c = r.strict();
    c.stats("job").await.unwrap();
    let refused = c.add(vec![item("nslash", 0)]).await;
    assert!(matches!(refused, Err(ClientError::InvalidArgument(_))));
    let body = scrape(&r.admin).await;
    let add = "grpc_service=\"kjob.queue.v1.Queue\",grpc_method=\"Add\",grpc_type=\"unary\"";
    let stats = "grpc_service=\"kjob.queue.v1.Queue\",grpc_method=\"Stats\",grpc_type=\"unary\"";
    for want in [
        format!("grpc_server_started_total{{{add}}} 1"),
        format!("grpc_server_handled_total{{{add},grpc_code=\"InvalidArgument\"}} 1"),
        format!("grpc_server_handled_total{{{add},grpc_code=\"OK\"}} 0"),
        format!("grpc_server_handling_seconds_count{{{add}}} 1"),
        format!("grpc_server_handled_total{{{stats},grpc_code=\"OK\"}} 1"),
    ] {
        assert!(body.lines().any(|l| l == want), "missing {want} in\n{body}");
    }
    r.stop().await;
}

/// TakeApiTokens: invalid asks are INVALID_ARGUMENT and change nothing; a valid one gets the
/// burst, then waits; a 429 report halves the rate, and kjob-queue's budget metrics show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_tokens_are_validated_granted_and_slowed() {
    let redis = RedisServer::start().unwrap();
    let r = start_ready(&redis).await;
    let c = r.strict();
    let before = redis.snapshot().await.unwrap();
    for (ns, want, qps, burst) in [
        ("Team_A", 1, 20.0, 30),
        ("a/b", 1, 20.0, 30),
        ("a", 0, 20.0, 30),
        ("a", 101, 20.0, 30),
        ("a", 1, 0.0, 30),
        ("a", 1, f64::INFINITY, 30),
        ("a", 1, 20.0, 0),
        ("a", 1, 20.0, 100_001),
    ] {
        let err = c.take_api_tokens(ns, want, qps, burst, 0).await.unwrap_err();
        assert!(
            matches!(err, ClientError::InvalidArgument(_)),
            "{ns} {want} {qps} {burst}: {err:?}"
        );
    }
    assert_eq!(redis.snapshot().await.unwrap(), before, "a refused ask changed Redis");
    let g = c.take_api_tokens("a", 100, 20.0, 30, 0).await.unwrap();
    assert_eq!((g.granted, g.active_namespaces, g.rate, g.slowed), (30, 1, 20.0, false));
    assert!(g.wait_ms >= 1 && g.wait_ms <= 1000, "{g:?}");
    let g = c.take_api_tokens("", 1, 20.0, 30, 2).await.unwrap();
    assert!(g.slowed && (g.rate - 10.0).abs() < 0.1, "{g:?}");
    assert_eq!(g.active_namespaces, 2, "cluster-scoped requests share as one more namespace");
    let body = scrape(&r.admin).await;
    for want in [
        "kjob_queue_api_budget_slowdowns_total 1",
        "kjob_queue_api_budget_throttled_total 2",
        "kjob_queue_api_budget_granted_total 30",
    ] {
        assert!(body.lines().any(|l| l == want), "missing {want} in\n{body}");
    }
    r.stop().await;
}

/// SetNamespaceWeights: an invalid set is INVALID_ARGUMENT and changes nothing; a valid one
/// replaces the whole set (weight-1 entries dropped), so a namespace left out gets 1 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_weights_are_validated_and_replaced_whole() {
    use std::collections::HashMap;
    let redis = RedisServer::start().unwrap();
    let r = start_ready(&redis).await;
    let c = r.strict();
    let set = |v: &[(&str, u32)]| -> HashMap<String, u32> {
        v.iter().map(|(n, w)| (n.to_string(), *w)).collect()
    };
    let before = redis.snapshot().await.unwrap();
    for bad in
        [&[("a", 0)][..], &[("a", 1001)], &[("A", 2)], &[("a,b=3", 2)], &[("ok", 2), ("", 2)]]
    {
        let err = c.set_namespace_weights(set(bad)).await.unwrap_err();
        assert!(matches!(err, ClientError::InvalidArgument(_)), "{bad:?}: {err:?}");
    }
    assert_eq!(redis.snapshot().await.unwrap(), before, "a refused set changed Redis");
    let store = kjob_workqueue::Store::connect(&redis.url(), Default::default()).await.unwrap();
    assert_eq!(c.set_namespace_weights(set(&[("a", 3), ("b", 1), ("c", 1000)])).await.unwrap(), 2);
    let got = store.namespace_weights().await.unwrap();
    assert_eq!(got.into_iter().collect::<Vec<_>>(), [("a".into(), 3), ("c".into(), 1000)]);
    assert_eq!(c.set_namespace_weights(set(&[("c", 2)])).await.unwrap(), 1);
    let got = store.namespace_weights().await.unwrap();
    assert_eq!(got.into_iter().collect::<Vec<_>>(), [("c".into(), 2)], "a is back to 1");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_v1alpha_and_v1_clients() {
    use tonic_reflection::pb::{v1, v1alpha};
    let redis = RedisServer::start().unwrap();
    let r = start_ready(&redis).await;
    let channel =
        tonic::transport::Endpoint::from_shared(r.url.clone()).unwrap().connect().await.unwrap();

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = alpha.server_reflection_info(futures::stream::iter([req])).await.unwrap();
    let answer = answers.get_mut().message().await.unwrap().expect("a v1alpha answer");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("unexpected v1alpha answer {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["kjob.queue.v1.Queue", "kjob.queue.v1.JobState", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "v1alpha lists {names:?}");
    }

    let mut v1 = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::FileContainingSymbol(
            "kjob.queue.v1.Queue".into(),
        )),
    };
    let mut answers = v1.server_reflection_info(futures::stream::iter([req])).await.unwrap();
    let answer = answers.get_mut().message().await.unwrap().expect("a v1 answer");
    assert!(
        matches!(
            answer.message_response,
            Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
        ),
        "{answer:?}"
    );
    r.stop().await;
}

/// The bug of issue 17: a gRPC server that stops must not leave the service running (and
/// ready). A listening socket shut down under the server makes every accept fail with EINVAL:
/// the server ends, the service goes not ready, drains, and `run` returns an error naming the
/// server (the binary's `main` returns it: exit status 1), after an error log line saying which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_listener_ends_the_service_with_an_error_naming_the_server() {
    let redis = RedisServer::start().unwrap();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    // The same socket, held by the test: shutting it down breaks the server's listener.
    let handle = std_listener.try_clone().unwrap();
    let listener = TcpListener::from_std(std_listener).unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let config = QueueConfig::new(redis.url(), Security::InsecureNoAuth);
    let listeners = Listeners { grpc: listener, admin: Some(admin) };
    let logs = Logs::default();
    let subscriber = logs.subscriber();
    let task = tokio::spawn(
        kjob_queue::run(listeners, config, shutdown.clone()).with_subscriber(subscriber),
    );
    wait_ready(&admin_url).await;
    let c = QueueClient::connect_lazy(&format!("http://{addr}")).unwrap();
    c.stats("job").await.unwrap();

    socket2::SockRef::from(&handle).shutdown(std::net::Shutdown::Read).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the service kept running on a broken listener")
        .unwrap();
    let err = ended.expect_err("a service whose server stopped must fail");
    assert!(err.to_string().contains("vital task \"gRPC server\" ended"), "{err:#}");
    assert!(shutdown.is_cancelled(), "the other tasks were asked to drain");
    let text = logs.text();
    let line = text.lines().find(|l| l.contains("vital task ended")).unwrap_or_else(|| {
        panic!("no log line names the task:\n{text}");
    });
    assert!(line.contains("ERROR") && line.contains("task=\"gRPC server\""), "{line}");
    assert!(text.contains("the listener cannot accept any more"), "{text}");
    // The admin port is gone with the service, so nothing reports it ready any more.
    assert!(reqwest::get(format!("{admin_url}/readyz")).await.is_err());
}

/// A Lease that waits with views and is handed a key by an Add gets the view that Add's script
/// read after its own writes (the pod it wrote is there), and the hand-off is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_hands_a_waiting_lease_the_view_it_wrote() {
    hand_off_a_view(false).await;
}

/// The same for a lessee that caches views decoded (kjob-worker's default): the hand-off brings
/// the pods' names, the view's version, count and epoch token, as a one-page read does, so the
/// service reads nothing more for it (Redis ran no HSCAN, the paged read's command).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caching_lessee_keeps_the_view_of_its_hand_off() {
    hand_off_a_view(true).await;
}

async fn hand_off_a_view(caching: bool) {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    let c = r.strict();
    let http = reqwest::Client::new();
    let mut direct =
        redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    assert!(c.cache_session("s1", v1::CacheSessionPhase::Begin).await.unwrap());
    let write = |key: &str, only: bool, cache: Vec<ViewOp<Vec<u8>>>| AddItem {
        queue: "job".into(),
        key: key.into(),
        observe_only: only,
        cache_session: "s1".into(),
        cache,
        ..Default::default()
    };
    let snapshot = |key: &str| {
        let ops = vec![
            cache_op(v1::CacheOpKind::Reset, "u1", b"", ""),
            cache_op(v1::CacheOpKind::Job, "u1", b"{\"job\":1}", "7"),
            cache_op(v1::CacheOpKind::Trust, "", b"", ""),
        ];
        write(key, true, ops)
    };
    c.add((0..5).map(|i| snapshot(&format!("ns/h{i}"))).collect()).await.unwrap();
    assert!(c.cache_session("s1", v1::CacheSessionPhase::Commit).await.unwrap());
    let handed = async || {
        metric(&http, &r.admin, "kjob_queue_handoff_views_total{name=\"job\"}").await.unwrap()
    };
    assert_eq!(handed().await, 0.0);
    // The Add must find the Lease waiting (past its first LEASE): a few tries, each checked.
    for i in 0..5 {
        let key = format!("ns/h{i}");
        let waiting = {
            let c = c.clone();
            tokio::spawn(async move {
                let call = LeaseCall {
                    queue: "job",
                    max_items: 1,
                    lease: LEASE,
                    wait: Duration::from_secs(10),
                    worker_id: "w",
                    records: Some(&["backoff"]),
                    cached: if caching { Some(&[]) } else { None },
                };
                c.lease_finishing(call, Vec::new()).await.map(|(got, _)| got)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut direct).await.unwrap();
        let pod = cache_op(v1::CacheOpKind::Pod, "p", b"{\"pod\":2}", "");
        c.add(vec![write(&key, false, vec![pod])]).await.unwrap();
        let got = waiting.await.unwrap().unwrap();
        assert_eq!(got.len(), 1);
        let v = got[0].view.as_ref().expect("a view with every Job key");
        assert!(v.trusted, "{v:?}");
        assert_eq!((got[0].key.as_str(), v.job_uid.as_str()), (key.as_str(), "u1"));
        assert_eq!(v.pods, vec![b"{\"pod\":2}".to_vec()], "the Add's own write is in the view");
        let e = v.expectations.as_ref().unwrap();
        assert!(!e.exists && e.satisfied, "{e:?}");
        if handed().await != 1.0 {
            continue;
        }
        let stats: String =
            redis::cmd("INFO").arg("commandstats").query_async(&mut direct).await.unwrap();
        if caching {
            assert_eq!(v.pod_names, ["p"], "{v:?}");
            assert_eq!(v.pod_count, Some(1));
            assert!(v.version > 0 && !v.epoch.is_empty(), "{v:?}");
            assert!(v.next_page.is_empty() && !v.delta, "{v:?}");
            assert!(!stats.contains("cmdstat_hscan"), "the view was read again:\n{stats}");
        } else {
            assert!(v.pod_names.is_empty() && v.epoch.is_empty(), "{v:?}");
        }
        r.stop().await;
        return;
    }
    panic!("no Add handed its key to the waiting Lease in five tries");
}
