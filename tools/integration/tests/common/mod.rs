//! Shared harness of the worker's integration tests: an in-process kjob-sim (kubelet off), a
//! real redis-server with the kjob-queue binary, workers run in-process, and a test "kubelet +
//! watcher" that plays pod phases and feeds expectation observations to the queue.

#![allow(dead_code)]

pub mod logs;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kjob_core::{Observation, ObservationKind};
use kjob_queue_client::{AddItem, QueueClient};
use kjob_sim::testing::TestSim;
use kjob_testkit::{ChildGuard, RedisServer, free_port};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The scheduler name of the test pods: no scheduler runs under it, so only the Driver moves them.
pub const TEST_SCHEDULER: &str = "kjob-test-driver";

/// Whether `p` still carries the Job tracking finalizer.
pub fn has_finalizer(p: &Pod) -> bool {
    p.metadata.finalizers.iter().flatten().any(|f| f == kjob_core::JOB_TRACKING_FINALIZER)
}

/// Creates a namespace.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .unwrap();
    api.create(&PostParams::default(), &ns).await.expect("create namespace");
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A kjob-queue process over its own redis-server.
pub struct QueueService {
    /// gRPC URL.
    pub url: String,
    _redis: RedisServer,
    _proc: ChildGuard,
}

impl QueueService {
    /// Starts redis-server and kjob-queue on free ports.
    pub fn start() -> QueueService {
        let redis = RedisServer::start().expect("redis-server");
        let port = free_port();
        let proc = kjob_testkit::process::start_queue(&redis.url(), port)
            .expect("kjob-queue (cargo build --bins)");
        QueueService { url: format!("http://127.0.0.1:{port}"), _redis: redis, _proc: proc }
    }

    /// A client of it.
    pub fn client(&self) -> QueueClient {
        QueueClient::connect_lazy(&self.url).unwrap()
    }
}

/// A worker running in-process.
pub struct WorkerHandle {
    /// Cancelled to drain it.
    pub shutdown: CancellationToken,
    /// The run task.
    pub task: JoinHandle<anyhow::Result<()>>,
    /// Its admin port.
    pub admin_port: u16,
}

impl WorkerHandle {
    /// Starts `kjob_worker::run` against the simulator and the queue.
    pub fn start(sim: &TestSim, queue_url: &str, id: &str, lease: Duration) -> WorkerHandle {
        Self::start_with(sim, queue_url, id, lease, Duration::from_secs(5))
    }

    /// Like [`WorkerHandle::start`] with a shutdown grace.
    pub fn start_with(
        sim: &TestSim,
        queue_url: &str,
        id: &str,
        lease: Duration,
        shutdown_grace: Duration,
    ) -> WorkerHandle {
        Self::start_on(sim.kubeconfig_path(), queue_url, id, lease, shutdown_grace)
    }

    /// Starts `kjob_worker::run` on `server` (as the worker's ServiceAccount) and `queue`.
    pub fn on(
        server: &kjob_testkit::server::TestServer,
        queue: &QueueService,
        id: &str,
        lease: Duration,
        shutdown_grace: Duration,
    ) -> WorkerHandle {
        Self::start_on(&server.worker_kubeconfig(), &queue.url, id, lease, shutdown_grace)
    }

    /// Starts `kjob_worker::run` on any API server (`kubeconfig`) and the queue.
    pub fn start_on(
        kubeconfig: &std::path::Path,
        queue_url: &str,
        id: &str,
        lease: Duration,
        shutdown_grace: Duration,
    ) -> WorkerHandle {
        let config = kjob_worker::WorkerConfig {
            queue_url: queue_url.to_string(),
            queue_tls: kjob_queue_client::QueueTlsArgs::insecure(),
            view_key: Default::default(),
            concurrency: 4,
            view_cache_pods: kjob_worker::view_cache::DEFAULT_VIEW_CACHE_PODS,
            lease_duration: lease,
            kube_qps: 500.0,
            kube_burst: 1000,
            api_qps_total: None,
            api_burst_total: None,
            controller_name: kjob_core::DEFAULT_CONTROLLER_NAME.to_string(),
            manage_all_jobs: false,
            shutdown_grace,
            worker_id: Some(id.to_string()),
            kube: kjob_svc::KubeClientArgs {
                kubeconfig: Some(kubeconfig.to_path_buf()),
                kube_timeout_seconds: 10,
                kube_http1_only: false,
            },
        };
        let admin = std::net::TcpListener::bind("127.0.0.1:0").expect("admin port");
        admin.set_nonblocking(true).unwrap();
        let admin_port = admin.local_addr().unwrap().port();
        let admin = tokio::net::TcpListener::from_std(admin).unwrap();
        let listeners = kjob_worker::Listeners { admin: Some(admin) };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kjob_worker::run(listeners, config, shutdown.clone()));
        WorkerHandle { shutdown, task, admin_port }
    }

    /// Drains the worker and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("worker task").expect("worker run");
    }

    /// GETs a path of its admin port.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.admin_port);
        match reqwest::get(&url).await {
            Ok(r) => {
                let code = r.status().as_u16();
                (code, r.text().await.unwrap_or_default())
            }
            Err(e) => (0, e.to_string()),
        }
    }

    /// `job_controller_job_syncs_total` summed over its labels (0 while unreachable).
    pub async fn job_syncs(&self) -> f64 {
        let (_, text) = self.admin_get("/metrics").await;
        text.lines()
            .filter(|l| l.starts_with("job_controller_job_syncs_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Kills it without a drain (a crash: no Done, no more writes).
    pub fn crash(self) {
        self.task.abort();
    }
}

/// How the test kubelet finishes a pod.
#[derive(Debug, Clone)]
pub enum Fate {
    /// Stay Running (Ready).
    Run,
    /// Succeed.
    Succeed,
    /// Fail with this exit code (container `main`).
    Fail(i32),
    /// Fail with a pod condition `DisruptionTarget=True`.
    Disrupt,
}

/// The test's kubelet and watcher: sets pod phases through `/status`, terminates pods being
/// deleted, and feeds creation/deletion/finalizer observations plus a Job enqueue to the queue.
pub struct Driver {
    pub client: kube::Client,
    pub queue: QueueClient,
    pub ns: String,
    pub job: String,
    seen: BTreeSet<String>,
    deleting: BTreeSet<String>,
    with_finalizer: BTreeSet<String>,
    finished: BTreeSet<String>,
    /// Every pod UID ever seen, with its name.
    pub all_pods: BTreeMap<String, String>,
    /// Leave pods being deleted running (a slow graceful termination) while set.
    pub hold_terminating: bool,
}

impl Driver {
    /// A driver for Job `ns/job`.
    pub fn new(client: kube::Client, queue: QueueClient, ns: &str, job: &str) -> Driver {
        Driver {
            client,
            queue,
            ns: ns.into(),
            job: job.into(),
            seen: BTreeSet::new(),
            deleting: BTreeSet::new(),
            with_finalizer: BTreeSet::new(),
            finished: BTreeSet::new(),
            all_pods: BTreeMap::new(),
            hold_terminating: false,
        }
    }

    /// The Job as stored.
    pub async fn get_job(&self) -> Option<Job> {
        Api::<Job>::namespaced(self.client.clone(), &self.ns).get_opt(&self.job).await.unwrap()
    }

    /// The Job's pods (by the job-name label).
    pub async fn pods(&self) -> Vec<Pod> {
        let lp =
            ListParams::default().labels(&format!("batch.kubernetes.io/job-name={}", self.job));
        Api::<Pod>::namespaced(self.client.clone(), &self.ns).list(&lp).await.unwrap().items
    }

    /// One round: observe pods, apply fates to fresh pods, terminate deleting pods, enqueue.
    pub async fn step(&mut self, fate: &mut dyn FnMut(&Pod) -> Fate) {
        let Some(job) = self.get_job().await else { return };
        let job_uid = job.metadata.uid.clone().unwrap_or_default();
        let pods = self.pods().await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let mut observations = Vec::new();
        let mut present = BTreeSet::new();
        for pod in &pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            present.insert(uid.clone());
            let owned = pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == job_uid && o.controller == Some(true));
            if !owned {
                continue;
            }
            self.all_pods.insert(uid.clone(), name.clone());
            if self.seen.insert(uid.clone()) {
                observations.push(obs(ObservationKind::Creation, &job_uid, &uid));
            }
            let has_fin = pod
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == kjob_core::JOB_TRACKING_FINALIZER);
            if has_fin {
                self.with_finalizer.insert(uid.clone());
            } else if self.with_finalizer.remove(&uid) {
                observations.push(obs(ObservationKind::FinalizerRemoval, &job_uid, &uid));
            }
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            let terminal = phase == "Succeeded" || phase == "Failed";
            if pod.metadata.deletion_timestamp.is_some() {
                if self.deleting.insert(uid.clone()) {
                    observations.push(obs(ObservationKind::Deletion, &job_uid, &uid));
                }
                if self.hold_terminating {
                    continue;
                }
                if !terminal {
                    set_phase(&api, pod, &Fate::Fail(137)).await;
                }
                // A terminated pod being deleted goes away at once (kubelet's grace-0 delete).
                let _ = api.delete(&name, &DeleteParams::default().grace_period(0)).await;
                continue;
            }
            if !terminal && !self.finished.contains(&uid) {
                let f = fate(pod);
                if !matches!(f, Fate::Run) || phase != "Running" {
                    set_phase(&api, pod, &f).await;
                }
                if !matches!(f, Fate::Run) {
                    self.finished.insert(uid.clone());
                }
            }
        }
        for uid in self.seen.clone() {
            if !present.contains(&uid) {
                self.seen.remove(&uid);
                if self.deleting.insert(uid.clone()) {
                    observations.push(obs(ObservationKind::Deletion, &job_uid, &uid));
                }
                if self.with_finalizer.remove(&uid) {
                    observations.push(obs(ObservationKind::FinalizerRemoval, &job_uid, &uid));
                }
            }
        }
        let item = AddItem {
            queue: kjob_core::JOB_QUEUE.into(),
            key: format!("{}/{}", self.ns, self.job),
            observations,
            ..Default::default()
        };
        self.queue.add(vec![item]).await.expect("enqueue");
    }

    /// Steps until `done(job)` holds, or panics after `timeout`.
    pub async fn run_until(
        &mut self,
        timeout: Duration,
        fate: &mut dyn FnMut(&Pod) -> Fate,
        done: &mut dyn FnMut(&Job) -> bool,
    ) -> Job {
        let deadline = Instant::now() + timeout;
        loop {
            self.step(fate).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(job) = self.get_job().await
                && done(&job)
            {
                return job;
            }
            if Instant::now() > deadline {
                let job = self.get_job().await;
                panic!(
                    "timed out after {timeout:?}; job status: {:#?}",
                    job.and_then(|j| j.status)
                );
            }
        }
    }
}

fn obs(kind: ObservationKind, job_uid: &str, pod_uid: &str) -> Observation {
    Observation::new(kind, job_uid, pod_uid)
}

/// Writes a pod's phase (and container state) through `/status`, as a kubelet would.
pub async fn set_phase(api: &Api<Pod>, pod: &Pod, fate: &Fate) {
    let now = jiff::Timestamp::now().to_string();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_else(|| "main".into());
    let status = match fate {
        Fate::Run => serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": container, "ready": true, "restartCount": 0,
                "image": "busybox", "imageID": "", "state": {"running": {"startedAt": now}}}],
        }),
        Fate::Succeed => serde_json::json!({
            "phase": "Succeeded",
            "containerStatuses": [{"name": container, "ready": false, "restartCount": 0,
                "image": "busybox", "imageID": "",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}],
        }),
        Fate::Fail(code) => serde_json::json!({
            "phase": "Failed",
            "containerStatuses": [{"name": container, "ready": false, "restartCount": 0,
                "image": "busybox", "imageID": "",
                "state": {"terminated": {"exitCode": code, "reason": "Error", "startedAt": now, "finishedAt": now}}}],
        }),
        Fate::Disrupt => serde_json::json!({
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "lastTransitionTime": now,
                "reason": "EvictionByEvictionAPI"}],
            "containerStatuses": [{"name": container, "ready": false, "restartCount": 0,
                "image": "busybox", "imageID": "",
                "state": {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": now, "finishedAt": now}}}],
        }),
    };
    let patch = serde_json::json!({ "status": status });
    let pp = kube::api::PatchParams::default();
    if let Err(e) = api.patch_status(&name, &pp, &kube::api::Patch::Merge(&patch)).await {
        tracing::debug!(pod = name, error = %e, "setting pod phase failed");
    }
}

/// Creates a Job from a JSON manifest (managedBy is set to kjob's controller name).
pub async fn create_job(client: &kube::Client, ns: &str, mut manifest: serde_json::Value) -> Job {
    manifest["apiVersion"] = "batch/v1".into();
    manifest["kind"] = "Job".into();
    manifest["spec"]["managedBy"] = kjob_core::DEFAULT_CONTROLLER_NAME.into();
    let job: Job = serde_json::from_value(manifest).unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .expect("create job")
}

/// Creates a NonIndexed Job `name` of `completions` pods, `parallelism` at a time, that never
/// restart.
pub async fn create_plain_job(
    client: &kube::Client,
    ns: &str,
    name: &str,
    completions: i32,
    parallelism: i32,
) -> Job {
    let spec = serde_json::json!({
        "completions": completions, "parallelism": parallelism, "template": template("Never")
    });
    create_job(client, ns, serde_json::json!({"metadata": {"name": name}, "spec": spec})).await
}

/// A condition of the Job with status True.
pub fn condition<'a>(
    job: &'a Job,
    type_: &str,
) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// The Job is Complete or Failed.
pub fn finished(job: &Job) -> bool {
    condition(job, "Complete").is_some() || condition(job, "Failed").is_some()
}

/// A pod's container named `main` running busybox.
pub fn template(restart: &str) -> serde_json::Value {
    // A scheduler nobody runs: on the real control plane kube-scheduler and kjob-node-agent
    // leave these pods to the test's Driver, as kjob-sim with its kubelet off does.
    serde_json::json!({
        "spec": {
            "restartPolicy": restart,
            "schedulerName": TEST_SCHEDULER,
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]
        }
    })
}
