//! The harness side of a run: creating Jobs, watching Jobs and Pods (timestamps taken when
//! events arrive), snapshots of counters before and after a phase, and the sim-limit loop.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_bench::procfs::{Usage, read_usage};
use kjob_bench::promtext;
use kjob_bench::redisinfo;
use kjob_bench::report::{LimitResult, PhaseResult, ProcessUsage};
use kjob_bench::stats::summarize;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::JoinSet;

use crate::stack::{Stack, redis_url, worker_admin_urls};

/// Timeout of every single API, metrics or Redis call the harness makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Namespace every benchmark object lives in.
pub const NAMESPACE: &str = "default";
/// How often the harness checks whether a phase is done.
const POLL: Duration = Duration::from_millis(200);
/// Redis commands the harness itself sends when taking a snapshot.
const HARNESS_REDIS_COMMANDS: [&str; 3] = ["info", "hello", "client|setinfo"];

/// Per-Job observations.
#[derive(Debug, Default)]
struct JobTrack {
    created: Option<Instant>,
    first_pod: Option<Instant>,
    last_pod: Option<Instant>,
    pods: u64,
    finished: Option<Instant>,
    counted: u64,
    finished_pods: VecDeque<Instant>,
    counted_latency: Vec<f64>,
}

/// Watches Jobs and Pods and keeps what the latency figures need.
#[derive(Clone, Default)]
pub struct Recorder {
    jobs: Arc<Mutex<HashMap<String, JobTrack>>>,
    pods: Arc<Mutex<(HashSet<String>, HashSet<String>)>>,
    watch_errors: Arc<std::sync::atomic::AtomicU64>,
}

impl Recorder {
    /// Notes that the create call of `job` returned at `at`.
    pub fn submitted(&self, job: &str, at: Instant) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let t = jobs.entry(job.to_string()).or_default();
        t.created = Some(t.created.map_or(at, |c| c.min(at)));
    }

    fn on_job(&self, job: &Job, now: Instant) {
        let Some(name) = job.metadata.name.clone() else { return };
        let status = job.status.clone().unwrap_or_default();
        let counted = (status.succeeded.unwrap_or(0) + status.failed.unwrap_or(0)).max(0) as u64;
        let done = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let t = jobs.entry(name).or_default();
        t.created.get_or_insert(now);
        if counted > t.counted {
            // Pods are matched to counts in the order they were seen finishing.
            for _ in t.counted..counted {
                match t.finished_pods.pop_front() {
                    Some(f) => t.counted_latency.push(now.duration_since(f).as_secs_f64()),
                    None => break,
                }
            }
            t.counted = counted;
        }
        if done && t.finished.is_none() {
            t.finished = Some(now);
        }
    }

    fn on_pod(&self, pod: &Pod, now: Instant) {
        let (Some(uid), Some(job)) = (
            pod.metadata.uid.clone(),
            pod.metadata.labels.as_ref().and_then(|l| l.get(kjob_core::JOB_NAME_LABEL)).cloned(),
        ) else {
            return;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminal = matches!(phase, Some("Succeeded" | "Failed"));
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let new = pods.0.insert(uid.clone());
        let newly_finished = terminal && pods.1.insert(uid);
        drop(pods);
        if !new && !newly_finished {
            return;
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let t = jobs.entry(job).or_default();
        if new {
            t.pods += 1;
            t.first_pod.get_or_insert(now);
            t.last_pod = Some(now);
        }
        if newly_finished {
            t.finished_pods.push_back(now);
        }
    }

    /// Starts the Job and Pod watches; returns once both have listed.
    pub async fn start(
        &self,
        client: kube::Client,
        tasks: &mut JoinSet<anyhow::Result<()>>,
    ) -> anyhow::Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(2);
        let jobs: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
        let (r, t) = (self.clone(), tx.clone());
        tasks.spawn(async move {
            let mut s = watcher(jobs, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = s.next().await {
                let now = Instant::now();
                match ev {
                    Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) => {
                        r.on_job(&j, now)
                    }
                    Ok(watcher::Event::InitDone) => {
                        let _ = t.try_send(());
                    }
                    Ok(_) => {}
                    Err(e) => r.watch_failed("jobs", &e),
                }
            }
            Ok(())
        });
        let r = self.clone();
        tasks.spawn(async move {
            let mut s = watcher(pods, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = s.next().await {
                let now = Instant::now();
                match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        r.on_pod(&p, now)
                    }
                    Ok(watcher::Event::InitDone) => {
                        let _ = tx.try_send(());
                    }
                    Ok(_) => {}
                    Err(e) => r.watch_failed("pods", &e),
                }
            }
            Ok(())
        });
        for _ in 0..2 {
            tokio::time::timeout(CALL_TIMEOUT, rx.recv()).await.context("watches did not sync")?;
        }
        Ok(())
    }

    // A watch error (a 410 after a cut stream, a refused request) is not fatal: kube's watcher
    // re-lists after a backoff and the uid sets make replayed objects harmless. Counted so the
    // report shows that the harness's own view was interrupted.
    fn watch_failed(&self, what: &str, e: &watcher::Error) {
        self.watch_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(watch = what, error = %e, "harness watch failed; it re-lists");
    }

    /// Watch errors the harness has seen (each followed by a re-list).
    pub fn watch_errors(&self) -> u64 {
        self.watch_errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many of `names` have finished.
    pub fn finished(&self, names: &[String]) -> usize {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        names.iter().filter(|n| jobs.get(*n).is_some_and(|t| t.finished.is_some())).count()
    }

    /// Fills the throughput and latency figures of `out` for the Jobs `names`, submitted from
    /// `t0`; the phase ended at `end`.
    fn fill(
        &self,
        names: &[String],
        t0: Instant,
        end: Instant,
        out: &mut PhaseResult,
    ) -> (Vec<f64>, Vec<f64>) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let (mut first, mut counted) = (Vec::new(), Vec::new());
        let mut last_finish = None::<Instant>;
        let mut last_pod = None::<Instant>;
        for t in names.iter().filter_map(|n| jobs.get(n)) {
            out.pods_created += t.pods;
            if let (Some(c), Some(p)) = (t.created, t.first_pod) {
                first.push(p.saturating_duration_since(c).as_secs_f64());
            }
            counted.extend_from_slice(&t.counted_latency);
            if let Some(f) = t.finished {
                out.jobs_finished += 1;
                last_finish = last_finish.max(Some(f));
            }
            last_pod = last_pod.max(t.last_pod);
        }
        let finish = if out.timed_out { end } else { last_finish.unwrap_or(end) };
        out.elapsed_secs = finish.duration_since(t0).as_secs_f64();
        out.pods_window_secs = last_pod.unwrap_or(end).saturating_duration_since(t0).as_secs_f64();
        out.first_pod_latency = summarize(&mut first);
        out.counted_latency = summarize(&mut counted);
        (first, counted)
    }
}

/// A Job for the benchmark: `completions` pods that each run for `run_time`.
pub fn job(
    name: &str,
    controller: &str,
    completions: i32,
    parallelism: i32,
    indexed: bool,
    run_time: Duration,
) -> anyhow::Result<Job> {
    let mut spec = json!({
        "managedBy": controller,
        "completions": completions,
        "parallelism": parallelism,
        "template": {
            "metadata": {"annotations": {"kjob.io/sim-run-time": format!("{}ms", run_time.as_millis())}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
        }
    });
    if indexed {
        spec["completionMode"] = json!("Indexed");
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "kjob-bench"}},
        "spec": spec
    }))?)
}

/// Creates one Job (bounded by [`CALL_TIMEOUT`]) and notes when it was submitted.
async fn create_one(api: &Api<Job>, rec: &Recorder, job: &Job) -> anyhow::Result<()> {
    let name = job.metadata.name.clone().unwrap_or_default();
    tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), job))
        .await
        .with_context(|| format!("creating Job {name} timed out"))?
        .with_context(|| format!("creating Job {name}"))?;
    rec.submitted(&name, Instant::now());
    Ok(())
}

/// Creates `jobs` with `clients` concurrent creators, noting each in `rec`.
pub async fn create_jobs(
    client: &kube::Client,
    rec: &Recorder,
    jobs: Vec<Job>,
    clients: usize,
) -> anyhow::Result<()> {
    let api: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
    let queue = Arc::new(Mutex::new(jobs));
    let mut set: JoinSet<anyhow::Result<()>> = JoinSet::new();
    for _ in 0..clients.max(1) {
        let (api, queue, rec) = (api.clone(), queue.clone(), rec.clone());
        set.spawn(async move {
            loop {
                let Some(j) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                    return Ok(());
                };
                create_one(&api, &rec, &j).await?;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.context("creator task")??;
    }
    Ok(())
}

/// Creates `jobs` at `rate` per second (open loop: each on its schedule, however long earlier
/// creates take), noting each in `rec`.
pub async fn create_jobs_paced(
    client: &kube::Client,
    rec: &Recorder,
    jobs: Vec<Job>,
    rate: f64,
) -> anyhow::Result<()> {
    anyhow::ensure!(rate > 0.0, "pace must be positive, got {rate}");
    let api: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
    let t0 = tokio::time::Instant::now();
    let mut set: JoinSet<anyhow::Result<()>> = JoinSet::new();
    for (i, j) in jobs.into_iter().enumerate() {
        tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
        let (api, rec) = (api.clone(), rec.clone());
        set.spawn(async move { create_one(&api, &rec, &j).await });
        // Reap finished creates as we go so the set stays small.
        while let Some(r) = set.try_join_next() {
            r.context("creator task")??;
        }
    }
    while let Some(r) = set.join_next().await {
        r.context("creator task")??;
    }
    Ok(())
}

/// Counters and resource use at one moment.
pub struct Snapshot {
    at: Instant,
    sim: BTreeMap<Vec<String>, f64>,
    workers: BTreeMap<Vec<String>, f64>,
    syncs: f64,
    redis: BTreeMap<String, u64>,
    usage: Vec<(String, Usage)>,
}

async fn get_text(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let resp =
        http.get(url).timeout(CALL_TIMEOUT).send().await.with_context(|| format!("GET {url}"))?;
    Ok(resp.error_for_status()?.text().await?)
}

/// Takes a snapshot of `stack`.
pub async fn snapshot(
    stack: &Stack,
    http: &reqwest::Client,
    ticks: f64,
) -> anyhow::Result<Snapshot> {
    let at = Instant::now();
    let sim_text = get_text(http, &format!("{}/metrics", stack.sim_url)).await?;
    let sim =
        promtext::sum_by(&sim_text, "kjob_sim_apiserver_requests_total", &["verb", "resource"]);
    let mut workers = BTreeMap::new();
    let mut syncs = 0.0;
    for admin in &worker_admin_urls(stack) {
        let text = get_text(http, &format!("{admin}/metrics")).await?;
        for (k, v) in promtext::sum_by(&text, "kjob_worker_api_calls_total", &["verb", "resource"])
        {
            *workers.entry(k).or_insert(0.0) += v;
        }
        syncs += promtext::total(&text, "job_controller_job_syncs_total");
    }
    let redis = if let Some(url) = redis_url(stack) {
        let client = redis::Client::open(url)?;
        let info: String = tokio::time::timeout(CALL_TIMEOUT, async {
            let mut con = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO").arg("commandstats").query_async::<String>(&mut con).await
        })
        .await
        .context("redis INFO timed out")??;
        redisinfo::command_calls(&info)
    } else {
        BTreeMap::new()
    };
    let usage = stack
        .pids()
        .into_iter()
        .filter_map(|(name, pid)| read_usage(pid, ticks).ok().map(|u| (name, u)))
        .collect();
    Ok(Snapshot { at, sim, workers, syncs, redis, usage })
}

fn diff(
    a: &BTreeMap<Vec<String>, f64>,
    b: &BTreeMap<Vec<String>, f64>,
) -> Vec<(String, String, u64)> {
    b.iter()
        .filter_map(|(k, v)| {
            let d = (v - a.get(k).copied().unwrap_or(0.0)).max(0.0) as u64;
            (d > 0).then(|| (k[0].clone(), k.get(1).cloned().unwrap_or_default(), d))
        })
        .collect()
}

/// One workload phase: what to create and how long to wait.
pub struct Phase {
    /// Report name.
    pub name: String,
    /// The Jobs.
    pub jobs: Vec<Job>,
    /// Concurrent creators.
    pub creators: usize,
    /// Deadline for every Job to finish.
    pub timeout: Duration,
    /// Jobs created per second; `None` creates them all as fast as the creators can.
    pub pace: Option<f64>,
}

/// Runs `phase` on `stack` and returns its figures and the raw latency samples
/// (first-pod, counted).
pub async fn run_phase(
    stack: &mut Stack,
    client: &kube::Client,
    rec: &Recorder,
    http: &reqwest::Client,
    ticks: f64,
    phase: Phase,
) -> anyhow::Result<(PhaseResult, Vec<f64>, Vec<f64>)> {
    let names: Vec<String> = phase.jobs.iter().filter_map(|j| j.metadata.name.clone()).collect();
    let before = snapshot(stack, http, ticks).await?;
    let watch_errors = rec.watch_errors();
    let t0 = Instant::now();
    let deadline = t0 + phase.timeout;
    match phase.pace {
        Some(rate) => create_jobs_paced(client, rec, phase.jobs, rate).await?,
        None => create_jobs(client, rec, phase.jobs, phase.creators).await?,
    }
    tracing::info!(phase = %phase.name, secs = t0.elapsed().as_secs_f64(), "all Jobs created");
    let mut timed_out = false;
    let mut last_report = Instant::now();
    while rec.finished(&names) < names.len() {
        stack.check_alive()?;
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            tracing::info!(phase = %phase.name, finished = rec.finished(&names), of = names.len(), "waiting");
            last_report = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    }
    let end = Instant::now();
    // Let the last status writes' syncs settle into the counters before reading them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = snapshot(stack, http, ticks).await?;
    let mut out = PhaseResult {
        name: phase.name,
        jobs: names.len() as u64,
        timed_out,
        watch_errors: rec.watch_errors() - watch_errors,
        ..Default::default()
    };
    let (first, counted) = rec.fill(&names, t0, end, &mut out);
    out.api_all = diff(&before.sim, &after.sim);
    out.api_workers = diff(&before.workers, &after.workers);
    out.syncs = (after.syncs - before.syncs).max(0.0) as u64;
    out.redis_commands = redisinfo::delta(&before.redis, &after.redis)
        .into_iter()
        .filter(|(c, _)| !HARNESS_REDIS_COMMANDS.contains(&c.as_str()))
        .collect();
    out.redis_commands.sort_by_key(|c| std::cmp::Reverse(c.1));
    let window = after.at.duration_since(before.at);
    tracing::debug!(?window, "snapshot window");
    out.processes = after
        .usage
        .iter()
        .map(|(name, u)| {
            let b = before
                .usage
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, u)| u.cpu_secs)
                .unwrap_or(0.0);
            ProcessUsage {
                name: name.clone(),
                cpu_secs: (u.cpu_secs - b).max(0.0),
                peak_rss: u.peak_rss,
            }
        })
        .collect();
    Ok((out, first, counted))
}

/// kjob-sim's raw write throughput: `clients` loops POST `pods` pods in all.
pub async fn measure_limit(
    sim_url: &str,
    http: &reqwest::Client,
    pods: u64,
    clients: usize,
) -> anyhow::Result<LimitResult> {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let url = format!("{sim_url}/api/v1/namespaces/{NAMESPACE}/pods");
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..clients.max(1) {
        let (next, url, http) = (next.clone(), url.clone(), http.clone());
        set.spawn(async move {
            let (mut ok, mut err) = (0u64, 0u64);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= pods {
                    return (ok, err);
                }
                let body = json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("limit-{i}"), "labels": {"app.kubernetes.io/part-of": "kjob-bench"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
                });
                match http.post(&url).json(&body).timeout(CALL_TIMEOUT).send().await {
                    Ok(r) if r.status().is_success() => ok += 1,
                    _ => err += 1,
                }
            }
        });
    }
    let (mut created, mut errors) = (0, 0);
    while let Some(r) = set.join_next().await {
        let (o, e) = r.context("limit client task")?;
        created += o;
        errors += e;
    }
    Ok(LimitResult { clients, pods: created, errors, secs: t0.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, job: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "uid": uid, "labels": {kjob_core::JOB_NAME_LABEL: job}},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn job_status(name: &str, succeeded: i32, complete: bool) -> Job {
        let conditions =
            if complete { json!([{"type": "Complete", "status": "True"}]) } else { json!([]) };
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"succeeded": succeeded, "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn recorder_measures_first_pod_and_counting_latency() {
        let rec = Recorder::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        rec.submitted("a", at(0));
        rec.on_pod(&pod("p1", "a", "Pending"), at(300));
        rec.on_pod(&pod("p2", "a", "Pending"), at(400));
        // Repeated events of a known pod change nothing.
        rec.on_pod(&pod("p1", "a", "Running"), at(500));
        rec.on_pod(&pod("p1", "a", "Succeeded"), at(1000));
        rec.on_pod(&pod("p1", "a", "Succeeded"), at(1100));
        rec.on_pod(&pod("p2", "a", "Succeeded"), at(1200));
        rec.on_job(&job_status("a", 1, false), at(1500));
        assert_eq!(rec.finished(&["a".into()]), 0);
        rec.on_job(&job_status("a", 2, true), at(2000));
        assert_eq!(rec.finished(&["a".into()]), 1);

        let mut out = PhaseResult::default();
        let (first, counted) = rec.fill(&["a".into(), "missing".into()], t0, at(5000), &mut out);
        assert_eq!(first, vec![0.3]);
        assert_eq!(counted, vec![0.5, 0.8]);
        assert_eq!((out.pods_created, out.jobs_finished), (2, 1));
        assert!((out.elapsed_secs - 2.0).abs() < 1e-9);
        assert!((out.pods_window_secs - 0.4).abs() < 1e-9);
        assert_eq!(out.counted_latency.map(|s| s.p99), Some(0.8));
    }
}
