//! One run: a fresh control plane for one configuration, kjob's stack on it when the
//! configuration is kjob, one workload, counters and `/proc` read before and after, and
//! everything stopped again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::batch::v1::Job;
use kjob_bench::apiserver::Counters;
use kjob_bench::audit::ControllerWrites;
use kjob_bench::pprof::{self, CpuByPart};
use kjob_bench::procfs::{Usage, machine_busy_secs, read_usage};
use kjob_bench::upstream::{
    APISERVER, CONTROLLER_MANAGER, Configuration, ETCD, ProcessFigures, RunFigures, TenantFigures,
    Workload,
};
use kjob_testkit::Program;
use kjob_testkit::cluster::{
    ClusterInfo, ClusterOptions, ControlPlane, JobController, KJOB_NAMESPACE,
    UPSTREAM_JOB_CONTROLLER_USER,
};
use kjob_testkit::stack::{RealServer, Stack, StackConfig};
use kube::api::Api;
use tokio::task::JoinSet;

use kjob_bench::harness::{Counts, Creator, NAMESPACE, Observed, Recorder, job};

/// Timeout of every single API call and scrape the harness makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Shortest wait after the last Job finished before the final scrape.
const SETTLE_MIN: Duration = Duration::from_secs(1);
/// Longest wait: a controller still busy after this is cut off (the run records how long it
/// settled, so a cut-off shows).
const SETTLE_MAX: Duration = Duration::from_secs(30);
/// Window over which kube-apiserver's request rate is taken, at rest before the Jobs and while
/// settling after them.
const RATE_WINDOW: Duration = Duration::from_secs(1);
/// How long the rate at rest is taken before the Jobs are created.
const BASELINE_WINDOW: Duration = Duration::from_secs(3);
/// After the last Job finished, the run ends once a window's request rate is back within this
/// factor of the rate at rest, plus [`SETTLE_SLACK`] requests/s: the last status writes, events
/// and finalizer removals of either controller are then in the counters, whichever is slower to
/// finish them (a fixed pause cut off kjob's event writer).
const SETTLE_FACTOR: f64 = 1.5;
/// Requests/s of slack on top of [`SETTLE_FACTOR`] (the rate at rest is a few requests/s).
const SETTLE_SLACK: f64 = 2.0;
/// Length of each CPU profile taken of kube-apiserver during a run: profiles follow each other
/// until the run ends, so a run's last one outlasts it by at most this.
const PROFILE_CHUNK_SECS: u64 = 5;
/// How long kjob's watcher may take to win its Lease.
const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Namespace of the benchmark's Jobs.
/// Control-plane processes whose CPU is measured (names of their pid files).
const CONTROL_PLANE: [&str; 3] = [APISERVER, ETCD, CONTROLLER_MANAGER];

/// What a run creates, with its sizes.
#[derive(Debug, Clone, Copy)]
pub enum Spec {
    /// `jobs` single-pod Jobs created at once by `creators` concurrent clients.
    Burst { jobs: usize, creators: usize },
    /// One Indexed Job.
    Indexed { completions: i32, parallelism: i32 },
    /// `jobs` single-pod Jobs created at `rate` per second.
    Steady { jobs: usize, rate: f64 },
    /// `jobs` single-pod Jobs created at once in one namespace by `creators` clients, while
    /// each of `quiet_namespaces` other namespaces creates one every `quiet_every` until the
    /// flood has drained.
    Flood { jobs: usize, creators: usize, quiet_namespaces: usize, quiet_every: Duration },
}

/// The flood's quiet namespace number `i` (from 1).
fn quiet_namespace(i: usize) -> String {
    format!("quiet-{i:02}")
}

/// What [`create`] made: every Job's name, and for the flood which were the flood's.
struct Created {
    names: Vec<String>,
    /// The flood's Jobs and the quiet namespaces' Jobs.
    tenants: Option<(Vec<String>, Vec<String>)>,
}

impl Spec {
    /// The workload it is.
    pub fn workload(&self) -> Workload {
        match self {
            Spec::Burst { .. } => Workload::Burst,
            Spec::Indexed { .. } => Workload::Indexed,
            Spec::Steady { .. } => Workload::Steady,
            Spec::Flood { .. } => Workload::Flood,
        }
    }
}

/// What every run shares.
#[derive(Debug, Clone)]
pub struct Env {
    /// Folder of the release kjob binaries and kjob-node-agent.
    pub bin_dir: PathBuf,
    /// Folder of the upstream binaries.
    pub cluster_bins: PathBuf,
    /// The redis-server executable.
    pub redis_server: PathBuf,
    /// Fake nodes.
    pub nodes: u32,
    /// Run time of every pod.
    pub pod_run_time: Duration,
    /// Deadline of a run, from the first Job created.
    pub timeout: Duration,
    /// `RUST_LOG` of the kjob services.
    pub service_log: String,
    /// `CLK_TCK`.
    pub ticks: f64,
    /// Whether kube-apiserver's CPU is profiled through each run.
    pub apiserver_profile: bool,
    /// Whether kjob runs secured as deploy/ runs it (mTLS, view key, Redis TLS and ACL user).
    pub kjob_secure: bool,
}

/// Counters and process usage at one moment.
struct Snapshot {
    api: Counters,
    usage: BTreeMap<String, Usage>,
    /// Busy CPU seconds of the whole machine.
    machine_cpu: f64,
    at: Instant,
}

impl Snapshot {
    /// kube-apiserver's requests per second from `earlier` to this one.
    fn request_rate_since(&self, earlier: &Snapshot) -> f64 {
        let secs = self.at.duration_since(earlier.at).as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        (self.api.total_requests() - earlier.api.total_requests()).max(0.0) / secs
    }
}

async fn admin_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    // Watches keep kube's long read timeout.
    let mut config = kjob_testkit::server::kube_config(kubeconfig).await?;
    config.connect_timeout = Some(CALL_TIMEOUT);
    config.write_timeout = Some(CALL_TIMEOUT);
    Ok(kube::Client::try_from(config)?)
}

/// Keeps every kjob process's `/metrics` at the end of a run beside its log
/// (`<run>/kjob/metrics/<name>.prom`): queue durations, sync latencies and RPC counts explain a
/// figure after the fact. A process that does not answer is skipped with a warning.
async fn save_metrics(stack: &Stack) {
    let http = reqwest::Client::new();
    for name in stack.names() {
        let Some(url) = stack.admin_url(&name) else { continue };
        let Some(dir) =
            stack.log_path(&name).parent().and_then(Path::parent).map(|d| d.join("metrics"))
        else {
            continue;
        };
        let text = match http.get(format!("{url}/metrics")).timeout(CALL_TIMEOUT).send().await {
            Ok(r) => r.text().await,
            Err(e) => Err(e),
        };
        let saved = match text {
            Ok(t) => std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join(format!("{name}.prom")), t))
                .map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = saved {
            tracing::warn!(process = name, error = %e, "could not keep the process's metrics");
        }
    }
}

fn control_plane_pids(dir: &Path) -> Vec<(String, u32)> {
    CONTROL_PLANE
        .iter()
        .filter_map(|n| {
            let s = std::fs::read_to_string(dir.join("pids").join(n)).ok()?;
            Some((n.to_string(), s.trim().parse().ok()?))
        })
        .collect()
}

async fn snapshot(
    client: &kube::Client,
    pids: &[(String, u32)],
    ticks: f64,
) -> anyhow::Result<Snapshot> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = tokio::time::timeout(CALL_TIMEOUT, client.request_text(req))
        .await
        .context("GET /metrics timed out")?
        .context("GET /metrics of kube-apiserver")?;
    let usage = pids
        .iter()
        .filter_map(|(n, pid)| read_usage(*pid, ticks).ok().map(|u| (n.clone(), u)))
        .collect();
    let machine_cpu = machine_busy_secs(ticks).context("reading /proc/stat")?;
    Ok(Snapshot { api: Counters::parse(&text), usage, machine_cpu, at: Instant::now() })
}

/// Waits until kube-apiserver's request rate is back near `baseline` (requests/s at rest),
/// at least [`SETTLE_MIN`] and at most [`SETTLE_MAX`] after `end`; the last snapshot taken.
async fn settle(
    client: &kube::Client,
    pids: &[(String, u32)],
    ticks: f64,
    baseline: f64,
    end: Instant,
) -> anyhow::Result<Snapshot> {
    let mut last = snapshot(client, pids, ticks).await?;
    loop {
        tokio::time::sleep(RATE_WINDOW).await;
        let now = snapshot(client, pids, ticks).await?;
        let rate = now.request_rate_since(&last);
        let waited = now.at.duration_since(end);
        last = now;
        let quiet = rate <= baseline * SETTLE_FACTOR + SETTLE_SLACK;
        if (quiet && waited >= SETTLE_MIN) || waited >= SETTLE_MAX {
            if !quiet {
                tracing::warn!(rate, baseline, "still busy when the settle ran out");
            }
            return Ok(last);
        }
    }
}

/// Creates the flood's quiet namespaces.
async fn create_namespaces(client: &kube::Client, quiet: usize) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    for i in 1..=quiet {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": quiet_namespace(i)}}))?;
        let created =
            tokio::time::timeout(CALL_TIMEOUT, api.create(&kube::api::PostParams::default(), &ns))
                .await
                .context("creating a namespace timed out")?;
        match created {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).context("creating a quiet namespace"),
        }
    }
    Ok(())
}

/// The flood (see [`Spec::Flood`]): returns once the flood's Jobs have finished (or `deadline`
/// passed) and the quiet namespaces have stopped creating.
async fn flood(
    client: &kube::Client,
    rec: &Recorder,
    (jobs, creators, quiet_namespaces, quiet_every): (usize, usize, usize, Duration),
    run_time: Duration,
    deadline: Instant,
) -> anyhow::Result<Created> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut quiet: JoinSet<anyhow::Result<Vec<String>>> = JoinSet::new();
    for i in 1..=quiet_namespaces {
        let ns = quiet_namespace(i);
        let creator = Creator::new(Api::namespaced(client.clone(), &ns), rec.clone(), CALL_TIMEOUT);
        let stop = stop.clone();
        // Each namespace on its own phase, so the quiet creates spread over the interval.
        let offset = quiet_every.mul_f64((i - 1) as f64 / quiet_namespaces as f64);
        quiet.spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + offset, quiet_every);
            let mut names = Vec::new();
            loop {
                tick.tick().await;
                if stop.load(Ordering::Relaxed) {
                    return Ok(names);
                }
                let name = format!("{ns}-{:04}", names.len());
                let mut j = job(&name, None, 1, 1, false, run_time);
                j.metadata.namespace = Some(ns.clone());
                creator.one(&j).await?;
                names.push(name);
            }
        });
    }
    let creator =
        Creator::new(Api::namespaced(client.clone(), NAMESPACE), rec.clone(), CALL_TIMEOUT);
    let list: Vec<Job> =
        (0..jobs).map(|i| job(&format!("flood-{i:05}"), None, 1, 1, false, run_time)).collect();
    let flood_names: Vec<String> = list.iter().filter_map(|j| j.metadata.name.clone()).collect();
    let burst = creator.burst(list, creators).await;
    let drained = match burst {
        Ok(()) => rec.wait_finished(&flood_names, deadline, || Ok(())).await.map(|_| ()),
        Err(e) => Err(e),
    };
    stop.store(true, Ordering::Relaxed);
    let mut quiet_names = Vec::new();
    while let Some(r) = quiet.join_next().await {
        quiet_names.extend(r.context("a quiet namespace's creator")??);
    }
    drained?;
    let names = flood_names.iter().chain(&quiet_names).cloned().collect();
    Ok(Created { names, tenants: Some((flood_names, quiet_names)) })
}

/// Creates the Jobs of `spec` (the flood also waits for its flood to drain, until
/// `deadline`).
async fn create(
    client: &kube::Client,
    rec: &Recorder,
    spec: Spec,
    run_time: Duration,
    deadline: Instant,
) -> anyhow::Result<Created> {
    let creator =
        Creator::new(Api::namespaced(client.clone(), NAMESPACE), rec.clone(), CALL_TIMEOUT);
    let single = |n: usize, prefix: &str| -> Vec<Job> {
        (0..n).map(|i| job(&format!("{prefix}-{i:05}"), None, 1, 1, false, run_time)).collect()
    };
    let jobs = match spec {
        Spec::Burst { jobs, creators } => {
            let list = single(jobs, "burst");
            creator.burst(list.clone(), creators).await?;
            list
        }
        Spec::Indexed { completions, parallelism } => {
            let j = job("indexed", None, completions, parallelism, true, run_time);
            creator.one(&j).await?;
            vec![j]
        }
        Spec::Steady { jobs, rate } => {
            let list = single(jobs, "steady");
            creator.paced(list.clone(), rate).await?;
            list
        }
        Spec::Flood { jobs, creators, quiet_namespaces, quiet_every } => {
            let sizes = (jobs, creators, quiet_namespaces, quiet_every);
            return flood(client, rec, sizes, run_time, deadline).await;
        }
    };
    let names = jobs.iter().filter_map(|j| j.metadata.name.clone()).collect();
    Ok(Created { names, tenants: None })
}

/// Runs `spec` on configuration `cfg` in `dir` (a fresh control plane, stopped after): the
/// raw figures and what the harness observed (for the latency charts).
pub async fn run(
    env: &Env,
    cfg: &Configuration,
    spec: Spec,
    pass: usize,
    dir: &Path,
) -> anyhow::Result<(RunFigures, Observed)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut opts = ClusterOptions::new(dir.join("cluster"), env.bin_dir.join("kjob-node-agent"));
    opts.bin_dir = Some(env.cluster_bins.clone());
    opts.nodes = env.nodes;
    opts.job_controller =
        if cfg.is_upstream() { JobController::Upstream } else { JobController::Kjob };
    let run_time = format!("--pod-run-time={}ms", env.pod_run_time.as_millis());
    opts.extra_args
        .add(Program::KubeControllerManager, cfg.controller_manager_args())
        .add(Program::NodeAgent, [run_time]);
    if env.apiserver_profile {
        // The cluster turns profiling off; a later flag wins.
        opts.extra_args.add(Program::KubeApiserver, ["--profiling=true"]);
    }
    let started = Instant::now();
    let cp = tokio::task::block_in_place(|| ControlPlane::start(opts))?;
    let info = ClusterInfo::read(&cp.dir)?;
    tracing::info!(secs = started.elapsed().as_secs_f64(), "control plane up");
    let stack = match cfg.kjob_workers() {
        Some((workers, worker_flags)) => {
            let mut sc = StackConfig::new(
                env.bin_dir.clone(),
                env.redis_server.clone(),
                dir.join("kjob"),
                workers,
            );
            let mut real = RealServer::from_cluster(&info, NAMESPACE);
            // Like upstream: every namespace.
            real.namespace = None;
            sc.real = Some(real);
            sc.extra_args
                .add(Program::Watcher, ["--manage-all-jobs"])
                .add(Program::Worker, ["--manage-all-jobs"])
                .add(Program::Worker, worker_flags)
                .add(Program::Queue, cfg.kjob_queue_args());
            sc.env = vec![("RUST_LOG".into(), env.service_log.clone())];
            (sc.tls, sc.redis_tls) = (env.kjob_secure, env.kjob_secure);
            let stack = tokio::task::block_in_place(|| -> anyhow::Result<Stack> {
                let s = Stack::start(sc)?;
                s.wait_for_leader(LEADER_TIMEOUT)?;
                Ok(s)
            })?;
            Some(stack)
        }
        None => None,
    };
    let outcome = measure(env, cfg, spec, pass, &info, stack).await;
    tokio::task::block_in_place(|| drop(cp));
    outcome
}

async fn measure(
    env: &Env,
    cfg: &Configuration,
    spec: Spec,
    pass: usize,
    info: &ClusterInfo,
    mut stack: Option<Stack>,
) -> anyhow::Result<(RunFigures, Observed)> {
    let client = admin_client(&info.kubeconfig).await?;
    let rec = Recorder::default();
    let mut watches = JoinSet::new();
    // The flood spreads over namespaces (its Jobs' names are unique across them).
    let watched = match spec {
        Spec::Flood { quiet_namespaces, .. } => {
            create_namespaces(&client, quiet_namespaces).await?;
            None
        }
        _ => Some(NAMESPACE),
    };
    rec.start(client.clone(), watched, &mut watches).await?;
    let mut pids = control_plane_pids(&info.dir);
    if let Some(s) = &stack {
        pids.extend(s.pids());
    }
    let rest = snapshot(&client, &pids, env.ticks).await?;
    tokio::time::sleep(BASELINE_WINDOW).await;
    let before = snapshot(&client, &pids, env.ticks).await?;
    let baseline_rate = before.request_rate_since(&rest);
    let run_over = Arc::new(AtomicBool::new(false));
    let profiler = env.apiserver_profile.then(|| {
        tokio::spawn(profile_apiserver(client.clone(), info.dir.clone(), run_over.clone()))
    });
    let t0 = Instant::now();
    let deadline = t0 + env.timeout;
    let Created { names, tenants } =
        create(&client, &rec, spec, env.pod_run_time, deadline).await?;
    tracing::info!(jobs = names.len(), secs = t0.elapsed().as_secs_f64(), "all Jobs created");
    let alive = || match stack.as_mut() {
        Some(s) => tokio::task::block_in_place(|| s.check_alive()),
        None => Ok(()),
    };
    let timed_out = rec.wait_finished(&names, deadline, alive).await?;
    let end = Instant::now();
    run_over.store(true, Ordering::Relaxed);
    let after = settle(&client, &pids, env.ticks, baseline_rate, end).await?;
    let settle_secs = after.at.duration_since(end).as_secs_f64();
    // After the snapshot: the last profile may outlast the run by a piece, which must not
    // stretch the window the counters and CPU figures cover.
    let apiserver_cpu = match profiler {
        Some(task) => task.await.context("the profiling task panicked")?,
        None => None,
    };
    watches.abort_all();
    if let Some(s) = &stack {
        save_metrics(s).await;
    }
    if let Some(s) = stack.take() {
        tokio::task::block_in_place(|| drop(s));
    }
    let observed = rec.observed(&names, t0, end);
    let tenants = tenants.map(|(flood, quiet)| {
        let (f, q) = (rec.observed(&flood, t0, end), rec.observed(&quiet, t0, end));
        TenantFigures {
            flood_jobs: flood.len() as u64,
            quiet_namespaces: match spec {
                Spec::Flood { quiet_namespaces, .. } => quiet_namespaces,
                _ => 0,
            },
            quiet_jobs: quiet.len() as u64,
            flood_drain_secs: f.counts.elapsed_secs,
            quiet_first_pod_samples: q.first_pod,
            quiet_complete_samples: q.complete,
        }
    });
    let api = after.api.since(&before.api);
    let upstream = cfg.is_upstream();
    let processes = after
        .usage
        .iter()
        .map(|(name, u)| {
            let b = before.usage.get(name).map_or(0.0, |b| b.cpu_secs);
            let controller = if name == CONTROLLER_MANAGER {
                upstream
            } else {
                !CONTROL_PLANE.contains(&name.as_str())
            };
            ProcessFigures {
                name: name.clone(),
                cpu_secs: (u.cpu_secs - b).max(0.0),
                peak_rss: u.peak_rss,
                controller,
            }
        })
        .collect();
    let figures = RunFigures {
        config: cfg.id.clone(),
        workload: spec.workload().name().into(),
        pass,
        counts: Counts { timed_out, ..observed.counts },
        offered_rate: match spec {
            Spec::Steady { rate, .. } => Some(rate),
            _ => None,
        },
        first_pod: observed.first_pod_summary(),
        first_pod_samples: observed.first_pod.clone(),
        counted: observed.counted_summary(),
        counted_samples: observed.counted.clone(),
        counted_from_finished_at: observed.counted_from_finished_at_summary(),
        time_to_complete_secs: match spec {
            Spec::Indexed { .. } => observed.time_to_complete_secs,
            _ => None,
        },
        requests: api.requests.iter().map(|((v, r), n)| (format!("{v} {r}"), *n)).collect(),
        response_bytes: api.response_bytes,
        response_bytes_by_request: api
            .response_bytes_by
            .iter()
            .map(|((v, r), n)| (format!("{v} {r}"), *n))
            .collect(),
        watch_event_bytes: api.watch_event_bytes,
        processes,
        watch_errors: rec.watch_errors(),
        terminated_watchers: api.terminated_watchers,
        controller_writes: controller_writes(info, upstream, matches!(spec, Spec::Indexed { .. })),
        controller_peak_rate: controller_peak_rate(info, upstream),
        tenants,
        machine_cpu_secs: (after.machine_cpu - before.machine_cpu).max(0.0),
        baseline_requests_per_s: baseline_rate,
        settle_secs,
        apiserver_cpu,
    };
    Ok((figures, observed))
}

/// Profiles kube-apiserver's CPU in [`PROFILE_CHUNK_SECS`] pieces until `run_over`, keeping
/// each profile in the cluster's folder (`kube-apiserver-cpu-<n>.pprof`, for `go tool pprof`);
/// their sum split by part, or `None` when no profile could be taken.
async fn profile_apiserver(
    client: kube::Client,
    dir: PathBuf,
    run_over: Arc<AtomicBool>,
) -> Option<CpuByPart> {
    use futures::AsyncReadExt;
    let mut sum: Option<CpuByPart> = None;
    for n in 1.. {
        if run_over.load(Ordering::Relaxed) {
            break;
        }
        let uri = format!("/debug/pprof/profile?seconds={PROFILE_CHUNK_SECS}");
        let fetched = async {
            let req = http::Request::get(uri).body(Vec::new())?;
            let mut body = Vec::new();
            client.request_stream(req).await?.read_to_end(&mut body).await?;
            let part = pprof::cpu_by_part(&pprof::decode(&body)?)?;
            std::fs::write(dir.join(format!("kube-apiserver-cpu-{n}.pprof")), &body)?;
            anyhow::Ok(part)
        };
        let limit = Duration::from_secs(PROFILE_CHUNK_SECS) + CALL_TIMEOUT;
        match tokio::time::timeout(limit, fetched).await {
            Ok(Ok(part)) => sum.get_or_insert_with(CpuByPart::default).add(&part),
            Ok(Err(e)) => {
                tracing::warn!(error = format!("{e:#}"), "profiling kube-apiserver failed");
                break;
            }
            Err(_) => {
                tracing::warn!("profiling kube-apiserver timed out");
                break;
            }
        }
    }
    sum
}

/// The audit log's username of the configuration's Job controller.
fn controller_user(upstream: bool) -> String {
    if upstream {
        UPSTREAM_JOB_CONTROLLER_USER.to_string()
    } else {
        format!("system:serviceaccount:{KJOB_NAMESPACE}:kjob-worker")
    }
}

/// The Job controller's peak request rate over any 10 s of the run's audit log (see
/// [`RunFigures::controller_peak_rate`]); `None` when the log cannot be read or is empty.
fn controller_peak_rate(info: &ClusterInfo, upstream: bool) -> Option<f64> {
    let text = std::fs::read_to_string(&info.audit_log).ok()?;
    kjob_bench::audit::peak_request_rate(
        &text,
        &controller_user(upstream),
        kjob_bench::upstream::PEAK_RATE_WINDOW_SECS,
    )
    .map(|(rate, _)| rate)
}

/// The Job controller's writes in the run's audit log (kube-controller-manager's Job controller
/// for upstream, kjob's workers otherwise), with the create rounds when `one_job` synced; none
/// when the log cannot be read.
fn controller_writes(info: &ClusterInfo, upstream: bool, one_job: bool) -> ControllerWrites {
    let user = controller_user(upstream);
    match std::fs::read_to_string(&info.audit_log) {
        Ok(text) => kjob_bench::audit::controller_writes(&text, &user, one_job),
        Err(e) => {
            tracing::warn!(path = %info.audit_log.display(), error = %e, "audit log unreadable");
            ControllerWrites::default()
        }
    }
}
