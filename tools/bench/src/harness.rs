//! The harness side of both benchmarks: creating Jobs (noting when each create returned) and
//! watching Jobs and Pods of the benchmark namespace, with the moment each event arrived. Every
//! configuration is observed the same way, through the harness's own client, so the figures
//! compare.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde_json::json;

use crate::stats::{rate, summarize};
use crate::upstream::Latency;
use tokio::task::JoinSet;

/// Namespace every benchmark object lives in.
pub const NAMESPACE: &str = "default";

/// How long the two watches may take to list.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a run waiting for its Jobs checks whether they are done.
const POLL: Duration = Duration::from_millis(200);
/// How often a waiting run says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// A pod seen finished: when its terminal phase arrived, and its container's `finishedAt`.
#[derive(Debug, Clone, Copy)]
struct Finished {
    seen: Instant,
    finished_at: Option<jiff::Timestamp>,
}

/// Per-Job observations.
#[derive(Debug, Default)]
struct JobTrack {
    created: Option<Instant>,
    first_pod: Option<Instant>,
    last_pod: Option<Instant>,
    pods: u64,
    finished: Option<Instant>,
    counted: u64,
    finished_pods: VecDeque<Finished>,
    counted_latency: Vec<f64>,
    counted_from_finished_at: Vec<f64>,
}

/// What a run counted of its Jobs and pods, and in how long: the figures both benchmarks'
/// rates come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Jobs created.
    pub jobs: u64,
    /// Jobs that reached Complete or Failed.
    pub jobs_finished: u64,
    /// Pods seen created.
    pub pods_created: u64,
    /// Seconds from the first Job created to the last one finished (the run's end when some
    /// did not).
    pub elapsed_secs: f64,
    /// Seconds from the first Job created to the last pod seen.
    pub pods_window_secs: f64,
    /// Seconds from the first Job created to the last (how long the clients took to create
    /// them: on a saturated API server a controller's load slows its clients' creates too).
    pub jobs_window_secs: f64,
    /// Whether the run hit its deadline before every Job finished.
    pub timed_out: bool,
}

impl Counts {
    /// Pods created per second.
    pub fn pods_per_sec(&self) -> f64 {
        rate(self.pods_created, self.pods_window_secs)
    }
    /// Jobs the clients created per second (one Job: none, it has no window).
    pub fn jobs_created_per_sec(&self) -> f64 {
        if self.jobs < 2 { 0.0 } else { rate(self.jobs, self.jobs_window_secs) }
    }
    /// Jobs finished per second.
    pub fn jobs_per_sec(&self) -> f64 {
        rate(self.jobs_finished, self.elapsed_secs)
    }
}

/// What a run measured of its Jobs.
#[derive(Debug, Default)]
pub struct Observed {
    /// The Jobs and pods counted (`timed_out` is the caller's to set).
    pub counts: Counts,
    /// Job created → first pod, seconds, sorted.
    pub first_pod: Vec<f64>,
    /// Pod seen finished → counted, seconds, sorted.
    pub counted: Vec<f64>,
    /// Container `finishedAt` → counted, seconds, sorted.
    pub counted_from_finished_at: Vec<f64>,
    /// Created → finished of the first Job (the Indexed workload has one).
    pub time_to_complete_secs: Option<f64>,
    /// Created → finished (Complete or Failed) of every Job that finished, seconds, sorted.
    pub complete: Vec<f64>,
}

impl Observed {
    /// Summary of [`Observed::first_pod`].
    pub fn first_pod_summary(&self) -> Option<Latency> {
        summarize(&mut self.first_pod.clone()).map(Latency::from)
    }
    /// Summary of [`Observed::counted`].
    pub fn counted_summary(&self) -> Option<Latency> {
        summarize(&mut self.counted.clone()).map(Latency::from)
    }
    /// Summary of [`Observed::counted_from_finished_at`].
    pub fn counted_from_finished_at_summary(&self) -> Option<Latency> {
        summarize(&mut self.counted_from_finished_at.clone()).map(Latency::from)
    }
}

/// Watches Jobs and Pods and keeps what the figures need.
#[derive(Clone, Default)]
pub struct Recorder {
    jobs: Arc<Mutex<HashMap<String, JobTrack>>>,
    /// Pod uids seen, and those seen terminal.
    pods: Arc<Mutex<(HashSet<String>, HashSet<String>)>>,
    watch_errors: Arc<AtomicU64>,
}

fn finished_at(pod: &Pod) -> Option<jiff::Timestamp> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0))
        .max()
}

impl Recorder {
    /// Notes that the create call of `job` returned at `at`.
    pub fn submitted(&self, job: &str, at: Instant) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let t = jobs.entry(job.to_string()).or_default();
        t.created = Some(t.created.map_or(at, |c| c.min(at)));
    }

    fn on_job(&self, job: &Job, now: Instant, wall: jiff::Timestamp) {
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
                let Some(f) = t.finished_pods.pop_front() else { break };
                t.counted_latency.push(now.saturating_duration_since(f.seen).as_secs_f64());
                if let Some(at) = f.finished_at {
                    let secs = wall.duration_since(at).as_secs_f64();
                    t.counted_from_finished_at.push(secs.max(0.0));
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
            t.finished_pods.push_back(Finished { seen: now, finished_at: finished_at(pod) });
        }
    }

    /// Starts the Job and Pod watches of `namespace` (`None`: every namespace, where Job names
    /// must then be unique across namespaces: Jobs are told apart by name); returns once both
    /// have listed.
    pub async fn start(
        &self,
        client: kube::Client,
        namespace: Option<&str>,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(2);
        let (jobs, pods): (Api<Job>, Api<Pod>) = match namespace {
            Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client, ns)),
            None => (Api::all(client.clone()), Api::all(client)),
        };
        let (r, t) = (self.clone(), tx.clone());
        tasks.spawn(async move {
            let mut s = watcher(jobs, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = s.next().await {
                let (now, wall) = (Instant::now(), jiff::Timestamp::now());
                match ev {
                    Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) => {
                        r.on_job(&j, now, wall)
                    }
                    Ok(watcher::Event::InitDone) => {
                        let _ = t.try_send(());
                    }
                    Ok(_) => {}
                    Err(e) => r.watch_failed("jobs", &e),
                }
            }
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
        });
        for _ in 0..2 {
            tokio::time::timeout(SYNC_TIMEOUT, rx.recv())
                .await
                .context("the harness's watches did not sync")?;
        }
        Ok(())
    }

    // Not fatal: kube's watcher re-lists after a backoff, and the uid sets make replayed
    // objects harmless. Counted so the report shows the harness's view was interrupted.
    fn watch_failed(&self, what: &str, e: &watcher::Error) {
        self.watch_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(watch = what, error = %e, "harness watch failed; it re-lists");
    }

    /// Watch errors seen so far.
    pub fn watch_errors(&self) -> u64 {
        self.watch_errors.load(Ordering::Relaxed)
    }

    /// How many of `names` have finished.
    pub fn finished(&self, names: &[String]) -> usize {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        names.iter().filter(|n| jobs.get(*n).is_some_and(|t| t.finished.is_some())).count()
    }

    /// Waits until every Job of `names` has finished, calling `alive` (which fails when the
    /// system under test died) at every poll; `Ok(true)` when `deadline` passed first.
    pub async fn wait_finished(
        &self,
        names: &[String],
        deadline: Instant,
        mut alive: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<bool> {
        let mut last_report = Instant::now();
        while self.finished(names) < names.len() {
            alive()?;
            if Instant::now() > deadline {
                tracing::warn!(finished = self.finished(names), of = names.len(), "run timed out");
                return Ok(true);
            }
            if last_report.elapsed() > PROGRESS_EVERY {
                tracing::info!(finished = self.finished(names), of = names.len(), "waiting");
                last_report = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(false)
    }

    /// The figures of the Jobs `names`, created from `t0`; the run ended at `end`.
    pub fn observed(&self, names: &[String], t0: Instant, end: Instant) -> Observed {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Observed::default();
        out.counts.jobs = names.len() as u64;
        let (mut last_finish, mut last_pod, mut last_created) =
            (None::<Instant>, None::<Instant>, None::<Instant>);
        let mut all_finished = true;
        for (i, n) in names.iter().enumerate() {
            let Some(t) = jobs.get(n) else {
                all_finished = false;
                continue;
            };
            out.counts.pods_created += t.pods;
            if let (Some(c), Some(p)) = (t.created, t.first_pod) {
                out.first_pod.push(p.saturating_duration_since(c).as_secs_f64());
            }
            out.counted.extend_from_slice(&t.counted_latency);
            out.counted_from_finished_at.extend_from_slice(&t.counted_from_finished_at);
            match t.finished {
                Some(f) => {
                    out.counts.jobs_finished += 1;
                    if let Some(c) = t.created {
                        out.complete.push(f.saturating_duration_since(c).as_secs_f64());
                    }
                    last_finish = last_finish.max(Some(f));
                    if i == 0 {
                        out.time_to_complete_secs =
                            t.created.map(|c| f.saturating_duration_since(c).as_secs_f64());
                    }
                }
                None => all_finished = false,
            }
            last_pod = last_pod.max(t.last_pod);
            last_created = last_created.max(t.created);
        }
        let finish = if all_finished { last_finish.unwrap_or(end) } else { end };
        out.counts.elapsed_secs = finish.saturating_duration_since(t0).as_secs_f64();
        out.counts.pods_window_secs =
            last_pod.unwrap_or(end).saturating_duration_since(t0).as_secs_f64();
        out.counts.jobs_window_secs =
            last_created.unwrap_or(end).saturating_duration_since(t0).as_secs_f64();
        for v in [
            &mut out.first_pod,
            &mut out.counted,
            &mut out.counted_from_finished_at,
            &mut out.complete,
        ] {
            v.sort_by(f64::total_cmp);
        }
        out
    }
}

/// A benchmark Job in [`NAMESPACE`]: `completions` pods that each run for `run_time` (on
/// kjob-sim's kubelet and kjob-node-agent alike), `spec.managedBy` set to `managed_by` (unset:
/// upstream takes it, and kjob too with `--manage-all-jobs`).
pub fn job(
    name: &str,
    managed_by: Option<&str>,
    completions: i32,
    parallelism: i32,
    indexed: bool,
    run_time: Duration,
) -> Job {
    let mut spec = json!({
        "completions": completions,
        "parallelism": parallelism,
        "template": {
            "metadata": {"annotations": {"kjob.io/sim-run-time": format!("{}ms", run_time.as_millis())}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
        }
    });
    if let Some(controller) = managed_by {
        spec["managedBy"] = json!(controller);
    }
    if indexed {
        spec["completionMode"] = json!("Indexed");
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "kjob-bench"}},
        "spec": spec
    }))
    .expect("a literal Job decodes")
}

/// Creates Jobs through one namespaced API, noting each create in a [`Recorder`].
#[derive(Clone)]
pub struct Creator {
    api: Api<Job>,
    rec: Recorder,
    /// Bound of each create call.
    timeout: Duration,
}

impl Creator {
    /// Creates through `api`, each call bounded by `timeout`, noting the creates in `rec`.
    pub fn new(api: Api<Job>, rec: Recorder, timeout: Duration) -> Self {
        Self { api, rec, timeout }
    }

    /// Creates one Job and notes when the create returned.
    pub async fn one(&self, job: &Job) -> anyhow::Result<()> {
        let name = job.metadata.name.clone().unwrap_or_default();
        tokio::time::timeout(self.timeout, self.api.create(&PostParams::default(), job))
            .await
            .with_context(|| format!("creating Job {name} timed out"))?
            .with_context(|| format!("creating Job {name}"))?;
        self.rec.submitted(&name, Instant::now());
        Ok(())
    }

    /// Creates `jobs` with `clients` concurrent creators (a burst).
    pub async fn burst(&self, jobs: Vec<Job>, clients: usize) -> anyhow::Result<()> {
        let queue = Arc::new(Mutex::new(jobs));
        let mut set: JoinSet<anyhow::Result<()>> = JoinSet::new();
        for _ in 0..clients.max(1) {
            let (me, queue) = (self.clone(), queue.clone());
            set.spawn(async move {
                loop {
                    let Some(j) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                        return Ok(());
                    };
                    me.one(&j).await?;
                }
            });
        }
        join_creators(&mut set).await
    }

    /// Creates `jobs` at `rate` per second (open loop: each on its schedule, however long
    /// earlier creates take).
    pub async fn paced(&self, jobs: Vec<Job>, rate: f64) -> anyhow::Result<()> {
        anyhow::ensure!(rate > 0.0, "pace must be positive, got {rate}");
        let t0 = tokio::time::Instant::now();
        let mut set: JoinSet<anyhow::Result<()>> = JoinSet::new();
        for (i, j) in jobs.into_iter().enumerate() {
            tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
            let me = self.clone();
            set.spawn(async move { me.one(&j).await });
            // Reap finished creates as we go so the set stays small.
            while let Some(r) = set.try_join_next() {
                r.context("creator task")??;
            }
        }
        join_creators(&mut set).await
    }
}

async fn join_creators(set: &mut JoinSet<anyhow::Result<()>>) -> anyhow::Result<()> {
    while let Some(r) = set.join_next().await {
        r.context("creator task")??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, job: &str, phase: &str, finished_at: Option<&str>) -> Pod {
        let mut v = json!({
            "metadata": {"name": uid, "uid": uid, "labels": {kjob_core::JOB_NAME_LABEL: job}},
            "status": {"phase": phase}
        });
        if let Some(at) = finished_at {
            v["status"]["containerStatuses"] = json!([{
                "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "finishedAt": at}}
            }]);
        }
        serde_json::from_value(v).unwrap()
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
    fn first_pod_counted_and_time_to_complete() {
        let rec = Recorder::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let wall: jiff::Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
        rec.submitted("a", at(0));
        rec.on_pod(&pod("p1", "a", "Pending", None), at(300));
        rec.on_pod(&pod("p2", "a", "Pending", None), at(400));
        rec.on_pod(&pod("p1", "a", "Running", None), at(500));
        rec.on_pod(&pod("p1", "a", "Succeeded", Some("2026-01-01T00:00:09Z")), at(1000));
        rec.on_pod(&pod("p1", "a", "Succeeded", Some("2026-01-01T00:00:09Z")), at(1100));
        rec.on_pod(&pod("p2", "a", "Succeeded", None), at(1200));
        rec.on_job(&job_status("a", 1, false), at(1500), wall);
        assert_eq!(rec.finished(&["a".into()]), 0);
        rec.on_job(&job_status("a", 2, true), at(2000), wall);
        assert_eq!(rec.finished(&["a".into()]), 1);

        let o = rec.observed(&["a".into()], t0, at(5000));
        assert_eq!(o.first_pod, vec![0.3]);
        assert_eq!(o.counted, vec![0.5, 0.8]);
        // Only p1 had a finishedAt: 1 s before the count arrived.
        assert_eq!(o.counted_from_finished_at, vec![1.0]);
        assert_eq!((o.counts.jobs, o.counts.pods_created, o.counts.jobs_finished), (1, 2, 1));
        assert_eq!(o.time_to_complete_secs, Some(2.0));
        assert_eq!(o.complete, vec![2.0]);
        assert!((o.counts.elapsed_secs - 2.0).abs() < 1e-9);
        assert!((o.counts.pods_window_secs - 0.4).abs() < 1e-9);
        // A Job that never finished stretches the run to its end.
        let o = rec.observed(&["a".into(), "missing".into()], t0, at(5000));
        assert!((o.counts.elapsed_secs - 5.0).abs() < 1e-9);
        assert_eq!(o.counts.jobs_window_secs, 0.0, "one Job, created at t0");
        // The clients' window ends at the last create.
        rec.submitted("b", at(700));
        let o = rec.observed(&["a".into(), "b".into()], t0, at(5000));
        assert!((o.counts.jobs_window_secs - 0.7).abs() < 1e-9);
    }
}
