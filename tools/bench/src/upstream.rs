//! The side-by-side benchmark against kube-controller-manager's Job controller (issue 16) as
//! plain data: the configurations and the order they run in, the figures of one run, their
//! summary per configuration, the ratios kjob ÷ upstream-tuned judged against the issue's
//! targets, and the Markdown report. `src/bin/kjob-bench-upstream` does the I/O around them.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use crate::audit::{ControllerWrites, CreateRounds, ServerTime};
use crate::harness::Counts;
use crate::pprof::CpuByPart;
use crate::report::Provenance;
use crate::stats::Summary;

/// Id of the configuration every ratio divides by: upstream tuned as operators tune it.
pub const BASELINE: &str = "b";
/// Id of kjob with one worker (the `_1w` ratios).
pub const KJOB_1W: &str = "c";
/// Id of kjob with two workers (the `_2w` ratios).
pub const KJOB_2W: &str = "d";
/// Id of upstream at kube-controller-manager's defaults (the managed-cluster ratios).
pub const UPSTREAM_DEFAULTS: &str = "a";
/// Id of upstream with the total budget of kjob's two workers (the `_2w_budget` ratios).
pub const BUDGET_2W: &str = "b2";
/// Resamples of the bootstrap behind every ratio's 95 % interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// What a run creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Single-pod Jobs created at once.
    Burst,
    /// One Indexed Job with many completions.
    Indexed,
    /// Single-pod Jobs created at a steady rate.
    Steady,
    /// One namespace floods the queue with single-pod Jobs while quiet namespaces each create
    /// one every few seconds (issue 45's fairness benchmark).
    Flood,
}

impl Workload {
    /// Every workload, in the order a pass runs them (the steady rate comes from a burst run).
    pub const ALL: [Workload; 4] =
        [Workload::Burst, Workload::Indexed, Workload::Steady, Workload::Flood];

    /// Short name (`burst`, `indexed`, `steady`), as in flags and run folders.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Burst => "burst",
            Workload::Indexed => "indexed",
            Workload::Steady => "steady",
            Workload::Flood => "flood",
        }
    }

    /// The workload called `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.name() == s)
    }
}

/// Which Job controller a configuration runs, with its knobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Controller {
    /// kube-controller-manager's Job controller.
    Upstream {
        /// `--concurrent-job-syncs`.
        concurrent_job_syncs: u32,
        /// `--kube-api-qps`.
        kube_api_qps: u32,
        /// `--kube-api-burst`.
        kube_api_burst: u32,
        /// `--kube-api-content-type`, when not the default (protobuf).
        content_type: Option<String>,
    },
    /// kjob: redis, kjob-queue, one kjob-watcher and `workers` kjob-workers.
    Kjob {
        /// kjob-worker processes.
        workers: usize,
        /// Each worker's `--kube-qps`.
        kube_qps: u32,
        /// Each worker's `--kube-burst`.
        kube_burst: u32,
        /// Each worker's `--concurrency` (syncs in flight).
        concurrency: usize,
        /// The workers' shared budget (`--api-qps-total`, `--api-burst-total`), when set.
        #[serde(skip_serializing_if = "Option::is_none")]
        api_total: Option<(u32, u32)>,
        /// kjob-queue with `--lease-order fifo` (fairness off): the flood's reference.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        lease_fifo: bool,
    },
}

/// kube-controller-manager's own defaults (`--kube-api-qps=20`, `--kube-api-burst=30`,
/// `--concurrent-job-syncs=5`): the budget a managed cluster keeps, which nobody there can
/// raise. The `m<N>` configurations give each of N workers this budget.
pub const MANAGED: (u32, u32, usize) = (20, 30, 5);
/// Most workers an `m<N>` configuration may ask for (each is a process on a 2-core machine).
pub const MANAGED_MAX_WORKERS: usize = 16;
/// The window the workers' peak request rate is taken over (issue 45: the budget holds "over
/// every 10 s window").
pub const PEAK_RATE_WINDOW_SECS: f64 = 10.0;

/// kjob-worker's `--concurrency` in the comparison: the syncs in flight of upstream tuned
/// (`--concurrent-job-syncs=50`), so both sides are tuned alike (kjob's default is upstream's 5).
pub const KJOB_CONCURRENCY: usize = 50;

/// One configuration of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Configuration {
    /// `a`, `b`, `bj`, `c`, `d`.
    pub id: String,
    /// What it is, for people.
    pub label: String,
    /// The controller and its knobs.
    pub controller: Controller,
}

impl Configuration {
    /// The configuration called `id`: (a) upstream defaults, (b) upstream tuned, (bj) upstream
    /// tuned talking JSON, (b2) upstream with the total budget of (d) — twice a worker's QPS,
    /// burst and syncs in flight in one process —, (c) kjob with 1 worker, (d) kjob with 2
    /// workers; kjob's workers get `worker_qps`/`worker_burst`.
    pub fn by_id(id: &str, worker_qps: u32, worker_burst: u32) -> Option<Self> {
        let upstream = |syncs, qps, burst, ct: Option<&str>| Controller::Upstream {
            concurrent_job_syncs: syncs,
            kube_api_qps: qps,
            kube_api_burst: burst,
            content_type: ct.map(str::to_string),
        };
        let kjob = |workers| Controller::Kjob {
            workers,
            kube_qps: worker_qps,
            kube_burst: worker_burst,
            concurrency: KJOB_CONCURRENCY,
            api_total: None,
            lease_fifo: false,
        };
        if let Some(c) = Self::managed(id) {
            return Some(c);
        }
        if id == "cf" {
            let mut c = Self::by_id("c", worker_qps, worker_burst)?;
            if let Controller::Kjob { lease_fifo, .. } = &mut c.controller {
                *lease_fifo = true;
            }
            return Some(Self { id: id.into(), label: "kjob, 1 worker, fairness off".into(), ..c });
        }
        let (label, controller) = match id {
            "a" => ("upstream defaults", upstream(5, 20, 30, None)),
            "b" => ("upstream tuned", upstream(50, 200, 400, None)),
            "bj" => ("upstream tuned, JSON", upstream(50, 200, 400, Some("application/json"))),
            "b2" => (
                "upstream, two workers' budget",
                upstream(2 * KJOB_CONCURRENCY as u32, 2 * worker_qps, 2 * worker_burst, None),
            ),
            "c" => ("kjob, 1 worker", kjob(1)),
            "d" => ("kjob, 2 workers", kjob(2)),
            _ => return None,
        };
        Some(Self { id: id.to_string(), label: label.to_string(), controller })
    }

    /// The managed-cluster configurations: `m<N>`, kjob with N workers each at upstream's
    /// default budget ([`MANAGED`]); `mt<N>`, the same N workers sharing one such budget
    /// (`--api-qps-total`/`--api-burst-total` equal to one process's).
    fn managed(id: &str) -> Option<Self> {
        if id == "f1" {
            let mut c = Self::managed("m1")?;
            if let Controller::Kjob { lease_fifo, .. } = &mut c.controller {
                *lease_fifo = true;
            }
            let label = "kjob, 1 worker at upstream's defaults, fairness off".to_string();
            return Some(Self { id: id.into(), label, ..c });
        }
        let (workers, shared) =
            managed_id(id).filter(|(w, _)| (1..=MANAGED_MAX_WORKERS).contains(w))?;
        let (qps, burst, syncs) = MANAGED;
        let label = if shared {
            format!("kjob, {workers} workers sharing upstream's default budget")
        } else {
            format!("kjob, {workers} worker(s) at upstream's defaults each")
        };
        let controller = Controller::Kjob {
            workers,
            kube_qps: qps,
            kube_burst: burst,
            concurrency: syncs,
            api_total: shared.then_some((qps, burst)),
            lease_fifo: false,
        };
        Some(Self { id: id.to_string(), label, controller })
    }

    /// Workers of an `m<N>` configuration (not `mt<N>`), which the scaling ratios compare.
    pub fn managed_workers(&self) -> Option<usize> {
        match &self.controller {
            Controller::Kjob { workers, api_total: None, .. }
                if self.id == format!("m{workers}") =>
            {
                Some(*workers)
            }
            _ => None,
        }
    }

    /// kjob-queue flags of a kjob configuration.
    pub fn kjob_queue_args(&self) -> Vec<String> {
        match &self.controller {
            Controller::Kjob { lease_fifo: true, .. } => vec!["--lease-order=fifo".into()],
            _ => Vec::new(),
        }
    }

    /// Whether kube-controller-manager's Job controller runs.
    pub fn is_upstream(&self) -> bool {
        matches!(self.controller, Controller::Upstream { .. })
    }

    /// kube-controller-manager flags of this configuration (none for kjob).
    pub fn controller_manager_args(&self) -> Vec<String> {
        match &self.controller {
            Controller::Upstream {
                concurrent_job_syncs,
                kube_api_qps,
                kube_api_burst,
                content_type,
            } => {
                let mut v = vec![
                    format!("--concurrent-job-syncs={concurrent_job_syncs}"),
                    format!("--kube-api-qps={kube_api_qps}"),
                    format!("--kube-api-burst={kube_api_burst}"),
                ];
                if let Some(ct) = content_type {
                    v.push(format!("--kube-api-content-type={ct}"));
                }
                v
            }
            Controller::Kjob { .. } => Vec::new(),
        }
    }

    /// `(workers, worker flags)` of a kjob configuration.
    pub fn kjob_workers(&self) -> Option<(usize, Vec<String>)> {
        match &self.controller {
            Controller::Kjob { workers, kube_qps, kube_burst, concurrency, api_total, .. } => {
                let mut flags = vec![
                    format!("--kube-qps={kube_qps}"),
                    format!("--kube-burst={kube_burst}"),
                    format!("--concurrency={concurrency}"),
                ];
                if let Some((qps, burst)) = api_total {
                    flags.push(format!("--api-qps-total={qps}"));
                    flags.push(format!("--api-burst-total={burst}"));
                }
                Some((*workers, flags))
            }
            Controller::Upstream { .. } => None,
        }
    }
}

/// One run: a fresh control plane, one configuration, one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Pass number from 1.
    pub pass: usize,
    /// The workload.
    pub workload: Workload,
    /// Index into the configuration list.
    pub config: usize,
}

/// The order of runs: each pass runs every workload, and each workload on every configuration
/// — in the given order on odd passes and reversed on even ones, so drift of the machine
/// during the run cancels out between configurations.
pub fn schedule(configs: usize, workloads: &[Workload], passes: usize) -> Vec<Slot> {
    let mut out = Vec::new();
    for pass in 1..=passes {
        let order: Vec<usize> =
            if pass % 2 == 1 { (0..configs).collect() } else { (0..configs).rev().collect() };
        for &workload in workloads {
            out.extend(order.iter().map(|&config| Slot { pass, workload, config }));
        }
    }
    out
}

/// Jobs/s of the steady workload: `flag` when positive, else half of (b)'s Jobs/s in the burst
/// workload, else (no (b) in the run) half of the mean of every burst run's; at least 1.
pub fn steady_rate(flag: f64, baseline_jobs_per_s: Option<f64>, burst_jobs_per_s: &[f64]) -> f64 {
    if flag > 0.0 {
        return flag;
    }
    let base = baseline_jobs_per_s.filter(|r| *r > 0.0).or_else(|| {
        (!burst_jobs_per_s.is_empty())
            .then(|| burst_jobs_per_s.iter().sum::<f64>() / burst_jobs_per_s.len() as f64)
    });
    base.map_or(1.0, |b| (b / 2.0).max(1.0))
}

/// A latency summary in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl From<Summary> for Latency {
    fn from(s: Summary) -> Self {
        Self { count: s.count, p50: s.p50, p99: s.p99, max: s.max, mean: s.mean }
    }
}

/// CPU and peak memory of one process during a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProcessFigures {
    /// Process name (`kube-apiserver`, `kjob-worker-1`, `redis-server`, …).
    pub name: String,
    /// CPU seconds (user + system) during the run.
    pub cpu_secs: f64,
    /// Peak resident set size since the process started (`VmHWM`), bytes.
    pub peak_rss: u64,
    /// Whether it is part of the Job controller of the configuration (kjob's processes, or
    /// kube-controller-manager when its Job controller runs).
    pub controller: bool,
}

/// Raw figures of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunFigures {
    /// Configuration id.
    pub config: String,
    /// Workload name.
    pub workload: String,
    /// Pass number from 1.
    pub pass: usize,
    /// Jobs created and finished, pods created, and in how long.
    #[serde(flatten)]
    pub counts: Counts,
    /// Jobs/s offered (steady workload).
    pub offered_rate: Option<f64>,
    /// Job created → its first pod seen.
    pub first_pod: Option<Latency>,
    /// Every sample behind `first_pod`, seconds, ascending: percentiles over a configuration's
    /// runs are taken of the pooled samples, not averaged.
    pub first_pod_samples: Vec<f64>,
    /// Pod seen finished (its terminal phase arriving on the harness's watch) → counted in
    /// its Job's `succeeded`/`failed`.
    pub counted: Option<Latency>,
    /// Every sample behind `counted`, seconds, ascending.
    pub counted_samples: Vec<f64>,
    /// The same from the container's `finishedAt`, which kube-apiserver keeps to the second
    /// only (so up to 1 s longer).
    pub counted_from_finished_at: Option<Latency>,
    /// Job created → Complete, for the Indexed workload.
    pub time_to_complete_secs: Option<f64>,
    /// API requests by `"VERB resource"` (every client; the other clients are the same in
    /// every configuration).
    pub requests: BTreeMap<String, f64>,
    /// Bytes of kube-apiserver's responses, watches left out (a watch's stream is its events).
    pub response_bytes: f64,
    /// Bytes of kube-apiserver's responses by `"VERB resource"`; a `WATCH` key holds the
    /// streams of the watches that ended during the run (in `watch_event_bytes` already).
    pub response_bytes_by_request: BTreeMap<String, f64>,
    /// Bytes of kube-apiserver's watch events.
    pub watch_event_bytes: f64,
    /// Processes of the control plane and of kjob.
    pub processes: Vec<ProcessFigures>,
    /// Errors of the harness's own watches (each followed by a re-list).
    pub watch_errors: u64,
    /// Watches (of any client) kube-apiserver closed because they read too slowly.
    pub terminated_watchers: f64,
    /// The Job controller's writes as kube-apiserver's audit log timed them.
    pub controller_writes: ControllerWrites,
    /// Busy CPU seconds of the whole machine (every process, every core) during the run.
    pub machine_cpu_secs: f64,
    /// kube-apiserver's requests per second at rest, before the Jobs were created.
    pub baseline_requests_per_s: f64,
    /// Seconds from the last Job finished until the request rate was back at rest (the run's
    /// counters and CPU figures end there).
    pub settle_secs: f64,
    /// kube-apiserver's CPU through the run by what it was doing (from its CPU profiles), when
    /// profiled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apiserver_cpu: Option<CpuByPart>,
    /// The Job controller's most requests received in any [`PEAK_RATE_WINDOW_SECS`], per
    /// second, from the audit log: every request of kjob's workers, or of upstream's
    /// `job-controller` ServiceAccount (on both sides the informers' lists and watches are
    /// another user's: kjob's watcher, kube-controller-manager's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_peak_rate: Option<f64>,
    /// The flood workload's figures per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantFigures>,
}

/// What the flood workload measures of its tenants: the flooding namespace's drain and the
/// quiet namespaces' waits.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TenantFigures {
    /// Jobs the flooding namespace created at once.
    pub flood_jobs: u64,
    /// Quiet namespaces.
    pub quiet_namespaces: usize,
    /// Jobs the quiet namespaces created while the flood drained.
    pub quiet_jobs: u64,
    /// Seconds from the first flood Job created to the last one finished.
    pub flood_drain_secs: f64,
    /// The quiet Jobs' created → first pod, seconds, ascending.
    pub quiet_first_pod_samples: Vec<f64>,
    /// The quiet Jobs' created → Complete, seconds, ascending.
    pub quiet_complete_samples: Vec<f64>,
}

impl RunFigures {
    fn cpu_of(&self, name: &str) -> f64 {
        self.processes.iter().filter(|p| p.name == name).map(|p| p.cpu_secs).sum()
    }
    /// CPU seconds of the Job controller's processes.
    pub fn controller_cpu_secs(&self) -> f64 {
        self.processes.iter().filter(|p| p.controller).map(|p| p.cpu_secs).sum()
    }
    /// Sum of the peak RSS of the Job controller's processes, bytes.
    pub fn controller_peak_rss(&self) -> u64 {
        self.processes.iter().filter(|p| p.controller).map(|p| p.peak_rss).sum()
    }
}

/// Name of kube-apiserver's process.
pub const APISERVER: &str = "kube-apiserver";
/// Name of etcd's process.
pub const ETCD: &str = "etcd";
/// Name of kube-controller-manager's process.
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";

/// The figures of one configuration over all its runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConfigFigures {
    /// Configuration id.
    pub id: String,
    /// Its label.
    pub label: String,
    /// Runs summarised.
    pub runs: usize,
    /// Runs that hit their deadline.
    pub timed_out_runs: usize,
    /// Pods created/s in the burst workload (mean over passes).
    pub pods_per_s: Option<f64>,
    /// Jobs finished/s in the burst workload.
    pub jobs_per_s: Option<f64>,
    /// Jobs the harness's clients created per second in the burst workload: its pods/s cannot
    /// beat this, and a controller that loads kube-apiserver while they create slows it.
    pub jobs_created_per_s: Option<f64>,
    /// Pods created/s of the Indexed Job.
    pub indexed_pods_per_s: Option<f64>,
    /// The Indexed Job's time from created to Complete, seconds.
    pub indexed_time_to_complete_secs: Option<f64>,
    /// p50 Job created → first pod at the steady rate, seconds.
    pub first_pod_p50: Option<f64>,
    /// p99 Job created → first pod at the steady rate, seconds.
    pub first_pod_p99: Option<f64>,
    /// p50 pod finished → counted at the steady rate, seconds.
    pub counted_p50: Option<f64>,
    /// p99 pod finished → counted at the steady rate, seconds.
    pub counted_p99: Option<f64>,
    /// p99 Job created → first pod in the burst workload, seconds.
    pub burst_first_pod_p99: Option<f64>,
    /// p99 pod finished → counted in the burst workload, seconds.
    pub burst_counted_p99: Option<f64>,
    /// Pods created over every run (the denominator of the cost figures).
    pub pods: u64,
    /// API requests per pod by `"VERB resource"`.
    pub requests_per_pod: BTreeMap<String, f64>,
    /// Every API request per pod.
    pub requests_per_pod_total: Option<f64>,
    /// Bytes kube-apiserver sent per pod (responses and watch events).
    pub bytes_sent_per_pod: Option<f64>,
    /// Of which responses.
    pub response_bytes_per_pod: Option<f64>,
    /// Response bytes per pod by `"VERB resource"`.
    pub response_bytes_per_pod_by_request: BTreeMap<String, f64>,
    /// Of which watch events.
    pub watch_event_bytes_per_pod: Option<f64>,
    /// kube-apiserver CPU seconds per 1,000 pods.
    pub apiserver_cpu_per_1k_pods: Option<f64>,
    /// etcd CPU seconds per 1,000 pods.
    pub etcd_cpu_per_1k_pods: Option<f64>,
    /// kube-apiserver + etcd CPU seconds per 1,000 pods.
    pub apiserver_etcd_cpu_per_1k_pods: Option<f64>,
    /// Job controller CPU seconds per 1,000 pods (kube-controller-manager, or every kjob
    /// process with Redis).
    pub controller_cpu_per_1k_pods: Option<f64>,
    /// The Job controller's marginal CPU seconds per 1,000 pods: every kjob process with Redis;
    /// for upstream, kube-controller-manager's CPU less what it spends with its Job controller
    /// off (its CPU in kjob's runs of the same benchmark, per pod), so its other controllers
    /// are counted on neither side. Set by [`summarize_all`].
    pub marginal_controller_cpu_per_1k_pods: Option<f64>,
    /// For upstream: kube-controller-manager's CPU per 1,000 pods in kjob's runs, the part
    /// [`Self::marginal_controller_cpu_per_1k_pods`] leaves out. Set by [`summarize_all`].
    pub controller_manager_rest_per_1k_pods: Option<f64>,
    /// Busy CPU seconds of the whole machine per 1,000 pods.
    pub machine_cpu_per_1k_pods: Option<f64>,
    /// Longest settle after a run's last Job, seconds.
    pub settle_secs_max: Option<f64>,
    /// kube-controller-manager CPU seconds per 1,000 pods (in kjob's runs: its other
    /// controllers alone, the baseline included in upstream's figure).
    pub controller_manager_cpu_per_1k_pods: Option<f64>,
    /// Largest peak RSS of the Job controller over the runs, bytes (kjob: sum over processes).
    pub controller_peak_rss: Option<u64>,
    /// Watches kube-apiserver closed as too slow, over every run.
    pub terminated_watchers: f64,
    /// The highest [`RunFigures::controller_peak_rate`] over the runs, requests/s.
    pub controller_peak_rate: Option<f64>,
    /// Flood: the quiet namespaces' p50 Job created → first pod, pooled, seconds.
    pub flood_quiet_first_pod_p50: Option<f64>,
    /// Flood: the quiet namespaces' p99 Job created → first pod, pooled, seconds.
    pub flood_quiet_first_pod_p99: Option<f64>,
    /// Flood: the quiet namespaces' p50 Job created → Complete, pooled, seconds.
    pub flood_quiet_complete_p50: Option<f64>,
    /// Flood: the quiet namespaces' p99 Job created → Complete, pooled, seconds.
    pub flood_quiet_complete_p99: Option<f64>,
    /// Flood: seconds from the first flood Job created to the last finished (mean over runs).
    pub flood_drain_secs: Option<f64>,
    /// Flood: every Job (the flood's and the quiet namespaces') finished per second.
    pub flood_jobs_per_s: Option<f64>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn per(x: f64, pods: u64, scale: f64) -> Option<f64> {
    (pods > 0).then(|| x * scale / pods as f64)
}

/// The `q`-quantile of every sample `samples` picks from `runs`, pooled; when the runs kept no
/// samples, the mean of their summaries' figure `fallback` picks.
fn pooled<'a>(
    runs: impl Iterator<Item = &'a RunFigures> + Clone,
    samples: fn(&RunFigures) -> &[f64],
    q: f64,
    fallback: fn(&RunFigures) -> Option<f64>,
) -> Option<f64> {
    let mut all: Vec<f64> = runs.clone().flat_map(|r| samples(r).iter().copied()).collect();
    if all.is_empty() {
        return mean(runs.filter_map(fallback));
    }
    all.sort_by(f64::total_cmp);
    crate::stats::percentile(&all, q)
}

/// Summarises the runs of configuration `c` among `runs`.
pub fn summarize_config(c: &Configuration, runs: &[RunFigures]) -> ConfigFigures {
    summarize_refs(c, &runs.iter().collect::<Vec<_>>())
}

/// Every configuration's figures, with the marginal controller CPU set (it needs kjob's runs
/// to know what kube-controller-manager spends with its Job controller off).
pub fn summarize_all(configs: &[Configuration], runs: &[RunFigures]) -> Vec<ConfigFigures> {
    summarize_all_refs(configs, &runs.iter().collect::<Vec<_>>())
}

fn summarize_all_refs(configs: &[Configuration], runs: &[&RunFigures]) -> Vec<ConfigFigures> {
    let kjob: Vec<&str> =
        configs.iter().filter(|c| !c.is_upstream()).map(|c| c.id.as_str()).collect();
    let (kcm_cpu, pods) = runs
        .iter()
        .filter(|r| kjob.contains(&r.config.as_str()))
        .fold((0.0, 0), |(cpu, pods), r| {
            (cpu + r.cpu_of(CONTROLLER_MANAGER), pods + r.counts.pods_created)
        });
    let rest = per(kcm_cpu, pods, 1000.0);
    configs
        .iter()
        .map(|c| {
            let mut f = summarize_refs(c, runs);
            if c.is_upstream() {
                f.controller_manager_rest_per_1k_pods = rest;
                f.marginal_controller_cpu_per_1k_pods = match (f.controller_cpu_per_1k_pods, rest) {
                    (Some(all), Some(rest)) => Some((all - rest).max(0.0)),
                    _ => None,
                };
            } else {
                f.marginal_controller_cpu_per_1k_pods = f.controller_cpu_per_1k_pods;
            }
            f
        })
        .collect()
}

fn summarize_refs(c: &Configuration, runs: &[&RunFigures]) -> ConfigFigures {
    let mine: Vec<&RunFigures> = runs.iter().copied().filter(|r| r.config == c.id).collect();
    let of = |w: Workload| mine.iter().copied().filter(move |r| r.workload == w.name());
    let pods: u64 = mine.iter().map(|r| r.counts.pods_created).sum();
    let (mut requests, mut response_by) = (BTreeMap::new(), BTreeMap::new());
    for r in &mine {
        for (k, v) in &r.requests {
            *requests.entry(k.clone()).or_insert(0.0) += v;
        }
        for (k, v) in &r.response_bytes_by_request {
            *response_by.entry(k.clone()).or_insert(0.0) += v;
        }
    }
    let per_pod = |m: BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        m.into_iter().filter_map(|(k, v)| per(v, pods, 1.0).map(|p| (k, p))).collect()
    };
    let total_requests: f64 = requests.values().sum();
    let sum = |f: &dyn Fn(&RunFigures) -> f64| mine.iter().map(|r| f(r)).sum::<f64>();
    let response = sum(&|r| r.response_bytes);
    let watch = sum(&|r| r.watch_event_bytes);
    let api_cpu = sum(&|r| r.cpu_of(APISERVER));
    let etcd_cpu = sum(&|r| r.cpu_of(ETCD));
    ConfigFigures {
        id: c.id.clone(),
        label: c.label.clone(),
        runs: mine.len(),
        timed_out_runs: mine.iter().filter(|r| r.counts.timed_out).count(),
        pods_per_s: mean(of(Workload::Burst).map(|r| r.counts.pods_per_sec())),
        jobs_per_s: mean(of(Workload::Burst).map(|r| r.counts.jobs_per_sec())),
        jobs_created_per_s: mean(of(Workload::Burst).map(|r| r.counts.jobs_created_per_sec())),
        indexed_pods_per_s: mean(of(Workload::Indexed).map(|r| r.counts.pods_per_sec())),
        indexed_time_to_complete_secs: mean(
            of(Workload::Indexed)
                .filter(|r| !r.counts.timed_out)
                .filter_map(|r| r.time_to_complete_secs),
        ),
        first_pod_p50: pooled(of(Workload::Steady), first_pod_samples, 0.50, |r| {
            r.first_pod.map(|l| l.p50)
        }),
        first_pod_p99: pooled(of(Workload::Steady), first_pod_samples, 0.99, |r| {
            r.first_pod.map(|l| l.p99)
        }),
        counted_p50: pooled(of(Workload::Steady), counted_samples, 0.50, |r| {
            r.counted.map(|l| l.p50)
        }),
        counted_p99: pooled(of(Workload::Steady), counted_samples, 0.99, |r| {
            r.counted.map(|l| l.p99)
        }),
        burst_first_pod_p99: pooled(of(Workload::Burst), first_pod_samples, 0.99, |r| {
            r.first_pod.map(|l| l.p99)
        }),
        burst_counted_p99: pooled(of(Workload::Burst), counted_samples, 0.99, |r| {
            r.counted.map(|l| l.p99)
        }),
        pods,
        requests_per_pod: per_pod(requests),
        requests_per_pod_total: per(total_requests, pods, 1.0),
        bytes_sent_per_pod: per(response + watch, pods, 1.0),
        response_bytes_per_pod: per(response, pods, 1.0),
        response_bytes_per_pod_by_request: per_pod(response_by),
        watch_event_bytes_per_pod: per(watch, pods, 1.0),
        apiserver_cpu_per_1k_pods: per(api_cpu, pods, 1000.0),
        etcd_cpu_per_1k_pods: per(etcd_cpu, pods, 1000.0),
        apiserver_etcd_cpu_per_1k_pods: per(api_cpu + etcd_cpu, pods, 1000.0),
        controller_cpu_per_1k_pods: per(sum(&|r| r.controller_cpu_secs()), pods, 1000.0),
        controller_manager_cpu_per_1k_pods: per(
            sum(&|r| r.cpu_of(CONTROLLER_MANAGER)),
            pods,
            1000.0,
        ),
        marginal_controller_cpu_per_1k_pods: None,
        controller_manager_rest_per_1k_pods: None,
        machine_cpu_per_1k_pods: per(sum(&|r| r.machine_cpu_secs), pods, 1000.0),
        settle_secs_max: mine.iter().map(|r| r.settle_secs).reduce(f64::max),
        controller_peak_rss: mine.iter().map(|r| r.controller_peak_rss()).max(),
        terminated_watchers: sum(&|r| r.terminated_watchers),
        controller_peak_rate: mine.iter().filter_map(|r| r.controller_peak_rate).reduce(f64::max),
        flood_quiet_first_pod_p50: tenant_quantile(of(Workload::Flood), quiet_first_pod, 0.50),
        flood_quiet_first_pod_p99: tenant_quantile(of(Workload::Flood), quiet_first_pod, 0.99),
        flood_quiet_complete_p50: tenant_quantile(of(Workload::Flood), quiet_complete, 0.50),
        flood_quiet_complete_p99: tenant_quantile(of(Workload::Flood), quiet_complete, 0.99),
        flood_drain_secs: mean(
            of(Workload::Flood).filter_map(|r| r.tenants.as_ref().map(|t| t.flood_drain_secs)),
        ),
        flood_jobs_per_s: mean(of(Workload::Flood).map(|r| r.counts.jobs_per_sec())),
    }
}

fn quiet_first_pod(t: &TenantFigures) -> &[f64] {
    &t.quiet_first_pod_samples
}

fn quiet_complete(t: &TenantFigures) -> &[f64] {
    &t.quiet_complete_samples
}

/// The `q`-quantile of the tenant samples `samples` picks from `runs`, pooled.
fn tenant_quantile<'a>(
    runs: impl Iterator<Item = &'a RunFigures>,
    samples: fn(&TenantFigures) -> &[f64],
    q: f64,
) -> Option<f64> {
    let mut all: Vec<f64> =
        runs.filter_map(|r| r.tenants.as_ref()).flat_map(|t| samples(t).iter().copied()).collect();
    all.sort_by(f64::total_cmp);
    crate::stats::percentile(&all, q)
}

fn first_pod_samples(r: &RunFigures) -> &[f64] {
    &r.first_pod_samples
}

fn counted_samples(r: &RunFigures) -> &[f64] {
    &r.counted_samples
}

/// `kjob / base` when both are known and `base` is positive.
pub fn ratio(kjob: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (kjob, base) {
        (Some(k), Some(b)) if b > 0.0 && k.is_finite() && b.is_finite() => Some(k / b),
        _ => None,
    }
}

/// One headline figure: its key in `ratios` (without `_1w`/`_2w`), how it is read from a
/// configuration's figures, and the issue's targets for 1 and 2 workers.
#[derive(Debug, Clone, Copy)]
pub struct Headline {
    /// Key stem of the ratio.
    pub key: &'static str,
    /// What it is, with its unit.
    pub what: &'static str,
    /// The figure.
    pub get: fn(&ConfigFigures) -> Option<f64>,
    /// Whether more is better (the target is a floor) or less (a ceiling).
    pub higher_is_better: bool,
    /// Target ratio with 1 worker.
    pub goal_1w: f64,
    /// Target ratio with 2 workers.
    pub goal_2w: f64,
}

/// The figures the issue sets targets for, in the report's order.
pub const HEADLINES: [Headline; 7] = [
    Headline {
        key: "apiserver_etcd_cpu_per_pod",
        what: "kube-apiserver + etcd CPU s per 1,000 pods",
        get: |f| f.apiserver_etcd_cpu_per_1k_pods,
        higher_is_better: false,
        goal_1w: 1.2,
        goal_2w: 1.2,
    },
    Headline {
        key: "apiserver_bytes_sent_per_pod",
        what: "bytes kube-apiserver sent per pod",
        get: |f| f.bytes_sent_per_pod,
        higher_is_better: false,
        goal_1w: 1.5,
        goal_2w: 1.5,
    },
    Headline {
        key: "pods_per_s",
        what: "pods created/s (burst)",
        get: |f| f.pods_per_s,
        higher_is_better: true,
        goal_1w: 1.0,
        goal_2w: 1.2,
    },
    Headline {
        key: "jobs_per_s",
        what: "Jobs finished/s (burst)",
        get: |f| f.jobs_per_s,
        higher_is_better: true,
        goal_1w: 1.0,
        goal_2w: 1.2,
    },
    Headline {
        key: "p99_first_pod",
        what: "p99 Job created -> first pod, steady rate (s)",
        get: |f| f.first_pod_p99,
        higher_is_better: false,
        goal_1w: 1.0,
        goal_2w: 1.0,
    },
    Headline {
        key: "indexed_time_to_complete",
        what: "Indexed Job created -> Complete (s)",
        get: |f| f.indexed_time_to_complete_secs,
        higher_is_better: false,
        goal_1w: 1.0,
        goal_2w: 1.0,
    },
    Headline {
        key: "marginal_controller_cpu_per_pod",
        what: "marginal Job controller CPU s per 1,000 pods",
        get: |f| f.marginal_controller_cpu_per_1k_pods,
        higher_is_better: false,
        goal_1w: 2.0,
        goal_2w: 2.0,
    },
];

/// The pairs the ratios compare: key suffix, kjob's configuration, upstream's.
pub const RATIO_PAIRS: [(&str, &str, &str); 3] =
    [("1w", KJOB_1W, BASELINE), ("2w", KJOB_2W, BASELINE), ("2w_budget", KJOB_2W, BUDGET_2W)];

/// The `ratios` object: every [`HEADLINES`] key with `_1w` (configuration c ÷ b), `_2w`
/// (d ÷ b) and `_2w_budget` (d ÷ b2), each where both configurations ran (`None` where one has
/// no figure); the flood's and the managed-cluster ratios where their configurations ran.
pub fn ratios(figures: &[ConfigFigures]) -> BTreeMap<String, Option<f64>> {
    let find = |id: &str| figures.iter().find(|f| f.id == id);
    let mut out = BTreeMap::new();
    for (suffix, kjob, upstream) in RATIO_PAIRS {
        let (k, base) = (find(kjob), find(upstream));
        // A pair whose configurations did not both run has no ratios (and no verdicts).
        if k.is_none() || base.is_none() {
            continue;
        }
        for h in &HEADLINES {
            let r = ratio(k.and_then(h.get), base.and_then(h.get));
            out.insert(format!("{}_{suffix}", h.key), r);
        }
    }
    // The flood: kjob against upstream with the same budget, at upstream's defaults (m1 ÷ a) and
    // tuned (c ÷ b).
    for (suffix, kjob, upstream) in FLOOD_PAIRS {
        let (Some(k), Some(base)) = (find(kjob), find(upstream)) else { continue };
        if k.flood_drain_secs.is_none() || base.flood_drain_secs.is_none() {
            continue;
        }
        type Get = fn(&ConfigFigures) -> Option<f64>;
        let figures: [(&str, Get); 4] = [
            ("flood_quiet_p99_first_pod", |f| f.flood_quiet_first_pod_p99),
            ("flood_quiet_p99_complete", |f| f.flood_quiet_complete_p99),
            ("flood_drain", |f| f.flood_drain_secs),
            ("flood_jobs_per_s", |f| f.flood_jobs_per_s),
        ];
        for (key, get) in figures {
            out.insert(format!("{key}_{suffix}"), ratio(get(k), get(base)));
        }
    }
    // Managed-cluster budgets: N workers against one, and against upstream at its defaults.
    let jobs_per_s = |id: &str| find(id).and_then(|f| f.jobs_per_s);
    for f in figures {
        let Some((n, shared)) = managed_id(&f.id) else { continue };
        if !shared && n > 1 && find("m1").is_some() {
            out.insert(format!("scale_jobs_per_s_m{n}"), ratio(f.jobs_per_s, jobs_per_s("m1")));
        }
        if find(UPSTREAM_DEFAULTS).is_some() {
            out.insert(
                format!("managed_jobs_per_s_{}", f.id),
                ratio(f.jobs_per_s, jobs_per_s(UPSTREAM_DEFAULTS)),
            );
        }
    }
    out
}

/// The flood's comparisons: key suffix, kjob's configuration, upstream's with the same budget.
pub const FLOOD_PAIRS: [(&str, &str, &str); 4] = [
    ("default", "m1", UPSTREAM_DEFAULTS),
    ("tuned", KJOB_1W, BASELINE),
    ("fifo_default", "m1", "f1"),
    ("fifo_tuned", KJOB_1W, "cf"),
];

/// Issue 45's fairness target: under the flood at upstream's default budget, the quiet
/// namespaces' p99 Job created → first pod is at most this share of upstream's.
pub const FLOOD_QUIET_P99_GOAL: f64 = 0.2;

/// `(N, shared budget)` of a managed-cluster configuration id (`m<N>`, `mt<N>`).
pub fn managed_id(id: &str) -> Option<(usize, bool)> {
    let (shared, n) = match id.strip_prefix("mt") {
        Some(n) => (true, n),
        None => (false, id.strip_prefix('m')?),
    };
    Some((n.parse().ok()?, shared))
}

/// Issue 45's scaling target: N workers at upstream's default budget each finish at least
/// this share of N × one worker's Jobs/s (and of N × upstream's at its defaults, for N = 8).
pub const SCALE_EFFICIENCY: f64 = 0.85;

/// A small deterministic generator (SplitMix64) for the bootstrap, so a report can be
/// recomputed from its JSON exactly.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// A 95 % interval of every ratio by the percentile bootstrap: the runs of each configuration
/// and workload are drawn again with replacement (`resamples` times), every figure is
/// recomputed as for the report, and the 2.5th and 97.5th percentiles of each ratio are kept.
/// Runs of one configuration differ by about ±10 % on two cores; the interval says which
/// differences the passes resolve.
pub fn bootstrap_intervals(
    configs: &[Configuration],
    runs: &[RunFigures],
    resamples: usize,
    seed: u64,
) -> BTreeMap<String, (f64, f64)> {
    let mut groups: BTreeMap<(&str, &str), Vec<&RunFigures>> = BTreeMap::new();
    for r in runs {
        groups.entry((r.config.as_str(), r.workload.as_str())).or_default().push(r);
    }
    let mut rng = SplitMix(seed);
    let mut draws: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut sample: Vec<&RunFigures> = Vec::with_capacity(runs.len());
    for _ in 0..resamples {
        sample.clear();
        for g in groups.values() {
            sample.extend((0..g.len()).map(|_| g[rng.below(g.len())]));
        }
        for (k, r) in ratios(&summarize_all_refs(configs, &sample)) {
            if let Some(r) = r.filter(|r| r.is_finite()) {
                draws.entry(k).or_default().push(r);
            }
        }
    }
    draws
        .into_iter()
        .filter_map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            let lo = crate::stats::percentile(&v, 0.025)?;
            let hi = crate::stats::percentile(&v, 0.975)?;
            Some((k, (lo, hi)))
        })
        .collect()
}

/// The [`ratios`] of each pass alone (pass 1 first), from that pass's runs only: the
/// run-to-run spread behind each mean ratio. A single run of one configuration moves by ±10 %
/// on two cores, so a mean ratio near its target says little unless the passes agree.
pub fn ratios_per_pass(
    configs: &[Configuration],
    runs: &[RunFigures],
) -> BTreeMap<String, Vec<Option<f64>>> {
    let passes = runs.iter().map(|r| r.pass).max().unwrap_or(0);
    let mut out: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
    for pass in 1..=passes {
        let of_pass: Vec<&RunFigures> = runs.iter().filter(|r| r.pass == pass).collect();
        let figures = summarize_all_refs(configs, &of_pass);
        for (key, r) in ratios(&figures) {
            out.entry(key).or_default().push(r);
        }
    }
    out
}

/// One target judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Ratio key (`pods_per_s_1w`).
    pub key: String,
    /// What it measures.
    pub what: String,
    /// The ratio, if measured.
    pub ratio: Option<f64>,
    /// `≤ 1.2` or `≥ 1.0`.
    pub goal: String,
    /// Whether the target is met (false when unmeasured).
    pub met: bool,
    /// The ratio of each pass alone ([`ratios_per_pass`]).
    pub per_pass: Vec<Option<f64>>,
    /// Whether every measured pass lands on the same side of the goal as the mean ratio (true
    /// with fewer than two measured passes).
    pub passes_agree: bool,
    /// The ratio's bootstrap 95 % interval ([`bootstrap_intervals`]), when computed.
    pub interval: Option<(f64, f64)>,
    /// Whether the verdict stands: the whole interval on one side of the goal (without an
    /// interval: the passes agree). When false the ratio is within the noise of the run.
    pub decided: bool,
}

/// Every ratio against its target, with the per-pass ratios and the interval behind it.
pub fn verdicts(
    ratios: &BTreeMap<String, Option<f64>>,
    per_pass: &BTreeMap<String, Vec<Option<f64>>>,
    intervals: &BTreeMap<String, (f64, f64)>,
) -> Vec<Verdict> {
    let judge = |key: &str, what: String, goal: f64, higher: bool, goal_text: String| {
        let meets = |r: f64| if higher { r >= goal } else { r <= goal };
        let r = ratios.get(key).copied().flatten();
        let met = r.is_some_and(meets);
        let passes = per_pass.get(key).cloned().unwrap_or_default();
        let passes_agree = r.is_none() || passes.iter().flatten().all(|&p| meets(p) == met);
        let interval = intervals.get(key).copied();
        let decided = match interval {
            Some((lo, hi)) if r.is_some() => meets(lo) == met && meets(hi) == met,
            _ => passes_agree,
        };
        Verdict {
            key: key.to_string(),
            what,
            ratio: r,
            goal: goal_text,
            met,
            per_pass: passes,
            passes_agree,
            interval,
            decided,
        }
    };
    let op = |higher: bool| if higher { ">=" } else { "<=" };
    let mut out = Vec::new();
    for suffix in ["1w", "2w"] {
        for h in &HEADLINES {
            let key = format!("{}_{suffix}", h.key);
            if !ratios.contains_key(&key) {
                continue;
            }
            let goal = if suffix == "1w" { h.goal_1w } else { h.goal_2w };
            let text = format!("{} {goal}", op(h.higher_is_better));
            out.push(judge(&key, h.what.to_string(), goal, h.higher_is_better, text));
        }
    }
    // Managed-cluster budgets (issue 45): N workers ≥ 0.85·N × one worker; 8 workers ≥
    // 0.85·8 × upstream at its defaults; and the flood's. Only where the configurations ran.
    for key in ratios.keys() {
        let (goal, higher, what) = if let Some(n) = key.strip_prefix("scale_jobs_per_s_m") {
            let Ok(n) = n.parse::<usize>() else { continue };
            let what = format!("Jobs/s, {n} workers ÷ 1 (upstream's budget each)");
            (SCALE_EFFICIENCY * n as f64, true, what)
        } else if key == "managed_jobs_per_s_m8" {
            (SCALE_EFFICIENCY * 8.0, true, "Jobs/s, 8 workers ÷ upstream at its defaults".into())
        } else if key == "flood_quiet_p99_first_pod_fifo_tuned" {
            let what =
                "flood, tuned: quiet p99 created -> first pod, kjob fair (c) ÷ kjob FIFO (cf)";
            (1.05, false, what.to_string())
        } else if key == "flood_jobs_per_s_fifo_default" {
            (0.95, true, "flood, default budget: Jobs/s, kjob fair (m1) ÷ kjob FIFO (f1)".into())
        } else if key == "flood_quiet_p99_first_pod_default" {
            let what =
                "flood: quiet namespaces' p99 Job created -> first pod, kjob (m1) ÷ upstream (a)";
            (FLOOD_QUIET_P99_GOAL, false, what.to_string())
        } else {
            continue;
        };
        out.push(judge(key, what, goal, higher, format!("{} {goal:.2}", op(higher))));
    }
    out
}

/// The report's word for a verdict: `yes`, `no`, or `undecided` when its interval (or its
/// passes) lies on both sides of the goal.
fn verdict_word(v: &Verdict) -> &'static str {
    match (v.met, v.decided) {
        (_, false) => "undecided",
        (true, true) => "yes",
        (false, true) => "no",
    }
}

/// The managed-cluster section: kjob's workers each at upstream's default budget (`m<N>`) or
/// sharing one (`mt<N>`), against one worker and against upstream at its defaults (a).
fn render_managed(s: &mut String, r: &UpstreamReport) {
    let managed: Vec<&ConfigFigures> =
        r.figures.iter().filter(|f| managed_id(&f.id).is_some()).collect();
    if managed.is_empty() {
        return;
    }
    let (qps, burst, syncs) = MANAGED;
    let _ = writeln!(
        s,
        "\n## Managed-cluster budgets\n\nEvery process at kube-controller-manager's defaults \
         (QPS {qps}, burst {burst}, {syncs} syncs in flight), as on a managed cluster where nobody \
         can raise them: (a) is upstream; (m<N>) kjob with N workers, each with that budget; \
         (mt<N>) N workers sharing one such budget (`--api-qps-total={qps} \
         --api-burst-total={burst}`). Jobs/s of the burst.\n\n\
         | configuration | Jobs/s | pods/s | ÷ (m1) [95 % interval] | ÷ (a) [95 % interval] | peak requests/s over 10 s |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    let cell = |key: String| {
        format!(
            "{}{}",
            fmt_opt(r.ratios.get(&key).copied().flatten(), 2),
            fmt_interval(r.intervals.get(&key).copied())
        )
    };
    let upstream = r.figures.iter().find(|f| f.id == UPSTREAM_DEFAULTS);
    for f in upstream.into_iter().chain(managed) {
        let (scale, vs_a) = match managed_id(&f.id) {
            Some((n, false)) if n > 1 => (
                cell(format!("scale_jobs_per_s_m{n}")),
                cell(format!("managed_jobs_per_s_{}", f.id)),
            ),
            Some(_) => (String::new(), cell(format!("managed_jobs_per_s_{}", f.id))),
            None => (String::new(), String::new()),
        };
        let _ = writeln!(
            s,
            "| ({}) {} | {} | {} | {scale} | {vs_a} | {} |",
            f.id,
            f.label,
            fmt_opt(f.jobs_per_s, 2),
            fmt_opt(f.pods_per_s, 1),
            fmt_opt(f.controller_peak_rate, 1)
        );
    }
    let _ = writeln!(
        s,
        "\nPeak requests/s: the most requests kube-apiserver's audit log received from the Job \
         controller in any 10 s window, per second — kjob's workers' ServiceAccount, or \
         upstream's `job-controller` ServiceAccount (the informers' lists and watches are \
         another user on both sides: kjob's watcher, kube-controller-manager itself)."
    );
}

/// A PNG of the report with its caption.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Chart {
    /// File name beside the report.
    pub file: String,
    /// What it shows.
    pub caption: String,
}

/// Everything `upstream.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UpstreamReport {
    /// Which run this is.
    #[serde(flatten)]
    pub run: Provenance,
    /// Version of the upstream binaries.
    pub kubernetes_version: String,
    /// Passes over the configurations.
    pub passes: usize,
    /// Workload sizes and knobs as run.
    pub workloads: BTreeMap<String, serde_json::Value>,
    /// Jobs/s offered in the steady workload.
    pub steady_rate: Option<f64>,
    /// The configurations, in first-pass order.
    pub configurations: Vec<Configuration>,
    /// Figures per configuration.
    pub figures: Vec<ConfigFigures>,
    /// kjob ÷ upstream tuned (b), and (d) ÷ (b2) when (b2) ran.
    pub ratios: BTreeMap<String, Option<f64>>,
    /// Each ratio's bootstrap 95 % interval.
    pub intervals: BTreeMap<String, (f64, f64)>,
    /// The ratios against the issue's targets.
    pub verdicts: Vec<Verdict>,
    /// Raw figures of every run, in the order they ran.
    pub runs: Vec<RunFigures>,
    /// Charts beside the report.
    pub charts: Vec<Chart>,
    /// Wall-clock seconds of the whole benchmark.
    pub total_secs: f64,
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

fn fmt_interval(v: Option<(f64, f64)>) -> String {
    v.map_or(String::new(), |(lo, hi)| format!(" [{lo:.2}–{hi:.2}]"))
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.map_or(String::new(), |r| format!(" ({r:.2}×)"))
}

/// The section on the Job controller's writes as the audit log timed them: per workload and
/// configuration, the mean over its runs of each run's figure.
fn render_controller_writes(s: &mut String, r: &UpstreamReport, header: &str, rule: &str) {
    if r.runs.iter().all(|run| run.controller_writes.by_request.is_empty()) {
        return;
    }
    let _ = writeln!(s, "\n## The Job controller's writes as kube-apiserver timed them\n");
    let _ = writeln!(
        s,
        "From kube-apiserver's audit log (the controller's own writes only; per workload the mean \
         over passes of each run's figure). *ms*: from the server receiving a write to completing \
         its answer, p50 / p99. *Create rounds* (where one Job syncs: the Indexed Job): a sync \
         creates pods in slow-start rounds (1, 2, 4, … at once, each after the last answered); \
         *between rounds*: from the server's last answer of one round to its receiving the next \
         (rounds of one sync), p50 / p99 — the part of a round trip spent outside the server's \
         handling.\n"
    );
    let _ = writeln!(s, "{}\n{rule}", header.replacen("| figure |", "| write |", 1));
    let pair = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
        _ => "–".to_string(),
    };
    for w in Workload::ALL {
        let runs_of = |c: &str| -> Vec<&ControllerWrites> {
            r.runs
                .iter()
                .filter(|run| run.config == c && run.workload == w.name())
                .map(|run| &run.controller_writes)
                .collect()
        };
        if r.figures.iter().all(|f| runs_of(&f.id).is_empty()) {
            continue;
        }
        for kind in ["POST pods", "PATCH pods", "DELETE pods", "PUT jobs/status"] {
            let cells: Vec<String> = r
                .figures
                .iter()
                .map(|f| {
                    let times: Vec<ServerTime> = runs_of(&f.id)
                        .iter()
                        .filter_map(|cw| cw.by_request.get(kind).copied())
                        .collect();
                    pair(mean(times.iter().map(|t| t.p50_ms)), mean(times.iter().map(|t| t.p99_ms)))
                })
                .collect();
            if cells.iter().all(|c| c == "–") {
                continue;
            }
            let _ = writeln!(s, "| {} {kind} ms |{}", w.name(), row(&cells));
        }
        let rounds_of = |c: &str| -> Vec<CreateRounds> {
            runs_of(c).iter().filter_map(|cw| cw.create_rounds).collect()
        };
        if r.figures.iter().all(|f| rounds_of(&f.id).is_empty()) {
            continue;
        }
        let counts: Vec<String> = r
            .figures
            .iter()
            .map(|f| fmt_opt(mean(rounds_of(&f.id).iter().map(|cr| cr.count as f64)), 0))
            .collect();
        let _ = writeln!(s, "| {} create rounds |{}", w.name(), row(&counts));
        let gaps: Vec<String> = r
            .figures
            .iter()
            .map(|f| {
                let crs = rounds_of(&f.id);
                pair(
                    mean(crs.iter().filter_map(|cr| cr.gap_p50_ms)),
                    mean(crs.iter().filter_map(|cr| cr.gap_p99_ms)),
                )
            })
            .collect();
        let _ = writeln!(s, "| {} between rounds ms |{}", w.name(), row(&gaps));
    }
}

/// Table cells as the rest of a markdown row (` a | b |`).
/// "Where kube-apiserver's CPU went": per configuration, its profiles of every run summed, each
/// part as CPU seconds per 1,000 pods and as a share of the profiled CPU.
fn render_apiserver_cpu(s: &mut String, r: &UpstreamReport, header: &str, rule: &str) {
    let sums: Vec<Option<(CpuByPart, f64)>> = r
        .figures
        .iter()
        .map(|f| {
            let runs: Vec<&RunFigures> = r
                .runs
                .iter()
                .filter(|run| run.config == f.id && run.apiserver_cpu.is_some())
                .collect();
            let pods: f64 = runs.iter().map(|run| run.counts.pods_created as f64).sum();
            let mut sum = CpuByPart::default();
            runs.iter().filter_map(|run| run.apiserver_cpu.as_ref()).for_each(|c| sum.add(c));
            (pods > 0.0).then_some((sum, pods))
        })
        .collect();
    let Some(names) = sums.iter().flatten().map(|(c, _)| c.parts.clone()).next() else {
        return;
    };
    let _ = writeln!(s, "\n## Where kube-apiserver's CPU went\n");
    let _ = writeln!(
        s,
        "From kube-apiserver's CPU profiles (Go's pprof, taken in 5 s pieces through every run and \
         kept as `cluster/kube-apiserver-cpu-<n>.pprof` in each run's folder), every run of a \
         configuration summed: CPU seconds per 1,000 pods created, and the share of the profiled \
         CPU. A sample counts in the first part one of whose functions is on its stack; whose \
         requests a part holds is what the workloads send (pod status from the nodes, bindings \
         from the scheduler, PATCHes of pods from the Job controller). The other clients are the \
         same in every configuration, so a difference between columns is the Job controller's.\n"
    );
    let _ = writeln!(s, "{}\n{rule}", header.replacen("| figure |", "| part |", 1));
    let mut lines: Vec<(String, Vec<String>)> = names
        .iter()
        .map(|(name, _)| {
            let cells = sums
                .iter()
                .map(|c| match c {
                    Some((c, pods)) if c.cpu_secs > 0.0 => {
                        let secs = c.secs_of(name);
                        format!("{:.2} ({:.1} %)", secs / pods * 1000.0, 100.0 * secs / c.cpu_secs)
                    }
                    _ => "–".to_string(),
                })
                .collect();
            (name.clone(), cells)
        })
        .collect();
    lines.push((
        "all profiled CPU".into(),
        sums.iter()
            .map(|c| match c {
                Some((c, pods)) => {
                    format!("{:.2} (over {:.0} s)", c.cpu_secs / pods * 1000.0, c.profiled_secs)
                }
                None => "–".to_string(),
            })
            .collect(),
    ));
    for (name, cells) in lines {
        let _ = writeln!(s, "| {name} |{}", row(&cells));
    }
}

fn row(cells: &[String]) -> String {
    cells.iter().map(|c| format!(" {c} |")).collect()
}

/// The Markdown report.
pub fn render_markdown(r: &UpstreamReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# kjob vs kube-controller-manager's Job controller\n");
    let _ = writeln!(
        s,
        "`{}` — started {}, {} CPUs, Kubernetes {}, {} pass(es), {:.0} s in all. Every run on a \
         fresh control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, \
         kjob-node-agent); ratios in parentheses are ÷ (b) upstream tuned from the same run.\n",
        r.run.command, r.run.started, r.run.cpus, r.kubernetes_version, r.passes, r.total_secs
    );
    let _ = writeln!(s, "## Configurations\n");
    for c in &r.configurations {
        let how = match &c.controller {
            Controller::Upstream { .. } => c.controller_manager_args().join(" "),
            Controller::Kjob { workers, .. } => format!(
                "redis + kjob-queue{} + 1 kjob-watcher + {workers} kjob-worker(s), {}, --manage-all-jobs",
                c.kjob_queue_args().iter().map(|a| format!(" {a}")).collect::<String>(),
                c.kjob_workers().map(|(_, f)| f.join(" ")).unwrap_or_default()
            ),
        };
        let _ = writeln!(s, "* **({})** {}: `{}`", c.id, c.label, how);
    }
    let _ = writeln!(s, "\nWorkloads:");
    for (k, v) in &r.workloads {
        let _ = writeln!(s, "* {k}: {v}");
    }
    if let Some(rate) = r.steady_rate {
        let _ = writeln!(s, "* steady rate offered: {rate:.2} Jobs/s");
    }

    let base = r.figures.iter().find(|f| f.id == BASELINE);
    let _ = writeln!(s, "\n## Figures\n");
    let mut header = "| figure |".to_string();
    let mut rule = "|---|".to_string();
    for f in &r.figures {
        let _ = write!(header, " ({}) {} |", f.id, f.label);
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    type Row = (&'static str, fn(&ConfigFigures) -> Option<f64>, usize);
    let rows: [Row; 29] = [
        ("pods created/s (burst)", |f| f.pods_per_s, 1),
        ("Jobs finished/s (burst)", |f| f.jobs_per_s, 1),
        ("Jobs the harness created/s (burst)", |f| f.jobs_created_per_s, 1),
        ("pods created/s (Indexed)", |f| f.indexed_pods_per_s, 1),
        ("Indexed Job created → Complete (s)", |f| f.indexed_time_to_complete_secs, 2),
        ("p50 Job created → first pod, steady (s)", |f| f.first_pod_p50, 3),
        ("p99 Job created → first pod, steady (s)", |f| f.first_pod_p99, 3),
        ("p50 pod finished → counted, steady (s)", |f| f.counted_p50, 3),
        ("p99 pod finished → counted, steady (s)", |f| f.counted_p99, 3),
        ("p99 Job created → first pod, burst (s)", |f| f.burst_first_pod_p99, 2),
        ("p99 pod finished → counted, burst (s)", |f| f.burst_counted_p99, 2),
        ("API requests per pod", |f| f.requests_per_pod_total, 2),
        ("bytes kube-apiserver sent per pod", |f| f.bytes_sent_per_pod, 0),
        ("kube-apiserver CPU s / 1,000 pods", |f| f.apiserver_cpu_per_1k_pods, 2),
        ("etcd CPU s / 1,000 pods", |f| f.etcd_cpu_per_1k_pods, 2),
        ("kube-apiserver + etcd CPU s / 1,000 pods", |f| f.apiserver_etcd_cpu_per_1k_pods, 2),
        (
            "marginal Job controller CPU s / 1,000 pods",
            |f| f.marginal_controller_cpu_per_1k_pods,
            2,
        ),
        ("Job controller processes' CPU s / 1,000 pods", |f| f.controller_cpu_per_1k_pods, 2),
        ("kube-controller-manager CPU s / 1,000 pods", |f| f.controller_manager_cpu_per_1k_pods, 2),
        (
            "… of it with its Job controller off (kjob's runs)",
            |f| f.controller_manager_rest_per_1k_pods,
            2,
        ),
        ("whole machine CPU s / 1,000 pods", |f| f.machine_cpu_per_1k_pods, 1),
        ("longest settle after the last Job (s)", |f| f.settle_secs_max, 1),
        (
            "flood: quiet namespaces' p50 Job created → first pod (s)",
            |f| f.flood_quiet_first_pod_p50,
            2,
        ),
        (
            "flood: quiet namespaces' p99 Job created → first pod (s)",
            |f| f.flood_quiet_first_pod_p99,
            2,
        ),
        (
            "flood: quiet namespaces' p50 Job created → Complete (s)",
            |f| f.flood_quiet_complete_p50,
            2,
        ),
        (
            "flood: quiet namespaces' p99 Job created → Complete (s)",
            |f| f.flood_quiet_complete_p99,
            2,
        ),
        ("flood: the flooding namespace's drain (s)", |f| f.flood_drain_secs, 1),
        ("flood: every Job finished per second", |f| f.flood_jobs_per_s, 2),
        (
            "Job controller's peak requests/s over 10 s (kjob's workers; upstream's job-controller)",
            |f| f.controller_peak_rate,
            1,
        ),
    ];
    for (name, get, digits) in rows {
        let mut line = format!("| {name} |");
        for f in &r.figures {
            let v = get(f);
            let rel = if f.id == BASELINE { None } else { ratio(v, base.and_then(get)) };
            let _ = write!(line, " {}{} |", fmt_opt(v, digits), fmt_ratio(rel));
        }
        let _ = writeln!(s, "{line}");
    }
    let mut line = "| Job controller peak RSS (MiB) |".to_string();
    for f in &r.figures {
        let _ = write!(
            line,
            " {} |",
            fmt_opt(f.controller_peak_rss.map(|b| b as f64 / (1 << 20) as f64), 0)
        );
    }
    let _ = writeln!(s, "{line}");
    let mut line = "| watches kube-apiserver closed as too slow |".to_string();
    for f in &r.figures {
        let _ = write!(line, " {} |", f.terminated_watchers);
    }
    let _ = writeln!(s, "{line}");
    let mut line = "| runs (timed out) |".to_string();
    for f in &r.figures {
        let _ = write!(line, " {} ({}) |", f.runs, f.timed_out_runs);
    }
    let _ = writeln!(s, "{line}");
    let _ = writeln!(
        s,
        "\nMarginal Job controller CPU: every kjob process with redis-server for kjob; for \
         upstream, kube-controller-manager's CPU less its CPU per pod in kjob's runs of this \
         benchmark, where its Job controller is off (its other controllers — garbage collector, \
         pod GC, … — are then on neither side). The processes' row is the raw figure \
         (kube-controller-manager whole for upstream). Whole machine: busy CPU of every process \
         on every core, the harness included (the same in every configuration). A run ends once \
         kube-apiserver's request rate is back at its rate at rest. Peak RSS: VmHWM \
         (summed over kjob's processes). Pod finished → counted: from the pod's terminal phase \
         arriving on the harness's watch (the container's `finishedAt` has 1-s resolution; that \
         variant is in upstream.json). API requests and bytes count every client (the \
         scheduler, node agent and harness are the same in every configuration)."
    );

    render_managed(&mut s, r);
    let _ = writeln!(s, "\n## Targets (kjob ÷ upstream tuned, and the managed-cluster scaling)\n");
    let _ = writeln!(
        s,
        "| ratio | what | measured [95 % interval] | per pass | goal | met |\n|---|---|---:|---:|---|---|"
    );
    for v in &r.verdicts {
        let passes: Vec<String> = v.per_pass.iter().map(|p| fmt_opt(*p, 2)).collect();
        let _ = writeln!(
            s,
            "| `{}` | {} | {}{} | {} | {} | {} |",
            v.key,
            v.what,
            fmt_opt(v.ratio, 2),
            fmt_interval(v.interval),
            passes.join(", "),
            v.goal,
            verdict_word(v)
        );
    }
    let _ = writeln!(
        s,
        "\n*met*: the ratio (of the figures over every pass, latencies pooled) against the goal; \
         `undecided` where its 95 % interval (a bootstrap over the runs of each configuration \
         and workload, {BOOTSTRAP_RESAMPLES} resamples) reaches both sides of it."
    );
    let budget: Vec<(&String, &Option<f64>)> =
        r.ratios.iter().filter(|(k, _)| k.ends_with("_2w_budget")).collect();
    if budget.iter().any(|(_, v)| v.is_some()) {
        let _ = writeln!(
            s,
            "\n## kjob with two workers ÷ upstream with their budget (b2)\n\n\
             (b2) gives one kube-controller-manager what (d)'s two workers have together.\n\n\
             | ratio | measured [95 % interval] |\n|---|---:|"
        );
        for (k, v) in budget {
            let _ = writeln!(
                s,
                "| `{k}` | {}{} |",
                fmt_opt(*v, 2),
                fmt_interval(r.intervals.get(k).copied())
            );
        }
    }

    let by_request = [
        ("API requests per pod by verb and resource", "request", 3, None),
        (
            "Response bytes per pod by verb and resource",
            "response",
            0,
            Some(
                "Each row: the bytes of kube-apiserver's answers to that request, per pod (every \
                 client). A WATCH row is the whole stream of the watches that ended during the \
                 run (kube-apiserver records a watch's stream as its response when it ends: a \
                 watch it closed as too slow, or one at the end); those bytes are the watch \
                 events', already in the bytes sent above, and are not counted twice there.",
            ),
        ),
    ];
    for (title, what, digits, note) in by_request {
        let _ = writeln!(s, "\n## {title}\n");
        if let Some(note) = note {
            let _ = writeln!(s, "{note}\n");
        }
        let table = |f: &ConfigFigures| {
            if what == "request" {
                f.requests_per_pod.clone()
            } else {
                f.response_bytes_per_pod_by_request.clone()
            }
        };
        let tables: Vec<BTreeMap<String, f64>> = r.figures.iter().map(table).collect();
        let mut keys: Vec<&String> = tables.iter().flat_map(|t| t.keys()).collect();
        keys.sort();
        keys.dedup();
        let _ = writeln!(s, "{}\n{rule}", header.replacen("| figure |", &format!("| {what} |"), 1));
        for k in keys {
            let mut line = format!("| {k} |");
            for t in &tables {
                let _ = write!(line, " {} |", fmt_opt(t.get(k).copied(), digits));
            }
            let _ = writeln!(s, "{line}");
        }
    }

    render_controller_writes(&mut s, r, &header, &rule);
    render_apiserver_cpu(&mut s, r, &header, &rule);

    if !r.charts.is_empty() {
        let _ = writeln!(s, "\n## Charts\n");
        for c in &r.charts {
            let _ = writeln!(s, "![{}]({})\n\n{}\n", c.caption, c.file, c.caption);
        }
    }

    let _ = writeln!(s, "## Runs\n");
    let _ = writeln!(
        s,
        "| pass | workload | config | Jobs | finished | pods | s | Jobs created/s | pods/s | Jobs/s | p99 first pod (s) | p99 counted (s) | requests | MB sent | apiserver CPU s | etcd CPU s | controller CPU s | timed out |\n\
         |---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for run in &r.runs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            run.pass,
            run.workload,
            run.config,
            run.counts.jobs,
            run.counts.jobs_finished,
            run.counts.pods_created,
            run.counts.elapsed_secs,
            run.counts.jobs_created_per_sec(),
            run.counts.pods_per_sec(),
            run.counts.jobs_per_sec(),
            fmt_opt(run.first_pod.map(|l| l.p99), 3),
            fmt_opt(run.counted.map(|l| l.p99), 3),
            run.requests.values().sum::<f64>(),
            (run.response_bytes + run.watch_event_bytes) / 1e6,
            run.cpu_of(APISERVER),
            run.cpu_of(ETCD),
            run.controller_cpu_secs(),
            if run.counts.timed_out { "yes" } else { "no" },
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(id: &str) -> Configuration {
        Configuration::by_id(id, 200, 400).unwrap()
    }

    fn proc(name: &str, cpu: f64, rss: u64, controller: bool) -> ProcessFigures {
        ProcessFigures { name: name.into(), cpu_secs: cpu, peak_rss: rss, controller }
    }

    fn run(config: &str, workload: Workload, pods: u64, secs: f64, cpu: f64) -> RunFigures {
        let upstream = cfg(config).is_upstream();
        let mut processes = vec![proc(APISERVER, cpu, 1, false), proc(ETCD, cpu / 2.0, 1, false)];
        // kube-controller-manager spends 1 CPU s on its other controllers, and 1 more on Jobs
        // when its Job controller runs.
        processes.push(proc(CONTROLLER_MANAGER, if upstream { 2.0 } else { 1.0 }, 100, upstream));
        if !upstream {
            processes.push(proc("kjob-worker-1", 2.0, 30, true));
            processes.push(proc("redis-server", 0.5, 10, true));
        }
        RunFigures {
            config: config.into(),
            workload: workload.name().into(),
            pass: 1,
            counts: Counts {
                jobs: pods,
                jobs_finished: pods,
                pods_created: pods,
                elapsed_secs: secs,
                pods_window_secs: secs / 2.0,
                jobs_window_secs: secs / 2.0,
                timed_out: false,
            },
            first_pod: Some(Latency { count: 1, p50: 0.1, p99: secs / 100.0, max: 1.0, mean: 0.1 }),
            machine_cpu_secs: 2.0 * cpu,
            time_to_complete_secs: (workload == Workload::Indexed).then_some(secs),
            requests: [("POST pods".to_string(), pods as f64)].into(),
            response_bytes: 1000.0 * pods as f64,
            response_bytes_by_request: [("POST pods".to_string(), 1000.0 * pods as f64)].into(),
            watch_event_bytes: 500.0 * pods as f64,
            processes,
            ..Default::default()
        }
    }

    #[test]
    fn configurations_carry_the_issue_flags() {
        assert_eq!(
            cfg("a").controller_manager_args(),
            ["--concurrent-job-syncs=5", "--kube-api-qps=20", "--kube-api-burst=30"]
        );
        assert_eq!(
            cfg("bj").controller_manager_args().last().map(String::as_str),
            Some("--kube-api-content-type=application/json")
        );
        assert!(cfg("c").controller_manager_args().is_empty());
        assert_eq!(
            cfg("d").kjob_workers(),
            Some((
                2,
                ["--kube-qps=200", "--kube-burst=400", "--concurrency=50"]
                    .map(String::from)
                    .to_vec()
            ))
        );
        assert!(cfg("b").kjob_workers().is_none());
        assert!(Configuration::by_id("z", 1, 1).is_none());
        assert_eq!(Workload::parse("steady"), Some(Workload::Steady));
        assert_eq!(Workload::parse("x"), None);
    }

    #[test]
    fn managed_configurations_scale_against_one_worker_and_upstream_defaults() {
        let m4 = cfg("m4");
        assert_eq!(m4.managed_workers(), Some(4));
        assert_eq!(
            m4.kjob_workers(),
            Some((
                4,
                ["--kube-qps=20", "--kube-burst=30", "--concurrency=5"].map(String::from).to_vec()
            ))
        );
        let mt4 = cfg("mt4");
        assert_eq!(mt4.managed_workers(), None, "a shared budget is not a scaling point");
        let (n, flags) = mt4.kjob_workers().unwrap();
        assert_eq!(n, 4);
        assert_eq!(&flags[3..], ["--api-qps-total=20", "--api-burst-total=30"]);
        for fifo in ["f1", "cf"] {
            let c = cfg(fifo);
            assert_eq!(c.kjob_queue_args(), ["--lease-order=fifo"], "{fifo}");
            assert_eq!(c.managed_workers(), None, "{fifo} is no scaling point");
        }
        assert_eq!(cfg("f1").kjob_workers(), cfg("m1").kjob_workers());
        assert_eq!(cfg("cf").kjob_workers(), cfg("c").kjob_workers());
        assert!(cfg("m1").kjob_queue_args().is_empty());
        for bad in ["m0", "m17", "mx", "mt", "m"] {
            assert!(Configuration::by_id(bad, 1, 1).is_none(), "{bad}");
        }
        // Burst runs of 400 Jobs: upstream at its defaults 100 s; one worker 100 s, two 55 s,
        // eight 20 s (5.0×: short of 0.85·8 = 6.8); four sharing one budget 100 s.
        let configs: Vec<Configuration> = ["a", "m1", "m2", "m8", "mt4"].map(cfg).to_vec();
        let runs: Vec<RunFigures> =
            [("a", 100.0), ("m1", 100.0), ("m2", 55.0), ("m8", 20.0), ("mt4", 100.0)]
                .into_iter()
                .map(|(c, secs)| run(c, Workload::Burst, 400, secs, 10.0))
                .collect();
        let figures = summarize_all(&configs, &runs);
        let r = ratios(&figures);
        let close = |k: &str, want: f64| {
            let got = r[k].unwrap();
            assert!((got - want).abs() < 1e-9, "{k}: {got} != {want}");
        };
        close("scale_jobs_per_s_m2", 100.0 / 55.0);
        close("scale_jobs_per_s_m8", 5.0);
        close("managed_jobs_per_s_m8", 5.0);
        close("managed_jobs_per_s_mt4", 1.0);
        assert!(!r.contains_key("scale_jobs_per_s_m1") && !r.contains_key("scale_jobs_per_s_mt4"));
        let v = verdicts(&r, &BTreeMap::new(), &BTreeMap::new());
        let get =
            |k: &str| v.iter().find(|v| v.key == k).unwrap_or_else(|| panic!("no verdict {k}"));
        assert!(get("scale_jobs_per_s_m2").met, "1.82 >= 1.70");
        assert!(!get("scale_jobs_per_s_m8").met, "5.0 < 6.8");
        assert_eq!(get("managed_jobs_per_s_m8").goal, ">= 6.80");
        assert!(!get("managed_jobs_per_s_m8").met);
        let md = render_markdown(&UpstreamReport {
            configurations: configs,
            figures,
            ratios: r,
            ..Default::default()
        });
        assert!(md.contains("## Managed-cluster budgets"), "{md}");
        assert!(
            md.contains("| (m8) kjob, 8 worker(s) at upstream's defaults each | 20.00 |"),
            "{md}"
        );
    }

    #[test]
    fn the_flood_compares_quiet_namespaces_against_upstream_with_the_same_budget() {
        let tenants = |first: &[f64], drain: f64| TenantFigures {
            flood_jobs: 300,
            quiet_namespaces: 10,
            quiet_jobs: first.len() as u64,
            flood_drain_secs: drain,
            quiet_first_pod_samples: first.to_vec(),
            quiet_complete_samples: first.iter().map(|f| f + 1.0).collect(),
        };
        let flood = |config: &str, first: &[f64], drain: f64| RunFigures {
            tenants: Some(tenants(first, drain)),
            ..run(config, Workload::Flood, 300, drain, 5.0)
        };
        // Upstream's quiet Jobs wait behind the flood (10–90 s); kjob's do not (0.5–1.5 s), and
        // its flood drains as fast. At the tuned budget nobody waits.
        let configs: Vec<Configuration> = ["a", "m1", "b", "c"].map(cfg).to_vec();
        let runs = vec![
            flood("a", &[10.0, 50.0, 90.0], 90.0),
            flood("m1", &[0.5, 1.0, 1.5], 91.0),
            flood("b", &[0.1, 0.2], 10.0),
            flood("c", &[0.1, 0.3], 10.0),
            // A burst run carries no tenants and changes none of the flood's figures.
            run("a", Workload::Burst, 100, 30.0, 5.0),
        ];
        let figures = summarize_all(&configs, &runs);
        let m1 = figures.iter().find(|f| f.id == "m1").unwrap();
        assert_eq!(m1.flood_quiet_first_pod_p50, Some(1.0));
        assert_eq!(m1.flood_quiet_complete_p50, Some(2.0));
        assert_eq!(m1.flood_drain_secs, Some(91.0));
        let r = ratios(&figures);
        let p99 = |id: &str| {
            figures.iter().find(|f| f.id == id).unwrap().flood_quiet_first_pod_p99.unwrap()
        };
        let want = p99("m1") / p99("a");
        assert!((r["flood_quiet_p99_first_pod_default"].unwrap() - want).abs() < 1e-9);
        assert!(want < FLOOD_QUIET_P99_GOAL, "{want}");
        assert!((r["flood_drain_default"].unwrap() - 91.0 / 90.0).abs() < 1e-9);
        assert!(r.contains_key("flood_quiet_p99_first_pod_tuned"));
        let v = verdicts(&r, &BTreeMap::new(), &BTreeMap::new());
        let fair = v.iter().find(|v| v.key == "flood_quiet_p99_first_pod_default").unwrap();
        assert_eq!(fair.goal, "<= 0.20");
        assert!(fair.met && fair.decided);
        // Without upstream's flood run there is no ratio and no verdict.
        let r = ratios(&summarize_all(&configs, &runs[1..]));
        assert!(!r.contains_key("flood_quiet_p99_first_pod_default"));
    }

    #[test]
    fn schedule_interleaves_then_reverses() {
        let s = schedule(4, &[Workload::Burst, Workload::Steady], 2);
        let order: Vec<(usize, Workload, usize)> =
            s.iter().map(|s| (s.pass, s.workload, s.config)).collect();
        use Workload::*;
        assert_eq!(
            order,
            vec![
                (1, Burst, 0),
                (1, Burst, 1),
                (1, Burst, 2),
                (1, Burst, 3),
                (1, Steady, 0),
                (1, Steady, 1),
                (1, Steady, 2),
                (1, Steady, 3),
                (2, Burst, 3),
                (2, Burst, 2),
                (2, Burst, 1),
                (2, Burst, 0),
                (2, Steady, 3),
                (2, Steady, 2),
                (2, Steady, 1),
                (2, Steady, 0),
            ]
        );
        assert!(schedule(4, &Workload::ALL, 0).is_empty());
    }

    #[test]
    fn steady_rate_is_half_the_baseline() {
        assert_eq!(steady_rate(7.0, Some(40.0), &[1.0]), 7.0);
        assert_eq!(steady_rate(0.0, Some(40.0), &[10.0]), 20.0);
        assert_eq!(steady_rate(0.0, None, &[10.0, 30.0]), 10.0);
        assert_eq!(steady_rate(0.0, None, &[]), 1.0);
        assert_eq!(steady_rate(0.0, Some(0.5), &[]), 1.0);
    }

    #[test]
    fn ratio_needs_both_sides() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(Some(f64::NAN), Some(1.0)), None);
    }

    #[test]
    fn summary_ratios_and_verdicts() {
        let runs = vec![
            run("b", Workload::Burst, 100, 10.0, 10.0),
            run("b", Workload::Indexed, 100, 20.0, 10.0),
            run("b", Workload::Steady, 100, 10.0, 10.0),
            run("c", Workload::Burst, 100, 5.0, 20.0),
            run("c", Workload::Indexed, 100, 40.0, 20.0),
            run("c", Workload::Steady, 100, 10.0, 20.0),
        ];
        let figs = summarize_all(&[cfg("b"), cfg("c"), cfg("d")], &runs);
        let (b, c, d) = (&figs[0], &figs[1], &figs[2]);
        assert_eq!((b.runs, b.pods), (3, 300));
        assert_eq!(b.pods_per_s, Some(20.0));
        assert_eq!(c.jobs_per_s, Some(20.0));
        // The runs' clients created their Jobs in half the run: 100 Jobs in 2.5 s.
        assert_eq!(c.jobs_created_per_s, Some(40.0));
        assert_eq!(c.indexed_time_to_complete_secs, Some(40.0));
        assert_eq!(b.requests_per_pod.get("POST pods"), Some(&1.0));
        assert_eq!(b.response_bytes_per_pod_by_request.get("POST pods"), Some(&1000.0));
        assert_eq!(b.bytes_sent_per_pod, Some(1500.0));
        // 3 runs × (10 + 5) CPU s over 300 pods.
        assert_eq!(b.apiserver_etcd_cpu_per_1k_pods, Some(150.0));
        // Upstream's controller is kube-controller-manager; kjob's is its processes.
        assert_eq!(b.controller_cpu_per_1k_pods, Some(20.0));
        assert_eq!(c.controller_cpu_per_1k_pods, Some(25.0));
        assert_eq!(c.controller_manager_cpu_per_1k_pods, Some(10.0));
        // Marginal: upstream's kube-controller-manager less what it spends in kjob's runs.
        assert_eq!(b.controller_manager_rest_per_1k_pods, Some(10.0));
        assert_eq!(b.marginal_controller_cpu_per_1k_pods, Some(10.0));
        assert_eq!(c.marginal_controller_cpu_per_1k_pods, Some(25.0));
        assert_eq!(c.controller_manager_rest_per_1k_pods, None);
        // 3 runs × 2 × 10 CPU s of the whole machine over 300 pods.
        assert_eq!(b.machine_cpu_per_1k_pods, Some(200.0));
        assert_eq!(b.controller_peak_rss, Some(100));
        assert_eq!(c.controller_peak_rss, Some(40));
        assert_eq!(d.runs, 0);
        assert_eq!(d.pods_per_s, None);

        let r = ratios(&figs);
        assert_eq!(r.len(), 14);
        assert_eq!(r["pods_per_s_1w"], Some(2.0));
        assert_eq!(r["apiserver_etcd_cpu_per_pod_1w"], Some(2.0));
        assert_eq!(r["indexed_time_to_complete_1w"], Some(2.0));
        assert_eq!(r["marginal_controller_cpu_per_pod_1w"], Some(2.5));
        assert_eq!(r["apiserver_bytes_sent_per_pod_1w"], Some(1.0));
        assert_eq!(r["p99_first_pod_1w"], Some(1.0));
        assert_eq!(r["pods_per_s_2w"], None);
        let per_pass = ratios_per_pass(&[cfg("b"), cfg("c"), cfg("d")], &runs);
        assert_eq!(per_pass["pods_per_s_1w"], vec![Some(2.0)], "one pass");
        let v = verdicts(&r, &per_pass, &BTreeMap::new());
        assert!(v.iter().all(|x| x.passes_agree), "a single pass agrees with itself");
        let met = |k: &str| v.iter().find(|x| x.key == k).unwrap().met;
        assert!(met("pods_per_s_1w"));
        assert!(!met("apiserver_etcd_cpu_per_pod_1w"));
        assert!(met("apiserver_bytes_sent_per_pod_1w"));
        assert!(met("p99_first_pod_1w"));
        assert!(!met("pods_per_s_2w"), "unmeasured is not met");

        let report = UpstreamReport {
            configurations: vec![cfg("b"), cfg("c"), cfg("d")],
            figures: figs.clone(),
            ratios: r.clone(),
            verdicts: v,
            runs,
            ..Default::default()
        };
        let md = render_markdown(&report);
        assert!(md.contains("| pods created/s (burst) | 20.0 | 40.0 (2.00×) | – |"), "{md}");
        assert!(md.contains("`pods_per_s_1w`"));
        let (requests, responses) = md
            .split_once("## Response bytes per pod by verb and resource")
            .expect("a response bytes table");
        assert!(requests.contains("| POST pods | 1.000 | 1.000 | – |"), "{md}");
        assert!(responses.contains("| POST pods | 1000 | 1000 | – |"), "{md}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["runs"][0]["response_bytes_by_request"]["POST pods"], 100_000.0);
        assert_eq!(json["ratios"]["pods_per_s_1w"], 2.0);
        assert!(json["ratios"]["pods_per_s_2w"].is_null());
        assert!(!md.contains("as kube-apiserver timed them"), "no audit figures, no section");
    }

    #[test]
    fn the_audit_section_averages_each_runs_figures() {
        let writes = |p50: f64, rounds: u64, gap: Option<f64>| ControllerWrites {
            by_request: [(
                "POST pods".to_string(),
                ServerTime { count: 10, p50_ms: p50, p99_ms: 2.0 * p50 },
            )]
            .into(),
            create_rounds: Some(CreateRounds {
                count: rounds,
                gap_p50_ms: gap,
                gap_p99_ms: gap.map(|g| 3.0 * g),
            }),
        };
        let mut runs = vec![
            run("b", Workload::Indexed, 100, 20.0, 10.0),
            run("b", Workload::Indexed, 100, 20.0, 10.0),
            run("c", Workload::Indexed, 100, 20.0, 10.0),
            run("c", Workload::Steady, 100, 20.0, 10.0),
        ];
        runs[0].controller_writes = writes(2.0, 100, Some(10.0));
        runs[1].controller_writes = writes(4.0, 120, Some(20.0));
        runs[2].controller_writes = writes(5.0, 170, None);
        // Many Jobs: server times, no rounds.
        runs[3].controller_writes =
            ControllerWrites { create_rounds: None, ..writes(1.0, 0, None) };
        let configurations = vec![cfg("b"), cfg("c")];
        let figures = configurations.iter().map(|c| summarize_config(c, &runs)).collect();
        let report = UpstreamReport { configurations, figures, runs, ..Default::default() };
        let md = render_markdown(&report);
        let (_, section) = md.split_once("as kube-apiserver timed them").expect("an audit section");
        assert!(section.contains("| indexed POST pods ms | 3.0 / 6.0 | 5.0 / 10.0 |"), "{md}");
        assert!(section.contains("| indexed create rounds | 110 | 170 |"), "{md}");
        assert!(section.contains("| indexed between rounds ms | 15.0 / 45.0 | – |"), "{md}");
        assert!(!section.contains("PATCH pods"), "no such writes, no row: {md}");
        assert!(!section.contains("| burst"), "no burst runs: {md}");
        assert!(section.contains("| steady POST pods ms | – | 1.0 / 2.0 |"), "{md}");
        assert!(!section.contains("steady create rounds"), "{md}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["runs"][2]["controller_writes"]["create_rounds"]["count"], 170);
        assert!(json["runs"][3]["controller_writes"]["create_rounds"].is_null());
    }

    #[test]
    fn passes_on_both_sides_of_a_goal_leave_it_undecided() {
        let in_pass = |mut r: RunFigures, pass: usize| {
            r.pass = pass;
            r
        };
        // Upstream 10 pods/s in both passes; kjob 20 pods/s in pass 1, 5 in pass 2: the mean
        // ratio (12.5 / 10) meets the 1w goal of 1.0, the second pass alone does not.
        let runs = vec![
            in_pass(run("b", Workload::Burst, 100, 10.0, 10.0), 1),
            in_pass(run("c", Workload::Burst, 100, 5.0, 10.0), 1),
            in_pass(run("c", Workload::Burst, 100, 20.0, 10.0), 2),
            in_pass(run("b", Workload::Burst, 100, 10.0, 10.0), 2),
        ];
        let configs = [cfg("b"), cfg("c")];
        let figs: Vec<ConfigFigures> = configs.iter().map(|c| summarize_config(c, &runs)).collect();
        let r = ratios(&figs);
        assert_eq!(r["pods_per_s_1w"], Some(1.25));
        let per_pass = ratios_per_pass(&configs, &runs);
        assert_eq!(per_pass["pods_per_s_1w"], vec![Some(2.0), Some(0.5)]);
        // (d) never ran: no two-worker ratio, in either pass.
        assert!(!per_pass.contains_key("pods_per_s_2w") && !r.contains_key("pods_per_s_2w"));
        let v = verdicts(&r, &per_pass, &BTreeMap::new());
        let pods = v.iter().find(|x| x.key == "pods_per_s_1w").unwrap();
        assert!(pods.met);
        assert!(!pods.passes_agree);
        assert_eq!(verdict_word(pods), "undecided");
        // Same CPU per pod in both passes: both at 1.0 (<= 1.2), so they agree.
        let cpu = v.iter().find(|x| x.key == "apiserver_etcd_cpu_per_pod_1w").unwrap();
        assert_eq!((cpu.met, cpu.passes_agree, verdict_word(cpu)), (true, true, "yes"));
        assert!(v.iter().all(|x| !x.key.ends_with("_2w")), "no verdict without (d)");

        let report = UpstreamReport {
            configurations: configs.to_vec(),
            figures: figs,
            ratios: r,
            verdicts: v,
            runs,
            ..Default::default()
        };
        let md = render_markdown(&report);
        assert!(
            md.contains("| `pods_per_s_1w` | pods created/s (burst) | 1.25 | 2.00, 0.50 | >= 1 | undecided |"),
            "{md}"
        );
        let json = serde_json::to_value(&report).unwrap();
        let first = &json["verdicts"][0];
        assert!(first["per_pass"].is_array(), "{first}");
        assert!(first["passes_agree"].is_boolean());
    }

    #[test]
    fn bootstrap_intervals_decide_only_what_the_runs_resolve() {
        let in_pass = |mut r: RunFigures, pass: usize| {
            r.pass = pass;
            r
        };
        // Upstream 20 pods/s in every pass; kjob 40 pods/s in three passes and 10 in one: the
        // ratio over all passes (1.625) meets >= 1.0, but a resample of the slow pass alone does
        // not, so the interval reaches below 1.
        let mut runs = Vec::new();
        for (pass, kjob_secs) in [(1, 5.0), (2, 5.0), (3, 20.0), (4, 5.0)] {
            runs.push(in_pass(run("b", Workload::Burst, 100, 10.0, 10.0), pass));
            runs.push(in_pass(run("c", Workload::Burst, 100, kjob_secs, 10.0), pass));
            runs.push(in_pass(run("b2", Workload::Burst, 100, 10.0, 10.0), pass));
            runs.push(in_pass(run("d", Workload::Burst, 100, 5.0, 10.0), pass));
        }
        let configs = [cfg("b"), cfg("c"), cfg("b2"), cfg("d")];
        let figs = summarize_all(&configs, &runs);
        let r = ratios(&figs);
        assert_eq!(r["pods_per_s_1w"], Some(1.625));
        assert_eq!(r["pods_per_s_2w_budget"], Some(2.0), "(d) against (b2)");
        let iv = bootstrap_intervals(&configs, &runs, 500, 7);
        let (lo, hi) = iv["pods_per_s_1w"];
        assert!(lo < 1.0 && hi >= 2.0, "{lo}–{hi}");
        // The same runs always: a point interval.
        assert_eq!(iv["pods_per_s_2w"], (2.0, 2.0));
        assert_eq!(iv, bootstrap_intervals(&configs, &runs, 500, 7), "deterministic");
        let v = verdicts(&r, &ratios_per_pass(&configs, &runs), &iv);
        let word = |k: &str| verdict_word(v.iter().find(|x| x.key == k).unwrap());
        assert_eq!(word("pods_per_s_1w"), "undecided");
        assert_eq!(word("pods_per_s_2w"), "yes");
        let report = UpstreamReport {
            configurations: configs.to_vec(),
            figures: figs,
            ratios: r,
            intervals: iv,
            verdicts: v,
            runs,
            ..Default::default()
        };
        let md = render_markdown(&report);
        assert!(
            md.contains("| `pods_per_s_2w` | pods created/s (burst) | 2.00 [2.00–2.00] |"),
            "{md}"
        );
        assert!(md.contains("| `pods_per_s_2w_budget` | 2.00 [2.00–2.00] |"), "{md}");
    }

    #[test]
    fn latency_percentiles_pool_the_samples_of_every_run() {
        let mut one = run("b", Workload::Steady, 100, 10.0, 10.0);
        one.first_pod_samples = [vec![0.1; 98], vec![1.0; 2]].concat();
        let mut two = run("b", Workload::Steady, 100, 10.0, 10.0);
        two.first_pod_samples = vec![0.1; 100];
        let f = summarize_config(&cfg("b"), &[one, two]);
        // Each run's p99 alone: 1.0 and 0.1 (a mean of 0.55); of the 200 samples: 0.1.
        assert_eq!(f.first_pod_p99, Some(0.1));
        // Runs that kept no samples fall back to the mean of their summaries.
        let f = summarize_config(&cfg("b"), &[run("b", Workload::Steady, 100, 10.0, 10.0)]);
        assert_eq!(f.first_pod_p99, Some(0.1));
    }

    #[test]
    fn apiserver_cpu_section_sums_the_runs_per_pod_and_as_shares() {
        let part = |patch: f64, other: f64| CpuByPart {
            profiled_secs: 10.0,
            cpu_secs: patch + other,
            parts: vec![
                ("PATCH (pods: the Job controller's finalizer removals)".into(), patch),
                ("other".into(), other),
            ],
        };
        let mut b = run("b", Workload::Burst, 100, 10.0, 10.0);
        b.apiserver_cpu = Some(part(1.0, 3.0));
        let mut c1 = run("c", Workload::Burst, 100, 10.0, 10.0);
        c1.apiserver_cpu = Some(part(0.5, 1.5));
        let mut c2 = run("c", Workload::Indexed, 300, 10.0, 10.0);
        c2.apiserver_cpu = Some(part(0.5, 1.5));
        let configs = [cfg("b"), cfg("c")];
        let runs = vec![b, c1, c2];
        let figures = configs.iter().map(|c| summarize_config(c, &runs)).collect();
        let report = UpstreamReport {
            configurations: configs.to_vec(),
            figures,
            runs,
            ..Default::default()
        };
        let md = render_markdown(&report);
        assert!(md.contains("## Where kube-apiserver's CPU went"), "{md}");
        // b: 1 s of 4 over 100 pods; c: 1 s of 4 over 400 pods.
        assert!(
            md.contains("| PATCH (pods: the Job controller's finalizer removals) | 10.00 (25.0 %) | 2.50 (25.0 %) |"),
            "{md}"
        );
        assert!(
            md.contains("| all profiled CPU | 40.00 (over 10 s) | 10.00 (over 20 s) |"),
            "{md}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["runs"][0]["apiserver_cpu"]["cpu_secs"], 4.0);

        // Runs without profiles: no section, and no key in the JSON.
        let mut plain = report;
        plain.runs.iter_mut().for_each(|r| r.apiserver_cpu = None);
        assert!(!render_markdown(&plain).contains("kube-apiserver's CPU went"));
        assert!(serde_json::to_value(&plain).unwrap()["runs"][0].get("apiserver_cpu").is_none());
    }
}
