//! The watcher end to end: kjob-sim (in process) → kjob-watcher → kjob-queue (process) → Redis.
//!
//! Needs `redis-server` and a built `kjob-queue` (`cargo build -p kjob-queue`).

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_queue_client::{JobExpectations, Outcome, QueueClient, v1};
use kjob_sim::testing::TestSim;
use kjob_testkit::{ChildGuard, RedisServer, free_port};
use kjob_watcher::WatcherConfig;
use kjob_watcher::leader::LeaseConfig;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const LEASE_NS: &str = "kube-node-lease";
const CONTROLLER: &str = kjob_core::DEFAULT_CONTROLLER_NAME;

// ------------------------------------------------------------------ harness

fn start_queue(redis: &RedisServer, port: u16) -> ChildGuard {
    kjob_testkit::process::start_queue(&redis.url(), port).expect("kjob-queue (cargo build --bins)")
}

struct Stack {
    sim: TestSim,
    redis: RedisServer,
    queue_port: u16,
    queue_proc: ChildGuard,
    queue: QueueClient,
}

impl Stack {
    async fn start() -> Self {
        let sim = TestSim::start(Default::default()).await;
        let redis = RedisServer::start().unwrap();
        let queue_port = free_port();
        let queue_proc = start_queue(&redis, queue_port);
        let queue = QueueClient::connect_lazy(&queue_url(queue_port)).unwrap();
        Self { sim, redis, queue_port, queue_proc, queue }
    }
}

/// A stack with an in-process watcher leading it, a client of its kjob-sim, and the managed Job
/// `name` created after the watcher started (every watched test begins so).
async fn watched_job(name: &str) -> (Stack, kube::Client, InProcWatcher, Job) {
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let w = InProcWatcher::start(&stack).await;
    let job = create_job(&client, name).await;
    (stack, client, w, job)
}

fn queue_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn lease_cfg(identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: "kjob-watcher".into(),
        namespace: LEASE_NS.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
    }
}

struct InProcWatcher {
    admin: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl InProcWatcher {
    async fn start(stack: &Stack) -> Self {
        Self::start_with_resync(stack, Duration::from_secs(600)).await
    }

    async fn start_with_resync(stack: &Stack, resync_period: Duration) -> Self {
        let config = WatcherConfig {
            queue_url: queue_url(stack.queue_port),
            queue_tls: kjob_queue_client::QueueTlsArgs::insecure(),
            view_key: Default::default(),
            controller_name: CONTROLLER.into(),
            manage_all: false,
            namespace: None,
            lease: lease_cfg("inproc"),
            resync_period,
            watch_encoding: kjob_watcher::WatchEncoding::Protobuf,
            kube: kjob_svc::KubeClientArgs {
                kubeconfig: Some(stack.sim.kubeconfig_path().to_path_buf()),
                kube_timeout_seconds: 30,
                kube_http1_only: false,
            },
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = listener.local_addr().unwrap();
        let listeners = kjob_watcher::Listeners { admin: Some(listener) };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kjob_watcher::run(listeners, config, shutdown.clone()));
        let w = Self { admin, shutdown, task };
        w.wait_ready().await;
        w
    }

    async fn wait_ready(&self) {
        let url = format!("http://{}/readyz", self.admin);
        let http = reqwest::Client::new();
        poll("watcher ready", Duration::from_secs(15), || {
            let req = http.get(&url).timeout(Duration::from_secs(1)).send();
            async move { req.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
    }

    /// Waits up to `limit` until the series `line_prefix` reaches `at_least`.
    async fn wait_metric(&self, what: &str, limit: Duration, line_prefix: &str, at_least: f64) {
        poll(what, limit, || async { self.metric(line_prefix).await >= at_least }).await;
    }

    async fn metric(&self, line_prefix: &str) -> f64 {
        let body = reqwest::get(format!("http://{}/metrics", self.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        body.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

async fn poll<F, Fut>(what: &str, limit: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if cond().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create_job(client: &kube::Client, name: &str) -> Job {
    create_job_managed_by(client, name, CONTROLLER).await
}

async fn create_job_managed_by(client: &kube::Client, name: &str, managed_by: &str) -> Job {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "managedBy": managed_by,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]
            }}
        }
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), NS).create(&PostParams::default(), &job).await.unwrap()
}

async fn create_pod(client: &kube::Client, name: &str, job: &Job, finalizer: bool) -> Pod {
    let labels = job
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    let finalizers: Vec<&str> =
        if finalizer { vec![kjob_core::JOB_TRACKING_FINALIZER] } else { vec![] };
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": labels,
            "finalizers": finalizers,
            "ownerReferences": [kjob_reconcile::template::controller_ref(job)]
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS).create(&PostParams::default(), &pod).await.unwrap()
}

fn key(name: &str) -> String {
    format!("{NS}/{name}")
}

fn uid(job: &Job) -> String {
    job.metadata.uid.clone().unwrap()
}

/// Leases and forgets everything ready on the job queue, so later checks start from empty.
async fn drain(q: &QueueClient) -> Vec<String> {
    let items =
        q.lease("job", 1000, Duration::from_secs(30), Duration::ZERO, "test").await.unwrap();
    let mut keys = vec![];
    for it in items {
        q.done("job", &it.key, &it.lease_id, Outcome::Forget).await.unwrap();
        keys.push(it.key);
    }
    keys
}

async fn key_state(q: &QueueClient, k: &str) -> v1::KeyState {
    q.inspect("job", vec![k.to_string()]).await.unwrap().keys.remove(0)
}

/// Waits (up to `limit`, as [`poll`]) until the state of Job `name`'s key satisfies `ok`.
async fn wait_key(
    stack: &Stack,
    what: &str,
    name: &str,
    limit: Duration,
    ok: impl Fn(&str) -> bool,
) -> Duration {
    let k = key(name);
    poll(what, limit, || async { ok(&key_state(&stack.queue, &k).await.state) }).await
}

async fn expectations(q: &QueueClient, k: &str, job_uid: &str) -> JobExpectations {
    q.get_expectations(k, job_uid).await.unwrap()
}

/// Waits until the Job's key has been enqueued (by the takeover resync or the add event) and
/// takes it out again.
async fn settle(stack: &Stack, name: &str) {
    let k = key(name);
    wait_key(stack, "job key enqueued", name, Duration::from_secs(10), |s| s != "absent").await;
    // Ready immediately (delay 0): lease it out and forget it.
    poll("job key drained", Duration::from_secs(5), || async {
        drain(&stack.queue).await;
        key_state(&stack.queue, &k).await.state == "absent"
    })
    .await;
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_creation_is_observed_once_and_enqueued_within_the_batch_window() {
    let (stack, client, w, job) = watched_job("j1").await;
    settle(&stack, "j1").await;

    stack.queue.set_expectations(&key("j1"), &uid(&job), 1, 0).await.unwrap();
    let created_at = Instant::now();
    create_pod(&client, "j1-a", &job, true).await;
    poll("creation observed", Duration::from_secs(5), || async {
        expectations(&stack.queue, &key("j1"), &uid(&job)).await.satisfied
    })
    .await;
    let st = key_state(&stack.queue, &key("j1")).await;
    assert!(st.state == "delayed" || st.state == "ready", "{st:?}");
    // Ready one batch period after the event, not before.
    let took = wait_key(&stack, "key ready", "j1", Duration::from_secs(5), |s| s == "ready").await;
    assert!(created_at.elapsed() >= Duration::from_millis(900), "ready too early: {took:?}");
    let e = expectations(&stack.queue, &key("j1"), &uid(&job)).await;
    assert_eq!((e.add, e.del), (0, 0), "exactly one creation observation: {e:?}");
    assert_eq!(drain(&stack.queue).await, vec![key("j1")]);
    assert!(w.metric("kjob_watcher_batches_total").await >= 1.0);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pod_updates_makes_one_queue_entry() {
    let (stack, client, w, job) = watched_job("burst").await;
    create_pod(&client, "burst-a", &job, true).await;
    settle(&stack, "burst").await;
    poll("pod creation sync drained", Duration::from_secs(5), || async {
        drain(&stack.queue).await;
        key_state(&stack.queue, &key("burst")).await.state == "absent"
    })
    .await;

    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    for i in 0..100 {
        let patch = json!({"metadata": {"annotations": {"n": i.to_string()}}});
        pods.patch("burst-a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }
    w.wait_metric(
        "updates handled",
        Duration::from_secs(10),
        "kjob_watcher_events_total{kind=\"pod\",type=\"update\"}",
        100.0,
    )
    .await;
    wait_key(&stack, "key ready", "burst", Duration::from_secs(5), |s| s == "ready").await;
    let stats = stack.queue.stats("job").await.unwrap();
    assert_eq!((stats.ready, stats.delayed), (1, 0), "{stats:?}");
    assert_eq!(drain(&stack.queue).await, vec![key("burst")]);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_watch_relists_and_synthesizes_deletes() {
    let (stack, client, w, job) = watched_job("cut").await;
    create_pod(&client, "cut-a", &job, false).await;
    // The pod's creation observation has landed (its batch lingers for company), so the
    // expectations set below are not lowered by it afterwards.
    w.wait_metric(
        "creation observed",
        Duration::from_secs(5),
        "kjob_watcher_observations_total{kind=\"creation\"}",
        1.0,
    )
    .await;
    settle(&stack, "cut").await;
    stack.queue.set_expectations(&key("cut"), &uid(&job), 0, 1).await.unwrap();

    // Slow reads keep the watcher from re-watching before the history is gone.
    let http = reqwest::Client::new();
    let faults = |ms: u64| {
        http.post(format!("{}/sim/faults", stack.sim.url()))
            .json(&json!({"readLatencyMs": ms}))
            .send()
    };
    assert!(faults(1500).await.unwrap().status().is_success());
    stack.sim.close_watches();
    let dp = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    Api::<Pod>::namespaced(client.clone(), NS).delete("cut-a", &dp).await.unwrap();
    stack.sim.compact();
    assert!(faults(0).await.unwrap().status().is_success());

    w.wait_metric(
        "tombstone",
        Duration::from_secs(15),
        "kjob_watcher_events_total{kind=\"pod\",type=\"tombstone\"}",
        1.0,
    )
    .await;
    poll("deletion observed", Duration::from_secs(5), || async {
        expectations(&stack.queue, &key("cut"), &uid(&job)).await.satisfied
    })
    .await;
    let e = expectations(&stack.queue, &key("cut"), &uid(&job)).await;
    assert_eq!((e.add, e.del), (0, 0), "{e:?}");
    assert!(w.metric("kjob_watcher_watch_restarts_total{kind=\"pod\"}").await >= 1.0);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_while_the_queue_is_down() {
    let (mut stack, client, w, job) = watched_job("down").await;
    settle(&stack, "down").await;
    stack.queue.set_expectations(&key("down"), &uid(&job), 3, 0).await.unwrap();

    stack.queue_proc.kill();
    for p in ["down-a", "down-b", "down-c"] {
        create_pod(&client, p, &job, true).await;
    }
    w.wait_metric("send errors", Duration::from_secs(5), "kjob_watcher_send_errors_total", 1.0)
        .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    stack.queue_proc = start_queue(&stack.redis, stack.queue_port);

    poll("creations observed after the queue came back", Duration::from_secs(10), || async {
        stack.queue.get_expectations(&key("down"), &uid(&job)).await.is_ok_and(|e| e.satisfied)
    })
    .await;
    let e = expectations(&stack.queue, &key("down"), &uid(&job)).await;
    assert_eq!((e.add, e.del), (0, 0), "{e:?}");
    wait_key(&stack, "key ready", "down", Duration::from_secs(5), |s| s == "ready").await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_jobs_are_never_enqueued_and_managed_ones_are_resynced() {
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let resync = Duration::from_secs(1);
    let w = InProcWatcher::start_with_resync(&stack, resync).await;
    let foreign = create_job_managed_by(&client, "theirs", "example.com/other").await;
    create_pod(&client, "theirs-a", &foreign, true).await;
    create_job(&client, "ours").await;
    settle(&stack, "ours").await;
    // The periodic resync puts the managed Job back; the foreign one never shows up.
    let what = "resync re-enqueues the managed job";
    wait_key(&stack, what, "ours", Duration::from_secs(5), |s| s != "absent").await;
    assert!(
        w.metric("kjob_watcher_events_total{kind=\"pod\",type=\"add\"}").await >= 1.0,
        "the foreign pod was seen"
    );
    assert_eq!(key_state(&stack.queue, &key("theirs")).await.state, "absent");
    let orphans = stack.queue.stats("orphan-pod").await.unwrap();
    assert_eq!(orphans.ready + orphans.delayed, 0, "{orphans:?}");
    w.stop().await;
}

/// A Job deleted while no watcher led leaves its pods Terminating, kept by the tracking
/// finalizer. The watcher that then starts leading sends them to the orphan queue (upstream's
/// initial list goes through `addPod`, whose deletePod path enqueues the orphan), where the
/// worker removes the finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_job_deleted_while_no_watcher_led_reach_the_orphan_queue() {
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let job = create_job(&client, "gone").await;
    create_pod(&client, "gone-a", &job, true).await;
    create_pod(&client, "gone-b", &job, false).await;
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    for name in ["gone-a", "gone-b"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    Api::<Job>::namespaced(client.clone(), NS)
        .delete("gone", &DeleteParams::background())
        .await
        .unwrap();
    let left = pods.get("gone-a").await.unwrap();
    assert!(left.metadata.deletion_timestamp.is_some(), "kept Terminating by its finalizer");

    let w = InProcWatcher::start(&stack).await;
    let orphan_state = |name: &str| {
        let q = stack.queue.clone();
        let k = key(name);
        async move { q.inspect("orphan-pod", vec![k]).await.unwrap().keys.remove(0).state }
    };
    poll("the Terminating pod on the orphan queue", Duration::from_secs(10), || async {
        orphan_state("gone-a").await != "absent"
    })
    .await;
    let keys = leased_orphan_keys(&stack).await;
    assert_eq!(keys, [key("gone-a")], "only the pod that still has the finalizer");
    w.stop().await;
}

/// Leases every ready key of the orphan queue, as the orphan worker would.
async fn leased_orphan_keys(stack: &Stack) -> Vec<String> {
    let items = stack
        .queue
        .lease("orphan-pod", 100, Duration::from_secs(30), Duration::ZERO, "test")
        .await
        .unwrap();
    items.into_iter().map(|i| i.key).collect()
}

fn spawn_watcher_process(stack: &Stack, identity: &str, admin_port: u16) -> ChildGuard {
    let mut cmd = Command::new(
        kjob_testkit::bin_path("kjob-watcher").expect("make build builds kjob-watcher"),
    );
    cmd.arg("--queue-url")
        .arg(queue_url(stack.queue_port))
        .arg("--insecure-no-auth")
        .arg("--admin-listen")
        .arg(format!("127.0.0.1:{admin_port}"))
        .arg("--kubeconfig")
        .arg(stack.sim.kubeconfig_path())
        .arg("--lease-namespace")
        .arg(LEASE_NS)
        .arg("--identity")
        .arg(identity)
        .args(["--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "300ms"])
        .stdout(std::process::Stdio::null());
    ChildGuard::spawn(identity, &mut cmd).unwrap()
}

async fn lease_holder(client: &kube::Client) -> Option<String> {
    let api =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), LEASE_NS);
    api.get_opt("kjob-watcher")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_takes_over_within_the_lease_duration_without_double_observations() {
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let mut procs = [
        spawn_watcher_process(&stack, "w1", free_port()),
        spawn_watcher_process(&stack, "w2", free_port()),
    ];
    poll("a leader", Duration::from_secs(15), || async { lease_holder(&client).await.is_some() })
        .await;
    let leader = lease_holder(&client).await.unwrap();
    let job = create_job(&client, "fo").await;
    settle(&stack, "fo").await;

    stack.queue.set_expectations(&key("fo"), &uid(&job), 1, 0).await.unwrap();
    create_pod(&client, "fo-a", &job, true).await;
    poll("creation observed by the first leader", Duration::from_secs(5), || async {
        expectations(&stack.queue, &key("fo"), &uid(&job)).await.satisfied
    })
    .await;

    let idx = if leader == "w1" { 0 } else { 1 };
    let survivor = if leader == "w1" { "w2" } else { "w1" };
    procs[idx].kill();
    let took = poll("the standby takes over", Duration::from_secs(10), || async {
        lease_holder(&client).await.as_deref() == Some(survivor)
    })
    .await;
    assert!(took <= Duration::from_secs(3) + Duration::from_millis(1500), "takeover took {took:?}");
    // The new leader enqueues every Job once it leads.
    wait_key(&stack, "takeover resync", "fo", Duration::from_secs(10), |s| s != "absent").await;
    let e = expectations(&stack.queue, &key("fo"), &uid(&job)).await;
    assert_eq!(e.add, 0, "the new leader observed an old creation again: {e:?}");

    stack.queue.set_expectations(&key("fo"), &uid(&job), 1, 0).await.unwrap();
    create_pod(&client, "fo-b", &job, true).await;
    poll("creation observed by the new leader", Duration::from_secs(5), || async {
        expectations(&stack.queue, &key("fo"), &uid(&job)).await.satisfied
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = expectations(&stack.queue, &key("fo"), &uid(&job)).await;
    assert_eq!((e.add, e.del), (0, 0), "{e:?}");
    assert!(!procs[1 - idx].has_exited(), "the survivor died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_lease_and_exits_cleanly() {
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let mut w = spawn_watcher_process(&stack, "solo", free_port());
    poll("solo leads", Duration::from_secs(15), || async {
        lease_holder(&client).await.as_deref() == Some("solo")
    })
    .await;
    let status = tokio::task::spawn_blocking(move || w.terminate(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("kjob-watcher did not exit after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert_eq!(lease_holder(&client).await, None, "the lease was not released");
}

/// A Job that finishes while the watcher's cache still shows its pods' tracking finalizers (the
/// pod watch runs behind under load): the backup cleanup's orphan entries wait for the pods' own
/// finalizer removals, and only the pod that kept its finalizer reaches the orphan queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_jobs_orphan_entries_wait_for_the_pods_own_finalizer_removals() {
    let (stack, client, w, job) = watched_job("fin").await;
    create_pod(&client, "fin-a", &job, true).await;
    create_pod(&client, "fin-b", &job, true).await;
    w.wait_metric("both pods seen", Duration::from_secs(10), POD_ADDS, 2.0).await;

    let now = jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "startTime": now, "completionTime": now, "succeeded": 1,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods", "lastProbeTime": now,
             "lastTransitionTime": now},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods", "lastProbeTime": now,
             "lastTransitionTime": now}
        ]
    }});
    let job_updates = w.metric(JOB_UPDATES).await;
    Api::<Job>::namespaced(client.clone(), NS)
        .patch_status("fin", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // fin-a loses its finalizer just after the watcher has seen the Job finish (its two watches
    // may deliver in either order under load), as the worker's own removal arrives when the pod
    // watch lags; fin-b keeps it.
    w.wait_metric("the Job's finish seen", Duration::from_secs(10), JOB_UPDATES, job_updates + 1.0)
        .await;
    Api::<Pod>::namespaced(client.clone(), NS)
        .patch(
            "fin-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();

    let rechecks =
        |outcome: &str| format!("kjob_watcher_orphan_rechecks_total{{outcome=\"{outcome}\"}}");
    w.wait_metric("both entries re-checked", Duration::from_secs(10), &rechecks("sent"), 1.0).await;
    assert_eq!(w.metric(&rechecks("settled")).await, 1.0, "fin-a needed no cleanup");
    let keys = leased_orphan_keys(&stack).await;
    assert_eq!(keys, [key("fin-b")], "only the pod that kept its finalizer");
    w.stop().await;
}

const POD_ADDS: &str = "kjob_watcher_events_total{kind=\"pod\",type=\"add\"}";
const JOB_UPDATES: &str = "kjob_watcher_events_total{kind=\"job\",type=\"update\"}";

/// The weights of the fair lease follow the Namespaces' `kjob.io/queue-weight` annotations:
/// listed at start, changed, removed, and an invalid value counted as 1; kjob-queue keeps the
/// set the watcher sends in Redis, where every replica's lease scripts read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_weights_follow_the_annotations() {
    use k8s_openapi::api::core::v1::Namespace;
    use std::collections::BTreeMap;
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let annotated = |name: &str, weight: Option<&str>| -> Namespace {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": weight
                    .map(|w| json!({ kjob_core::QUEUE_WEIGHT_ANNOTATION: w }))
                    .unwrap_or(json!({})),
            }
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    namespaces.create(&pp, &annotated("tenant-a", Some("3"))).await.unwrap();
    namespaces.create(&pp, &annotated("tenant-b", Some("lots"))).await.unwrap();
    let store =
        kjob_workqueue::Store::connect(&stack.redis.url(), Default::default()).await.unwrap();
    let w = InProcWatcher::start(&stack).await;
    let want = |v: &[(&str, u32)]| -> BTreeMap<String, u32> {
        v.iter().map(|(n, w)| (n.to_string(), *w)).collect()
    };
    let wait_for = |expected: BTreeMap<String, u32>, what: &'static str| {
        let store = store.clone();
        async move {
            poll(what, Duration::from_secs(10), || {
                let (store, expected) = (store.clone(), expected.clone());
                async move { store.namespace_weights().await.unwrap() == expected }
            })
            .await;
        }
    };
    wait_for(want(&[("tenant-a", 3)]), "the listed weights (tenant-b's invalid: 1)").await;
    namespaces.create(&pp, &annotated("tenant-c", Some("2"))).await.unwrap();
    let set = |w: serde_json::Value| {
        Patch::Merge(
            json!({ "metadata": { "annotations": { kjob_core::QUEUE_WEIGHT_ANNOTATION: w } } }),
        )
    };
    namespaces.patch("tenant-b", &PatchParams::default(), &set(json!("7"))).await.unwrap();
    wait_for(want(&[("tenant-a", 3), ("tenant-b", 7), ("tenant-c", 2)]), "added, fixed").await;
    namespaces.patch("tenant-a", &PatchParams::default(), &set(json!(null))).await.unwrap();
    namespaces.patch("tenant-c", &PatchParams::default(), &set(json!("0"))).await.unwrap();
    wait_for(want(&[("tenant-b", 7)]), "removed, invalid").await;
    w.stop().await;
}

/// Every Job enqueue carries its pods' priority as the PriorityClasses say (the template's
/// `priority`, else its class's value, else the global default's, else 0), and the queue leases
/// a namespace's keys in that order; a Job created after a class changed takes the new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_enqueues_carry_their_pods_priority() {
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let stack = Stack::start().await;
    let client = stack.sim.client();
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let class = |name: &str, value: i32, global: bool| -> PriorityClass {
        serde_json::from_value(json!({
            "metadata": {"name": name}, "value": value, "globalDefault": global
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    classes.create(&pp, &class("batch-high", 1000, false)).await.unwrap();
    let w = InProcWatcher::start(&stack).await;
    let job = |name: &str, pod: serde_json::Value| -> Job {
        let mut spec =
            json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]});
        spec.as_object_mut().unwrap().extend(pod.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"managedBy": CONTROLLER, "template": {"spec": spec}}
        }))
        .unwrap()
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    // Created in this order, one Add each: without priorities they would be leased so.
    for (name, pod) in [
        ("plain", json!({})),
        ("critical", json!({"priorityClassName": "system-cluster-critical"})),
        ("high", json!({"priorityClassName": "batch-high"})),
        ("explicit", json!({"priority": 5})),
    ] {
        jobs.create(&pp, &job(name, pod)).await.unwrap();
        wait_key(&stack, "enqueued", name, Duration::from_secs(10), |s| s == "ready").await;
    }
    let store =
        kjob_workqueue::Store::connect(&stack.redis.url(), Default::default()).await.unwrap();
    let priority = |name: &str| {
        let store = store.clone();
        let k = key(name);
        async move { store.explain("job", &k).await.unwrap().unwrap().priority }
    };
    assert_eq!(priority("plain").await, 0);
    assert_eq!(priority("critical").await, 2_000_000_000);
    assert_eq!(priority("high").await, 1000);
    assert_eq!(priority("explicit").await, 5);
    assert_eq!(drain(&stack.queue).await, ["critical", "high", "explicit", "plain"].map(key));
    // A global default reaches the Jobs that name no class with their next enqueue.
    classes.create(&pp, &class("batch-default", 100, true)).await.unwrap();
    jobs.create(&pp, &job("later", json!({}))).await.unwrap();
    wait_key(&stack, "enqueued", "later", Duration::from_secs(10), |s| s == "ready").await;
    // The class and the Job come on two watches: should the Job's come first, its next update
    // (each one an enqueue) carries the default.
    let mut touch = 0;
    poll("the global default's priority", Duration::from_secs(10), || {
        touch += 1;
        let (jobs, priority) = (jobs.clone(), priority("later"));
        async move {
            if priority.await == 100 {
                return true;
            }
            let patch =
                Patch::Merge(json!({"metadata": {"annotations": {"touch": touch.to_string()}}}));
            jobs.patch("later", &PatchParams::default(), &patch).await.unwrap();
            false
        }
    })
    .await;
    w.stop().await;
}
