//! The harness side of a run: creating Jobs, watching Jobs and Pods (timestamps taken when
//! events arrive), snapshots of counters before and after a phase, and the sim-limit loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::batch::v1::Job;
use kjob_bench::harness::{Counts, Creator, NAMESPACE, Recorder};
use kjob_bench::procfs::{Usage, read_usage};
use kjob_bench::promtext;
use kjob_bench::redisinfo;
use kjob_bench::report::{LimitResult, PhaseResult, ProcessUsage};
use kjob_bench::stats::summarize;
use kube::api::Api;
use serde_json::json;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::stack::{Stack, redis_client, worker_admin_urls};

/// Timeout of every single API, metrics or Redis call the harness makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Redis commands the harness itself sends when taking a snapshot.
const HARNESS_REDIS_COMMANDS: [&str; 3] = ["info", "hello", "client|setinfo"];

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
    let redis = if let Some(client) = redis_client(stack)? {
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

impl Phase {
    /// A phase that creates `jobs` as fast as `creators` can and waits `timeout` for them.
    pub fn burst(name: String, jobs: Vec<Job>, creators: usize, timeout: Duration) -> Self {
        Self { name, jobs, creators, timeout, pace: None }
    }
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
    let creator =
        Creator::new(Api::namespaced(client.clone(), NAMESPACE), rec.clone(), CALL_TIMEOUT);
    match phase.pace {
        Some(rate) => creator.paced(phase.jobs, rate).await?,
        None => creator.burst(phase.jobs, phase.creators).await?,
    }
    tracing::info!(phase = %phase.name, secs = t0.elapsed().as_secs_f64(), "all Jobs created");
    let waiting = rec.wait_finished(&names, deadline, || stack.check_alive());
    let timed_out = waiting.instrument(tracing::info_span!("phase", phase = %phase.name)).await?;
    let end = Instant::now();
    // Let the last status writes' syncs settle into the counters before reading them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = snapshot(stack, http, ticks).await?;
    let observed = rec.observed(&names, t0, end);
    let mut out = PhaseResult {
        name: phase.name,
        counts: Counts { timed_out, ..observed.counts },
        watch_errors: rec.watch_errors() - watch_errors,
        ..Default::default()
    };
    out.first_pod_latency = summarize(&mut observed.first_pod.clone());
    out.counted_latency = summarize(&mut observed.counted.clone());
    let (first, counted) = (observed.first_pod, observed.counted);
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
