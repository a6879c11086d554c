//! kjob under faults: runs a seeded mix of Jobs through the real kjob processes (via
//! [`kjob_testkit::Stack`]) while killing workers, restarting kjob-queue and redis-server,
//! wiping Redis, failing it over to a replica that missed the last writes, killing the leading
//! watcher, injecting API 429/500 answers and cutting watch streams; then
//! checks that every Job ended exactly as upstream would, no pod was created twice, no pod
//! keeps its tracking finalizer and no queue key is left leased.

pub mod plan;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kjob_queue_client::QueueClient;
use kjob_testkit::Program;
use kjob_testkit::Stack;
use kjob_testkit::faults::ApiFaults;
use kjob_testkit::proxy::ProxyStats;
use kjob_testkit::stack::{QUEUE, REDIS, StackConfig};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::plan::{Expected, Shape, terminal};

/// Timeout of each API call the harness makes.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval between polls of Job status.
const POLL: Duration = Duration::from_millis(500);
/// How long the queue may take to drain its last syncs after every Job finished.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a watcher failover may take (short Lease timings are passed to the watchers).
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an API-error window stays open.
const API_ERROR_WINDOW: Duration = Duration::from_secs(2);
/// Namespace of the workload.
const NAMESPACE: &str = "chaos";
/// Lease timings short enough for several failovers per run (client-go's are 15/10/2 s).
const WATCHER_ARGS: [&str; 4] =
    ["--lease-duration=4s", "--renew-deadline=3s", "--retry-period=500ms", "--resync-period=20s"];
/// How long before the master dies a lagging replica stops replicating: long enough to miss
/// several lease grants, Dones and Adds of a busy run.
const FAILOVER_LAG: Duration = Duration::from_millis(500);
/// Longest wait for kjob-queue to lease again after a Redis-loss fault (a fence hold is one
/// worker lease, 5 s here).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// A killed worker's leases come back after this long.
const WORKER_ARGS: [&str; 1] = ["--lease-duration=5s"];

/// One run's settings.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Seed of the workload and of the fault schedule.
    pub seed: u64,
    /// Number of Jobs.
    pub jobs: usize,
    /// How long faults are injected.
    pub duration: Duration,
    /// Pause between two faults.
    pub fault_interval: Duration,
    /// Worker processes kept running.
    pub workers: usize,
    /// Folder of the kjob binaries.
    pub bin_dir: PathBuf,
    /// The redis-server executable.
    pub redis_server: PathBuf,
    /// Folder for logs, redis data and the kubeconfig.
    pub run_dir: PathBuf,
    /// How long Jobs may take to finish after the last fault.
    pub converge_timeout: Duration,
    /// How long each pod runs in the sim's kubelet (jittered up to 2x).
    pub pod_run_time: Duration,
    /// The fault kinds to inject (each round of the schedule covers every one of them).
    pub faults: Vec<Fault>,
    /// Run on this real control plane (a `make cluster-up` folder) instead of kjob-sim; the
    /// Jobs go to a fresh namespace, and the services reach kube-apiserver through the
    /// testkit's fault proxy, which injects the API-error and cut-watch faults there.
    pub cluster: Option<kjob_testkit::cluster::ClusterInfo>,
}

/// The kinds of injected faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL a random worker and start a replacement.
    KillWorker,
    /// SIGKILL kjob-queue and start it again on its port.
    RestartQueue,
    /// SIGKILL redis-server (AOF on) and start it again on its port and data.
    RestartRedis,
    /// SIGKILL the watcher holding the Lease (and start it again as a standby).
    KillLeader,
    /// SIGKILL redis-server, delete its AOF, and start it again empty: every lease, queued key,
    /// expectation, record and view is gone.
    WipeRedis,
    /// Fail Redis over to a replica whose replication was cut [`FAILOVER_LAG`] before the
    /// master died: the writes of that last moment (leases, Dones, Adds) are lost.
    FailoverLagging,
    /// Make the API server answer a share of the services' requests with 429 and 500 for a
    /// while (kjob-sim's `/sim/faults`, or the fault proxy in front of a real kube-apiserver).
    ApiErrors,
    /// End every open watch stream of the services (kjob-sim's hook, or the fault proxy).
    CloseWatches,
}

impl Fault {
    /// Every kind, in schedule order before shuffling.
    pub const ALL: [Fault; 8] = [
        Fault::KillWorker,
        Fault::RestartQueue,
        Fault::RestartRedis,
        Fault::KillLeader,
        Fault::WipeRedis,
        Fault::FailoverLagging,
        Fault::ApiErrors,
        Fault::CloseWatches,
    ];
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// Parses the names [`Fault`]'s `Display` prints (`kill-worker`, `restart-redis`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fault::ALL.into_iter().find(|f| f.to_string() == s).ok_or_else(|| {
            let names: Vec<String> = Fault::ALL.iter().map(ToString::to_string).collect();
            format!("unknown fault {s:?}; expected one of {}", names.join(", "))
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::KillWorker => "kill-worker",
            Fault::RestartQueue => "restart-queue",
            Fault::RestartRedis => "restart-redis",
            Fault::KillLeader => "kill-leader-watcher",
            Fault::WipeRedis => "wipe-redis",
            Fault::FailoverLagging => "failover-lagging",
            Fault::ApiErrors => "api-429-500",
            Fault::CloseWatches => "close-watches",
        })
    }
}

/// A seeded fault schedule of `n` faults: every kind once per round, each round shuffled.
pub fn schedule(rng: &mut StdRng, kinds: &[Fault], n: usize) -> Vec<Fault> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n && !kinds.is_empty() {
        let mut round = kinds.to_vec();
        round.shuffle(rng);
        out.extend(round.into_iter().take(n - out.len()));
    }
    out
}

/// The figures of a run and every violation found.
#[derive(Debug, Default)]
pub struct Report {
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, u32>,
    /// Jobs created.
    pub jobs: usize,
    /// Jobs by shape kind.
    pub jobs_by_kind: BTreeMap<&'static str, usize>,
    /// Pods ever created (seen by a pod watch kept from the start).
    pub pods_created: u64,
    /// Pods present at the end.
    pub pods_listed: usize,
    /// Pods beyond what upstream would create, plus pods created and deleted again.
    pub duplicates: u64,
    /// Jobs not in their expected terminal state at the end.
    pub wrong_or_unfinished: usize,
    /// From the last fault to every Job finished.
    pub converge_after_last_fault: Option<Duration>,
    /// Whole run.
    pub elapsed: Duration,
    /// What the fault proxy did, on the real control plane.
    pub proxy: Option<ProxyStats>,
    /// For each Redis-loss fault (wipe, lagging failover): how long after it kjob-queue granted
    /// its first lease again (`None`: not within [`RECOVERY_TIMEOUT`]).
    pub recoveries: Vec<(Fault, Option<Duration>)>,
    /// Every invariant broken, one line each.
    pub violations: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u32 = self.faults.values().sum();
        writeln!(f, "faults injected: {total}")?;
        for (k, n) in &self.faults {
            writeln!(f, "  {k:<20} {n}")?;
        }
        writeln!(f, "jobs: {}", self.jobs)?;
        for (k, n) in &self.jobs_by_kind {
            writeln!(f, "  {k:<20} {n}")?;
        }
        writeln!(f, "pods created: {} (present at end: {})", self.pods_created, self.pods_listed)?;
        writeln!(f, "duplicates: {}", self.duplicates)?;
        writeln!(f, "jobs wrong or unfinished: {}", self.wrong_or_unfinished)?;
        match self.converge_after_last_fault {
            Some(d) => writeln!(f, "converged {:.1}s after the last fault", d.as_secs_f64())?,
            None => writeln!(f, "did not converge")?,
        }
        for (fault, after) in &self.recoveries {
            match after {
                Some(d) => writeln!(f, "{fault}: leasing again {:.1}s after it", d.as_secs_f64())?,
                None => writeln!(f, "{fault}: no lease within {RECOVERY_TIMEOUT:?} after it")?,
            }
        }
        if let Some(p) = &self.proxy {
            writeln!(
                f,
                "fault proxy: {} requests forwarded, {} refused, {} watches cut",
                p.forwarded, p.refused, p.watches_cut
            )?;
        }
        writeln!(f, "elapsed: {:.1}s", self.elapsed.as_secs_f64())?;
        writeln!(f, "violations: {}", self.violations.len())?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        Ok(())
    }
}

/// Runs the stack, the workload and the faults, and checks the end state.
pub async fn run(cfg: ChaosConfig) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut scfg =
        StackConfig::new(cfg.bin_dir.clone(), cfg.redis_server.clone(), cfg.run_dir.clone(), 0);
    scfg.workers = cfg.workers;
    scfg.watchers = 2;
    scfg.extra_args.add(Program::Watcher, WATCHER_ARGS).add(Program::Worker, WORKER_ARGS);
    let controller = scfg.controller_name.clone();
    let namespace = match &cfg.cluster {
        Some(info) => {
            let ns = format!("{NAMESPACE}-{}-{}", std::process::id(), cfg.seed);
            tokio::task::block_in_place(|| info.create_namespace(&ns))?;
            scfg.real = Some(kjob_testkit::stack::RealServer {
                fault_proxy: true,
                ..kjob_testkit::stack::RealServer::from_cluster(info, &ns)
            });
            ns
        }
        None => NAMESPACE.to_string(),
    };
    let namespace = namespace.as_str();
    let mut stack = tokio::task::block_in_place(|| Stack::start(scfg))?;
    tracing::info!(logs = %stack.log_dir.display(), "stack started");
    let client = kube_client(&stack).await?;
    let queue = QueueClient::connect_lazy(&stack.queue_url)?;
    tokio::task::block_in_place(|| stack.wait_for_leader(LEADER_TIMEOUT))?;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
    let pp = PostParams::default();
    if cfg.cluster.is_none() {
        retry_create("namespace", || namespaces.create(&pp, &ns)).await?;
    }

    // The workload: a third up front, the rest spread over the fault period.
    let shapes: Vec<Shape> = (0..cfg.jobs).map(|_| Shape::random(&mut rng)).collect();
    let run_ms: Vec<u64> = (0..cfg.jobs)
        .map(|_| {
            let base = cfg.pod_run_time.as_millis() as u64;
            rng.random_range(base..=base * 2)
        })
        .collect();
    let mut report = Report { jobs: cfg.jobs, ..Report::default() };
    for s in &shapes {
        *report.jobs_by_kind.entry(s.kind()).or_default() += 1;
    }
    // Every pod ever created, by uid: a watch kept from before the first Job, so a pod created
    // and deleted again is still counted.
    let seen_pods = spawn_pod_tracker(Api::namespaced(client.clone(), namespace));
    let up_front = cfg.jobs.div_ceil(3);
    let jobs_api: Api<Job> = Api::namespaced(client.clone(), namespace);
    let creator = {
        let jobs_api = jobs_api.clone();
        let shapes = shapes.clone();
        let controller = controller.clone();
        let spread = cfg.duration;
        tokio::spawn(async move {
            let later = shapes.len() - up_front.min(shapes.len());
            let gap = if later > 0 { spread / (later as u32 + 1) } else { Duration::ZERO };
            for (i, s) in shapes.iter().enumerate() {
                if i >= up_front {
                    tokio::time::sleep(gap).await;
                }
                let job = s.job(&job_name(i), &controller, run_ms[i]);
                let pp = PostParams::default();
                retry_create("job", || jobs_api.create(&pp, &job)).await?;
            }
            anyhow::Ok(())
        })
    };

    // Faults.
    let n_faults = (cfg.duration.as_millis() / cfg.fault_interval.as_millis().max(1)) as usize;
    let plan = schedule(&mut rng, &cfg.faults, n_faults.max(1));
    let mut last_fault = Instant::now();
    let mut recoveries = Vec::new();
    for fault in plan {
        tokio::time::sleep(cfg.fault_interval).await;
        inject(&mut stack, &mut rng, fault).await.with_context(|| format!("injecting {fault}"))?;
        *report.faults.entry(fault).or_default() += 1;
        last_fault = Instant::now();
        tracing::info!(%fault, "fault injected");
        if matches!(fault, Fault::WipeRedis | Fault::FailoverLagging)
            && let Some(admin) = stack.admin_url(QUEUE)
        {
            let admin = admin.trim_start_matches("http://").parse()?;
            recoveries.push((fault, tokio::task::spawn_blocking(move || leasing_again(admin))));
        }
    }
    for (fault, after) in recoveries {
        report.recoveries.push((fault, after.await.context("recovery probe panicked")?));
    }
    creator.await.context("job creator panicked")??;
    tokio::task::block_in_place(|| stack.check_alive())?;

    // Convergence.
    let deadline = Instant::now() + cfg.converge_timeout;
    let mut finished;
    loop {
        let jobs = list_all(&jobs_api).await?;
        finished = jobs.iter().filter(|j| terminal(j).is_some()).count();
        if finished == cfg.jobs {
            report.converge_after_last_fault = Some(last_fault.elapsed());
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::info!(finished, of = cfg.jobs, "convergence wait over");

    check_jobs(&jobs_api, &client, namespace, &shapes, &mut report).await?;
    // The tracker may lag the list by a moment; give it time to see every listed pod.
    let pod_deadline = Instant::now() + Duration::from_secs(10);
    while seen_pods.lock().map(|m| m.len()).unwrap_or(0) < report.pods_listed
        && Instant::now() < pod_deadline
    {
        tokio::time::sleep(POLL).await;
    }
    let seen = seen_pods.lock().map(|m| m.clone()).unwrap_or_default();
    check_pods_created(&seen, &mut report);
    check_queue(&queue, namespace, cfg.jobs, &mut report).await?;
    if let Ok(proxy) = stack.fault_proxy() {
        let stats = proxy.stats();
        report.violations.extend(check_proxy(&report.faults, &stats));
        report.proxy = Some(stats);
    }
    tokio::task::block_in_place(|| stack.check_alive())?;
    report.elapsed = started.elapsed();
    tokio::task::block_in_place(|| stack.stop());
    Ok(report)
}

/// kjob-queue's `kjob_queue_leases_total` of the Job queue, from its admin port.
fn leases_total(admin: std::net::SocketAddr) -> Option<f64> {
    let (code, body) = kjob_testkit::stack::http_request(admin, "GET", "/metrics", None).ok()?;
    let body = String::from_utf8(body).ok().filter(|_| code == 200)?;
    let series = format!("kjob_queue_leases_total{{name=\"{}\"}} ", kjob_core::JOB_QUEUE);
    body.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// How long after now kjob-queue grants a lease again (its lease count grows), polled every
/// 100 ms; `None` past [`RECOVERY_TIMEOUT`]. A wipe or failover holds leasing for one worker
/// lease, so this is the fault's cost in time before Jobs progress again.
fn leasing_again(admin: std::net::SocketAddr) -> Option<Duration> {
    let start = Instant::now();
    let before = leases_total(admin);
    while start.elapsed() < RECOVERY_TIMEOUT {
        std::thread::sleep(Duration::from_millis(100));
        if let (Some(now), Some(b)) = (leases_total(admin), before)
            && now > b
        {
            return Some(start.elapsed());
        }
    }
    None
}

/// The fault proxy's API faults took effect: an injected error window refused some requests,
/// and closing the watches cut some (the services always keep watches open).
fn check_proxy(faults: &BTreeMap<Fault, u32>, stats: &ProxyStats) -> Vec<String> {
    let mut out = Vec::new();
    if faults.contains_key(&Fault::ApiErrors) && stats.refused == 0 {
        out.push("api-429-500 injected but the fault proxy refused no request".to_string());
    }
    if faults.contains_key(&Fault::CloseWatches) && stats.watches_cut == 0 {
        out.push("close-watches injected but the fault proxy cut no watch".to_string());
    }
    out
}

fn job_name(i: usize) -> String {
    format!("chaos-{i:04}")
}

async fn kube_client(stack: &Stack) -> anyhow::Result<Client> {
    kjob_testkit::server::kube_client(&stack.kubeconfig, Some(API_TIMEOUT)).await
}

/// Creates an object, retrying injected errors; "already exists" (an earlier try that timed
/// out after the server stored it) counts as success.
async fn retry_create<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(API_TIMEOUT, call()).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => return Ok(()),
            Ok(Err(e)) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("creating {what}"));
            }
            Err(_) if Instant::now() > deadline => anyhow::bail!("creating {what}: timed out"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn list_all<K>(api: &Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(API_TIMEOUT, api.list(&ListParams::default())).await {
            Ok(Ok(l)) => return Ok(l.items),
            Ok(Err(e)) if Instant::now() > deadline => return Err(e).context("listing"),
            Err(_) if Instant::now() > deadline => anyhow::bail!("listing: timed out"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The Job's terminal condition type and reason, once it has one.
async fn inject(stack: &mut Stack, rng: &mut StdRng, fault: Fault) -> anyhow::Result<()> {
    match fault {
        Fault::KillWorker => {
            let workers = stack.workers();
            let victim = workers[rng.random_range(0..workers.len())].clone();
            tokio::task::block_in_place(|| {
                stack.remove_worker(&victim, true, Duration::ZERO)?;
                stack.add_worker().map(drop)
            })
        }
        Fault::RestartQueue => tokio::task::block_in_place(|| {
            stack.kill(QUEUE)?;
            stack.restart(QUEUE)
        }),
        Fault::RestartRedis => tokio::task::block_in_place(|| {
            stack.kill(REDIS)?;
            stack.restart(REDIS)
        }),
        Fault::WipeRedis => tokio::task::block_in_place(|| stack.wipe_redis()),
        Fault::FailoverLagging => {
            tokio::task::block_in_place(|| stack.fail_over_redis_lagging(FAILOVER_LAG))
        }
        Fault::KillLeader => tokio::task::block_in_place(|| {
            let leader = stack.wait_for_leader(LEADER_TIMEOUT)?;
            stack.kill(&leader)?;
            stack.restart(&leader)
        }),
        Fault::ApiErrors => {
            tokio::task::block_in_place(|| stack.inject(&ApiFaults::errors(0.1, 0.1)))?;
            tokio::time::sleep(API_ERROR_WINDOW).await;
            tokio::task::block_in_place(|| stack.inject(&ApiFaults::none()))
        }
        Fault::CloseWatches => tokio::task::block_in_place(|| stack.close_watches()),
    }
}

async fn check_jobs(
    jobs_api: &Api<Job>,
    client: &Client,
    namespace: &str,
    shapes: &[Shape],
    report: &mut Report,
) -> anyhow::Result<()> {
    let jobs: BTreeMap<String, Job> = list_all(jobs_api)
        .await?
        .into_iter()
        .map(|j| (j.metadata.name.clone().unwrap_or_default(), j))
        .collect();
    let pods: Vec<Pod> = list_all(&Api::<Pod>::namespaced(client.clone(), namespace)).await?;
    report.pods_listed = pods.len();
    let mut pods_per_job: BTreeMap<String, i32> = BTreeMap::new();
    for p in &pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        *pods_per_job.entry(plan::job_name_of(p)).or_default() += 1;
        let fins = p.metadata.finalizers.as_deref().unwrap_or_default();
        if fins.iter().any(|f| f == kjob_core::JOB_TRACKING_FINALIZER) {
            report.violations.push(format!("pod {name} keeps the tracking finalizer"));
        }
    }
    for (i, shape) in shapes.iter().enumerate() {
        let name = job_name(i);
        let Some(job) = jobs.get(&name) else {
            report.violations.push(format!("job {name} is missing"));
            report.wrong_or_unfinished += 1;
            continue;
        };
        let exp: Expected = shape.expected();
        let npods = pods_per_job.get(&name).copied().unwrap_or(0);
        let mut wrong = exp.mismatches(job, npods);
        if npods > exp.max_pods {
            report.duplicates += (npods - exp.max_pods) as u64;
            wrong.push(format!("{npods} pods, upstream creates at most {}", exp.max_pods));
        } else if npods < exp.min_pods {
            wrong.push(format!("{npods} pods, upstream creates at least {}", exp.min_pods));
        }
        if !wrong.is_empty() {
            report.wrong_or_unfinished += 1;
            report.violations.push(format!("job {name} ({}): {}", shape.kind(), wrong.join("; ")));
        }
    }
    Ok(())
}

/// Pods seen by the tracker: uid → owning Job name.
type SeenPods = Arc<Mutex<HashMap<String, String>>>;

fn spawn_pod_tracker(pods: Api<Pod>) -> SeenPods {
    let seen: SeenPods = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default()).boxed();
        // Errors (injected 500s, cut streams) are retried by the watcher itself on the next
        // poll; this loop only records pods.
        while let Some(ev) = stream.next().await {
            let pod = match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(watcher::Event::Delete(p)) => p,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "pod watch error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let (Some(uid), labels) = (pod.metadata.uid.clone(), pod.metadata.labels.as_ref())
            else {
                continue;
            };
            let job =
                labels.and_then(|l| l.get(kjob_core::JOB_NAME_LABEL)).cloned().unwrap_or_default();
            if let Ok(mut m) = out.lock() {
                m.insert(uid, job);
            }
        }
    });
    seen
}

/// Compares the pods ever seen with the pods present: the workload deletes no pod, so a pod
/// seen but gone is one created and then removed (an excess the controller undid).
fn check_pods_created(seen: &HashMap<String, String>, report: &mut Report) {
    report.pods_created = seen.len() as u64;
    let listed = report.pods_listed as u64;
    if report.pods_created != listed {
        let gone = report.pods_created.saturating_sub(listed);
        report.duplicates += gone;
        report.violations.push(format!(
            "{} pods created but {listed} present: {gone} created and deleted again",
            report.pods_created
        ));
    }
}

/// No key may stay leased, and once everything finished nothing is left ready.
async fn check_queue(
    queue: &QueueClient,
    namespace: &str,
    jobs: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let keys: Vec<String> = (0..jobs).map(|i| format!("{namespace}/{}", job_name(i))).collect();
    loop {
        let stats = queue.stats(kjob_core::JOB_QUEUE).await?;
        let inspect = queue.inspect(kjob_core::JOB_QUEUE, keys.clone()).await?;
        let leased: Vec<&str> =
            inspect.keys.iter().filter(|k| k.state == "leased").map(|k| k.key.as_str()).collect();
        if stats.leased == 0 && stats.ready == 0 && leased.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            report.violations.push(format!(
                "queue not drained: ready {} leased {} (leased keys: {:?})",
                stats.ready, stats.leased, leased
            ));
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_faults_must_have_taken_effect() {
        let injected = BTreeMap::from([(Fault::ApiErrors, 2), (Fault::CloseWatches, 2)]);
        let none = ProxyStats { forwarded: 100, ..ProxyStats::default() };
        assert_eq!(check_proxy(&injected, &none).len(), 2);
        let both = ProxyStats { forwarded: 100, refused: 3, watches_cut: 4 };
        assert!(check_proxy(&injected, &both).is_empty());
        let crashes_only = BTreeMap::from([(Fault::KillWorker, 2)]);
        assert!(check_proxy(&crashes_only, &none).is_empty());
    }

    #[test]
    fn fault_names_round_trip_and_schedule_covers_every_kind() {
        for f in Fault::ALL {
            assert_eq!(f.to_string().parse::<Fault>(), Ok(f));
        }
        assert!("kill-everything".parse::<Fault>().is_err());
        let mut rng = StdRng::seed_from_u64(3);
        let plan = schedule(&mut rng, &Fault::ALL, 2 * Fault::ALL.len());
        for f in Fault::ALL {
            assert_eq!(plan.iter().filter(|&&p| p == f).count(), 2, "{plan:?}");
        }
        assert!(schedule(&mut rng, &[], 5).is_empty());
    }
}
